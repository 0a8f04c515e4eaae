"""A running study's cost, for the writers of its outputs: one trial count and one wall time.

:class:`workers.study.StudyRunner` is the source (:meth:`~workers.study.StudyRunner.cost`); while a
study's ``with`` block runs, it is registered here for the thread that runs it, so a report writer
deep in a kind (``studies.reporting.begin_report``) puts the runner's numbers in the ``verdict.json``
and the report it writes, the numbers the run's closing lines and its MLflow run (``ls``) show.
Light: no Ray, no MLflow.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["COST_KEYS", "registered", "running_cost"]

COST_KEYS = ("trials", "wall_time_s", "cpu_hours", "gpu_hours")
"""The keys of a study's cost (``verdict.json``'s ``resources``)."""

_RUNNING: contextvars.ContextVar[Callable[[], dict[str, float]] | None] = contextvars.ContextVar(
    "autonorm_study_cost", default=None
)


@contextmanager
def registered(cost: Callable[[], dict[str, float]]) -> Iterator[None]:
    """``cost`` answers :func:`running_cost` in this thread (and the contexts copied from it) inside
    the block: a :class:`workers.study.StudyRunner` its :meth:`~workers.study.StudyRunner.cost`."""
    token = _RUNNING.set(cost)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def running_cost() -> dict[str, float] | None:
    """The cost (:data:`COST_KEYS`, or some of them) of the study this thread is running, or whose
    report it regenerates (``autonorm-study report`` registers the study directory's trial count and
    the wall time its run wrote); ``None`` otherwise (``reproduce``: a re-analysis costs nothing)."""
    cost = _RUNNING.get()
    return cost() if cost is not None else None
