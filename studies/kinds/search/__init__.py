"""The search kind: one Optuna (or grid) search under Ray Tune, optionally followed by the AutoNorm
claims study (``confirm:``).

``KIND`` is the registered contract object (:class:`studies.kinds.search.kind.SearchKind`); the
run, status and report functions live in :mod:`studies.kinds.search.study`, imported on first use
(they import Ray).
"""

from __future__ import annotations

from typing import Any

from studies.kinds.search.kind import SearchKind, arm_config

__all__ = ["KIND", "SearchKind", "arm_config", "gate_lr_edges", "report", "run", "status", "total_trials"]

KIND = SearchKind()

_LAZY = ("gate_lr_edges", "report", "run", "status", "total_trials", "analyse", "describe_result")


def __getattr__(name: str) -> Any:
    # PEP 562: the run module's names, imported on first use (it imports Ray).
    if name in _LAZY:
        from studies.kinds.search import study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
