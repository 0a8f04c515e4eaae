"""Stop signals, broken checkpoints, credential-free URIs and the read-only lease view, without Ray
(the whole path with real Ray and MLflow is tests/integration/test_faults.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.interrupts import StudyInterrupted
from workers.lease import lease_holder, study_lease
from workers.plan import StorageConfig
from workers.storage import resolve_storage
from workers.tracking import redact_uri

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_exits_as_shells_report_a_signal(signum: int, code: int) -> None:
    err = StudyInterrupted(signum)
    assert err.exit_code == code and signal.Signals(signum).name in str(err)


def test_a_stop_during_the_start_up_estimate_stops_the_study(monkeypatch: pytest.MonkeyPatch) -> None:
    # An estimate that cannot be made never stops a study; a stop signal arriving meanwhile does.
    import studies.planning
    from studies.kinds import KINDS
    from studies.running import _estimate

    spec = type("Spec", (), {"name": "s"})()
    kind = KINDS["search"]

    def broken(_spec: object, _kind: object, **_options: object) -> None:
        raise ValueError("no calibration")

    monkeypatch.setattr(studies.planning, "plan_study", broken)
    assert _estimate(spec, kind) is None

    def stopped(_spec: object, _kind: object, **_options: object) -> None:
        raise StudyInterrupted(signal.SIGINT)

    monkeypatch.setattr(studies.planning, "plan_study", stopped)
    with pytest.raises(StudyInterrupted):
        _estimate(spec, kind)


DRIVER = textwrap.dedent(
    """
    import os, signal, sys, time
    from workers import interrupts
    from workers.interrupts import StudyInterrupted
    interrupts.install()
    try:
        os.kill(os.getpid(), signal.SIG{first})
        time.sleep(5)
    except StudyInterrupted as exc:
        print("first", exc.exit_code, flush=True)
        {second}
        sys.exit(exc.exit_code)
    print("no stop", flush=True)
    """
)


def _driver(first: str, second: str) -> subprocess.CompletedProcess[str]:
    code = DRIVER.format(first=first, second=second)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_outside_tune_a_stop_signal_unwinds_the_driver() -> None:
    proc = _driver("TERM", "pass")
    assert proc.stdout.strip() == "first 143" and proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_second_signal_stops_at_once_without_a_traceback() -> None:
    # the second one arrives while the first one's shutdown is still going on (a long finally)
    proc = _driver("INT", "os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not stopped')")
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert "not stopped" not in proc.stdout
    assert "SIGINT again: stopping now" in proc.stderr and "Traceback" not in proc.stderr


def _checkpoint(directory: Path, index: int, content: bytes | None) -> Path:
    path = directory / f"checkpoint_{index:06d}"
    path.mkdir(parents=True)
    if content is None:
        import torch

        torch.save({"epoch": index + 1}, path / "state.pt")
    else:
        (path / "state.pt").write_bytes(content)
    return path


@pytest.mark.parametrize("broken", [b"", b"\x00garbage" * 50, b"PK\x03\x04truncated"])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, broken: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    from ray import tune

    from workers.trainable import _resume_from

    _checkpoint(tmp_path, 0, None)
    _checkpoint(tmp_path, 1, None)
    newest = _checkpoint(tmp_path, 2, broken)
    state = _resume_from(tune.Checkpoint.from_directory(str(newest)), "t1")
    assert state == {"epoch": 2}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trial t1" in lines[0] and "checkpoint_000001" in lines[0]


def test_no_readable_checkpoint_restarts_the_trial_from_scratch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ray import tune

    from workers.trainable import _resume_from

    _checkpoint(tmp_path, 0, b"")
    newest = _checkpoint(tmp_path, 1, b"junk")
    assert _resume_from(tune.Checkpoint.from_directory(str(newest)), "t2") is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trial t2" in lines[0] and "from scratch" in lines[0]


def test_every_trials_checkpoint_notice_reaches_the_driver_through_rays_log_dedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two trials on two workers say the same thing about different checkpoints. Ray's log
    # deduplicator (the one the driver's log monitor uses) drops tokens holding digits, so both lines
    # are one to it; the exemption workers sets before Ray is imported must let each through.
    from ray import tune
    from ray._private.ray_logging import LogDeduplicator

    from workers import TRIAL_NOTICE
    from workers.trainable import _resume_from

    lines = []
    for trial in ("2a0acc3f", "0c7fbe2d"):
        _checkpoint(tmp_path / trial, 0, None)
        newest = _checkpoint(tmp_path / trial, 1, b"\x00garbage")
        _resume_from(tune.Checkpoint.from_directory(str(newest)), trial)
        lines += capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2

    def through(dedup: LogDeduplicator) -> list[str]:
        out: list[str] = []
        for pid, line in enumerate(lines):
            batch = {"ip": "127.0.0.1", "pid": 100 + pid, "lines": [line]}
            out += [x for b in dedup.deduplicate(batch) for x in b["lines"]]
        return out

    assert len(through(LogDeduplicator(5, None, None))) == 1  # the trap: the second one is folded
    assert through(LogDeduplicator(5, TRIAL_NOTICE, None)) == lines
    assert os.environ["RAY_DEDUP_LOGS_ALLOW_REGEX"] == TRIAL_NOTICE


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://user:pw@mlflow:5000/path?token=abc", "http://mlflow:5000/path"),
        ("postgresql+psycopg2://u:secret@db:5432/mlflow", "postgresql+psycopg2://db:5432/mlflow"),
        ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_uris_are_shown_without_credentials(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_the_lease_holder_is_read_without_taking_or_touching_the_lease(tmp_path: Path) -> None:
    storage = resolve_storage(StorageConfig(path=str(tmp_path)))
    assert lease_holder(storage, "s") is None
    with study_lease(storage, "s") as me:
        lease = tmp_path / "s.lease"
        before = lease.read_bytes(), lease.stat().st_mtime_ns
        held = lease_holder(storage, "s")
        assert held is not None and held["pid"] == os.getpid() and held["token"] == me["token"]
        assert (lease.read_bytes(), lease.stat().st_mtime_ns) == before
    assert lease_holder(storage, "s") is None
    # a lease left by a driver that died on this host holds nothing
    import json
    import socket

    dead = {"host": socket.gethostname(), "pid": 999999999, "heartbeat": 1e12}
    (tmp_path / "s.lease").write_text(json.dumps(dead))
    assert lease_holder(storage, "s") is None
