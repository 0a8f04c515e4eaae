"""Randomisation tests: the within-seed permutation test of a trend and the paired sign-flip test."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from studies.stats._checks import Alternative, _check_alternative, _check_confidence
from studies.stats.intervals import t_interval

__all__ = [
    "EXACT_PERMUTATION_LIMIT",
    "log_n_permutations",
    "min_sign_flip_p",
    "paired_contrast",
    "permutation_p_value",
    "sign_flip_p",
]

#: Exact enumeration of the within-seed permutations up to this many distinct permutations.
EXACT_PERMUTATION_LIMIT = 100_000

_SIGN_FLIP_EXACT_LIMIT = 2**20  # sign patterns enumerated exactly up to this many (K <= 20 seeds)
_CHUNK_BITS = 16  # sign patterns per enumeration chunk: 2^16 x K floats at a time


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
