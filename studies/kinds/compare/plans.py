"""The compare kind's phases, from a validated spec (light: no Ray, no torch).

``tune`` (every arm's η on the grid, on the tuning seeds), the optional range extensions
``tune-ext<k>`` (only while a tuned η sits on the grid's edge), then ``confirm`` (arms x seeds with
the tuned η).
"""

from __future__ import annotations

from typing import Any

from studies.kinds.contract import Phase

__all__ = ["phases"]


def phases(spec: Any) -> list[Phase]:
    """``tune``, the optional ``tune-ext<k>`` rounds, ``confirm`` (the spec's η standing in for
    the tuned one: the trial count does not depend on it)."""
    tuning = spec.lr_tuning
    rounds = tuning.max_extensions if tuning.lr_grid().extendable else 0
    edge = {arm: tuning.high for arm in spec.arm_names}  # the rate does not change the cost
    placeholder = {arm: spec.training.lr for arm in spec.arm_names}
    return [
        Phase.of(spec.tuning_plan()),
        *(Phase.of(spec.extension_plan(k, edge), optional=True) for k in range(1, rounds + 1)),
        Phase.of(spec.confirmatory_plan(placeholder)),
    ]
