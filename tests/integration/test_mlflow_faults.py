"""The tracking server away, on real processes: a CLI driver subprocess, a real local Ray, a real
``mlflow server`` on PostgreSQL + S3 of this module's own (it is stopped and restarted on its port)
(issue #25).

1. MLflow unreachable for a whole first run: the study is refused before anything starts (exit 1,
   naming the URI without its credentials); the same command with MLflow up completes.
2. MLflow stopped for 10 s once the first trial run exists, then restarted on the same port (2
   trials, 8 epochs, both at once): exit 0, every epoch of every trial once, every run FINISHED.
   (10 s outlasts the tracking layer's first back-off steps, 1, 2 and 4 s: results queue through
   several failed tries and are delivered once the server answers; a longer outage only adds
   back-off steps of the same kind.)
3. MLflow stopped once the first trial run exists and still away when the trials end (2 trials,
   4 epochs): after ``tracking.final_flush_s`` (4 s here) the driver exits non-zero listing the undelivered trials; with MLflow
   back the same command delivers the rest without training anything.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import short_tmp_dir
from tests.integration.faults import (
    Accounting,
    Driver,
    accounting,
    alarming_lines,
    latest_epochs,
    new_mark,
    record_figures,
    result_epochs,
    wait_gone,
    write_spec,
)
from tests.services import (
    MlflowServer,
    PostgresServer,
    S3Server,
    create_database,
    free_port,
    start_mlflow_server,
)

pytestmark = [pytest.mark.ray, pytest.mark.services, pytest.mark.slow]

OUTAGE_S = 10.0
# The outage study: 2 trials started at once, so the stop at the first trial run finds both
# unfinished (an epoch is ~0.3 s, a trial worker's start ~15 s under load: trials cost, epochs not).
TRIALS, EPOCHS = 2, 8
LATE_TRIALS, LATE_EPOCHS = 2, 4
FINAL_FLUSH_S = 4
SECRET = "s3cr3t-pw"


@dataclass
class Run:
    rc: int
    output: str
    wall_s: float
    acc: Accounting | None = None
    trained: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Outages:
    away: Run | None = None
    away_ray_sessions: list[str] = field(default_factory=list)  # Ray session folders the refusal left
    after_away: Run | None = None
    at_stop: dict[str, float] = field(default_factory=dict)
    alive_at_restart: bool = False
    stop_s: float = 0.0
    uri_shown: str = ""
    late: Run | None = None
    late_at_stop: dict[str, float] = field(default_factory=dict)
    late_rerun: Run | None = None
    late_trained_before: dict[str, list[int]] = field(default_factory=dict)


def _wait_first_run(client: Any, name: str, driver: Driver, timeout: float = 300) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.alive(), driver.output()[-4000:]
        try:
            seen = latest_epochs(client, name)
        except Exception:
            seen = {}
        if seen:
            return seen
        time.sleep(0.3)
    raise AssertionError(f"no trial run in {timeout:.0f} s:\n{driver.output()[-4000:]}")


@pytest.fixture(scope="module")
def outages(postgres_server: PostgresServer, s3_server: S3Server) -> Iterator[Outages]:
    from mlflow import MlflowClient

    work = short_tmp_dir("an_mlf_")
    ray_tmp = work / "ray"
    ray_tmp.mkdir()
    port = free_port()
    backend = create_database(postgres_server, f"faults_{new_mark()[:8]}")
    artifacts = f"s3://{s3_server.bucket}/faults-artifacts"

    def start() -> MlflowServer:
        return start_mlflow_server(backend, artifacts, s3_server.env(), directory=work / "mlflow", port=port)

    uri = f"http://127.0.0.1:{port}"
    # MLflow credentials come from the environment (a spec refuses them in the URI): never printed.
    credentials = {"MLFLOW_TRACKING_USERNAME": "user", "MLFLOW_TRACKING_PASSWORD": SECRET}
    storage = work / "runs"
    result = Outages(uri_shown=uri)
    server: MlflowServer | None = None

    def run(name: str, spec: Path, label: str, extra: tuple[str, ...] = ()) -> Driver:
        args = ["run", str(spec), "--storage-path", str(storage), "--tracking-uri", uri, *extra]
        driver = Driver(args, work, new_mark(), ray_tmp, work / f"{label}.log", extra_env=credentials)
        return driver.start()

    def finish(driver: Driver, name: str, timeout: float = 900) -> Run:
        rc = driver.wait(timeout)
        wait_gone(driver.mark, 20.0)
        acc = None
        if server is not None:
            acc = accounting(MlflowClient(tracking_uri=uri), name)
        return Run(
            rc, driver.output(), (driver.ended or 0) - driver.started, acc, result_epochs(storage / name)
        )

    try:
        # 1. away for the whole first run (nothing listens on the port), then up for the rerun
        name = f"away_{new_mark()[:6]}"
        spec = write_spec(work, name, trials=TRIALS, epochs=EPOCHS)
        result.away = finish(run(name, spec, "away"), name)
        result.away_ray_sessions = [str(p) for p in ray_tmp.rglob("session_*")]
        server = start()
        client = MlflowClient(tracking_uri=uri)
        # 2. the same command with MLflow up; MLflow stopped OUTAGE_S once the first trial run exists
        driver = run(name, spec, "after_away")
        result.at_stop = _wait_first_run(client, name, driver)
        stopped = time.monotonic()
        server.handle.stop()
        time.sleep(OUTAGE_S)
        result.alive_at_restart = driver.alive()
        server = start()
        result.stop_s = time.monotonic() - stopped
        result.after_away = finish(driver, name)

        # 3. stopped mid-study and still away when the trials end
        late = f"late_{new_mark()[:6]}"
        late_spec = write_spec(work, late, trials=LATE_TRIALS, epochs=LATE_EPOCHS)
        flush = ("--set", f"tracking.final_flush_s={FINAL_FLUSH_S}")
        driver = run(late, late_spec, "late", flush)
        result.late_at_stop = _wait_first_run(client, late, driver)
        server.handle.stop()
        server = None
        result.late = finish(driver, late)
        result.late_trained_before = result_epochs(storage / late)
        server = start()
        result.late_rerun = finish(run(late, late_spec, "late_rerun", flush), late)
        for label, r in (
            ("mlflow_away", result.away),
            (f"mlflow_away_rerun_with_{OUTAGE_S:.0f}s_outage", result.after_away),
            ("mlflow_away_at_end", result.late),
            ("mlflow_away_at_end_rerun", result.late_rerun),
        ):
            assert r is not None
            record_figures(
                label,
                {
                    "rc": r.rc,
                    "wall_s": r.wall_s,
                    "tracebacks": r.output.count("Traceback (most recent call last)"),
                    "trial_runs": r.acc.trial_runs if r.acc else None,
                    "study_runs": r.acc.study_runs if r.acc else None,
                    "trained_epochs": r.trained,
                },
            )
        record_figures("mlflow_outage", {"at_stop": result.at_stop, "stop_s": result.stop_s})
        yield result
    finally:
        if server is not None:
            server.handle.stop()
        if not os.environ.get("AUTONORM_KEEP_FAULT_WORK"):  # kept to read the real logs
            shutil.rmtree(work, ignore_errors=True)


def _no_traceback(text: str) -> None:
    assert "Traceback (most recent call last)" not in text, text[-4000:]


def _complete(acc: Accounting | None, name_prefix: str, trials: int, epochs: int) -> None:
    assert acc is not None
    assert [(n.split("_")[0], s) for n, s in acc.study_runs] == [(name_prefix, "FINISHED")], acc
    assert len(acc.trial_runs) == trials, acc
    for trial_id, (status, steps) in acc.trial_runs.items():
        assert status == "FINISHED", (trial_id, acc)
        assert steps == list(range(1, epochs + 1)), (trial_id, steps)
    assert all(status == "FINISHED" for _, _, status in acc.other_runs), acc


def test_mlflow_away_for_the_whole_first_run_is_refused_before_training(outages: Outages) -> None:
    away = outages.away
    assert away is not None
    assert away.rc == 1, away.output[-3000:]
    assert away.wall_s < 300
    _no_traceback(away.output)
    assert outages.uri_shown in away.output and SECRET not in away.output
    assert "nothing was started or trained" in away.output
    assert away.trained == {}  # no trial ran
    assert outages.away_ray_sessions == []  # refused before Ray was started


def test_rerun_with_mlflow_up_completes(outages: Outages) -> None:
    after = outages.after_away
    assert after is not None and after.rc == 0, after.output[-4000:] if after else None
    _no_traceback(after.output)
    assert SECRET not in after.output
    _complete(after.acc, "away", TRIALS, EPOCHS)


def test_mlflow_stopped_for_10_s_mid_study(outages: Outages) -> None:
    # the outage struck while trials were unfinished and the study outlived it
    assert len(outages.at_stop) < TRIALS or min(outages.at_stop.values()) < EPOCHS
    assert outages.alive_at_restart and outages.stop_s >= OUTAGE_S
    after = outages.after_away
    assert after is not None and after.rc == 0
    # The study outlived the outage: no Traceback, no ERROR line from Tune, Ray or Optuna (issue #40).
    assert alarming_lines(after.output) == [], after.output[-4000:]
    _complete(after.acc, "away", TRIALS, EPOCHS)  # every epoch of every trial once, every run FINISHED


def test_mlflow_still_away_at_the_end_exits_non_zero_then_delivers(outages: Outages) -> None:
    late = outages.late
    assert late is not None
    assert len(outages.late_at_stop) < LATE_TRIALS or min(outages.late_at_stop.values()) < LATE_EPOCHS
    assert late.rc == 1, late.output[-4000:]
    _no_traceback(late.output)
    assert "waiting up to" in late.output and "tracking.final_flush_s" in late.output
    assert "run the same command again" in late.output
    assert len(outages.late_trained_before) == LATE_TRIALS  # it did train every trial to the end
    assert all(epochs[-1] == LATE_EPOCHS for epochs in outages.late_trained_before.values())
    rerun = outages.late_rerun
    assert rerun is not None and rerun.rc == 0, rerun.output[-4000:]
    _no_traceback(rerun.output)
    assert alarming_lines(rerun.output) == [], rerun.output[-4000:]
    assert rerun.trained == outages.late_trained_before  # nothing trained again
    _complete(rerun.acc, "late", LATE_TRIALS, LATE_EPOCHS)
