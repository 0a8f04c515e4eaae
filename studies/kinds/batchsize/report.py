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

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import matplotlib
import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory
from scipy import stats

from studies.kinds.batchsize.analysis import normalize_table

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

#: Verdict and control-label colours (blue / orange / grey; never red for "supported").
VERDICT_COLORS = {
    "supported": "#1f5fa8",
    "refuted": "#d9822b",
    "inconclusive": "#8a8f94",
    "stable": "#2a9d8f",
    "declines": "#d9822b",
    "unclear": "#8a8f94",
}
_GATE_KEY = re.compile(r"^gate_entropy[/._](?:layer[_.]?)?(?P<layer>[A-Za-z0-9_.]+)$")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _fmt_ci(ci: Sequence[float] | None, digits: int = 3) -> str:
    if ci is None:
        return "–"
    return f"[{_fmt(float(ci[0]), digits)}, {_fmt(float(ci[1]), digits)}]"


def _json_safe(obj: Any) -> Any:
    """Replace NaN/inf by None and numpy scalars by Python ones, so ``json.dump`` writes valid JSON."""
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --------------------------------------------------------------------------------------------------
# Tables (rows of text, shared by Markdown and HTML)


def _ordered_arms(result: Mapping[str, Any]) -> list[str]:
    control = result["control"]
    controls = list(result.get("control_arms") or [control])
    rest = sorted(a for a in result["arms"] if a not in controls)
    return [a for a in controls if a in result["arms"]] + rest


def _outcome(r: Mapping[str, Any]) -> str:
    return str(r.get("verdict") or r.get("label") or "–")


def verdict_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per arm of a single-budget result: controls first, then the fix arms.

    Columns: arm, role, verdict (a fix arm's verdict or a control's label), reasons, slope,
    slope CI, interaction, interaction CI, p, p (Holm), spearman ρ, n, failed.
    """
    control = result["control"]
    rows = []
    for arm in _ordered_arms(result):
        r = result["arms"][arm]
        rows.append(
            {
                "arm": f"{arm} (control)" if arm == control else arm,
                "role": str(r.get("role", "control" if arm == control else "fix")),
                "verdict": _outcome(r),
                "reasons": "; ".join(r.get("reasons") or []) or "–",
                "slope / log2 B": _fmt(r.get("slope")),
                "slope CI": _fmt_ci(r.get("slope_ci")),
                "interaction": _fmt(r.get("interaction")),
                "interaction CI": _fmt_ci(r.get("interaction_ci")),
                "p": _fmt(r.get("p_value")),
                "p (Holm)": _fmt(r.get("p_value_holm")),
                "spearman ρ": _fmt(r.get("spearman_rho")),
                "n": _fmt(r.get("n")),
                "failed": _fmt(r.get("n_failed")),
            }
        )
    return rows


def control_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """The control labels of a single-budget result: label, slope with CI, the −δ threshold, reasons."""
    delta = float(result.get("delta", 0.005))
    sign = 1.0 if result.get("higher_is_better", True) else -1.0
    rows = []
    for arm, label in result["controls"].items():
        r = result["arms"][arm]
        rows.append(
            {
                "control": arm,
                "label": str(label),
                "slope / log2 B": _fmt(r.get("slope")),
                "slope CI": _fmt_ci(r.get("slope_ci")),
                "threshold": f"{_fmt(-sign * delta)} per doubling",
                "reasons": "; ".join(r.get("reasons") or []) or "–",
            }
        )
    return rows


def sensitivity_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """The sensitivity analysis of a single-budget result (failed trials dropped, not scored at chance)."""
    rows = []
    for arm in _ordered_arms(result):
        r = result["arms"][arm]
        s = r.get("sensitivity") or {}
        rows.append(
            {
                "arm": arm,
                "verdict (failures dropped)": _outcome(s),
                "verdict (primary)": _outcome(r),
                "n": _fmt(s.get("n")),
                "slope / log2 B": _fmt(s.get("slope")),
                "slope CI": _fmt_ci(s.get("slope_ci")),
                "interaction": _fmt(s.get("interaction")),
                "interaction CI": _fmt_ci(s.get("interaction_ci")),
                "p (Holm)": _fmt(s.get("p_value_holm")),
                "reasons": "; ".join(s.get("reasons") or []) or "–",
            }
        )
    return rows


def cell_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """Failed trials / trials and median final train loss per (arm, batch size) cell."""
    rows = []
    for arm in _ordered_arms(result):
        r = result["arms"][arm]
        fails = r.get("failures_by_cell") or {}
        ns = r.get("n_by_cell") or {}
        losses = r.get("median_train_loss_by_cell") or {}
        row = {"arm": arm}
        for cell in fails:
            row[f"B={cell}"] = f"{fails[cell]}/{ns.get(cell, '?')} · {_fmt(losses.get(cell))}"
        rows.append(row)
    return rows


def budget_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """For a result with budgets: one row per arm with the combined and the per-budget outcomes."""
    names = list(result["budgets"] or {})
    rows = []
    for arm in _ordered_arms(result):
        r = result["arms"][arm]
        row = {
            "arm": arm,
            "role": str(r.get("role", "")),
            "combined": _outcome(r),
            "reasons": "; ".join(r.get("reasons") or []) or "–",
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
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


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
            if ci is not None:
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
    handles = [Line2D([], [], color=c, lw=2.2, label=v) for v, c in VERDICT_COLORS.items() if v != "unclear"]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"{result.get('confidence', 0.95):.0%} CIs over seeds (dotted: −δ)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def plot_gate_entropy(
    history_by_trial: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *, max_trials: int = 12
) -> Path:
    """Gate entropy per layer over epochs, one panel per trial (AutoNorm search study).

    Args:
        history_by_trial: trial name -> its per-epoch results (``ray.tune.report`` dicts or MLflow
            metric rows). Per-layer keys look like ``gate_entropy/<layer>``, ``gate_entropy_<layer>``
            or ``gate_entropy.layer_<i>``; ``gate_entropy_mean`` (or a bare ``gate_entropy``) is drawn
            as the mean. The x axis is ``epoch`` when present, else the row number (1-based).
        path: the PNG to write.
        max_trials: panels beyond this are left out (the first ones in the mapping's order are kept).

    Raises:
        ValueError: no trial has any gate-entropy key.
    """
    trials = [(name, list(rows)) for name, rows in history_by_trial.items()][:max_trials]
    series: list[tuple[str, dict[str, tuple[list[float], list[float]]]]] = []
    for name, rows in trials:
        per: dict[str, tuple[list[float], list[float]]] = {}
        for i, row in enumerate(rows):
            epoch: Any = row.get("epoch")
            x = float(epoch) if _finite(epoch) else float(i + 1)
            for key, value in row.items():
                if key in ("gate_entropy_mean", "gate_entropy"):
                    label = "mean"
                else:
                    m = _GATE_KEY.match(key)
                    if m is None or m.group("layer") == "mean":
                        label = "mean" if m is not None else ""
                    else:
                        label = m.group("layer")
                if not label or not _finite(value):
                    continue  # Tune's data frames hold NaN for epochs that did not report a key
                xs, ys = per.setdefault(label, ([], []))
                xs.append(x)
                ys.append(float(value))
        if per:
            series.append((name, per))
    if not series:
        raise ValueError(
            "no gate-entropy metrics found (keys like 'gate_entropy/<layer>' or 'gate_entropy_mean')"
        )
    ncols = min(3, len(series))
    nrows = math.ceil(len(series) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    for ax, (name, per) in zip(axes.flat, series):
        layers = sorted((k for k in per if k != "mean"), key=lambda s: (len(s), s))
        cmap = matplotlib.colormaps["viridis"]
        for j, layer in enumerate(layers):
            xs, ys = per[layer]
            ax.plot(xs, ys, color=cmap(j / max(1, len(layers) - 1)), lw=1.2, label=f"layer {layer}")
        if "mean" in per:
            xs, ys = per["mean"]
            ax.plot(xs, ys, color="black", lw=2.0, ls="--", label="mean")
        ax.axhline(math.log(2), color="gray", lw=0.8, ls=":")
        ax.set_ylim(-0.02, max(math.log(2), *(max(v[1]) for v in per.values())) * 1.05)
        ax.set_title(str(name), fontsize=9)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(layers) <= 12:
            ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("gate entropy H (nats; ln 2 dotted)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


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
        "p: one-sided (predicted direction), the larger of the within-seed permutation p of the batch-size "
        f"labels (exact when ≤ 100,000 permutations, else {result.get('n_perm')} draws) and the t-test p "
        "over seeds; Holm over the fix arms only.",
        f"failed trials are scored at chance ({_fmt(result.get('chance_metric'))}; train loss "
        f"{_fmt(result.get('chance_loss'))}); the sensitivity table drops them instead.",
        "gates (→ inconclusive): > 20 % failures in a cell (failures), median final train loss > 0.9 × "
        "chance loss in a cell (optimisation-limited), tuned lr at its range edge (lr-at-range-edge), "
        f"fewer than {result.get('min_seeds')} complete seeds, fewer than 4 batch sizes or a smallest "
        "attainable p × family ≥ α (underpowered).",
        f"verdict: supported iff Holm p < α = {_fmt(result.get('alpha'))} and the slope and interaction "
        "CIs both lie in the predicted direction of 0; refuted iff either lies entirely on the other "
        f"side; controls: declines / stable / unclear against −δ, δ = {_fmt(result.get('delta'))}.",
    ]


def _resources_lines(
    wall_time_s: float | None, cpu_hours: float | None, gpu_hours: float | None
) -> list[str]:
    return [
        f"wall time: {_fmt(wall_time_s / 60.0 if wall_time_s is not None else None, 3)} min",
        f"CPU hours: {_fmt(cpu_hours, 3)}",
        f"GPU hours: {_fmt(gpu_hours, 3)}",
    ]


def _sections(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report body as sections of paragraphs and tables, shared by Markdown and HTML."""
    sections: list[dict[str, Any]] = []
    singles = _single_results(result)
    if result.get("budgets"):
        sections.append(
            {
                "heading": "Verdicts across budgets",
                "text": [
                    "A fix arm is supported only when it is supported under every budget; supported under "
                    "some budgets only is reported as budget-dependent (inconclusive)."
                ],
                "tables": [("", budget_table(result))],
            }
        )
    for budget, single in singles:
        prefix = f"Budget {budget}: " if budget is not None else ""
        text = [_headline(single)] if budget is not None else []
        sections.append(
            {
                "heading": f"{prefix}per-arm results",
                "text": text,
                "tables": [("", verdict_table(single))],
            }
        )
        sections.append(
            {"heading": f"{prefix}control labels", "text": [], "tables": [("", control_table(single))]}
        )
        sens = single.get("sensitivity") or {}
        sections.append(
            {
                "heading": f"{prefix}sensitivity (failed trials dropped)",
                "text": [f"Study verdict with failures dropped: {sens.get('study_verdict', '–')}."],
                "tables": [("", sensitivity_table(single))],
            }
        )
        sections.append(
            {
                "heading": f"{prefix}failures and median train loss per cell",
                "text": ["failed/trials · median final train loss (failures at chance loss)."],
                "tables": [("", cell_table(single))],
            }
        )
    return sections


def _md_table(rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return "_none_\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_markdown(
    result: Mapping[str, Any],
    *,
    title: str = "Batch-size correlation study",
    protocol: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
    plots: Sequence[str] = (),
) -> str:
    """The Markdown report. Its first line is the study verdict; then the exploratory banner (when
    any arm is underpowered), the hypothesis, per-arm, control, sensitivity and cell tables (per
    budget when there are budgets), method, resources, protocol and plots."""
    hib = result.get("higher_is_better", True)
    parts = [f"**{_headline(result)}**\n\n"]
    if result.get("exploratory"):
        parts.append(f"> **{_BANNER}**\n\n")
    parts += [
        f"# {title}\n\n",
        f"**Hypothesis.** {result.get('hypothesis', '')}\n\n",
        f"Metric `{result['metric']}` (higher is {'better' if hib else 'worse'}); control arm "
        f'`{result["control"]}`. "Worse as B grows" means a {result.get("direction", "negative")} slope '
        "vs log2 B.\n\n",
    ]
    for sec in _sections(result):
        parts.append(f"## {sec['heading']}\n\n")
        parts += [f"{t}\n\n" for t in sec["text"]]
        parts += [_md_table(rows) + "\n" for _, rows in sec["tables"]]
    parts.append("## Method\n\n" + "".join(f"- {line}\n" for line in _method_lines(result)))
    parts.append(
        "\n## Resources\n\n"
        + "".join(f"- {line}\n" for line in _resources_lines(wall_time_s, cpu_hours, gpu_hours))
    )
    if protocol:
        parts.append(
            "\n## Protocol\n\n```yaml\n"
            + yaml.safe_dump(_json_safe(dict(protocol)), sort_keys=False, allow_unicode=True)
            + "```\n"
        )
    if plots:
        parts.append("\n## Plots\n\n" + "".join(f"![{Path(p).stem}]({Path(p).name})\n\n" for p in plots))
    return "".join(parts)


_HTML_TEMPLATE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{ headline }} — {{ title }}</title><style>
body{font-family:sans-serif;max-width:1250px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
.study{font-size:1.3em;font-weight:bold;padding:.5em;border-left:6px solid {{ colors[study] }}}
.banner{background:#fff4d6;border:1px solid #d9a400;padding:.6em;font-weight:bold}
{% for name, color in colors.items() %}.v-{{ name }}{color:{{ color }};font-weight:bold}
{% endfor %}img{max-width:100%}pre{background:#f6f6f6;padding:.6em}
</style></head><body>
<p class="study" id="study-verdict">{{ headline }}</p>
{% if exploratory %}<p class="banner" id="exploratory">{{ banner }}</p>
{% endif %}<h1>{{ title }}</h1>
<p><b>Hypothesis.</b> {{ hypothesis }}</p>
<p>Metric <code>{{ metric }}</code> (higher is {{ "better" if higher_is_better else "worse" }}), control
<code>{{ control }}</code>; "worse as B grows" is a {{ direction }} slope vs log2 B.</p>
{% for sec in sections %}<h2>{{ sec.heading }}</h2>
{% for t in sec.text %}<p>{{ t }}</p>
{% endfor %}{% for caption, rows in sec.tables %}{% if rows %}<table>
<tr>{% for col in rows[0] %}<th>{{ col }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for col, val in row.items() %}{% if col.startswith("verdict") or col in ("label", "combined") or col in budget_names %}<td class="v-{{ val }}">{{ val }}</td>{% else %}<td>{{ val }}</td>{% endif %}{% endfor %}</tr>
{% endfor %}</table>
{% endif %}{% endfor %}{% endfor %}<h2>Method</h2><ul>
{% for line in method %}<li>{{ line }}</li>
{% endfor %}</ul>
<h2>Resources</h2><ul>
{% for line in resources %}<li>{{ line }}</li>
{% endfor %}</ul>
{% if protocol %}<h2>Protocol</h2><pre>{{ protocol }}</pre>
{% endif %}{% if images %}<h2>Plots</h2>
{% for name, uri in images %}<figure><img src="{{ uri }}" alt="{{ name }}"><figcaption>{{ name }}</figcaption></figure>
{% endfor %}{% endif %}</body></html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render_html(
    result: Mapping[str, Any],
    *,
    title: str = "Batch-size correlation study",
    protocol: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
    images: Sequence[str | Path] = (),
) -> str:
    """The HTML report from a Jinja2 template (autoescaped). The study verdict is the first element of
    the body; ``images`` (PNG files) are embedded as ``data:image/png;base64`` URIs."""
    proto = (
        yaml.safe_dump(_json_safe(dict(protocol)), sort_keys=False, allow_unicode=True) if protocol else ""
    )
    return _ENV.from_string(_HTML_TEMPLATE).render(
        headline=_headline(result),
        study=result["study_verdict"],
        colors=VERDICT_COLORS,
        exploratory=bool(result.get("exploratory")),
        banner=_BANNER,
        title=title,
        hypothesis=result.get("hypothesis", ""),
        metric=result["metric"],
        higher_is_better=result.get("higher_is_better", True),
        control=result["control"],
        direction=result.get("direction", "negative"),
        sections=_sections(result),
        budget_names=list(result.get("budgets") or {}),
        method=_method_lines(result),
        resources=_resources_lines(wall_time_s, cpu_hours, gpu_hours),
        protocol=proto,
        images=[(Path(p).stem, _data_uri(Path(p))) for p in images],
    )


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
        ``plot_forest``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "verdict": out / "verdict.json",
        "trials": out / "trials.csv",
        "markdown": out / "report.md",
        "html": out / "report.html",
        "plot_metric": out / "metric_vs_batch_size.png",
        "plot_forest": out / "forest.png",
    }
    paths["verdict"].write_text(json.dumps(_json_safe(verdict), indent=2, allow_nan=False) + "\n")
    table.to_csv(paths["trials"], index=False)
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
