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
from collections.abc import Callable, Iterator
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


def _driver(root: Path, temp_dir: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, **ray_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers.restore_driver", str(root), temp_dir, *args],
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


def _ends(first: subprocess.Popen[str], root: Path, n: int, *, poll_s: float) -> list[float]:
    """The sorted end times of the study's trials once ``n`` have ended (the driver still running)."""
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        ends = sorted(e["t"] for e in _events(root) if e["event"] == "end")
        if len(ends) >= n:
            return ends
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        time.sleep(poll_s)
    pytest.fail(f"the study did not finish {n} trials in time")


def _sigkill(first: subprocess.Popen[str], when: Callable[[], None], *, group: bool) -> float:
    """SIGKILL the driver (its process group with ``group``) once ``when()`` returns; stop what it
    had started either way. Returns the kill's time."""
    kill = os.killpg if group else os.kill
    tree: list[psutil.Process] = []
    try:
        when()
        tree = psutil.Process(first.pid).children(recursive=True)
        kill_time = time.time()
        kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            kill(first.pid, signal.SIGKILL)
            first.wait()
        _stop_tree(tree)
    return kill_time


def _rerun(root: Path, temp_dir: str, *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the same study command again (a resume) to its end: its ``RESULT`` and every trial event."""
    second = _driver(root, temp_dir, *args)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-4000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    assert result["restored"] is True
    trials = result["trials"]
    assert len(trials) == NUM_SAMPLES
    assert all(t["status"] == "completed" for t in trials.values())
    return result, _events(root)


def _check_mlflow(result: dict[str, Any], epochs: int) -> None:
    """One parent run, one child run per trial, each epoch in MLflow once, nothing left RUNNING."""
    trials = result["trials"]
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
        assert sorted(steps) == list(range(1, epochs + 1))  # each epoch once, none lost


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

    def after_two_ends() -> None:
        _ends(first, root, 2, poll_s=0.2)
        time.sleep(SNAPSHOT_MARGIN_S + 0.5)

    kill_time = _sigkill(first, after_two_ends, group=False)
    ended_before = {
        e["trial"] for e in _events(root) if e["event"] == "end" and e["t"] < kill_time - SNAPSHOT_MARGIN_S
    }
    assert 2 <= len(ended_before) < NUM_SAMPLES, "kill landed outside the study"

    result, events = _rerun(root, temp_dir)
    trials = result["trials"]
    # Trials finished before the kill were not started again.
    restarted = {e["trial"] for e in events if e["event"] == "start" and e["trial"] in ended_before}
    starts = Counter(e["trial"] for e in events if e["event"] == "start")
    assert all(starts[t] == 1 for t in ended_before), (restarted, starts)
    # Every trial finished exactly once (an unfinished one resumed rather than restarting twice).
    ends = Counter(e["trial"] for e in events if e["event"] == "end")
    assert set(ends) == set(trials)
    resumed = [e for e in events if e["event"] == "start" and e["start"] > 1]
    assert all(e["trial"] not in ended_before for e in resumed)

    _check_mlflow(result, EPOCHS)


# The snapshot gap (docs/reliability.md, "Tune's snapshot period"): trials of one epoch write one
# checkpoint each, so CheckpointConfig(num_to_keep=2) never forces a snapshot, and under Tune's default
# period (AUTONORM_TUNE_SNAPSHOT_S=auto: a snapshot at the first change 10 s after the last one) a trial
# that ended a few seconds before the kill is still RUNNING in the snapshot: the rerun trains it again.
# The kill follows the 3rd trial's end (the 2nd pair, 2 at a time): the 1st pair ends about when the
# 10 s of Tune's first period run out (actor start + one 3 s epoch), the 2nd pair well inside the next.
GAP_EPOCHS = 1
GAP_SLEEP_S = 3.0
GAP_KILL_AFTER_END = 3


def test_sigkill_just_after_a_trial_ended_does_not_train_it_again(workdir: tuple[Path, str]) -> None:
    """SIGKILL the driver's process group 2.5 s after the 3rd trial ended (one-epoch trials): on the
    rerun no trial that had finished is started again, and every trial is accounted for once."""
    root, temp_dir = workdir
    args = (str(GAP_EPOCHS), str(GAP_SLEEP_S))
    first = _driver(root, temp_dir, *args)

    def after_the_gap_trials_end() -> None:
        ends = _ends(first, root, GAP_KILL_AFTER_END, poll_s=0.1)
        # The kill time is taken from the trial's own end time, not from when this loop saw it.
        time.sleep(max(0.0, ends[GAP_KILL_AFTER_END - 1] + SNAPSHOT_MARGIN_S + 0.5 - time.time()))

    kill_time = _sigkill(first, after_the_gap_trials_end, group=True)
    before = _events(root)
    ended_before = {
        e["trial"] for e in before if e["event"] == "end" and e["t"] < kill_time - SNAPSHOT_MARGIN_S
    }
    assert 1 <= len(ended_before) < NUM_SAMPLES, "kill landed outside the study"

    result, events = _rerun(root, temp_dir, *args)
    trials = result["trials"]
    rerun = events[len(before) :]
    # Epochs trained per trial, counted from each invocation's start epoch (``quadratic_trial`` logs
    # one "start" line per invocation): a finished trial trained again logs a second epoch 1.
    trained = Counter[str]()
    for e in events:
        if e["event"] == "start":
            trained[e["trial"]] += GAP_EPOCHS - e["start"] + 1
    retrained = {t: trained[t] for t in ended_before if trained[t] != GAP_EPOCHS}
    assert not retrained, f"finished before the kill, trained again on the rerun: {retrained}; {rerun}"
    restarted = [e for e in rerun if e["event"] == "start" and e["trial"] in ended_before]
    assert not restarted, f"finished before the kill, started again on the rerun: {restarted}"
    # Every trial ended (one caught mid-epoch by the kill trains that epoch again: it had no
    # checkpoint), and Tune and MLflow hold each trial once, each with its one epoch once.
    assert {e["trial"] for e in events if e["event"] == "end"} == set(trials), events
    _check_mlflow(result, GAP_EPOCHS)
