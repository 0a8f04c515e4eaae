"""A study against real services: MLflow server on PostgreSQL with artifacts in S3 (SeaweedFS),
and Tune's own experiment state and checkpoints in the same S3 store (``s3://`` storage path)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.services import embedded_ray
from tests.workers.conftest import ray_env
from tests.workers.trials import quadratic_trial
from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig
from workers.runner import run_study
from workers.tracking import TAG_ROLE, TAG_TRIAL_ID

# own_ray: the S3 keys reach the trial workers through the environment of the cluster this test starts.
pytestmark = [pytest.mark.services, pytest.mark.ray, pytest.mark.slow, pytest.mark.own_ray]


def test_study_logs_to_mlflow_server_and_stores_state_in_s3(
    mlflow_server: Any, s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Keys reach the driver and the trial workers from the environment only (never from the plan,
    # never inside pickled state): the cluster's processes inherit them, as on a real node.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    with embedded_ray("rt_svc_", ray_env()):
        _study_against_services(mlflow_server, s3_server, tmp_path)


def _study_against_services(mlflow_server: Any, s3_server: Any, tmp_path: Path) -> None:
    name = f"svc-{uuid.uuid4().hex[:8]}"
    prefix = f"tune/{name}"
    plan = StudyPlan(
        name=name,
        base_config={"training": {"epochs": 2}, "seed": 0},
        space=(ParamDef("x", "float", low=0.0, high=1.0),),
        sampler=SamplerConfig(type="random", seed=0),
        num_samples=3,
        max_concurrent=2,
        storage=StorageConfig(
            path=f"s3://{s3_server.bucket}/{prefix}",
            endpoint_override=s3_server.endpoint,
            region=s3_server.region,
        ),
        tracking=TrackingConfig(uri=mlflow_server.tracking_uri, experiment=name),
        artifacts=(("resolved_spec.yaml", f"name: {name}\n"),),
    )
    result = run_study(plan, trainable=quadratic_trial, progress=False)
    assert result.experiment_path == f"s3://{s3_server.bucket}/{prefix}/{name}"
    assert result.tracking_uri == mlflow_server.tracking_uri
    assert [t.status for t in result.trials] == ["completed"] * 3

    client = MlflowClient(mlflow_server.tracking_uri)
    exp = client.get_experiment_by_name(name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(TAG_ROLE) == "study"]
    children = [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]
    assert [p.info.run_id for p in parents] == [result.parent_run_id]
    assert sorted(c.data.tags[TAG_TRIAL_ID] for c in children) == sorted(t.trial_id for t in result.trials)
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == result.parent_run_id
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "val_accuracy"))
        assert steps == [1, 2]
    assert parents[0].info.status == "FINISHED"

    # The parent's artifact went through the server's proxy into the bucket.
    keys = s3_server.list_keys("mlflow-artifacts/")
    assert any(k.endswith(f"{result.parent_run_id}/artifacts/resolved_spec.yaml") for k in keys), keys
    downloaded = client.download_artifacts(result.parent_run_id, "resolved_spec.yaml", str(tmp_path))
    assert Path(downloaded).read_text() == f"name: {name}\n"

    # Tune's experiment state and per-epoch checkpoints are in the bucket, so a restore works from S3.
    tune_keys = s3_server.list_keys(f"{prefix}/{name}/")
    assert any("experiment_state" in k for k in tune_keys), tune_keys
    assert sum("checkpoint_000001" in k for k in tune_keys) >= 3
    again = run_study(plan, trainable=quadratic_trial, progress=False)
    assert again.restored and again.parent_run_id == result.parent_run_id
    assert len(client.search_runs([exp.experiment_id])) == 4  # still one parent + three children
