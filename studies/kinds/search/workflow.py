"""``kind: search``: an Optuna (or grid) search under Ray Tune, then optionally the AutoNorm claims.

Phases (:mod:`studies.kinds.search.kind`), each in its own folder with its own phase run nested
under the study run:

1. ``search``: the search; the gate entropy per layer is drawn and logged.
2. With a ``confirm:`` section: the best COMPLETED search configuration (AutoNorm-S) and the
   baselines (FrozenLN, FrozenDyT, RandomSelector, AutoNorm never frozen) on fresh seeds, each arm's
   η first tuned on held-out seeds around the searched η (``confirm-tune-<arm>``), then every arm on
   every confirmatory seed at full budget, FIFO (``confirm-<arm>``).
3. Analysis: :func:`studies.kinds.search.claims.autonorm_claims` on the per-seed paired differences
   and the per-epoch gate logs; ``verdict.json``, ``confirm_trials.csv``, reports and plots in the
   study directory and ``claim/<id>`` tags on the study run. Without ``confirm:`` the
   ``verdict.json`` says ``study_verdict: none`` and names the best trial.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.contract import StudyOutcome
from studies.kinds.analysis_inputs import chance_levels, sequential_design
from studies.kinds.looks import ArmLooks, n_looks, run_looks
from studies.kinds.outcome import hypothesis_entry, run_outcome
from studies.kinds.printing import interval, probability, say, signed
from studies.kinds.search.adequacy import (
    adequacy_record,
    adequacy_rule,
    checked_arms,
    gate_claims,
    measure,
)
from studies.kinds.search.claims import CONFIRM_COLUMNS
from studies.kinds.search.design import CLAIM_ARMS, FROZEN_COLUMN, design_fields, gate_lr_edges, gate_lr_noisy
from studies.kinds.search.plans import (
    arm_config,
    check_plan,
    confirm_plan,
    extension_plan,
    look_plan_name,
    refine_plan,
    search_plan,
    tune_plan,
)
from studies.kinds.search.plans import (
    phases as planned_phases,
)
from studies.kinds.search.power import pilot
from studies.kinds.search.spec import StudySpec
from studies.kinds.search.values import claim_metrics
from studies.kinds.study_runner import extension_runner, refine_runner, study_runner
from studies.reporting import estimate_name, with_study_cost, write_json
from studies.scope import scope_line, scope_tags
from studies.tuning import RefinePoints, RunPoints, tune
from workers.plan import StudyPlan
from workers.records import StudyResult, TrialRecord, best_trial
from workers.results import read_histories, read_trials

__all__ = [
    "CLAIM_ARMS",
    "analyse",
    "arm_config",
    "confirm_table",
    "describe_result",
    "gate_lr_edges",
    "pilot",
    "run",
    "total_trials",
]

SPEC = StudySpec


def total_trials(spec: StudySpec) -> int:
    """Search trials plus, with ``confirm:``, every arm's tuning and confirmatory trials."""
    return sum(len(p.configs) for p in planned_phases(spec) if not p.optional)


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


def run(spec: StudySpec, **runner_options: Any) -> StudyOutcome:
    """Run the search and, with ``confirm:``, the confirmatory phases and the claims; idempotent (a
    rerun resumes). ``runner_options``: :data:`studies.kinds.study_runner.RUNNER_OPTIONS`."""
    study = spec.to_plan()
    plan = search_plan(spec)
    with study_runner(study, expected_trials=total_trials(spec), **runner_options) as runner:
        result = runner.run(plan)
        png = _gate_entropy_plot(runner.phase_plan(plan), runner.local_dir())
        if png is not None:
            runner.log_outputs(files=[png], artifact_path="plots")
            runner.publish([png])
        summary = describe_result(result, plan)
        summary["study"] = study.name
        files: dict[str, Path] = {"gate_entropy_plot": png} if png is not None else {}
        if spec.confirm is not None:
            verdict, claim_files = _confirm_and_claims(spec, plan, result, runner)
            files.update(claim_files)
            summary["claims"] = {k: v.get("verdict") for k, v in (verdict.get("claims") or {}).items()}
        else:
            verdict = analyse(None, spec, best=result.best(plan.metric, plan.mode), metric=plan.metric)
            verdict["scope"] = _search_scope(result.trials, plan.metric, gpu_hours=runner.resource_hours()[1])
            path = runner.local_dir() / "verdict.json"
            write_json(path, with_study_cost(verdict))
            files["verdict"] = path
            runner.publish([path])
            runner.log_outputs(
                files=[path],
                tags={"verdict/study": str(verdict["study_verdict"]), **scope_tags(verdict["scope"])},
            )
        summary["study_verdict"] = verdict["study_verdict"]
    parent = runner.run_id or result.parent_run_id
    return run_outcome(spec, runner, parent_run_id=parent, summary=summary, verdict=verdict, files=files)


#: The claims that make up the AutoNorm paper's main claim (where they apply to the data).
MAIN_CLAIMS = ("a", "b")


def study_verdict_of(claims: Mapping[str, Mapping[str, Any]]) -> str:
    """The paper's main claim: (a) and (b) together where both apply (on text, where (a) does not
    apply, (b) alone): ``supported`` when all that apply are, ``refuted`` when any is, else
    ``inconclusive`` (also when none applies)."""
    verdicts = [
        str(claims[c].get("verdict"))
        for c in MAIN_CLAIMS
        if c in claims and not any("not applicable" in str(r) for r in claims[c].get("reasons") or [])
    ]
    if verdicts and all(v == "supported" for v in verdicts):
        return "supported"
    if "refuted" in verdicts:
        return "refuted"
    return "inconclusive"


def analyse(table: Any, spec: StudySpec, **inputs: Any) -> dict[str, Any]:
    """The ``verdict.json`` dictionary.

    With ``confirm:``: ``table`` is the confirmatory table (:func:`confirm_table`), ``inputs`` carry
    ``gate_logs`` (per-epoch logs per (arm, seed)), ``tuned`` (each arm's lr-tuning record),
    ``searched`` (``False`` when no search trial completed) and ``adequacy`` (the training-adequacy
    check's entry per arm, :func:`studies.kinds.search.adequacy.measure`; absent: not measured); the
    claims, each gated for an η at its grid's edge and for an arm it rests on that did not pass the
    check (:func:`studies.kinds.search.adequacy.gate_claims`), each listing its ``arms``, and the
    study verdict (:func:`study_verdict_of`). Without: ``study_verdict: none``
    and the best search trial (``inputs["best"]``, ``inputs["metric"]``).
    """
    if spec.confirm is None:
        best = inputs.get("best")
        metric = inputs.get("metric") or spec.search.metric
        return {
            "kind": spec.kind,
            "study_verdict": "none",
            "hypotheses": {},
            "metric": metric,
            "best_trial_id": best.trial_id if best is not None else None,
            "best_metric": best.metrics.get(metric) if best is not None else None,
            "best_params": dict(best.params) if best is not None else None,
        }
    from studies.kinds.search.claims import autonorm_claims

    confirm = spec.confirm
    claims = autonorm_claims(
        table,
        inputs.get("gate_logs") or {},
        data_kind=_data_kind(spec),  # type: ignore[arg-type]
        min_seeds=confirm.min_seeds,
        alpha=confirm.alpha,
        eps=confirm.eps,
        metric=confirm.metric,
        chance=_chance(spec),
        sequential=sequential_design(spec.sequential, confirm.seeds),
    )
    sequential = _sequential_fields(spec, claims.pop("_looks", None), trials_run=len(table))
    gate_lr_edges(claims, inputs.get("tuned") or {})
    gate_lr_noisy(claims, inputs.get("tuned") or {})
    checks = adequacy_record(spec, inputs.get("adequacy"))
    gate_claims(claims, checks)
    if not inputs.get("searched", True):
        for claim in claims.values():
            claim["verdict"] = "inconclusive"
            claim.setdefault("reasons", []).append("no completed search trial")
    return {
        "kind": spec.kind,
        "study_verdict": study_verdict_of(claims),
        "hypotheses": {cid: {**hypothesis_entry(c), "arms": list(c["arms"])} for cid, c in claims.items()},
        "claims": claims,
        "data_kind": _data_kind(spec),
        **design_fields(spec, table, inputs.get("gate_logs") or {}),
        **(sequential or {}),
        "adequacy": checks,
        "adequacy_rule": adequacy_rule(spec),
    }


def _sequential_fields(
    spec: StudySpec, looks: Any, *, trials_run: int | None = None
) -> dict[str, Any] | None:
    """``looks``, ``seeds_used``, ``max_seeds``, ``trials_saved`` of a sequential claims study
    (``trials_run``: the confirmatory trials its table holds; arms stop at different looks)."""
    if spec.sequential is None or spec.confirm is None:
        return None
    from studies.sequential import sequential_fields

    return sequential_fields(
        looks or [],
        spec.confirm.seeds,
        max_seeds=spec.sequential.max_seeds,
        trials_per_seed=len(spec.confirm.arms),
        trials_run=trials_run,
    )


def _sequential_of(verdict: Mapping[str, Any]) -> dict[str, Any] | None:
    keys = ("looks", "seeds_used", "max_seeds", "trials_saved")
    return {k: verdict[k] for k in keys} if "looks" in verdict else None


# --------------------------------------------------------------------------------------------------
# confirm and claims
# --------------------------------------------------------------------------------------------------


def tune_arm_lr(
    confirm: Any,
    arm: str,
    searched_lr: float,
    trials: Sequence[TrialRecord],
    *,
    metric: str,
    mode: str,
    run_points: RunPoints | None,
    run_refine: RefinePoints | None = None,
) -> dict[str, Any]:
    """An arm's η from its ``confirm-tune-<arm>`` trials (:func:`studies.tuning.tune`): the best mean
    ``metric`` over tuning seeds, the grid around the searched η extended through ``run_points``
    when the winner sits on its edge, an interior winner refined through ``run_refine``."""
    records, _ = tune(
        {arm: confirm.lr_tuning.lr_grid(searched_lr)},
        trials,
        cell_of=lambda t: arm,
        metric=metric,
        mode="max" if mode == "max" else "min",
        max_extensions=confirm.lr_tuning.max_extensions,
        run_points=run_points,
        refine=confirm.lr_tuning.refine,
        run_refine=run_refine,
    )
    return records[arm]


def _tuning_trials(spec: StudySpec, arm: str) -> list[TrialRecord]:
    """The arm's tuning trials (``confirm-tune-<arm>``, its extension rounds and refinement), read
    from the study directory: the training-adequacy check's 1x runs where it reuses them."""
    from studies.study_dir import StudyDir

    assert spec.confirm is not None
    tune = spec.confirm.lr_tuning
    if tune is None:
        return []
    where = StudyDir.of(spec)
    names = [
        f"confirm-tune-{arm}",
        *(f"confirm-tune-{arm}-ext{k}" for k in range(1, tune.max_extensions + 1)),
        f"confirm-tune-{arm}-refine",
    ]
    return [t for name in names for t in read_trials(where.phase_plan(name), history=False)]


def _run_check(
    spec: StudySpec, plan: StudyPlan, runner: Any, base: Mapping[str, Any], arm: str
) -> dict[str, Any] | str:
    """The arm's training-adequacy check (phase ``confirm-tune-<arm>-adequacy``,
    :mod:`studies.kinds.search.adequacy`) at its confirmed configuration ``base``: its entry (every
    arm's printed in one line, :func:`_checks_line`)."""
    cplan = check_plan(spec, plan, base, arm)
    lr = float(base["training"]["lr"])
    return measure(spec, arm, lr, runner.run(cplan).trials, _tuning_trials(spec, arm))


def _checks_line(checks: Mapping[str, Any]) -> str:
    """The training-adequacy check of every checked arm in one line: the arms that passed, then the
    under-trained ones, each with what it reached and its gain at twice the budget (or its floor)."""
    from studies.adequacy import FACTOR

    passed = [arm for arm, e in checks.items() if isinstance(e, Mapping) and e.get("passed")]
    parts = [f"{', '.join(passed)} passed"] if passed else []
    under = []
    for arm, e in checks.items():
        if arm in passed:
            continue
        if not isinstance(e, Mapping):
            parts.append(f"{arm} {e}")
        elif _finite(e.get("reached")) and _finite(e.get("gain")):
            under.append(f"{arm} reached {e['reached']:.4f}, {signed(e['gain'])}")
        else:  # below the metric's floor, or nothing reached: its reason says which
            under.append(str(e.get("reason") or arm).removeprefix("under-trained: "))
    if under:
        parts.append(f"under-trained (gain at {FACTOR}x): " + "; ".join(under))
    return f"training adequacy ({FACTOR}x the budget): " + "; ".join(parts)


def _claim_lines(spec: StudySpec, verdict: Mapping[str, Any]) -> list[str]:
    """The printed verdict (the batch-size kind's form): the study's (the paper's main claim), then
    one line per claim: its verdict, its labelled estimate with its interval, its Holm p-value and its
    reasons; the claims not applicable to the data in one line."""
    claims = verdict.get("claims") or {}
    main = [c for c in MAIN_CLAIMS if c in claims and not _not_applicable(claims[c])]
    lines = [
        f"STUDY VERDICT: {verdict.get('study_verdict')}  (the paper's main claim: {' and '.join(main) or 'none applies'})"
    ]
    skipped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for cid, c in claims.items():
        reasons = tuple(_short(str(r)) for r in c.get("reasons") or [])
        if _not_applicable(c):
            skipped.setdefault((str(c.get("verdict")), reasons), []).append(cid)
            continue
        numbers = ""
        if _finite(c.get("estimate")):
            numbers = f"  {estimate_name('search', cid)}={signed(c.get('estimate'))} {interval(c.get('ci'))}"
        if _finite(c.get("p_value_holm")):
            numbers += f" p_holm={probability(c.get('p_value_holm'))}"
        elif _finite(c.get("p_value")):  # a claim tested alone (c, d, a reported e): its own p
            numbers += f"{'' if numbers else ' '} p={probability(c.get('p_value'))}"
        why = f" ({'; '.join(reasons)})" if reasons else ""
        lines.append(f"  {cid}: {c.get('verdict')}{numbers}{why}")
    for (label, reasons), ids in skipped.items():
        lines.append(f"  {', '.join(ids)}: {label} ({'; '.join(reasons)})")
    return lines


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _short(reason: str) -> str:
    """A claim's reason as its printed line shows it: an under-trained arm by name (the adequacy
    line above it has its numbers); any other reason as it is."""
    if reason.startswith("under-trained: "):
        return f"{reason.split()[1]} under-trained"
    return reason


def _not_applicable(claim: Mapping[str, Any]) -> bool:
    return any("not applicable" in str(r) for r in claim.get("reasons") or [])


def _stored_checks(spec: StudySpec, tuned: Mapping[str, Any], searched_lr: float | None) -> dict[str, Any]:
    """The training-adequacy check read back from the study directory (``report``): each checked
    arm's entry at the η it was confirmed at."""
    from studies.kinds.search.adequacy import phase_of
    from studies.study_dir import StudyDir

    where = StudyDir.of(spec)
    out: dict[str, Any] = {}
    for arm in checked_arms(spec):
        trials = read_trials(where.phase_plan(phase_of(arm)), history=False)
        if not trials:
            continue
        record = tuned.get(arm)
        if record is not None and not record.get("no_learning_rate_trained"):
            lr = float(record["lr"])
        elif searched_lr is not None:
            lr = searched_lr
        else:
            continue
        out[arm] = measure(spec, arm, lr, trials, _tuning_trials(spec, arm))
    return out


_EPOCH_SUMMARY_METRICS = ("test_accuracy", "val_accuracy", "train_loss")


def _log_epoch_summaries(runner: Any, phase: str, arm: str) -> None:
    """Under the arm's confirmatory phase run, the arm's summary run: each metric's mean over seeds
    and t-interval at step = epoch (MLflow draws one line per arm against the epoch when the
    confirmatory summary runs are selected)."""
    import pandas as pd

    from studies.summaries import arm_summaries

    ran = [p for name, p, _ in runner.results if name == phase]
    if not ran:
        return
    rows = [
        {
            "arm": arm,
            "seed": t.config.get("seed"),
            "epoch": int(h["epoch"]),
            **{k: h.get(k) for k in _EPOCH_SUMMARY_METRICS},
        }
        for t in read_trials(ran[-1], history=True)
        for h in t.history
        if isinstance(h.get("epoch"), int | float) and math.isfinite(float(h["epoch"]))
    ]
    table = pd.DataFrame(rows)
    if table.empty:
        return
    table = table.drop_duplicates(["seed", "epoch"], keep="last")  # an epoch a restarted trial repeated
    metrics = [m for m in _EPOCH_SUMMARY_METRICS if table[m].notna().any()]
    runner.log_summaries(phase, arm_summaries(table, metrics=metrics, axis="epoch"))


def _confirm_arm(
    spec: StudySpec,
    plan: StudyPlan,
    runner: Any,
    base: Mapping[str, Any],
    arm: str,
    run_ids: dict[str, str],
    *,
    look: int = 1,
) -> None:
    """The arm's confirmatory phase (``look``: of a sequential design) at its confirmed configuration
    ``base``, its summary run logged under the phase run; its trials' MLflow run ids into ``run_ids``."""
    confirmed = runner.run(confirm_plan(spec, plan, base, arm, look=look))
    _log_epoch_summaries(runner, look_plan_name(arm, look), arm)
    run_ids.update({t.trial_id: t.mlflow_run_id for t in confirmed.trials if t.mlflow_run_id})


def _claims_so_far(spec: StudySpec, run_ids: Mapping[str, str], tuned: Mapping[str, Any]) -> dict[str, Any]:
    """The claims on the confirmatory trials run so far (the tuning's edge gates applied)."""
    table, gate_logs = confirm_table(spec, run_ids)
    return analyse(table, spec, gate_logs=gate_logs, tuned=tuned)


def _confirm_and_claims(
    spec: StudySpec, plan: StudyPlan, result: StudyResult, runner: Any
) -> tuple[dict[str, Any], dict[str, Path]]:

    confirm = spec.confirm
    assert confirm is not None
    best = result.best(plan.metric, plan.mode)
    tuned: dict[str, Any] = {}
    run_ids: dict[str, str] = {}
    bases: dict[str, dict[str, Any]] = {}
    checks: dict[str, Any] = {}
    checked = checked_arms(spec)
    if best is None:
        say(spec.name, "no completed search trial: the confirmatory phase cannot run")
    else:
        searched_lr = float(best.config["training"]["lr"])
        for arm in confirm.arms:
            base = arm_config(best.config, arm, confirm.freeze)
            lr = searched_lr
            if confirm.lr_tuning is not None:
                tplan = tune_plan(spec, plan, base, arm, searched_lr)

                def plan_of(
                    round_: int, lrs: Mapping[str, float], arm: str = arm, base: Any = base
                ) -> StudyPlan:
                    return extension_plan(spec, plan, base, arm, round_, lrs[arm])

                def line(round_: int, lrs: Mapping[str, float], arm: str = arm) -> str:
                    return f"{arm}: lr range extension {round_}: lr={lrs[arm]:g}"

                def refine_of(
                    lrs: Mapping[str, Sequence[float]], arm: str = arm, base: Any = base
                ) -> StudyPlan:
                    return refine_plan(spec, plan, base, arm, lrs[arm])

                run_points = extension_runner(
                    runner, plan_of, seeds=len(confirm.lr_tuning.seeds), line=line, tag=spec.name
                )
                record = tune_arm_lr(
                    confirm,
                    arm,
                    searched_lr,
                    runner.run(tplan).trials,
                    metric=plan.metric,
                    mode=plan.mode,
                    run_points=run_points,
                    run_refine=refine_runner(
                        runner, refine_of, seeds=len(confirm.lr_tuning.seeds), tag=spec.name
                    ),
                )
                tuned[arm] = record
                lr = searched_lr if record["no_learning_rate_trained"] else float(record["lr"])
            base["training"]["lr"] = lr
            bases[arm] = base
            if arm in checked:
                checks[arm] = _run_check(spec, plan, runner, base, arm)
            if spec.sequential is None:
                _confirm_arm(spec, plan, runner, base, arm, run_ids)
        if checks:
            say(spec.name, _checks_line(checks))
        if spec.sequential is not None:
            from studies.adequacy import failed_cells
            from studies.kinds.search.claims import arms_needed

            # A claim on an arm that failed the check ends inconclusive whatever its seeds show: such
            # an arm gets no seeds after the first look (arms_needed counts its claims as decided).
            under = [arm for arm in checks if failed_cells(checks, [arm])]
            if under:
                say(
                    spec.name,
                    f"{', '.join(under)} under-trained: the claims on them end inconclusive whatever "
                    "the seeds, so they take no seeds after the first look",
                )
            looks = ArmLooks(
                spec,
                [arm for arm in confirm.arms if arm in bases],
                run_arm=lambda arm, j: _confirm_arm(spec, plan, runner, bases[arm], arm, run_ids, look=j),
                analyse=lambda: _claims_so_far(spec, run_ids, tuned),
                needed=lambda hypotheses, arms: arms_needed(hypotheses, arms, under_trained=under),
                phase_of=look_plan_name,
                noun="claim",
            )
            run_looks(looks, sequential=spec.sequential, seeds=confirm.seeds, runner=runner, tag=spec.name)
    table, gate_logs = confirm_table(spec, run_ids)
    verdict = analyse(
        table, spec, gate_logs=gate_logs, tuned=tuned, searched=best is not None, adequacy=checks
    )
    claims = verdict["claims"]
    cpu_h, gpu_h = runner.resource_hours()
    out_dir = runner.local_dir()
    files = _write_claims(
        spec, verdict, table, gate_logs, out_dir, best, tuned, (runner.wall_time_s, cpu_h, gpu_h)
    )
    runner.publish(files.values())
    tags = {f"claim/{cid}": str(c.get("verdict")) for cid, c in claims.items()}
    tags["verdict/study"] = str(verdict["study_verdict"])
    tags.update(scope_tags(verdict.get("scope")))
    runner.log_outputs(files=files.values(), tags=tags, metrics=claim_metrics(claims))
    lines = _claim_lines(spec, verdict)
    say(spec.name, lines[0])
    say(spec.name, f"scope: {scope_line(verdict.get('scope'))}")
    for text in lines[1:]:
        say(spec.name, text)
    verdict["tuned_lr"] = tuned
    return verdict, dict(files)


def _write_claims(
    spec: StudySpec,
    verdict: dict[str, Any],
    table: Any,
    gate_logs: Mapping[tuple[str, Any], Any],
    out_dir: Path,
    best: TrialRecord | None,
    tuned: Mapping[str, Any],
    spent: tuple[float, float, float] = (math.nan, math.nan, math.nan),
) -> dict[str, Path]:
    """The claims report files (:func:`studies.kinds.search.report.write_claims_report`), the
    verdict's ``scope`` (:mod:`studies.scope`, from the confirmatory trials) set first; ``spent``:
    wall time (s), CPU hours, GPU hours."""
    from studies.kinds.search.report import write_claims_report
    from studies.scope import study_scope
    from studies.study_dir import StudyDir

    assert spec.confirm is not None
    where = StudyDir.of(spec)
    configs = [
        t.config
        for arm in spec.confirm.arms
        for j in range(1, n_looks(spec) + 1)
        for t in read_trials(where.phase_plan(look_plan_name(arm, j)), history=False)
    ]
    verdict["scope"] = study_scope(configs, table, metric=spec.confirm.metric, gpu_hours=spent[2])
    files = write_claims_report(
        verdict["claims"],
        table,
        gate_logs,
        out_dir,
        title=f"AutoNorm claims: {spec.name}",
        protocol=spec.to_document(),
        data_kind=verdict["data_kind"],
        best_config=best.config if best is not None else None,
        tuned_lr=tuned,
        wall_time_s=spent[0],
        cpu_hours=spent[1],
        gpu_hours=spent[2],
        shared={k: verdict[k] for k in SHARED if k in verdict},
        sequential=_sequential_of(verdict),
    )
    from studies.plots import write_study_plots

    trials = [
        (arm, t)
        for arm in spec.confirm.arms
        for j in range(1, n_looks(spec) + 1)
        for t in read_trials(where.phase_plan(look_plan_name(arm, j)), history=True)
    ]
    plots = write_study_plots(
        {"": tuned}, trials, out_dir, metric=spec.search.metric, report=files.get("markdown")
    )
    return {**files, **plots}


SHARED = (
    "kind",
    "study_verdict",
    "hypotheses",
    "scope",
    "freeze",
    "reported_arms",
    "adequacy",
    "adequacy_rule",
)
"""The analysis's fields the claims report writes into ``verdict.json`` (beside its own)."""


def _search_scope(trials: Sequence[TrialRecord], metric: str, *, gpu_hours: float = 0.0) -> dict[str, Any]:
    """A search without ``confirm:``: the scope of its trials (one arm, ``search``)."""
    from studies.scope import study_scope

    rows = [
        {"arm": "search", "seed": int(t.config.get("seed", 0)), metric: t.metrics.get(metric)}
        for t in trials
        if isinstance(t.metrics.get(metric), int | float)
    ]
    return study_scope([t.config for t in trials], rows, metric=metric, gpu_hours=gpu_hours)


def confirm_table(
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
        trials = [
            t
            for j in range(1, n_looks(spec) + 1)
            for t in read_trials(where.phase_plan(look_plan_name(arm, j)), history=True)
        ]
        for t in trials:
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
                    FROZEN_COLUMN: t.metrics.get(FROZEN_COLUMN),
                }
            )
            if t.history:
                gate_logs[(arm, seed)] = [dict(h) for h in t.history]
    rows.sort(key=lambda r: (str(r["arm"]), r["seed"]))  # the same rows in the same order however read
    frozen = [FROZEN_COLUMN] if spec.confirm.freeze is not None else []  # a stored study's table as it was
    return pd.DataFrame(rows, columns=[*CONFIRM_COLUMNS, "test_loss", *frozen]), gate_logs


def _data_kind(spec: StudySpec) -> str:
    from studies.kinds.search.spec import data_kind_of

    assert spec.confirm is not None
    return spec.confirm.data_kind if spec.confirm.data_kind != "auto" else data_kind_of(spec.data)


def _chance(spec: StudySpec) -> float | None:
    levels = chance_levels(spec)
    return levels[0] if levels else None


GATE_PANELS = 12  # trials in the gate-entropy plot


def _gate_entropy_plot(plan: StudyPlan, out_dir: Path) -> Path | None:
    """Gate entropy per layer over epochs, best trial first; ``None`` when no trial logged a gate.

    A plotting failure must not turn a finished study into a failed one: it is reported on stderr.
    """
    try:
        from studies.reporting import plot_gate_entropy

        trials = read_trials(plan, history=False)
        best = best_trial(trials, plan.metric, plan.mode)
        # The plot's panels: the best trial, then the others in order, of those that reported; only
        # their result files are read (a large study's are not all loaded for 12 panels).
        shown = [t.trial_id for t in sorted(trials, key=lambda t: t is not best) if t.metrics][:GATE_PANELS]
        read = read_histories(plan, shown)
        histories = {tid: read[tid] for tid in shown if tid in read}
        if not histories:
            return None
        return plot_gate_entropy(histories, out_dir / "gate_entropy_per_layer.png", max_trials=GATE_PANELS)
    except ValueError:
        return None  # no gate-entropy metrics in this study (no AutoNorm layer)
    except Exception as exc:
        print(f"gate-entropy plot skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


# --------------------------------------------------------------------------------------------------
# status / report, from the study directory
# --------------------------------------------------------------------------------------------------
