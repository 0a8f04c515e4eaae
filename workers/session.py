"""The one place that starts and stops Ray for a study.

``ray_session`` joins ``address`` / ``$RAY_ADDRESS`` when given, else starts a loopback-only local
cluster, and on exit stops only what it started: ``ray.shutdown()`` plus a wait for the worker
processes that appeared after ``ray.init`` (Ray puts them in process groups of their own, and they
outlive ``ray.shutdown`` by seconds). Children the caller had before (a notebook's servers, a test's
PostgreSQL) are never touched. A study of several plans holds one session for all of them: starting
Ray costs 15-20 s here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from workers import interrupts

__all__ = ["local_cluster_resources", "ray_session"]

logger = logging.getLogger(__name__)


def _child_pids() -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def _shutdown_local_ray(preexisting: set[int], timeout_s: float = 30.0) -> None:
    import psutil
    import ray

    try:
        ours = [p for p in psutil.Process().children(recursive=True) if p.pid not in preexisting]
    except psutil.Error:
        ours = []
    # Worker processes left over once Tune has returned are idle (every result and checkpoint is
    # saved): stop them first, hard. Ray's own shutdown sends them SIGTERM, whose handler raises
    # SystemExit inside whatever they are doing and prints a traceback the user would take for a
    # failure of the study.
    for proc in ours:
        with contextlib.suppress(psutil.Error):
            name = proc.name()
            if name.startswith("ray::") and not name.endswith("Agent"):  # workers, not Ray's agents
                proc.kill()
    ray.shutdown()
    _, alive = psutil.wait_procs(ours, timeout=timeout_s)
    for proc in alive:
        logger.warning("Ray process %s still alive %.0f s after shutdown; killing it", proc.pid, timeout_s)
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _init_local(kwargs: Mapping[str, Any], preexisting: set[int], attempts: int = 3) -> None:
    """``ray.init`` of a local cluster, retried when the node times out during startup: Ray gives its
    processes a fixed ~30 s to come up, which a loaded machine can miss (seen here at load 15-20)."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            logger.warning("local Ray did not start in time (attempt %d of %d); retrying", attempt, attempts)
            _shutdown_local_ray(preexisting)


def local_cluster_resources(
    address: str | None = None, init_kwargs: Mapping[str, Any] | None = None
) -> dict[str, float] | None:
    """What the local cluster :func:`ray_session` would start will have, known before starting it.

    ``None`` when the session would join a cluster (``address`` / ``$RAY_ADDRESS``) or one is already
    initialised in this process (ask that cluster). Otherwise ``{"CPU": n}`` (``num_cpus`` or the
    machine's CPU count), plus ``"GPU"`` only when ``num_gpus`` is given (Ray detects GPUs itself).
    """
    import ray

    if ray.is_initialized() or address or os.environ.get("RAY_ADDRESS"):
        return None
    kwargs = dict(init_kwargs or {})
    have = {"CPU": float(kwargs.get("num_cpus") or os.cpu_count() or 1)}
    if kwargs.get("num_gpus") is not None:
        have["GPU"] = float(kwargs["num_gpus"])
    return have


@contextlib.contextmanager
def ray_session(
    address: str | None = None,
    init_kwargs: Mapping[str, Any] | None = None,
    *,
    env_vars: Mapping[str, str] | None = None,
) -> Iterator[bool]:
    """Connect to (or start) Ray for the block; yields True when this call started a local cluster.

    Args:
        address: cluster to join; ``$RAY_ADDRESS`` when ``None``; a local loopback cluster otherwise.
        init_kwargs: extra ``ray.init`` keywords (``num_cpus``, ``_temp_dir``).
        env_vars: environment for the local cluster's workers (never used when joining a cluster:
            inside a Ray Job a runtime_env would replace the job's, working_dir included).
    """
    import ray

    if ray.is_initialized():
        yield False
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **dict(init_kwargs or {}))
        interrupts.reinstall()  # ray.init replaced the driver's SIGTERM handler
        try:
            yield False
        finally:
            ray.shutdown()  # disconnects this driver; the cluster keeps running
        return
    # Embedded mode: every listener on 127.0.0.1. Real clusters come through RAY_ADDRESS.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Ray starts num_cpus idle workers for the first driver, without the study's runtime_env, so no
    # trial actor can use them (each gets a fresh worker with that environment): about a second of
    # CPU each for nothing, at every local start.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": dict(env_vars)}
    kwargs.update(init_kwargs or {})
    preexisting = _child_pids()
    _init_local(kwargs, preexisting)
    interrupts.reinstall()  # ray.init replaced the driver's SIGTERM handler
    try:
        yield True
    finally:
        _shutdown_local_ray(preexisting)
