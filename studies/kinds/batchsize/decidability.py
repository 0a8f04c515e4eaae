"""Designs of the batch-size kind that can never decide (see :mod:`studies.decidability`)."""

from __future__ import annotations

from typing import Any

from studies.decidability import (
    Undecidable,
    fewest_seeds,
    permutation_floor,
    sequential_undecidable,
    too_few_seeds,
)

__all__ = ["undecidable"]


def undecidable(spec: Any) -> list[Undecidable]:
    """The fix arms (per budget) whose design cannot reach a decision: the power gate of
    :func:`studies.kinds.batchsize.analysis.batchsize_trend` (``analysis.min_seeds`` seeds, 4 batch
    sizes, the smallest permutation p times the number of fix arms below ``alpha``), checked before
    the study runs."""
    from studies.kinds.batchsize.hypothesis import MIN_BATCH_SIZES as _MIN_BATCH_SIZES

    a = spec.analysis
    family = len(spec.fix_arms)
    k, s = len(spec.batch_sizes), len(spec.seeds)
    if getattr(spec, "sequential", None) is not None:
        names = [f"{arm} ({budget})" for budget in spec.budgets for arm in spec.fix_arms]
        return sequential_undecidable(spec, names, a.alpha)

    def floor(seeds: int) -> float:
        return permutation_floor(k, seeds, a.n_perm) * family

    out: list[Undecidable] = []
    p = floor(s)
    reasons = too_few_seeds(s, a.min_seeds, "analysis.min_seeds")
    if k < _MIN_BATCH_SIZES:
        reasons.append(f"fewer than {_MIN_BATCH_SIZES} batch sizes")
    if p >= a.alpha:
        reasons.append(
            f"the permutation p times the Holm family size ({family} fix arms) cannot get below alpha"
        )
    if not reasons:
        return out
    needed = fewest_seeds(floor, a.alpha, a.min_seeds) if k >= _MIN_BATCH_SIZES else None
    path = "batch_sizes" if k < _MIN_BATCH_SIZES else "seeds"
    for budget in spec.budgets:
        for arm in spec.fix_arms:
            out.append(Undecidable(f"{arm} ({budget})", path, p, a.alpha, s, needed, "; ".join(reasons)))
    return out
