"""Credentials come only from the environment and go nowhere else.

A real study (``studies/autonorm_search.py --preset smoke``) runs with S3 trial storage and the
MLflow server; its S3 secret key is genuinely in use, and a second, planted secret sits in the same
environment. Neither may appear in any MLflow param, tag, metric name or artifact, nor in any log
line of the driver, of Ray (every file of the session's log directory) or of the MLflow server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import short_tmp_dir
from tests.services import MlflowServer, S3Server

pytestmark = [pytest.mark.services, pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


class StudyRun:
    def __init__(self, name: str, canary: str, ray_tmp: Path, output: str, storage_prefix: str) -> None:
        self.name = name
        self.canary = canary
        self.ray_tmp = ray_tmp
        self.output = output
        self.storage_prefix = storage_prefix


@pytest.fixture(scope="module")
def study_run(s3_server: S3Server, mlflow_server: MlflowServer) -> Iterator[StudyRun]:
    name = f"security_{secrets.token_hex(4)}"
    canary = f"planted-{secrets.token_hex(16)}"
    ray_tmp = short_tmp_dir("rt_sec_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_", "MLFLOW_"))}
    env.update(
        AWS_ACCESS_KEY_ID=s3_server.access_key,
        AWS_SECRET_ACCESS_KEY=s3_server.secret_key,
        AWS_DEFAULT_REGION=s3_server.region,
        AUTONORM_PLANTED_SECRET=canary,
        MLFLOW_TRACKING_URI=mlflow_server.tracking_uri,
        # The embedded local cluster keeps its session (and logs) in this directory, on loopback.
        RAY_TMPDIR=str(ray_tmp),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    prefix = f"security-{name}"
    result = subprocess.run(
        [
            sys.executable,
            "studies/autonorm_search.py",
            "--preset",
            "smoke",
            "--set",
            f"name={name}",
            # One search trial of 2 epochs: what is scanned is every kind of record, not their number
            # (the trial still writes its S3 trial storage and Tune state with the secret in use).
            "--set",
            "search.num_samples=1",
            "--set",
            "search.max_concurrent=1",  # one trial actor per phase
            "--set",
            "training.epochs=2",
            "--set",
            "search.space.0.high=2",
            # A small confirm phase: its phase runs, reports and claims go through the scans too.
            "--set",
            "confirm={arms: [frozen_ln, autonorm_s], seeds: [100, 101], lr_tuning: null}",
            "--storage-path",
            f"s3://{s3_server.bucket}/{prefix}",
            "--set",
            f"storage.endpoint_override={s3_server.endpoint}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    try:
        yield StudyRun(name, canary, ray_tmp, output, prefix)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _secrets(run: StudyRun, s3: S3Server) -> list[str]:
    return [run.canary, s3.secret_key]


def _mlflow_records(mlflow_server: MlflowServer, experiment: str) -> tuple[Any, list[Any]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return exp, client.search_runs([exp.experiment_id], max_results=1000)


def test_secret_in_no_mlflow_param_tag_or_metric(
    study_run: StudyRun, s3_server: S3Server, mlflow_server: MlflowServer
) -> None:
    exp, runs = _mlflow_records(mlflow_server, study_run.name)
    roles = [r.data.tags.get("autonorm.role") for r in runs]
    assert roles.count("study") == 1 and roles.count("trial") >= 1  # the study really was tracked
    texts = [str(exp.tags), exp.artifact_location or ""]
    for run in runs:
        texts += [
            str(run.data.params),
            str(run.data.tags),
            " ".join(run.data.metrics),
            run.info.run_name or "",
        ]
    blob = "\n".join(texts)
    assert any(run.data.params for run in runs)  # the check looks at something
    assert [i for i, secret in enumerate(_secrets(study_run, s3_server)) if secret in blob] == []


def test_secret_in_no_mlflow_artifact(
    study_run: StudyRun, s3_server: S3Server, mlflow_server: MlflowServer
) -> None:
    exp, runs = _mlflow_records(mlflow_server, study_run.name)
    client = s3_server.boto3_client()
    keys = [k for k in s3_server.list_keys("mlflow-artifacts/") if f"/{exp.experiment_id}/" in f"/{k}"]
    run_ids = {r.info.run_id for r in runs}
    assert keys and any(any(rid in k for rid in run_ids) for k in keys)  # the spec artifact at least
    for key in keys:
        body = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
        found = [i for i, secret in enumerate(_secrets(study_run, s3_server)) if secret.encode() in body]
        assert found == [], key


def test_secret_in_no_log_line(study_run: StudyRun, s3_server: S3Server, mlflow_server: MlflowServer) -> None:
    logs = {"driver output": study_run.output}
    sessions = list(study_run.ray_tmp.glob("ray/session_*/logs"))
    assert sessions, "the study's Ray session logs are missing"
    for path in sorted(p for s in sessions for p in s.rglob("*") if p.is_file()):
        logs[str(path)] = path.read_text(errors="replace")
    logs["mlflow server"] = mlflow_server.handle.log_path.read_text(errors="replace")
    assert len(logs) > 5
    leaks = [
        f"{name} (secret #{i})"
        for name, text in logs.items()
        for i, secret in enumerate(_secrets(study_run, s3_server))
        if secret in text
    ]
    assert leaks == []


def test_secret_in_no_object_under_the_storage_prefix(study_run: StudyRun, s3_server: S3Server) -> None:
    """Tune state (tuner.pkl, experiment state, searcher state), checkpoints, study_spec.yaml, reports:
    every object the study wrote under its storage prefix, read back byte by byte."""
    client = s3_server.boto3_client()
    keys = s3_server.list_keys(f"{study_run.storage_prefix}/")
    assert any(k.endswith("study_spec.yaml") for k in keys) and any(k.endswith("tuner.pkl") for k in keys)
    for key in keys:
        body = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
        found = [i for i, secret in enumerate(_secrets(study_run, s3_server)) if secret.encode() in body]
        assert found == [], key
