"""Shutting down an embedded study's local Ray cluster (its own module: no other cluster may be up)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.own_ray]


def test_local_shutdown_spares_the_callers_other_children() -> None:
    # A notebook's (or a test session's) own subprocesses must survive an embedded study's shutdown.
    import subprocess
    import sys

    from tests.services import embedded_ray

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with embedded_ray("rt_spare_", {}, num_cpus=1):
            import ray

            assert ray.is_initialized()
        assert bystander.poll() is None  # still running
    finally:
        bystander.kill()
        bystander.wait()
