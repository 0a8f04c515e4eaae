"""Training adequacy of the claims study (issue #47): was every arm a claim rests on trained to a
comparable end before the claims were decided?

The claims kind's budget check (:mod:`studies.adequacy` holds the rule and its thresholds, shared
with the compare and batch-size kinds). After an arm's η is tuned (``confirm-tune-<arm>``, its range
extensions and refinement) and before it is confirmed, the phase ``confirm-tune-<arm>-adequacy``
trains the arm at its confirmed configuration (its tuned η) for ``FACTOR`` (2) times the budget
(epochs, and ``max_updates`` where set) on one check seed (:func:`check_seed`: the first tuning
seed, else the first search seed), and at the budget itself where no tuning trial at the chosen η
on that seed holds it (:func:`reuses_tuning`):

* ``reached``: the arm's validation metric (``search.metric``, what the tuning selects on) at the
  budget on the check seed;
* ``gain``: the metric at twice the budget less ``reached``, oriented by ``search.mode``;
* the arm passes unless ``gain > analysis.adequacy.max_gain`` (default ``sequential.min_effect``,
  else 0.005) or ``reached`` misses ``analysis.adequacy.min_metric``.

Only the arms a claim tested on the data rests on are checked (:func:`checked_arms`,
:func:`studies.kinds.search.claims.hypothesis_arms`: a, b, e's contrasts and the gate arm of c and
d); ``verdict.json["adequacy"]`` has an entry for every confirmatory arm, :data:`NOT_MEASURED` for
one no claim rests on. A claim resting on an arm that did not pass is ``inconclusive`` with the
arm's ``under-trained: ...`` reason (:func:`gate_claims`), never supported or refuted. Light: no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from studies.adequacy import FACTOR, NOT_MEASURED, enabled, failed_cells, max_gain, reason, rule, settings

__all__ = [
    "adequacy_record",
    "adequacy_rule",
    "budget_training",
    "check_seed",
    "check_trials",
    "checked_arms",
    "claim_arms",
    "gate_claims",
    "measure",
    "phase_of",
    "reuses_tuning",
]


def phase_of(arm: str) -> str:
    """The arm's check phase: ``confirm-tune-<arm>-adequacy`` (its tuning phase, then ``-adequacy``)."""
    return f"confirm-tune-{arm}-adequacy"


def data_kind(spec: Any) -> str:
    from studies.kinds.search.spec import data_kind_of

    confirm = spec.confirm
    return str(confirm.data_kind) if confirm.data_kind != "auto" else data_kind_of(spec.data)


def claim_arms(claim: str) -> list[str]:
    """The confirmatory arms ``claim`` rests on (its ``arms`` in ``verdict.json``)."""
    from studies.kinds.search.claims import hypothesis_arms

    return list(hypothesis_arms(claim))


def checked_arms(spec: Any) -> list[str]:
    """The confirmatory arms (in ``confirm.arms`` order) that a claim tested on the study's data
    rests on; none without ``confirm:`` or with the check off."""
    from studies.kinds.search.claims import CLAIMS, applies

    if spec.confirm is None or not enabled(spec):
        return []
    kind = data_kind(spec)
    needed = {arm for claim in CLAIMS if applies(claim, kind) for arm in claim_arms(claim)}
    return [arm for arm in spec.confirm.arms if arm in needed]


def check_seed(spec: Any) -> int:
    """The check's seed: the first tuning seed (``confirm.lr_tuning.seeds``), else the first search seed."""
    tuning = spec.confirm.lr_tuning
    return int(tuning.seeds[0]) if tuning is not None else int(spec.seeds[0])


def reuses_tuning(spec: Any) -> bool:
    """Whether an arm's tuning trial at its chosen η on the check seed is the check's 1x run: the
    arms are tuned (``confirm.lr_tuning``) at the study's budget (``lr_tuning.epochs`` unset or equal
    to ``training.epochs``, or an updates budget)."""
    tuning = spec.confirm.lr_tuning
    if tuning is None:
        return False
    return spec.training.budget != "epochs" or tuning.epochs in (None, spec.training.epochs)


def budget_training(training: Mapping[str, Any], factor: int) -> dict[str, Any]:
    """The training fields of ``factor`` times the budget ``training`` sets (epochs, max_updates)."""
    out: dict[str, Any] = {"epochs": int(training["epochs"]) * factor}
    if training.get("max_updates") is not None:
        out["max_updates"] = int(training["max_updates"]) * factor
    return out


def check_trials(spec: Any) -> int:
    """The check's trials (0 when it is off): per checked arm, one at twice the budget and one at
    the budget where the tuning lacks it."""
    return len(checked_arms(spec)) * (1 if reuses_tuning(spec) else 2)


def _value(trial: Any, metric: str) -> float:
    v = trial.metrics.get(metric)
    ok = str(trial.status).lower() in ("completed", "terminated")
    ok = ok and isinstance(v, int | float) and not isinstance(v, bool)
    return float(v) if ok and math.isfinite(float(v)) else math.nan


def measure(
    spec: Any, arm: str, lr: float, check: Sequence[Any], tuning: Iterable[Any] = ()
) -> dict[str, Any] | str:
    """The arm's entry ``{"passed", "reached", "gain", "reached_twice", "seeds", "reason", "note"}``
    (module docstring) from its check phase's trials and, where the check reuses them
    (:func:`reuses_tuning`), its tuning trials at ``lr`` (the η it is confirmed at) on the check
    seed; :data:`NOT_MEASURED` without a run at twice the budget."""
    from studies.tuning import round_lr

    metric = spec.search.metric
    sign = 1.0 if spec.search.mode == "max" else -1.0
    seed = check_seed(spec)
    twice_epochs = int(spec.training.epochs) * FACTOR
    once: float = math.nan
    twice: float | None = None
    for t in check:
        if int(t.config.get("seed", -1)) != seed:
            continue
        if int(t.config["training"]["epochs"]) == twice_epochs:
            twice = _value(t, metric)
        else:
            once = _value(t, metric)
    if reuses_tuning(spec):
        for t in tuning:
            same = round_lr(float(t.config["training"]["lr"])) == round_lr(float(lr))
            if int(t.config.get("seed", -1)) == seed and same and math.isfinite(_value(t, metric)):
                once = _value(t, metric)
    if twice is None:
        return NOT_MEASURED
    reached = once if math.isfinite(once) else None
    gain = sign * (twice - once) if math.isfinite(once) and math.isfinite(twice) else None
    entry: dict[str, Any] = {
        "passed": True,
        "reached": reached,
        "gain": gain,
        "reached_twice": twice if math.isfinite(twice) else None,
        "seeds": int(gain is not None),
        "reason": None,
        "note": None,
    }
    if gain is None:
        entry["note"] = "no completed pair of runs at the budget and twice it: no gain measured"
    elif gain > max_gain(spec):
        entry.update(passed=False, reason=reason(arm, reached, gain))
    s = settings(spec)
    floor = None if s is None else s.min_metric
    if floor is not None and reached is not None and sign * (reached - floor) < 0:
        entry.update(passed=False, reason=reason(arm, reached, None, floor=floor))
    return entry


def adequacy_record(spec: Any, entries: Mapping[str, Any] | None) -> Any:
    """``verdict.json["adequacy"]``: an entry for every confirmatory arm (:data:`NOT_MEASURED` for
    one no claim rests on, or whose check has not run); :data:`NOT_MEASURED` when the check is off or
    never ran."""
    if spec.confirm is None or not enabled(spec) or not isinstance(entries, Mapping) or not entries:
        return NOT_MEASURED
    return {arm: entries.get(arm, NOT_MEASURED) for arm in spec.confirm.arms}


def adequacy_rule(spec: Any) -> dict[str, Any]:
    """``verdict.json["adequacy_rule"]``: what the check compared (metric, factor, thresholds, seed)."""
    seeds = [check_seed(spec)] if spec.confirm is not None else []
    return {**rule(spec, metric=spec.search.metric, seeds=seeds), "arms": checked_arms(spec)}


def gate_claims(claims: Mapping[str, dict[str, Any]], entries: Any) -> None:
    """In place: each claim lists the ``arms`` it rests on, and one resting on an arm whose check did
    not pass is ``inconclusive`` with that arm's ``under-trained: ...`` reason (never supported or
    refuted). Claim c follows its sub-layer types."""
    for cid, claim in claims.items():
        arms = claim_arms(cid)
        claim["arms"] = arms
        reasons_ = [str(r) for r in claim.get("reasons") or []]
        under = failed_cells(entries, arms)
        if not under or any(r.startswith("not applicable") for r in reasons_):
            continue
        claim["verdict"] = "inconclusive"
        reasons = claim.setdefault("reasons", [])
        reasons.extend(r for r in under if r not in reasons)
