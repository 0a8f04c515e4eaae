"""The compare kind's contract object (:class:`CompareKind`) and its phases.

``tune`` (every arm's η on the grid, on the tuning seeds), the optional range extensions
``tune-ext<k>`` (only while a tuned η sits on the grid's edge), then ``confirm`` (arms x seeds with
the tuned η). Light on imports: the run, analysis and report modules are imported on use.
"""

from __future__ import annotations

import itertools
from typing import Any

from studies.kinds.base import Phase, StudyKind

__all__ = ["KIND_NAME", "CompareKind"]

KIND_NAME = "compare"


class CompareKind(StudyKind):
    """``kind: compare``: does each arm beat its reference arm, as the paper's table says?"""

    name = KIND_NAME
    spec = "studies.kinds.compare.spec:CompareStudySpec"
    script = None
    title = "Compare studies"
    summary = (
        "Arms x seeds with paired contrasts against reference arms (the Affine Divergence main table), "
        "e.g. `studies/specs/affine_divergence_table.yaml`."
    )
    module = "studies.kinds.compare.study"
    decidability = "studies.kinds.compare.decidability"
    example = ("studies/specs/affine_divergence_table.yaml", "smoke")
    tiny = (
        "training.epochs=1",
        "arms=[linear, corrected]",
        "contrasts={corrected_vs_plain: {arm: corrected, reference: linear, predicted: better}}",
        "seeds=[0, 1]",
        "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], max_extensions: 0}",
        "max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
    )

    def phases(self, spec: Any) -> list[Phase]:
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
