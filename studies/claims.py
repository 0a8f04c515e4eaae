"""Re-export of :mod:`studies.kinds.search.claims` at its old path (imports only)."""

from studies.kinds.search.claims import (
    ARMS,
    CLAIMS,
    COMPLETED_STATUSES,
    CONFIRM_COLUMNS,
    VERDICTS,
    autonorm_claims,
    collapse_epochs,
    dyt_depth_slope,
    paired_contrast,
)

__all__ = [
    "ARMS",
    "CLAIMS",
    "COMPLETED_STATUSES",
    "CONFIRM_COLUMNS",
    "VERDICTS",
    "autonorm_claims",
    "collapse_epochs",
    "dyt_depth_slope",
    "paired_contrast",
]
