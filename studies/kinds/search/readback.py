"""The claims kind's ``status`` and ``report``: its phases read back from the study directory
(split from :mod:`studies.kinds.search.workflow`, which runs and analyses a study)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.kinds.records import (
    original_run,
    read_phase_trials,
    spent,
    stored_refinement,
    stored_rounds,
    study_wall_s,
)
from studies.kinds.search.plans import (
    SEARCH_PHASE,
    search_plan,
)
from studies.kinds.search.plans import (
    phases as planned_phases,
)
from studies.kinds.search.spec import StudySpec
from studies.kinds.search.workflow import (
    _gate_entropy_plot,
    _search_scope,
    _stored_checks,
    _write_claims,
    analyse,
    confirm_table,
    total_trials,
    tune_arm_lr,
)
from studies.reporting import with_study_cost, write_json
from workers.plan import StudyPlan, expected_trials
from workers.records import TrialRecord, best_trial
from workers.results import read_trials

__all__ = ["report", "status", "trial_name"]


def trial_name(t: TrialRecord, plan: StudyPlan) -> str:
    """A trial's name as its MLflow run has it (``search-007``), not Tune's id: the phase's run-name
    template rendered for the trial (its ``{index}`` from the ``experiment_tag`` Tune put in its
    results: a searcher's trial ids are random)."""
    from workers.tracking.names import record_run_name

    tag = t.metrics.get("experiment_tag")
    return t.name or record_run_name(
        plan.run_name,
        plan_name=plan.name,
        trial_id=t.trial_id,
        config=t.config,
        experiment_tag=str(tag) if tag is not None else None,
    )


def _row(t: TrialRecord, plan: StudyPlan) -> dict[str, Any]:
    from workers.dotted import get_path

    row: dict[str, Any] = {
        "trial": trial_name(t, plan),
        "status": t.status,
        "epoch": t.metrics.get("epoch", t.metrics.get("training_iteration")),
        plan.metric: t.metrics.get(plan.metric),
    }
    for p in plan.space:
        row[p.name] = get_path(t.config, p.name)
    for name, _ in plan.grid:
        row[name] = get_path(t.config, name)
    return row


def _stored_search_plan(spec: StudySpec) -> StudyPlan:
    """The search phase's plan where the study directory keeps it (for reading trials back)."""
    from studies.study_dir import StudyDir

    plan = search_plan(spec)
    return dataclasses.replace(plan, storage=StudyDir.of(spec).phase_plan(SEARCH_PHASE).storage)


def status(spec: StudySpec) -> dict[str, Any]:
    """Progress from the study directory (while it runs and after)."""
    import json

    from studies.study_dir import StudyDir

    plan = _stored_search_plan(spec)
    where = StudyDir.of(spec)
    trials = read_trials(plan, history=False)
    best = best_trial(trials, plan.metric, plan.mode)
    phases: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    optional_run = 0  # trials of range extensions and later looks that ran: each raised the count
    for phase in planned_phases(spec):
        ts = (
            trials if phase.name == SEARCH_PHASE else read_trials(where.phase_plan(phase.name), history=False)
        )
        phases[phase.name] = {"trials": len(ts), "by_status": dict(Counter(t.status for t in ts))}
        counts.update(t.status for t in ts)
        optional_run += len(ts) if phase.optional else 0
    out: dict[str, Any] = {
        "study": spec.name,
        "kind": spec.kind,
        "directory": where.uri,
        "expected_trials": total_trials(spec) + optional_run,
        "trials": sum(counts.values()),
        "by_status": dict(counts),
        "phases": phases,
        "metric": plan.metric,
        "best_trial": trial_name(best, plan) if best else None,
        f"best_{plan.metric}": best.metrics.get(plan.metric) if best else None,
        "rows": [_row(t, plan) for t in trials],
    }
    text = where.read_text("verdict.json")
    verdict = json.loads(text) if text else None
    out["study_verdict"] = verdict.get("study_verdict") if verdict else None
    out["wall_s"] = study_wall_s(verdict)  # the wall time the run wrote, as every kind's status has it
    if spec.confirm is not None and verdict:
        out["claims"] = {k: v.get("verdict") for k, v in (verdict.get("claims") or {}).items()}
    return out


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _edge_flags(best: TrialRecord | None, plan: StudyPlan) -> list[str]:
    """Numeric parameters whose best value sits in the outer 5 % of the range (tuning playbook)."""
    from workers.dotted import get_path

    if best is None:
        return []
    flags = []
    for p in plan.space:
        if p.type == "categorical" or p.low is None or p.high is None:
            continue
        v = get_path(best.config, p.name)
        if not isinstance(v, int | float):
            continue
        lo, hi, x = (math.log(p.low), math.log(p.high), math.log(v)) if p.log else (p.low, p.high, float(v))
        pos = (x - lo) / (hi - lo)
        if pos <= 0.05 or pos >= 0.95:
            side = "low" if pos <= 0.05 else "high"
            flags.append(
                f"{p.name}={_short(v)} is at the {side} edge of [{p.low}, {p.high}]: widen the range"
            )
    return flags


def report(spec: StudySpec, out_dir: Path) -> Path:
    """``report.md`` (+ gate-entropy plot when trials report it) and ``verdict.json`` regenerated from
    the study directory; with ``confirm:`` the claims report in ``out_dir/claims``."""
    plan = _stored_search_plan(spec)
    trials = read_trials(plan)
    best = best_trial(trials, plan.metric, plan.mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = Counter(t.status for t in trials)
    lines = [
        f"# Study `{spec.name}`",
        "",
        f"- trials: {len(trials)} of {expected_trials(plan)} planned "
        f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none'})",
        f"- failed: {counts.get('error', 0)}, diverged: {counts.get('diverged', 0)}, "
        f"pruned (stopped early): {counts.get('pruned', 0)}",
        f"- metric: `{plan.metric}` ({plan.mode}), sampler `{plan.sampler.type}` (seed {plan.sampler.seed}), "
        f"scheduler `{plan.scheduler.type}`",
        "",
    ]
    if best is not None:
        from workers.dotted import get_path

        lines += [
            f"## Best completed trial `{trial_name(best, plan)}`: {plan.metric} = {_short(best.metrics[plan.metric])}",
            "",
        ]
        searched = [(p.name, get_path(best.config, p.name)) for p in plan.space]
        lines += [f"- `{name}` = {_short(v)}" for name, v in searched if v is not None]  # None: inactive
        flags = _edge_flags(best, plan)
        if flags:
            lines += ["", "Best point on a search-space edge:", *[f"- {f}" for f in flags]]
        lines.append("")
    rows = [_row(t, plan) for t in trials]
    sign = -1.0 if plan.mode == "max" else 1.0

    def order(r: dict[str, Any]) -> float:
        v = r[plan.metric]
        return sign * v if isinstance(v, int | float) and math.isfinite(v) else math.inf

    rows.sort(key=order)
    if rows:
        keys = list(rows[0])
        lines += ["## Trials", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(_short(r.get(k)) for k in keys) + " |" for r in rows]
        lines.append("")
    png = _gate_entropy_plot(plan, out_dir)
    if png is not None:
        lines += ["## Gate entropy per layer", "", f"![gate entropy]({png.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    if spec.confirm is not None:
        verdict = _claims_report(spec, plan, trials, out_dir / "claims")
    else:
        verdict = analyse(None, spec, best=best, metric=plan.metric)
        verdict["scope"] = _search_scope(trials, plan.metric)
        with_study_cost(verdict)  # ``report``'s: the trials in the study directory, the run's wall time
    write_json(out_dir / "verdict.json", verdict)
    return path


def _claims_report(
    spec: StudySpec, plan: StudyPlan, trials: Sequence[TrialRecord], out_dir: Path
) -> dict[str, Any]:
    """The claims re-analysed from the confirmatory phases in the study directory; their verdict."""
    import json

    from studies.study_dir import StudyDir

    confirm = spec.confirm
    assert confirm is not None
    run_ids, wall_time_s = original_run(spec, "confirm_trials.csv")
    table, gate_logs = confirm_table(spec, run_ids)
    tuned: dict[str, Any] = {}
    if confirm.lr_tuning is not None:
        where = StudyDir.of(spec)
        best_lr = best_trial(trials, plan.metric, plan.mode)
        for arm in confirm.arms:
            if best_lr is None:
                continue

            tuned[arm] = tune_arm_lr(
                confirm,
                arm,
                float(best_lr.config["training"]["lr"]),
                read_trials(where.phase_plan(f"confirm-tune-{arm}")),
                metric=plan.metric,
                mode=plan.mode,
                run_points=stored_rounds(spec, f"confirm-tune-{arm}-ext"),
                run_refine=stored_refinement(spec, f"confirm-tune-{arm}-refine"),
            )
    best = best_trial(trials, plan.metric, plan.mode)
    searched_lr = float(best.config["training"]["lr"]) if best is not None else None
    verdict = analyse(
        table,
        spec,
        gate_logs=gate_logs,
        tuned=tuned,
        searched=best is not None,
        adequacy=_stored_checks(spec, tuned, searched_lr),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cost = spent(spec, read_phase_trials(planned_phases(spec), spec), wall_time_s)
    files = _write_claims(spec, verdict, table, gate_logs, out_dir, best, tuned, cost)
    written: dict[str, Any] = json.loads(files["verdict"].read_text(encoding="utf-8"))
    return written
