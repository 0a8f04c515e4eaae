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

Each kind says which of its hypotheses cannot be decided (:meth:`studies.contract.StudyKind.
undecidable`, in ``studies/kinds/<kind>/decidability.py``), mirroring its own analysis's gates; this
module has the floors they share and the refusal. ``tests/studies/test_decidability.py`` checks that a
design refused here is one the analysis calls underpowered. A sequential design (anytime-valid tests)
is refused when its last look cannot reject (:func:`sequential_floor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from studies.schema import SpecError, SpecIssue

if TYPE_CHECKING:
    from studies.contract import StudyKind

__all__ = [
    "MAX_SEEDS_SEARCHED",
    "Undecidable",
    "check_decidable",
    "fewest_seeds",
    "permutation_floor",
    "sequential_floor",
    "sequential_undecidable",
    "too_few_seeds",
    "undecidable",
]

MAX_SEEDS_SEARCHED = 64


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


def sequential_undecidable(spec: Any, names: list[str], alpha: float) -> list[Undecidable]:
    """The hypotheses ``names`` of a sequential design (``spec.sequential``) when its last look cannot
    reject: the anytime p floor of :func:`sequential_floor` with Holm's family of ``len(names)``."""
    seq = spec.sequential
    looks = seq.schedule()
    family = len(names)

    def floor(n: int) -> float:
        return sequential_floor(n, prior_scale=seq.prior_scale, family=family)

    if floor(looks[-1]) < alpha:
        return []
    needed = next((n for n in range(2, 10 * MAX_SEEDS_SEARCHED) if floor(n) < alpha), None)
    why = (
        f"no look of the sequential design can reject (the mixture t-test's e-value is at most "
        f"(1 + n g)^((n - 1)/2), g = {seq.prior_scale:g}, times the Holm family size {family}); "
        f"looks at {', '.join(map(str, looks))} seeds"
    )
    return [
        Undecidable(h, "sequential.max_seeds", floor(looks[-1]), alpha, looks[-1], needed, why) for h in names
    ]


def too_few_seeds(seeds: int, min_seeds: int, path: str) -> list[str]:
    """The reason a design of ``seeds`` seeds fails the gate ``path`` (``min_seeds``), if it does."""
    return [f"fewer seeds than {path} ({min_seeds})"] if seeds < min_seeds else []


def fewest_seeds(floor: Callable[[int], float], alpha: float, min_seeds: int) -> int | None:
    """The fewest seeds, from ``min_seeds`` (at least 2) up to :data:`MAX_SEEDS_SEARCHED`, whose
    smallest attainable p ``floor(seeds)`` is below ``alpha``; ``None`` when more seeds alone do not
    help."""
    return next((n for n in range(max(min_seeds, 2), MAX_SEEDS_SEARCHED + 1) if floor(n) < alpha), None)


def permutation_floor(n_batch_sizes: int, n_seeds: int, n_perm: int) -> float:
    """The smallest within-seed permutation p of ``n_seeds`` seeds with ``n_batch_sizes`` distinct
    labels each: exact enumeration up to the limit, else Monte-Carlo with the +1 correction."""
    from studies.stats import EXACT_PERMUTATION_LIMIT, log_n_permutations

    x = np.arange(n_batch_sizes, dtype=float)
    log_n = log_n_permutations([x] * n_seeds)
    exact = log_n <= math.log(EXACT_PERMUTATION_LIMIT) + 1e-9
    return math.exp(-log_n) if exact else max(math.exp(-log_n), 1.0 / (n_perm + 1))


def undecidable(spec: Any, kind: StudyKind) -> list[Undecidable]:
    """Every hypothesis of ``spec`` that its design can never decide (the kind's
    :meth:`studies.contract.StudyKind.undecidable`); empty when all can."""
    return list(kind.undecidable(spec))


def check_decidable(spec: Any, kind: StudyKind, *, allow_exploratory: bool = False) -> Any:
    """``spec`` itself when every hypothesis can be decided, or when it is exploratory (then marked
    ``exploratory: true``, which the report shows); else :class:`SpecError` naming each hypothesis.

    Raises:
        SpecError: the design cannot decide (exit 2 in every entry point).
    """
    issues = undecidable(spec, kind)
    if not issues:
        return spec
    if getattr(spec, "exploratory", False):
        return spec
    if allow_exploratory:
        return spec.model_copy(update={"exploratory": True})
    raise SpecError([SpecIssue(u.path, u.message()) for u in issues])
