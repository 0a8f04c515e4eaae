"""scripts/setup.sh is quiet (issue #48 item 1): one line per step on the terminal, what the step's
commands print in the set-up log, and the log's path and tail when a step fails; the tests' browser
only with ``--browser`` (scripts/test.sh), never for the README's first command."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"


def _bash(script: str, *, log: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` after sourcing setup.sh (its functions, nothing run), its log at ``log``."""
    full = {**os.environ, "AUTONORM_SETUP_LOG": str(log), **(env or {})}
    return subprocess.run(
        ["bash", "-c", f"source {SETUP}\n{script}"],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_step_prints_one_line_and_logs_what_its_command_prints(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    proc = _bash(
        "step 'unpacking things' bash -c 'echo Unpacking libfoo; echo WARNING: Location >&2'", log=log
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[setup] unpacking things\n" and proc.stderr == ""
    assert log.read_text() == "Unpacking libfoo\nWARNING: Location\n"


def test_a_failing_step_prints_the_logs_path_and_tail_and_stops(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    noisy = "; ".join(f"echo line-{i}" for i in range(40))
    proc = _bash(
        f"step 'installing dependencies' bash -c '{noisy}; echo pip says no >&2; exit 3'\necho not reached",
        log=log,
        env={"AUTONORM_SETUP_TAIL": "5"},
    )
    assert proc.returncode == 1
    assert proc.stdout == "[setup] installing dependencies\n"  # nothing after the failed step ran
    err = proc.stderr.splitlines()
    assert err[0] == f"[setup] failed: installing dependencies (exit 3); the last lines of {log}:"
    assert [line.strip() for line in err[1:]] == ["line-36", "line-37", "line-38", "line-39", "pip says no"]
    assert "line-0\n" in log.read_text()  # the whole output is in the log


def test_a_step_stops_at_its_functions_first_failing_command(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    proc = _bash("two() { false; echo after-false; }\nstep 'two commands' two", log=log)
    assert proc.returncode == 1 and "after-false" not in log.read_text()
    assert "[setup] failed: two commands (exit 1)" in proc.stderr


def _fake_venv(tmp_path: Path) -> Path:
    """A virtualenv setup.sh takes as installed and up to date: its python does nothing."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes())
    (venv / ".autonorm-deps").write_text(digest.hexdigest() + "\n")
    return venv


def test_the_browser_is_the_test_commands_not_the_first_commands(tmp_path: Path) -> None:
    """(The data step runs the real scripts/fetch_data.sh: the data sets are there once the suite's set-up
    has run; it only checks them.)"""
    venv = _fake_venv(tmp_path)
    log = tmp_path / "setup.log"
    stub = "install_browser() { echo STUB-INSTALL; }\n"
    first = _bash(stub + "main", log=log, env={"VENV": str(venv)})
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert all(line.startswith("[setup] ") for line in lines), lines
    assert not [line for line in lines if "test browser" in line] and "STUB-INSTALL" not in log.read_text()
    assert lines[-1] == f"[setup] ready: {venv}/bin/python (set-up log: {log})"
    assert "fetch_data:" in log.read_text()  # the data fetch's own lines went to the log
    tests = _bash(stub + "main --browser", log=log, env={"VENV": str(venv)})
    assert tests.returncode == 0, tests.stderr
    browser = [line for line in tests.stdout.splitlines() if "test browser" in line]
    assert len(browser) == 1, tests.stdout
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        assert "STUB-INSTALL" in log.read_text()
    assert "--browser" in (ROOT / "scripts" / "test.sh").read_text()
