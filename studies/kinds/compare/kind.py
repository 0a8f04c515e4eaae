"""The compare kind (:class:`CompareKind`): does each arm beat its reference arm, as the paper's table says?

Light on imports: its phases come from :mod:`studies.kinds.compare.plans`; running, analysing and
reporting (:mod:`studies.kinds.compare.workflow`, Ray and pandas) are imported inside the methods.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.kinds.compare import plans
from studies.kinds.contract import Phase, StudyKind, StudyOutcome

__all__ = ["CompareKind"]


class CompareKind(StudyKind):
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

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        from studies.kinds.compare.workflow import run

        return run(spec, **runner_options)

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        from studies.kinds.compare.workflow import analyse

        return analyse(table, spec, **inputs)

    def status(self, spec: Any) -> dict[str, Any]:
        from studies.kinds.compare.workflow import status

        return status(spec)

    def report(self, spec: Any, out_dir: Path) -> Path:
        from studies.kinds.compare.workflow import report

        return report(spec, out_dir)

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

    def alpha(self, spec: Any) -> float:
        return float(spec.analysis.alpha)

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds, off the tuning seeds (the document as set, re-validated)."""
        doc = spec.model_dump(mode="json", exclude_unset=True)
        taken = set(spec.lr_tuning.seeds)
        doc["seeds"] = list(itertools.islice((s for s in itertools.count() if s not in taken), k))
        return type(spec).model_validate(doc)
