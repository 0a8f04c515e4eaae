"""The test harness's own bookkeeping (tests/conftest.py): what `.ci/run` prints about a run must be true."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.conftest import _RUN_MARK, _RayStartCounter


def _fake_gcs(tmp_path: Path, mark: str | None) -> subprocess.Popen[bytes]:
    """A process named ``gcs_server`` (a copy of ``sleep``), with or without this counter's mark."""
    binary = tmp_path / "gcs_server"
    if not binary.exists():
        shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    env = {k: v for k, v in os.environ.items() if k != _RUN_MARK}
    if mark is not None:
        env[_RUN_MARK] = mark
    return subprocess.Popen([str(binary), "30"], env=env)


def test_ray_start_counter_counts_each_marked_gcs_server_once(tmp_path: Path) -> None:
    counter = _RayStartCounter(f"harness-{time.time_ns()}")
    procs = [_fake_gcs(tmp_path, counter.mark), _fake_gcs(tmp_path, "another run"), _fake_gcs(tmp_path, None)]
    try:
        time.sleep(0.3)  # exec'd by now
        for _ in range(3):  # sampled again and again: still one
            counter.sample()
        assert counter.seen == {procs[0].pid}
        late = _fake_gcs(tmp_path, counter.mark)  # a cluster started later is counted at the next sample
        procs.append(late)
        time.sleep(0.3)
        counter.sample()
        assert counter.seen == {procs[0].pid, late.pid}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
