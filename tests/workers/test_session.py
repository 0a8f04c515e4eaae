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
