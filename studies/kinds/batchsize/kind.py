"""The batch-size kind (:class:`BatchSizeKind`): does a divergence-correcting layer get worse as the batch grows?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from studies.kinds.base import KindParts
from studies.kinds.pipeline import TINY, TunedDesignKind
from studies.kinds.spec_surgery import extended_spec

__all__ = ["BatchSizeKind"]


class BatchSizeKind(TunedDesignKind):
    """``kind: batchsize``: does a divergence-correcting layer get worse as the batch grows? Its
    phases per budget (``epochs``, ``updates``): ``tune-<budget>``, its optional range-extension
    rounds and refinement, then ``confirm-<budget>`` and a sequential design's optional later looks
    (:meth:`studies.kinds.pipeline.TunedDesignKind.phases`)."""

    name = "batchsize"
    script = "studies/batchsize_correlation.py"
    title = "Batch-size studies"
    summary = "The affine-divergence batch-size protocol, e.g. `studies/specs/batchsize_correlation.yaml`."
    example = ("studies/specs/batchsize_correlation.yaml", "smoke")
    tiny = (*TINY, "batch_sizes=[16, 32]", "lr_tuning.reference_batch_size=32", "analysis.n_boot=50")

    def parts(self) -> KindParts:
        from studies.kinds.batchsize import decidability, power, spec, workflow

        return KindParts(
            spec.BatchSizeStudySpec, decidability.undecidable, power.pilot, design=workflow.DESIGN
        )

    def paper_claims(self, verdict: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
        """The Affine Divergence paper's batch-size claim, decided by the study verdict."""
        return {"batch size": [("(study)", "study")]}

    def claim_estimates(
        self, label: str, study: str, verdict: Mapping[str, Any]
    ) -> tuple[list[str], list[Any]]:
        """Per budget run: each fix arm's interaction with its interval (the batch-size estimand)."""
        from studies.kinds.batchsize.page import claim_estimates

        return claim_estimates(verdict)

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        """The seeds used so far, then ``seeds`` new ones above every seed any phase used (tuning
        seeds included), the looks made so far kept as looks."""
        return extended_spec(spec, seeds, verdict, confirmatory=spec.seeds, taken=spec.lr_tuning.seeds)
