"""The compare kind (:class:`CompareKind`): does each arm beat its reference arm, as the paper's table says?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from studies.kinds.base import KindParts
from studies.kinds.pipeline import TINY, TunedDesignKind

__all__ = ["CompareKind"]


class CompareKind(TunedDesignKind):
    """``kind: compare``: does each arm beat its reference arm, as the paper's table says? Its phases:
    ``tune``, the optional ``tune-ext<k>`` rounds, ``tune-refine``, ``confirm``
    (:meth:`studies.kinds.pipeline.TunedDesignKind.phases`)."""

    name = "compare"
    script = None
    title = "Compare studies"
    summary = (
        "Arms x seeds with paired contrasts against reference arms (the Affine Divergence main table), "
        "e.g. `studies/specs/affine_divergence_table.yaml`."
    )
    example = ("studies/specs/affine_divergence_table.yaml", "smoke")
    tiny = (
        *TINY,
        "contrasts={corrected_vs_plain: {arm: corrected, reference: linear, predicted: better}}",
        "seeds=[0, 1]",
    )

    def describe(self, spec: Any) -> str:
        contrasts = f"{len(spec.contrast_specs)} contrasts ({', '.join(spec.contrast_specs)})"
        return f"{len(spec.arm_names)} arms x {len(spec.seeds)} seeds, {contrasts}; {super().describe(spec)}"

    def paper_claims(self, verdict: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
        """The Affine Divergence paper's main table: its MLP row (corrected vs BN, LN) from a study
        of MLPs, its CNN row (PatchNorm vs BN, LN; BN, LN vs plain) from one of CNNs (``scope``'s
        model type)."""
        scope = verdict.get("scope") if isinstance(verdict.get("scope"), Mapping) else {}
        model = ((scope or {}).get("model") or {}).get("type")
        rows = {
            "mlp": ("main table, MLP", ("corrected_vs_batchnorm", "corrected_vs_layernorm")),
            "cnn": (
                "main table, CNN",
                (
                    "patchnorm_vs_batchnorm",
                    "patchnorm_vs_layernorm",
                    "batchnorm_vs_plain",
                    "layernorm_vs_plain",
                ),
            ),
        }
        if model not in rows:
            return {}
        label, contrasts = rows[model]
        tested = [(c, c) for c in contrasts if c in (verdict.get("hypotheses") or {})]
        return {label: tested} if tested else {}

    def parts(self) -> KindParts:
        from studies.kinds.compare import decidability, power, spec, workflow

        return KindParts(spec.CompareStudySpec, decidability.undecidable, power.pilot, design=workflow.DESIGN)
