"""What a kind's analysis reads off its spec besides the trials: the chance levels of the study's
data and the sequential design it replays."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "chance_levels",
    "sequential_design",
]


def chance_levels(spec: Any) -> tuple[float, float] | None:
    """Chance accuracy 1/C and chance loss ln C of the study's data; ``None`` without classes
    (regression)."""
    from studies.schema import data_classes

    c = data_classes(spec.data)
    return (1.0 / c, math.log(c)) if c else None


def sequential_design(sequential: Any, seeds: Sequence[Any]) -> dict[str, Any] | None:
    """The sequential design an analysis replays (looks, seed order, min effect, prior scale) of a
    ``sequential:`` section over the confirmatory ``seeds`` (``None``: a fixed design)."""
    if sequential is None:
        return None
    return {
        "looks": list(sequential.schedule()),
        "seed_order": list(seeds),
        "min_effect": sequential.min_effect,
        "prior_scale": sequential.prior_scale,
    }
