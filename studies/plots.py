"""The two plots every tuned-design study directory keeps (and logs to its MLflow study run):

* ``lr_tuning.png`` (:func:`plot_lr_tuning`): each tuning cell's validation metric against η (log
  axis), one line per arm (per (arm, B) cell for a per-B tuning), the chosen η ringed, and the noise
  band: ± one standard error over the tuning seeds where the record keeps it (``score_se``);
* ``learning_curves.png`` (:func:`plot_learning_curves`): the confirmatory trials' validation metric
  against the epoch, one line per arm, the mean over seeds and its t-band (95 %).

Both read plain records (the tuning record of :mod:`studies.tuning`, per-epoch rows), so a report
rebuilt from a study directory draws the same pictures; ``None`` when there is nothing to draw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LEARNING_CURVES_PNG",
    "LR_TUNING_PNG",
    "curve_rows",
    "plot_learning_curves",
    "plot_lr_tuning",
    "write_study_plots",
]

LR_TUNING_PNG = "lr_tuning.png"
LEARNING_CURVES_PNG = "learning_curves.png"


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lr_tuning(records: Mapping[str, Mapping[str, Any]], path: Path, *, metric: str) -> Path | None:
    """Validation ``metric`` against η per tuning cell (``records``: budget -> cell -> its tuning
    record, ``""`` for a kind of one unnamed budget), the chosen η ringed, ± one SE shaded where
    recorded. One panel per budget."""
    budgets = [(b, cells) for b, cells in records.items() if isinstance(cells, Mapping) and cells]
    if not budgets:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(budgets), figsize=(6.5 * len(budgets), 4.2), squeeze=False)
    drawn = False
    for ax, (budget, cells) in zip(axes[0], budgets, strict=True):
        for cell, rec in sorted(cells.items()):
            scores = rec.get("scores") if isinstance(rec, Mapping) else None
            if not isinstance(scores, Mapping):
                continue
            points = sorted((float(lr), float(v)) for lr, v in scores.items() if _finite(v))
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            (line,) = ax.plot(xs, ys, "o-", ms=3, lw=1.2, label=str(cell))
            se = rec.get("score_se") if isinstance(rec.get("score_se"), Mapping) else {}
            band = [(x, y, float(se[f"{x:g}"])) for x, y in points if _finite(se.get(f"{x:g}"))]
            if band:
                bx, by, bs = zip(*band, strict=True)
                ax.fill_between(
                    bx,
                    [y - s for y, s in zip(by, bs, strict=True)],
                    [y + s for y, s in zip(by, bs, strict=True)],
                    color=line.get_color(),
                    alpha=0.15,
                    lw=0,
                )
            chosen = rec.get("lr")
            if _finite(chosen) and _finite(scores.get(f"{float(chosen):g}")):
                ax.plot(
                    [chosen], [scores[f"{float(chosen):g}"]], "o", ms=9, mfc="none", color=line.get_color()
                )
            drawn = True
        ax.set_xscale("log")
        ax.set_xlabel("learning rate η")
        ax.set_ylabel(f"{metric} (mean over tuning seeds)")
        ax.set_title(f"η tuning{f' ({budget} budget)' if budget else ''}: chosen η ringed, band ± 1 SE")
        if len(cells) <= 12:
            ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def write_study_plots(
    records: Mapping[str, Mapping[str, Any]],
    trials: Iterable[tuple[str, Any]],
    out_dir: Path,
    *,
    metric: str,
    report: Path | None,
) -> dict[str, Path]:
    """:data:`LR_TUNING_PNG` from the tuning ``records`` (budget -> cell -> record) and
    :data:`LEARNING_CURVES_PNG` from the confirmatory ``trials`` (``(arm, trial)`` pairs, each read
    with its history) in ``out_dir``, linked at the end of ``report`` (a ``report.md``) when given.

    Returns:
        ``{"plot_lr_tuning": path, "plot_learning_curves": path}``, for those drawn.
    """
    out: dict[str, Path] = {}
    tuning = plot_lr_tuning(records, out_dir / LR_TUNING_PNG, metric=metric)
    if tuning is not None:
        out["plot_lr_tuning"] = tuning
    curves = plot_learning_curves(
        curve_rows(trials, metric=metric), out_dir / LEARNING_CURVES_PNG, metric=metric
    )
    if curves is not None:
        out["plot_learning_curves"] = curves
    if report is not None and report.is_file() and out:
        lines = ["", "## Tuning and learning curves", ""]
        if tuning is not None:
            lines += [f"![{metric} against the learning rate per tuning cell]({LR_TUNING_PNG})", ""]
        if curves is not None:
            lines += [f"![{metric} against the epoch per arm]({LEARNING_CURVES_PNG})", ""]
        report.write_text(
            report.read_text(encoding="utf-8").rstrip("\n") + "\n" + "\n".join(lines), encoding="utf-8"
        )
    return out


def curve_rows(trials: Iterable[tuple[str, Any]], *, metric: str) -> list[dict[str, Any]]:
    """Per-epoch rows ``{arm, seed, epoch, value}`` of ``(arm, trial)`` pairs read with their history
    (a repeated epoch of a restarted trial: its last value)."""
    rows: dict[tuple[str, Any, int, Any], dict[str, Any]] = {}
    for arm, t in trials:
        seed = t.config.get("seed")
        b = (t.config.get("training") or {}).get("batch_size")
        for h in getattr(t, "history", None) or []:
            epoch, value = h.get("epoch"), h.get(metric)
            if _finite(epoch) and _finite(value):
                rows[(arm, seed, int(epoch), b)] = {
                    "arm": arm,
                    "seed": seed,
                    "epoch": int(epoch),
                    "value": float(value),
                }
    return list(rows.values())


def plot_learning_curves(
    rows: Sequence[Mapping[str, Any]], path: Path, *, metric: str, confidence: float = 0.95
) -> Path | None:
    """Validation ``metric`` against the epoch per arm (``rows``: :func:`curve_rows`): the mean over
    the seeds (and batch sizes, where a design has several) and its t-band."""
    if not rows:
        return None
    from scipy import stats

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    by_arm: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        by_arm.setdefault(str(r["arm"]), {}).setdefault(int(r["epoch"]), []).append(float(r["value"]))
    for arm, epochs in sorted(by_arm.items()):
        xs = sorted(epochs)
        means = [sum(epochs[e]) / len(epochs[e]) for e in xs]
        (line,) = ax.plot(xs, means, "o-", ms=3, lw=1.4, label=arm)
        lo, hi = [], []
        for e, m in zip(xs, means, strict=True):
            v = epochs[e]
            if len(v) > 1:
                sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
                half = float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1)) * sd / math.sqrt(len(v))
            else:
                half = 0.0
            lo.append(m - half)
            hi.append(m + half)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"{metric} (mean over seeds)")
    ax.set_title(f"Learning curves of the confirmatory trials ({confidence:.0%} t-band)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
