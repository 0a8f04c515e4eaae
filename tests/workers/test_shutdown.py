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


def test_a_local_session_starts_no_idle_worker_its_actors_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray would start num_cpus idle workers for the first driver, without the study's runtime_env:
    # the actor below still gets a fresh worker, and the idle ones cost CPU for nothing.
    import time

    import psutil
    import ray

    from workers.session import ray_session

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)

    @ray.remote(num_cpus=1)
    class Probe:
        def pid(self) -> int:
            import os

            return os.getpid()

    with ray_session(None, {"num_cpus": 2}, env_vars={"AUTONORM_PROBE": "1"}):
        probe = Probe.remote()  # held: a dropped handle kills the actor
        actor_pid = ray.get(probe.pid.remote())
        time.sleep(2.0)  # prestarted workers would be up by now (they were, within a second)
        names = {p.pid: p.name() for p in psutil.Process().children(recursive=True) if p.is_running()}
        assert psutil.Process(actor_pid).name().startswith("ray::")  # the actor's own worker
    assert not [n for n in names.values() if n == "ray::IDLE"], names
