"""Re-export of :mod:`studies.kinds.search.report` at its old path (imports only)."""

from studies.kinds.search.report import (
    CONTRASTS,
    GATED_ARMS,
    PAPER_CLAIMS,
    VERDICT_COLORS,
    claims_line,
    claims_table,
    plot_claims_forest,
    plot_dyt_weight_vs_depth,
    plot_gate_entropy_by_sublayer,
    underpowered_claims,
    write_claims_report,
)

__all__ = [
    "CONTRASTS",
    "GATED_ARMS",
    "PAPER_CLAIMS",
    "VERDICT_COLORS",
    "claims_line",
    "claims_table",
    "plot_claims_forest",
    "plot_dyt_weight_vs_depth",
    "plot_gate_entropy_by_sublayer",
    "underpowered_claims",
    "write_claims_report",
]
