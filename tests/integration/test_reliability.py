"""Faults a study must survive or refuse cleanly, injected into real processes (CLI subprocesses,
a real local Ray, sqlite MLflow): diverging trials, two drivers at once, impossible resources, an
edited spec on rerun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from studies.kinds import load_study
from studies.running import run_study_spec
from studies.schema import SpecError
from studies.study_dir import SPEC_FILE, StudyDir
from tests.console_rules import console_problems

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"
CLI = [sys.executable, "-m", "studies.cli"]

DIVERGING = """\
kind: search
name: diverging
model: {type: tabular, preset: tiny}
data: {type: diabetes}
training: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 5.0, grad_clip: null, weight_decay: 0.0,
           schedule: constant, warmup_fraction: 0.0}
search:
  metric: val_rmse
  mode: min
  sampler: {type: random, seed: 0}
  num_samples: 2
  max_concurrent: 1  # one trial actor: each actor process costs seconds of CPU to start
  space:
    - {name: training.lr, type: float, low: 5.0, high: 10.0, log: true}
retries: 0
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["PYTHONPATH"] = str(ROOT)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


def _cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_rerun_with_an_edited_spec_is_refused_naming_the_field(tmp_path: Path) -> None:
    """No Ray needed: the check happens under the lease, before anything is started or written."""
    spec = load_study(SEARCH, [f"storage_path={tmp_path}"], preset="smoke")
    StudyDir.of(spec).write_text(SPEC_FILE, spec.to_yaml())
    before = (tmp_path / spec.name / SPEC_FILE).read_text()
    edited = load_study(SEARCH, [f"storage_path={tmp_path}", "training.epochs=4"], preset="smoke")
    with pytest.raises(SpecError) as err:
        run_study_spec(edited)
    assert [i.path for i in err.value.issues] == ["training.epochs"]
    assert (tmp_path / spec.name / SPEC_FILE).read_text() == before
    assert not (tmp_path / "mlflow.db").exists()
    moved = load_study(SEARCH, [f"storage_path={tmp_path}"], preset="smoke")  # same spec: accepted
    assert moved.to_yaml() == spec.to_yaml()


@pytest.mark.ray
@pytest.mark.slow
def test_diverging_trials_do_not_crash_the_study(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    (tmp_path / "diverging.yaml").write_text(DIVERGING)
    proc = _cli("run", "diverging.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # No traceback through our code. (Ray itself may log a warning with a stack trace when syncing
    # its experiment state is slow on a loaded machine; that ends nothing.)
    blocks = proc.stderr.split("Traceback (most recent call last):")[1:]
    assert not [b for b in blocks if "/studies/" in b or "/workers/" in b], proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/runs/mlflow.db")
    exp = client.get_experiment_by_name("diverging")
    assert exp is not None
    studies = client.search_runs([exp.experiment_id], filter_string="tags.`autonorm.role` = 'study'")
    assert len(studies) == 1 and studies[0].info.status == "FINISHED"
    trials = client.search_runs([exp.experiment_id], filter_string="tags.`autonorm.role` = 'trial'")
    assert len(trials) == 2
    assert {t.data.tags["autonorm.trial_status"] for t in trials} == {"diverged"}
    # A quiet console (issue #48): the service's own lines only, Tune's box and Ray's log lines in the
    # study's driver.log; the progress line counts the diverged trials; no summary JSON without --json.
    assert console_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    assert "] done: 2/2 trials (2 failed)" in proc.stdout and '"diverged": 2' not in proc.stdout
    driver_log = (tmp_path / "runs" / "diverging" / "driver.log").read_text()
    assert "Configuration for experiment" in driver_log and "Started a local Ray instance" in driver_log


@pytest.mark.ray
@pytest.mark.slow
def test_two_drivers_of_one_study_one_wins_one_is_refused(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    args = [
        "run",
        str(SEARCH),
        "--preset",
        "smoke",
        "--storage-path",
        str(tmp_path),
        "--set",
        "search.num_samples=1",  # one trial: a loser that ran anything would add a second
        "--set",
        "training.epochs=2",
        "--set",
        "search.space.0.high=2",
        "--set",
        "confirm=null",
    ]
    procs = [
        subprocess.Popen(
            [*CLI, *args], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = outs[[p.returncode for p in procs].index(1)]
    assert "held by another driver" in loser[1] and "Traceback" not in loser[1]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("autonorm_search")
    assert exp is not None
    assert len(client.search_runs([exp.experiment_id], filter_string="tags.`autonorm.role` = 'study'")) == 1
    trials = client.search_runs([exp.experiment_id], filter_string="tags.`autonorm.role` = 'trial'")
    assert len(trials) == 1 and len({t.data.tags["ray.trial_id"] for t in trials}) == 1


@pytest.mark.ray
@pytest.mark.slow
def test_impossible_resources_fail_fast_naming_the_resource(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = _cli(
        "run",
        str(SEARCH),
        "--preset",
        "smoke",
        "--storage-path",
        str(tmp_path),
        "--set",
        "resources.cpu=64",
        cwd=tmp_path,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "resources.cpu" in proc.stderr and "64" in proc.stderr and "Traceback" not in proc.stderr
    # Refused before the local cluster it could never use was started.
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    print(f"refused after {elapsed:.0f} s")  # the figure for the closing note, not an assertion
