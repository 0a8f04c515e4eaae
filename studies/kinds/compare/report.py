"""The compare study's report, through the shared kit (:mod:`studies.reporting`).

``verdict.json``, ``trials.csv``, ``report.md``, ``report.html`` and ``forest.png`` (the contrasts:
per-seed paired differences, mean and t-interval, the ±margin band): the study verdict first, then
the contrasts table, the per-arm table (arms in no contrast included, marked "table only"), the
tuned learning rates, the method, resources and the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from studies.reporting import (
    COLORS,
    Document,
    Section,
    begin_report,
    draw_contrast_row,
    finite,
    fmt,
    fmt_ci,
    legend_handles,
    render_html,
    render_markdown,
    resources_lines,
    save_figure,
    to_yaml,
)

__all__ = ["CONTRAST_COLORS", "plot_contrasts_forest", "write_compare_report"]

CONTRAST_COLORS: dict[str, str] = {v: COLORS[v] for v in ("better", "worse", "equivalent", "inconclusive")}
"""One colour per contrast verdict: the kit's palette, where no two labels share a colour."""

_BANNER = (
    "Exploratory — underpowered: at least one contrast has too few seeds to be decided at its Holm "
    "level (see its reasons); no claim either way."
)


def plot_contrasts_forest(verdict: Mapping[str, Any], path: str | Path) -> Path:
    """Forest plot of the contrasts: per-seed paired differences (small dots), the mean (dot) and its
    t-interval (bar), coloured by verdict; the zero line and the ±margin band."""
    contrasts = verdict.get("contrasts") or {}
    names = list(contrasts)
    margin = float(verdict.get("margin") or 0.0)
    fig = Figure(figsize=(9.0, 0.8 * max(len(names), 1) + 1.8))
    ax = fig.subplots()
    ypos = np.arange(len(names))[::-1].astype(float)
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    labels = []
    for y, name in zip(ypos, names):
        c = contrasts[name]
        labels.append(f"{name}\n{c['arm']} − {c['reference']}")
        color = CONTRAST_COLORS.get(str(c.get("verdict")), "black")
        note = f"{c.get('verdict')} (pred. {c.get('predicted')})\np(Holm) {fmt(c.get('p_value_holm'))}"
        draw_contrast_row(ax, trans, y, c, color, note)
        if not finite(c.get("estimate")):
            ax.text(0.02, y, "n/a (no paired seeds)", transform=trans, va="center", fontsize=8, color="gray")
    if margin > 0:
        ax.axvspan(-margin, margin, color=COLORS["stable"], alpha=0.12, lw=0)
    ax.axvline(0.0, color="black", lw=0.9, ls="--")
    ax.set_yticks(ypos)
    ax.set_yticklabels(labels, fontsize=8)
    if len(names):
        ax.set_ylim(ypos.min() - 0.6, ypos.max() + 0.6)
    conf = float(verdict.get("confidence", 0.95))
    ax.set_xlabel(
        f"paired difference of the final {verdict.get('metric')} (per-seed dots; mean and {conf:.0%} t-CI; "
        f"band ±margin {margin:g})"
    )
    ax.grid(axis="x", alpha=0.3)
    handles = legend_handles([str(c.get("verdict")) for c in contrasts.values()], lw=2.6)
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    ax.set_title("Paired contrasts over seeds (two-sided sign-flip p, Holm over the contrasts)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 0.84, 1))
    return save_figure(fig, Path(path))


def _contrast_rows(verdict: Mapping[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "contrast": name,
            "arm − reference": f"{c['arm']} − {c['reference']}",
            "seeds": fmt(c.get("n_seeds")),
            "estimate": fmt(c.get("estimate")),
            "CI": fmt_ci(c.get("ci")),
            "p": fmt(c.get("p_value")),
            "p (Holm)": fmt(c.get("p_value_holm")),
            "verdict": str(c.get("verdict")),
            "predicted": str(c.get("predicted")),
            "hypothesis": str(c.get("hypothesis")),
            "reasons": "; ".join(c.get("reasons") or []) or "–",
        }
        for name, c in (verdict.get("contrasts") or {}).items()
    ]


def _arm_rows(verdict: Mapping[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "arm": arm,
            "role": str(r.get("role")),
            "trials": fmt(r.get("n")),
            "failed": fmt(r.get("n_failed")),
            f"mean {verdict.get('metric')}": fmt(r.get("mean"), 4),
            "CI": fmt_ci(r.get("ci"), 4),
            "sd": fmt(r.get("sd")),
            "median train loss": fmt(r.get("median_train_loss")),
            "lr": fmt(r.get("tuned_lr") if r.get("tuned_lr") is not None else r.get("lr")),
            "gates": "; ".join(r.get("gates") or []) or "–",
        }
        for arm, r in (verdict.get("arms") or {}).items()
    ]


def _lr_rows(lr_record: Mapping[str, Any], metric: str) -> list[dict[str, str]]:
    return [
        {
            "arm": arm,
            "tuned lr": fmt(rec.get("lr")),
            f"mean {metric}": fmt(rec.get(metric)),
            "grid": f"{fmt(min(rec.get('grid') or [None]))} … {fmt(max(rec.get('grid') or [None]))}"
            if rec.get("grid")
            else "–",
            "extensions": fmt(rec.get("extensions")),
            "at range edge": "yes" if rec.get("at_range_edge") else "no",
            "trials (failed)": f"{fmt(rec.get('trials'))} ({fmt(rec.get('trials_failed'))})",
        }
        for arm, rec in lr_record.items()
    ]


def _document(
    verdict: Mapping[str, Any],
    *,
    title: str,
    protocol: Mapping[str, Any] | None,
    lr_record: Mapping[str, Any],
    tuning_metric: str,
    wall_time_s: float | None,
    cpu_hours: float | None,
    gpu_hours: float | None,
) -> Document:
    study = str(verdict["study_verdict"])
    contrasts = verdict.get("contrasts") or {}
    table_only = list(verdict.get("table_only_arms") or [])
    return Document(
        headline=f"Study verdict: {study}",
        title=title,
        verdict=study,
        prefix="Study verdict: ",
        parts=[(study, study)],
        banner=_BANNER if verdict.get("exploratory") else "",
        intro=[
            f"**Claim.** {verdict.get('hypothesis', '')}",
            f"Metric `{verdict.get('metric')}` (final value; higher is "
            f"{'better' if verdict.get('higher_is_better', True) else 'worse'}); "
            f"{len(contrasts)} contrasts in the Holm family at alpha {fmt(verdict.get('alpha'))}; "
            f"equivalence margin ±{fmt(verdict.get('margin'))}."
            + (f" Arms in no contrast (tables only): {', '.join(table_only)}." if table_only else ""),
        ],
        sections=[
            Section(
                "Contrasts",
                ["Paired difference arm − reference over the same seeds."],
                [_contrast_rows(verdict)],
                label_columns=("hypothesis",),
            ),
            Section("Arms", ["Failed trials scored at chance accuracy."], [_arm_rows(verdict)]),
            Section(
                "Tuned learning rates",
                [f"Selected on `{tuning_metric}` over the tuning seeds."],
                [_lr_rows(lr_record, tuning_metric)],
            ),
        ],
        method=[
            "each arm's learning rate tuned on held-out seeds (log grid, best mean validation metric, "
            "range extended while the winner sits on an edge); then every arm on the same fresh seeds, "
            "full budget, no early stopping",
            f"per contrast: mean paired difference, {float(verdict.get('confidence', 0.95)):.0%} t-interval "
            "over seeds, exact two-sided sign-flip p (Monte-Carlo beyond 20 seeds), Holm over the contrasts",
            "gates (→ inconclusive): lr-at-range-edge, failures (> 20 % of an arm's trials), "
            "optimisation-limited (median final train loss > 0.9 × ln C), underpowered (fewer than "
            f"{verdict.get('min_seeds')} paired seeds, or 2/2^K × family ≥ alpha)",
            "then: equivalent (CI inside ±margin), better / worse (Holm p ≤ alpha), else inconclusive; "
            "a contrast's hypothesis is supported when its verdict is the predicted one, refuted when the "
            "opposite; the study is refuted if any is refuted, supported if all are",
        ],
        resources=resources_lines(wall_time_s, cpu_hours, gpu_hours),
        protocol=to_yaml(dict(protocol)) if protocol else "",
    )


def write_compare_report(
    verdict: Mapping[str, Any],
    table: Any,
    out_dir: str | Path,
    *,
    title: str = "Compare study",
    protocol: Mapping[str, Any] | None = None,
    lr_record: Mapping[str, Any] | None = None,
    tuning_metric: str = "val_accuracy",
    wall_time_s: float | None = None,
    cpu_hours: float | None = None,
    gpu_hours: float | None = None,
) -> dict[str, Path]:
    """Write ``verdict.json`` (verbatim, NaN as null), ``trials.csv``, ``forest.png``, ``report.md``
    and ``report.html`` into ``out_dir``; returns name -> path (``verdict``, ``trials``,
    ``plot_forest``, ``markdown``, ``html``)."""
    paths = begin_report(out_dir, verdict, table, plot_forest="forest.png")
    plots = [plot_contrasts_forest(verdict, paths["plot_forest"])]
    doc = _document(
        verdict,
        title=title,
        protocol=protocol,
        lr_record=lr_record or {},
        tuning_metric=tuning_metric,
        wall_time_s=wall_time_s,
        cpu_hours=cpu_hours,
        gpu_hours=gpu_hours,
    )
    paths["markdown"].write_text(render_markdown(doc, [p.name for p in plots]), encoding="utf-8")
    paths["html"].write_text(render_html(doc, plots), encoding="utf-8")
    return paths
