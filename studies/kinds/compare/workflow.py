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

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds import kit as base
from studies.kinds.compare.spec import CompareStudySpec
from studies.tuning import RunPoints, tuned_rates
from workers.plan import StudyPlan
from workers.records import TrialRecord

__all__ = ["analyse", "pilot", "select_learning_rates", "trials_table"]

TABLE_FILE = "trials.csv"
# The tuned-design pipeline's hooks (studies.kinds.pipeline.TunedDesign): this module is the kind's
# design, of one unnamed budget "".
TAG = "compare"
ANALYSIS_LINE = "analysis: paired contrasts, verdicts, report"
REPORT_READS_RUN = False  # its report has never read the run's trials.csv / wall time back


def select_learning_rates(
    spec: CompareStudySpec, trials: Sequence[TrialRecord], *, run_points: RunPoints | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """The tuned η per arm from the tuning trials (:func:`studies.tuning.tune`), extending edge
    winners through ``run_points`` (``None``: no extension); the table and a record per arm."""
    return tuned_rates(
        spec.arm_names, trials, cell_of=base.arm_of, tuning=spec.lr_tuning, run_points=run_points
    )


def trials_table(trials: Sequence[TrialRecord], *, metric: str, lr_record: Mapping[str, Any]) -> Any:
    """One row per confirmatory trial: ``arm, seed, status, <metric>, train_loss, lr, lr_at_edge,
    epochs_done, time_total_s, trial_id, mlflow_run_id`` (sorted by arm, then seed)."""
    import pandas as pd

    rows = []
    for t in trials:
        arm = base.arm_of(t)
        rows.append(
            {
                "arm": arm,
                "seed": int(t.config.get("seed", 0)),
                "status": t.status,
                metric: base.metric_value(t, metric),
                "train_loss": base.metric_value(t, "train_loss"),
                "lr": float(t.config["training"]["lr"]),
                "lr_at_edge": bool(lr_record.get(arm, {}).get("at_range_edge", False)),
                "epochs_done": t.metrics.get("epoch"),
                "time_total_s": float(t.metrics.get("time_total_s") or 0.0),
                "trial_id": t.trial_id,
                "mlflow_run_id": t.mlflow_run_id,
            }
        )
    if not rows:
        return pd.DataFrame(columns=["arm", "seed", "status", metric, "train_loss", "lr", "lr_at_edge"])
    return pd.DataFrame(rows).sort_values(["arm", "seed"], kind="stable").reset_index(drop=True)


def _chance(spec: CompareStudySpec) -> tuple[float | None, float | None]:
    """The failed trial's score (chance accuracy 1/C, for an accuracy metric) and ln C."""
    levels = base.chance_levels(spec)
    if levels is None:
        return None, None
    accuracy = spec.analysis.metric.endswith("accuracy") and spec.analysis.higher_is_better
    return (levels[0] if accuracy else None), levels[1]


def analyse(table: Any, spec: CompareStudySpec, **inputs: Any) -> dict[str, Any]:
    """:func:`studies.kinds.compare.analysis.compare_arms` with the spec's settings and the shared
    fields ``kind``, ``study_verdict`` and ``hypotheses`` (one per contrast: the hypothesis's
    verdict, the reasons, the paired estimate and CI, p and Holm p). ``inputs``: ``lr_tuning`` (the
    tuning record per arm, shown in the report)."""
    from studies.kinds.compare.analysis import compare_arms

    failed_value, chance_loss = _chance(spec)
    result = compare_arms(  # the analysis section's fields are compare_arms' own arguments
        table,
        contrasts={n: c.model_dump() for n, c in spec.contrast_specs.items()},
        failed_value=failed_value,
        chance_loss=chance_loss,
        **spec.analysis.model_dump(),
    )
    lr_record = inputs.get("lr_tuning") or {}
    for arm, res in result["arms"].items():
        rec = lr_record.get(arm) or {}
        res["tuned_lr"] = rec.get("lr")
        res["lr_extensions"] = rec.get("extensions")
    contrasts = result["contrasts"]
    hypotheses = {
        name: {**base.hypothesis_entry(res), "verdict": res["hypothesis"]} for name, res in contrasts.items()
    }
    return {
        "kind": spec.kind,
        "study_verdict": result["study_verdict"],
        "hypotheses": hypotheses,
        "hypothesis": spec.hypothesis,
        "table_only_arms": list(spec.table_only_arms),
        **result,
    }


def verdict_tags(verdict: Mapping[str, Any]) -> dict[str, str]:
    tags = {f"verdict/{name}": str(c["verdict"]) for name, c in verdict.get("contrasts", {}).items()}
    tags["verdict/study"] = str(verdict.get("study_verdict", "inconclusive"))
    for name, c in verdict.get("contrasts", {}).items():
        if c.get("reasons"):
            tags[f"reasons/{name}"] = "; ".join(str(r) for r in c["reasons"])[:5000]
    return tags


def verdict_metrics(verdict: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for name, c in verdict.get("contrasts", {}).items():
        for key in ("estimate", "p_value", "p_value_holm", "n_seeds"):
            v = c.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                out[f"{key}/{name}"] = float(v)
    for arm, r in verdict.get("arms", {}).items():
        v = r.get("mean")
        if isinstance(v, int | float) and math.isfinite(v):
            out[f"mean/{arm}"] = float(v)
    return out


def write_outputs(
    spec: CompareStudySpec,
    verdict: dict[str, Any],
    table: Any,
    out_dir: Path,
    records: Mapping[str, Any],
    spent: tuple[float, float, float],
) -> dict[str, Path]:
    """The report, ``verdict.json`` and ``trials.csv`` in ``out_dir`` (``lr_tuning.json`` is the
    pipeline's); ``spent`` is (wall s, CPU h, GPU h)."""
    from studies.kinds.compare.report import write_compare_report

    lr_record = records[""]
    protocol = spec.to_document()
    protocol["tuned_lr"] = {arm: rec["lr"] for arm, rec in lr_record.items()}
    return write_compare_report(
        verdict,
        table,
        out_dir,
        title=f"Compare study: {spec.name}",
        protocol=protocol,
        lr_record=lr_record,
        tuning_metric=spec.lr_tuning.metric,
        wall_time_s=spent[0],
        cpu_hours=spent[1],
        gpu_hours=spent[2],
    )


# ---- the pipeline's hooks (studies.kinds.pipeline.TunedDesign) ---------------------------------


def budgets(spec: CompareStudySpec) -> Sequence[str]:
    return ("",)


def tune_name(spec: CompareStudySpec, budget: str) -> str:
    return "tune"


def look_name(spec: CompareStudySpec, budget: str, look: int) -> str:
    return "confirm"


def tuning_plan(spec: CompareStudySpec, budget: str, environ: Mapping[str, str] | None) -> StudyPlan:
    return spec.tuning_plan(environ=environ)


def extension_plan(
    spec: CompareStudySpec,
    budget: str,
    round_: int,
    lrs: Mapping[str, float],
    environ: Mapping[str, str] | None,
) -> StudyPlan:
    """Range-extension round ``k`` as its own tuning phase ``tune-ext<k>``."""
    return spec.extension_plan(round_, lrs, environ=environ)


def confirm_plan(
    spec: CompareStudySpec, budget: str, lr: Mapping[str, float], look: int, environ: Mapping[str, str] | None
) -> StudyPlan:
    return spec.confirmatory_plan(lr, environ=environ)


def check_tuned(spec: CompareStudySpec, lr: Mapping[str, float]) -> None:
    missing = [a for a in spec.arm_names if a not in lr]
    if missing:  # no trial of these arms came back: nothing to confirm them with
        raise RuntimeError(f"lr tuning gave no learning rate for {missing}; see the tune phase's trials")


def confirm_table(
    spec: CompareStudySpec, trials: Sequence[TrialRecord], budget: str, record: Mapping[str, Any]
) -> Any:
    return trials_table(trials, metric=spec.analysis.metric, lr_record=record)


def after_confirm(spec: CompareStudySpec, runner: Any, phase: str, table: Any) -> None:
    """No per-arm summary runs."""


def analysis_inputs(records: Mapping[str, Any]) -> dict[str, Any]:
    return {"lr_tuning": records[""]}


def outcome_summary(verdict: Mapping[str, Any], records: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """The run's summary: the verdict per contrast and the tuned η per arm."""
    verdicts = {"contrasts": {n: c["verdict"] for n, c in verdict["contrasts"].items()}}
    return verdicts, {arm: rec["lr"] for arm, rec in records[""].items()}


def opening_line(spec: CompareStudySpec) -> str:
    return (
        f"study {spec.name!r}: {len(spec.arm_names)} arms x {len(spec.seeds)} seeds = "
        f"{spec.confirmatory_trials} confirmatory + {spec.tuning_trials} lr-tuning trials "
        f"({spec.total_trials} total); contrasts: {', '.join(spec.contrast_specs)}"
    )


def tuning_line(spec: CompareStudySpec, budget: str, plan: StudyPlan) -> str:
    return f"phase {plan.name}: {len(plan.grid[0][1])} (arm, lr) cells x {len(spec.lr_tuning.seeds)} seeds"


def extension_line(budget: str, round_: int, lrs: Mapping[str, float]) -> str:
    return f"  range extension {round_}: " + ", ".join(f"{k} lr={v:g}" for k, v in lrs.items())


def confirm_line(spec: CompareStudySpec, budget: str, plan: StudyPlan) -> str:
    return f"phase {plan.name}: {len(spec.arm_names)} arms x {len(spec.seeds)} seeds (FIFO, full budget)"


def verdict_lines(spec: CompareStudySpec, verdict: Mapping[str, Any]) -> list[str]:
    """The printed verdict: the study's, then each contrast's estimate, CI, Holm p and label."""
    from studies.reporting import fmt, fmt_ci

    return [
        f"STUDY VERDICT: {verdict['study_verdict']}",
        *(
            f"  {name:<24} {c['arm']} − {c['reference']}: {fmt(c['estimate'])} {fmt_ci(c['ci'])} "
            f"p_holm={fmt(c['p_value_holm'])} -> {c['verdict']} (predicted {c['predicted']}: {c['hypothesis']})"
            + (f" ({'; '.join(c['reasons'])})" if c["reasons"] else "")
            for name, c in verdict["contrasts"].items()
        ),
    ]


def closing_lines(spent: tuple[float, float, float]) -> list[str]:
    return []


def status_fields(spec: CompareStudySpec, verdict: Mapping[str, Any] | None) -> dict[str, Any]:
    contrasts = verdict.get("contrasts") or {} if verdict else None
    return {
        "contrasts": {n: c.get("verdict") for n, c in contrasts.items()} if contrasts is not None else None
    }


def status_row_fields(spec: CompareStudySpec, phase: str, trial: TrialRecord) -> dict[str, Any]:
    return {spec.analysis.metric: trial.metrics.get(spec.analysis.metric)}


def pilot(
    spec: CompareStudySpec, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
) -> dict[str, Any]:
    """``plan --pilot``: per contrast, the per-seed paired differences in ``<study_dir>/trials.csv``
    (failed trials scored as in the analysis) and the seeds :func:`studies.pilot.per_seed_need`
    asks for over the family (two-sided, Holm over the spec's contrasts).

    Raises:
        ValueError: no ``trials.csv`` or a column missing.
    """
    import numpy as np
    import pandas as pd

    from studies.pilot import paired_seed_needs

    path = Path(study_dir) / TABLE_FILE
    if not path.is_file():
        raise ValueError(f"{path} not found: the pilot has no confirmatory trial table (arms x seeds)")
    table = pd.read_csv(path)
    metric = spec.analysis.metric
    for col in ("arm", "seed", "status", metric):
        if col not in table.columns:
            raise ValueError(f"{path} lacks column {col!r}; required: arm, seed, status, {metric}")
    failed_value, _ = _chance(spec)
    values = pd.to_numeric(table[metric], errors="coerce").to_numpy(dtype=float)
    ok = (table["status"].astype(str).str.lower() == "completed").to_numpy() & np.isfinite(values)
    scored = np.where(ok, values, np.nan if failed_value is None else failed_value)
    contrasts = spec.contrast_specs
    m = len(contrasts)
    out = paired_seed_needs(
        table,
        scored,
        [(name, c.arm, c.reference, "two-sided") for name, c in contrasts.items()],
        alpha=alpha,
        power=power,
        min_effect=min_effect,
    )
    out.update(
        quantity=f"per-seed paired difference of {metric}",
        metric=metric,
        contrasts={
            n: {"a": c.arm, "b": c.reference, "alternative": "two-sided"} for n, c in contrasts.items()
        },
        family_size=m,
        # The fewest seeds that can decide at all: analysis.min_seeds, and the sign-flip floor
        # 2 / 2^K x m < alpha (the power of a t-test alone would plan fewer).
        min_seeds=max(spec.analysis.min_seeds, _floor_seeds(m, spec.analysis.alpha)),
    )
    return out


def _floor_seeds(family: int, alpha: float) -> int:
    """The fewest seeds K with ``2 / 2^K x family < alpha`` (the smallest two-sided sign-flip p)."""
    from studies.stats import min_sign_flip_p

    k = 2
    while min_sign_flip_p(k, "two-sided") * family >= alpha:
        k += 1
    return k
