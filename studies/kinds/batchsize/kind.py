"""The batch-size kind's contract object (:class:`BatchSizeKind`) and its phases.

Per budget (``epochs``, ``updates``), each phase in its own folder with its own phase run:
``tune-<budget>`` (every arm's η on the grid at the reference batch size, on the tuning seeds), then
``confirm-<budget>`` (arms x batch sizes x seeds with the tuned η).

Light on imports: the run, analysis and report modules are imported on use.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from studies.kinds.base import Phase, StudyKind
from studies.kinds.batchsize.spec import cell_key

__all__ = ["KIND_NAME", "BatchSizeKind", "placeholder_lr"]

KIND_NAME = "batchsize"


def placeholder_lr(spec: Any) -> dict[str, float]:
    """The spec's η for every arm (every cell for ``lr_policy: tuned``): what a confirmatory plan is
    built with before the tuning phase has chosen."""
    if spec.lr_policy == "tuned":
        return {cell_key(a, b): spec.training.lr for a in spec.arms for b in spec.batch_sizes}
    return {a: spec.training.lr for a in spec.arms}


class BatchSizeKind(StudyKind):
    """``kind: batchsize``: does a divergence-correcting layer get worse as the batch grows?"""

    name = KIND_NAME
    spec = "studies.kinds.batchsize.spec:BatchSizeStudySpec"
    script = "studies/batchsize_correlation.py"
    title = "Batch-size studies"
    summary = "The affine-divergence batch-size protocol, e.g. `studies/specs/batchsize_correlation.yaml`."
    module = "studies.kinds.batchsize.study"
    decidability = "studies.kinds.batchsize.decidability"
    example = ("studies/specs/batchsize_correlation.yaml", "smoke")
    tiny = (
        "training.epochs=1",
        "arms=[linear, corrected]",
        "batch_sizes=[16, 32]",
        "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], reference_batch_size: 32, max_extensions: 0}",
        "analysis.n_boot=50",
        "max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
    )

    def phases(self, spec: Any) -> list[Phase]:
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
            out += [
                Phase.of(spec.extension_plan(budget, k, edge), optional=True) for k in range(1, rounds + 1)
            ]
            out.append(Phase.of(spec.confirmatory_plan(budget, placeholder)))
            if spec.sequential is not None:  # the looks after the first: run until decided
                looks = range(2, len(spec.sequential.schedule()) + 1)
                out += [
                    Phase.of(spec.confirmatory_plan(budget, placeholder, look=j), look=True) for j in looks
                ]
        return out

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        from studies.kinds.batchsize.study import extended_spec

        return extended_spec(spec, seeds, verdict)

    def alpha(self, spec: Any) -> float:
        return float(spec.analysis.alpha)

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds, off the tuning seeds. The document re-validated is what was set
        (``exclude_unset``): a full dump would also carry fields the spec derives itself (the layer
        and LR scaling), which it refuses as input."""
        doc = spec.model_dump(mode="json", exclude_unset=True)
        taken = set(spec.lr_tuning.seeds)
        doc["seeds"] = list(itertools.islice((s for s in itertools.count() if s not in taken), k))
        return type(spec).model_validate(doc)
