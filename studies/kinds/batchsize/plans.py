"""The batch-size kind's phases, from a validated spec (light: no Ray, no torch).

Per budget (``epochs``, ``updates``), each phase in its own folder with its own phase run:
``tune-<budget>`` (every arm's η on the grid at the reference batch size, on the tuning seeds), the
optional range-extension rounds ``tune-<budget>-ext<k>``, then ``confirm-<budget>`` (arms x batch
sizes x seeds with the tuned η) and a sequential design's later looks.
"""

from __future__ import annotations

from typing import Any

from studies.kinds.batchsize.spec import cell_key
from studies.kinds.contract import Phase

__all__ = ["phases", "placeholder_lr"]


def placeholder_lr(spec: Any) -> dict[str, float]:
    """The spec's η for every arm (every cell for ``lr_policy: tuned``): what a confirmatory plan is
    built with before the tuning phase has chosen."""
    if spec.lr_policy == "tuned":
        return {cell_key(a, b): spec.training.lr for a in spec.arms for b in spec.batch_sizes}
    return {a: spec.training.lr for a in spec.arms}


def phases(spec: Any) -> list[Phase]:
    """Per budget ``tune-<budget>``, the optional range-extension rounds ``tune-<budget>-ext<k>``
    (run only while a tuned η sits on the grid's edge), then ``confirm-<budget>`` (with the spec's
    η standing in for the tuned one: the trial count and the update counts do not depend on it);
    a sequential design's first look is ``confirm-<budget>``, its later looks the optional
    ``confirm-<budget>-look<j>``."""
    placeholder = placeholder_lr(spec)
    tuning = spec.lr_tuning
    rounds = tuning.max_extensions if tuning.lr_grid().extendable else 0
    edge = {cell: tuning.high for cell in spec.tuning_cells}  # the rate does not change the cost
    out = []
    for budget in spec.budgets:
        out.append(Phase.of(spec.tuning_plan(budget)))
        out += [Phase.of(spec.extension_plan(budget, k, edge), optional=True) for k in range(1, rounds + 1)]
        out.append(Phase.of(spec.confirmatory_plan(budget, placeholder)))
        if spec.sequential is not None:  # the looks after the first: run until decided
            looks = range(2, len(spec.sequential.schedule()) + 1)
            out += [Phase.of(spec.confirmatory_plan(budget, placeholder, look=j), look=True) for j in looks]
    return out
