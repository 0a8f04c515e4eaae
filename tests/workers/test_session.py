"""workers.session: a local Ray that misses its startup deadline is started again (the deadline is
Ray's own and a loaded machine misses it; it cannot be provoked on demand, so ray.init is scripted)."""

from __future__ import annotations

from typing import Any

import pytest

from workers import session


def test_startup_timeout_is_retried_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[dict[str, Any]] = []
    stops: list[set[int]] = []

    def init(**kwargs: Any) -> None:
        calls.append(kwargs)
        if len(calls) < 3:
            raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(session, "_shutdown_local_ray", lambda pre, timeout_s=30.0: stops.append(pre))
    session._init_local({"num_cpus": 1}, {42})
    assert len(calls) == 3 and calls[-1] == {"num_cpus": 1}
    assert stops == [
        {42},
        {42},
    ]  # what the failed attempt left behind is stopped, the caller's children spared


def test_other_errors_and_the_last_timeout_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setattr(session, "_shutdown_local_ray", lambda pre, timeout_s=30.0: None)

    def bad(**kwargs: Any) -> None:
        raise ValueError("invalid argument num_cpus")

    monkeypatch.setattr(ray, "init", bad)
    with pytest.raises(ValueError, match="num_cpus"):
        session._init_local({}, set())
    attempts: list[int] = []

    def slow(**kwargs: Any) -> None:
        attempts.append(1)
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "init", slow)
    with pytest.raises(Exception, match="timed out during startup"):
        session._init_local({}, set(), attempts=2)
    assert len(attempts) == 2


def test_local_cluster_resources_are_predicted_only_for_a_cluster_this_session_would_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the premise: no cluster in this process yet
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert session.local_cluster_resources(None, {"num_cpus": 3}) == {"CPU": 3.0}
    assert session.local_cluster_resources(None, None) == {"CPU": float(os.cpu_count() or 1)}
    assert session.local_cluster_resources(None, {"num_cpus": 2, "num_gpus": 1}) == {"CPU": 2.0, "GPU": 1.0}
    assert session.local_cluster_resources("ray://head:10001", {"num_cpus": 2}) is None  # joins: ask it
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert session.local_cluster_resources(None, {"num_cpus": 2}) is None


def test_precheck_refuses_before_any_ray_start_and_leaves_unknown_resources_to_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from workers.errors import ResourceError
    from workers.plan import StudyPlan
    from workers.preflight import precheck_local_resources

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("AUTONORM_ALLOW_PENDING_RESOURCES", raising=False)
    started: list[Any] = []
    monkeypatch.setattr(ray, "init", lambda **kw: started.append(kw))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the premise: no cluster in this process yet

    def plan(**resources: float) -> StudyPlan:
        return StudyPlan(name="p", base_config={}, resources=tuple(resources.items()))

    with pytest.raises(ResourceError, match=r"resources\.cpu.*asks for 64 CPU.*has 2"):
        precheck_local_resources([plan(cpu=64)], None, {"num_cpus": 2})
    precheck_local_resources([plan(cpu=2, gpu=0.5)], None, {"num_cpus": 2})  # GPUs: Ray detects them later
    precheck_local_resources(
        [plan(cpu=2, accelerator_x=1)], None, {"num_cpus": 2}
    )  # custom: the cluster says
    with pytest.raises(ResourceError, match=r"resources\.gpu"):
        precheck_local_resources([plan(cpu=1, gpu=1)], None, {"num_cpus": 2, "num_gpus": 0})
    monkeypatch.setenv("AUTONORM_ALLOW_PENDING_RESOURCES", "1")
    precheck_local_resources([plan(cpu=64)], None, {"num_cpus": 2})
    assert started == []  # nothing was started to find this out
