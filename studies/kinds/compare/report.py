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

from studies import reporting
from studies.adequacy import report_section

__all__ = ["CONTRAST_COLORS", "plot_contrasts_forest", "write_compare_report"]

CONTRAST_COLORS: dict[str, str] = {
    v: reporting.COLORS[v] for v in ("better", "worse", "equivalent", "inconclusive")
}
"""One colour per contrast verdict: the kit's palette, where no two labels share a colour."""

_BANNER = (
    "Exploratory — underpowered: at least one contrast has too few seeds to be decided at its Holm "
    "level (see its reasons); no claim either way."
)


def plot_contrasts_forest(verdict: Mapping[str, Any], path: str | Path) -> Path:
    """Forest plot of the contrasts: per-seed paired differences (small dots), the mean (dot) and its
    t-interval (bar), coloured by verdict; the zero line and the ±margin band."""
    contrasts = verdict.get("contrasts") or {}
    margin = float(verdict.get("margin") or 0.0)
    plot = reporting.ForestPlot(
        [f"{name}\n{c['arm']} − {c['reference']}" for name, c in contrasts.items()], width=9.0
    )
    for y, c in zip(plot.ypos, contrasts.values()):
        color = CONTRAST_COLORS.get(str(c.get("verdict")), "black")
        p_holm = reporting.fmt(c.get("p_value_holm"))
        plot.row(y, c, color, f"{c.get('verdict')} (pred. {c.get('predicted')})\np(Holm) {p_holm}")
        if not reporting.finite(c.get("estimate")):
            plot.note(y, "n/a (no paired seeds)")
    if margin > 0:
        plot.ax.axvspan(-margin, margin, color=reporting.COLORS["stable"], alpha=0.12, lw=0)
    conf = float(verdict.get("confidence", 0.95))
    return plot.save(
        path,
        xlabel=f"paired difference of the final {verdict.get('metric')} (per-seed dots; mean and {conf:.0%} "
        f"t-CI; band ±margin {margin:g})",
        title="Paired contrasts over seeds (two-sided sign-flip p, Holm over the contrasts)",
        verdicts=[str(c.get("verdict")) for c in contrasts.values()],
    )


def _contrast_rows(verdict: Mapping[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "contrast": name,
            "arm − reference": f"{c['arm']} − {c['reference']}",
            "seeds": reporting.fmt(c.get("n_seeds")),
            "difference": reporting.fmt(c.get("estimate")),
            "CI": reporting.fmt_ci(c.get("ci")),
            "p": reporting.fmt(c.get("p_value")),
            "p (Holm)": reporting.fmt(c.get("p_value_holm")),
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
            "trials": reporting.fmt(r.get("n")),
            "failed": reporting.fmt(r.get("n_failed")),
            f"mean {verdict.get('metric')}": reporting.fmt(r.get("mean"), 4),
            "CI": reporting.fmt_ci(r.get("ci"), 4),
            "sd": reporting.fmt(r.get("sd")),
            "median train loss": reporting.fmt(r.get("median_train_loss")),
            "lr": reporting.fmt(r.get("tuned_lr") if r.get("tuned_lr") is not None else r.get("lr")),
            "gates": "; ".join(r.get("gates") or []) or "–",
        }
        for arm, r in (verdict.get("arms") or {}).items()
    ]


def _lr_rows(lr_record: Mapping[str, Any], metric: str) -> list[dict[str, str]]:
    return [
        {
            "arm": arm,
            "tuned lr": reporting.fmt(rec.get("lr")),
            f"mean {metric}": reporting.fmt(rec.get(metric)),
            "grid": f"{reporting.fmt(min(rec.get('grid') or [None]))} … {reporting.fmt(max(rec.get('grid') or [None]))}"
            if rec.get("grid")
            else "–",
            "extensions": reporting.fmt(rec.get("extensions")),
            "refinement": reporting.fmt_refinement(rec.get("refine")),
            "at range edge": "yes" if rec.get("at_range_edge") else "no",
            "trials (failed)": f"{reporting.fmt(rec.get('trials'))} ({reporting.fmt(rec.get('trials_failed'))})",
        }
        for arm, rec in lr_record.items()
    ]


def _document(
    verdict: Mapping[str, Any],
    *,
    title: str,
    lr_record: Mapping[str, Any],
    tuning_metric: str,
    **shared: Any,
) -> reporting.Document:
    """``shared``: :func:`studies.reporting.study_document`'s ``protocol`` and ``spent``."""
    study = str(verdict["study_verdict"])
    contrasts = verdict.get("contrasts") or {}
    table_only = list(verdict.get("table_only_arms") or [])
    return reporting.study_document(
        verdict,
        banner=_BANNER,
        headline=f"Study verdict: {study}",
        title=title,
        prefix="Study verdict: ",
        parts=[(study, study)],
        intro=[
            f"**Claim.** {verdict.get('hypothesis', '')}",
            f"Metric `{verdict.get('metric')}` (final value; higher is "
            f"{'better' if verdict.get('higher_is_better', True) else 'worse'}); "
            f"{len(contrasts)} contrasts in the Holm family at alpha {reporting.fmt(verdict.get('alpha'))}; "
            f"equivalence margin ±{reporting.fmt(verdict.get('margin'))}."
            + (f" Arms in no contrast (tables only): {', '.join(table_only)}." if table_only else ""),
        ],
        sections=[
            reporting.Section(
                "Contrasts",
                ["Paired difference arm − reference over the same seeds."],
                [_contrast_rows(verdict)],
                label_columns=("hypothesis",),
            ),
            reporting.Section("Arms", ["Failed trials scored at chance accuracy."], [_arm_rows(verdict)]),
            reporting.Section(
                "Tuned learning rates",
                [f"Selected on `{tuning_metric}` over the tuning seeds."],
                [_lr_rows(lr_record, tuning_metric)],
            ),
            reporting.Section("Training adequacy", *report_section(verdict)),
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
        **shared,
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
    paths = reporting.begin_report(out_dir, verdict, table, plot_forest="forest.png")
    plots = [plot_contrasts_forest(verdict, paths["plot_forest"])]
    doc = _document(
        verdict,
        title=title,
        protocol=protocol,
        lr_record=lr_record or {},
        tuning_metric=tuning_metric,
        spent=(wall_time_s, cpu_hours, gpu_hours),
    )
    paths["markdown"].write_text(reporting.render_markdown(doc, [p.name for p in plots]), encoding="utf-8")
    paths["html"].write_text(reporting.render_html(doc, plots), encoding="utf-8")
    return paths
