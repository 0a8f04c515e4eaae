"""Helpers of the fault-injection tests: a study driver as a real CLI subprocess in its own process
group (as a terminal or a scheduler starts it), its processes found by a marker in their
environment, progress and accounting read from a real MLflow server, Tune's own view of each trial's
latest checkpoint."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "studies.cli"]
MARK = "AUTONORM_FAULT_TEST"

SPEC = """\
kind: search
name: {name}
model: {{type: mlp, preset: tiny, hidden: [32]}}
data: {{type: digits}}
training: {{epochs: {epochs}, batch_size: 8, optimizer: sgd, lr: 0.05}}
search:
  metric: val_accuracy
  mode: max
  sampler: {{type: random, seed: 0}}
  scheduler: {{type: fifo}}
  num_samples: {trials}
  max_concurrent: 2
  space:
    - {{name: training.lr, type: float, low: 0.01, high: 0.1, log: true}}
"""


def write_spec(directory: Path, name: str, *, trials: int = 4, epochs: int = 6) -> Path:
    """The issue's study: a tiny MLP on digits, ``trials`` trials of ``epochs`` epochs, 2 at a time."""
    path = directory / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, trials=trials, epochs=epochs))
    return path


def env(mark: str, ray_tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    out.update(extra or {})
    out.update(
        {
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "PYTHONPATH": str(ROOT),
            "RAY_TMPDIR": str(ray_tmp),  # our own session directories, never another test's
            # Every epoch reaches MLflow at once (not every 2 s): the faults strike at epochs seen there.
            "AUTONORM_RESULT_FLUSH_S": "0",
            MARK: mark,
        }
    )
    return out


@dataclass
class Driver:
    """``autonorm-study run`` in a new session (its own process group, like a shell job)."""

    args: list[str]
    cwd: Path
    mark: str
    ray_tmp: Path
    log: Path
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    signalled: float | None = None
    ended: float | None = None
    events: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> Driver:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*CLI, *self.args],
            cwd=self.cwd,
            env=env(self.mark, self.ray_tmp, self.extra_env),
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        self.signalled = self.signalled or time.monotonic()
        os.killpg(self.pid, signum)

    def signal_driver(self, signum: int) -> None:
        self.signalled = self.signalled or time.monotonic()
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_marked(self.mark)
            rc = self.proc.wait(timeout=30)
            self.ended = time.monotonic()
            raise AssertionError(
                f"driver still running after {timeout:.0f} s:\n{self.output()[-4000:]}"
            ) from None
        self.ended = time.monotonic()
        return rc

    def exit_after_signal_s(self) -> float:
        assert self.signalled is not None and self.ended is not None
        return self.ended - self.signalled

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def marked(mark: str) -> list[psutil.Process]:
    """Every live process carrying ``mark`` in its environment: the driver, Ray, trial workers."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_marked(mark: str) -> None:
    for proc in marked(mark):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def wait_gone(mark: str, timeout: float) -> list[psutil.Process]:
    """Wait until no marked process is left; the ones still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = marked(mark)
        if not left:
            return []
        time.sleep(0.5)
    return marked(mark)


# --------------------------------------------------------------------------------------------- MLflow


def _runs(client: Any, experiment: str) -> list[Any]:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return list(client.search_runs([exp.experiment_id], max_results=1000))


def latest_epochs(client: Any, experiment: str) -> dict[str, float]:
    """``trial id -> latest epoch in MLflow`` for every trial run (cheap: one search)."""
    out = {}
    for run in _runs(client, experiment):
        if run.data.tags.get("autonorm.role") == "trial":
            out[run.data.tags.get("ray.trial_id", run.info.run_id)] = run.data.metrics.get("epoch", 0.0)
    return out


def wait_for_epochs(
    client: Any, experiment: str, driver: Driver, *, epochs: int, total: float = 0, timeout: float = 300
) -> dict[str, float]:
    """Until some trial run holds ``epochs`` epochs (or more) in MLflow and all trial runs together
    more than ``total``; what MLflow holds then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not driver.alive():
            raise AssertionError(f"the driver ended before the fault:\n{driver.output()[-4000:]}")
        try:
            seen = latest_epochs(client, experiment)
        except Exception:
            seen = {}
        if seen and max(seen.values()) >= epochs and sum(seen.values()) > total:
            return seen
        time.sleep(0.3)
    raise AssertionError(f"no trial reached {epochs} epochs in {timeout:.0f} s:\n{driver.output()[-4000:]}")


@dataclass(frozen=True)
class Accounting:
    study_runs: list[tuple[str, str]]  # (name, status)
    trial_runs: dict[str, tuple[str, list[int]]]  # trial id -> (status, epoch steps, sorted)
    other_runs: list[tuple[str, str, str]]  # (role, name, status)


def accounting(client: Any, experiment: str) -> Accounting:
    study, trials, other = [], {}, []
    for run in _runs(client, experiment):
        role = run.data.tags.get("autonorm.role")
        if role == "study":
            study.append((run.info.run_name, run.info.status))
        elif role == "trial":
            # sorted: a tracking server returns a history in no promised order (a duplicate shows)
            steps = sorted(int(m.step) for m in client.get_metric_history(run.info.run_id, "epoch"))
            trial_id = run.data.tags.get("ray.trial_id", run.info.run_id)
            assert trial_id not in trials, f"two runs for trial {trial_id}"
            trials[trial_id] = (run.info.status, steps)
        else:
            other.append((str(role), run.info.run_name, run.info.status))
    return Accounting(study, trials, other)


# ----------------------------------------------------------------------------------------------- Tune


def newest_state(study_dir: Path, *, not_in: frozenset[str] = frozenset()) -> Path | None:
    """The Tune experiment state a restore of the study reads: the greatest file name
    ``experiment_state-<driver start time>.json`` (``ray.tune.execution.experiment_state.
    _find_newest_experiment_checkpoint``), ``None`` when there is none. Not the newest by mtime: a
    restored driver downloads every earlier driver's state file into its staging folder and uploads
    them all again at each sync (copied by threads, in no order), so an older driver's state is often
    the file written last, naming checkpoints the next restore never reads. ``not_in``: names that do
    not count (the states there were before a driver started: what is left is that driver's own)."""
    states = [
        Path(s)
        for s in glob.glob(f"{study_dir}/**/experiment_state-*.json", recursive=True)
        if os.path.basename(s) not in not_in
    ]
    return max(states, key=lambda s: s.name) if states else None


def state_names(study_dir: Path) -> frozenset[str]:
    return frozenset(
        os.path.basename(s) for s in glob.glob(f"{study_dir}/**/experiment_state-*.json", recursive=True)
    )


def tune_checkpoints(
    study_dir: Path, *, not_in: frozenset[str] = frozenset()
) -> dict[str, tuple[str, str | None]]:
    """``trial id -> (status, latest checkpoint dir)`` as the experiment state a restore reads says
    (:func:`newest_state`): the checkpoint a restore resumes each trial from (a checkpoint written
    after that state is never used)."""
    from ray.tune.experiment import Trial

    state = newest_state(study_dir, not_in=not_in)
    assert state is not None, f"no Tune experiment state under {study_dir} (but {sorted(not_in)})"
    data = json.loads(state.read_text())
    out: dict[str, tuple[str, str | None]] = {}
    for trial_json, meta in data["trial_data"]:
        trial = Trial.from_json_state(trial_json, stub=True)
        trial.restore_run_metadata(meta)
        checkpoint = trial.checkpoint
        out[trial.trial_id] = (trial.status, None if checkpoint is None else str(checkpoint.path))
    return out


def result_epochs(study_dir: Path) -> dict[str, list[int]]:
    """Every epoch each trial reported, in order, from Tune's result files (restarts included)."""
    out: dict[str, list[int]] = {}
    for path in glob.glob(f"{study_dir}/**/result.json", recursive=True):
        # Trial folders are named after the trials' readable names: the id is in each result.
        results = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        if not results:
            continue
        trial_id, size = str(results[0]["trial_id"]), int(results[0].get("members") or 0)
        if size:  # a stacked group (execution.stack): each member's own epochs, as a trial's
            from workers.members import member_history, member_id

            for k in range(size):
                out[member_id(trial_id, k)] = [int(r["epoch"]) for r in member_history(results, k)]
        else:
            out[trial_id] = [int(r["epoch"]) for r in results]
    return out


STUDY_WRITES = (
    "experiment_state-",
    "search_gen_state-",
    "searcher-state-",
    "basic-variant-state-",
    "tuner.pkl",
)


def snapshot(study_dir: Path) -> dict[str, tuple[int, int]]:
    """``relative path -> (size, mtime_ns)`` of the files a reader must not touch: everything in the
    study directory except what the running study itself rewrites (its trials' directories and
    Tune's state files) and a report's own folder."""
    out = {}
    # A trial's folder (named after the trial) is where Tune writes its params.json.
    trial_dirs = {p.parent for p in study_dir.rglob("params.json")}
    for path in study_dir.rglob("*"):
        rel = path.relative_to(study_dir)
        if not path.is_file() or rel.parts[0] == "report":
            continue
        if trial_dirs.intersection(path.parents) or rel.name.startswith(STUDY_WRITES):
            continue
        stat = path.stat()
        out[str(rel)] = (stat.st_size, stat.st_mtime_ns)
    return out


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def new_mark() -> str:
    return uuid.uuid4().hex


def record_figures(label: str, figures: dict[str, Any]) -> None:
    """Append measured figures to ``$AUTONORM_FAULT_FIGURES`` (JSON lines) when set: what the
    figures table in docs/reliability.md is made from."""
    path = os.environ.get("AUTONORM_FAULT_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"scenario": label, **figures}, default=str) + "\n")


# ------------------------------------------------------------------------------------ the user's view

_ALARM = re.compile(r"Traceback|\bERROR\b|already reported|Error handling checkpoint")


def alarming_lines(output: str) -> list[str]:
    """The lines of a driver's real output (stdout and stderr, with what Ray forwards from trial
    workers) that read as a failure: a ``Traceback``, a log line at ``ERROR`` (Ray's and Tune's
    ``... ERROR file.py:N -- ...``), Optuna's ``already reported`` warning. A fault the study
    survived must print none of them (issue #40); its recovery says what happened in a line of ours."""
    return [line for line in output.splitlines() if _ALARM.search(line)]
