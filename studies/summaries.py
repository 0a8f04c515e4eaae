"""Per-arm summary runs: what MLflow's chart view needs to draw a study's comparison natively.

MLflow draws one chart per metric key and one line per run, with the metric's ``step`` on the x
axis. So under a phase run, one *summary run* per arm (``autonorm.role=summary``, named after the
arm, tagged ``autonorm.arm``) logs ``<metric>_mean``, ``<metric>_ci_low`` and ``<metric>_ci_high``
at ``step`` = the phase's axis value (the batch size, the epoch): selecting a phase's summary runs
draws ``<metric>_mean`` against that axis with one line per arm. The values are the mean over
seeds of the trials table's metric and its t-interval (:func:`studies.stats.mean_interval`), the
same numbers ``trials.csv`` gives; the interval of an accuracy (a metric named ``*accuracy``) is
clipped to [0, 1], the range the metric can take (a t-interval over two seeds easily leaves it).
Summary runs are never trials: every trial count reads ``autonorm.role=trial`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from studies.stats import mean_interval

__all__ = ["SummaryRun", "arm_summaries"]


@dataclass(frozen=True)
class SummaryRun:
    """One arm's summary under one phase run: ``metrics[key]`` is ``[(step, value), ...]``."""

    arm: str
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    n: dict[int, int] = field(default_factory=dict)  # seeds with a finite value, per step


def arm_summaries(
    table: Any,
    *,
    metrics: Sequence[str],
    axis: str,
    arm: str = "arm",
    confidence: float = 0.95,
) -> list[SummaryRun]:
    """One :class:`SummaryRun` per arm of ``table`` (a trials table, one row per trial), with
    ``<metric>_mean`` / ``_ci_low`` / ``_ci_high`` per value of the integer column ``axis``.

    A row whose metric is NaN (a failed trial) is left out of that point, as pandas' mean leaves it
    out of ``trials.csv``'s; a point with one finite value has no CI (NaN, not logged)."""
    if table is None or len(table) == 0 or axis not in table.columns:
        return []
    out = []
    for name in sorted({str(a) for a in table[arm]}):
        sub = table[table[arm].astype(str) == name]
        run = SummaryRun(arm=name)
        for step in sorted({int(s) for s in sub[axis]}):
            rows = sub[sub[axis].astype(int) == step]
            for metric in metrics:
                if metric not in rows.columns:
                    continue
                mean, lo, hi, n = mean_interval(rows[metric].astype(float).to_numpy(), confidence)
                if metric.endswith("accuracy") and n >= 2:  # an accuracy lies in [0, 1], so does its CI
                    lo, hi = max(lo, 0.0), min(hi, 1.0)
                for suffix, value in (("mean", mean), ("ci_low", lo), ("ci_high", hi)):
                    run.metrics.setdefault(f"{metric}_{suffix}", []).append((step, value))
                run.n[step] = max(run.n.get(step, 0), n)
        out.append(run)
    return out
