"""Values of the claims analysis: seeds as JSON-able keys, floats that are ``None`` when not finite,
a cell read as a float, the confidence level checked."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["check_confidence", "claim_metrics", "float_or_none", "seed_key", "to_float"]


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


def claim_metrics(claims: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The numbers each claim's verdict rests on, once each: ``estimate/<claim>``, its CI as
    ``ci_low/<claim>`` / ``ci_high/<claim>``, ``p_value/<claim>`` and ``p_value_holm/<claim>``."""
    out: dict[str, float] = {}
    for cid, c in claims.items():
        raw = c.get("ci")
        ci: Sequence[Any] = raw if isinstance(raw, list | tuple) and len(raw) == 2 else (None, None)
        values = {
            "estimate": c.get("estimate"),
            "ci_low": ci[0],
            "ci_high": ci[1],
            "p_value": c.get("p_value"),
            "p_value_holm": c.get("p_value_holm"),
        }
        for key, v in values.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                out[f"{key}/{cid}"] = float(v)
    return out
