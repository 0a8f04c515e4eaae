"""The batch-size kind (:class:`BatchSizeKind`): does a divergence-correcting layer get worse as the batch grows?

Light on imports: its phases come from :mod:`studies.kinds.batchsize.plans`; running, analysing and
reporting are the tuned-design pipeline (:class:`studies.kinds.pipeline.TunedDesignKind`) with
:mod:`studies.kinds.batchsize.workflow` (Ray and pandas) as its hooks, imported when needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from studies.kinds.batchsize import plans
from studies.kinds.contract import Phase
from studies.kinds.kit import extended_spec, with_seeds
from studies.kinds.pipeline import TunedDesign, TunedDesignKind

__all__ = ["BatchSizeKind"]


class BatchSizeKind(TunedDesignKind):
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

    def design(self) -> TunedDesign:
        from studies.kinds.batchsize import workflow

        return cast(TunedDesign, workflow)  # the module is the implementation

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        from studies.kinds.batchsize.power import pilot

        return pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        """The seeds used so far, then ``seeds`` new ones above every seed any phase used (tuning
        seeds included), the looks made so far kept as looks."""
        return extended_spec(spec, seeds, verdict, confirmatory=spec.seeds, taken=spec.lr_tuning.seeds)

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds, off the tuning seeds. The document re-validated is what was set
        (``exclude_unset``): a full dump would also carry fields the spec derives itself (the layer
        and LR scaling), which it refuses as input."""
        return with_seeds(spec, k, taken=spec.lr_tuning.seeds)
