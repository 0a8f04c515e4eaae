"""SIGKILL a study driver mid-study, run the same command again: nothing lost, nothing doubled."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mlflow import MlflowClient

from tests.workers.conftest import REPO_ROOT, ray_env
from tests.workers.restore_driver import EPOCHS, NUM_SAMPLES
from workers.tracking import TAG_ROLE, TAG_TRIAL_ID

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# A trial counts as finished before the kill only if it ended this long before it: Tune snapshots
# its state on every loop step (TUNE_GLOBAL_CHECKPOINT_S=0), which takes milliseconds, but the
# machine is shared and slow.
SNAPSHOT_MARGIN_S = 2.0


def _events(root: Path) -> list[dict[str, Any]]:
    path = root / "invocations.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _driver(root: Path, temp_dir: str) -> subprocess.Popen[str]:
    env = {**os.environ, **ray_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers.restore_driver", str(root), temp_dir],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _stop_tree(procs: list[psutil.Process], timeout_s: float = 20.0) -> None:
    """Wait for the killed driver's Ray processes to go; kill (by PID) whatever outlives the wait."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture
def workdir() -> Iterator[tuple[Path, str]]:
    root = Path(tempfile.mkdtemp(prefix="h5_restore_"))
    temp_dir = tempfile.mkdtemp(prefix="rt_h5r_", dir="/tmp")
    yield root, temp_dir
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_sigkill_mid_study_then_rerun(workdir: tuple[Path, str]) -> None:
    root, temp_dir = workdir
    first = _driver(root, temp_dir)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            ends = [e for e in _events(root) if e["event"] == "end"]
            if len(ends) >= 2:
                break
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            time.sleep(0.2)
        else:
            pytest.fail("the study did not finish two trials in time")
        time.sleep(SNAPSHOT_MARGIN_S + 0.5)
        tree = psutil.Process(first.pid).children(recursive=True)
        kill_time = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        _stop_tree(tree)
    ended_before = {
        e["trial"] for e in _events(root) if e["event"] == "end" and e["t"] < kill_time - SNAPSHOT_MARGIN_S
    }
    assert 2 <= len(ended_before) < NUM_SAMPLES, "kill landed outside the study"

    second = _driver(root, temp_dir)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-4000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])

    assert result["restored"] is True
    trials = result["trials"]
    assert len(trials) == NUM_SAMPLES
    assert all(t["status"] == "completed" for t in trials.values())

    events = _events(root)
    # Trials finished before the kill were not started again.
    restarted = {e["trial"] for e in events if e["event"] == "start" and e["trial"] in ended_before}
    starts = Counter(e["trial"] for e in events if e["event"] == "start")
    assert all(starts[t] == 1 for t in ended_before), (restarted, starts)
    # Every trial finished exactly once (an unfinished one resumed rather than restarting twice).
    ends = Counter(e["trial"] for e in events if e["event"] == "end")
    assert set(ends) == set(trials)
    resumed = [e for e in events if e["event"] == "start" and e["start"] > 1]
    assert all(e["trial"] not in ended_before for e in resumed)

    client = MlflowClient(result["tracking_uri"])
    exp = client.get_experiment_by_name("restore")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(TAG_ROLE) == "study"]
    children = [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]
    assert [p.info.run_id for p in parents] == [result["parent"]]
    assert Counter(c.data.tags[TAG_TRIAL_ID] for c in children) == Counter(set(trials))  # no duplicates
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    for child in children:
        assert child.info.run_id == trials[child.data.tags[TAG_TRIAL_ID]]["run"]
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "epoch")]
        assert sorted(steps) == list(range(1, EPOCHS + 1))  # each epoch once, none lost
