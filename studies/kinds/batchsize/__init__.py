"""The batch-size kind: does the benefit of divergence-correcting layers shrink as the batch grows?

``KIND`` is the registered contract object (:class:`studies.kinds.batchsize.kind.BatchSizeKind`);
the run, status and report functions live in :mod:`studies.kinds.batchsize.study`, imported on first
use (they import Ray).
"""

from __future__ import annotations

from typing import Any

from studies.kinds.batchsize.kind import BatchSizeKind

__all__ = [
    "KIND",
    "BatchSizeKind",
    "analyse",
    "report",
    "run",
    "select_learning_rates",
    "status",
    "total_trials",
    "trials_table",
]

KIND = BatchSizeKind()

_LAZY = ("analyse", "report", "run", "select_learning_rates", "status", "total_trials", "trials_table")


def __getattr__(name: str) -> Any:
    # PEP 562: the run module's names, imported on first use (it imports Ray).
    if name in _LAZY:
        from studies.kinds.batchsize import study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
