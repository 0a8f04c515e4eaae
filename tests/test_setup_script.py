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


def test_a_fresh_set_up_prints_three_lines(tmp_path: Path) -> None:
    """From nothing: the virtualenv with its dependencies, the data sets, ready; pip's output in the log.
    (``PY`` and ``install_dependencies`` are stand-ins: the real ones take minutes.)"""
    venv = tmp_path / "venv"
    fake_python = tmp_path / "python3"
    fake_python.write_text(
        '#!/bin/sh\n# "-m venv DIR": a virtualenv whose python does nothing\n'
        'mkdir -p "$3/bin" && printf "#!/bin/sh\\nexit 0\\n" > "$3/bin/python" && chmod +x "$3/bin/python"\n'
        'echo "--version" "$@"\n'
    )
    fake_python.chmod(0o755)
    log = tmp_path / "setup.log"
    stub = "install_dependencies() { echo Collecting torch==2.13.0; echo Successfully installed torch; }\n"
    proc = _bash(stub + "main", log=log, env={"VENV": str(venv), "PYTHON": str(fake_python)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"[setup] creating {venv} with ") and f"output -> {log}" in lines[0]
    assert lines[1].startswith("[setup] offline data sets") and lines[2].startswith("[setup] ready: ")
    assert "Successfully installed torch" in log.read_text() and "Collecting" not in proc.stdout
    assert (venv / ".autonorm-deps").is_file()  # a second run only checks
    again = _bash(stub + "main", log=log, env={"VENV": str(venv), "PYTHON": str(fake_python)})
    assert len(again.stdout.splitlines()) == 2, again.stdout
