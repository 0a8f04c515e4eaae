"""What the round-5 claims design adds to a claims study's verdict (docs/science.md §4.2): claim b's
freeze and how much of each AutoNorm-S run it held (:func:`freeze_record`), the searched configuration
confirmed as an arm of its own and reported, never a claim's arm (:func:`reported_arms`), and the
informational ``lr-tuning-noisy`` reason on the claims resting on an arm whose tuned η led its
runner-up by less than one standard error (:func:`gate_lr_noisy`).

A spec without ``confirm.freeze`` (a study stored before it existed) gets none of these fields, so
its verdict reads and reproduces as it was written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from studies.kinds.search.gates import layer_count
from studies.kinds.search.spec import REPORTED_ARMS
from studies.kinds.search.values import seed_key, to_float
from studies.tuning import NOISY

__all__ = [
    "CLAIM_ARMS",
    "FROZEN_COLUMN",
    "design_fields",
    "design_lines",
    "freeze_record",
    "gate_lr_edges",
    "gate_lr_noisy",
    "reported_arms",
]

FROZEN_COLUMN = "selector_frozen"
"""The confirmatory table's column (and the trial's final metric): 1 when the gate ended frozen."""

#: The arm claim b tests and the arms a reported arm is set against.
B_ARM = "autonorm_s"
_AGAINST = ("autonorm", "autonorm_s")


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


def gate_lr_noisy(claims: dict[str, Any], tuned: Mapping[str, Any]) -> None:
    """A claim resting on an arm whose tuned η was ``noisy`` (:func:`studies.tuning.tuning_noise`)
    gets the reason ``lr-tuning-noisy (<arm>)`` (in place); informational: the verdict stays."""
    for cid, claim in claims.items():
        noisy = [a for a in CLAIM_ARMS.get(cid, ()) if (tuned.get(a) or {}).get("noisy")]
        if noisy and not any("not applicable" in str(r) for r in claim.get("reasons") or []):
            claim.setdefault("reasons", []).extend(f"{NOISY} ({arm})" for arm in noisy)


def _rows(table: Any, arm: str) -> list[dict[str, Any]]:
    if table is None or not len(table) or "arm" not in table.columns:
        return []
    rows: list[dict[str, Any]] = table[table["arm"].astype(str) == arm].to_dict("records")
    return rows


def freeze_record(spec: Any, table: Any, gate_logs: Mapping[tuple[str, Any], Any]) -> dict[str, Any]:
    """Claim b's freeze as designed and as it happened: ``t_freeze``, ``rule``, ``eps_h``, ``epochs``,
    ``frozen_share`` (of the epochs, when the rule freezes), ``seeds`` (AutoNorm-S trials),
    ``seeds_frozen`` (those whose gate ended frozen; ``None`` when the table does not say),
    ``layers`` (gated layers per model) and ``layers_frozen`` (summed over the seeds: the rule freezes
    every gate of a model at once, on their mean entropy)."""
    confirm = spec.confirm
    freeze = confirm.freeze
    epochs = int(spec.training.epochs)
    rows = _rows(table, B_ARM)
    flags = [to_float(r.get(FROZEN_COLUMN)) for r in rows]
    known = [f for f in flags if math.isfinite(f)]
    logs = [v for (arm, _), v in gate_logs.items() if str(arm) == B_ARM]
    layers = max((layer_count(v, ("gate_entropy",)) for v in logs), default=0)
    frozen = sum(f >= 0.5 for f in known) if len(known) == len(flags) and flags else None
    return {
        "arm": B_ARM,
        "t_freeze": freeze.epoch(epochs),
        "rule": freeze.rule,
        "eps_h": freeze.eps_h,
        "epochs": epochs,
        "frozen_share": freeze.frozen_share(epochs),
        "seeds": len(rows),
        "seeds_frozen": frozen,
        "layers": layers,
        "layers_frozen": frozen * layers if frozen is not None else None,
    }


def reported_arms(spec: Any, table: Any, *, metric: str, confidence: float = 0.95) -> dict[str, Any]:
    """Each reported arm (:data:`~studies.kinds.search.spec.REPORTED_ARMS` in ``confirm.arms``) set
    against AutoNorm and AutoNorm-S on the seeds both completed: the mean paired difference of
    ``metric``, its t-interval and the two-sided sign-flip p, unadjusted. Reported, not a claim: in no
    Holm family, no verdict, no seeds launched for it."""
    from studies.stats import paired_contrast

    out: dict[str, Any] = {}
    for arm in [a for a in spec.confirm.arms if a in REPORTED_ARMS]:
        mine = {seed_key(r["seed"]): to_float(r.get(metric)) for r in _rows(table, arm) if _ok(r, metric)}
        entry: dict[str, Any] = {"role": "reported, not a claim", "metric": metric, "versus": {}}
        for other in [a for a in _AGAINST if a in spec.confirm.arms]:
            theirs = {
                seed_key(r["seed"]): to_float(r.get(metric)) for r in _rows(table, other) if _ok(r, metric)
            }
            seeds = sorted(set(mine) & set(theirs), key=str)
            if len(seeds) < 2:
                entry["versus"][other] = {
                    "n_seeds": len(seeds),
                    "estimate": None,
                    "ci": [None, None],
                    "p_value": None,
                }
                continue
            test = paired_contrast(
                [mine[s] for s in seeds],
                [theirs[s] for s in seeds],
                alternative="two-sided",
                confidence=confidence,
            )
            entry["versus"][other] = {k: test[k] for k in ("n_seeds", "estimate", "ci", "p_value")}
        out[arm] = entry
    return out


def _ok(row: Mapping[str, Any], metric: str) -> bool:
    return str(row.get("status", "")).lower() in ("completed", "terminated") and math.isfinite(
        to_float(row.get(metric))
    )


def design_fields(spec: Any, table: Any, gate_logs: Mapping[tuple[str, Any], Any]) -> dict[str, Any]:
    """``freeze`` and ``reported_arms`` of the verdict; empty for a spec without ``confirm.freeze``."""
    if spec.confirm is None or spec.confirm.freeze is None:
        return {}
    out: dict[str, Any] = {}
    if B_ARM in spec.confirm.arms:
        out["freeze"] = freeze_record(spec, table, gate_logs)
    reported = reported_arms(spec, table, metric=spec.confirm.metric)
    if reported:
        out["reported_arms"] = reported
    return out


def _num(v: Any) -> str:
    return f"{v:+.4f}" if isinstance(v, int | float) and math.isfinite(v) else "–"


def design_lines(verdict: Mapping[str, Any]) -> list[str]:
    """The report's lines on claim b's freeze and the reported arms (none for a stored study's
    verdict without them)."""
    lines: list[str] = []
    freeze = verdict.get("freeze")
    if isinstance(freeze, Mapping):
        froze = (
            f"{freeze['seeds_frozen']} of {freeze['seeds']} seeds froze, {freeze['layers_frozen']} of "
            f"{freeze['seeds'] * freeze['layers']} gated layers"
            if freeze.get("seeds_frozen") is not None
            else "how many froze is not recorded"
        )
        lines.append(
            f"Claim b's AutoNorm-S (`{freeze['arm']}`): the searched gate frozen at the end of epoch "
            f"{freeze['t_freeze']} of {freeze['epochs']} (rule `{freeze['rule']}`, ε_H {freeze['eps_h']:g}; "
            f"{freeze['frozen_share']:.0%} of training frozen when it freezes): {froze}."
        )
    for arm, entry in (verdict.get("reported_arms") or {}).items():
        versus = "; ".join(
            f"− {other}: {_num(v.get('estimate'))} (CI {_num((v.get('ci') or [None, None])[0])} … "
            f"{_num((v.get('ci') or [None, None])[1])}, p {v['p_value']:.3g} unadjusted, {v.get('n_seeds')} seeds)"
            if v.get("p_value") is not None
            else f"− {other}: too few paired seeds ({v.get('n_seeds')})"
            for other, v in (entry.get("versus") or {}).items()
        )
        lines.append(
            f"`{arm}` (the searched configuration as found) is reported, not a claim's arm: "
            f"{entry.get('metric')} {versus or 'no arm to set it against'}."
        )
    return lines
