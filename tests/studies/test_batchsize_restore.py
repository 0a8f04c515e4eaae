"""SIGKILL the batch-size smoke study mid-way, run it again: every trial accounted for exactly once.

The driver runs the smoke cut to 2 arms x 2 batch sizes (12 tuning, 8 confirmatory trials) with real
training, each cell's trials stacked (``execution.stack: auto``: the confirmatory phase is 4 groups of
2 seeds); the kill lands in the confirmatory phase right after its first group reported its first
epoch, so the rerun restores groups mid-way from their checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from tests.console_rules import console_problems
from tests.studies.batchsize_driver import spec_for
from tests.workers.conftest import REPO_ROOT, ray_env
from tests.workers.test_restore import _stop_tree

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _driver(storage: Path, temp_dir: str) -> subprocess.Popen[str]:
    env = {**os.environ, **ray_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.studies.batchsize_driver", str(storage), temp_dir, "stacked"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _reported(phase: Path) -> bool:
    """A trial of the phase has written its result (its folder's result.json is not empty)."""
    return any(p.stat().st_size > 0 for p in phase.glob("*/result.json"))


def test_batchsize_study_killed_mid_way_then_rerun_accounts_exactly() -> None:
    storage = Path(tempfile.mkdtemp(prefix="bs_kill_"))
    temp_dir = tempfile.mkdtemp(prefix="rt_bk_", dir="/tmp")
    spec = spec_for(storage)
    try:
        first = _driver(storage, temp_dir)
        tree: list[psutil.Process] = []
        confirm = storage / spec.name / "confirm-epochs"
        try:
            # Kill inside the second phase, as soon as its first group has reported an epoch: the
            # 4 groups (2 arms x 2 batch sizes, 2 seeds each, 2 groups at a time) are not done.
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not _reported(confirm):
                assert first.poll() is None, first.stdout.read() if first.stdout else ""
                time.sleep(0.1)
            assert _reported(confirm), "no confirmatory trial reported"
            tree = psutil.Process(first.pid).children(recursive=True)
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        finally:
            if first.poll() is None:
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
            _stop_tree(tree)
        assert (storage / f"{spec.name}.lease").exists()  # the killed driver could not release it

        second = _driver(storage, temp_dir)
        out, _ = second.communicate(timeout=900)
        assert second.returncode == 0, out[-4000:]
        # The rerun's console (issue #48, a quiet console): the service's lines only, the verdict and
        # its scope among them; Tune's boxes and Ray's log lines are in the study's driver.log.
        assert console_problems(out) == [], out
        assert [ln for ln in out.splitlines() if "STUDY VERDICT:" in ln], out
        assert [ln for ln in out.splitlines() if "] scope: " in ln], out
        assert "Configuration for experiment" in (storage / spec.name / "driver.log").read_text()
        (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        result = json.loads(line[len("RESULT ") :])
        assert not (storage / f"{spec.name}.lease").exists()

        client = MlflowClient(result["tracking_uri"])
        exp = client.get_experiment_by_name(spec.name)
        assert exp is not None
        runs = client.search_runs([exp.experiment_id], max_results=5000)
        studies = [r for r in runs if r.data.tags.get("autonorm.role") == "study"]
        trials = [r for r in runs if r.data.tags.get("autonorm.role") == "trial"]
        assert [r.info.run_id for r in studies] == [result["parent"]]
        ids = Counter(r.data.tags["ray.trial_id"] for r in trials)
        assert len(ids) == spec.total_trials and set(ids.values()) == {1}  # none lost, none doubled
        assert all("-m" in i for i in ids)  # every trial a member of a stacked group
        for r in trials:  # every epoch of every member once, also of the groups restored mid-way
            steps = sorted(int(m.step) for m in client.get_metric_history(r.info.run_id, "epoch"))
            # the adequacy check's runs are named by their budget (-e3-, or -e6- at twice it)
            check = r.data.tags["autonorm.phase"].endswith("-adequacy")
            epochs = int(r.info.run_name.rsplit("-e", 1)[1].split("-")[0]) if check else 3
            assert steps == list(range(1, epochs + 1)), (r.info.run_name, steps)
            assert r.info.status == "FINISHED" and r.data.tags["autonorm.trial_status"] == "completed"
        assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
        table = (storage / spec.name / "trials.csv").read_text().splitlines()
        assert len(table) - 1 == spec.expected_trials
        verdict = json.loads((storage / spec.name / "verdict.json").read_text())
        assert sum(a["n"] + a["n_failed"] for a in verdict["arms"].values()) == spec.expected_trials
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)
