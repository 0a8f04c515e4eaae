"""The batch-size kind (:class:`BatchSizeKind`): does a divergence-correcting layer get worse as the batch grows?

Light on imports: its phases come from :mod:`studies.kinds.batchsize.plans`; running, analysing and
reporting (:mod:`studies.kinds.batchsize.workflow`, Ray and pandas) are imported inside the methods.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.kinds.batchsize import plans
from studies.kinds.contract import Phase, StudyKind, StudyOutcome

__all__ = ["BatchSizeKind"]


class BatchSizeKind(StudyKind):
    """``kind: batchsize``: does a divergence-correcting layer get worse as the batch grows?"""

    name = "batchsize"
    script = "studies/batchsize_correlation.py"
    title = "Batch-size studies"
    summary = "The affine-divergence batch-size protocol, e.g. `studies/specs/batchsize_correlation.yaml`."
    example = ("studies/specs/batchsize_correlation.yaml", "smoke")
    tiny = (
        "training.epochs=1",
        "arms=[linear, corrected]",
        "batch_sizes=[16, 32]",
        "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], reference_batch_size: 32, max_extensions: 0}",
        "analysis.n_boot=50",
        "max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
    )

    def spec_class(self) -> type[BaseModel]:
        from studies.kinds.batchsize.spec import BatchSizeStudySpec

        return BatchSizeStudySpec

    def phases(self, spec: Any) -> list[Phase]:
        """Per budget ``tune-<budget>``, the optional range-extension rounds ``tune-<budget>-ext<k>``
        (run only while a tuned η sits on the grid's edge), then ``confirm-<budget>`` and a sequential
        design's optional later looks ``confirm-<budget>-look<j>`` (:func:`studies.kinds.batchsize.plans.phases`)."""
        return plans.phases(spec)

    def undecidable(self, spec: Any) -> list[Any]:
        from studies.kinds.batchsize.decidability import undecidable

        return undecidable(spec)

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        from studies.kinds.batchsize.workflow import run

        return run(spec, **runner_options)

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        from studies.kinds.batchsize.workflow import analyse

        return analyse(table, spec, **inputs)

    def status(self, spec: Any) -> dict[str, Any]:
        from studies.kinds.batchsize.workflow import status

        return status(spec)

    def report(self, spec: Any, out_dir: Path) -> Path:
        from studies.kinds.batchsize.workflow import report

        return report(spec, out_dir)

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        from studies.kinds.batchsize.power import pilot

        return pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        from studies.kinds.batchsize.workflow import extended_spec

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
