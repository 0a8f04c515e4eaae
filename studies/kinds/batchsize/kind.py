"""The batch-size kind's contract object (:class:`BatchSizeKind`) and its phases.

Per budget (``epochs``, ``updates``), each phase in its own folder with its own phase run:
``tune-<budget>`` (every arm's η on the grid at the reference batch size, on the tuning seeds), then
``confirm-<budget>`` (arms x batch sizes x seeds with the tuned η).

Light on imports: the run, analysis and report modules are imported on use.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from studies.kinds.base import Phase, StudyKind, StudyOutcome
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

    def phases(self, spec: Any) -> list[Phase]:
        """Per budget ``tune-<budget>``, the optional range-extension rounds ``tune-<budget>-ext<k>``
        (run only while a tuned η sits on the grid's edge), then ``confirm-<budget>`` (with the spec's
        η standing in for the tuned one: the trial count and the update counts do not depend on it)."""
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
        return out

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        from studies.kinds.batchsize.study import run

        return run(spec, **runner_options)

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        from studies.kinds.batchsize.study import analyse

        return analyse(spec, table)

    def status(self, spec: Any) -> dict[str, Any]:
        from studies.kinds.batchsize.study import status

        return status(spec)

    def report(self, spec: Any, out_dir: Path) -> Path:
        from studies.kinds.batchsize.study import report

        return report(spec, out_dir)

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        from studies.kinds.batchsize.power import pilot

        return pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)

    def undecidable(self, spec: Any) -> list[Any]:
        from studies.kinds.batchsize.decidability import undecidable

        return undecidable(spec)

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
