"""Intervals and t-tests over per-seed values: OLS slope, t-intervals, the seed bootstrap, the
interval of a mean correlation on the Fisher-z scale, the one-sample t-test."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from studies.stats._checks import _scipy_stats

__all__ = [
    "FISHER_Z_CLIP",
    "FISHER_Z_MIN_SEEDS",
    "fisher_z_interval",
    "mean_interval",
    "ols_slope",
    "seed_interval",
    "t_interval",
    "t_test_p",
]

_BOOTSTRAP_MIN_SEEDS = 10
FISHER_Z_CLIP = 0.999
"""A correlation of exactly ±1 is taken as ±0.999 before ``atanh`` (whose value there is infinite)."""
FISHER_Z_MIN_SEEDS = 3
"""Below this many per-seed correlations there is no interval (``None``)."""


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


def fisher_z_interval(values: Sequence[float] | np.ndarray, *, confidence: float) -> list[float] | None:
    """The interval of the mean of per-seed correlations on the Fisher-z scale, back-transformed.

    Each finite value ``r`` (a correlation, in [-1, 1]; ``±1`` taken as ``±``:data:`FISHER_Z_CLIP`)
    becomes ``z = atanh(r)``; the two-sided t-interval of the mean of the K values of ``z`` (K - 1 df,
    level ``confidence``) is mapped back with ``tanh``. So the interval always lies inside [-1, 1],
    whatever the spread or the number of seeds. ``None`` below :data:`FISHER_Z_MIN_SEEDS` values.

    Raises:
        ValueError: a value outside [-1, 1].
    """
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if np.any(np.abs(v) > 1.0 + 1e-12):
        raise ValueError(f"correlations must lie in [-1, 1], got {v[np.abs(v) > 1.0].tolist()}")
    if v.size < FISHER_Z_MIN_SEEDS:
        return None
    z = np.arctanh(np.clip(v, -FISHER_Z_CLIP, FISHER_Z_CLIP))
    lo, hi = t_interval(z, confidence)
    return [float(np.tanh(lo)), float(np.tanh(hi))]


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
