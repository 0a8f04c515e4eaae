"""Finished trials written once, outside Tune's snapshot (workers.tune_state): the merge rules, the
files, and a real study that writes, reads and restores through them."""

from __future__ import annotations

import dataclasses
import glob
import inspect
import json
from pathlib import Path
from typing import Any

import pyarrow.fs
import pytest

from workers import tune_state
from workers.tune_state import CHUNK_PREFIX, CHUNK_SUFFIX, merge_trial_data, read_finished_trials


def _data(tid: str, status: str, tag: str = "") -> list[str]:
    return [json.dumps({"trial_id": tid, "status": status, "tag": tag}), json.dumps({"tag": tag})]


def _tags(merged: list[list[str]]) -> list[tuple[str, str]]:
    return [(json.loads(s)["trial_id"], json.loads(s)["tag"]) for s, _ in merged]


def test_a_finished_file_entry_replaces_a_snapshot_that_had_not_seen_the_trial_end() -> None:
    snapshot = [_data("a", "RUNNING", "snap"), _data("b", "PENDING", "snap")]
    finished = [("a", _data("a", "TERMINATED", "file"))]
    assert _tags(merge_trial_data(snapshot, finished)) == [("a", "file"), ("b", "snap")]


def test_between_two_terminal_states_the_snapshot_wins_and_no_trial_is_listed_twice() -> None:
    snapshot = [_data("a", "TERMINATED", "snap"), _data("c", "ERROR", "snap")]
    finished = [("a", _data("a", "TERMINATED", "file")), ("b", _data("b", "TERMINATED", "file"))]
    assert _tags(merge_trial_data(snapshot, finished)) == [("b", "file"), ("a", "snap"), ("c", "snap")]


def test_files_are_read_in_the_order_written_and_a_cut_short_line_is_skipped(tmp_path: Path) -> None:
    fs = pyarrow.fs.LocalFileSystem()
    first = tune_state._write_chunk(
        fs, str(tmp_path), [("a", _data("a", "TERMINATED")), ("b", _data("b", "TERMINATED"))]
    )
    second = tune_state._write_chunk(fs, str(tmp_path), [("c", _data("c", "TERMINATED"))])
    assert Path(first).name.startswith(CHUNK_PREFIX) and first.endswith(CHUNK_SUFFIX)
    # A driver killed while writing: the last line stops half-way.
    with open(second, "a") as fh:
        fh.write('{"trial_id": "d", "state": "{\\"trial_')
    (tmp_path / "experiment_state-x.json").write_text("{}")  # not a finished-trials file
    assert [tid for tid, _ in read_finished_trials(fs, str(tmp_path))] == ["a", "b", "c"]
    assert read_finished_trials(fs, str(tmp_path / "missing")) == []


def test_the_trials_per_file_come_from_the_environment_with_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "3")
    assert tune_state.chunk_trials() == 3
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "many")
    assert tune_state.chunk_trials() == tune_state.CHUNK_TRIALS
    monkeypatch.delenv(tune_state.CHUNK_TRIALS_ENV)
    assert tune_state.chunk_trials() == tune_state.CHUNK_TRIALS


def test_the_private_tune_api_it_wraps_is_there() -> None:
    from ray.tune.analysis import experiment_analysis
    from ray.tune.execution.tune_controller import TuneController

    assert list(inspect.signature(TuneController._restore_trials).parameters) == ["self", "experiment_state"]
    # Tune's sets of trials by status, which the snapshot skip and the compaction count.
    status_sets = inspect.getsource(TuneController._set_trial_status)
    for name in ("_pending_trials", "_running_trials", "_paused_trials", "_stopped_trials", "_failed_trials"):
        assert f"self.{name}" in status_sets, name
    assert '"trial_data": list(self._get_trial_checkpoints().values())' in inspect.getsource(
        TuneController.save_to_dir
    )
    assert "self._trial_metadata" in inspect.getsource(TuneController._get_trial_checkpoints)
    load_src = inspect.getsource(experiment_analysis.ExperimentAnalysis._load_trials)
    assert "_loads_with_cloudpickle(" in load_src and 'experiment_state["trial_data"]' in load_src
    init_src = inspect.getsource(experiment_analysis.ExperimentAnalysis.__init__)
    assert "self._fs" in init_src and "self._experiment_fs_path" in init_src
    # Tune's sync-down copies .json and .pkl files into the staging folder (and up again at each save).
    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager

    down = inspect.getsource(_ExperimentCheckpointManager.sync_down_experiment_state)
    assert 'endswith(".json")' in down and 'endswith(".pkl")' in down and ".jsonl" not in down


@pytest.mark.ray
@pytest.mark.slow
def test_a_study_writes_its_finished_trials_once_and_reads_and_restores_them_all(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray import tune

    from tests.workers.trials import quadratic_trial
    from workers.plan import SamplerConfig, SchedulerConfig, StorageConfig, StudyPlan, TrackingConfig
    from workers.results import read_trials
    from workers.runner import run_study

    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "2")
    log = tmp_path / "calls.jsonl"
    plan = StudyPlan(
        name="chunks",
        base_config={"training": {"epochs": 2}, "log_file": str(log)},
        space=(),
        sampler=SamplerConfig(type="grid"),
        grid=(("x", (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)),),
        num_samples=1,
        max_concurrent=2,
        scheduler=SchedulerConfig(type="fifo"),
        storage=StorageConfig(path=str(tmp_path / "runs")),
        tracking=TrackingConfig(experiment="chunks"),
    )
    result = run_study(plan, trainable=quadratic_trial, progress=False)
    ids = {t.trial_id for t in result.trials}
    assert len(ids) == 8 and all(t.status == "completed" for t in result.trials)

    experiment = tmp_path / "runs" / "chunks"
    files = sorted(glob.glob(str(experiment / f"{CHUNK_PREFIX}*{CHUNK_SUFFIX}")))
    in_files = [tid for tid, _ in read_finished_trials(pyarrow.fs.LocalFileSystem(), str(experiment))]
    assert files and len(in_files) == len(set(in_files)) >= 4  # each finished trial written once
    state = max(experiment.glob("experiment_state-*.json"), key=lambda p: p.name)
    in_snapshot = {json.loads(s)["trial_id"] for s, _ in json.loads(state.read_text())["trial_data"]}
    assert len(in_snapshot) < 8 and in_snapshot | set(in_files) == ids

    # Every reader sees all eight: Tune's own analysis, the study's records, and a restore.
    assert {t.trial_id for t in tune.ExperimentAnalysis(str(experiment)).trials} == ids
    assert {r.trial_id for r in read_trials(plan)} == ids

    # A second read of an unchanged phase is the first one's records; a changed state is read again.
    from workers import results

    built: list[bool] = []
    real_class = results._analysis_class

    def counted(history: bool) -> Any:
        built.append(history)
        return real_class(history)

    monkeypatch.setattr(results, "_analysis_class", counted)
    first = read_trials(plan)
    assert read_trials(plan) == first and read_trials(plan, history=False) == [
        dataclasses.replace(r, history=()) for r in first
    ]
    assert built == [] and all(r.history for r in first)  # all three from the read above
    state.touch()
    assert read_trials(plan, history=False) == [dataclasses.replace(r, history=()) for r in first]
    assert built == [False]
    starts = sum(json.loads(line)["event"] == "start" for line in log.read_text().splitlines())
    again = run_study(plan, trainable=quadratic_trial, progress=False)
    assert again.restored and {t.trial_id for t in again.trials} == ids
    assert all(t.status == "completed" for t in again.trials)
    assert (
        sum(json.loads(line)["event"] == "start" for line in log.read_text().splitlines()) == starts
    )  # none rerun


class _Trial:
    def __init__(self, tid: str, status: str) -> None:
        self.trial_id, self.status = tid, status


class _Syncer:
    def __init__(self) -> None:
        self.waits = 0

    def wait(self) -> None:
        self.waits += 1


class _Storage:
    def __init__(self, root: Path) -> None:
        self.storage_filesystem = pyarrow.fs.LocalFileSystem()
        self.experiment_fs_path = str(root)
        self.syncer = _Syncer()


class _Searcher:
    def __init__(self) -> None:
        self.saves = 0

    def save_to_dir(self, dirpath: str, session_str: str) -> None:
        self.saves += 1


class _Controller:
    """The parts of Tune's controller the snapshot wrapper reads."""

    def __init__(self, root: Path) -> None:
        self._trials: list[_Trial] = []
        self._trial_metadata: dict[str, list[str]] = {}
        self._storage = _Storage(root)
        self._search_alg = _Searcher()
        self._seen: dict[str, str] = {}

    @property
    def _stopped_trials(self) -> set[_Trial]:  # Tune keeps a set per status
        return {t for t in self._trials if t.status == "TERMINATED"}

    @property
    def _failed_trials(self) -> set[_Trial]:
        return {t for t in self._trials if t.status == "ERROR"}

    def _get_trial_checkpoints(self) -> dict[str, list[str]]:
        # Tune re-serialises the trials that changed since the last call (new ones, new statuses).
        for t in self._trials:
            if self._seen.get(t.trial_id) != t.status:
                self._trial_metadata[t.trial_id] = _data(t.trial_id, t.status)
                self._seen[t.trial_id] = t.status
        return self._trial_metadata

    def save_to_dir(self) -> None:
        self.snapshot = list(self._get_trial_checkpoints())
        self._search_alg.save_to_dir("dir", "session")


def test_finished_trials_leave_the_snapshot_after_one_save_and_in_files_of_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tune_state.CHUNK_TRIALS_ENV, "2")
    c = _Controller(tmp_path)
    save = tune_state._compacting_save(_Controller.save_to_dir)
    c._trials = [_Trial("a", "TERMINATED"), _Trial("b", "TERMINATED"), _Trial("c", "RUNNING")]
    save(c)
    assert c.snapshot == ["a", "b", "c"]  # ended since the last save: they wait one
    save(c)
    assert c.snapshot == ["c"]
    assert [tid for tid, _ in read_finished_trials(c._storage.storage_filesystem, str(tmp_path))] == [
        "a",
        "b",
    ]
    c._trials[2].status = "TERMINATED"
    save(c)
    save(c)
    assert c.snapshot == ["c"]  # one finished trial is fewer than a file's two: it stays
    c._trials.append(_Trial("d", "ERROR"))
    c._trials.append(_Trial("e", "TERMINATED"))
    save(c)
    save(c)
    assert c.snapshot == ["d"]  # an errored trial always stays: a restore runs it again
    assert len(list(tmp_path.glob(f"{CHUNK_PREFIX}*"))) == 2


def test_the_searcher_is_saved_when_a_trial_comes_or_ends_not_for_a_result_or_a_start(tmp_path: Path) -> None:
    c = _Controller(tmp_path)
    save = tune_state._compacting_save(_Controller.save_to_dir)
    c._trials = [_Trial("a", "PENDING")]
    save(c)
    save(c)  # a result: the same trials, the same statuses
    c._trials[0].status = "RUNNING"
    save(c)  # a start: the searcher suggested the trial when it was added
    assert c._search_alg.saves == 1
    c._trials[0].status = "TERMINATED"
    save(c)  # an Optuna searcher learns the trial's value
    c._trials.append(_Trial("b", "PENDING"))
    save(c)
    save(c)
    assert c._search_alg.saves == 3
    assert "save_to_dir" not in vars(c._search_alg)  # the method is back after a skipped save


def test_tunes_grid_is_saved_when_a_trial_ends_too(tmp_path: Path) -> None:
    # Its concurrency bookkeeping (live trials against max_concurrent_trials) changes when a trial
    # ends: a grid restored from a state saved before that waits for the trial forever (found by the
    # batch-size SIGKILL test when the grid was saved only when a trial was added).
    from ray.tune.search import BasicVariantGenerator

    class Grid(BasicVariantGenerator):  # type: ignore[misc]
        saves = 0

        def save_to_dir(self, dirpath: Any, session_str: Any) -> Any:  # type: ignore[override]
            Grid.saves += 1

    c = _Controller(tmp_path)
    c._search_alg = Grid()  # type: ignore[assignment]
    save = tune_state._compacting_save(_Controller.save_to_dir)
    c._trials = [_Trial("a", "PENDING"), _Trial("b", "PENDING")]
    save(c)
    c._trials[0].status = "RUNNING"
    save(c)
    assert Grid.saves == 1
    c._trials[0].status = "TERMINATED"
    save(c)
    assert Grid.saves == 2


class _TrialStorage:
    def __init__(self, staging: Path, remote: Path) -> None:
        self.trial_driver_staging_path = str(staging)
        self.trial_fs_path = str(remote)


def test_a_written_trials_staging_folder_is_uploaded_once_more_then_removed(tmp_path: Path) -> None:
    staging, remote = tmp_path / "staging", tmp_path / "storage"
    done = _Trial("a", "TERMINATED")
    done.storage = _TrialStorage(staging / "a", remote / "a")  # type: ignore[attr-defined]
    (staging / "a").mkdir(parents=True)
    (staging / "a" / "result.json").write_text('{"epoch": 3}\n')
    empty = _Trial("b", "TERMINATED")
    empty.storage = _TrialStorage(staging / "b", remote / "b")  # type: ignore[attr-defined]
    (staging / "b").mkdir()
    storage = _Storage(tmp_path)
    tune_state.retire_staging(storage, [done, empty, _Trial("c", "TERMINATED")])  # c: no storage at all
    assert (remote / "a" / "result.json").read_text() == '{"epoch": 3}\n'
    assert not (staging / "a").exists() and not (staging / "b").exists() and not (remote / "b").exists()
    assert storage.syncer.waits == 1  # a sync still copying is waited for first
