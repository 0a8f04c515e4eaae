"""The batch-size kind: does the benefit of divergence-correcting layers shrink as the batch grows?
See :mod:`studies.kinds.batchsize.study`."""

from studies.kinds.batchsize.study import (
    SPEC,
    analyse,
    report,
    run,
    select_learning_rates,
    status,
    total_trials,
    trials_table,
)

__all__ = [
    "SPEC",
    "analyse",
    "report",
    "run",
    "select_learning_rates",
    "status",
    "total_trials",
    "trials_table",
]
