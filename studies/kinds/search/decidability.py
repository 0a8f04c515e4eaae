"""Designs of the search kind (its AutoNorm claims) that can never decide (see :mod:`studies.decidability`)."""

from __future__ import annotations

from typing import Any

from studies.decidability import Undecidable, fewest_seeds, sequential_undecidable, too_few_seeds

__all__ = ["undecidable"]


def undecidable(spec: Any) -> list[Undecidable]:
    """The claims whose design cannot reach a decision: the gates of
    :func:`studies.kinds.search.claims.autonorm_claims` (``confirm.min_seeds``, the smallest sign-flip
    p times the Holm family below ``alpha``), checked before the study runs."""
    from studies.kinds.search.claims import _APPLIES, _CONTRASTS
    from studies.kinds.search.spec import data_kind_of
    from studies.stats import min_sign_flip_p as _min_attainable_p

    confirm = spec.confirm
    if confirm is None or not confirm.run_claims:
        return []
    kind = confirm.data_kind if confirm.data_kind != "auto" else data_kind_of(spec.data)
    k, alpha, arms = len(confirm.seeds), confirm.alpha, set(confirm.arms)
    family = [c for c in _CONTRASTS if kind in _APPLIES[c[0]]]
    out: list[Undecidable] = []
    if getattr(spec, "sequential", None) is not None:
        names = [f"claim {c}" for c, a, b, _ in family if {a, b} <= arms]
        return sequential_undecidable(spec, names, alpha)

    def add(claim: str, p_of: Any) -> None:
        p = p_of(k)
        reasons = too_few_seeds(k, confirm.min_seeds, "confirm.min_seeds")
        if p >= alpha:
            reasons.append(
                "the sign-flip p"
                + (f" times the Holm family size ({len(family)})" if claim in {c[0] for c in family} else "")
                + " cannot get below alpha"
            )
        if reasons:
            needed = fewest_seeds(p_of, alpha, confirm.min_seeds)
            out.append(
                Undecidable(f"claim {claim}", "confirm.seeds", p, alpha, k, needed, "; ".join(reasons))
            )

    for claim, arm_a, arm_b, alternative in family:
        if {arm_a, arm_b} <= arms:
            add(claim, lambda n, alt=alternative: _min_attainable_p(n, alt) * len(family))
    gated = bool(arms & {"autonorm", "autonorm_s"})
    if gated and kind in _APPLIES["c"]:
        add("c", lambda n: _min_attainable_p(n, "greater"))
    if gated and kind in _APPLIES["d"]:
        add("d", lambda n: 0.5**n)
    return out
