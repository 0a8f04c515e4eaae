"""A study whose every trial diverges in its first epoch runs to the end (real local Ray + MLflow).

The reproduction of a study-ending crash: a trial that diverged before finishing an epoch reported
no search metric, Tune's strict metric check raised inside ``Tuner.fit``, and every rerun crashed
the same way. Now every report carries the metric (NaN), Optuna is told FAIL, ASHA ignores the NaN.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from workers.plan import ParamDef, SamplerConfig, SchedulerConfig, StorageConfig, StudyPlan, TrackingConfig
from workers.runner import run_study
from workers.search import create_searcher
from workers.tracking import TAG_ROLE, TAG_TRIAL_ID, TAG_TRIAL_STATUS
from workers.trainable import resolve_trial_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BASE_CONFIG: dict[str, Any] = {
    "data": {"type": "diabetes"},
    "model": {"type": "mlp", "preset": "tiny"},
    # Plain SGD without clipping at lr >= 5 blows the regression loss up within the first epoch.
    "training": {"epochs": 2, "batch_size": 32, "optimizer": "sgd", "grad_clip": None},
    "seed": 0,
}


def _plan(root: Path) -> StudyPlan:
    return StudyPlan(
        name="diverge",
        base_config=BASE_CONFIG,
        space=(ParamDef("training.lr", "float", low=5.0, high=10.0, log=True),),
        sampler=SamplerConfig(type="random", seed=3),
        scheduler=SchedulerConfig(type="asha", grace_period=1, reduction_factor=2),
        metric="val_rmse",
        mode="min",
        num_samples=3,
        max_concurrent=2,
        retries=0,
        storage=StorageConfig(path=str(root)),
        tracking=TrackingConfig(experiment="diverge"),
    )


@pytest.fixture(scope="module")
def diverged_study(
    local_ray: None, mlflow_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[StudyPlan, Any]:
    root = tmp_path_factory.mktemp("diverge")
    shutil.copyfile(mlflow_template, root / "mlflow.db")  # the default sqlite URI, schema built once
    plan = _plan(root)
    return plan, run_study(plan, progress=False)


def test_every_trial_diverges_and_the_study_still_ends(diverged_study: tuple[StudyPlan, Any]) -> None:
    plan, result = diverged_study
    assert len(result.trials) == plan.num_samples
    for trial in result.trials:
        assert trial.status == "diverged", trial.metrics
        assert 5.0 <= trial.params["training.lr"] <= 10.0
        assert trial.config == resolve_trial_config(BASE_CONFIG, trial.params)
        # The one report of a trial that diverged in epoch 1: epoch 0, the metric NaN, the loss.
        assert trial.metrics["epoch"] == 0
        assert math.isnan(trial.metrics["val_rmse"])
        assert not math.isfinite(trial.metrics["train_loss"])
    assert result.best("val_rmse", "min") is None


def test_diverged_trials_are_failures_to_optuna(diverged_study: tuple[StudyPlan, Any]) -> None:
    plan, result = diverged_study
    searcher = create_searcher(plan, study_key="x" * 16)
    searcher.restore_from_dir(result.experiment_path)
    study: Any = searcher._ot_study
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * plan.num_samples
    assert all(t.intermediate_values == {} for t in study.trials)  # NaN never reached Optuna


def test_diverged_study_in_mlflow(diverged_study: tuple[StudyPlan, Any]) -> None:
    plan, result = diverged_study
    client = MlflowClient(result.tracking_uri)
    assert result.parent_run_id is not None
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["trials_diverged"] == plan.num_samples
    runs = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
    )
    children = [c for c in runs if c.data.tags.get(TAG_ROLE) == "trial"]
    assert sorted(c.data.tags[TAG_TRIAL_ID] for c in children) == sorted(t.trial_id for t in result.trials)
    for child in children:
        assert child.data.tags[TAG_TRIAL_STATUS] == "diverged"
        assert child.info.status == "FINISHED"
        assert child.data.metrics["epoch"] == 0
        assert "config_resolved" not in child.data.metrics


def test_rerun_of_the_diverged_study_restores_without_crashing(diverged_study: tuple[StudyPlan, Any]) -> None:
    plan, first = diverged_study
    again = run_study(plan, progress=False)
    assert again.restored
    assert {t.trial_id: t.status for t in again.trials} == {t.trial_id: "diverged" for t in first.trials}
    assert again.parent_run_id == first.parent_run_id
