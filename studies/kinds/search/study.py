"""``kind: search``: an Optuna (or grid) search under Ray Tune, then optionally the AutoNorm claims.

Phases, all under the study's one MLflow run:

1. ``search``: one plan whose Tune experiment *is* the study directory and whose MLflow run is the
   study run (the search trials are its children). The gate entropy per layer is drawn and logged.
2. ``confirm`` (with a ``confirm:`` section): the best COMPLETED search configuration (AutoNorm-S)
   and the baselines (FrozenLN, FrozenDyT, RandomSelector, AutoNorm never frozen) on fresh seeds,
   each arm's η first tuned on held-out seeds around the searched η, then every arm on every
   confirmatory seed at full budget, FIFO. One phase run per arm and step, nested under the study run.
3. ``claims``: :func:`studies.kinds.search.claims.autonorm_claims` on the per-seed paired differences and the
   per-epoch gate logs; ``verdict.json``, ``confirm_trials.csv``, reports and plots in the study
   directory and ``claim/<id>`` tags on the study run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds import StudyOutcome
from studies.kinds.search.claims import CONFIRM_COLUMNS
from studies.kinds.search.spec import CONFIRM_ARMS, StudySpec
from studies.tuning import RunPoints, tune
from workers.plan import StudyPlan, expected_trials
from workers.runner import StudyResult, TrialRecord, best_trial, read_trials
from workers.trainable import CONFIG_RESULT_KEY

__all__ = ["arm_config", "describe_result", "report", "run", "status", "total_trials"]

SPEC = StudySpec


def total_trials(spec: StudySpec) -> int:
    """Search trials plus, with ``confirm:``, every arm's tuning and confirmatory trials."""
    total = expected_trials(spec.to_plan())
    confirm = spec.confirm
    if confirm is not None:
        tuning = confirm.lr_tuning.points * len(confirm.lr_tuning.seeds) if confirm.lr_tuning else 0
        total += len(confirm.arms) * (tuning + len(confirm.seeds))
    return total


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
    planned: Mapping[str, float] | None = None,
) -> StudyOutcome:
    from workers.study import StudyRunner

    plan = dataclasses.replace(spec.to_plan(), run_name="search-{index:03d}")
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
        planned=planned,
        resources=plan.resources,
    ) as runner:
        result = runner.run(plan, phase="search", nested=False)
        png = _gate_entropy_plot(plan, runner.local_dir())
        if png is not None:
            runner.log_outputs(files=[png], artifact_path="plots")
            runner.publish([png])
        summary = describe_result(result, plan)
        files: dict[str, Path] = {"gate_entropy_plot": png} if png is not None else {}
        verdict = None
        if spec.confirm is not None:
            verdict, claim_files = _confirm_and_claims(spec, plan, result, runner)
            files.update(claim_files)
            summary["claims"] = {k: v.get("verdict") for k, v in (verdict.get("claims") or {}).items()}
    return StudyOutcome(
        kind="search",
        name=plan.name,
        study_dir=runner.study_uri,
        tracking_uri=runner.tracking_uri,
        parent_run_id=runner.run_id or result.parent_run_id,
        summary=summary,
        verdict=verdict,
        files=files,
    )


# --------------------------------------------------------------------------------------------------
# confirm and claims
# --------------------------------------------------------------------------------------------------


def arm_config(best: Mapping[str, Any], arm: str) -> dict[str, Any]:
    """The trial config of a confirmatory arm: the best searched configuration with its norm (and
    freezing) replaced; everything else (model size, divergence fix, data, budget) unchanged."""
    cfg = copy.deepcopy(dict(best))
    cfg.pop(CONFIG_RESULT_KEY, None)
    norm = dict(cfg["model"]["norm"])
    candidates = list(norm.get("candidates") or ("dyt", "layernorm"))
    if arm == "autonorm_s":
        return cfg  # the searched AutoNorm-S, freezing rule and all
    cfg["training"]["freeze"] = None
    if arm == "autonorm":
        cfg["model"]["norm"] = norm  # the same gate, never frozen
    elif arm == "frozen_ln":
        cfg["model"]["norm"] = {"type": "layernorm"}
    elif arm == "frozen_dyt":
        cfg["model"]["norm"] = {"type": "dyt"}
    elif arm == "random_selector":
        cfg["model"]["norm"] = {"type": "random_selector", "candidates": candidates}
    else:
        raise ValueError(f"unknown confirmatory arm {arm!r}; valid: {', '.join(CONFIRM_ARMS)}")
    return cfg


def _grid_plan(
    plan: StudyPlan,
    *,
    name: str,
    base: Mapping[str, Any],
    grid: Any,
    max_concurrent: int,
    arm: str,
    run_name: str,
) -> StudyPlan:
    from workers.plan import SamplerConfig, SchedulerConfig

    return dataclasses.replace(
        plan,
        name=name,
        run_name=run_name,
        tags=(*plan.tags, ("autonorm.arm", arm)),
        base_config=copy.deepcopy(dict(base)),
        space=(),
        grid=tuple(grid),
        sampler=SamplerConfig(type="grid"),
        scheduler=SchedulerConfig(type="fifo"),
        num_samples=1,
        max_concurrent=max_concurrent,
    )


def tune_arm_lr(
    confirm: Any,
    arm: str,
    searched_lr: float,
    trials: Sequence[TrialRecord],
    *,
    metric: str,
    mode: str,
    run_points: RunPoints | None,
) -> dict[str, Any]:
    """An arm's η from its ``confirm-tune-<arm>`` trials (:func:`studies.tuning.tune`): the best mean
    ``metric`` over tuning seeds, the grid around the searched η extended through ``run_points``
    when the winner sits on its edge."""
    records, _ = tune(
        {arm: confirm.lr_tuning.lr_grid(searched_lr)},
        trials,
        cell_of=lambda t: arm,
        metric=metric,
        mode="max" if mode == "max" else "min",
        max_extensions=confirm.lr_tuning.max_extensions,
        run_points=run_points,
    )
    return records[arm]


def _confirm_and_claims(
    spec: StudySpec, plan: StudyPlan, result: StudyResult, runner: Any
) -> tuple[dict[str, Any], dict[str, Path]]:
    from studies.kinds.search.report import write_claims_report

    confirm = spec.confirm
    assert confirm is not None
    data_kind = _data_kind(spec)
    best = result.best(plan.metric, plan.mode)
    slots = confirm.max_concurrent or plan.max_concurrent
    tuned: dict[str, Any] = {}
    run_ids: dict[str, str] = {}
    if best is None:
        print(f"[{spec.name}] no completed search trial: the confirmatory phase cannot run", flush=True)
    else:
        searched_lr = float(best.config["training"]["lr"])
        for arm in confirm.arms:
            base = arm_config(best.config, arm)
            lr = searched_lr
            if confirm.lr_tuning is not None:
                tune = confirm.lr_tuning
                tune_base = copy.deepcopy(base)
                if tune.epochs is not None:
                    tune_base["training"]["epochs"] = tune.epochs
                tplan = _grid_plan(
                    plan,
                    name=f"confirm-tune-{arm}",
                    base=tune_base,
                    grid=(("training.lr", tune.grid(searched_lr)), ("seed", tuple(tune.seeds))),
                    max_concurrent=slots,
                    arm=arm,
                    run_name=f"{arm}-lr{{training.lr:.3g}}-s{{seed}}",
                )

                def run_points(
                    round_: int, lrs: Mapping[str, float], arm: str = arm, base: Any = tune_base
                ) -> Any:
                    eplan = _grid_plan(
                        plan,
                        name=f"confirm-tune-{arm}-ext{round_}",
                        base=base,
                        grid=(("training.lr", (lrs[arm],)), ("seed", tuple(confirm.lr_tuning.seeds))),  # type: ignore[union-attr]
                        max_concurrent=slots,
                        arm=arm,
                        run_name=f"{arm}-lr{{training.lr:.3g}}-s{{seed}}",
                    )
                    runner.set_expected_trials(runner.expected_trials + len(confirm.lr_tuning.seeds))  # type: ignore[union-attr]
                    print(f"[{spec.name}] {arm}: lr range extension {round_}: lr={lrs[arm]:g}", flush=True)
                    return runner.run(eplan, phase=f"confirm-lr-ext{round_}").trials

                record = tune_arm_lr(
                    confirm,
                    arm,
                    searched_lr,
                    runner.run(tplan, phase="confirm-lr").trials,
                    metric=plan.metric,
                    mode=plan.mode,
                    run_points=run_points,
                )
                tuned[arm] = record
                lr = searched_lr if record["no_learning_rate_trained"] else float(record["lr"])
            base["training"]["lr"] = lr
            cplan = _grid_plan(
                plan,
                name=f"confirm-{arm}",
                base=base,
                grid=(("seed", tuple(confirm.seeds)),),
                max_concurrent=slots,
                arm=arm,
                run_name=f"{arm}-s{{seed}}",
            )
            confirmed = runner.run(cplan, phase="confirm")
            run_ids.update({t.trial_id: t.mlflow_run_id for t in confirmed.trials if t.mlflow_run_id})
    table, gate_logs, claims = _claims(spec, run_ids)
    gate_lr_edges(claims, tuned)
    if best is None:
        for claim in claims.values():
            claim["verdict"] = "inconclusive"
            claim.setdefault("reasons", []).append("no completed search trial")
    cpu_h, gpu_h = runner.resource_hours()
    out_dir = runner.local_dir()
    files = write_claims_report(
        claims,
        table,
        gate_logs,
        out_dir,
        title=f"AutoNorm claims: {spec.name}",
        protocol=spec.to_document(),
        data_kind=data_kind,
        best_config=best.config if best is not None else None,
        tuned_lr=tuned,
        wall_time_s=runner.wall_time_s,
        cpu_hours=cpu_h,
        gpu_hours=gpu_h,
    )
    runner.publish(files.values())
    tags = {f"claim/{cid}": str(c.get("verdict")) for cid, c in claims.items()}
    metrics = {
        f"{key}/{cid}": float(c[key])
        for cid, c in claims.items()
        for key in ("estimate", "p_value", "p_value_holm")
        if isinstance(c.get(key), int | float) and math.isfinite(float(c[key]))
    }
    runner.log_outputs(files=files.values(), tags=tags, metrics=metrics)
    for cid, c in claims.items():
        reasons = "; ".join(str(r) for r in c.get("reasons") or [])
        print(
            f"[{spec.name}] claim {cid}: {c.get('verdict')} (estimate {c.get('estimate')}, CI {c.get('ci')}, "
            f"p_holm {c.get('p_value_holm')}) {reasons}",
            flush=True,
        )
    verdict = {"claims": claims, "data_kind": data_kind, "tuned_lr": tuned}
    return verdict, dict(files)


def _confirm_table(
    spec: StudySpec, run_ids: Mapping[str, str]
) -> tuple[Any, dict[tuple[str, Any], list[dict[str, Any]]]]:
    """One row per confirmatory trial and the per-epoch logs per (arm, seed), read from the study
    directory (so ``report`` rebuilds exactly what ``run`` analysed)."""
    import pandas as pd

    from studies.study_dir import StudyDir

    assert spec.confirm is not None
    where = StudyDir.of(spec)
    rows: list[dict[str, Any]] = []
    gate_logs: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for arm in spec.confirm.arms:
        for t in read_trials(where.phase_plan(f"confirm-{arm}"), history=True):
            seed = int(t.config.get("seed", 0))
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "status": t.status,
                    "test_accuracy": t.metrics.get("test_accuracy"),
                    "val_accuracy": t.metrics.get("val_accuracy"),
                    "train_loss": t.metrics.get("train_loss"),
                    "lr": t.config["training"]["lr"],
                    "trial_id": t.trial_id,
                    "mlflow_run_id": run_ids.get(t.trial_id),
                    "test_loss": t.metrics.get("test_loss"),
                }
            )
            if t.history:
                gate_logs[(arm, seed)] = [dict(h) for h in t.history]
    return pd.DataFrame(rows, columns=[*CONFIRM_COLUMNS, "test_loss"]), gate_logs


#: The arms each claim compares; c and d describe the unfrozen gate.
CLAIM_ARMS = {
    "a": ("random_selector", "autonorm"),
    "b": ("autonorm_s", "autonorm"),
    "e": ("autonorm_s", "frozen_ln"),
    "c": ("autonorm",),
    "c_attn": ("autonorm",),
    "c_mlp": ("autonorm",),
    "d": ("autonorm",),
}


def gate_lr_edges(claims: dict[str, Any], tuned: Mapping[str, Any]) -> None:
    """A claim about an arm whose tuned η sits on the edge of its grid is not decided: the arm's best
    η may lie outside the range, so the comparison may be between a tuned and an under-tuned arm.
    Its verdict becomes ``inconclusive`` with reason ``lr-at-range-edge (<arm>)`` (in place)."""
    for cid, claim in claims.items():
        edges = [a for a in CLAIM_ARMS.get(cid, ()) if (tuned.get(a) or {}).get("at_range_edge")]
        if not edges or any("not applicable" in str(r) for r in claim.get("reasons") or []):
            continue
        claim.setdefault("reasons", []).extend(f"lr-at-range-edge ({arm})" for arm in edges)
        if claim.get("verdict") in ("supported", "refuted"):
            claim["verdict_before_lr_gate"] = claim["verdict"]
            claim["verdict"] = "inconclusive"


def _data_kind(spec: StudySpec) -> str:
    from studies.kinds.search.spec import data_kind_of

    assert spec.confirm is not None
    return spec.confirm.data_kind if spec.confirm.data_kind != "auto" else data_kind_of(spec.data.type)


def _claims(
    spec: StudySpec, run_ids: Mapping[str, str]
) -> tuple[Any, dict[tuple[str, Any], list[dict[str, Any]]], dict[str, Any]]:
    """The confirmatory trials from the study directory and the claims computed on them."""
    from studies.kinds.search.claims import autonorm_claims

    confirm = spec.confirm
    assert confirm is not None
    table, gate_logs = _confirm_table(spec, run_ids)
    claims = autonorm_claims(
        table,
        gate_logs,
        data_kind=_data_kind(spec),  # type: ignore[arg-type]
        min_seeds=confirm.min_seeds,
        alpha=confirm.alpha,
        eps=confirm.eps,
        metric=confirm.metric,
        chance=_chance(spec),
    )
    return table, gate_logs, claims


def _chance(spec: StudySpec) -> float | None:
    from autonorm_core.data import class_count

    c = class_count(spec.data.type)
    return 1.0 / c if c else None


def _gate_entropy_plot(plan: StudyPlan, out_dir: Path) -> Path | None:
    """Gate entropy per layer over epochs, best trial first; ``None`` when no trial logged a gate.

    A plotting failure must not turn a finished study into a failed one: it is reported on stderr.
    """
    try:
        from studies.kinds.batchsize.report import plot_gate_entropy

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
    import json

    from studies.study_dir import StudyDir

    plan = spec.to_plan()
    where = StudyDir.of(spec)
    trials = read_trials(plan, history=False)
    best = best_trial(trials, plan.metric, plan.mode)
    out: dict[str, Any] = {
        "study": plan.name,
        "kind": "search",
        "directory": where.uri,
        "expected_trials": total_trials(spec),
        "trials": len(trials),
        "by_status": dict(Counter(t.status for t in trials)),
        "metric": plan.metric,
        "best_trial": best.trial_id if best else None,
        f"best_{plan.metric}": best.metrics.get(plan.metric) if best else None,
        "rows": [_row(t, plan) for t in trials],
    }
    if spec.confirm is not None:
        phases = {"search": {"trials": len(trials), "by_status": dict(Counter(t.status for t in trials))}}
        counts: Counter[str] = Counter(t.status for t in trials)
        rounds = spec.confirm.lr_tuning.max_extensions if spec.confirm.lr_tuning else 0
        extended = 0
        for arm in spec.confirm.arms:
            names = [f"confirm-tune-{arm}", *(f"confirm-tune-{arm}-ext{k}" for k in range(1, rounds + 1))]
            for name in [*names, f"confirm-{arm}"]:
                ts = read_trials(where.phase_plan(name), history=False)
                if "-ext" in name:
                    if not ts:  # an extension round that never ran is not a phase
                        continue
                    extended += len(ts)
                phases[name] = {"trials": len(ts), "by_status": dict(Counter(t.status for t in ts))}
                counts.update(t.status for t in ts)
        out["expected_trials"] = total_trials(spec) + extended
        out["phases"] = phases
        out["trials"] = sum(counts.values())
        out["by_status"] = dict(counts)
        text = where.read_text("verdict.json")
        if text:
            out["claims"] = {k: v.get("verdict") for k, v in (json.loads(text).get("claims") or {}).items()}
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
    if spec.confirm is not None:
        _claims_report(spec, plan, trials, out_dir / "claims")
    return path


def _claims_report(spec: StudySpec, plan: StudyPlan, trials: Sequence[TrialRecord], out_dir: Path) -> Path:
    """The claims re-analysed from the confirmatory phases in the study directory."""
    from studies.kinds.search.report import write_claims_report
    from studies.study_dir import StudyDir

    confirm = spec.confirm
    assert confirm is not None
    data_kind = _data_kind(spec)
    table, gate_logs, claims = _claims(spec, {})
    tuned: dict[str, Any] = {}
    if confirm.lr_tuning is not None:
        where = StudyDir.of(spec)
        best_lr = best_trial(trials, plan.metric, plan.mode)
        for arm in confirm.arms:
            if best_lr is None:
                continue

            def read_points(round_: int, lrs: Mapping[str, float], arm: str = arm) -> Any:
                return read_trials(where.phase_plan(f"confirm-tune-{arm}-ext{round_}"), history=False)

            tuned[arm] = tune_arm_lr(
                confirm,
                arm,
                float(best_lr.config["training"]["lr"]),
                read_trials(where.phase_plan(f"confirm-tune-{arm}")),
                metric=plan.metric,
                mode=plan.mode,
                run_points=read_points,
            )
    gate_lr_edges(claims, tuned)
    best = best_trial(trials, plan.metric, plan.mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_claims_report(
        claims,
        table,
        gate_logs,
        out_dir,
        title=f"AutoNorm claims: {spec.name}",
        protocol=spec.to_document(),
        data_kind=data_kind,
        best_config=best.config if best else None,
        tuned_lr=tuned,
    )
    return files.get("markdown", out_dir / "report.md")
