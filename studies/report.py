"""Reports for hypothesis studies: ``verdict.json``, ``report.md``, ``report.html`` and PNG plots.

Every function here takes data and output paths and writes files; nothing logs to MLflow (the study
entry point does that with the parent run's id), nothing reads global state. Plots use matplotlib's
Agg canvas through ``matplotlib.figure.Figure`` (never pyplot), so they render on head-less cluster
nodes and from threads, and touch no global figure state.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory
from scipy import stats

from studies.analysis import DIVERGENCE_FIXES, normalize_table

__all__ = [
    "cell_summary",
    "cell_values",
    "plot_forest",
    "plot_gate_entropy",
    "plot_metric_vs_batch_size",
    "render_markdown",
    "verdict_table",
    "write_batchsize_report",
]

_VERDICT_COLORS = {"supported": "#c0392b", "refuted": "#2471a3", "inconclusive": "#7f8c8d"}
_GATE_KEY = re.compile(r"^gate_entropy[/._](?:layer[_.]?)?(?P<layer>[A-Za-z0-9_.]+)$")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
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


def verdict_table(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """Rows of the paper-style table: one per arm, control first, values formatted as text."""
    control = result["control"]
    arms = sorted(result["arms"], key=lambda a: (a != control, a))
    rows = []
    for arm in arms:
        r = result["arms"][arm]
        rows.append(
            {
                "arm": f"{arm} (control)" if arm == control else arm,
                "claim predicts": "control"
                if arm == control
                else ("worse with B" if arm in DIVERGENCE_FIXES else "no trend"),
                "n": str(r["n"]),
                "failed": str(r["n_failed"]),
                "spearman ρ": _fmt(r["spearman_rho"], 3),
                "slope / log2 B": _fmt(r["slope"]),
                "slope CI": _fmt_ci(r["slope_ci"]),
                "interaction": _fmt(r["interaction"]),
                "interaction CI": _fmt_ci(r["interaction_ci"]),
                "p": _fmt(r["p_value"]),
                "p (Holm)": _fmt(r["p_value_holm"]),
                "verdict": result["verdict"][arm],
            }
        )
    return rows


def cell_values(table: pd.DataFrame, *, metric: str, control: str | None = None) -> pd.DataFrame:
    """The per-trial values the plots and summaries use, over completed trials.

    Columns ``kind, arm, batch_size, seed, value``: ``kind="metric"`` rows are the metric itself;
    with ``control``, ``kind="difference"`` rows are the paired differences ``arm - control`` per
    (batch size, seed) cell where both completed (the control has none).
    """
    df = normalize_table(table, metric)
    ok = df[df["ok"]]
    cols = ["kind", "arm", "batch_size", "seed", "value"]
    frames = [ok.assign(kind="metric")[cols]]
    if control is not None:
        cell = ok.groupby(["arm", "batch_size", "seed"], as_index=False)["value"].mean()
        ctrl = cell[cell["arm"] == control].drop(columns="arm").rename(columns={"value": "ctrl"})
        paired = cell[cell["arm"] != control].merge(ctrl, on=["batch_size", "seed"], how="inner")
        frames.append(paired.assign(value=paired["value"] - paired["ctrl"], kind="difference")[cols])
    return pd.concat(frames, ignore_index=True)


def cell_summary(
    table: pd.DataFrame, *, metric: str, control: str | None = None, confidence: float = 0.95
) -> pd.DataFrame:
    """Mean and t-interval over seeds of the metric (``kind="metric"``) and of the paired difference
    to ``control`` (``kind="difference"``) per (arm, batch size), over completed trials.

    Columns: ``kind, arm, batch_size, n, mean, lo, hi`` (``lo``/``hi`` NaN when ``n < 2``).
    """
    values = cell_values(table, metric=metric, control=control)
    rows = []
    for (kind, arm, b), g in values.groupby(["kind", "arm", "batch_size"]):
        v = g["value"].to_numpy(dtype=float)
        mean = float(v.mean())
        if v.size >= 2:
            half = float(stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
            lo, hi = mean - half, mean + half
        else:
            lo = hi = math.nan
        rows.append(
            {"kind": kind, "arm": arm, "batch_size": b, "n": v.size, "mean": mean, "lo": lo, "hi": hi}
        )
    return pd.DataFrame(rows, columns=["kind", "arm", "batch_size", "n", "mean", "lo", "hi"])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _arm_colors(arms: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab10"]
    return {arm: cmap(i % 10) for i, arm in enumerate(arms)}


def plot_metric_vs_batch_size(
    table: pd.DataFrame,
    path: str | Path,
    *,
    metric: str,
    control: str | None = None,
    result: Mapping[str, Any] | None = None,
    confidence: float = 0.95,
) -> Path:
    """Metric vs batch size per arm (mean over seeds, t-interval band, log2 x-axis).

    With ``control``, a second panel shows the paired difference to the control per arm — the
    quantity whose slope is the interaction. With ``result``, the legend carries each arm's verdict.
    """
    summary = cell_summary(table, metric=metric, control=control, confidence=confidence)
    values = cell_values(table, metric=metric, control=control)
    arms = sorted(summary["arm"].unique(), key=lambda a: (a != control, a))
    colors = _arm_colors(arms)
    panels = ["metric", "difference"] if control is not None else ["metric"]
    fig = Figure(figsize=(6.2 * len(panels), 4.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, kind in zip(axes[0], panels):
        sub = summary[summary["kind"] == kind]
        for arm in arms:
            g = sub[sub["arm"] == arm].sort_values("batch_size")
            if g.empty:
                continue
            label = arm
            if result is not None and arm in result.get("verdict", {}):
                label = f"{arm} ({result['verdict'][arm]})"
            b = g["batch_size"].to_numpy(dtype=float)
            ax.plot(b, g["mean"], marker="o", ms=4, color=colors[arm], label=label)
            ax.fill_between(b, g["lo"], g["hi"], color=colors[arm], alpha=0.18, linewidth=0)
            pts = values[(values["kind"] == kind) & (values["arm"] == arm)]
            ax.scatter(pts["batch_size"], pts["value"], s=7, color=colors[arm], alpha=0.45, linewidths=0)
        # Limits from the trials themselves: with few seeds a t-band can be far wider than the data.
        kind_values = values.loc[values["kind"] == kind, "value"].to_numpy(dtype=float)
        if kind_values.size:
            lo_v, hi_v = float(kind_values.min()), float(kind_values.max())
            pad = 0.15 * (hi_v - lo_v) if hi_v > lo_v else 0.05 * max(1.0, abs(hi_v))
            ax.set_ylim(lo_v - pad, hi_v + pad)
        ax.set_xscale("log", base=2)
        ticks = sorted(summary["batch_size"].unique())
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(int(t)) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("batch size B (log2 scale)")
        ax.grid(alpha=0.3)
        if kind == "metric":
            ax.set_ylabel(metric)
            ax.set_title(f"{metric} vs batch size (mean, {confidence:.0%} CI over seeds, dots = trials)")
        else:
            ax.axhline(0.0, color="black", lw=0.8)
            ax.set_ylabel(f"{metric}(arm) − {metric}({control})")
            ax.set_title("paired difference to the control")
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def plot_forest(result: Mapping[str, Any], path: str | Path) -> Path:
    """Forest plot: each arm's slope and interaction vs log2 B with their bootstrap CIs, coloured by verdict."""
    control = result["control"]
    arms = sorted(result["arms"], key=lambda a: (a != control, a))
    fig = Figure(figsize=(11, 0.55 * len(arms) + 1.8))
    axes = fig.subplots(1, 2, sharey=True)
    ypos = np.arange(len(arms))[::-1]
    for ax, (key, title) in zip(
        axes, [("slope", "slope vs log2 B"), ("interaction", f"interaction (arm − {control}) vs log2 B")]
    ):
        for y, arm in zip(ypos, arms):
            r = result["arms"][arm]
            color = _VERDICT_COLORS.get(result["verdict"][arm], "black")
            est, ci = r.get(key), r.get(f"{key}_ci")
            if ci is not None:
                ax.plot(ci, [y, y], color=color, lw=2.2)
            if est is not None:
                ax.plot([est], [y], "o", color=color, ms=6)
            elif key == "interaction":
                trans = blended_transform_factory(ax.transAxes, ax.transData)
                ax.text(
                    0.02,
                    y,
                    "n/a (control)" if arm == control else "n/a",
                    transform=trans,
                    ha="left",
                    va="center",
                    fontsize=8,
                    color="gray",
                )
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"Δ {result['metric']} per doubling of B")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ypos)
    axes[0].set_yticklabels([f"{a} (control)" if a == control else a for a in arms])
    handles = [Line2D([], [], color=c, lw=2.2, label=v) for v, c in _VERDICT_COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"{result.get('confidence', 0.95):.0%} bootstrap CIs (seeds resampled)", fontsize=10)
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


def _md_table(rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return "_no arms_\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r[c].replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _md_warnings(result: Mapping[str, Any]) -> str:
    warns = result.get("warnings") or []
    if not warns:
        return ""
    return "\n**Warnings**\n\n" + "".join(f"- {w}\n" for w in warns)


def _resources_lines(
    wall_time_s: float | None, cpu_hours: float | None, gpu_hours: float | None
) -> list[str]:
    return [
        f"wall time: {_fmt(wall_time_s / 60.0 if wall_time_s is not None else None, 3)} min",
        f"CPU hours: {_fmt(cpu_hours, 3)}",
        f"GPU hours: {_fmt(gpu_hours, 3)}",
    ]


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
    """The Markdown report: hypothesis, verdict table, method, resources, protocol, plots."""
    direction = "decreases" if result.get("higher_is_better", True) else "increases"
    parts = [
        f"# {title}\n\n",
        f"**Hypothesis.** {result['hypothesis']}\n\n",
        f"Metric `{result['metric']}` (higher is {'better' if result.get('higher_is_better', True) else 'worse'});"
        f' control arm `{result["control"]}`. "Worse as B grows" means the metric {direction} with B, i.e. a '
        f"{result.get('direction', 'negative')} slope.\n\n",
        "## Results\n\n",
        _md_table(verdict_table(result)),
        _md_warnings(result),
        "\n## Method\n\n",
        f"- slope: OLS of {result['metric']} on log2 B over all completed trials of the arm; "
        f"{result.get('confidence', 0.95):.0%} percentile bootstrap CI, {result.get('n_boot')} resamples of seeds.\n"
        f"- interaction: OLS slope on log2 B of the paired differences arm − control per (B, seed) cell "
        f"where both completed; same bootstrap.\n"
        f"- p: one-sided permutation p-value of the interaction in the hypothesis direction, "
        f"{result.get('n_perm')} permutations of the batch-size labels within seeds; Holm-adjusted across arms.\n"
        f"- verdict: `supported` when the slope CI and the interaction CI both lie on the hypothesis side of 0; "
        f"`refuted` when the slope CI lies at or beyond 0 on the other side; else `inconclusive`.\n"
        f"- failed: trials not completed or with a non-finite metric, counted and excluded from the fits.\n",
        "\n## Resources\n\n",
        "".join(f"- {line}\n" for line in _resources_lines(wall_time_s, cpu_hours, gpu_hours)),
    ]
    if protocol:
        parts += [
            "\n## Protocol\n\n",
            "```yaml\n" + yaml.safe_dump(_json_safe(dict(protocol)), sort_keys=False) + "```\n",
        ]
    if plots:
        parts += ["\n## Plots\n\n", "".join(f"![{Path(p).stem}]({p})\n\n" for p in plots)]
    return "".join(parts)


def _render_html(
    result: Mapping[str, Any],
    *,
    title: str,
    protocol: Mapping[str, Any] | None,
    wall_time_s: float | None,
    cpu_hours: float | None,
    gpu_hours: float | None,
    plots: Sequence[str],
) -> str:
    rows = verdict_table(result)
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in (rows[0] if rows else []))
    body = ""
    for r in rows:
        cells = "".join(
            f'<td class="v-{esc(v)}">{esc(v)}</td>' if k == "verdict" else f"<td>{esc(v)}</td>"
            for k, v in r.items()
        )
        body += f"<tr>{cells}</tr>\n"
    resources = "".join(
        f"<li>{esc(line)}</li>" for line in _resources_lines(wall_time_s, cpu_hours, gpu_hours)
    )
    proto = ""
    if protocol:
        proto = (
            "<h2>Protocol</h2><pre>"
            + esc(yaml.safe_dump(_json_safe(dict(protocol)), sort_keys=False))
            + "</pre>"
        )
    warns = result.get("warnings") or []
    warn_html = (
        ("<p><b>Warnings</b></p><ul>" + "".join(f"<li>{esc(w)}</li>" for w in warns) + "</ul>")
        if warns
        else ""
    )
    imgs = "".join(f'<figure><img src="{esc(p)}" alt="{esc(Path(p).stem)}"></figure>' for p in plots)
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:first-child{text-align:left}.v-supported{color:#c0392b;font-weight:bold}"
        ".v-refuted{color:#2471a3;font-weight:bold}.v-inconclusive{color:#7f8c8d}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{style}</style></head>"
        f"<body><h1>{esc(title)}</h1><p><b>Hypothesis.</b> {esc(result['hypothesis'])}</p>"
        f"<p>Metric <code>{esc(str(result['metric']))}</code>, control <code>{esc(str(result['control']))}</code>, "
        f"hypothesis direction: {esc(str(result.get('direction', 'negative')))} slope vs log2 B; "
        f"{result.get('confidence', 0.95):.0%} bootstrap CIs over seeds ({result.get('n_boot')} resamples), "
        f"one-sided permutation p ({result.get('n_perm')} permutations within seeds), Holm across arms.</p>"
        f"<h2>Results</h2><table><tr>{head}</tr>\n{body}</table>{warn_html}"
        f"<h2>Resources</h2><ul>{resources}</ul>{proto}<h2>Plots</h2>{imgs}</body></html>\n"
    )


def write_batchsize_report(
    result: Mapping[str, Any],
    table: pd.DataFrame,
    out_dir: str | Path,
    *,
    title: str = "Batch-size correlation study",
    protocol: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
) -> dict[str, Path]:
    """Write ``verdict.json``, ``trials.csv``, ``report.md``, ``report.html`` and the plots into ``out_dir``.

    Args:
        result: the dictionary returned by :func:`studies.analysis.batchsize_trend`; written verbatim
            (NaN as null) to ``verdict.json``.
        table: the trial table the result was computed from (for the plots and ``trials.csv``).
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
    paths["verdict"].write_text(json.dumps(_json_safe(result), indent=2, allow_nan=False) + "\n")
    table.to_csv(paths["trials"], index=False)
    plot_metric_vs_batch_size(
        table,
        paths["plot_metric"],
        metric=str(result["metric"]),
        control=str(result["control"]),
        result=result,
        confidence=float(result.get("confidence", 0.95)),
    )
    plot_forest(result, paths["plot_forest"])
    plots = [paths["plot_metric"].name, paths["plot_forest"].name]
    common: dict[str, Any] = {
        "title": title,
        "protocol": protocol,
        "wall_time_s": wall_time_s,
        "cpu_hours": cpu_hours,
        "gpu_hours": gpu_hours,
        "plots": plots,
    }
    paths["markdown"].write_text(render_markdown(result, **common))
    paths["html"].write_text(_render_html(result, **common))
    return paths
