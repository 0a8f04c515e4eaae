"""Designs that can never decide, found before they run: the smallest p-value each hypothesis can reach.

A hypothesis test on K seeds has a floor: the exact sign-flip test of K paired differences cannot give
a p below 1/2^K (2/2^K two-sided), the within-seed permutation test of the batch-size study not below
1 / (number of distinct arrangements) — or 1 / (n_perm + 1) once it draws Monte-Carlo permutations —,
and Holm's first step multiplies the smallest p by the family size. Where that floor is at or above
α, or the power gate's own minimum (``min_seeds``, four batch sizes) is not met, the analysis gives
``inconclusive`` (``underpowered``) by rule, whatever the data: the study would spend its whole budget
to learn nothing. :func:`undecidable` finds these designs per hypothesis, with the seeds that would
be needed; :func:`check_decidable` turns them into spec errors (exit 2) unless the study is marked
exploratory (``exploratory: true`` in the spec, or ``--allow-exploratory``), in which case it runs and
its report says "exploratory" (the analysis marks the same hypotheses ``underpowered``).

The floors mirror the analyses exactly (``studies.analysis.batchsize_trend``,
``studies.claims.autonorm_claims``); ``tests/studies/test_decidability.py`` checks that a design
refused here is one the analysis calls underpowered. A sequential design (anytime-valid tests) has
its own first look that can reject; it is checked where the kind has one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from studies.spec import SpecError, SpecIssue

__all__ = ["Undecidable", "check_decidable", "sequential_floor", "undecidable"]

_MAX_SEEDS_SEARCHED = 64


@dataclass(frozen=True)
class Undecidable:
    """One hypothesis the design can never decide.

    Attributes:
        hypothesis: its name (a fix arm and budget, a claim id).
        path: the spec field to change (seeds, batch_sizes, ...).
        attainable_p: the smallest p the design can reach, after Holm's family factor.
        alpha: the level it must get below.
        seeds: seeds in the design.
        seeds_needed: the fewest seeds that can decide (None: more seeds alone do not help).
        why: the rule that fails, in words.
    """

    hypothesis: str
    path: str
    attainable_p: float
    alpha: float
    seeds: int
    seeds_needed: int | None
    why: str

    def message(self) -> str:
        need = (
            f"; it needs at least {self.seeds_needed} seeds"
            if self.seeds_needed is not None
            else "; more seeds alone do not help"
        )
        return (
            f"hypothesis {self.hypothesis!r} can never be decided: {self.why} (smallest attainable p "
            f"{self.attainable_p:.3g} vs alpha {self.alpha:g}, {self.seeds} seeds){need}. Run it anyway as "
            "exploratory with --allow-exploratory or `exploratory: true`"
        )


def sequential_floor(n_seeds: int, *, prior_scale: float, family: int) -> float:
    """The smallest anytime p (times Holm's family size) the mixture t-test can reach with ``n_seeds``:
    its e-value is at most ``(1 + n g)^((n - 1) / 2)`` (``t`` → ∞), and p = 1 / max e-value."""
    if n_seeds < 2:
        return math.inf
    log_e_max = 0.5 * (n_seeds - 1) * math.log1p(n_seeds * prior_scale)
    return family * math.exp(-log_e_max)


def _sequential(spec: Any, names: list[str], alpha: float) -> list[Undecidable]:
    """A sequential design: can its last look reject, and from which look on can it?"""
    seq = spec.sequential
    looks = seq.schedule()
    family = len(names)

    def floor(n: int) -> float:
        return sequential_floor(n, prior_scale=seq.prior_scale, family=family)

    if floor(looks[-1]) < alpha:
        return []
    needed = next((n for n in range(2, 10 * _MAX_SEEDS_SEARCHED) if floor(n) < alpha), None)
    why = (
        f"no look of the sequential design can reject (the mixture t-test's e-value is at most "
        f"(1 + n g)^((n - 1)/2), g = {seq.prior_scale:g}, times the Holm family size {family}); "
        f"looks at {', '.join(map(str, looks))} seeds"
    )
    return [
        Undecidable(h, "sequential.max_seeds", floor(looks[-1]), alpha, looks[-1], needed, why) for h in names
    ]


# ---- batch-size kind ------------------------------------------------------------------------------


def _permutation_floor(n_batch_sizes: int, n_seeds: int, n_perm: int) -> float:
    from studies.stats import EXACT_PERMUTATION_LIMIT, log_n_permutations

    x = np.arange(n_batch_sizes, dtype=float)
    log_n = log_n_permutations([x] * n_seeds)
    exact = log_n <= math.log(EXACT_PERMUTATION_LIMIT) + 1e-9
    return math.exp(-log_n) if exact else max(math.exp(-log_n), 1.0 / (n_perm + 1))


def _batchsize(spec: Any) -> list[Undecidable]:
    from studies.kinds.batchsize.analysis import _MIN_BATCH_SIZES

    a = spec.analysis
    family = len(spec.fix_arms)
    k, s = len(spec.batch_sizes), len(spec.seeds)
    if getattr(spec, "sequential", None) is not None:
        names = [f"{arm} ({budget})" for budget in spec.budgets for arm in spec.fix_arms]
        return _sequential(spec, names, a.alpha)

    def floor(seeds: int) -> float:
        return _permutation_floor(k, seeds, a.n_perm) * family

    out: list[Undecidable] = []
    p = floor(s)
    reasons = []
    if s < a.min_seeds:
        reasons.append(f"fewer seeds than analysis.min_seeds ({a.min_seeds})")
    if k < _MIN_BATCH_SIZES:
        reasons.append(f"fewer than {_MIN_BATCH_SIZES} batch sizes")
    if p >= a.alpha:
        reasons.append(
            f"the permutation p times the Holm family size ({family} fix arms) cannot get below alpha"
        )
    if not reasons:
        return out
    needed: int | None = None
    if k >= _MIN_BATCH_SIZES:
        needed = next(
            (n for n in range(max(a.min_seeds, 2), _MAX_SEEDS_SEARCHED + 1) if floor(n) < a.alpha), None
        )
    path = "batch_sizes" if k < _MIN_BATCH_SIZES else "seeds"
    for budget in spec.budgets:
        for arm in spec.fix_arms:
            out.append(Undecidable(f"{arm} ({budget})", path, p, a.alpha, s, needed, "; ".join(reasons)))
    return out


# ---- search kind (the AutoNorm claims after a search) ------------------------------------------------


def _search(spec: Any) -> list[Undecidable]:
    from studies.kinds.search.claims import _APPLIES, _CONTRASTS
    from studies.kinds.search.spec import data_kind_of
    from studies.stats import min_sign_flip_p as _min_attainable_p

    confirm = spec.confirm
    if confirm is None or not confirm.run_claims:
        return []
    kind = confirm.data_kind if confirm.data_kind != "auto" else data_kind_of(spec.data.type)
    k, alpha, arms = len(confirm.seeds), confirm.alpha, set(confirm.arms)
    family = [c for c in _CONTRASTS if kind in _APPLIES[c[0]]]
    out: list[Undecidable] = []
    if getattr(spec, "sequential", None) is not None:
        names = [f"claim {c}" for c, a, b, _ in family if {a, b} <= arms]
        return _sequential(spec, names, alpha)

    def add(claim: str, p_of: Any) -> None:
        p = p_of(k)
        reasons = []
        if k < confirm.min_seeds:
            reasons.append(f"fewer seeds than confirm.min_seeds ({confirm.min_seeds})")
        if p >= alpha:
            reasons.append(
                "the sign-flip p"
                + (f" times the Holm family size ({len(family)})" if claim in {c[0] for c in family} else "")
                + " cannot get below alpha"
            )
        if reasons:
            needed = next(
                (n for n in range(max(confirm.min_seeds, 2), _MAX_SEEDS_SEARCHED + 1) if p_of(n) < alpha),
                None,
            )
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


def undecidable(spec: Any) -> list[Undecidable]:
    """Every hypothesis of ``spec`` (any kind) that its design can never decide; empty when all can."""
    kind = getattr(spec, "kind", "search")
    if kind == "batchsize":
        return _batchsize(spec)
    if kind == "search":
        return _search(spec)
    return []


def check_decidable(spec: Any, *, allow_exploratory: bool = False) -> Any:
    """``spec`` itself when every hypothesis can be decided, or when it is exploratory (then marked
    ``exploratory: true``, which the report shows); else :class:`SpecError` naming each hypothesis.

    Raises:
        SpecError: the design cannot decide (exit 2 in every entry point).
    """
    issues = undecidable(spec)
    if not issues:
        return spec
    if getattr(spec, "exploratory", False):
        return spec
    if allow_exploratory:
        return spec.model_copy(update={"exploratory": True})
    raise SpecError([SpecIssue(u.path, u.message()) for u in issues])
