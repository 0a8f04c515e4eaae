"""The batch-size kind's workflow: run its phases, analyse, write and log the outputs; status; report.

Phases (docs/science.md, "The batch-size hypothesis"; :meth:`studies.kinds.pipeline.TunedDesignKind.phases`), each in
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

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.analysis_inputs import chance_levels, sequential_design
from studies.kinds.batchsize.spec import BatchSizeStudySpec, cell_key
from studies.kinds.outcome import finite_metrics, hypothesis_entry, verdict_tags
from studies.kinds.pipeline import Analysed, TunedDesign
from studies.kinds.records import arm_of, metric_value, trial_row
from studies.schema.arms import CELL_STAGE
from studies.tuning import noisy_reasons
from workers.plan import StudyPlan
from workers.records import TrialRecord

__all__ = [
    "DESIGN",
    "BatchSizeDesign",
    "analyse",
    "select_learning_rates",
    "total_trials",
    "trials_table",
]

SPEC = BatchSizeStudySpec


def total_trials(spec: BatchSizeStudySpec) -> int:
    return spec.total_trials


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
        cell = {"arm": arm, "batch_size": b, "seed": int(t.config.get("seed", 0)), "budget": budget}
        lr = metric_value(t, "lr")  # the η the trial used at its batch size (scaled for linear / sqrt)
        tuned = {
            "lr": lr if math.isfinite(lr) else float(t.config["training"]["lr"]),
            "updates": metric_value(t, "updates"),
            "lr_at_edge": bool(rec.get("at_range_edge", False)),
            **({"lr_noisy": True} if rec.get("noisy") else {}),  # a column only where tuning was noisy
        }
        rows.append(trial_row(t, metric, cell, tuned))
    columns = ["arm", "batch_size", "seed", "budget", "status", metric, "train_loss", "lr", "updates"]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=columns)
    return df.sort_values(["budget", "arm", "batch_size", "seed"], kind="stable").reset_index(drop=True)


def analyse(table: Any, spec: BatchSizeStudySpec, **inputs: Any) -> dict[str, Any]:
    """:func:`studies.kinds.batchsize.analysis.batchsize_trend` with the spec's analysis settings,
    plus the fields every kind's ``verdict.json`` has: ``kind``, and ``hypotheses`` (one per fix arm:
    its verdict, reasons, the interaction estimate and CI, p and Holm p, and the ``arms`` it rests on:
    the fix arm and the control). ``inputs``: ``adequacy``, the training-adequacy check per budget
    (:func:`studies.adequacy.measure`; absent: not measured), which gates the arms (an (arm, B) cell
    that did not pass) and becomes ``verdict.json["adequacy"]``."""
    from studies import adequacy
    from studies.kinds.batchsize.analysis import batchsize_trend

    a = spec.analysis
    chance_metric, chance_loss = chance_levels(spec) or (math.nan, math.nan)
    checks = inputs.get("adequacy") if adequacy.enabled(spec) else None
    verdict = batchsize_trend(
        table,
        control=spec.control,
        controls=list(spec.control_arms),
        chance_metric=chance_metric,
        chance_loss=chance_loss,
        # metric, direction, alpha, delta, min_seeds, n_boot, n_perm, seed, confidence
        **a.model_dump(exclude={"adequacy"}),
        sequential=sequential_design(spec.sequential, [str(s) for s in spec.seeds]),
        adequacy=checks,
    )
    if spec.sequential is not None:
        verdict.update(_sequential_summary(spec, verdict))
    _note_noisy(verdict, table, spec.control)
    arms = verdict.get("arms") or {}
    per_budget = budget_readings(spec, verdict, inputs.get("lr_records") or {})
    hypotheses = {
        arm: {
            **hypothesis_entry(arms.get(arm) or {}, estimate="interaction", ci="interaction_ci"),
            "verdict": label,
            "arms": [arm, spec.control],
            **_by_budget(arm, per_budget),
        }
        for arm, label in (verdict.get("verdict") or {}).items()
    }
    return {
        "kind": spec.kind,
        "study_verdict": verdict.get("study_verdict"),
        "hypotheses": hypotheses,
        **verdict,
        "per_budget": per_budget,
        "adequacy": adequacy.adequacy_record(spec, checks),
        "adequacy_rule": adequacy.rule(spec),
    }


_PER_ARM = ("slope", "slope_ci", "interaction", "interaction_ci", "n_seeds")


def budget_readings(
    spec: BatchSizeStudySpec, verdict: Mapping[str, Any], lr_records: Mapping[str, Any]
) -> dict[str, Any]:
    """Per budget run, the reading at a glance: ``{"verdict", "reasons", "reading", "arms"}`` with, per
    arm, its label, slope per doubling of B and interaction against the control (each with its
    interval), seeds, and the η per batch size (``tuned_lr``: ``{B: η}``, :func:`_cell_lr`). ``reading``: the budget's verdict in one sentence with
    its numbers."""
    budgets = verdict.get("budgets") or {spec.budgets[0]: verdict}
    out: dict[str, Any] = {}
    for budget, result in budgets.items():
        record = lr_records.get(budget) or {}
        labels = {**(result.get("verdict") or {}), **(result.get("controls") or {})}
        arms = {}
        for arm, r in (result.get("arms") or {}).items():
            lrs = {str(b): _cell_lr(spec, record, arm, b) for b in spec.batch_sizes}
            arms[arm] = {
                "role": "control" if arm in spec.control_arms else "fix",
                "verdict": labels.get(arm),
                **{k: r.get(k) for k in _PER_ARM},
                "tuned_lr": lrs,
            }
        out[budget] = {
            "verdict": result.get("study_verdict"),
            "reasons": list(result.get("study_reasons") or []),
            "reading": _reading(budget, result.get("study_verdict"), arms, spec.control),
            "arms": arms,
        }
    return out


def _cell_lr(spec: BatchSizeStudySpec, record: Mapping[str, Any], arm: str, b: int) -> float | None:
    """The η the (arm, B) cell trains with: its own (``tuned``), else the arm's η at the reference
    batch size, scaled with B for ``linear`` / ``sqrt``."""
    own = (record.get(cell_key(arm, b)) or {}).get("lr")
    if own is not None or spec.lr_policy == "tuned":
        return float(own) if own is not None else None
    ref = (record.get(arm) or {}).get("lr")
    if ref is None:
        return None
    power = {"linear": 1.0, "sqrt": 0.5}.get(spec.lr_policy, 0.0)
    return float(ref) * (b / spec.lr_tuning.reference_batch_size) ** power


def _reading(budget: str, label: Any, arms: Mapping[str, Mapping[str, Any]], control: str) -> str:
    """One sentence: the budget's verdict, each fix arm's interaction and each control's slope."""
    fix = [
        f"{arm} {_num(r.get('interaction'))} {_ci(r.get('interaction_ci'))} ({r.get('verdict')})"
        for arm, r in arms.items()
        if r["role"] == "fix"
    ]
    controls = [
        f"{arm} {_num(r.get('slope'))} {_ci(r.get('slope_ci'))} ({r.get('verdict')})"
        for arm, r in arms.items()
        if r["role"] == "control"
    ]
    return (
        f"{budget} budget, {label}: interaction per doubling of B against {control}: "
        + "; ".join(fix)
        + "; control slopes per doubling: "
        + "; ".join(controls)
        + "."
    )


def _by_budget(arm: str, per_budget: Mapping[str, Any]) -> dict[str, Any]:
    """With several budgets a fix arm's hypothesis has no one estimate: its interaction per budget."""
    if len(per_budget) < 2:
        return {}
    return {
        "by_budget": {
            b: {"estimate": p["arms"][arm].get("interaction"), "ci": p["arms"][arm].get("interaction_ci")}
            for b, p in per_budget.items()
            if arm in p["arms"]
        }
    }


def _note_noisy(verdict: dict[str, Any], table: Any, control: str) -> None:
    """``lr-tuning-noisy (<arm>)`` on each fix arm (per budget, and over budgets) whose cells or the
    control's had a noisy tuned pick (the table's ``lr_noisy``): informational, no verdict changes."""
    if table is None or "lr_noisy" not in getattr(table, "columns", ()):
        return
    rows = table[table["lr_noisy"].eq(True)]
    for name, result in [("", verdict), *(verdict.get("budgets") or {}).items()]:
        mine = rows if not name else rows[rows["budget"].astype(str) == name]
        noisy = set(mine["arm"].astype(str))
        for arm, res in (result.get("arms") or {}).items():
            if res.get("role") == "fix":
                res["reasons"] = [*(res.get("reasons") or []), *noisy_reasons((arm, control), noisy)]


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
    run = sum(
        int(r.get("n") or 0) for result in budgets.values() for r in (result.get("arms") or {}).values()
    )
    return sequential_fields(
        merged,
        spec.seeds,
        max_seeds=spec.sequential.max_seeds,
        trials_per_seed=spec.trials_per_seed,
        trials_run=run or None,
    )


def look_arms(spec: BatchSizeStudySpec, verdict: Mapping[str, Any], budget: str) -> list[str] | None:
    """Per-arm stopping (PROTOCOL §5) for ``budget``'s next look: a fix arm whose hypothesis (its
    interaction against the control) is decided gets no more seeds; the controls go on while any fix
    arm's hypothesis is open (the control pairs with every fix arm, and the control labels are the
    claim's second half); ``[]`` once every fix arm is decided. A fix arm with a cell that failed the
    training-adequacy check (``under_trained`` in its result), or whose interaction's control
    (``spec.control``) has one, counts as decided: its verdict ends ``inconclusive`` whatever more
    seeds show. ``None`` before the first look."""
    budgets = verdict.get("budgets") or {"": verdict}
    result = budgets.get(budget) or (budgets.get("") if len(budgets) == 1 else None)
    looks = (result or {}).get("looks") or []
    if not looks:
        return None
    hypotheses = looks[-1]["hypotheses"]
    arms = (result or {}).get("arms") or {}
    under = {arm for arm, r in arms.items() if r.get("under_trained")}  # analysis: its failed cells
    control_under = spec.control in under  # every interaction is measured against it
    open_fix = [
        arm
        for arm in spec.fix_arms
        if (hypotheses.get(arm) or {}).get("decision") not in ("reject", "futile")
        and arm not in under
        and not control_under
    ]
    if not open_fix:
        return []
    return [arm for arm in spec.arms if arm in open_fix or arm in spec.control_arms]


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


def _verdict_numbers(res: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """An arm's numbers (:data:`_VERDICT_NUMBERS`) and the two ends of each CI (:data:`_VERDICT_CIS`)."""
    out = [(key, res.get(key)) for key in _VERDICT_NUMBERS]
    for key in _VERDICT_CIS:
        ci = res.get(key)
        if isinstance(ci, list | tuple) and len(ci) == 2:
            out += [(f"{key}_low", ci[0]), (f"{key}_high", ci[1])]
    return out


def _resolved_phases(spec: BatchSizeStudySpec, table: Any, lr_records: Mapping[str, Any]) -> dict[str, Any]:
    """What each phase actually ran (the protocol's first section): the tuning phase's batch sizes,
    seeds, epochs and η grid (as extended), its refinement (the rates, the grid's winner, whether a
    refinement rate won, or why none ran) and the tuned η per arm / cell; the confirmatory phase's batch
    sizes, seeds and the η each arm used at each batch size (scaled for ``linear`` / ``sqrt``)."""
    out: dict[str, Any] = {}
    two_stage = spec.lr_policy == "tuned" and spec.lr_tuning.cells is not None
    sizes = (
        spec.batch_sizes
        if spec.lr_policy == "tuned" and not two_stage
        else (spec.lr_tuning.reference_batch_size,)
    )
    for budget in spec.budgets:
        record = lr_records.get(budget) or {}
        stages = {"": {c: r for c, r in record.items() if r.get("stage") != "cell"}}
        if two_stage:
            stages[CELL_STAGE] = {c: r for c, r in record.items() if r.get("stage") == "cell"}
        for stage, recs in stages.items():
            out[f"tune-{budget}{stage}"] = {
                "batch_sizes": [int(b) for b in (spec.batch_sizes if stage else sizes)],
                "seeds": [int(x) for x in spec.lr_tuning.seeds],
                "epochs": spec.lr_tuning.epochs or spec.training.epochs,
                "lr_grid": {cell: [float(x) for x in rec.get("grid") or []] for cell, rec in recs.items()},
                "lr_refine": {cell: rec.get("refine") for cell, rec in recs.items()},
                "tuned_lr": {cell: rec.get("lr") for cell, rec in recs.items()},
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


def _num(v: Any) -> str:
    return (
        f"{v:+.4f}" if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else "n/a"
    )


def _p(v: Any) -> str:
    """A p-value: a probability, never signed."""
    return (
        f"{v:.4g}" if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else "n/a"
    )


def _ci(ci: Any) -> str:
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(x, int | float) for x in ci):
        return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"
    return "n/a"


class BatchSizeDesign(TunedDesign):
    """The batch-size kind's hooks (:class:`studies.kinds.pipeline.TunedDesign`): one tuning and one
    confirmatory phase per budget (``epochs``, ``updates``), per-arm summary runs after each
    confirmatory phase."""

    TAG = "batchsize"
    ANALYSIS_LINE = "phase analysis: statistics, verdict, report"
    REPORT_READS_RUN = True

    def look_arms(
        self, spec: BatchSizeStudySpec, verdict: Mapping[str, Any], budget: str
    ) -> list[str] | None:
        return look_arms(spec, verdict, budget)

    def cell_of(self, spec: BatchSizeStudySpec, trial: TrialRecord) -> str:
        """The first tuning stage's cell: its arm, or ``cell_key(arm, B)`` for ``lr_policy: tuned``
        on the whole grid (with ``lr_tuning.cells`` the first stage tunes each arm at the reference B)."""
        arm = arm_of(trial)
        cells = set(spec.tuning_cells)
        key = cell_key(arm, int(trial.config["training"]["batch_size"]))
        return key if key in cells else arm

    analyse = staticmethod(analyse)

    def analysis_inputs(self, records: Mapping[str, Any]) -> dict[str, Any]:
        """The tuning records per budget: ``verdict.json["per_budget"]`` lists each cell's tuned η."""
        return {"lr_records": dict(records)}

    def confirm_table(
        self, spec: BatchSizeStudySpec, trials: Sequence[TrialRecord], budget: str, record: Mapping[str, Any]
    ) -> Any:
        return trials_table(
            trials, metric=spec.analysis.metric, budget=budget, lr_record=record, lr_policy=spec.lr_policy
        )

    def after_confirm(self, spec: BatchSizeStudySpec, runner: Any, phase: str, table: Any) -> None:
        """Under the confirmatory phase run, one summary run per arm: the analysis metric's mean over
        seeds and its t-interval at step = batch size (MLflow then draws one line per arm against B)."""
        from studies.summaries import arm_summaries

        summaries = arm_summaries(
            table, metrics=[spec.analysis.metric], axis="batch_size", confidence=spec.analysis.confidence
        )
        runner.log_summaries(phase, summaries)

    def write_outputs(self, done: Analysed, out_dir: Path) -> dict[str, Path]:
        """The report files, the cost kept in the verdict (``resources``)."""
        from studies.kinds.batchsize.report import write_batchsize_report

        spec = done.spec
        # What the study cost, kept with the verdict so a regenerated report shows the run's wall time.
        done.verdict["resources"] = done.resources
        doc = spec.to_document()
        head: dict[str, Any] = {k: doc.pop(k) for k in ("kind", "name") if k in doc}
        protocol: dict[str, Any] = {**head, "phases": _resolved_phases(spec, done.table, done.records), **doc}
        return write_batchsize_report(
            done.verdict,
            done.table,
            out_dir,
            title=f"Batch-size correlation study: {spec.name}",
            protocol=protocol,
            **done.resources,
        )

    def verdict_tags(self, verdict: Mapping[str, Any]) -> dict[str, str]:
        labels = {"verdict": verdict.get("verdict", {}), "control": verdict.get("controls", {})}
        return verdict_tags(
            verdict, labels, {arm: r.get("reasons") for arm, r in verdict.get("arms", {}).items()}
        )

    def verdict_metrics(self, verdict: Mapping[str, Any]) -> dict[str, float]:
        """The numbers the verdict rests on, once each: per arm ``<stat>/<arm>`` (``<stat>/<budget>/<arm>``
        with several budgets) for the slope, interaction, Spearman rho, p and Holm p, counts, and each CI
        as ``<stat>_ci_low/<arm>`` / ``<stat>_ci_high/<arm>``."""
        budgets = verdict.get("budgets") or {}
        sources = {f"{b}/": res for b, res in budgets.items()} if len(budgets) > 1 else {"": verdict}
        return finite_metrics(
            (f"{name}/{prefix}{arm}", v)
            for prefix, result in sources.items()
            for arm, res in result.get("arms", {}).items()
            for name, v in _verdict_numbers(res)
        )

    def outcome_summary(
        self, verdict: Mapping[str, Any], records: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Any]:
        """The run's summary: the verdict per arm and per control, the tuned η per budget and cell."""
        verdicts = {"verdict": verdict.get("verdict"), "controls": verdict.get("controls")}
        return verdicts, {b: {k: r["lr"] for k, r in rec.items()} for b, rec in records.items()}

    def design_size(self, spec: BatchSizeStudySpec) -> str:
        return (
            f"{len(spec.arms)} arms x {len(spec.batch_sizes)} batch sizes x {len(spec.seeds)} seeds x "
            f"{len(spec.budgets)} budget(s)"
        )

    def design_note(self, spec: BatchSizeStudySpec) -> str:
        return f", lr_policy={spec.lr_policy}"

    def tuning_line(self, spec: BatchSizeStudySpec, budget: str, plan: StudyPlan) -> str:
        where = "" if spec.tuning_cells != spec.arm_names else f" at B={spec.lr_tuning.reference_batch_size}"
        return f"phase lr_tuning ({budget} budget): {len(plan.grid[0][1])} (cell, lr) points{where} x {len(spec.lr_tuning.seeds)} seeds"

    def confirm_line(self, spec: BatchSizeStudySpec, budget: str, plan: StudyPlan) -> str:
        return f"phase confirmatory ({budget} budget): {plan.name} (grid, FIFO, full budget)"

    def verdict_lines(self, spec: BatchSizeStudySpec, verdict: Mapping[str, Any]) -> list[str]:
        """The printed verdict: the study's, then per budget (with several) each arm's numbers and label."""
        lines = [
            f"STUDY VERDICT: {verdict.get('study_verdict')}  {'; '.join(verdict.get('study_reasons') or [])}"
        ]
        budgets = verdict.get("budgets") or {}
        sections = budgets.items() if len(budgets) > 1 else [("", verdict)]
        combined = {**verdict.get("verdict", {}), **verdict.get("controls", {})}
        for budget, result in sections:
            if budget:
                lines.append(
                    f" {budget} budget: {result.get('study_verdict')}  {'; '.join(result.get('study_reasons') or [])}"
                )
            labels = {**result.get("verdict", {}), **result.get("controls", {})}
            arms = result.get("arms", {})
            for arm in sorted(arms, key=lambda a: (a not in spec.control_arms, a)):
                r = arms[arm]
                lines.append(
                    f"  {arm:<18} n={r.get('n')} failed={r.get('n_failed')} slope={_num(r.get('slope'))} "
                    f"{_ci(r.get('slope_ci'))} interaction={_num(r.get('interaction'))} {_ci(r.get('interaction_ci'))} "
                    f"p_holm={_p(r.get('p_value_holm'))} -> {labels.get(arm, '?')}"
                    + (f" ({'; '.join(r.get('reasons') or [])})" if r.get("reasons") else "")
                )
        if len(budgets) > 1:
            lines.append(
                " both budgets together: " + ", ".join(f"{arm} {label}" for arm, label in combined.items())
            )
        return lines

    def status_fields(self, spec: BatchSizeStudySpec, verdict: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"verdict": verdict.get("verdict") if verdict else None}

    def status_row_fields(self, spec: BatchSizeStudySpec, phase: str, trial: TrialRecord) -> dict[str, Any]:
        """A tuning trial shows what selects its η (validation), never the test set."""
        metric = spec.lr_tuning.metric if phase.startswith("tune-") else spec.analysis.metric
        return {"batch_size": trial.config["training"]["batch_size"], metric: trial.metrics.get(metric)}


DESIGN = BatchSizeDesign()
"""The hooks :meth:`studies.kinds.pipeline.TunedDesignKind.design` returns."""

select_learning_rates = DESIGN.select_learning_rates
"""The tuned η per arm (per ``cell_key(arm, B)`` for ``tuned``) from one budget's tuning trials
(:meth:`studies.kinds.pipeline.TunedDesign.select_learning_rates`)."""
