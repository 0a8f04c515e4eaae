"""The statistics of every study kind: pure numpy/scipy, no study vocabulary.

One module so that one rule holds everywhere (docs/science.md; the protocol's §2-§4):

* **Multiplicity**: :func:`holm`, the only Holm step-down in the code base. Its rule: the family is
  the hypotheses whose p-value is defined; a ``None`` or NaN p-value is not in the family and stays
  ``None``; a p-value outside [0, 1] is an error. Tied p-values get the same adjusted value, so the
  order in which ties are visited does not matter.
* **Fixed designs**: paired contrasts with an exact sign-flip p (:func:`paired_contrast`), the
  within-seed permutation test of a trend (:func:`permutation_p_value`), t-intervals and a seed
  bootstrap (:func:`t_interval`, :func:`seed_interval`), one-sample t-tests (:func:`t_test_p`) and their
  power (:func:`power_of_t_test`, :func:`seeds_needed`).
* **Sequential designs** (the protocol's §4): the normal-mixture t-test, anytime-valid for unknown
  variance (Wang & Ramdas, arXiv 2310.03722, Thm 4.9; the ``safestats`` R package):
  :func:`mixture_log_e_values`, :func:`confidence_sequence`, :func:`sequential_test` for one
  hypothesis, :func:`sequential_family` for a family with Holm at every look and
  :func:`sequential_looks` to replay every planned look of a study from its per-seed values.

Every random draw comes from a ``numpy.random.Generator`` owned by the call; nothing seeds globally.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np


def _scipy_stats() -> Any:
    """``scipy.stats``, imported on first use: it costs ~0.4 s, and validating or planning a spec
    (which checks power with these functions only when a design is borderline) should not pay it."""
    from scipy import stats

    return stats


__all__ = [
    "DECISIONS",
    "EXACT_PERMUTATION_LIMIT",
    "Alternative",
    "confidence_sequence",
    "expected_seeds",
    "holm",
    "log_n_permutations",
    "mean_interval",
    "min_sign_flip_p",
    "mixture_log_e_values",
    "ols_slope",
    "paired_contrast",
    "permutation_p_value",
    "power_of_t_test",
    "seed_interval",
    "seeds_needed",
    "sequential_family",
    "sequential_looks",
    "sequential_test",
    "sign_flip_p",
    "t_interval",
    "t_test_p",
]

Alternative = Literal["less", "greater", "two-sided"]
_ALTERNATIVES = ("less", "greater", "two-sided")

#: Decisions of a sequential look: ``reject`` (the null is rejected at its Holm level), ``futile``
#: (the confidence sequence excludes every effect of at least ``min_effect`` in the predicted
#: direction), ``continue`` (undecided, more seeds planned), ``inconclusive`` (undecided at the last look).
DECISIONS = ("reject", "futile", "continue", "inconclusive")

#: Exact enumeration of the within-seed permutations up to this many distinct permutations.
EXACT_PERMUTATION_LIMIT = 100_000

_BOOTSTRAP_MIN_SEEDS = 10
_SIGN_FLIP_EXACT_LIMIT = 2**20  # sign patterns enumerated exactly up to this many (K <= 20 seeds)
_CHUNK_BITS = 16  # sign patterns per enumeration chunk: 2^16 x K floats at a time


def _check_alpha(alpha: float, name: str = "alpha") -> None:
    if isinstance(alpha, bool) or not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {alpha!r}")


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be 'less', 'greater' or 'two-sided', got {alternative!r}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


# ------------------------------------------------------------------------------------ multiplicity


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjusted p-values, in the input's key order.

    Over the ``m`` hypotheses with a defined p-value, ``p_(i)`` (ascending, i = 1..m) becomes
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``: monotone in the raw p-values, never below them, capped
    at 1. A ``None``/NaN p-value is not part of the family (it does not raise ``m``) and stays ``None``.
    Reject hypothesis i at level ``alpha`` when its adjusted p is ``<= alpha``.

    Raises:
        ValueError: a defined p-value outside [0, 1].
    """
    defined: dict[str, float] = {}
    for name, p in p_values.items():
        if p is None or (isinstance(p, float) and math.isnan(p)):
            continue
        value = float(p)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"p-values must lie in [0, 1], got {name!r}: {p!r}")
        defined[name] = value
    out: dict[str, float | None] = {name: None for name in p_values}
    m = len(defined)
    running = 0.0
    # Ties get the same adjusted value whatever order they are visited in: (m - j + 1) p only falls.
    for rank, (name, p) in enumerate(sorted(defined.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (m - rank) * p))
        out[name] = running
    return out


# --------------------------------------------------------------------------- intervals and t-tests


def ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` on ``x``; NaN when ``x`` has fewer than two distinct values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 2:
        return math.nan
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx <= 1e-12 * max(1.0, float(np.abs(x).max()) ** 2):
        return math.nan
    return float(xc @ (y - y.mean()) / sxx)


def t_interval(d: np.ndarray, confidence: float) -> tuple[float, float]:
    """Two-sided t-interval of the mean of ``d`` over its K >= 2 values (K - 1 df)."""
    d = np.asarray(d, dtype=float)
    mean = float(d.mean())
    sem = float(d.std(ddof=1) / math.sqrt(d.size))
    if sem == 0.0:  # identical values: the interval collapses to the point
        return mean, mean
    half = float(_scipy_stats().t.ppf(0.5 + confidence / 2.0, df=d.size - 1)) * sem
    return mean - half, mean + half


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float) -> tuple[float, float, float, int]:
    """``(mean, ci_low, ci_high, n)`` of the finite ``values``: their mean and two-sided t-interval
    (:func:`t_interval`); NaN bounds below two values, all NaN for none."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan, 0
    if v.size < 2:
        return float(v.mean()), math.nan, math.nan, 1
    lo, hi = t_interval(v, confidence)
    return float(v.mean()), lo, hi, int(v.size)


def seed_interval(
    values: np.ndarray, *, confidence: float, n_boot: int, rng: np.random.Generator
) -> tuple[float | None, list[float] | None, str | None]:
    """Mean of per-seed values and its CI: t-interval (K - 1 df) when K < 10, else a percentile
    bootstrap over seeds. Non-finite values are left out. Returns ``(estimate, ci, method)``; CI
    ``None`` when K < 2."""
    v = values[np.isfinite(values)]
    k = v.size
    if k == 0:
        return None, None, None
    est = float(v.mean())
    if k < 2:
        return est, None, None
    if k < _BOOTSTRAP_MIN_SEEDS:
        half = float(_scipy_stats().t.ppf(0.5 + confidence / 2.0, k - 1) * v.std(ddof=1) / math.sqrt(k))
        return est, [est - half, est + half], "t"
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=n_boot).astype(float)
    boot = counts @ v / k
    a = 1.0 - confidence
    lo, hi = np.quantile(boot, [a / 2.0, 1.0 - a / 2.0])
    return est, [float(lo), float(hi)], "bootstrap"


def t_test_p(values: np.ndarray, *, negative: bool) -> float | None:
    """One-sided one-sample t-test p of the per-seed values (H1: mean < 0 when ``negative``, else > 0);
    non-finite values are left out, ``None`` below 2 values."""
    v = values[np.isfinite(values)]
    if v.size < 2:
        return None
    sd = float(v.std(ddof=1))
    mean = float(v.mean())
    if sd == 0.0:
        return 0.0 if (mean < 0 if negative else mean > 0) else 1.0
    t = mean / (sd / math.sqrt(v.size))
    return float(_scipy_stats().t.cdf(t, v.size - 1) if negative else _scipy_stats().t.sf(t, v.size - 1))


# ------------------------------------------------------------------------- randomisation tests


def log_n_permutations(rows: Sequence[np.ndarray]) -> float:
    """log of the number of distinct within-seed arrangements of the batch-size labels:
    product over seeds of ``n_k! / prod(multiplicity!)``."""
    total = 0.0
    for x in rows:
        _, mult = np.unique(x, return_counts=True)
        total += math.lgamma(x.size + 1) - sum(math.lgamma(int(c) + 1) for c in mult)
    return total


def permutation_p_value(
    x_by_seed: Sequence[np.ndarray],
    d_by_seed: Sequence[np.ndarray],
    *,
    negative: bool,
    n_perm: int,
    rng: np.random.Generator,
    exact_limit: int = EXACT_PERMUTATION_LIMIT,
) -> tuple[float, str, int]:
    """One-sided within-seed permutation p of the mean per-seed slope of ``d`` on ``x``.

    The batch-size labels ``x`` are permuted within each seed; ``sum (x - mean)^2`` of a seed is
    unchanged, so each permuted per-seed slope is one dot product. With at most ``exact_limit``
    distinct permutations every one is enumerated and ``p = #{T* at least as extreme} / N`` (the
    observed arrangement is one of them); otherwise ``n_perm`` Monte-Carlo draws and ``p = (1 + hits)
    / (1 + n_perm)`` (Phipson & Smyth 2010). Seeds with fewer than two points are left out.

    Returns:
        ``(p, "exact" | "monte-carlo", number of permutations evaluated)``.
    """
    pairs = [(np.asarray(x, float), np.asarray(d, float)) for x, d in zip(x_by_seed, d_by_seed)]
    pairs = [(x, d) for x, d in pairs if x.size >= 2 and np.ptp(x) > 0]
    if not pairs:
        raise ValueError("no seed has two or more batch sizes")
    k = len(pairs)
    coefs = [(x - x.mean()) / float((x - x.mean()) @ (x - x.mean())) for x, _ in pairs]
    observed = sum(float(c @ d) for c, (_, d) in zip(coefs, pairs)) / k
    tol = 1e-9 * max(1.0, abs(observed))
    log_n = log_n_permutations([x for x, _ in pairs])
    if log_n <= math.log(exact_limit) + 1e-9:
        dist = np.zeros(1)
        for c, (_, d) in zip(coefs, pairs):
            perms = np.array(list(itertools.permutations(range(d.size))), dtype=np.intp)
            contrib = d[perms] @ c / k  # slope of d against the permuted labels, all permutations
            dist = (dist[:, None] + contrib[None, :]).ravel()
        hits = np.count_nonzero(dist <= observed + tol if negative else dist >= observed - tol)
        return float(hits / dist.size), "exact", int(dist.size)
    stat = np.zeros(n_perm)
    by_size: dict[int, list[int]] = {}
    for j, (x, _) in enumerate(pairs):
        by_size.setdefault(x.size, []).append(j)
    for size, idx in by_size.items():
        d_mat = np.stack([pairs[j][1] for j in idx])  # (g, size)
        c_mat = np.stack([coefs[j] for j in idx])  # (g, size)
        perm = rng.random((n_perm, len(idx), size)).argsort(axis=2)  # (n_perm, g, size)
        permuted = np.take_along_axis(np.broadcast_to(d_mat, perm.shape), perm, axis=2)
        stat += np.einsum("pgs,gs->p", permuted, c_mat) / k
    hits = np.count_nonzero(stat <= observed + tol if negative else stat >= observed - tol)
    return float((1 + hits) / (1 + n_perm)), "monte-carlo", int(n_perm)


def _tail_count(totals: np.ndarray, observed: float, alternative: str, tol: float) -> int:
    """How many sign-flipped sums are at least as extreme as the observed one."""
    if alternative == "greater":
        return int(np.count_nonzero(totals >= observed - tol))
    if alternative == "less":
        return int(np.count_nonzero(totals <= observed + tol))
    return int(np.count_nonzero(np.abs(totals) >= abs(observed) - tol))


def sign_flip_p(d: np.ndarray, alternative: str, *, n_mc: int, seed: int) -> tuple[float, str]:
    """Sign-flip p of ``sum(d)``: exact over all 2^K patterns, or Monte-Carlo with the +1 correction."""
    k = d.size
    observed = float(d.sum())
    # Sums of the same numbers in another order differ by rounding only: count those as ties.
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    if 2**k <= _SIGN_FLIP_EXACT_LIMIT:
        bits = np.arange(k)
        count = 0
        chunk = min(2**k, 2**_CHUNK_BITS)
        for start in range(0, 2**k, chunk):
            codes = np.arange(start, start + chunk)[:, None]
            signs = 1.0 - 2.0 * ((codes >> bits) & 1)  # (chunk, K) in {+1, -1}
            count += _tail_count(signs @ d, observed, alternative, tol)
        return count / 2**k, "exact"
    if n_mc < 1:
        raise ValueError(f"n_mc must be positive, got {n_mc}")
    rng = np.random.default_rng(seed)
    count = 0
    remaining = n_mc
    while remaining:
        n = min(remaining, 2**_CHUNK_BITS)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(n, k))
        count += _tail_count(signs @ d, observed, alternative, tol)
        remaining -= n
    return (count + 1) / (n_mc + 1), "monte-carlo"


def min_sign_flip_p(k: int, alternative: str) -> float:
    """Smallest sign-flip p with K seeds (exact enumeration; Monte-Carlo cannot go lower in practice)."""
    if k < 1:
        return 1.0
    return (2.0 if alternative == "two-sided" else 1.0) / 2.0**k


def paired_contrast(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    alternative: Alternative = "greater",
    confidence: float = 0.95,
    n_mc: int = 99_999,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired contrast of two arms over the same seeds: mean difference, t-interval, sign-flip p.

    Args:
        a: per-seed values of the first arm.
        b: per-seed values of the second arm, aligned with ``a`` (same seed at the same position).
        alternative: ``"greater"`` (H1: mean of ``a − b`` > 0), ``"less"`` or ``"two-sided"``.
        confidence: level of the two-sided t-interval.
        n_mc: Monte-Carlo sign patterns when ``2^K`` exceeds ``2^20`` (K > 20 seeds).
        seed: seeds the Monte-Carlo draws (a ``numpy.random.Generator`` owned by the call).

    Returns:
        ``{"estimate", "ci": [lo, hi], "p_value", "n_seeds", "differences", "alternative",
        "confidence", "method": "exact" | "monte-carlo"}``; ``estimate`` = mean of ``d = a − b``,
        ``ci`` the t-interval over seeds (K − 1 df), ``p_value`` the sign-flip p of ``sum(d)`` (ties,
        e.g. the identity pattern, count as at least as extreme).

    Raises:
        ValueError: different lengths, fewer than 2 seeds, non-finite values, bad options.
    """
    _check_alternative(alternative)
    _check_confidence(confidence)
    x = np.asarray(a, dtype=float).ravel()
    y = np.asarray(b, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"a and b must be aligned per seed, got lengths {x.size} and {y.size}")
    if x.size < 2:
        raise ValueError(f"need at least 2 seeds for a t-interval, got {x.size}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite (score failed trials before calling)")
    d = x - y
    lo, hi = t_interval(d, confidence)
    p, method = sign_flip_p(d, alternative, n_mc=n_mc, seed=seed)
    return {
        "estimate": float(d.mean()),
        "ci": [lo, hi],
        "p_value": float(p),
        "n_seeds": int(d.size),
        "differences": [float(v) for v in d],
        "alternative": alternative,
        "confidence": confidence,
        "method": method,
    }


# ------------------------------------------------------------------------------ power (fixed n)


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


# ------------------------------------------------------------- sequential: the mixture t-test


def _check_prior_scale(prior_scale: float) -> None:
    if isinstance(prior_scale, bool) or not (
        isinstance(prior_scale, int | float) and math.isfinite(prior_scale) and prior_scale > 0
    ):
        raise ValueError(f"prior_scale must be finite and > 0, got {prior_scale!r}")


def _prefix_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and sample sd of every prefix ``x[..., :k]``, k = 1..n, along the last axis (sd NaN at k = 1).

    Shifted by the overall mean first so that the running sums of squares lose no digits."""
    n = x.shape[-1]
    shift = x.mean(axis=-1, keepdims=True)
    y = x - shift
    k = np.arange(1, n + 1, dtype=float)
    s1 = np.cumsum(y, axis=-1)
    s2 = np.cumsum(y * y, axis=-1)
    mean_y = s1 / k
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(k > 1, np.maximum(s2 - k * mean_y * mean_y, 0.0) / (k - 1), np.nan)
    return k, mean_y + shift, np.sqrt(var)


def _log_e(n: np.ndarray, mean: np.ndarray, sd: np.ndarray, mu0: float, g: float) -> np.ndarray:
    """log E_n of the normal-mixture t-test (the protocol's §4), elementwise; 0 (E = 1) below n = 2.

    ``E_n = c^(-1/2) [(1 + t^2/nu) / (1 + t^2/(nu c))]^(n/2)`` with ``c = 1 + n g``, ``nu = n - 1``,
    ``t = sqrt(n) (mean - mu0) / sd``. Zero spread with a mean off ``mu0`` is the limit t -> inf,
    ``E_n = c^((n - 1)/2)``, the largest value n values can give.
    """
    n = np.asarray(n, dtype=float)
    c = 1.0 + n * g
    nu = np.maximum(n - 1.0, 1.0)
    diff = np.asarray(mean, dtype=float) - mu0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        u = n * diff * diff / (nu * sd * sd)  # t^2 / nu
        u = np.where(sd > 0, u, np.where(diff == 0, 0.0, np.inf))
        finite = 0.5 * n * (np.log1p(u) - np.log1p(u / c)) - 0.5 * np.log(c)
        log_e = np.where(np.isinf(u), 0.5 * (n - 1.0) * np.log(c), finite)
    return np.where(n >= 2, log_e, 0.0)


def _directional(log_e: np.ndarray, mean: np.ndarray, mu0: float, alternative: str) -> np.ndarray:
    """log E restricted to means on the alternative's side (-inf elsewhere): a one-sided test rejects
    only there, a subset of the two-sided rejection region, so its error stays below alpha."""
    if alternative == "less":
        return np.where(mean < mu0, log_e, -np.inf)
    if alternative == "greater":
        return np.where(mean > mu0, log_e, -np.inf)
    return log_e


def mixture_log_e_values(
    values: Sequence[float] | np.ndarray,
    *,
    mu0: float = 0.0,
    prior_scale: float = 1.0,
    alternative: Alternative = "two-sided",
) -> np.ndarray:
    """log e-value ``log E_k`` of the mixture t-test of mean ``mu0`` after each prefix of ``values``.

    Under the null (normal values of mean ``mu0``, any variance) ``E_k`` is a test martingale, so
    ``P(exists k: E_k >= 1/alpha) <= alpha`` under any stopping rule (Ville's inequality).
    ``prior_scale`` is the mixture's g (the standardised effect is mixed over N(0, g)). A one-sided
    ``alternative`` sets ``E_k = 0`` (log -inf) where the prefix mean is on the wrong side.

    Returns:
        ``log E_1 .. log E_n`` (``log E_1 = 0``: one value has no spread); along the last axis when
        ``values`` is 2-D (one row per simulated study).
    """
    _check_prior_scale(prior_scale)
    _check_alternative(alternative)
    x = np.asarray(values, dtype=float)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("values must hold at least one number")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite (score failed trials before testing)")
    k, mean, sd = _prefix_moments(x)
    return _directional(_log_e(k, mean, sd, mu0, float(prior_scale)), mean, mu0, alternative)


def confidence_sequence(
    values: Sequence[float] | np.ndarray, *, alpha: float, prior_scale: float = 1.0
) -> tuple[float, float]:
    """The mixture t-test's two-sided confidence sequence for the mean after all of ``values``.

    Inverting ``E_n(mu) < 1/alpha``: with ``c = 1 + n g``, ``K = (c / alpha^2)^(1/n)`` and
    ``W = nu (K - 1) / (1 - K/c)``, ``mu`` lies in ``mean +- sd / sqrt(n) * sqrt(W)``. The intervals of
    every n hold the true mean at once with probability >= 1 - alpha. Unbounded (``-inf, inf``) while
    ``K >= c``, i.e. with too few values (g = 1, alpha = 0.05: fewer than 5), and below 2 values.
    """
    _check_alpha(alpha)
    _check_prior_scale(prior_scale)
    x = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(x).all():
        raise ValueError("values must be finite (score failed trials before testing)")
    n = x.size
    if n < 2:
        return -math.inf, math.inf
    mean = float(x.mean())
    sd = float(x.std(ddof=1))
    c = 1.0 + n * prior_scale
    log_k = (math.log(c) - 2.0 * math.log(alpha)) / n
    if log_k >= math.log(c):
        return -math.inf, math.inf
    kk = math.exp(log_k)
    w = (n - 1) * (kk - 1.0) / (1.0 - kk / c)
    half = sd / math.sqrt(n) * math.sqrt(w)
    return mean - half, mean + half


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(n) for n in looks)
    if not out or any(isinstance(n, bool) or int(n) != n for n in looks):
        raise ValueError(f"looks must be a non-empty list of seed counts, got {list(looks)!r}")
    if out[0] < 1 or any(b <= a for a, b in itertools.pairwise(out)):
        raise ValueError(f"looks must be positive and strictly ascending, got {list(out)}")
    return out


def _futile(ci: tuple[float, float], alternative: str, min_effect: float | None) -> bool:
    """The interval excludes every effect of at least ``min_effect`` in the predicted direction."""
    if min_effect is None:
        return False
    lo, hi = ci
    if alternative == "less":
        return lo > -min_effect
    if alternative == "greater":
        return hi < min_effect
    return lo > -min_effect and hi < min_effect


def _check_min_effect(min_effect: float | None) -> None:
    if min_effect is not None and not (
        not isinstance(min_effect, bool)
        and isinstance(min_effect, int | float)
        and math.isfinite(min_effect)
        and min_effect > 0
    ):
        raise ValueError(f"min_effect must be finite and > 0 (or None), got {min_effect!r}")


def _anytime_p(log_e: np.ndarray) -> float:
    best = float(np.max(log_e))
    return 1.0 if best <= 0 else float(min(1.0, math.exp(-best)))


def sequential_test(
    values: Sequence[float] | np.ndarray,
    *,
    looks: Sequence[int],
    alpha: float,
    alternative: Alternative,
    min_effect: float | None = None,
    prior_scale: float = 1.0,
) -> dict[str, Any]:
    """One hypothesis's decision at a look of a sequential study (the anytime-valid mixture t-test).

    Args:
        values: the per-seed values so far, in seed order (paired differences, per-seed slopes);
            ``len(values)`` must be one of ``looks``.
        looks: the planned seed counts, ascending; the last is the maximum.
        alpha: the level (for one hypothesis; :func:`sequential_family` applies Holm to a family).
        alternative: ``"less"``, ``"greater"`` (one-sided, for the mean) or ``"two-sided"``.
        min_effect: the smallest effect worth finding; ``None`` = no futility stop.
        prior_scale: the mixture's g (the standardised effect ~ N(0, g)); 1 by default.

    Returns:
        ``{"decision", "p_value", "ci": [low, high]}``: ``p_value`` is the anytime-valid p so far
        (``min(1, 1 / max_k E_k)`` over every prefix, on the alternative's side), ``ci`` the two-sided
        confidence sequence at level 1 - ``alpha`` (infinite bounds while too few values).
        ``decision``: ``reject`` when ``p_value <= alpha``; else ``futile`` when ``ci`` excludes every
        effect of size ``min_effect`` or more in the alternative's direction; else ``inconclusive``
        at the last look and ``continue`` before it.

    Guarantees, for normal values with unknown variance: any look says ``reject`` under mean 0 with
    probability at most ``alpha`` (whatever the looks); ``ci`` holds the true mean at every look at
    once with probability at least 1 - ``alpha``.

    Raises:
        ValueError: non-finite values, ``len(values)`` not a planned look, bad options.
    """
    _check_alpha(alpha)
    _check_alternative(alternative)
    _check_min_effect(min_effect)
    planned = _check_looks(looks)
    x = np.asarray(values, dtype=float).ravel()
    if x.size not in planned:
        raise ValueError(f"len(values) = {x.size} is not one of the planned looks {list(planned)}")
    log_e = mixture_log_e_values(x, prior_scale=prior_scale, alternative=alternative)
    p = _anytime_p(log_e)
    ci = confidence_sequence(x, alpha=alpha, prior_scale=prior_scale)
    decision = _decide(p <= alpha, ci, alternative, min_effect, last=x.size == planned[-1])
    return {"decision": decision, "p_value": p, "ci": [ci[0], ci[1]]}


def _decide(
    rejected: bool, ci: tuple[float, float], alternative: str, min_effect: float | None, *, last: bool
) -> str:
    if rejected:
        return "reject"
    if _futile(ci, alternative, min_effect):
        return "futile"
    return "inconclusive" if last else "continue"


def sequential_family(
    values: Mapping[str, Sequence[float] | np.ndarray | None],
    *,
    looks: Sequence[int],
    alpha: float,
    alternatives: Mapping[str, Alternative],
    min_effect: float | Mapping[str, float | None] | None = None,
    prior_scale: float = 1.0,
    n_seeds: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Decisions for a family of hypotheses at one look, Holm over their anytime p-values.

    Each hypothesis's running anytime-valid p is a valid p-value at any stopping time, and Holm is
    monotone in them, so rejecting where the Holm-adjusted p is ``<= alpha`` keeps the family-wise
    error at most ``alpha`` over all looks; a rejection stays (the running p never rises).
    Futility is per hypothesis, on its own 1 - ``alpha`` confidence sequence (non-binding: stopping
    for futility never raises the type-I error).

    Args:
        values: hypothesis -> its per-seed values at this look (``None`` or fewer than 2 values:
            not testable yet, left out of Holm's family, ``continue``/``inconclusive``). A list may
            be shorter than the look's seed count (a seed without a value is left out).
        looks: the planned seed counts, ascending.
        alpha: the family-wise level.
        alternatives: hypothesis -> ``"less" | "greater" | "two-sided"``.
        min_effect: one value for all, or hypothesis -> value (``None``: no futility).
        prior_scale: the mixture's g.
        n_seeds: the look's seed count (default: the longest list); the look is the last when it
            reaches ``looks[-1]``, and there the undecided are ``inconclusive``.

    Returns:
        hypothesis -> ``{"decision", "p_value", "p_value_holm", "ci", "estimate", "n"}``.
    """
    _check_alpha(alpha)
    _check_prior_scale(prior_scale)
    planned = _check_looks(looks)
    arrays = {k: (None if v is None else np.asarray(v, dtype=float).ravel()) for k, v in values.items()}
    if n_seeds is None:
        n_seeds = max((a.size for a in arrays.values() if a is not None), default=0)
    last = n_seeds >= planned[-1]
    raw: dict[str, dict[str, Any]] = {}
    for name, x in arrays.items():
        alternative = alternatives[name]
        effect = min_effect.get(name) if isinstance(min_effect, Mapping) else min_effect
        _check_alternative(alternative)
        _check_min_effect(effect)
        r: dict[str, Any] = {"_alt": alternative, "_effect": effect, "n": 0 if x is None else int(x.size)}
        if x is None or x.size < 2:
            r.update(p_value=None, ci=(-math.inf, math.inf))
            r["estimate"] = None if x is None or x.size == 0 else float(x.mean())
        else:
            log_e = mixture_log_e_values(x, prior_scale=prior_scale, alternative=alternative)
            r.update(
                p_value=_anytime_p(log_e),
                ci=confidence_sequence(x, alpha=alpha, prior_scale=prior_scale),
                estimate=float(x.mean()),
            )
        raw[name] = r
    adjusted = holm({name: r["p_value"] for name, r in raw.items()})
    out: dict[str, dict[str, Any]] = {}
    for name, r in raw.items():
        p_holm = adjusted[name]
        ci = (float(r["ci"][0]), float(r["ci"][1]))
        decision = _decide(p_holm is not None and p_holm <= alpha, ci, r["_alt"], r["_effect"], last=last)
        out[name] = {
            "decision": decision,
            "p_value": r["p_value"],
            "p_value_holm": p_holm,
            "ci": [ci[0], ci[1]],
            "estimate": r["estimate"],
            "n": r["n"],
        }
    return out


def sequential_looks(
    values: Mapping[str, Sequence[float] | np.ndarray | None],
    *,
    looks: Sequence[int],
    alpha: float,
    alternatives: Mapping[str, Alternative],
    min_effect: float | Mapping[str, float | None] | None = None,
    prior_scale: float = 1.0,
    stop_early: bool = True,
) -> list[dict[str, Any]]:
    """Replay a sequential study's looks from its per-seed values (in seed order).

    Look j uses the first ``looks[j]`` values of every hypothesis; the replay ends at the first look
    where every hypothesis is decided (``reject`` or ``futile``) — the study stops launching seeds
    there — or at the last look the values reach (``stop_early=False``: always the latter, for a
    study that went on, e.g. extended, after a decided look). Deterministic, so a report regenerated
    from the trials repeats the study's own looks.

    Returns:
        ``[{"n_seeds", "hypotheses": {name: {decision, p_value, p_value_holm, ci, estimate, n}},
        "stop": bool}, ...]``; ``stop`` is true on a look where every hypothesis is decided or the
        last planned look.
    """
    planned = _check_looks(looks)
    arrays = {k: (None if v is None else np.asarray(v, dtype=float).ravel()) for k, v in values.items()}
    have = max((a.size for a in arrays.values() if a is not None), default=0)
    out: list[dict[str, Any]] = []
    for n in planned:
        if n > have:
            break
        prefix = {k: (None if a is None else a[:n]) for k, a in arrays.items()}
        decided = sequential_family(
            prefix,
            looks=planned,
            alpha=alpha,
            alternatives=alternatives,
            min_effect=min_effect,
            prior_scale=prior_scale,
            n_seeds=n,
        )
        stop = n == planned[-1] or all(h["decision"] in ("reject", "futile") for h in decided.values())
        out.append({"n_seeds": n, "hypotheses": decided, "stop": stop})
        if stop and stop_early:
            break
    return out


def expected_seeds(
    looks: Sequence[int],
    *,
    family: int,
    alpha: float,
    effect: float,
    min_effect: float | None,
    prior_scale: float = 1.0,
    runs: int = 300,
    seed: int = 0,
) -> float:
    """The mean seed count a sequential study stops at, by simulation (``plan`` for sequential specs).

    ``family`` independent hypotheses, each with normal per-seed values of mean ``effect`` in the
    predicted direction and sd 1 (``effect`` and ``min_effect`` in sd units), tested with Holm at every
    look (:func:`sequential_family`, one-sided); a study stops at the first look where every
    hypothesis is decided, else at ``looks[-1]``. A seeded generator owned by the call.
    """
    planned = _check_looks(looks)
    if family < 1:
        raise ValueError(f"family must be >= 1, got {family}")
    rng = np.random.default_rng(seed)
    names = [f"h{i}" for i in range(family)]
    alternatives: dict[str, Alternative] = dict.fromkeys(names, "greater")
    used = []
    for _ in range(runs):
        data = rng.normal(effect, 1.0, size=(family, planned[-1]))
        stop = planned[-1]
        for n in planned[:-1]:
            out = sequential_family(
                {k: data[i, :n] for i, k in enumerate(names)},
                looks=planned,
                alpha=alpha,
                alternatives=alternatives,
                min_effect=min_effect,
                prior_scale=prior_scale,
                n_seeds=n,
            )
            if all(h["decision"] in ("reject", "futile") for h in out.values()):
                stop = n
                break
        used.append(stop)
    return float(np.mean(used))
