"""From statistics to verdicts in the batch-size analysis (docs/science.md §2): a CI on the
"goodness" scale, a control's label, why a fix arm that passed its gates is not supported, the
study verdict of one budget, and the per-budget results combined.

The claim as stated has two halves: a fix layer gets worse as the batch grows, AND the controls
(plain affine, BatchNorm, LayerNorm) do not. Per budget the claim *holds* (at least one fix arm
``supported`` and every control ``stable``), *fails* (every fix arm ``refuted``, or any control
``declines``: a declining control contradicts the second half) or is *undecided*. The study is
``supported`` when it holds under every budget run, ``refuted`` when it fails under every budget
run, ``budget-dependent`` when it holds under one budget and fails under another (a decided
outcome, with a sentence naming which), else ``inconclusive`` with its reasons.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BUDGET_WORDS",
    "budget_line",
    "budget_sentence",
    "claim_reading",
    "combine_budgets",
    "control_label",
    "fix_reasons",
    "oriented",
    "study_verdict",
    "verdict_fields",
]


def oriented(ci: Sequence[float] | None, sign: float) -> tuple[float, float] | None:
    """A CI on the "goodness" scale, where the hypothesis direction ("worse as B grows") is negative."""
    if ci is None or any(v is None or not math.isfinite(v) for v in ci):
        return None
    lo, hi = sorted((sign * float(ci[0]), sign * float(ci[1])))
    return lo, hi


def control_label(slope_ci: list[float] | None, *, sign: float, delta: float) -> str:
    """``declines``, ``stable`` or ``unclear``: a control's oriented slope CI against ``-delta``."""
    ci = oriented(slope_ci, sign)
    if ci is None:
        return "unclear"
    if ci[1] < -delta:
        return "declines"
    if ci[0] > -delta:
        return "stable"
    return "unclear"


def fix_reasons(r: Mapping[str, Any], *, sign: float, alpha: float) -> list[str]:
    """Why a fix arm that passed its gates is not supported."""
    reasons = []
    p = r["p_value_holm"]
    if p is None:
        reasons.append("no p-value (too little paired data)")
    elif p >= alpha:
        reasons.append("not significant")
    for name in ("slope", "interaction"):
        ci = oriented(r[f"{name}_ci"], sign)
        if ci is None:
            reasons.append(f"no {name} CI")
        elif ci[1] >= 0:
            reasons.append(f"{name} CI not below 0")
    return reasons


BUDGET_WORDS: dict[str, str] = {"epochs": "a fixed epoch budget", "updates": "a fixed update budget"}
"""How a budget is said in a sentence."""


def claim_reading(verdict: Mapping[str, str], labels: Mapping[str, str]) -> str:
    """``holds`` | ``fails`` | ``undecided``: the claim under one budget, from the fix arms' verdicts
    and the controls' labels (the module docstring has the rule)."""
    fixes = list(verdict.values())
    if (fixes and all(v == "refuted" for v in fixes)) or any(lab == "declines" for lab in labels.values()):
        return "fails"
    if any(v == "supported" for v in fixes) and all(lab == "stable" for lab in labels.values()):
        return "holds"
    return "undecided"


def study_verdict(
    verdict: Mapping[str, str],
    labels: Mapping[str, str],
    arms: Mapping[str, Mapping[str, Any]],
    *,
    exploratory: bool,
) -> tuple[str, list[str]]:
    """The study verdict under one budget: ``supported`` where the claim holds, ``refuted`` where it
    fails (reasons: the declining controls, if that is why), else ``inconclusive`` with reasons."""
    fixes = list(verdict.values())
    reading = claim_reading(verdict, labels)
    if reading == "fails":
        return "refuted", [f"control {arm} declines" for arm, lab in labels.items() if lab == "declines"]
    if reading == "holds":
        return "supported", []
    reasons: list[str] = []
    if not fixes:
        reasons.append("no fix arm")
    elif not any(v == "supported" for v in fixes):
        reasons.append("no fix arm supported")
    if any(lab == "unclear" for lab in labels.values()):
        reasons.append("control unclear")
    for arm, lab in labels.items():
        if lab == "unclear" and "optimisation-limited" in arms[arm]["reasons"]:
            reasons.append(f"control {arm} optimisation-limited")
    if exploratory:
        reasons.append("underpowered")
    return "inconclusive", reasons


def verdict_fields(
    arms: Any, verdict: Any, labels: Any, study: tuple[str, list[str]], exploratory: bool
) -> dict[str, Any]:
    """The verdict fields of a result, in ``verdict.json`` order."""
    return {
        "arms": arms,
        "verdict": verdict,
        "controls": labels,
        "study_verdict": study[0],
        "study_reasons": study[1],
        "exploratory": exploratory,
    }


def _union(lists: Sequence[Sequence[str]]) -> list[str]:
    out: list[str] = []
    for lst in lists:
        out += [r for r in lst if r not in out]
    return out


def combine_budgets(
    per: Mapping[str, Mapping[str, Any]], fix_arms: list[str], control_arms: list[str]
) -> dict[str, Any]:
    """Combine per-budget results: agreement under every budget is required (docs/science.md §2)."""
    names = list(per)
    arms: dict[str, dict[str, Any]] = {}
    verdict: dict[str, str] = {}
    labels: dict[str, str] = {}
    brief = ("slope", "slope_ci", "interaction", "interaction_ci", "p_value", "p_value_holm", "n", "n_failed")
    for arm in [*control_arms, *fix_arms]:
        rs = {b: per[b]["arms"][arm] for b in names}
        key = "verdict" if arm in fix_arms else "label"
        values = [r[key] for r in rs.values()]
        reasons = _union([r["reasons"] for r in rs.values()])
        same = values[0] if len(set(values)) == 1 else None  # every budget agrees
        if arm in fix_arms:
            combined = same if same in ("supported", "refuted") else "inconclusive"
            if combined == "inconclusive" and "supported" in values:
                reasons = ["budget-dependent", *reasons]
            verdict[arm] = combined
        else:
            combined = "stable" if same == "stable" else ("declines" if "declines" in values else "unclear")
            labels[arm] = combined
        arms[arm] = {
            "role": "fix" if arm in fix_arms else "control",
            key: combined,
            "reasons": reasons if combined not in ("supported", "stable") else [],
            "by_budget": {
                b: {key: r[key], "reasons": r["reasons"], **{k: r[k] for k in brief}} for b, r in rs.items()
            },
        }
    readings = {b: claim_reading(per[b]["verdict"], per[b]["controls"]) for b in names}
    exploratory = any(per[b]["exploratory"] for b in names)
    study, study_reasons = _study_of(readings, per)
    sens = [per[b]["sensitivity"]["study_verdict"] for b in names]
    sens_study = sens[0] if len(set(sens)) == 1 and sens[0] != "inconclusive" else "inconclusive"
    return {
        "budget": None,
        "batch_sizes": sorted({b for n in names for b in per[n]["batch_sizes"]}),
        "seeds": _union([per[n]["seeds"] for n in names]),
        **verdict_fields(arms, verdict, labels, (study, study_reasons), exploratory),
        "claim_by_budget": readings,
        "sensitivity": {
            "study_verdict": sens_study,
            "by_budget": {b: per[b]["sensitivity"] for b in names},
        },
    }


def _study_of(readings: Mapping[str, str], per: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[str]]:
    """The study verdict and its reasons from the claim's reading under each budget."""
    values = set(readings.values())
    if values == {"holds"}:
        return "supported", []
    if values == {"fails"}:
        return "refuted", _union([per[b]["study_reasons"] for b in readings])
    if {"holds", "fails"} <= values:
        return "budget-dependent", [budget_sentence(readings)]
    reasons = [f"{b}: {r}" for b, r in readings.items() if r != "undecided"]
    return "inconclusive", [
        *reasons,
        *_union([per[b]["study_reasons"] for b in readings if readings[b] == "undecided"]),
    ]


def budget_sentence(readings: Mapping[str, str]) -> str:
    """The one sentence a ``budget-dependent`` study verdict carries: under which budget the claim
    holds and under which it fails (and what that says about the decline)."""
    holds = [b for b, r in readings.items() if r == "holds"]
    fails = [b for b, r in readings.items() if r == "fails"]
    say = " and ".join
    text = (
        f"the claim holds under {say(BUDGET_WORDS.get(b, b) for b in holds)} only and fails under "
        f"{say(BUDGET_WORDS.get(b, b) for b in fails)}"
    )
    if holds == ["epochs"] and fails == ["updates"]:
        text += ": the decline follows the number of updates, not the batch size"
    return text


def budget_line(budget: str, result: Mapping[str, Any]) -> str:
    """One line per budget for the report and ``status``: the claim's reading and why."""
    reading = claim_reading(result.get("verdict") or {}, result.get("controls") or {})
    fixes = ", ".join(f"{a} {v}" for a, v in (result.get("verdict") or {}).items())
    controls = ", ".join(f"{a} {lab}" for a, lab in (result.get("controls") or {}).items())
    return f"{BUDGET_WORDS.get(budget, budget)}: the claim {reading} (fix arms: {fixes or '-'}; controls: {controls or '-'})"
