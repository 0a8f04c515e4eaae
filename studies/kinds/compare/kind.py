"""The compare kind (:class:`CompareKind`): does each arm beat its reference arm, as the paper's table says?

Light on imports: its phases come from :mod:`studies.kinds.compare.plans`; running, analysing and
reporting are the tuned-design pipeline (:class:`studies.kinds.pipeline.TunedDesignKind`) with
:mod:`studies.kinds.compare.workflow` (Ray and pandas) as its hooks, imported when needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from studies.kinds.compare import plans
from studies.kinds.contract import Phase
from studies.kinds.kit import with_seeds
from studies.kinds.pipeline import TunedDesign, TunedDesignKind

__all__ = ["CompareKind"]


class CompareKind(TunedDesignKind):
    """``kind: compare``: does each arm beat its reference arm, as the paper's table says?"""

    name = "compare"
    script = None
    title = "Compare studies"
    summary = (
        "Arms x seeds with paired contrasts against reference arms (the Affine Divergence main table), "
        "e.g. `studies/specs/affine_divergence_table.yaml`."
    )
    example = ("studies/specs/affine_divergence_table.yaml", "smoke")
    tiny = (
        "training.epochs=1",
        "arms=[linear, corrected]",
        "contrasts={corrected_vs_plain: {arm: corrected, reference: linear, predicted: better}}",
        "seeds=[0, 1]",
        "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], max_extensions: 0}",
        "max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
    )

    def spec_class(self) -> type[BaseModel]:
        from studies.kinds.compare.spec import CompareStudySpec

        return CompareStudySpec

    def phases(self, spec: Any) -> list[Phase]:
        """``tune``, the optional ``tune-ext<k>`` rounds, ``confirm`` (:func:`studies.kinds.compare.plans.phases`)."""
        return plans.phases(spec)

    def undecidable(self, spec: Any) -> list[Any]:
        from studies.kinds.compare.decidability import undecidable

        return undecidable(spec)

    def design(self) -> TunedDesign:
        from studies.kinds.compare import workflow

        return cast(TunedDesign, workflow)  # the module is the implementation

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        from studies.kinds.compare.workflow import pilot

        return pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)

    def describe(self, spec: Any) -> str:
        return (
            f"{len(spec.arm_names)} arms x {len(spec.seeds)} seeds, {len(spec.contrast_specs)} contrasts "
            f"({', '.join(spec.contrast_specs)}); {self.total_trials(spec)} trials in all phases, "
            f"storage {spec.storage_path}"
        )

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds, off the tuning seeds (the document as set, re-validated)."""
        return with_seeds(spec, k, taken=spec.lr_tuning.seeds)
