"""Whole studies on a real local Ray cluster (one per module) with injected cheap trial functions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from tests.workers.trials import quadratic_trial
from workers.plan import ParamDef, SamplerConfig, SchedulerConfig, StorageConfig, StudyPlan, TrackingConfig
from workers.runner import run_study
from workers.search import create_searcher
from workers.tracking import TAG_ROLE, TAG_TRIAL_ID

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPACE = (
    ParamDef("x", "float", low=0.0, high=1.0),
    ParamDef("kind", "categorical", choices=("a", "b")),
    ParamDef("beta", "float", low=0.5, high=2.0, when=(("kind", "b"),)),
)


def _plan(root: Path, name: str, **kwargs: Any) -> StudyPlan:
    defaults: dict[str, Any] = {
        "name": name,
        "base_config": {"training": {"epochs": 4}, "seed": 0, "log_file": str(root / f"{name}.jsonl")},
        "space": SPACE,
        "sampler": SamplerConfig(type="random", seed=7),
        "num_samples": 8,
        "max_concurrent": 2,
        "storage": StorageConfig(path=str(root / "runs")),
        "tracking": TrackingConfig(experiment=name),
        "artifacts": (("resolved_spec.yaml", f"name: {name}\n"),),
        "tags": (("autonorm.spec_hash", "feedbeef"),),
    }
    defaults.update(kwargs)
    return StudyPlan(**defaults)


def _invocations(plan: StudyPlan) -> list[dict[str, Any]]:
    path = Path(plan.base_config["log_file"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _mlflow_runs(uri: str, experiment: str) -> tuple[list[Any], list[Any]]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    return (
        [r for r in runs if r.data.tags.get(TAG_ROLE) == "study"],
        [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"],
    )


@pytest.fixture(scope="module")
def asha_study(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[StudyPlan, Any]:
    root = tmp_path_factory.mktemp("asha")
    plan = _plan(root, "asha", scheduler=SchedulerConfig(type="asha", grace_period=1, reduction_factor=2))
    return plan, run_study(plan, trainable=quadratic_trial, progress=True)


def test_asha_study_runs_every_trial_with_conditional_params(asha_study: tuple[StudyPlan, Any]) -> None:
    plan, result = asha_study
    assert len(result.trials) == plan.num_samples
    assert not result.restored
    for trial in result.trials:
        assert ("beta" in trial.params) == (trial.params["kind"] == "b")
        assert trial.config["training"]["epochs"] == 4 and trial.config["x"] == trial.params["x"]
        assert trial.status in ("completed", "pruned")
        assert trial.node_id and trial.node_id != "local"
        last_epoch = trial.metrics["epoch"]
        assert (trial.status == "completed") == (last_epoch == 4)
    counts = Counter(t.status for t in result.trials)
    assert counts["pruned"] >= 1, counts  # ASHA (rf 2) stops the worse half at each rung
    assert counts["completed"] >= 1, counts


def test_asha_stopped_trials_reach_optuna_as_pruned(asha_study: tuple[StudyPlan, Any]) -> None:
    plan, result = asha_study
    # Tune saved the searcher (and its in-memory Optuna study) in the experiment directory.
    searcher = create_searcher(plan, study_key="x" * 16)
    searcher.restore_from_dir(result.experiment_path)
    # Finished Optuna trials were written once, to files of their own (the suite writes files of two:
    # tests/conftest.py), and the restored searcher has them all back from there.
    assert list(Path(result.experiment_path).glob("optuna-trials-*.bin"))
    assert searcher._archived
    states = Counter(t.state for t in searcher._ot_study.trials)
    counts = Counter(t.status for t in result.trials)
    assert states[optuna.trial.TrialState.PRUNED] == counts["pruned"]
    assert states[optuna.trial.TrialState.COMPLETE] == counts["completed"]
    assert sum(states.values()) == plan.num_samples
    # Optuna stores a PRUNED trial's last intermediate value as its value, so select by state.
    complete = optuna.trial.TrialState.COMPLETE
    complete_values = sorted(t.value for t in searcher._ot_study.trials if t.state == complete)
    reported = sorted(t.metrics["val_accuracy"] for t in result.trials if t.status == "completed")
    assert complete_values == pytest.approx(reported)


def test_asha_study_in_mlflow(asha_study: tuple[StudyPlan, Any]) -> None:
    plan, result = asha_study
    assert result.tracking_uri == f"sqlite:///{Path(plan.storage.path) / 'mlflow.db'}"
    parents, children = _mlflow_runs(result.tracking_uri, plan.tracking.experiment)
    assert [p.info.run_id for p in parents] == [result.parent_run_id]
    assert parents[0].info.status == "FINISHED"
    assert parents[0].data.params["expected_trials"] == str(plan.num_samples)
    assert parents[0].data.metrics["trials_pruned"] == Counter(t.status for t in result.trials)["pruned"]
    client = MlflowClient(result.tracking_uri)
    # The plan's resolved spec and the copy of its Optuna study (optuna-dashboard reads it).
    assert [a.path for a in client.list_artifacts(result.parent_run_id)] == [
        "optuna.db",
        "resolved_spec.yaml",
    ]
    by_trial = Counter(c.data.tags[TAG_TRIAL_ID] for c in children)
    assert by_trial == Counter(t.trial_id for t in result.trials)  # exactly one child per trial
    records = {t.trial_id: t for t in result.trials}
    for child in children:
        record = records[child.data.tags[TAG_TRIAL_ID]]
        assert child.info.status == "FINISHED"
        assert child.info.run_id == record.mlflow_run_id
        assert child.data.tags["autonorm.trial_status"] == record.status
        assert set(child.data.metrics) == {"epoch", "val_accuracy", "train_loss", "gate_entropy"}
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val_accuracy")]
        assert sorted(steps) == list(range(1, record.metrics["epoch"] + 1))
        assert child.data.params["x"] == str(record.params["x"])
        assert child.data.params["seed"] == "0"


def test_rerun_of_a_finished_study_restores_and_runs_nothing(asha_study: tuple[StudyPlan, Any]) -> None:
    plan, first = asha_study
    before = _invocations(plan)
    again = run_study(plan, trainable=quadratic_trial, progress=False)
    assert again.restored
    assert _invocations(plan) == before
    assert {t.trial_id: t.status for t in again.trials} == {t.trial_id: t.status for t in first.trials}
    parents, children = _mlflow_runs(again.tracking_uri, plan.tracking.experiment)
    assert len(parents) == 1 and parents[0].info.run_id == first.parent_run_id
    assert len(children) == plan.num_samples
    assert all(r.info.status == "FINISHED" for r in parents + children)


def test_a_study_whose_tuner_state_was_cut_short_restores_from_its_spec(
    asha_study: tuple[StudyPlan, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Tune copied ``tuner.pkl`` again at every snapshot of a restored driver; a SIGKILL mid-copy
    left it empty and no rerun could restore (CI, the fault chain). It is written again from the
    spec, and the rerun restores the study as it was."""
    import pickle

    from workers.runner import TUNER_STATE

    plan, first = asha_study
    before = _invocations(plan)
    state = Path(first.experiment_path) / TUNER_STATE
    state.write_bytes(b"")
    again = run_study(plan, trainable=quadratic_trial, progress=False)
    assert again.restored
    assert (
        f"{TUNER_STATE} in {first.experiment_path} is unreadable (empty); written again"
        in capsys.readouterr().out
    )
    assert _invocations(plan) == before  # nothing trained again
    assert {t.trial_id: t.status for t in again.trials} == {t.trial_id: t.status for t in first.trials}
    assert pickle.loads(state.read_bytes())["_tune_config"].num_samples == plan.num_samples
    # Whole files only: no temporary copy is left in the experiment directory.
    assert not [p for p in Path(first.experiment_path).rglob("*.partial")]
    parents, children = _mlflow_runs(again.tracking_uri, plan.tracking.experiment)
    assert len(parents) == 1 and len(children) == plan.num_samples


def test_grid_study_covers_the_product_times_repeats(local_ray: None, tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        "grid",
        space=(),
        sampler=SamplerConfig(type="grid"),
        grid=(("seed", (0, 1)), ("x", (0.2, 0.4, 0.6))),
        num_samples=2,
        scheduler=SchedulerConfig(type="fifo"),
        base_config={"training": {"epochs": 2}, "log_file": str(tmp_path / "grid.jsonl")},
    )
    result = run_study(plan, trainable=quadratic_trial, progress=False)
    combos = Counter((t.config["seed"], t.config["x"]) for t in result.trials)
    assert combos == {(s, x): 2 for s in (0, 1) for x in (0.2, 0.4, 0.6)}
    assert all(t.status == "completed" for t in result.trials)
    assert len([e for e in _invocations(plan) if e["event"] == "start"]) == 12


def test_tune_saves_its_state_when_a_trial_changes_not_at_every_idle_loop_step(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tune's loop steps every 0.1 s while a trial sleeps between epochs; with the snapshot at every step
    # (TUNE_GLOBAL_CHECKPOINT_S=0) each idle step saved again: 2 trials x 3 epochs x 0.4 s plus the
    # actor's start is ~40+ snapshots. Saved: a handful per change. The state on disk is still the last
    # one (every trial TERMINATED with its last epoch), which is what a restore reads.
    from ray import tune
    from ray.tune.execution.tune_controller import TuneController

    saves: list[int] = []
    original = TuneController.save_to_dir

    def counted(self: Any) -> None:
        saves.append(len(self._trials))
        original(self)

    monkeypatch.setattr(TuneController, "save_to_dir", counted)
    plan = _plan(
        tmp_path,
        "snap",
        space=(),
        sampler=SamplerConfig(type="grid"),
        grid=(("x", (0.2, 0.4)),),
        num_samples=1,
        max_concurrent=1,
        scheduler=SchedulerConfig(type="fifo"),
        base_config={"training": {"epochs": 3}, "sleep_s": 0.4, "log_file": str(tmp_path / "snap.jsonl")},
    )
    result = run_study(plan, trainable=quadratic_trial, progress=False)
    assert [t.status for t in result.trials] == ["completed", "completed"]
    reports = sum(len(t.history) or 3 for t in result.trials)
    assert 0 < len(saves) <= 4 * reports + 8, len(saves)  # every idle step: well over 40
    analysis = tune.ExperimentAnalysis(str(tmp_path / "runs" / "snap"))
    assert sorted(t.status for t in analysis.trials) == ["TERMINATED", "TERMINATED"]
    assert sorted(t.last_result["epoch"] for t in analysis.trials) == [3, 3]


def test_the_private_tune_api_the_snapshot_skip_wraps_is_there() -> None:
    import inspect

    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment.trial import Trial

    from workers.ray_internals import skip_idle_snapshots
    from workers.tune_state import book

    skip_idle_snapshots(book)
    assert getattr(TuneController.checkpoint, "_autonorm_skips_idle", False)
    assert list(inspect.signature(TuneController.checkpoint).parameters) == ["self", "force", "wait"]
    manager_src = inspect.getsource(_ExperimentCheckpointManager)
    assert (
        "self._should_force_sync_up" in manager_src
        and "self._last_save_time = time.monotonic()" in manager_src
    )
    assert "self.checkpoint()" in inspect.getsource(TuneController.step)  # the per-step snapshot it skips
    metadata = Trial("__fake", stub=True).run_metadata
    assert {"last_result_time", "num_failures", "error_filename"} <= set(vars(metadata))
