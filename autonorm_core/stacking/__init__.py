"""Member-stacked training: K seeds (or learning rates) of one architecture as one model (issue #38).

A trial of one small model leaves the machine mostly idle: every kernel is tiny and Python dispatch
dominates. Here K members of ONE architecture become one model whose parameters carry an explicit
member dimension (linears as ``torch.baddbmm``, convolutions as one grouped convolution, norms with
per-member affine parameters and statistics), trained by one loop that does, per member, exactly what
:func:`autonorm_core.training.fit` does for one model::

    from autonorm_core.stacking import create_members, fit_stacked, stackable

    seeds = [0, 1, 2, 3]
    models = create_members("mlp", splits, seeds, preset="tiny", layer="corrected")
    out = fit_stacked(models, splits, [TrainConfig(lr=lr) for lr in (0.01, 0.03, 0.1, 0.3)], seeds=seeds)
    out.results[k].history          # member k's metrics, the keys fit reports
    ok, why = stackable({"type": "text_encoder", "norm": "adanorm"})   # (False, "norm AdaNorm has ...")

Members whose model or configuration has no stacked form train one after the other with ``fit``
(``out.stacked is False``, ``out.reason`` says why).
"""

from autonorm_core.stacking.fit import (
    SHARED_FIELDS,
    StackedFitResult,
    StackedTraining,
    fit_stacked,
    start_stacked,
)
from autonorm_core.stacking.layers import NotStackableError
from autonorm_core.stacking.models import StackedModel, create_members, stack_models, stackable

__all__ = [
    "SHARED_FIELDS",
    "NotStackableError",
    "StackedFitResult",
    "StackedModel",
    "StackedTraining",
    "create_members",
    "fit_stacked",
    "stack_models",
    "stackable",
    "start_stacked",
]
