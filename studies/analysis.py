"""Re-export of :mod:`studies.kinds.batchsize.analysis` at its old path (imports only)."""

from studies.kinds.batchsize.analysis import (
    COMPLETED_STATUSES,
    DIVERGENCE_FIXES,
    EXACT_PERMUTATION_LIMIT,
    HYPOTHESIS,
    MIN_SEEDS,
    VERDICTS,
    batchsize_trend,
    gate_entropy,
    normalize_table,
    ols_slope,
    permutation_p_value,
    verdict_for,
)

__all__ = [
    "COMPLETED_STATUSES",
    "DIVERGENCE_FIXES",
    "EXACT_PERMUTATION_LIMIT",
    "HYPOTHESIS",
    "MIN_SEEDS",
    "VERDICTS",
    "batchsize_trend",
    "gate_entropy",
    "normalize_table",
    "ols_slope",
    "permutation_p_value",
    "verdict_for",
]
