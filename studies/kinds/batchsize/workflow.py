"""The batch-size kind's workflow: run its phases, analyse, write and log the outputs; status; report.

Phases (docs/science.md, "The batch-size hypothesis"; :mod:`studies.kinds.batchsize.plans`), each in
its own folder with its own phase run nested under the study's MLflow run:

1. ``tune-<budget>``, one grid plan per budget: every arm's η on a log-spaced grid at the reference
   batch size (per (arm, B) cell for ``lr_policy: tuned``) on held-out tuning seeds; the η with the
   best mean validation metric wins (a failed trial scores the worst value); a winner on the edge of
   the grid is flagged (``lr-at-range-edge``).
2. ``confirm-<budget>``, one grid plan per budget: arms x batch sizes x seeds with the tuned η (fixed
   across B, or scaled with B for ``linear`` / ``sqrt``), FIFO, full budget, same seeds for every arm.
3. Analysis: :func:`studies.kinds.batchsize.analysis.batchsize_trend` over every confirmatory trial (failed ones
   scored at chance, not dropped), then ``verdict.json``, reports, ``trials.csv``, ``lr_tuning.json``
   and plots in ``<storage_path>/<name>/``, all logged on the study run with ``verdict/<arm>``,
   ``control/<arm>`` and ``verdict/study`` tags.

Rerunning after a crash resumes: finished phases restore instantly from their Tune state and
finished trials are not repeated; MLflow runs re-attach by key.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.batchsize.plans import phases as planned_phases
from studies.kinds.batchsize.spec import BatchSizeStudySpec, cell_key
from studies.kinds.contract import StudyOutcome
from studies.kinds.kit import (
    arm_of,
    hypothesis_entry,
    log_study_outputs,
    metric_value,
    phase_status,
    read_phase_trials,
    spent,
    status_row,
    stored_rounds,
    study_outcome,
    study_runner,
)
from studies.tuning import RunPoints, tuned_lines, tuned_rates
from workers.records import TrialRecord
from workers.results import read_trials

__all__ = [
    "analyse",
    "report",
    "run",
    "select_learning_rates",
    "status",
    "total_trials",
    "trials_table",
]

SPEC = BatchSizeStudySpec
_TAG = "batchsize"


def _say(message: str) -> None:
    print(f"[{_TAG}] {message}", flush=True)


def total_trials(spec: BatchSizeStudySpec) -> int:
    return spec.total_trials


def _cell_of(spec: BatchSizeStudySpec) -> Any:
    def cell(t: TrialRecord) -> str:
        return (
            cell_key(arm_of(t), int(t.config["training"]["batch_size"]))
            if spec.lr_policy == "tuned"
            else arm_of(t)
        )

    return cell


def select_learning_rates(
    spec: BatchSizeStudySpec,
    trials: Sequence[TrialRecord],
    *,
    run_points: RunPoints | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The tuned η per arm (``cell_key(arm, B)`` per cell for ``tuned``) from one budget's tuning trials.

    :func:`studies.tuning.tune`: the η with the best mean validation metric over the tuning seeds
    (a failed trial scores the worst value); a winner on the edge of the grid extends it through
    ``run_points`` (up to ``lr_tuning.max_extensions`` rounds; ``None``: no extension). Returns the
    table and a JSON-able record per arm/cell (every η's mean score, the winner, the final grid,
    whether the winner still sits on its edge, trials completed / failed).
    """
    return tuned_rates(
        spec.tuning_cells, trials, cell_of=_cell_of(spec), tuning=spec.lr_tuning, run_points=run_points
    )


def trials_table(
    trials: Sequence[TrialRecord],
    *,
    metric: str,
    budget: str,
    lr_record: Mapping[str, Any],
    lr_policy: str,
) -> Any:
    """One row per confirmatory trial: the analysis input plus provenance.

    Columns: ``arm, batch_size, seed, budget, status, <metric>, train_loss, lr, updates, lr_at_edge,
    epochs_done, time_total_s, trial_id, mlflow_run_id``. ``status`` is the one trial vocabulary
    (``completed | diverged | error | pruned``); the analysis counts all but ``completed`` as failed.
    """
    import pandas as pd

    rows = []
    for t in trials:
        arm = arm_of(t)
        b = int(t.config["training"]["batch_size"])
        rec = lr_record.get(cell_key(arm, b) if lr_policy == "tuned" else arm, {})
        rows.append(
            {
                "arm": arm,
                "batch_size": b,
                "seed": int(t.config.get("seed", 0)),
                "budget": budget,
                "status": t.status,
                metric: metric_value(t, metric),
                "train_loss": metric_value(t, "train_loss"),
                # The η the trial used at its batch size (scaled for linear / sqrt).
                "lr": metric_value(t, "lr")
                if math.isfinite(metric_value(t, "lr"))
                else float(t.config["training"]["lr"]),
                "updates": metric_value(t, "updates"),
                "lr_at_edge": bool(rec.get("at_range_edge", False)),
                "epochs_done": t.metrics.get("epoch"),
                "time_total_s": float(t.metrics.get("time_total_s") or 0.0),
                "trial_id": t.trial_id,
                "mlflow_run_id": t.mlflow_run_id,
            }
        )
    columns = ["arm", "batch_size", "seed", "budget", "status", metric, "train_loss", "lr", "updates"]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=columns)
    return df.sort_values(["budget", "arm", "batch_size", "seed"], kind="stable").reset_index(drop=True)


def _chance(spec: BatchSizeStudySpec) -> tuple[float, float]:
    """Chance accuracy 1/C and chance loss ln C of the study's data (NaN for regression)."""
    from studies.schema import data_classes

    c = data_classes(spec.data)
    if not c:
        return math.nan, math.nan
    return 1.0 / c, math.log(c)


def analyse(table: Any, spec: BatchSizeStudySpec, **inputs: Any) -> dict[str, Any]:
    """:func:`studies.kinds.batchsize.analysis.batchsize_trend` with the spec's analysis settings,
    plus the fields every kind's ``verdict.json`` has: ``kind``, and ``hypotheses`` (one per fix arm:
    its verdict, reasons, the interaction estimate and CI, p and Holm p)."""
    from studies.kinds.batchsize.analysis import batchsize_trend

    a = spec.analysis
    chance_metric, chance_loss = _chance(spec)
    verdict = batchsize_trend(
        table,
        control=spec.control,
        controls=list(spec.control_arms),
        chance_metric=chance_metric,
        chance_loss=chance_loss,
        **a.model_dump(),  # metric, direction, alpha, delta, min_seeds, n_boot, n_perm, seed, confidence
        sequential=_sequential_design(spec),
    )
    if spec.sequential is not None:
        verdict.update(_sequential_summary(spec, verdict))
    arms = verdict.get("arms") or {}
    hypotheses = {
        arm: {
            **hypothesis_entry(arms.get(arm) or {}, estimate="interaction", ci="interaction_ci"),
            "verdict": label,
        }
        for arm, label in (verdict.get("verdict") or {}).items()
    }
    return {
        "kind": spec.kind,
        "study_verdict": verdict.get("study_verdict"),
        "hypotheses": hypotheses,
        **verdict,
    }


def _sequential_design(spec: BatchSizeStudySpec) -> dict[str, Any] | None:
    seq = spec.sequential
    if seq is None:
        return None
    return {
        "looks": list(seq.schedule()),
        "seed_order": [str(s) for s in spec.seeds],
        "min_effect": seq.min_effect,
        "prior_scale": seq.prior_scale,
    }


def _sequential_summary(spec: BatchSizeStudySpec, verdict: Mapping[str, Any]) -> dict[str, Any]:
    """``looks`` over every budget (hypothesis ``<arm>``, or ``<budget>/<arm>`` with several budgets;
    Holm runs per budget, the fixed design's family), ``seeds_used``, ``max_seeds``, ``trials_saved``."""
    from studies.sequential import sequential_fields

    assert spec.sequential is not None
    budgets = verdict.get("budgets") or {"": verdict}
    merged: list[dict[str, Any]] = []
    for budget, result in budgets.items():
        for j, look in enumerate(result.get("looks") or []):
            if j == len(merged):
                merged.append({"n_seeds": look["n_seeds"], "hypotheses": {}})
            prefix = f"{budget}/" if len(budgets) > 1 else ""
            merged[j]["hypotheses"].update({f"{prefix}{arm}": h for arm, h in look["hypotheses"].items()})
    return sequential_fields(
        merged, spec.seeds, max_seeds=spec.sequential.max_seeds, trials_per_seed=spec.trials_per_seed
    )


def extended_spec(spec: BatchSizeStudySpec, seeds: int, verdict: Mapping[str, Any]) -> BatchSizeStudySpec:
    """The spec of ``extend``: the seeds used so far, then ``seeds`` new ones (the next integers above
    every seed any phase used, tuning seeds included), the looks made so far kept as looks."""
    assert spec.sequential is not None
    used = int(verdict.get("seeds_used") or 0)
    done = [int(look["n_seeds"]) for look in verdict.get("looks") or []]
    if not used or not done:
        from studies.sequential import ExtendRefused

        raise ExtendRefused("the study's verdict.json records no looks: resume it first, then extend")
    top = max([*spec.seeds[:used], *spec.lr_tuning.seeds]) + 1
    doc = spec.to_document()
    doc["seeds"] = [*spec.seeds[:used], *range(top, top + seeds)]
    doc["sequential"] = spec.sequential.extended(done, seeds).model_dump(mode="json")
    return BatchSizeStudySpec.model_validate(doc)


def decided(verdict: Mapping[str, Any]) -> bool:
    """Every sequential hypothesis of the last look is decided (rejected or futile)."""
    looks = verdict.get("looks") or []
    if not looks:
        return False
    return all(h["decision"] in ("reject", "futile") for h in looks[-1]["hypotheses"].values())


def _verdict_tags(verdict: Mapping[str, Any]) -> dict[str, str]:
    tags = {f"verdict/{arm}": str(v) for arm, v in verdict.get("verdict", {}).items()}
    tags.update({f"control/{arm}": str(v) for arm, v in verdict.get("controls", {}).items()})
    tags["verdict/study"] = str(verdict.get("study_verdict", "inconclusive"))
    for arm, res in verdict.get("arms", {}).items():
        reasons = res.get("reasons") or []
        if reasons:
            tags[f"reasons/{arm}"] = "; ".join(str(r) for r in reasons)[:5000]
    return tags


_VERDICT_NUMBERS = (
    "slope",
    "interaction",
    "spearman_rho",
    "p_value",
    "p_value_holm",
    "n",
    "n_failed",
    "n_seeds",
)
_VERDICT_CIS = ("slope_ci", "interaction_ci", "spearman_rho_ci")


def _verdict_metrics(verdict: Mapping[str, Any]) -> dict[str, float]:
    """The numbers the verdict rests on, once each: per arm ``<stat>/<arm>`` (``<stat>/<budget>/<arm>``
    with several budgets) for the slope, interaction, Spearman rho, p and Holm p, counts, and each CI
    as ``<stat>_ci_low/<arm>`` / ``<stat>_ci_high/<arm>``."""
    budgets = verdict.get("budgets") or {}
    sources = {f"{b}/": res for b, res in budgets.items()} if len(budgets) > 1 else {"": verdict}
    out = {}

    def put(name: str, v: Any) -> None:
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[name] = float(v)

    for prefix, result in sources.items():
        for arm, res in result.get("arms", {}).items():
            for key in _VERDICT_NUMBERS:
                put(f"{key}/{prefix}{arm}", res.get(key))
            for key in _VERDICT_CIS:
                ci = res.get(key)
                if isinstance(ci, list | tuple) and len(ci) == 2:
                    put(f"{key}_low/{prefix}{arm}", ci[0])
                    put(f"{key}_high/{prefix}{arm}", ci[1])
    return out


def _write_outputs(
    spec: BatchSizeStudySpec,
    verdict: dict[str, Any],
    table: Any,
    out_dir: Path,
    lr_records: Mapping[str, Any],
    spent: tuple[float, float, float],
) -> dict[str, Path]:
    """Every output file; ``spent``: wall time (s), CPU hours, GPU hours."""
    wall_time_s, cpu_hours, gpu_hours = spent
    from studies.kinds.batchsize.report import write_batchsize_report
    from studies.reporting import write_json

    # What the study cost, kept with the verdict so a regenerated report shows the run's wall time.
    verdict["resources"] = {"wall_time_s": wall_time_s, "cpu_hours": cpu_hours, "gpu_hours": gpu_hours}

    doc = spec.to_document()
    head: dict[str, Any] = {k: doc.pop(k) for k in ("kind", "name") if k in doc}
    protocol: dict[str, Any] = {**head, "phases": _resolved_phases(spec, table, lr_records), **doc}
    files = write_batchsize_report(
        verdict,
        table,
        out_dir,
        title=f"Batch-size correlation study: {spec.name}",
        protocol=protocol,
        wall_time_s=wall_time_s,
        cpu_hours=cpu_hours,
        gpu_hours=gpu_hours,
    )
    return {**files, "lr_tuning": write_json(out_dir / "lr_tuning.json", dict(lr_records))}


def _resolved_phases(spec: BatchSizeStudySpec, table: Any, lr_records: Mapping[str, Any]) -> dict[str, Any]:
    """What each phase actually ran (the protocol's first section): the tuning phase's batch sizes,
    seeds, epochs and η grid (as extended), the tuned η per arm / cell; the confirmatory phase's batch
    sizes, seeds and the η each arm used at each batch size (scaled for ``linear`` / ``sqrt``)."""
    out: dict[str, Any] = {}
    sizes = spec.batch_sizes if spec.lr_policy == "tuned" else (spec.lr_tuning.reference_batch_size,)
    for budget in spec.budgets:
        record = lr_records.get(budget) or {}
        out[f"tune-{budget}"] = {
            "batch_sizes": [int(b) for b in sizes],
            "seeds": [int(x) for x in spec.lr_tuning.seeds],
            "epochs": spec.lr_tuning.epochs or spec.training.epochs,
            "lr_grid": {cell: [float(x) for x in rec.get("grid") or []] for cell, rec in record.items()},
            "tuned_lr": {cell: rec.get("lr") for cell, rec in record.items()},
        }
        sub = (
            table[table["budget"] == budget] if len(table) and "budget" in table.columns else table.iloc[0:0]
        )
        lrs: dict[str, dict[int, float]] = {}
        for arm, b, lr in zip(sub.get("arm", []), sub.get("batch_size", []), sub.get("lr", [])):
            lrs.setdefault(str(arm), {})[int(b)] = float(lr)
        out[f"confirm-{budget}"] = {
            "batch_sizes": sorted({int(b) for b in sub.get("batch_size", [])}),
            "seeds": sorted({int(x) for x in sub.get("seed", [])}),
            "epochs": spec.training.epochs if budget == "epochs" else None,
            "lr_policy": spec.lr_policy,
            "lr": {arm: dict(sorted(v.items())) for arm, v in sorted(lrs.items())},
        }
    return out


def _extension_runner(
    spec: BatchSizeStudySpec, runner: Any, budget: str, environ: Mapping[str, str] | None
) -> RunPoints:
    """Runs range-extension round ``k`` as its own tuning phase ``tune-<budget>-ext<k>`` (ordinary
    tuning trials: MLflow runs under the study run, resumable, listed by ``status``)."""

    def run_points(round_: int, lrs: Mapping[str, float]) -> Sequence[TrialRecord]:
        plan = spec.extension_plan(budget, round_, lrs, environ=environ)
        _say(
            f"  range extension {round_} ({budget} budget): "
            + ", ".join(f"{k} lr={v:g}" for k, v in lrs.items())
        )
        runner.set_expected_trials(runner.expected_trials + len(lrs) * len(spec.lr_tuning.seeds))
        return list(runner.run(plan).trials)

    return run_points


def _confirm(
    spec: BatchSizeStudySpec,
    runner: Any,
    budget: str,
    lr: Mapping[str, float],
    record: Mapping[str, Any],
    *,
    look: int,
    environ: Mapping[str, str] | None,
) -> Any:
    """One confirmatory phase (a look of a sequential design) as a trials table."""
    plan = spec.confirmatory_plan(budget, lr, look=look, environ=environ)
    _say(f"phase confirmatory ({budget} budget): {plan.name} (grid, FIFO, full budget)")
    confirmed = runner.run(plan)
    table = trials_table(
        confirmed.trials,
        metric=spec.analysis.metric,
        budget=budget,
        lr_record=record,
        lr_policy=spec.lr_policy,
    )
    _log_summaries(spec, runner, plan.name, table)
    return table


def _log_summaries(spec: BatchSizeStudySpec, runner: Any, phase: str, table: Any) -> None:
    """Under the confirmatory phase run, one summary run per arm: the analysis metric's mean over
    seeds and its t-interval at step = batch size (MLflow then draws one line per arm against B)."""
    from studies.summaries import arm_summaries

    summaries = arm_summaries(
        table, metrics=[spec.analysis.metric], axis="batch_size", confidence=spec.analysis.confidence
    )
    runner.log_summaries(phase, summaries)


def _run_looks(
    spec: BatchSizeStudySpec,
    runner: Any,
    tuned_lr: Mapping[str, Mapping[str, float]],
    lr_records: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None,
) -> list[Any]:
    """The confirmatory seeds in looks: after each, the anytime-valid test of every fix arm (Holm per
    budget); no more seeds once every hypothesis is decided. A look already in the study directory
    (a resumed study) and every look of an explicit ``sequential.looks`` schedule (``extend``) run
    whatever the decisions, so a rerun repeats the study and an extension adds exactly its seeds."""
    import pandas as pd

    from studies.sequential import look_seeds
    from studies.study_dir import StudyDir

    assert spec.sequential is not None
    schedule = spec.sequential.schedule()
    where = StudyDir.of(spec)
    tables: list[Any] = []
    for j in range(1, len(schedule) + 1):
        for budget in spec.budgets:
            tables.append(
                _confirm(spec, runner, budget, tuned_lr[budget], lr_records[budget], look=j, environ=environ)
            )
        if j == len(schedule):
            break
        verdict = analyse(pd.concat(tables, ignore_index=True), spec)
        state = {
            k: h["decision"] for k, h in (verdict.get("looks") or [{}])[-1].get("hypotheses", {}).items()
        }
        _say(f"look {j} ({schedule[j - 1]} seeds): " + ", ".join(f"{k} {v}" for k, v in state.items()))
        ran_before = bool(
            read_trials(where.phase_plan(spec.look_plan_name(spec.budgets[0], j + 1)), history=False)
        )
        if decided(verdict) and not ran_before and spec.sequential.looks is None:
            _say(
                f"every hypothesis decided after {schedule[j - 1]} of {spec.sequential.max_seeds} seeds: stop"
            )
            break
        runner.set_expected_trials(
            runner.expected_trials + len(dict(look_seeds(spec.seeds, schedule))[j + 1]) * spec.trials_per_seed
        )
    return tables


def _extension_reader(spec: BatchSizeStudySpec, budget: str) -> RunPoints:
    """Reads range-extension round ``k`` back from the study directory (report, status)."""
    return stored_rounds(spec, f"tune-{budget}-ext")


def run(
    spec: BatchSizeStudySpec, *, environ: Mapping[str, str] | None = None, **runner_options: Any
) -> StudyOutcome:
    """Run every phase, analyse, write and log the outputs; idempotent (a rerun resumes).
    ``runner_options``: :data:`studies.kinds.kit.RUNNER_OPTIONS`."""
    import pandas as pd

    study = spec.study_plan(environ=environ)
    _say(
        f"study {spec.name!r}: {len(spec.arms)} arms x {len(spec.batch_sizes)} batch sizes x "
        f"{len(spec.seeds)} seeds x {len(spec.budgets)} budget(s) = {spec.expected_trials} confirmatory "
        f"+ {spec.tuning_trials} lr-tuning trials ({spec.total_trials} total), lr_policy={spec.lr_policy}"
    )
    lr_records: dict[str, Any] = {}
    tuned_lr: dict[str, dict[str, float]] = {}
    tables = []
    with study_runner(study, expected_trials=spec.total_trials, **runner_options) as runner:
        for budget in spec.budgets:
            plan = spec.tuning_plan(budget, environ=environ)
            _say(
                f"phase lr_tuning ({budget} budget): {len(plan.grid[0][1])} cells x {len(spec.lr_tuning.seeds)} seeds"
            )
            tuned = runner.run(plan)
            lr, record = select_learning_rates(
                spec, tuned.trials, run_points=_extension_runner(spec, runner, budget, environ)
            )
            lr_records[budget] = record
            for line in tuned_lines(record):
                _say(line)
            tuned_lr[budget] = lr
            if spec.sequential is None:
                tables.append(_confirm(spec, runner, budget, lr, record, look=1, environ=environ))
        if spec.sequential is not None:
            tables = _run_looks(spec, runner, tuned_lr, lr_records, environ=environ)
        _say("phase analysis: statistics, verdict, report")
        table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
        verdict = analyse(table, spec)
        cpu_h, gpu_h = runner.resource_hours()
        out_dir = runner.local_dir()
        files = _write_outputs(spec, verdict, table, out_dir, lr_records, (runner.wall_time_s, cpu_h, gpu_h))
        log_study_outputs(runner, spec, files, tags=_verdict_tags(verdict), metrics=_verdict_metrics(verdict))
    _print_verdict(spec, verdict, runner.study_uri, runner.run_id, runner.tracking_uri)
    _say(f"wall time {runner.wall_time_s / 60:.1f} min, {cpu_h:.3f} CPU h, {gpu_h:.3f} GPU h")
    return study_outcome(
        spec,
        runner,
        verdict,
        table,
        files,
        verdicts={"verdict": verdict.get("verdict"), "controls": verdict.get("controls")},
        tuned_lr={b: {k: r["lr"] for k, r in rec.items()} for b, rec in lr_records.items()},
    )


def _num(v: Any) -> str:
    return (
        f"{v:+.4f}" if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else "n/a"
    )


def _ci(ci: Any) -> str:
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(x, int | float) for x in ci):
        return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"
    return "n/a"


def _print_verdict(
    spec: BatchSizeStudySpec, verdict: Mapping[str, Any], study_dir: str, run_id: str | None, uri: str
) -> None:
    _say(f"STUDY VERDICT: {verdict.get('study_verdict')}  {'; '.join(verdict.get('study_reasons') or [])}")
    if verdict.get("exploratory"):
        _say("exploratory: underpowered by design (see reasons); no claim either way")
    budgets = verdict.get("budgets") or {}
    sections = budgets.items() if len(budgets) > 1 else [("", verdict)]
    combined = {**verdict.get("verdict", {}), **verdict.get("controls", {})}
    for budget, result in sections:
        if budget:
            _say(
                f" {budget} budget: {result.get('study_verdict')}  {'; '.join(result.get('study_reasons') or [])}"
            )
        labels = {**result.get("verdict", {}), **result.get("controls", {})}
        arms = result.get("arms", {})
        for arm in sorted(arms, key=lambda a: (a not in spec.control_arms, a)):
            r = arms[arm]
            _say(
                f"  {arm:<18} n={r.get('n')} failed={r.get('n_failed')} slope={_num(r.get('slope'))} "
                f"{_ci(r.get('slope_ci'))} interaction={_num(r.get('interaction'))} {_ci(r.get('interaction_ci'))} "
                f"p_holm={_num(r.get('p_value_holm'))} -> {labels.get(arm, '?')}"
                + (f" ({'; '.join(r.get('reasons') or [])})" if r.get("reasons") else "")
            )
    if len(budgets) > 1:
        _say(" both budgets together: " + ", ".join(f"{arm} {label}" for arm, label in combined.items()))
    _say(f"outputs in {study_dir}; MLflow run {run_id} ({uri})")


# --------------------------------------------------------------------------------------------------
# status / report, from the study directory
# --------------------------------------------------------------------------------------------------


def _phase_trials(spec: BatchSizeStudySpec, *, history: bool = False) -> dict[str, list[TrialRecord]]:
    return read_phase_trials(planned_phases(spec), spec, history=history)


def status(spec: BatchSizeStudySpec) -> dict[str, Any]:
    """Progress of every phase from the study directory."""
    phases = _phase_trials(spec)
    # Extension rounds and looks that ran add their trials to expected_trials (each changes the count).
    fields, verdict = phase_status(planned_phases(spec), spec, phases)
    return {
        **fields,
        "verdict": verdict.get("verdict") if verdict else None,
        "rows": [
            # A tuning trial shows what selects its η (validation), never the test set.
            status_row(
                name, t, batch_size=t.config["training"]["batch_size"], **{metric: t.metrics.get(metric)}
            )
            for name, ts in phases.items()
            for metric in [spec.lr_tuning.metric if name.startswith("tune-") else spec.analysis.metric]
            for t in ts
        ],
    }


def _original_run(spec: BatchSizeStudySpec) -> tuple[dict[str, str], float]:
    """What only the run itself knew, from the outputs it wrote to the study directory: each trial's
    MLflow run id (its ``trials.csv``) and the study's wall time (its ``verdict.json``); empty / NaN
    when the run wrote none yet."""
    import io

    import pandas as pd

    from studies.study_dir import StudyDir

    where = StudyDir.of(spec)
    run_ids: dict[str, str] = {}
    text = where.read_text("trials.csv")
    if text:
        df = pd.read_csv(io.StringIO(text), dtype={"trial_id": str, "mlflow_run_id": str})
        if {"trial_id", "mlflow_run_id"} <= set(df.columns):
            run_ids = {
                str(t): str(r)
                for t, r in zip(df["trial_id"], df["mlflow_run_id"])
                if isinstance(r, str) and r
            }
    wall = math.nan
    text = where.read_text("verdict.json")
    if text:
        value = (json.loads(text).get("resources") or {}).get("wall_time_s")
        if isinstance(value, int | float) and math.isfinite(value):
            wall = float(value)
    return run_ids, wall


def report(spec: BatchSizeStudySpec, out_dir: Path) -> Path:
    """Re-analyse the finished phases from the study directory and write the report files."""
    import pandas as pd

    phases = _phase_trials(spec)
    run_ids, wall_time_s = _original_run(spec)
    phases = {
        name: [dataclasses.replace(t, mlflow_run_id=t.mlflow_run_id or run_ids.get(t.trial_id)) for t in ts]
        for name, ts in phases.items()
    }
    lr_records: dict[str, Any] = {}
    tables = []
    for budget in spec.budgets:
        _, record = select_learning_rates(
            spec, phases[f"tune-{budget}"], run_points=_extension_reader(spec, budget)
        )
        lr_records[budget] = record
        tables.append(
            trials_table(
                [
                    t
                    for name, ts in phases.items()
                    if name == f"confirm-{budget}" or name.startswith(f"confirm-{budget}-look")
                    for t in ts
                ],
                metric=spec.analysis.metric,
                budget=budget,
                lr_record=record,
                lr_policy=spec.lr_policy,
            )
        )
    table = pd.concat(tables, ignore_index=True)
    verdict = analyse(table, spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _write_outputs(spec, verdict, table, out_dir, lr_records, spent(spec, phases, wall_time_s))
    return files.get("markdown", out_dir / "report.md")
