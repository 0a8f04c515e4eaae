"""Per-seed statistics of the batch-size analysis: one value per seed (a row of seeds x batch sizes),
and the arm-keyed random streams its resampling draws from."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import numpy as np
from scipy import stats

from studies.stats import ols_slope

__all__ = ["arm_rng", "none_if_nan", "row_slopes", "row_spearman"]


def arm_rng(seed: int, salt: str, stream: int) -> np.random.Generator:
    # Derived from the arm's name (not its position) so adding an arm does not change another's CI.
    return np.random.default_rng([int(seed), zlib.crc32(salt.encode()), stream])


def _per_row(mat: np.ndarray, stat: Callable[[np.ndarray, np.ndarray], float], min_points: int) -> np.ndarray:
    """``stat(finite, values)`` of each row of ``mat`` (seeds x batch sizes, NaN = no data) over its
    finite entries (``finite``: their mask); NaN for a row with fewer than ``min_points``."""
    out = np.full(mat.shape[0], np.nan)
    for k, row in enumerate(mat):
        m = np.isfinite(row)
        if m.sum() >= min_points:
            out[k] = stat(m, row[m])
    return out


def row_slopes(x: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """OLS slope of each row of ``mat`` (seeds x batch sizes, NaN = no data) on ``x``; NaN when a row
    has fewer than two points."""
    return _per_row(mat, lambda m, y: ols_slope(x[m], y), 2)


def _spearman_vs_order(y: np.ndarray) -> float:
    if np.ptp(y) == 0:
        return math.nan  # a constant row has no rank order
    ry = stats.rankdata(y)
    rx = np.arange(ry.size, dtype=float)
    ry = ry - ry.mean()
    rx = rx - rx.mean()
    return float(rx @ ry / math.sqrt(float(rx @ rx) * float(ry @ ry)))


def row_spearman(mat: np.ndarray) -> np.ndarray:
    """Spearman rho of each row vs the batch-size order (columns ascending in B); NaN below 3 points
    or for a constant row."""
    return _per_row(mat, lambda m, y: _spearman_vs_order(y), 3)


def none_if_nan(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
