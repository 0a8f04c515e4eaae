"""Training adequacy: was each arm trained to a comparable end before it was compared (issue #47)?

A comparison of normalisers means something only when the arms were trained to a comparable end
(docs/science.md §3.9, "Training adequacy"). After a tuned design's tuning (its
range extensions and refinement included) and before its confirmatory phase, the *budget check* runs
each confirmatory cell (an arm; the batch-size kind: an (arm, B) cell) at its tuned η for
``FACTOR`` (2) times the budget (epochs, and ``max_updates`` where set) on the check seeds (the
tuning seeds; the batch-size kind: the first one), in the phase ``tune[-<budget>]-adequacy``:

* ``reached``: the cell's mean validation metric (``lr_tuning.metric``) at the study's budget on the
  check seeds: the tuning trials at the chosen η where the tuning ran that very configuration (same
  budget, the cell is a tuning cell), else trials of the check phase itself at 1x the budget;
* ``gain``: the mean over the check seeds of (metric at twice the budget − metric at the budget),
  oriented so that a positive gain is an improvement (``lr_tuning.mode``);
* the cell *passes* unless ``gain > max_gain`` (``analysis.adequacy.max_gain``; default the study's
  ``min_effect`` (``sequential.min_effect``), else :data:`DEFAULT_MAX_GAIN`) or ``reached`` misses the
  floor ``analysis.adequacy.min_metric`` (optional). A cell whose 2x runs all failed has no gain
  (``None``): the check cannot call it under-trained, it passes with a ``note``.

A hypothesis resting on a cell that did not pass is ``inconclusive`` with the reason
:func:`reason` (``under-trained: <cell> reached <x>, +<g> at twice the budget``); a control label
resting on one is ``unclear``. A study whose spec switches the check off (``analysis.adequacy.check:
false``; a stored study from before the check reads so) has ``"adequacy": "not measured"``.

Light: pydantic and the plan contract only; the kinds and the pipeline import it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool

from studies.schema.sections import FROZEN
from workers.dotted import ROOT
from workers.plan import StudyPlan

__all__ = [
    "DEFAULT_MAX_GAIN",
    "FACTOR",
    "NOT_MEASURED",
    "AdequacySpec",
    "adequacy_plan",
    "adequacy_record",
    "adequacy_trials",
    "check_key",
    "check_seeds",
    "enabled",
    "failed_cells",
    "max_gain",
    "measure",
    "phase_of",
    "reason",
    "reuses_tuning",
]

FACTOR = 2
"""The check trains for this many times the study's budget."""

DEFAULT_MAX_GAIN = 0.005
"""The largest gain at twice the budget that still passes, for a study without ``min_effect``
(accuracy units: half an accuracy point)."""

NOT_MEASURED = "not measured"
"""``verdict.json["adequacy"]`` (or one cell's entry) where the check did not run."""


class AdequacySpec(BaseModel):
    """The training-adequacy gate (docs/science.md, "Training adequacy"): the budget check and the
    floor. ``max_gain`` and ``min_metric`` are in units of ``lr_tuning.metric`` (the validation metric
    the tuning selects on)."""

    model_config = FROZEN

    check: StrictBool = True  # the budget check: each cell's tuned η at twice the budget (phase tune-adequacy); false: not measured
    max_gain: Annotated[float, Field(strict=False, ge=0, allow_inf_nan=False)] | None = (
        None  # lr_tuning.metric gain at twice the budget above which a cell is under-trained; None: sequential.min_effect, else 0.005
    )
    min_metric: Annotated[float, Field(strict=False, allow_inf_nan=False)] | None = (
        None  # the lr_tuning.metric each cell must reach at the budget (a preset says its source); None: no floor
    )


def settings(spec: Any) -> AdequacySpec | None:
    """The spec's ``analysis.adequacy`` section (``None``: a kind without one)."""
    found = getattr(getattr(spec, "analysis", None), "adequacy", None)
    return found if isinstance(found, AdequacySpec) else None


def enabled(spec: Any) -> bool:
    """Whether the study runs the budget check (``analysis.adequacy.check``)."""
    s = settings(spec)
    return bool(s is not None and s.check)


def max_gain(spec: Any) -> float:
    """``analysis.adequacy.max_gain``, else the study's ``sequential.min_effect``, else
    :data:`DEFAULT_MAX_GAIN`."""
    s = settings(spec)
    if s is not None and s.max_gain is not None:
        return float(s.max_gain)
    sequential = getattr(spec, "sequential", None)
    effect = getattr(sequential, "min_effect", None)
    return float(effect) if isinstance(effect, int | float) and effect > 0 else DEFAULT_MAX_GAIN


def phase_of(budget: str) -> str:
    """The check's phase: ``tune[-<budget>]-adequacy``."""
    return "tune" + (f"-{budget}" if budget else "") + "-adequacy"


def check_key(spec: Any, config: Mapping[str, Any]) -> str:
    """The cell a trial config belongs to: its arm, or ``<arm>@<B>`` for a kind whose grid has batch
    sizes."""
    arm = str(config["model"]["layer"]["type"])
    if "batch_sizes" in getattr(spec, "grid", {}):
        return f"{arm}@{int(config['training']['batch_size'])}"
    return arm


def check_seeds(spec: Any) -> tuple[int, ...]:
    """The check's seeds: the tuning seeds, or the first ``adequacy_seed_count`` of them."""
    seeds = tuple(int(s) for s in spec.lr_tuning.seeds)
    n = getattr(spec, "adequacy_seed_count", None)
    return seeds[: int(n)] if n else seeds


def _budget_training(spec: Any, budget: str, factor: int) -> dict[str, Any]:
    """The training fields of ``factor`` times the budget: ``epochs`` (and ``max_updates`` where set;
    unset it derives from the epochs)."""
    training = spec.base_config(budget=budget)["training"]
    out: dict[str, Any] = {"epochs": int(training["epochs"]) * factor}
    if training.get("max_updates") is not None:
        out["max_updates"] = int(training["max_updates"]) * factor
    return out


def _confirm_cells(spec: Any, budget: str, lr: Mapping[str, float]) -> list[dict[str, Any]]:
    """The confirmatory phase's cells (its ``@`` axis) under ``lr``."""
    plan = spec.confirmatory_plan(budget, lr)
    axes = dict(plan.grid)
    return [dict(c) for c in axes[ROOT]]


def _placeholder(spec: Any) -> dict[str, float]:
    return dict.fromkeys(spec.tuned_cells, float(spec.training.lr))


def reuses_tuning(spec: Any, budget: str) -> bool:
    """Whether the tuning trials at the chosen η are the check's 1x runs: the tuning ran the study's
    budget (``lr_tuning.epochs`` unset or equal, or an updates budget) and every confirmatory cell is
    a tuned cell (``lr_policy: tuned``, or a kind of one batch size)."""
    base = spec.base_config(budget=budget)["training"]
    tuning_epochs = spec.lr_tuning.epochs
    same_budget = base.get("budget", "epochs") != "epochs" or tuning_epochs in (None, base["epochs"])
    keys = {check_key(spec, c) for c in _confirm_cells(spec, budget, _placeholder(spec))}
    return same_budget and keys <= set(spec.tuned_cells)


def _merged(cell: Mapping[str, Any], training: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(cell)
    out["training"] = {**dict(cell.get("training") or {}), **dict(training)}
    return out


def adequacy_plan(
    spec: Any, budget: str, lr: Mapping[str, float], *, environ: Mapping[str, str] | None = None
) -> StudyPlan:
    """Phase ``tune[-<budget>]-adequacy``: every confirmatory cell at its tuned η (``lr``, the
    confirmatory phase's mapping) for twice the budget, and at the budget where the tuning trials do
    not hold it (:func:`reuses_tuning`), x :func:`check_seeds`."""
    cells = _confirm_cells(spec, budget, lr)
    twice = [_merged(c, _budget_training(spec, budget, FACTOR)) for c in cells]
    once = (
        [] if reuses_tuning(spec, budget) else [_merged(c, _budget_training(spec, budget, 1)) for c in cells]
    )
    plan: StudyPlan = spec.design_phase(
        phase_of(budget), budget, [*once, *twice], check_seeds(spec), tuning=False, environ=environ
    )
    # a run's name says its budget: the 1x and 2x runs of a cell and seed are two runs
    run_name = spec.trial_name + "-lr{training.lr:g}-e{training.epochs}-s{seed}"
    return dataclasses.replace(plan, run_name=run_name)


def adequacy_trials(spec: Any) -> int:
    """The check's trials over every budget (0 when it is off)."""
    if not enabled(spec):
        return 0
    total = 0
    for budget in spec.budget_names:
        cells = len(_confirm_cells(spec, budget, _placeholder(spec)))
        total += cells * (1 if reuses_tuning(spec, budget) else 2) * len(check_seeds(spec))
    return total


def _value(trial: Any, metric: str) -> float:
    v = trial.metrics.get(metric)
    ok = trial.status == "completed" and isinstance(v, int | float) and not isinstance(v, bool)
    return float(v) if ok and math.isfinite(float(v)) else math.nan


def _mean(values: Iterable[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def measure(
    spec: Any,
    budget: str,
    lr: Mapping[str, float],
    check_trials: Sequence[Any],
    tuning_trials: Sequence[Any] = (),
) -> dict[str, Any]:
    """Each confirmatory cell's entry: ``{"passed", "reached", "gain", "reached_twice", "seeds",
    "reason", "note"}`` (module docstring), from the check phase's trials and, where the check reuses
    them (:func:`reuses_tuning`), the tuning trials at the chosen η (``lr``: tuning cell -> η). A cell
    without any 2x trial yet is :data:`NOT_MEASURED`."""
    from studies.tuning import round_lr

    metric, sign = spec.lr_tuning.metric, (1.0 if spec.lr_tuning.mode == "max" else -1.0)
    seeds = check_seeds(spec)
    twice_epochs = _budget_training(spec, budget, FACTOR)["epochs"]
    once: dict[str, dict[int, float]] = {}
    twice: dict[str, dict[int, float]] = {}
    for t in check_trials:
        seed = int(t.config.get("seed", -1))
        if seed not in seeds:
            continue
        long = int(t.config["training"]["epochs"]) == twice_epochs
        (twice if long else once).setdefault(check_key(spec, t.config), {})[seed] = _value(t, metric)
    if reuses_tuning(spec, budget):
        chosen = {cell: round_lr(float(v)) for cell, v in lr.items()}
        for t in tuning_trials:
            key, seed = check_key(spec, t.config), int(t.config.get("seed", -1))
            if seed in seeds and chosen.get(key) == round_lr(float(t.config["training"]["lr"])):
                once.setdefault(key, {})[seed] = _value(t, metric)
    s = settings(spec)
    floor = None if s is None else s.min_metric
    limit = max_gain(spec)
    out: dict[str, Any] = {}
    for cell in _confirm_cells(spec, budget, lr):
        key = check_key(spec, cell)
        if key not in twice:
            out[key] = NOT_MEASURED
            continue
        base, more = once.get(key, {}), twice[key]
        reached = _mean(base.get(k, math.nan) for k in seeds)
        diffs = [sign * (more[k] - base[k]) for k in seeds if k in base and k in more]
        gain = _mean(diffs)
        entry: dict[str, Any] = {
            "passed": True,
            "reached": reached,
            "gain": gain,
            "reached_twice": _mean(more.values()),
            "seeds": sum(math.isfinite(d) for d in diffs),
            "reason": None,
            "note": None,
        }
        if gain is None:
            entry["note"] = "no completed pair of runs at the budget and twice it: no gain measured"
        elif gain > limit:
            entry.update(passed=False, reason=reason(key, reached, gain))
        if floor is not None and reached is not None and sign * (reached - floor) < 0:
            entry.update(passed=False, reason=reason(key, reached, None, floor=floor))
        out[key] = entry
    return out


def reason(cell: str, reached: float | None, gain: float | None, *, floor: float | None = None) -> str:
    """The reason a hypothesis resting on ``cell`` is inconclusive: ``under-trained: <cell> reached
    <x>, +<g> at twice the budget`` (or ``below min_metric <m>``)."""
    x = "n/a" if reached is None else f"{reached:.4g}"
    if floor is not None:
        return f"under-trained: {cell} reached {x}, below min_metric {floor:g}"
    return f"under-trained: {cell} reached {x}, +{0.0 if gain is None else gain:.4g} at twice the budget"


def failed_cells(entries: Any, cells: Iterable[str]) -> list[str]:
    """The reasons of those of ``cells`` whose entry did not pass (an entry :data:`NOT_MEASURED`, or
    ``entries`` not a mapping, passes: nothing was measured against it)."""
    if not isinstance(entries, Mapping):
        return []
    out = []
    for cell in cells:
        e = entries.get(cell)
        if isinstance(e, Mapping) and e.get("passed") is False:
            out.append(str(e.get("reason") or f"under-trained: {cell}"))
    return out


def adequacy_record(spec: Any, by_budget: Mapping[str, Any] | None) -> Any:
    """``verdict.json["adequacy"]``: :data:`NOT_MEASURED` when the check is off (or never ran); the
    entries of one budget by cell; with several budgets ``<budget>/<cell>``."""
    if not enabled(spec) or not by_budget:
        return NOT_MEASURED
    if len(by_budget) == 1:
        (entries,) = by_budget.values()
        return dict(entries) if isinstance(entries, Mapping) else NOT_MEASURED
    return {
        f"{budget}/{cell}": e
        for budget, entries in by_budget.items()
        if isinstance(entries, Mapping)
        for cell, e in entries.items()
    }


def rule(spec: Any, *, metric: str | None = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """``verdict.json["adequacy_rule"]``: what the check compared (metric, factor, thresholds, seeds);
    ``metric`` / ``seeds``: a kind's own (default ``lr_tuning.metric`` and :func:`check_seeds`)."""
    s = settings(spec)
    return {
        "check": enabled(spec),
        "metric": spec.lr_tuning.metric if metric is None else metric,
        "factor": FACTOR,
        "max_gain": max_gain(spec),
        "min_metric": None if s is None else s.min_metric,
        "seeds": list(check_seeds(spec) if seeds is None else seeds),
    }


def study_line(entries: Any) -> str | None:
    """``not testable at this budget: ...`` when a cell did not pass, else ``None``."""
    if not isinstance(entries, Mapping):
        return None
    failed = [c for c, e in entries.items() if isinstance(e, Mapping) and e.get("passed") is False]
    if not failed:
        return None
    return f"not testable at this budget: {', '.join(failed)} under-trained (training adequacy)"


def report_section(verdict: Mapping[str, Any]) -> tuple[list[str], list[list[dict[str, str]]]]:
    """The reports' "Training adequacy" section: its text and its table (one row per cell)."""
    entries, rule_ = verdict.get("adequacy"), verdict.get("adequacy_rule") or {}
    if not isinstance(entries, Mapping):
        return [f"Training adequacy: {entries or NOT_MEASURED} (the budget check did not run)."], []

    def num(v: Any, signed: bool = False) -> str:
        return "n/a" if not isinstance(v, int | float) else (f"{v:+.4g}" if signed else f"{v:.4g}")

    text = [
        f"Each cell's tuned η trained for {rule_.get('factor', FACTOR)}x the budget on seeds "
        f"{rule_.get('seeds')}: a gain in `{rule_.get('metric')}` above {num(rule_.get('max_gain'))}"
        + (
            f", or a reached value below {num(rule_.get('min_metric'))},"
            if rule_.get("min_metric") is not None
            else ""
        )
        + " marks it under-trained; what rests on it is inconclusive (a control unclear)."
    ]
    rows = [
        {
            "cell": str(cell),
            "reached": num(e.get("reached")) if isinstance(e, Mapping) else "–",
            "at twice the budget": num(e.get("reached_twice")) if isinstance(e, Mapping) else "–",
            "gain": num(e.get("gain"), signed=True) if isinstance(e, Mapping) else "–",
            "verdict": ("passed" if e.get("passed") else "under-trained")
            if isinstance(e, Mapping)
            else str(e),
        }
        for cell, e in entries.items()
    ]
    return text, [rows]


def logged_checks(spec: Any, verdict: Mapping[str, Any]) -> dict[str, Any] | None:
    """The check's entries per budget as a logged ``verdict.json`` records them (the inverse of
    :func:`adequacy_record`): what an offline re-analysis, which has the confirmatory table but not
    the check's trials, takes as its input. ``None``: not measured."""
    entries = verdict.get("adequacy")
    if not isinstance(entries, Mapping):
        return None
    budgets = [str(b) for b in spec.budget_names]
    if len(budgets) == 1:
        return {budgets[0]: dict(entries)}
    out: dict[str, Any] = {b: {} for b in budgets}
    for key, e in entries.items():
        budget, _, cell = str(key).partition("/")
        if budget in out:
            out[budget][cell] = e
    return out
