"""A study submitted with ``ray job submit`` to a token-auth head (``ray_head``), as a user would.
(``autonorm-study submit``, with its credential and commit checks, is tested with four studies at
once in test_concurrent_studies.py.)

The job uploads this repository as its working directory (without ``.venv``, ``.git``, run outputs:
Ray refuses uploads over its size limit, and the cluster has its own interpreter), runs the study
driver inside the job, and writes results to an absolute path outside the temporary copy, where the
test reads them back from MLflow.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from studies.cli import DEFAULT_EXCLUDES
from tests.services import RayNode

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
# `<plan name>-<index>` by default, or what the plan's run_name template makes; never Tune's
# internal trainable (`tune_entry_...`) or its bare trial id.
READABLE = re.compile(r"[A-Za-z][\w.]*(-[\w.]+)+")


def _assert_readable(runs: Sequence[Any]) -> None:
    names = [r.info.run_name for r in runs]
    assert len(set(names)) == len(names), names
    for name in names:
        assert READABLE.fullmatch(name) and not name.startswith(("tune_entry", "trial_")), names


def _job_env(ray_head: RayNode, tmp_path: Path) -> dict[str, str]:
    env = ray_head.client_env()
    for key in list(env):  # a developer shell's MLflow / S3 settings must not leak into the job
        if key.startswith(("MLFLOW_", "AWS_")):
            del env[key]
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840, check=False)


def test_ray_job_submit_runs_the_search_study_and_logs_it_to_mlflow(
    ray_head: RayNode, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    env = _job_env(ray_head, tmp_path)
    job_id = f"autonorm-search-{uuid.uuid4().hex[:8]}"
    proc = _run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            ray_head.dashboard_url,
            "--submission-id",
            job_id,
            "--working-dir",
            str(ROOT),
            "--runtime-env-json",
            # `ray job submit` does not pass its own environment to the job: only env_vars do.
            json.dumps(
                {
                    "excludes": list(DEFAULT_EXCLUDES),
                    "env_vars": {"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
                }
            ),
            "--",
            "python",
            "studies/autonorm_search.py",
            "--preset",
            "smoke",
            "--set",
            "search.num_samples=2",
            "--set",
            "training.epochs=2",
            "--set",
            "search.space.0.high=2",  # t_freeze in 1..epochs
            "--set",
            "confirm=null",  # the search alone: its study run, two trial runs (no confirmatory phases)
            "--set",
            f"storage_path={tmp_path / 'runs'}",
        ],
        env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert f"Job '{job_id}' succeeded" in output, output[-4000:]

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiment_ids, max_results=1000)
    parents = [r for r in runs if r.data.tags.get("autonorm.role") == "study"]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    phases = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [(r.info.run_name, r.data.tags.get("autonorm.role")) for r in phases] == [("search", "phase")]
    assert phases[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == phases[0].info.run_id]
    assert len(children) == 2, [(r.info.status, r.data.tags.get("autonorm.role")) for r in children]
    for child in children:
        assert child.data.tags.get("autonorm.role") == "trial"
        assert child.info.status != "RUNNING"
        assert "val_accuracy" in child.data.metrics, sorted(child.data.metrics)
        assert 0.0 <= child.data.metrics["val_accuracy"] <= 1.0
    assert (
        len(runs) == 4
    )  # study, phase, 2 trials: nothing else was logged (e.g. by a driver that fell back to ./mlruns)
    _assert_readable(children)
    for run in runs:
        assert run.data.tags.get("mlflow.source.type") == "JOB"
        assert run.data.tags.get("mlflow.source.name") == "studies/autonorm_search.py"
    # The driver says where the results are, with a direct link to the runs table.
    study_dir = tmp_path / "runs" / parent.info.run_name
    assert f"results: {study_dir}" in output, output[-4000:]
    assert f"/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}" in output
    assert (study_dir / "search" / "optuna.db").is_file()
