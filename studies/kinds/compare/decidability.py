"""Designs of the compare kind that can never decide (see :mod:`studies.decidability`)."""

from __future__ import annotations

from typing import Any

from studies.decidability import Undecidable, fewest_seeds, too_few_seeds

__all__ = ["undecidable"]


def undecidable(spec: Any) -> list[Undecidable]:
    """The contrasts the design cannot decide: the ``underpowered`` gate of
    :func:`studies.kinds.compare.analysis.compare_arms` (fewer than ``analysis.min_seeds`` seeds, or
    the smallest two-sided sign-flip p, 2 / 2^K, times the number of contrasts not below ``alpha``),
    checked before the study runs."""
    from studies.stats import min_sign_flip_p

    a = spec.analysis
    family = len(spec.contrast_specs)
    k = len(spec.seeds)

    def floor(n: int) -> float:
        return min_sign_flip_p(n, "two-sided") * family

    reasons = too_few_seeds(k, a.min_seeds, "analysis.min_seeds")
    if floor(k) >= a.alpha:
        reasons.append(
            f"the sign-flip p (at least 2/2^K) times the Holm family size ({family} contrasts) cannot get below alpha"
        )
    if not reasons:
        return []
    needed = fewest_seeds(floor, a.alpha, a.min_seeds)
    return [
        Undecidable(name, "seeds", floor(k), a.alpha, k, needed, "; ".join(reasons))
        for name in spec.contrast_specs
    ]
