"""The search kind: one Optuna (or grid) search under Ray Tune, optionally followed by the AutoNorm
claims study (``confirm:``). See :mod:`studies.kinds.search.study`."""

from studies.kinds.search.study import (
    SPEC,
    arm_config,
    gate_lr_edges,
    report,
    run,
    status,
    total_trials,
)

__all__ = ["SPEC", "arm_config", "gate_lr_edges", "report", "run", "status", "total_trials"]
