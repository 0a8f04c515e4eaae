"""``kind: search``: one Optuna (or grid) search under Ray Tune, e.g. the AutoNorm-S search.

One phase, one plan: the plan's Tune experiment *is* the study directory and its MLflow run is the
study run, the trial runs its children. At the end the gate entropy per layer of the trials is drawn
and logged on the study run.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from studies.kinds import StudyOutcome
from studies.spec import StudySpec
from workers.plan import StudyPlan, expected_trials
from workers.runner import StudyResult, TrialRecord, best_trial, read_trials

__all__ = ["describe_result", "report", "run", "status", "total_trials"]

SPEC = StudySpec


def total_trials(spec: StudySpec) -> int:
    return expected_trials(spec.to_plan())


def describe_result(result: StudyResult, plan: StudyPlan) -> dict[str, Any]:
    """The printable summary: the best COMPLETED trial (searched values, config, metric), the MLflow
    study run, trial counts by status, and where everything lives."""
    best = result.best(plan.metric, plan.mode)
    return {
        "study": plan.name,
        "metric": plan.metric,
        "mode": plan.mode,
        "best_metric": best.metrics.get(plan.metric) if best is not None else None,
        "best_trial_id": best.trial_id if best is not None else None,
        "best_params": dict(best.params) if best is not None else None,
        "parent_run_id": result.parent_run_id,
        "tracking_uri": result.tracking_uri,
        "experiment_path": result.experiment_path,
        "restored": result.restored,
        "trials": dict(Counter(str(t.status) for t in result.trials)),
        "best_config": dict(best.config) if best is not None else None,
    }


def run(
    spec: StudySpec,
    *,
    ray_address: str | None = None,
    ray_init_kwargs: Any = None,
    trainable: Any = None,
    progress: bool = True,
) -> StudyOutcome:
    from workers.study import StudyRunner

    plan = spec.to_plan()
    with StudyRunner(
        name=plan.name,
        storage=plan.storage,
        tracking=plan.tracking,
        expected_trials=expected_trials(plan),
        tags=dict(plan.tags),
        params=dict(plan.params),
        artifacts=dict(plan.artifacts),
        trainable=trainable,
        progress=progress,
        ray_address=ray_address,
        ray_init_kwargs=ray_init_kwargs,
    ) as runner:
        result = runner.run(plan, phase="search", nested=False)
        png = _gate_entropy_plot(plan, runner.local_dir())
        if png is not None:
            runner.log_outputs(files=[png], artifact_path="plots")
            runner.publish([png])
    return StudyOutcome(
        kind="search",
        name=plan.name,
        study_dir=runner.study_uri,
        tracking_uri=runner.tracking_uri,
        parent_run_id=result.parent_run_id,
        summary=describe_result(result, plan),
        files={"gate_entropy_plot": png} if png is not None else {},
    )


def _gate_entropy_plot(plan: StudyPlan, out_dir: Path) -> Path | None:
    """Gate entropy per layer over epochs, best trial first; ``None`` when no trial logged a gate.

    A plotting failure must not turn a finished study into a failed one: it is reported on stderr.
    """
    try:
        from studies.report import plot_gate_entropy

        trials = read_trials(plan)
        best = best_trial(trials, plan.metric, plan.mode)
        ordered = sorted(trials, key=lambda t: t is not best)
        histories = {t.trial_id: list(t.history) for t in ordered if t.history}
        if not histories:
            return None
        return plot_gate_entropy(histories, out_dir / "gate_entropy_per_layer.png")
    except ValueError:
        return None  # no gate-entropy metrics in this study (no AutoNorm layer)
    except Exception as exc:
        print(f"gate-entropy plot skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


# --------------------------------------------------------------------------------------------------
# status / report, from the study directory
# --------------------------------------------------------------------------------------------------


def _row(t: TrialRecord, plan: StudyPlan) -> dict[str, Any]:
    from workers.dotted import get_path

    row: dict[str, Any] = {
        "trial": t.trial_id,
        "status": t.status,
        "epoch": t.metrics.get("epoch", t.metrics.get("training_iteration")),
        plan.metric: t.metrics.get(plan.metric),
    }
    for p in plan.space:
        row[p.name] = get_path(t.config, p.name)
    for name, _ in plan.grid:
        row[name] = get_path(t.config, name)
    return row


def status(spec: StudySpec) -> dict[str, Any]:
    """Progress from the study directory (while it runs and after)."""
    from studies.study_dir import StudyDir

    plan = spec.to_plan()
    trials = read_trials(plan, history=False)
    best = best_trial(trials, plan.metric, plan.mode)
    return {
        "study": plan.name,
        "kind": "search",
        "directory": StudyDir.of(spec).uri,
        "expected_trials": expected_trials(plan),
        "trials": len(trials),
        "by_status": dict(Counter(t.status for t in trials)),
        "metric": plan.metric,
        "best_trial": best.trial_id if best else None,
        f"best_{plan.metric}": best.metrics.get(plan.metric) if best else None,
        "rows": [_row(t, plan) for t in trials],
    }


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
    """``report.md`` (+ gate-entropy plot when trials report it) regenerated from the study directory."""
    plan = spec.to_plan()
    trials = read_trials(plan)
    best = best_trial(trials, plan.metric, plan.mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = Counter(t.status for t in trials)
    lines = [
        f"# Study `{plan.name}`",
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
            f"## Best completed trial `{best.trial_id}`: {plan.metric} = {_short(best.metrics[plan.metric])}",
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
    return path
