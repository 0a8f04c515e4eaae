"""Re-export of :mod:`studies.kinds.batchsize.report` at its old path (imports only)."""

from studies.kinds.batchsize.report import (
    VERDICT_COLORS,
    cell_summary,
    control_table,
    metric_range,
    plot_forest,
    plot_gate_entropy,
    plot_metric_vs_batch_size,
    render_html,
    render_markdown,
    sensitivity_table,
    verdict_table,
    write_batchsize_report,
)

__all__ = [
    "VERDICT_COLORS",
    "cell_summary",
    "control_table",
    "metric_range",
    "plot_forest",
    "plot_gate_entropy",
    "plot_metric_vs_batch_size",
    "render_html",
    "render_markdown",
    "sensitivity_table",
    "verdict_table",
    "write_batchsize_report",
]
