"""Power of a fixed design: the one-sample t-test's noncentral t power and the seeds it needs; and,
for an estimate on the wrong side of its claim, the seeds at which the claim would be given up
(:func:`seeds_to_futility`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from studies.stats._checks import Alternative, _check_alpha, _check_alternative, _scipy_stats

__all__ = ["futility_needs", "power_of_t_test", "seeds_needed", "seeds_to_futility", "wrong_side"]


def power_of_t_test(
    k: int,
    effect: float,
    sd: float,
    *,
    alpha: float,
    alternative: Alternative = "two-sided",
) -> float:
    """Power of the one-sample t-test of mean 0 with ``k`` normal values of mean ``effect``, sd ``sd``.

    Args:
        k: number of values (seeds), at least 2 (the t-test needs a sample sd).
        effect: the true mean's magnitude in the direction of the alternative (its sign is ignored).
        sd: the values' standard deviation, > 0.
        alpha: the test's level (already corrected for multiplicity, if any).
        alternative: ``"less"`` / ``"greater"`` (one-sided) or ``"two-sided"``.

    Returns:
        The probability of rejecting: with ``t_c`` the critical value of the central t distribution
        (df = k - 1) at ``alpha`` (one-sided) or ``alpha / 2`` (two-sided) and
        ``nc = |effect| / sd * sqrt(k)``, ``P(T > t_c)`` one-sided and ``P(T > t_c) + P(T < -t_c)``
        two-sided, T noncentral t. ``effect = 0`` gives ``alpha`` (the test's size).
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    if not math.isfinite(effect):
        raise ValueError(f"effect must be finite, got {effect!r}")
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be finite and > 0, got {sd!r}")
    _check_alpha(alpha)
    _check_alternative(alternative)
    df = int(k) - 1
    nc = abs(effect) / sd * math.sqrt(int(k))
    if alternative == "two-sided":
        crit = float(_scipy_stats().t.isf(alpha / 2, df))
        # P(T < -crit | nc) written as P(T > crit | -nc): scipy's nct.cdf returns NaN for that far
        # tail once nc is large (e.g. df = 4999, nc = 35), nct.sf with the mirrored nc does not.
        power = float(_scipy_stats().nct.sf(crit, df, nc)) + float(_scipy_stats().nct.sf(crit, df, -nc))
    else:
        # By symmetry, "less" at mean -|effect| has the power of "greater" at +|effect|.
        crit = float(_scipy_stats().t.isf(alpha, df))
        power = float(_scipy_stats().nct.sf(crit, df, nc))
    if not math.isfinite(power):
        raise ArithmeticError(f"noncentral t power not computable for k={k}, nc={nc}, alpha={alpha}")
    return min(1.0, max(0.0, power))


def seeds_needed(
    values: Sequence[float],
    *,
    alpha: float,
    family_size: int,
    power: float = 0.8,
    min_effect: float | None = None,
    alternative: Alternative = "two-sided",
    k_max: int = 10_000,
) -> int | None:
    """The smallest number of seeds K >= 2 at which the study's t-test reaches ``power``.

    Args:
        values: per-seed values from a pilot (at least 2, finite).
        alpha: the family-wise level before correction.
        family_size: number of hypotheses tested together (e.g. arms vs. the control); the test
            is planned at ``alpha / family_size``, the level of Holm's first step (Bonferroni).
        power: the target power, in (0, 1).
        min_effect: the smallest effect worth detecting; by default the pilot's ``|mean(values)|``.
            Its sign is ignored (a magnitude in the direction of ``alternative``).
        alternative: the study's hypothesis direction, ``"less"``, ``"greater"`` or ``"two-sided"``.
        k_max: the largest K considered.

    Returns:
        K, or ``None`` when even ``k_max`` seeds do not reach ``power`` (e.g. a zero effect), or
        when the pilot values are all equal with a zero effect (nothing to detect, no spread to
        plan with). When the values are all equal and the effect is not zero (sd = 0), K = 2: a
        t-test on values without spread rejects with the smallest sample it accepts; such a pilot
        says more about too few or degenerate seeds than about the study, so check it.
    """
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"values must be a flat sequence of at least 2 numbers, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must all be finite")
    _check_alpha(alpha)
    if isinstance(family_size, bool) or not isinstance(family_size, int | np.integer) or family_size < 1:
        raise ValueError(f"family_size must be an integer >= 1, got {family_size!r}")
    _check_alpha(power, "power")
    _check_alternative(alternative)
    if isinstance(k_max, bool) or not isinstance(k_max, int | np.integer) or k_max < 2:
        raise ValueError(f"k_max must be an integer >= 2, got {k_max!r}")
    if min_effect is not None and not math.isfinite(min_effect):
        raise ValueError(f"min_effect must be finite, got {min_effect!r}")

    effect = abs(float(min_effect)) if min_effect is not None else abs(float(arr.mean()))
    sd = float(arr.std(ddof=1))
    if sd == 0.0:
        return 2 if effect > 0.0 else None
    level = alpha / family_size

    def reaches(k: int) -> bool:
        return power_of_t_test(k, effect, sd, alpha=level, alternative=alternative) >= power

    if not reaches(int(k_max)):
        return None
    # Power grows with K (both the noncentrality and the degrees of freedom do): bisect.
    lo, hi = 1, int(k_max)  # reaches(hi); lo is below the smallest K considered
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= 2 and reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi


def wrong_side(estimate: float | None, alternative: Alternative) -> bool:
    """Whether ``estimate`` lies on the wrong side of 0 for a one-sided claim (``"greater"``: below 0,
    ``"less"``: above 0); never for ``"two-sided"`` or a missing estimate."""
    _check_alternative(alternative)
    if estimate is None or not math.isfinite(estimate):
        return False
    return (alternative == "greater" and estimate < 0) or (alternative == "less" and estimate > 0)


def _half_width(n: int, sd: float, *, alpha: float, sequential: bool, confidence: float, g: float) -> float:
    """Half the width of the interval a study reads at ``n`` seeds with per-seed sd ``sd``: the
    mixture t-test's confidence sequence (:func:`studies.stats.anytime.confidence_sequence`, infinite
    while too few seeds) or the two-sided t-interval at ``confidence``."""
    if sequential:
        c = 1.0 + n * g
        log_k = (math.log(c) - 2.0 * math.log(alpha)) / n
        if log_k >= math.log(c):
            return math.inf
        kk = math.exp(log_k)
        return sd / math.sqrt(n) * math.sqrt((n - 1) * (kk - 1.0) / (1.0 - kk / c))
    return float(_scipy_stats().t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)


def seeds_to_futility(
    values: Sequence[float],
    *,
    alpha: float,
    alternative: Alternative,
    min_effect: float | None = None,
    sequential: bool = True,
    prior_scale: float = 1.0,
    confidence: float | None = None,
    k_max: int = 10_000,
) -> int | None:
    """The seeds at which a claim whose per-seed values point the other way would be given up.

    Projected at the per-seed mean and sd the study saw (both held fixed as seeds are added): the
    smallest K >= 2 at which the interval the study decides with excludes every effect of at least
    ``min_effect`` in the claimed direction (``alternative``: ``"greater"``: its upper bound below
    ``min_effect``; ``"less"``: its lower bound above ``-min_effect``). ``sequential``: the mixture
    t-test's confidence sequence at level 1 - ``alpha`` (``prior_scale`` its g) -- the protocol's
    futility rule (the protocol's §4); else the fixed design's two-sided t-interval at ``confidence``
    (default 1 - ``alpha``), which refutes the claim once it lies on the other side of the
    threshold. ``min_effect`` ``None`` means 0: the interval entirely on the wrong side.

    Returns:
        K, or ``None`` for a two-sided claim, fewer than 2 finite values, or a mean that does not lie
        beyond the threshold (no seed count excludes the claimed effects then), or when ``k_max``
        seeds do not suffice.
    """
    _check_alpha(alpha)
    _check_alternative(alternative)
    if min_effect is not None and not (math.isfinite(min_effect) and min_effect >= 0):
        raise ValueError(f"min_effect must be finite and >= 0 (or None), got {min_effect!r}")
    level = 1.0 - alpha if confidence is None else confidence
    _check_alpha(level, "confidence")
    arr = np.asarray(values, dtype=float).ravel()
    arr = arr[np.isfinite(arr)]
    if alternative == "two-sided" or arr.size < 2:
        return None
    threshold = float(min_effect or 0.0)
    # Orient so the claim is "greater": futile once mean + half < threshold.
    mean = float(arr.mean()) if alternative == "greater" else -float(arr.mean())
    sd = float(arr.std(ddof=1))
    if mean >= threshold:
        return None

    def futile(k: int) -> bool:
        half = _half_width(k, sd, alpha=alpha, sequential=sequential, confidence=level, g=prior_scale)
        return mean + half < threshold

    if not futile(int(k_max)):
        return None
    lo, hi = 1, int(k_max)  # futile(hi); the half-width shrinks with K, so bisect
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= 2 and futile(mid):
            hi = mid
        else:
            lo = mid
    return hi


def futility_needs(
    per_seed: Mapping[str, Sequence[float]],
    *,
    alternatives: Mapping[str, Alternative],
    alpha: float,
    min_effect: float | None,
    sequential: bool,
    prior_scale: float = 1.0,
    confidence: float | None = None,
) -> dict[str, Any]:
    """For each test of a family, from its per-seed values: ``estimate`` (their mean, signed; ``None``
    without a value), ``wrong_side`` (:func:`wrong_side` of it for ``alternatives[name]``) and
    ``futility_seeds`` (:func:`seeds_to_futility` where it is on the wrong side, else ``None``);
    ``futility_rule`` says which interval (``"sequential"``: the confidence sequence, ``"fixed"``:
    the t-interval) and ``futility_effect`` the effect it must exclude (``min_effect``, 0 when
    ``None``)."""
    out: dict[str, Any] = {
        "estimate": {},
        "wrong_side": {},
        "futility_seeds": {},
        "futility_rule": "sequential" if sequential else "fixed",
        "futility_effect": float(min_effect or 0.0),
    }
    for name, values in per_seed.items():
        arr = np.asarray(list(values), dtype=float)
        arr = arr[np.isfinite(arr)]
        est = float(arr.mean()) if arr.size else None
        alternative = alternatives[name]
        side = wrong_side(est, alternative)
        out["estimate"][name] = est
        out["wrong_side"][name] = side
        out["futility_seeds"][name] = (
            seeds_to_futility(
                arr,
                alpha=alpha,
                alternative=alternative,
                min_effect=min_effect,
                sequential=sequential,
                prior_scale=prior_scale,
                confidence=confidence,
            )
            if side
            else None
        )
    return out
