"""The Optuna searcher's saved state with finished trials written once (workers/optuna_state.py):
a restored searcher has every trial back, the saved state stays small as the study grows, and a
missing or cut-short file is said, not silently lost."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pyarrow.fs
import pytest

from workers import tune_state
from workers.optuna_state import ARCHIVE_PREFIX, ARCHIVE_SUFFIX, read_archived_trials
from workers.plan import ParamDef, SamplerConfig, StudyPlan
from workers.search import PruningAwareOptunaSearch, create_searcher

SPACE = (
    ParamDef("training.lr", "float", low=1e-4, high=1e-1, log=True),
    ParamDef("model.width", "int", low=8, high=64),
)


def _searcher() -> PruningAwareOptunaSearch:
    plan = StudyPlan(
        name="s",
        base_config={"training": {"epochs": 3}},
        space=SPACE,
        sampler=SamplerConfig(type="tpe", seed=7, n_startup_trials=3),
    )
    return create_searcher(plan, study_key="0" * 16)


def _run(searcher: PruningAwareOptunaSearch, first: int, last: int, *, finish: bool = True) -> None:
    for i in range(first, last):
        tid = f"t{i}"
        assert searcher.suggest(tid) is not None
        for step in (1, 2):
            searcher.on_trial_result(tid, {"val_accuracy": 0.01 * i + 0.1 * step, "training_iteration": step})
        if finish:
            status = "completed" if i % 3 else "diverged"
            searcher.on_trial_complete(tid, {"status": status, "val_accuracy": 0.01 * i + 0.2})


def _at(path: Path) -> Any:
    storage = SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(), experiment_fs_path=str(path))
    return tune_state._at_experiment(storage)


def _trials(searcher: PruningAwareOptunaSearch) -> list[tuple[Any, ...]]:
    study: Any = searcher._ot_study
    return [
        (t.number, t.state, t.value, t.params, t.intermediate_values)
        for t in study.get_trials(deepcopy=False)
    ]


def _files(path: Path) -> list[Path]:
    return sorted(path.glob(f"{ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX}"))


def test_a_restored_searcher_has_every_trial_back_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "4")
    experiment, staging = tmp_path / "experiment", tmp_path / "staging"
    staging.mkdir()
    searcher = _searcher()
    with _at(experiment):
        _run(searcher, 0, 10)
        _run(searcher, 10, 11, finish=False)  # one trial still running, with two values
        searcher.save(str(staging / "state.pkl"))
    # 10 finished trials, files of at least 4: all of them in one file, the running one not.
    [written] = _files(experiment)
    assert sorted(read_archived_trials(pyarrow.fs.LocalFileSystem(), str(experiment))) == list(range(10))
    assert not list(staging.glob(f"{ARCHIVE_PREFIX}*"))  # straight to the experiment, not the staging folder
    assert written.stat().st_size > 0
    restored = _searcher()
    with _at(experiment):  # as Tune resumes: the state from the staging folder, the files from storage
        restored.restore(str(staging / "state.pkl"))
    assert _trials(restored) == _trials(searcher)
    assert restored._archived == set(range(10))
    # The running trial goes on in the restored searcher and ends; the next suggestion is TPE's own.
    restored.on_trial_result("t10", {"val_accuracy": 0.9, "training_iteration": 3})
    restored.on_trial_complete("t10", {"status": "completed", "val_accuracy": 0.95})
    searcher.on_trial_result("t10", {"val_accuracy": 0.9, "training_iteration": 3})
    searcher.on_trial_complete("t10", {"status": "completed", "val_accuracy": 0.95})
    assert restored.suggest("t11") == searcher.suggest("t11")
    assert _trials(restored) == _trials(searcher)


def test_the_saved_state_stays_small_as_the_study_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "5")
    searcher, whole = _searcher(), _searcher()
    sizes: dict[int, int] = {}
    for first, n in ((0, 10), (10, 60)):
        with _at(tmp_path / "experiment"):
            _run(searcher, first, n)
            searcher.save(str(tmp_path / f"state-{n}.pkl"))
        sizes[n] = (tmp_path / f"state-{n}.pkl").stat().st_size
    _run(whole, 0, 60)
    whole.save(str(tmp_path / "whole.pkl"))  # no experiment location: pickled whole, as Ray does
    whole_size = (tmp_path / "whole.pkl").stat().st_size
    per_trial_whole = (whole_size - sizes[10]) / 50
    # 50 more finished trials cost the archived state a few bytes each (references, ids), not a trial.
    assert (sizes[60] - sizes[10]) / 50 < 0.1 * per_trial_whole, (sizes, whole_size)
    assert len(_files(tmp_path / "experiment")) == 2  # 10, then 50: two files
    # Outside Tune's resume the files are read next to the state file (restore_from_dir on a local
    # experiment directory).
    (tmp_path / "experiment" / "state-60.pkl").write_bytes((tmp_path / "state-60.pkl").read_bytes())
    restored = _searcher()
    restored.restore(str(tmp_path / "experiment" / "state-60.pkl"))
    assert _trials(restored) == _trials(searcher) and len(_trials(restored)) == 60


def test_a_missing_file_is_said_and_a_cut_short_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "2")
    experiment = tmp_path / "experiment"
    searcher = _searcher()
    with _at(experiment):
        _run(searcher, 0, 3)
        searcher.save(str(tmp_path / "old.pkl"))  # trials 0-2 in a file, referenced
    # A driver killed while writing its next file: the file is cut short and no state refers to it.
    (experiment / f"{ARCHIVE_PREFIX}99999999999999999999-dead{ARCHIVE_SUFFIX}").write_bytes(
        b"\x80\x05garbage"
    )
    restored = _searcher()
    with _at(experiment):
        restored.restore(str(tmp_path / "old.pkl"))
    assert _trials(restored) == _trials(searcher)
    assert "is unreadable" in caplog.text
    for path in _files(experiment):
        path.unlink()
    with _at(experiment), pytest.raises(pickle.UnpicklingError, match="refers to Optuna trial 0"):
        _searcher().restore(str(tmp_path / "old.pkl"))


def test_a_study_not_in_memory_is_pickled_whole(tmp_path: Path) -> None:
    searcher = _searcher()
    searcher._ot_study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", direction="maximize")
    with _at(tmp_path / "experiment"):
        searcher.save(str(tmp_path / "state.pkl"))
    assert not _files(tmp_path / "experiment")
    with open(tmp_path / "state.pkl", "rb") as f:
        assert isinstance(pickle.load(f), dict)  # Ray's own format: a plain pickle of __dict__
