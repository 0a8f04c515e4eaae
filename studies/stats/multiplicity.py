"""Multiplicity: :func:`holm`, the only Holm step-down in the code base."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["holm", "holm_into"]


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


def holm_into(results: Mapping[str, MutableMapping[str, Any]], names: Iterable[str] | None = None) -> None:
    """Set each result's ``p_value_holm``: :func:`holm` over the ``p_value`` of ``results[name]`` for
    ``name`` in ``names`` (every result by default), the family."""
    family = list(results if names is None else names)
    for name, p in holm({n: results[n]["p_value"] for n in family}).items():
        results[name]["p_value_holm"] = p
