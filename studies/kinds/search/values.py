"""Values of the claims analysis: seeds as JSON-able keys, floats that are ``None`` when not finite,
a cell read as a float, the confidence level checked."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_confidence", "float_or_none", "seed_key", "to_float"]


def float_or_none(x: float | np.floating[Any] | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def seed_key(seed: Any) -> int | str:
    """Seeds as JSON-able dict keys: integral values become ``int``, anything else ``str``."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    if isinstance(seed, (float, np.floating)) and float(seed).is_integer():
        return int(seed)
    return str(seed)


def check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
