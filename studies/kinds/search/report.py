"""Report of the AutoNorm claims study: ``verdict.json``, ``confirm_trials.csv``, ``report.md``,
``report.html`` and three plots.

The claims, their tests and their verdicts come from :func:`studies.kinds.search.claims.autonorm_claims`; this
module only writes them down (see docs/science.md for the claims themselves). It follows the
conventions of :mod:`studies.kinds.batchsize.report`:

* the first line of ``report.md`` (and the first element of ``report.html``) is the one-line verdict
  summary, ``Claims: a supported, b refuted (not reproduced), ...``; an "Exploratory — underpowered"
  banner follows when any claim is inconclusive for lack of seeds;
* the HTML is rendered from a Jinja2 template with autoescaping on, and every image is embedded as a
  ``data:image/png;base64`` URI (MLflow's UI shows HTML artifacts in a sandboxed iframe, where
  relative image paths never resolve); ``report.md`` links the PNG files by their relative names;
* plots use matplotlib's Agg canvas through ``matplotlib.figure.Figure`` (never pyplot); supported is
  blue, refuted orange and inconclusive grey, and nothing is drawn in red.

Nothing here logs to MLflow or reads global state: the study entry point publishes the files.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats

from studies.kinds.search.claims import CLAIMS, COMPLETED_STATUSES, CONFIRM_COLUMNS
from studies.kinds.search.design import design_lines
from studies.kinds.search.gates import layer_count
from studies.kinds.search.spec import REPORTED_ARMS
from studies.reporting import (
    COLORS,
    Document,
    ForestPlot,
    Section,
    count,
    estimate_name,
    finite,
    fmt,
    fmt_ci,
    fmt_refinement,
    render_html,
    render_markdown,
    resources_lines,
    save_figure,
    to_yaml,
    with_study_cost,
    write_json,
)
from studies.scope import scope_line

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

#: Verdict colours (blue / orange / grey; never red: neither outcome is an alarm).
VERDICT_COLORS = {k: COLORS[k] for k in ("supported", "refuted", "inconclusive")}

#: The paired contrasts drawn in the forest plot: claim id → (arm a, arm b) of ``d = a − b``.
CONTRASTS: dict[str, tuple[str, str]] = {
    "a": ("random_selector", "autonorm"),
    "b": ("autonorm_s", "autonorm"),
    "e": ("autonorm_s", "frozen_ln"),
}

#: Claims the AutoNorm paper makes; a refuted one is reported as "not reproduced" (``e`` is ours).
PAPER_CLAIMS = frozenset({"a", "b", "c", "c_attn", "c_mlp", "d"})

#: Arms whose gates are plotted, in this order (where their gate logs hold the keys).
GATED_ARMS = ("autonorm", "autonorm_s")

_CLAIM_ORDER = ("a", "b", "c", "c_attn", "c_mlp", "d", "e")
_SUBLAYERS = (("pre-attention norms (layer 2b)", 0, "c_attn"), ("pre-MLP norms (layer 2b + 1)", 1, "c_mlp"))
_ARM_STYLES = {"autonorm": ("#1f5fa8", "-"), "autonorm_s": ("#d9822b", "--")}
_DEFAULT_EPS = 0.1  # autonorm_claims' default gate-entropy threshold of claim d


# --------------------------------------------------------------------------------------------------
# Small helpers


def _sort_key(value: Any) -> tuple[int, Any]:
    """Seeds / arms of mixed types in one order: numbers first (by value), then strings."""
    if finite(value):
        return (0, float(value))
    return (1, str(value))


def _plain(value: Any) -> Any:
    """A seed as stored in a table cell → a JSON-able Python value (integral floats → int)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _verdict_text(claim_id: str, verdict: str) -> str:
    if verdict == "refuted" and claim_id in PAPER_CLAIMS:
        return "refuted (not reproduced)"
    return verdict


def _ordered_ids(claims: Mapping[str, Any]) -> list[str]:
    return [c for c in _CLAIM_ORDER if c in claims] + sorted(c for c in claims if c not in _CLAIM_ORDER)


def claims_line(claims: Mapping[str, Mapping[str, Any]]) -> str:
    """The one-line summary: ``Claims: a inconclusive, b refuted (not reproduced), ..., e supported``."""
    if not claims:
        return "Claims: none evaluated"
    parts = [
        f"{c} {_verdict_text(c, str(claims[c].get('verdict', 'inconclusive')))}" for c in _ordered_ids(claims)
    ]
    return "Claims: " + ", ".join(parts)


def underpowered_claims(claims: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Ids of the claims with reason ``underpowered`` (too few seeds, or a design that cannot pass)."""
    return [c for c in _ordered_ids(claims) if "underpowered" in (claims[c].get("reasons") or [])]


def _banner(ids: Sequence[str]) -> str:
    return (
        "Exploratory — underpowered: claim(s) "
        + ", ".join(ids)
        + " had too few paired seeds, or a design whose smallest attainable p cannot pass the (Holm) "
        "threshold. Their verdicts are not confirmatory."
    )


def _t_band(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided t-interval over the finite values (NaN bounds below two values)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2.0, v.size - 1)) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return mean, mean - half, mean + half


# --------------------------------------------------------------------------------------------------
# Tables


def _frame(confirm_table: Any) -> pd.DataFrame:
    """The confirm table as a DataFrame with every :data:`CONFIRM_COLUMNS` column first (missing ones
    empty), extra columns after, rows sorted by arm and seed."""
    df = (
        confirm_table.copy() if isinstance(confirm_table, pd.DataFrame) else pd.DataFrame(dict(confirm_table))
    )
    for col in CONFIRM_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df = df[[*CONFIRM_COLUMNS, *(c for c in df.columns if c not in CONFIRM_COLUMNS)]]
    if len(df):
        order = sorted(range(len(df)), key=lambda i: (str(df["arm"].iloc[i]), _sort_key(df["seed"].iloc[i])))
        df = df.iloc[order].reset_index(drop=True)
    return df


def _ok(df: pd.DataFrame, metric: str = "test_accuracy") -> np.ndarray:
    status = df["status"].astype(str).str.lower().isin(COMPLETED_STATUSES).to_numpy()
    values = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)
    return np.asarray(status & np.isfinite(values))


def claims_table(claims: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row per claim: id, statement, verdict ("refuted (not reproduced)" for a refuted paper
    claim), estimate, CI, p, Holm p, n seeds, reasons."""
    rows = []
    for cid in _ordered_ids(claims):
        c = claims[cid]
        rows.append(
            {
                "id": cid,
                "claim": str(c.get("claim") or CLAIMS.get(cid, "")),
                "verdict": _verdict_text(cid, str(c.get("verdict", "inconclusive"))),
                # named: a difference (a, b, e), a slope (c), a median epoch (d)
                "estimate": f"{estimate_name('search', cid)} {fmt(c.get('estimate'))}"
                if c.get("estimate") is not None
                else "–",
                "CI": fmt_ci(c.get("ci")),
                "p": fmt(c.get("p_value")),
                "p (Holm)": fmt(c.get("p_value_holm")),
                "n seeds": fmt(c.get("n_seeds")),
                "reasons": "; ".join(str(r) for r in c.get("reasons") or []) or "–",
            }
        )
    return rows


def _mean_sd(values: np.ndarray) -> str:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return "–"
    if v.size == 1:
        return f"{v[0]:.4f}"
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}"


def _arm_table(df: pd.DataFrame) -> list[dict[str, str]]:
    """Per arm: trials, mean ± sd (completed trials) of test and val accuracy, failures, lr."""
    rows = []
    ok = _ok(df)
    for arm in sorted(df["arm"].astype(str).unique()):
        mask = (df["arm"].astype(str) == arm).to_numpy()
        sub = df[mask]
        good = ok[mask]
        failed = sub.loc[~good, "status"].astype(str)
        fail_text = str(int((~good).sum()))
        if len(failed):
            counts = failed.value_counts()
            fail_text += " (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
        lrs = sorted({float(v) for v in pd.to_numeric(sub["lr"], errors="coerce") if math.isfinite(v)})
        rows.append(
            {
                "arm": f"{arm} (reported only)" if arm in REPORTED_ARMS else arm,
                "n": str(len(sub)),
                "completed": str(int(good.sum())),
                "failed": fail_text,
                "test accuracy (mean ± sd)": _mean_sd(
                    pd.to_numeric(sub.loc[good, "test_accuracy"], errors="coerce").to_numpy(dtype=float)
                ),
                "val accuracy (mean ± sd)": _mean_sd(
                    pd.to_numeric(sub.loc[good, "val_accuracy"], errors="coerce").to_numpy(dtype=float)
                ),
                "lr": ", ".join(f"{lr:g}" for lr in lrs) or "–",
            }
        )
    return rows


def _tuned_table(tuned_lr: Mapping[Any, Any] | None) -> list[dict[str, str]]:
    """Per arm: the learning rate picked on the held-out seeds, whether it sits at the grid's edge,
    its refinement, the mean score per lr and, when nothing was picked, why."""
    rows = []
    for arm, rec in (tuned_lr or {}).items():
        if isinstance(rec, Mapping):
            scores = rec.get("scores") or {}
            ses = rec.get("score_se") or {}  # each rate's standard error over the tuning seeds, when recorded
            rows.append(
                {
                    "arm": str(arm),
                    "lr": fmt(rec.get("lr"), 4),
                    "at range edge": fmt(rec.get("at_range_edge")),
                    "refinement": fmt_refinement(rec.get("refine")),
                    "mean score per lr": ", ".join(
                        f"{k}: {fmt(v, 4)}" + (f" ± {fmt(se, 2)}" if (se := ses.get(k)) is not None else "")
                        for k, v in scores.items()
                    )
                    or "–",
                    "note": str(
                        rec.get("reason")
                        or (
                            f"lr-tuning-noisy: lead {fmt(rec.get('lead'), 3)} < 1 SE"
                            if rec.get("noisy")
                            else "–"
                        )
                    ),
                }
            )
        else:
            rows.append(
                {
                    "arm": str(arm),
                    "lr": fmt(rec, 4),
                    "at range edge": "–",
                    "refinement": "–",
                    "mean score per lr": "–",
                    "note": "–",
                }
            )
    return rows


# --------------------------------------------------------------------------------------------------
# Gate logs


def _gate_series(
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]], arm: str, name: str
) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
    """seed → (epochs, values of shape (n_epochs, n_layers)) of ``<name>/layer_<i>`` for one arm;
    seeds without that key are left out. Rows are put in epoch order (the row number when an epoch
    is missing)."""
    out: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    for key, rows in gate_logs.items():
        if not (isinstance(key, tuple) and len(key) == 2 and str(key[0]) == arm):
            continue
        n_layers = layer_count(rows, (name,))
        if n_layers == 0:
            continue
        epochs = [float(r["epoch"]) if finite(r.get("epoch")) else float(i + 1) for i, r in enumerate(rows)]
        order = sorted(range(len(rows)), key=lambda i: epochs[i])
        grid = np.full((len(rows), n_layers), math.nan)
        for out_i, i in enumerate(order):
            for j in range(n_layers):
                v = rows[i].get(f"{name}/layer_{j}")
                if finite(v):
                    grid[out_i, j] = float(v)
        out[_plain(key[1])] = (np.array([epochs[i] for i in order]), grid)
    return out


def _gated_arms(gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]], name: str) -> list[str]:
    return [arm for arm in GATED_ARMS if _gate_series(gate_logs, arm, name)]


def _sublayer_columns(n_layers: int, parity: int) -> list[int]:
    """Layers of one sub-layer type: block b's pre-attention norm is 2b, its pre-MLP norm 2b + 1; an
    odd last layer (a gated final norm) belongs to neither."""
    return list(range(parity, 2 * (n_layers // 2), 2))


def _claim_note(claims: Mapping[str, Mapping[str, Any]], cid: str) -> str:
    c = claims.get(cid)
    if not c or c.get("estimate") is None:
        return ""
    return f"\n{cid}: {c.get('verdict')}, slope {fmt(c.get('estimate'))} {fmt_ci(c.get('ci'))}"


# --------------------------------------------------------------------------------------------------
# Plots


def plot_claims_forest(claims: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path | None:
    """Forest plot of the paired contrasts a, b, e: estimate (dot), CI (bar) and the per-seed
    differences (small dots), coloured by verdict, with the zero line. ``None`` (nothing written)
    when none of them has an estimate."""
    ids = [c for c in CONTRASTS if c in claims]
    if not any(finite(claims[c].get("estimate")) for c in ids):
        return None
    pairs = {cid: claims[cid].get("arms") or CONTRASTS[cid] for cid in ids}
    plot = ForestPlot([f"{cid}: {a} − {b}" for cid, (a, b) in pairs.items()], width=8.5)
    for y, cid in zip(plot.ypos, ids):
        c = claims[cid]
        verdict = str(c.get("verdict", "inconclusive"))
        if not finite(c.get("estimate")):
            plot.note(y, f"n/a ({'; '.join(str(r) for r in c.get('reasons') or []) or 'no estimate'})")
            continue
        p = c.get("p_value_holm") if c.get("p_value_holm") is not None else c.get("p_value")
        plot.row(
            y, c, VERDICT_COLORS.get(verdict, "black"), f"{_verdict_text(cid, verdict)}\np(Holm) {fmt(p)}"
        )
    return plot.save(
        path,
        xlabel="paired difference of the final test metric (per-seed dots; mean and 95 % t-CI)",
        title="Paired contrasts over seeds (a, b one-sided greater; e two-sided)",
        verdicts=[str(claims[cid].get("verdict", "inconclusive")) for cid in ids],
        label_size=8.5,
        right=0.86,
    )


def plot_gate_entropy_by_sublayer(
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    eps: float = _DEFAULT_EPS,
    confidence: float = 0.95,
) -> Path | None:
    """Gate entropy per layer over epochs: mean over seeds with a t-interval band, one row of panels
    per gated arm (:data:`GATED_ARMS`, where logged) and one column per sub-layer type (pre-attention
    norms = even layers, pre-MLP norms = odd layers), colour = block depth; the dotted line is claim
    d's threshold ``eps``. ``None`` (nothing written) when no gated arm logged a gate entropy."""
    arms = _gated_arms(gate_logs, "gate_entropy")
    if not arms:
        return None
    fig = Figure(figsize=(11, 3.6 * len(arms) + 0.4))
    axes = fig.subplots(len(arms), 2, squeeze=False, sharey=True)
    cmap = matplotlib.colormaps["viridis"]
    top = math.log(2)
    for row, arm in enumerate(arms):
        series = _gate_series(gate_logs, arm, "gate_entropy")
        n_layers = max(grid.shape[1] for _, grid in series.values())
        n_blocks = n_layers // 2
        for ax, (title, parity, _) in zip(axes[row], _SUBLAYERS):
            for layer in _sublayer_columns(n_layers, parity):
                by_epoch: dict[float, list[float]] = {}
                for epochs, grid in series.values():
                    if layer < grid.shape[1]:
                        for e, v in zip(epochs, grid[:, layer]):
                            by_epoch.setdefault(float(e), []).append(float(v))
                xs = sorted(by_epoch)
                bands = [_t_band(np.array(by_epoch[x]), confidence) for x in xs]
                mean = np.array([b[0] for b in bands])
                lo = np.clip(np.array([b[1] for b in bands]), 0.0, None)
                hi = np.array([b[2] for b in bands])
                finite = mean[np.isfinite(mean)]
                if finite.size:
                    top = max(
                        top, float(finite.max()), float(np.nanmax(hi)) if np.isfinite(hi).any() else 0.0
                    )
                block = layer // 2
                color = cmap(block / max(1, n_blocks - 1))
                ax.plot(xs, mean, color=color, lw=1.4, marker="o", ms=3, label=f"block {block}")
                ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
            ax.axhline(eps, color="gray", lw=0.9, ls=":", label=f"ε = {eps:g}")
            ax.set_title(f"{arm}: {title}, n = {count(len(series), 'seed')}", fontsize=9)
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if n_blocks <= 12:
                ax.legend(fontsize=6.5, ncol=2, loc="upper right")
        axes[row, 0].set_ylabel("gate entropy H (nats)")
    for ax in axes.flat:
        ax.set_ylim(-0.02, top * 1.08)
    fig.suptitle(f"Gate entropy per layer: mean over seeds, {confidence:.0%} t-CI band", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return save_figure(fig, Path(path))


def plot_dyt_weight_vs_depth(
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    claims: Mapping[str, Mapping[str, Any]] | None = None,
    confidence: float = 0.95,
) -> Path | None:
    """Final-epoch DyT weight vs block index, mean over seeds with a t-interval band, one panel per
    sub-layer type and one line per gated arm (seeds as faint dots); the panel title carries claim c's
    sub-claim (slope, CI, verdict) when it was tested. ``None`` (nothing written) when no gated arm
    logged a DyT weight."""
    arms = _gated_arms(gate_logs, "dyt_weight")
    if not arms:
        return None
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2, sharey=True)
    max_blocks = 1
    for ax, (title, parity, cid) in zip(axes, _SUBLAYERS):
        for arm in arms:
            color, ls = _ARM_STYLES.get(arm, ("#555555", "-"))
            by_block: dict[int, list[float]] = {}
            for _, grid in _gate_series(gate_logs, arm, "dyt_weight").values():
                if grid.shape[0] == 0:
                    continue
                final = grid[-1]
                for layer in _sublayer_columns(final.size, parity):
                    if math.isfinite(final[layer]):
                        by_block.setdefault(layer // 2, []).append(float(final[layer]))
            if not by_block:
                continue
            blocks = sorted(by_block)
            max_blocks = max(max_blocks, blocks[-1] + 1)
            bands = [_t_band(np.array(by_block[b]), confidence) for b in blocks]
            lo = np.clip([b[1] for b in bands], 0.0, 1.0)
            hi = np.clip([b[2] for b in bands], 0.0, 1.0)
            ax.plot(blocks, [b[0] for b in bands], color=color, ls=ls, marker="o", ms=4, lw=1.6, label=arm)
            ax.fill_between(blocks, lo, hi, color=color, alpha=0.15, linewidth=0)
            for b in blocks:
                ax.scatter(
                    np.full(len(by_block[b]), b), by_block[b], s=8, color=color, alpha=0.35, linewidths=0
                )
        ax.axhline(0.5, color="gray", lw=0.8, ls=":")
        ax.set_title(title + _claim_note(claims or {}, cid), fontsize=9)
        ax.set_xlabel("block index (0 = first)")
        ax.set_xticks(range(max_blocks))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="best")
    axes[0].set_ylabel("final DyT weight (LN weight = 1 − it)")
    axes[0].set_ylim(-0.03, 1.03)
    fig.suptitle(f"Final DyT weight vs depth: mean over seeds, {confidence:.0%} t-CI band", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return save_figure(fig, Path(path))


def _try_plot(name: str, draw: Callable[[], Path | None], errors: list[str]) -> Path | None:
    """A plot that fails must not fail a finished study: the report says it was skipped, and why."""
    try:
        return draw()
    except Exception as exc:  # matplotlib / malformed logs: report, do not raise
        msg = f"{name} skipped: {type(exc).__name__}: {exc}"
        print(msg, file=sys.stderr)
        errors.append(msg)
        return None


# --------------------------------------------------------------------------------------------------
# Markdown and HTML


def _method_lines(data_kind: str) -> list[str]:
    applies = "a, b, d, e" if data_kind == "vision" else "b, c, e"
    return [
        f"data: {data_kind}; the claims tested on it are {applies}, the others are inconclusive as not "
        "applicable (docs/science.md).",
        "a, b, e: per-seed paired differences of the final test metric over the confirmatory seeds; "
        "estimate = their mean, CI = t-interval (K − 1 df), p = exact sign-flip p (Monte-Carlo above 20 "
        "seeds); Holm over the contrasts tested on this data.",
        "c: per-seed OLS slope of the final DyT weight vs block index for each sub-layer type (c_attn, "
        "c_mlp), one-sided sign-flip p; c is supported only when both are.",
        "d: per seed, the median over layers of the first epoch with gate entropy < ε and LN weight > 0.5; "
        "sign test against the early epoch, order-statistic CI of the median.",
        "failed trials are scored at chance when a chance level is known (else excluded, and said so); "
        "too many failures, too few seeds or a design that cannot reach significance give inconclusive.",
        "supported iff the (Holm) p < α and the CI lies in the claimed direction; refuted iff the CI lies "
        "entirely on the other side; a refuted paper claim is reported as not reproduced.",
    ]


def _document(
    claims: Mapping[str, Mapping[str, Any]],
    df: pd.DataFrame,
    *,
    title: str,
    protocol: Any,
    data_kind: str,
    best_config: Any,
    tuned_lr: Mapping[Any, Any] | None,
    wall_time_s: float | None,
    cpu_hours: float | None,
    gpu_hours: float | None,
    plot_errors: Sequence[str],
    trials: int | None = None,
    study_verdict: str,
    scope: str = "",
    design: Sequence[str] = (),
    adequacy: Mapping[str, Any] | None = None,
) -> Document:
    from studies.adequacy import report_section

    weak = underpowered_claims(claims)
    tuned_text = (
        []
        if tuned_lr
        else ["No per-arm tuning: every arm ran at the learning rate of the best searched configuration."]
    )
    return Document(
        headline=claims_line(claims),
        title=title,
        scope=scope,
        verdict=study_verdict,
        prefix="Claims: ",
        parts=[
            (
                str(claims[cid].get("verdict", "inconclusive")),
                f"{cid} {_verdict_text(cid, str(claims[cid].get('verdict')))}",
            )
            for cid in _ordered_ids(claims)
        ],
        banner=_banner(weak) if weak else "",
        intro=[f"Data kind: `{data_kind}`.", *design],
        sections=[
            Section("Claims", tables=[claims_table(claims)]),
            Section(
                "Per-arm summary",
                [
                    "Accuracies over completed trials; failed trials are counted by status. An arm marked "
                    "(reported only) is in no claim's contrast."
                ],
                [_arm_table(df)],
            ),
            Section("Tuned learning rates", tuned_text, [_tuned_table(tuned_lr)]),
            *([Section("Training adequacy", *report_section(adequacy))] if adequacy is not None else []),
            Section(
                "Best searched configuration",
                code=to_yaml(best_config) if best_config else "",
                empty="None (no completed search trial).",
            ),
        ],
        method=_method_lines(data_kind),
        resources=resources_lines(wall_time_s, cpu_hours, gpu_hours, trials=trials),
        protocol=to_yaml(protocol) if protocol else "",
        plot_errors=list(plot_errors),
    )


# --------------------------------------------------------------------------------------------------
# Entry point


def write_claims_report(
    claims: Mapping[str, Mapping[str, Any]],
    confirm_table: Any,
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]],
    out_dir: str | Path,
    *,
    title: str,
    protocol: Mapping[str, Any] | None,
    data_kind: str,
    best_config: Mapping[str, Any] | None = None,
    tuned_lr: Mapping[Any, Any] | None = None,
    wall_time_s: float = math.nan,
    cpu_hours: float = math.nan,
    gpu_hours: float = math.nan,
    shared: Mapping[str, Any] | None = None,
    sequential: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write the claims study's report into ``out_dir`` (created when missing).

    Files: ``verdict.json`` (``{"claims", "data_kind", "study_verdict_line", "arms", "seeds",
    "best_config", "tuned_lr"}``, NaN/inf as null), ``confirm_trials.csv`` (the confirm table, the
    :data:`studies.kinds.search.claims.CONFIRM_COLUMNS` first, rows sorted by arm and seed), ``report.md`` and
    ``report.html`` (first line: :func:`claims_line`; then the underpowered banner when any claim has
    that reason, the claims, per-arm and tuned-lr tables, the best searched configuration, method,
    resources, protocol and plots), and the plots ``claims_forest.png``, ``gate_entropy.png`` and
    ``dyt_weight_vs_depth.png``.

    Args:
        claims: what :func:`studies.kinds.search.claims.autonorm_claims` returned; written verbatim (JSON-safe).
        confirm_table: one row per confirmatory trial (DataFrame or mapping of columns).
        gate_logs: ``(arm, seed) → per-epoch result rows`` with ``gate_entropy/layer_<i>`` and
            ``dyt_weight/layer_<i>`` (layer 2b = block b's pre-attention norm, 2b + 1 its pre-MLP norm).
        out_dir: output directory.
        title: report heading.
        protocol: the resolved study spec (or its relevant part), shown as YAML.
        data_kind: ``"vision"`` or ``"text"``, as given to ``autonorm_claims``.
        best_config: the best searched configuration (the confirm arms' starting point).
        tuned_lr: arm → the lr-tuning record (``{"lr", "at_range_edge", "scores", "reason"}``) or lr.
        wall_time_s / cpu_hours / gpu_hours: resources spent (NaN: unknown, shown as "–").
        shared: the fields every kind's ``verdict.json`` has (``kind``, ``study_verdict``,
            ``hypotheses``), written first.
        sequential: a sequential design's ``looks``, ``seeds_used``, ``max_seeds``, ``trials_saved``
            (:func:`studies.sequential.sequential_fields`): added to ``verdict.json``, and each
            claim's interval against the seeds drawn as ``intervals_vs_seeds.png``.

    Returns:
        name → path for ``verdict``, ``confirm_trials``, ``markdown``, ``html`` and, when there was
        something to draw, ``plot_forest``, ``plot_gate_entropy``, ``plot_dyt_depth``. A plot left out
        is also removed from ``out_dir`` (no stale figure from an earlier run); a plot that fails to
        draw is reported on stderr and in the report instead of failing the study.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = _frame(confirm_table)
    paths: dict[str, Path] = {
        "verdict": out / "verdict.json",
        "confirm_trials": out / "confirm_trials.csv",
        "markdown": out / "report.md",
        "html": out / "report.html",
    }
    eps_value = (claims.get("d") or {}).get("eps")
    eps = float(eps_value) if finite(eps_value) else _DEFAULT_EPS
    errors: list[str] = []
    drawers: list[tuple[str, Path, Callable[[Path], Path | None]]] = [
        ("plot_forest", out / "claims_forest.png", lambda p: plot_claims_forest(claims, p)),
        (
            "plot_gate_entropy",
            out / "gate_entropy.png",
            lambda p: plot_gate_entropy_by_sublayer(gate_logs, p, eps=eps),
        ),
        (
            "plot_dyt_depth",
            out / "dyt_weight_vs_depth.png",
            lambda p: plot_dyt_weight_vs_depth(gate_logs, p, claims=claims),
        ),
    ]
    if sequential and sequential.get("looks"):
        from studies.sequential import plot_intervals

        drawers.append(
            ("plot_looks", out / "intervals_vs_seeds.png", lambda p: plot_intervals(sequential, p))
        )
    plots: list[Path] = []
    for key, target, draw in drawers:
        target.unlink(missing_ok=True)
        drawn = _try_plot(target.name, functools.partial(draw, target), errors)
        if drawn is not None:
            paths[key] = drawn
            plots.append(drawn)
        else:
            target.unlink(missing_ok=True)  # a half-written figure of a failed plot

    from studies.adequacy import study_line

    untestable = study_line((shared or {}).get("adequacy"))
    line = claims_line(claims) + (f"; {untestable}" if untestable else "")
    verdict = {
        **dict(shared or {}),
        "claims": claims,
        "data_kind": data_kind,
        "study_verdict_line": line,
        "arms": sorted({str(a) for a in df["arm"]}),
        "seeds": sorted(
            {_plain(s) for s in df["seed"] if s is not None and not (isinstance(s, float) and math.isnan(s))},
            key=_sort_key,
        ),
        "best_config": best_config,
        "tuned_lr": tuned_lr,
        **dict(sequential or {}),
        # What the study cost, so a regenerated report shows the run's wall time; inside a study run
        # (or ``report``) the run's own numbers, as every kind writes them (``trials`` among them).
        "resources": {"wall_time_s": wall_time_s, "cpu_hours": cpu_hours, "gpu_hours": gpu_hours},
    }
    with_study_cost(verdict)
    cost = verdict["resources"]
    wall_time_s, cpu_hours, gpu_hours = (cost.get(k) for k in ("wall_time_s", "cpu_hours", "gpu_hours"))
    write_json(paths["verdict"], verdict)
    df.to_csv(paths["confirm_trials"], index=False)
    doc = _document(
        claims,
        df,
        title=title,
        protocol=protocol,
        data_kind=data_kind,
        best_config=best_config,
        tuned_lr=tuned_lr,
        wall_time_s=wall_time_s,
        cpu_hours=cpu_hours,
        gpu_hours=gpu_hours,
        trials=cost.get("trials"),
        plot_errors=errors,
        study_verdict=str((shared or {}).get("study_verdict", "none")),
        scope=scope_line((shared or {}).get("scope")),
        design=design_lines(shared or {}),
        adequacy=shared if shared and "adequacy" in shared else None,
    )
    paths["markdown"].write_text(render_markdown(doc, plots), encoding="utf-8")
    paths["html"].write_text(render_html(doc, plots), encoding="utf-8")
    return paths
