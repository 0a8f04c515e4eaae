"""Reports for hypothesis studies: ``verdict.json``, ``report.md``, ``report.html``, ``trials.csv`` and plots.

Every function here takes data and output paths and writes files; nothing logs to MLflow (the study
entry point does that with the parent run's id), nothing reads global state. Plots use matplotlib's
Agg canvas through ``matplotlib.figure.Figure`` (never pyplot), so they render on head-less cluster
nodes and from threads, and touch no global figure state.

The HTML report is rendered from a Jinja2 template with autoescaping on, and every image is embedded
as a ``data:image/png;base64`` URI: MLflow's UI shows HTML artifacts in a sandboxed iframe where
relative image paths never resolve. The study verdict is the first line of ``report.md`` and the
first element of the HTML page.

Colours: a supported claim is drawn in blue, refuted in orange and inconclusive in grey; no verdict
is drawn in red (red reads as "bad" or "alarm", and neither outcome is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory
from scipy import stats

from studies.adequacy import report_section
from studies.kinds.batchsize.analysis import normalize_table
from studies.reporting import (
    COLORS,
    Document,
    Section,
    begin_report,
    fmt,
    fmt_ci,
    legend_handles,
    save_figure,
    study_document,
)
from studies.reporting import render_html as kit_html
from studies.reporting import render_markdown as kit_markdown

__all__ = [
    "VERDICT_COLORS",
    "cell_summary",
    "control_table",
    "metric_range",
    "plot_forest",
    "plot_metric_vs_batch_size",
    "render_html",
    "render_markdown",
    "sensitivity_table",
    "verdict_table",
    "write_batchsize_report",
]

#: Verdict and control-label colours (blue / orange / grey; never red for "supported").
VERDICT_COLORS = COLORS


# --------------------------------------------------------------------------------------------------
# Tables (rows of text, shared by Markdown and HTML)


def _ordered_arms(result: Mapping[str, Any]) -> list[str]:
    control = result["control"]
    controls = list(result.get("control_arms") or [control])
    rest = sorted(a for a in result["arms"] if a not in controls)
    return [a for a in controls if a in result["arms"]] + rest


def _arm_results(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(arm, its result)`` in table order: controls first, then the fix arms."""
    return [(arm, result["arms"][arm]) for arm in _ordered_arms(result)]


def _outcome(r: Mapping[str, Any]) -> str:
    return str(r.get("verdict") or r.get("label") or "–")


#: Table column -> (result key, formatter): the numbers every table of this kind shows the same way.
_CELLS: dict[str, tuple[str, Any]] = {
    "slope / log2 B": ("slope", fmt),
    "slope CI": ("slope_ci", fmt_ci),
    "interaction": ("interaction", fmt),
    "interaction CI": ("interaction_ci", fmt_ci),
    "p": ("p_value", fmt),
    "p (Holm)": ("p_value_holm", fmt),
    "spearman ρ": ("spearman_rho", fmt),
    # its interval on the Fisher-z scale, inside [-1, 1]; none below 3 seeds
    "spearman ρ CI": ("spearman_rho_ci", lambda ci: fmt_ci(ci) if ci else "n/a"),
    "n": ("n", fmt),
    "failed": ("n_failed", fmt),
}


def _cells(r: Mapping[str, Any], *columns: str) -> dict[str, str]:
    """The named columns of one arm's (or one sensitivity analysis's) result, formatted."""
    out = {}
    for column in columns:
        if column == "reasons":
            out[column] = "; ".join(r.get("reasons") or []) or "–"
        else:
            key, formatter = _CELLS[column]
            out[column] = formatter(r.get(key))
    return out


def verdict_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per arm of a single-budget result: controls first, then the fix arms.

    Columns: arm, role, verdict (a fix arm's verdict or a control's label), reasons, slope,
    slope CI, interaction, interaction CI, p, p (Holm), spearman ρ, spearman ρ CI ("n/a" below 3
    seeds), n, failed.
    """
    control = result["control"]
    return [
        {
            "arm": f"{arm} (control)" if arm == control else arm,
            "role": str(r.get("role", "control" if arm == control else "fix")),
            "verdict": _outcome(r),
            **_cells(r, "reasons", *_CELLS),
        }
        for arm, r in _arm_results(result)
    ]


def control_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """The control labels of a single-budget result: label, slope with CI, the −δ threshold, reasons."""
    delta = float(result.get("delta", 0.005))
    sign = 1.0 if result.get("higher_is_better", True) else -1.0
    threshold = f"{fmt(-sign * delta)} per doubling"
    return [
        {
            "control": arm,
            "label": str(label),
            **_cells(result["arms"][arm], "slope / log2 B", "slope CI"),
            "threshold": threshold,
            **_cells(result["arms"][arm], "reasons"),
        }
        for arm, label in result["controls"].items()
    ]


def sensitivity_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """The sensitivity analysis of a single-budget result (failed trials dropped, not scored at chance)."""
    columns = ("n", "slope / log2 B", "slope CI", "interaction", "interaction CI", "p (Holm)", "reasons")
    return [
        {
            "arm": arm,
            "verdict (failures dropped)": _outcome(r.get("sensitivity") or {}),
            "verdict (primary)": _outcome(r),
            **_cells(r.get("sensitivity") or {}, *columns),
        }
        for arm, r in _arm_results(result)
    ]


def cell_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """Failed trials / trials and median final train loss per (arm, batch size) cell."""
    rows = []
    for arm, r in _arm_results(result):
        fails = r.get("failures_by_cell") or {}
        ns = r.get("n_by_cell") or {}
        losses = r.get("median_train_loss_by_cell") or {}
        row = {"arm": arm}
        for cell in fails:
            row[f"B={cell}"] = f"{fails[cell]}/{ns.get(cell, '?')} · {fmt(losses.get(cell))}"
        rows.append(row)
    return rows


def budget_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """For a result with budgets: one row per arm with the combined and the per-budget outcomes."""
    names = list(result["budgets"] or {})
    rows = []
    for arm, r in _arm_results(result):
        row = {
            "arm": arm,
            "role": str(r.get("role", "")),
            "combined": _outcome(r),
            **_cells(r, "reasons"),
        }
        for b in names:
            row[b] = _outcome(r["by_budget"][b])
        rows.append(row)
    return rows


def _single_results(result: Mapping[str, Any]) -> list[tuple[str | None, Mapping[str, Any]]]:
    budgets = result.get("budgets")
    if budgets:
        return [(str(b), r) for b, r in budgets.items()]
    return [(None, result)]


# --------------------------------------------------------------------------------------------------
# Plots


def metric_range(metric: str, values: np.ndarray | None = None) -> tuple[float, float] | None:
    """The range a metric can take: ``(0, 1)`` for an accuracy (its name contains ``acc``) or when every
    value lies in [0, 1]; else ``None`` (unbounded)."""
    if "acc" in metric.lower():
        return (0.0, 1.0)
    if values is not None:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        if v.size and float(v.min()) >= 0.0 and float(v.max()) <= 1.0:
            return (0.0, 1.0)
    return None


def cell_summary(
    table: pd.DataFrame,
    *,
    metric: str,
    control: str | None = None,
    confidence: float = 0.95,
    clip: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Mean and t-interval over seeds, per (budget, arm, batch size), over completed trials, of the
    metric (``kind="metric"``, band clipped to ``clip``) and of the paired difference to ``control``
    (``kind="difference"``, never clipped).

    Columns: ``kind, budget, arm, batch_size, n, mean, lo, hi`` (``lo``/``hi`` NaN when ``n < 3``:
    the band of two points says little; the plot shows the points instead).
    """
    df = normalize_table(table, metric)
    ok = df[df["ok"]]
    cell = ok.groupby(["budget", "arm", "batch_size", "seed"], as_index=False)["value"].mean()
    frames = [cell.assign(kind="metric")]
    if control is not None:
        ctrl = cell[cell["arm"] == control].drop(columns="arm").rename(columns={"value": "ctrl"})
        paired = cell[cell["arm"] != control].merge(ctrl, on=["budget", "batch_size", "seed"], how="inner")
        frames.append(paired.assign(value=paired["value"] - paired["ctrl"], kind="difference"))
    values = pd.concat(frames, ignore_index=True)
    rows = []
    for (kind, budget, arm, b), g in values.groupby(["kind", "budget", "arm", "batch_size"]):
        v = g["value"].to_numpy(dtype=float)
        mean = float(v.mean())
        lo = hi = math.nan
        if v.size >= 3:
            half = float(stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
            lo, hi = mean - half, mean + half
            if kind == "metric" and clip is not None:
                lo, hi = max(lo, clip[0]), min(hi, clip[1])
        rows.append(
            {
                "kind": kind,
                "budget": budget,
                "arm": arm,
                "batch_size": b,
                "n": v.size,
                "mean": mean,
                "lo": lo,
                "hi": hi,
            }
        )
    cols = ["kind", "budget", "arm", "batch_size", "n", "mean", "lo", "hi"]
    return pd.DataFrame(rows, columns=cols)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _arm_colors(arms: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab10"]
    palette = [cmap(i) for i in range(10) if i != 3]  # tab10's index 3 is red
    return {arm: palette[i % len(palette)] for i, arm in enumerate(arms)}


def plot_metric_vs_batch_size(
    table: pd.DataFrame,
    path: str | Path,
    *,
    metric: str,
    control: str | None = None,
    result: Mapping[str, Any] | None = None,
    confidence: float = 0.95,
) -> Path:
    """Metric vs batch size per arm (mean over completed seeds, t-interval band, log2 x-axis), and
    with ``control`` the paired difference to it; one row of panels per budget.

    Bands are drawn only for cells with n >= 3 and are clipped to the metric's range (accuracy in
    [0, 1]); every completed trial is a dot, so a cell with one or two seeds shows its points. Failed
    trials are crosses at the chance level the analysis scored them at (``result["chance_metric"]``).
    """
    df = normalize_table(table, metric)
    clip = metric_range(metric, df.loc[df["ok"], "value"].to_numpy())
    summary = cell_summary(table, metric=metric, control=control, confidence=confidence, clip=clip)
    budgets = sorted(df["budget"].unique())
    arms = sorted(df["arm"].unique(), key=lambda a: (a != control, a))
    colors = _arm_colors(arms)
    kinds = ["metric", "difference"] if control is not None else ["metric"]
    fig = Figure(figsize=(6.2 * len(kinds), 4.6 * len(budgets)))
    axes = fig.subplots(len(budgets), len(kinds), squeeze=False)
    chance = result.get("chance_metric") if result is not None else None
    labels: dict[str, str] = {}
    if result is not None:
        labels = {
            a: f"{a} ({v})" for a, v in {**result.get("controls", {}), **result.get("verdict", {})}.items()
        }
    ok = df[df["ok"]]
    for row, budget in enumerate(budgets):
        for ax, kind in zip(axes[row], kinds):
            sub = summary[(summary["kind"] == kind) & (summary["budget"] == budget)]
            for arm in arms:
                g = sub[sub["arm"] == arm].sort_values("batch_size")
                if g.empty:
                    continue
                b = g["batch_size"].to_numpy(dtype=float)
                ax.plot(b, g["mean"], marker="o", ms=4, color=colors[arm], label=labels.get(arm, arm))
                ax.fill_between(b, g["lo"], g["hi"], color=colors[arm], alpha=0.18, linewidth=0)
                if kind == "metric":
                    pts = ok[(ok["arm"] == arm) & (ok["budget"] == budget)]
                    ax.scatter(
                        pts["batch_size"], pts["value"], s=9, color=colors[arm], alpha=0.5, linewidths=0
                    )
                    failed = df[(df["arm"] == arm) & (df["budget"] == budget) & ~df["ok"]]
                    if chance is not None and len(failed):
                        ax.scatter(
                            failed["batch_size"],
                            np.full(len(failed), float(chance)),
                            marker="x",
                            s=22,
                            color=colors[arm],
                        )
            if kind == "metric" and clip is not None:
                lo_v, hi_v = clip
                vals = ok.loc[ok["budget"] == budget, "value"].to_numpy(dtype=float)
                if vals.size:
                    pad = 0.05 * max(float(np.ptp(vals)), 0.01)
                    lo_v = max(clip[0], float(vals.min()) - pad)
                    hi_v = min(clip[1], float(vals.max()) + pad)
                    if chance is not None and clip[0] <= float(chance) <= clip[1]:
                        lo_v = min(lo_v, float(chance))
                ax.set_ylim(lo_v - 0.01 * (hi_v - lo_v), hi_v + 0.01 * (hi_v - lo_v))
            ax.set_xscale("log", base=2)
            ticks = sorted(df["batch_size"].unique())
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(int(t)) if float(t).is_integer() else str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("batch size B (log2 scale)")
            ax.grid(alpha=0.3)
            where = f" [{budget}]" if budget else ""
            if kind == "metric":
                ax.set_ylabel(metric)
                ax.set_title(
                    f"{metric} vs B{where}: mean, {confidence:.0%} CI (n≥3), dots = trials", fontsize=9
                )
            else:
                ax.axhline(0.0, color="black", lw=0.8)
                ax.set_ylabel(f"{metric}(arm) − {metric}({control})")
                ax.set_title(f"paired difference to the control{where}", fontsize=9)
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_forest(result: Mapping[str, Any], path: str | Path) -> Path:
    """Forest plot: each arm's slope and interaction vs log2 B with their CIs, coloured by verdict
    (fix arms) or label (controls); one line per budget when the result has budgets."""
    entries: list[tuple[str, Mapping[str, Any]]] = []
    for budget, single in _single_results(result):
        for arm in _ordered_arms(single):
            name = arm if budget is None else f"{arm} [{budget}]"
            entries.append((name, single["arms"][arm]))
    control = result["control"]
    fig = Figure(figsize=(11, 0.5 * len(entries) + 2.0))
    axes = fig.subplots(1, 2, sharey=True)
    ypos = np.arange(len(entries))[::-1]
    for ax, (key, title) in zip(
        axes, [("slope", "slope vs log2 B"), ("interaction", f"interaction (arm − {control}) vs log2 B")]
    ):
        for y, (_name, r) in zip(ypos, entries):
            color = VERDICT_COLORS.get(_outcome(r), "black")
            est, ci = r.get(key), r.get(f"{key}_ci")
            if ci is not None and None not in ci:
                ax.plot(ci, [y, y], color=color, lw=2.2)
            if est is not None:
                ax.plot([est], [y], "o", color=color, ms=6)
            elif key == "interaction":
                trans = blended_transform_factory(ax.transAxes, ax.transData)
                ax.text(0.02, y, "n/a", transform=trans, ha="left", va="center", fontsize=8, color="gray")
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        if key == "slope":
            d = float(result.get("delta", 0.005)) * (1.0 if result.get("higher_is_better", True) else -1.0)
            ax.axvline(-d, color="gray", lw=0.8, ls=":")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"Δ {result['metric']} per doubling of B")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ypos)
    axes[0].set_yticklabels([name for name, _ in entries])
    handles = legend_handles([_outcome(r) for _, r in entries], lw=2.2)  # the labels that occur, once each
    fig.legend(handles=handles, loc="lower center", ncol=max(1, len(handles)), fontsize=8, frameon=False)
    fig.suptitle(f"{result.get('confidence', 0.95):.0%} CIs over seeds (dotted: −δ)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return save_figure(fig, path)


def plot_lr_vs_batch_size(result: Mapping[str, Any], path: str | Path) -> Path | None:
    """The η each (arm, B) cell trained with against B (``result["per_budget"]``'s ``tuned_lr``), one
    line per arm, log-log, one panel per budget, with the square-root rule through the control's
    η at the smallest B for reference; ``None`` when the verdict has no η per cell."""
    per_budget = result.get("per_budget")
    if not isinstance(per_budget, Mapping) or not per_budget:
        return None
    fig = Figure(figsize=(5.5 * len(per_budget), 4))
    axes = fig.subplots(1, len(per_budget), squeeze=False)
    control = result.get("control")
    for ax, (budget, reading) in zip(axes[0], per_budget.items()):
        arms = reading.get("arms") or {}
        colors = _arm_colors(sorted(arms, key=lambda a: (a != control, a)))
        for arm, r in arms.items():
            pts = sorted(
                (int(b), float(v)) for b, v in (r.get("tuned_lr") or {}).items() if _finite(v) and v > 0
            )
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", color=colors[arm], label=arm, lw=2 if arm == control else 1.2)
        ref = sorted(
            (int(b), float(v))
            for b, v in ((arms.get(control) or {}).get("tuned_lr") or {}).items()
            if _finite(v) and v > 0
        )
        if len(ref) >= 2:
            b0, lr0 = ref[0]
            sizes = [b for b, _ in ref]
            ax.plot(sizes, [lr0 * (b / b0) ** 0.5 for b in sizes], ls=":", color="grey", label="√B rule")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("tuned learning rate η")
        ax.set_title(f"{budget} budget: η per (arm, B) cell")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------------
# Markdown and HTML


def _headline(result: Mapping[str, Any]) -> str:
    reasons = result.get("study_reasons") or []
    text = f"Study verdict: {result['study_verdict']}"
    return text + (f" ({'; '.join(reasons)})" if reasons else "")


_BANNER = (
    "Exploratory — underpowered: at least one arm failed the power gate (too few seeds with data in "
    "every cell, too few batch sizes, or a design that cannot reach significance). Its verdicts are "
    "not confirmatory."
)


def _method_lines(result: Mapping[str, Any]) -> list[str]:
    return [
        "slope: mean over seeds of the per-seed OLS slope of the metric vs log2 B; CI: t-interval over "
        "the per-seed slopes (K − 1 df) below 10 seeds, seed bootstrap "
        f"({result.get('n_boot')} resamples) from 10 seeds; {result.get('confidence', 0.95):.0%} level.",
        "interaction: the same per-seed slope of the paired differences arm − control per (B, seed) cell.",
        "spearman ρ: mean over seeds of the per-seed Spearman ρ vs B; its interval is taken on the "
        "Fisher-z scale (ρ = ±1 as ±0.999, t-interval of the mean atanh ρ, back-transformed), so it "
        "lies inside [−1, 1]; none below 3 seeds.",
        "p: one-sided (predicted direction), the larger of the within-seed permutation p of the batch-size "
        f"labels (exact when ≤ 100,000 permutations, else {result.get('n_perm')} draws) and the t-test p "
        "over seeds; Holm over the fix arms only.",
        f"failed trials are scored at chance ({fmt(result.get('chance_metric'))}; train loss "
        f"{fmt(result.get('chance_loss'))}); the sensitivity table drops them instead.",
        "gates (→ inconclusive): > 20 % failures in a cell (failures), median final train loss > 0.9 × "
        "chance loss in a cell (optimisation-limited), tuned lr at its range edge (lr-at-range-edge), "
        f"fewer than {result.get('min_seeds')} complete seeds, fewer than 4 batch sizes or a smallest "
        "attainable p × family ≥ α (underpowered).",
        f"verdict: supported iff Holm p < α = {fmt(result.get('alpha'))} and the slope and interaction "
        "CIs both lie in the predicted direction of 0; refuted iff either lies entirely on the other "
        f"side; controls: declines / stable / unclear against −δ, δ = {fmt(result.get('delta'))}.",
    ]


def _sections(result: Mapping[str, Any]) -> list[tuple[str, list[str], list[dict[str, str]]]]:
    """The report body as ``(heading, paragraphs, table)`` sections, shared by Markdown and HTML."""
    sections = []
    if result.get("budgets"):
        across = (
            "A fix arm is supported only when it is supported under every budget; supported under "
            "some budgets only is reported as budget-dependent (inconclusive)."
        )
        sections.append(("Verdicts across budgets", [across], budget_table(result)))
    for budget, single in _single_results(result):
        prefix = f"Budget {budget}: " if budget is not None else ""
        dropped = (single.get("sensitivity") or {}).get("study_verdict", "–")
        test = (single.get("sensitivity") or {}).get("test") or single.get("test")
        same_test = f" (the primary's {test} test, on the trials that did not fail)" if test else ""
        sections += [
            (
                f"{prefix}per-arm results",
                [_headline(single)] if budget is not None else [],
                verdict_table(single),
            ),
            (f"{prefix}control labels", [], control_table(single)),
            (
                f"{prefix}sensitivity (failed trials dropped)",
                [f"Study verdict with failures dropped: {dropped}{same_test}."],
                sensitivity_table(single),
            ),
            (
                f"{prefix}failures and median train loss per cell",
                ["failed/trials · median final train loss (failures at chance loss)."],
                cell_table(single),
            ),
        ]
    return sections


def _document(
    result: Mapping[str, Any],
    *,
    title: str = "Batch-size correlation study",
    protocol: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
) -> Document:
    hib = result.get("higher_is_better", True)
    labels = ("label", "combined", *(result.get("budgets") or {}))
    sections = [
        Section(heading, text, [rows], label_columns=labels) for heading, text, rows in _sections(result)
    ]
    sections.append(Section("Training adequacy", *report_section(result)))
    return study_document(
        result,
        banner=_BANNER,
        protocol=protocol,
        spent=(wall_time_s, cpu_hours, gpu_hours),
        headline=_headline(result),
        title=title,
        intro=[
            f"**Hypothesis.** {result.get('hypothesis', '')}",
            *(
                f"**Reading.** {r['reading']}"
                for r in (result.get("per_budget") or {}).values()
                if isinstance(r, Mapping) and r.get("reading")
            ),
            f"Metric `{result['metric']}` (higher is {'better' if hib else 'worse'}); control arm "
            f'`{result["control"]}`. "Worse as B grows" means a {result.get("direction", "negative")} slope '
            "vs log2 B.",
        ],
        sections=sections,
        method=_method_lines(result),
    )


def render_markdown(result: Mapping[str, Any], *, plots: Sequence[str] = (), **options: Any) -> str:
    """The Markdown report. Its first line is the study verdict; then the exploratory banner (when
    any arm is underpowered), the hypothesis, per-arm, control, sensitivity and cell tables (per
    budget when there are budgets), method, resources and the protocol; the plots (captioned) come
    before the tables. ``options``: ``title``,
    ``protocol`` (shown as YAML), ``wall_time_s``, ``cpu_hours``, ``gpu_hours``."""
    return kit_markdown(_document(result, **options), plots)


def render_html(result: Mapping[str, Any], *, images: Sequence[str | Path] = (), **options: Any) -> str:
    """The HTML report (:func:`studies.reporting.render_html`): the study verdict is the first element
    of the body; ``images`` (PNG files) are embedded as ``data:image/png;base64`` URIs; ``options``
    as for :func:`render_markdown`."""
    return kit_html(_document(result, **options), images)


def write_batchsize_report(
    verdict: Mapping[str, Any],
    table: pd.DataFrame,
    out_dir: str | Path,
    *,
    title: str = "Batch-size correlation study",
    protocol: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
) -> dict[str, Path]:
    """Write ``verdict.json``, ``trials.csv``, ``report.md``, ``report.html``,
    ``metric_vs_batch_size.png`` and ``forest.png`` into ``out_dir``.

    Args:
        verdict: the dictionary returned by :func:`studies.kinds.batchsize.analysis.batchsize_trend`; written verbatim
            (NaN as null) to ``verdict.json``.
        table: the trial table the result was computed from; ``trials.csv`` keeps every column.
        out_dir: the study's output directory (created when missing).
        title: report heading.
        protocol: the protocol used (the resolved study spec or its relevant part), shown as YAML.
        wall_time_s / cpu_hours / gpu_hours: resources spent, shown in the report.

    Returns:
        Output name -> path: ``verdict``, ``trials``, ``markdown``, ``html``, ``plot_metric``,
        ``plot_forest``, ``plot_lr`` (``lr_vs_batch_size.png``, :func:`plot_lr_vs_batch_size`) and, for a sequential design, ``plot_looks`` (``intervals_vs_seeds.png``:
        each hypothesis's confidence sequence against the seeds).
    """
    paths = begin_report(
        out_dir, verdict, table, plot_metric="metric_vs_batch_size.png", plot_forest="forest.png"
    )
    plot_metric_vs_batch_size(
        table,
        paths["plot_metric"],
        metric=str(verdict["metric"]),
        control=str(verdict["control"]),
        result=verdict,
        confidence=float(verdict.get("confidence", 0.95)),
    )
    plot_forest(verdict, paths["plot_forest"])
    plots = [paths["plot_metric"], paths["plot_forest"]]
    lr_plot = plot_lr_vs_batch_size(verdict, Path(out_dir) / "lr_vs_batch_size.png")
    if lr_plot is not None:
        paths["plot_lr"] = lr_plot
        plots.append(lr_plot)
    if verdict.get("looks"):
        from studies.sequential import plot_intervals

        paths["plot_looks"] = Path(out_dir) / "intervals_vs_seeds.png"
        plots.append(plot_intervals(verdict, paths["plot_looks"]))
    common: dict[str, Any] = {
        "title": title,
        "protocol": protocol,
        "wall_time_s": wall_time_s,
        "cpu_hours": cpu_hours,
        "gpu_hours": gpu_hours,
    }
    paths["markdown"].write_text(render_markdown(verdict, plots=[p.name for p in plots], **common))
    paths["html"].write_text(render_html(verdict, images=plots, **common))
    return paths
