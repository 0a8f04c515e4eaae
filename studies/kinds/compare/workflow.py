"""``kind: compare``: arms x fresh seeds, each arm's η tuned on held-out seeds, paired contrasts.

Phases (:mod:`studies.kinds.compare.kind`), each in its own folder with its own phase run nested
under the study's MLflow run:

1. ``tune``: every arm's η on a log-spaced grid on the tuning seeds (:func:`studies.tuning.tune`:
   best mean validation metric, failed trials score the worst value); a winner on the grid's edge
   extends the grid in the optional phases ``tune-ext<k>``.
2. ``confirm``: arms x seeds with the tuned η, FIFO, full budget, the same seeds for every arm.
3. Analysis: :func:`studies.kinds.compare.analysis.compare_arms`, then ``verdict.json``, the report
   (forest plot, per-arm table, tuned rates, protocol), ``trials.csv`` and ``lr_tuning.json`` in
   ``<storage_path>/<name>/``, logged on the study run with ``verdict/<contrast>`` and
   ``verdict/study`` tags.

Rerunning after a crash resumes: finished phases restore from their Tune state, finished trials are
not repeated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.analysis_inputs import chance_levels
from studies.kinds.compare.spec import CompareStudySpec
from studies.kinds.outcome import finite_metrics, hypothesis_entry, verdict_tags
from studies.kinds.pipeline import Analysed, Rates, TunedDesign
from studies.kinds.records import arm_of, trial_row
from studies.tuning import noisy_reasons
from workers.plan import StudyPlan
from workers.records import TrialRecord

__all__ = ["DESIGN", "CompareDesign", "analyse", "chance_scores", "trials_table"]

TABLE_FILE = "trials.csv"


def trials_table(trials: Sequence[TrialRecord], *, metric: str, lr_record: Mapping[str, Any]) -> Any:
    """One row per confirmatory trial: ``arm, seed, status, <metric>, train_loss, lr, lr_at_edge,
    epochs_done, time_total_s, trial_id, mlflow_run_id`` (sorted by arm, then seed)."""
    import pandas as pd

    rows = []
    for t in trials:
        arm = arm_of(t)
        cell = {"arm": arm, "seed": int(t.config.get("seed", 0))}
        tuned = {
            "lr": float(t.config["training"]["lr"]),
            "lr_at_edge": bool(lr_record.get(arm, {}).get("at_range_edge", False)),
        }
        rows.append(trial_row(t, metric, cell, tuned))
    if not rows:
        return pd.DataFrame(columns=["arm", "seed", "status", metric, "train_loss", "lr", "lr_at_edge"])
    return pd.DataFrame(rows).sort_values(["arm", "seed"], kind="stable").reset_index(drop=True)


def chance_scores(spec: CompareStudySpec) -> tuple[float | None, float | None]:
    """The failed trial's score (chance accuracy 1/C, for an accuracy metric) and ln C."""
    levels = chance_levels(spec)
    if levels is None:
        return None, None
    accuracy = spec.analysis.metric.endswith("accuracy") and spec.analysis.higher_is_better
    return (levels[0] if accuracy else None), levels[1]


def analyse(table: Any, spec: CompareStudySpec, **inputs: Any) -> dict[str, Any]:
    """:func:`studies.kinds.compare.analysis.compare_arms` with the spec's settings and the shared
    fields ``kind``, ``study_verdict`` and ``hypotheses`` (one per contrast: the hypothesis's
    verdict, the reasons, the paired estimate and CI, p and Holm p, and the ``arms`` it rests on).
    ``inputs``: ``lr_tuning`` (the tuning record per arm, shown in the report), ``adequacy`` (the
    training-adequacy check per budget, :func:`studies.adequacy.measure`; absent: not measured), which
    becomes ``verdict.json["adequacy"]`` and gates the contrasts."""
    from studies import adequacy
    from studies.kinds.compare.analysis import compare_arms

    failed_value, chance_loss = chance_scores(spec)
    checks = adequacy.adequacy_record(spec, inputs.get("adequacy"))
    settings = {**spec.analysis.model_dump(), "adequacy": checks}  # the measurement, not the settings
    result = compare_arms(  # the analysis section's fields are compare_arms' own arguments
        table,
        contrasts={n: c.model_dump() for n, c in spec.contrast_specs.items()},
        failed_value=failed_value,
        chance_loss=chance_loss,
        **settings,
    )
    lr_record = inputs.get("lr_tuning") or {}
    for arm, res in result["arms"].items():
        rec = lr_record.get(arm) or {}
        res["tuned_lr"] = rec.get("lr")
        res["lr_extensions"] = rec.get("extensions")
    contrasts = result["contrasts"]
    noisy = {arm for arm, rec in lr_record.items() if (rec or {}).get("noisy")}  # informational only
    for res in contrasts.values():
        res["reasons"] = [*res["reasons"], *noisy_reasons((res["arm"], res["reference"]), noisy)]
    hypotheses = {
        name: {**hypothesis_entry(res), "verdict": res["hypothesis"], "arms": list(res["arms"])}
        for name, res in contrasts.items()
    }
    return {
        "kind": spec.kind,
        "study_verdict": result["study_verdict"],
        "hypotheses": hypotheses,
        "hypothesis": spec.hypothesis,
        "table_only_arms": list(spec.table_only_arms),
        **result,
        "adequacy": checks,
        "adequacy_rule": adequacy.rule(spec),
    }


class CompareDesign(TunedDesign):
    """The compare kind's hooks (:class:`studies.kinds.pipeline.TunedDesign`): one unnamed budget,
    ``tune`` then ``confirm``; an arm the tuning gave no η stops the study before ``confirm``."""

    TAG = "compare"
    ANALYSIS_LINE = "analysis: paired contrasts, verdicts, report"
    REPORT_READS_RUN = False  # its report has never read the run's trials.csv / wall time back

    analyse = staticmethod(analyse)

    def check_tuned(self, spec: CompareStudySpec, lr: Rates) -> None:
        missing = [a for a in spec.arm_names if a not in lr]
        if missing:  # no trial of these arms came back: nothing to confirm them with
            raise RuntimeError(f"lr tuning gave no learning rate for {missing}; see the tune phase's trials")

    def confirm_table(
        self, spec: CompareStudySpec, trials: Sequence[TrialRecord], budget: str, record: Mapping[str, Any]
    ) -> Any:
        return trials_table(trials, metric=spec.analysis.metric, lr_record=record)

    def analysis_inputs(self, records: Mapping[str, Any]) -> dict[str, Any]:
        return {"lr_tuning": records[""]}

    def write_outputs(self, done: Analysed, out_dir: Path) -> dict[str, Path]:
        """The report, ``verdict.json`` and ``trials.csv`` in ``out_dir``."""
        from studies.kinds.compare.report import write_compare_report

        spec = done.spec
        lr_record = done.records[""]
        protocol = spec.to_document()
        protocol["lr_refine"] = {arm: rec.get("refine") for arm, rec in lr_record.items()}
        protocol["tuned_lr"] = {arm: rec["lr"] for arm, rec in lr_record.items()}
        return write_compare_report(
            done.verdict,
            done.table,
            out_dir,
            title=f"Compare study: {spec.name}",
            protocol=protocol,
            lr_record=lr_record,
            tuning_metric=spec.lr_tuning.metric,
            **done.resources,
        )

    def verdict_tags(self, verdict: Mapping[str, Any]) -> dict[str, str]:
        contrasts = verdict.get("contrasts", {})
        labels = {n: c["verdict"] for n, c in contrasts.items()}
        return verdict_tags(verdict, {"verdict": labels}, {n: c.get("reasons") for n, c in contrasts.items()})

    def verdict_metrics(self, verdict: Mapping[str, Any]) -> dict[str, float]:
        out = finite_metrics(
            (f"{key}/{name}", c.get(key))
            for name, c in verdict.get("contrasts", {}).items()
            for key in ("estimate", "p_value", "p_value_holm", "n_seeds")
        )
        return {
            **out,
            **finite_metrics((f"mean/{arm}", r.get("mean")) for arm, r in verdict.get("arms", {}).items()),
        }

    def outcome_summary(
        self, verdict: Mapping[str, Any], records: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Any]:
        """The run's summary: the verdict per contrast and the tuned η per arm."""
        verdicts = {"contrasts": {n: c["verdict"] for n, c in verdict["contrasts"].items()}}
        return verdicts, {arm: rec["lr"] for arm, rec in records[""].items()}

    def design_size(self, spec: CompareStudySpec) -> str:
        return f"{len(spec.arm_names)} arms x {len(spec.seeds)} seeds"

    def design_note(self, spec: CompareStudySpec) -> str:
        return f"; contrasts: {', '.join(spec.contrast_specs)}"

    def tuning_line(self, spec: CompareStudySpec, budget: str, plan: StudyPlan) -> str:
        return (
            f"phase {plan.name}: {len(plan.grid[0][1])} (arm, lr) cells x {len(spec.lr_tuning.seeds)} seeds"
        )

    def confirm_line(self, spec: CompareStudySpec, budget: str, plan: StudyPlan) -> str:
        return f"phase {plan.name}: {len(spec.arm_names)} arms x {len(spec.seeds)} seeds (FIFO, full budget)"

    def verdict_lines(self, spec: CompareStudySpec, verdict: Mapping[str, Any]) -> list[str]:
        """The printed verdict: the study's, then each contrast's estimate, CI, Holm p and label."""
        from studies.reporting import fmt, fmt_ci

        reasons = verdict.get("study_reasons") or []
        untestable = next((r for r in reasons if str(r).startswith("not testable")), None)
        return [
            f"STUDY VERDICT: {verdict['study_verdict']}" + (f" ({untestable})" if untestable else ""),
            *(
                f"  {name:<24} {c['arm']} − {c['reference']}: {fmt(c['estimate'])} {fmt_ci(c['ci'])} "
                f"p_holm={fmt(c['p_value_holm'])} -> {c['verdict']} (predicted {c['predicted']}: {c['hypothesis']})"
                + (f" ({'; '.join(c['reasons'])})" if c["reasons"] else "")
                for name, c in verdict["contrasts"].items()
            ),
        ]

    def status_fields(self, spec: CompareStudySpec, verdict: Mapping[str, Any] | None) -> dict[str, Any]:
        contrasts = verdict.get("contrasts") or {} if verdict else None
        return {
            "contrasts": {n: c.get("verdict") for n, c in contrasts.items()}
            if contrasts is not None
            else None
        }

    def status_row_fields(self, spec: CompareStudySpec, phase: str, trial: TrialRecord) -> dict[str, Any]:
        return {spec.analysis.metric: trial.metrics.get(spec.analysis.metric)}


DESIGN = CompareDesign()
"""The hooks :meth:`studies.kinds.pipeline.TunedDesignKind.design` returns."""
