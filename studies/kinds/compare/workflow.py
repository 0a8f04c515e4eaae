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
from studies.kinds.compare.plans import phases as planned_phases
from studies.kinds.compare.spec import CompareStudySpec
from studies.kinds.contract import StudyOutcome
from studies.tuning import RunPoints, tuned_lines, tuned_rates
from workers.records import TrialRecord

__all__ = ["analyse", "pilot", "report", "run", "select_learning_rates", "status", "trials_table"]

TABLE_FILE = "trials.csv"


def _say(message: str) -> None:
    print(f"[compare] {message}", flush=True)


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
    from studies.schema import data_classes

    c = data_classes(spec.data)
    if not c:
        return None, None
    failed = 1.0 / c if spec.analysis.metric.endswith("accuracy") and spec.analysis.higher_is_better else None
    return failed, math.log(c)


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


def _verdict_tags(verdict: Mapping[str, Any]) -> dict[str, str]:
    tags = {f"verdict/{name}": str(c["verdict"]) for name, c in verdict.get("contrasts", {}).items()}
    tags["verdict/study"] = str(verdict.get("study_verdict", "inconclusive"))
    for name, c in verdict.get("contrasts", {}).items():
        if c.get("reasons"):
            tags[f"reasons/{name}"] = "; ".join(str(r) for r in c["reasons"])[:5000]
    return tags


def _verdict_metrics(verdict: Mapping[str, Any]) -> dict[str, float]:
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


def _write_outputs(
    out_dir: Path,
    spec: CompareStudySpec,
    verdict: dict[str, Any],
    table: Any,
    *,
    lr_record: Mapping[str, Any],
    spent: tuple[float, float, float],
) -> dict[str, Path]:
    """The report, ``verdict.json``, ``trials.csv`` and ``lr_tuning.json`` in ``out_dir``; ``spent``
    is (wall s, CPU h, GPU h)."""
    from studies.kinds.compare.report import write_compare_report
    from studies.reporting import write_json

    protocol = spec.to_document()
    protocol["tuned_lr"] = {arm: rec["lr"] for arm, rec in lr_record.items()}
    files = write_compare_report(
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
    return {**files, "lr_tuning": write_json(out_dir / "lr_tuning.json", dict(lr_record))}


def _extension_runner(spec: CompareStudySpec, runner: Any, environ: Mapping[str, str] | None) -> RunPoints:
    """Runs range-extension round ``k`` as its own tuning phase ``tune-ext<k>``."""

    def run_points(round_: int, lrs: Mapping[str, float]) -> Sequence[TrialRecord]:
        plan = spec.extension_plan(round_, lrs, environ=environ)
        _say(f"  range extension {round_}: " + ", ".join(f"{k} lr={v:g}" for k, v in lrs.items()))
        runner.set_expected_trials(runner.expected_trials + len(lrs) * len(spec.lr_tuning.seeds))
        return list(runner.run(plan).trials)

    return run_points


def _extension_reader(spec: CompareStudySpec) -> RunPoints:
    """Reads range-extension round ``k`` back from the study directory (report, status)."""
    return base.stored_rounds(spec, "tune-ext")


def run(
    spec: CompareStudySpec, *, environ: Mapping[str, str] | None = None, **runner_options: Any
) -> StudyOutcome:
    """Tune every arm's η, confirm on every seed, analyse the contrasts, write and log the outputs. A
    rerun resumes where this one stopped. ``runner_options``: :data:`studies.kinds.kit.RUNNER_OPTIONS`."""
    study = spec.study_plan(environ=environ)
    _say(
        f"study {spec.name!r}: {len(spec.arm_names)} arms x {len(spec.seeds)} seeds = "
        f"{spec.confirmatory_trials} confirmatory + {spec.tuning_trials} lr-tuning trials "
        f"({spec.total_trials} total); contrasts: {', '.join(spec.contrast_specs)}"
    )
    with base.study_runner(study, expected_trials=spec.total_trials, **runner_options) as runner:
        plan = spec.tuning_plan(environ=environ)
        _say(f"phase {plan.name}: {len(plan.grid[0][1])} (arm, lr) cells x {len(spec.lr_tuning.seeds)} seeds")
        tuned = runner.run(plan)
        lr, record = select_learning_rates(
            spec, tuned.trials, run_points=_extension_runner(spec, runner, environ)
        )
        for line in tuned_lines(record):
            _say(line)
        missing = [a for a in spec.arm_names if a not in lr]
        if missing:  # no trial of these arms came back: nothing to confirm them with
            raise RuntimeError(f"lr tuning gave no learning rate for {missing}; see the tune phase's trials")
        confirm = spec.confirmatory_plan(lr, environ=environ)
        _say(
            f"phase {confirm.name}: {len(spec.arm_names)} arms x {len(spec.seeds)} seeds (FIFO, full budget)"
        )
        confirmed = runner.run(confirm)
        table = trials_table(confirmed.trials, metric=spec.analysis.metric, lr_record=record)
        _say("analysis: paired contrasts, verdicts, report")
        verdict = analyse(table, spec, lr_tuning=record)
        cpu_h, gpu_h = runner.resource_hours()
        out_dir = runner.local_dir()
        files = _write_outputs(
            out_dir, spec, verdict, table, lr_record=record, spent=(runner.wall_time_s, cpu_h, gpu_h)
        )
        base.log_study_outputs(
            runner, spec, files, tags=_verdict_tags(verdict), metrics=_verdict_metrics(verdict)
        )
    _print_verdict(verdict, runner.study_uri, runner.run_id, runner.tracking_uri)
    verdicts = {"contrasts": {n: c["verdict"] for n, c in verdict["contrasts"].items()}}
    tuned = {arm: rec["lr"] for arm, rec in record.items()}
    return base.study_outcome(spec, runner, verdict, table, files, verdicts=verdicts, tuned_lr=tuned)


def _print_verdict(verdict: Mapping[str, Any], study_dir: str, run_id: str | None, uri: str) -> None:
    from studies.reporting import fmt, fmt_ci

    _say(f"STUDY VERDICT: {verdict['study_verdict']}")
    if verdict.get("exploratory"):
        _say("exploratory: underpowered by design (see reasons); no claim either way")
    for name, c in verdict["contrasts"].items():
        _say(
            f"  {name:<24} {c['arm']} − {c['reference']}: {fmt(c['estimate'])} {fmt_ci(c['ci'])} "
            f"p_holm={fmt(c['p_value_holm'])} -> {c['verdict']} (predicted {c['predicted']}: {c['hypothesis']})"
            + (f" ({'; '.join(c['reasons'])})" if c["reasons"] else "")
        )
    _say(f"outputs in {study_dir}; MLflow run {run_id} ({uri})")


# --------------------------------------------------------------------------------------------------
# status / report, from the study directory


def _phase_trials(spec: CompareStudySpec) -> dict[str, list[TrialRecord]]:
    return base.read_phase_trials(planned_phases(spec), spec)


def status(spec: CompareStudySpec) -> dict[str, Any]:
    """Progress of every phase from the study directory."""
    phases = _phase_trials(spec)
    fields, verdict = base.phase_status(planned_phases(spec), spec, phases)
    return {
        **fields,
        "contrasts": {n: c.get("verdict") for n, c in (verdict.get("contrasts") or {}).items()}
        if verdict
        else None,
        "rows": [
            base.status_row(name, t, **{spec.analysis.metric: t.metrics.get(spec.analysis.metric)})
            for name, ts in phases.items()
            for t in ts
        ],
    }


def report(spec: CompareStudySpec, out_dir: Path) -> Path:
    """Re-analyse the study directory (the tuning replayed with its extension rounds) and write the
    report files, ``verdict.json`` among them."""
    phases = _phase_trials(spec)
    _, record = select_learning_rates(spec, phases["tune"], run_points=_extension_reader(spec))
    table = trials_table(phases["confirm"], metric=spec.analysis.metric, lr_record=record)
    verdict = analyse(table, spec, lr_tuning=record)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _write_outputs(
        out_dir, spec, verdict, table, lr_record=record, spent=base.spent(spec, phases, math.nan)
    )
    return files["markdown"]


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
