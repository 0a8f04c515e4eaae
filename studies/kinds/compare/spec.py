"""The compare study's spec (``kind: compare``): arms x seeds, paired contrasts against reference arms.

The Affine Divergence paper's main table as a fixed design (docs/science.md, "The Affine Divergence
main table"). The spec names *arms* (values of ``model.layer.type`` of an ``mlp`` or ``cnn``),
*contrasts* (an arm against a reference arm, with the direction the paper predicts), *seeds* and
an *equivalence margin*; :mod:`studies.kinds.compare.kind` builds its phases from them, each a FIFO
grid plan:

1. ``tune``: each arm's η on a log-spaced grid on held-out tuning seeds, selected on a validation
   metric (:mod:`studies.tuning`; a winner on the grid's edge extends it in the optional phases
   ``tune-ext<k>``, an interior winner is refined in ``tune-refine``).
2. ``confirm``: arms x seeds with the tuned η, the same seeds — same split, data order and, where
   the shapes agree, initialisation — for every arm, full budget, no early stopping.

Arms that appear in no contrast (``prenorm_l2``, the paper's PreNormAffine) are trained and shown
in the tables, never tested. Training defaults are plain SGD (the divergence derivation assumes
vanilla gradient descent); momentum, Adam, weight decay are ablations a spec can switch on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StrictBool

from studies.adequacy import AdequacySpec
from studies.schema import (
    NonNegInt,
    SpecIssue,
)
from studies.schema.arms import Arm, ArmStudySpec, GridLRTuningSpec, PlainSGDTrainingSpec, phase_name
from studies.schema.sections import FROZEN
from workers.plan import StudyPlan

__all__ = [
    "CLAIM",
    "DEFAULT_CONTRASTS",
    "SET_BY_STUDY",
    "CompareAnalysisSpec",
    "CompareStudySpec",
    "CompareTrainingSpec",
    "ContrastSpec",
    "LRTuningSpec",
]

CLAIM = (
    "The divergence-corrected layer (MLP: DivergenceCorrectedLinear; CNN: PatchNormConv2d), which is "
    "not scale invariant, outperforms BatchNorm and LayerNorm, and both of these outperform no "
    "normalisation: scale invariance is not what makes normalisation work."
)

_DEFAULT_ARMS = {
    "mlp": ("corrected", "linear_batchnorm", "linear_layernorm", "linear", "prenorm_l2"),
    "cnn": ("patchnorm", "conv_batchnorm", "conv_layernorm", "conv"),
}
"""The arms of the paper's table per model type (``prenorm_l2``: PreNormAffine, table only)."""


def _paper_contrasts(
    fix: str, batchnorm: str, layernorm: str, plain: str, *_: str
) -> dict[str, tuple[str, str, str]]:
    """The claim over a model type's table (its fix, BatchNorm, LayerNorm and plain arm, in that
    order): the fix beats both norms, and both norms beat no normalisation."""
    return {
        f"{fix}_vs_batchnorm": (fix, batchnorm, "better"),
        f"{fix}_vs_layernorm": (fix, layernorm, "better"),
        "batchnorm_vs_plain": (batchnorm, plain, "better"),
        "layernorm_vs_plain": (layernorm, plain, "better"),
    }


DEFAULT_CONTRASTS: dict[str, dict[str, tuple[str, str, str]]] = {
    model: _paper_contrasts(*arms) for model, arms in _DEFAULT_ARMS.items()
}
"""The paper's predictions per model type: name -> (arm, reference, predicted direction). Used when
``contrasts`` is not given, restricted to the contrasts whose two arms are both among ``arms``."""

SET_BY_STUDY: dict[str, str] = {
    "training.lr": "set per arm by lr_tuning (the best point of its grid); use lr_tuning.low/high",
    "training.lr_scaling": "one batch size for every arm: no lr scaling; drop it",
    "training.reference_batch_size": "one batch size for every arm: no lr scaling; drop it",
    "training.budget": "the compare study trains every arm for training.epochs; drop it",
    "training.max_updates": "the compare study trains every arm for training.epochs; drop it",
}
"""Fields of the shared sections this kind sets itself, with what to set instead: refused when
given, left out of the spec reference (``scripts/gen_spec_reference.py``)."""

_NAME = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")]


class CompareTrainingSpec(PlainSGDTrainingSpec):
    """The compare study's training section: :class:`PlainSGDTrainingSpec`; the fields in
    :data:`SET_BY_STUDY` are set by the study and refused here."""


class LRTuningSpec(GridLRTuningSpec):
    """How each arm's learning rate is chosen before the ``confirm`` phase: :class:`GridLRTuningSpec`,
    at ``training.batch_size`` (one batch size for every arm)."""


class ContrastSpec(BaseModel):
    """One tested contrast: ``arm`` against ``reference`` (the paired difference ``arm − reference``
    of the final test metric), and the direction the claim predicts for ``arm``."""

    model_config = FROZEN

    arm: Arm
    reference: Arm
    predicted: Literal["better", "worse"] = "better"


class CompareAnalysisSpec(BaseModel):
    """Arguments of :func:`studies.kinds.compare.analysis.compare_arms` (docs/science.md, "The
    Affine Divergence main table")."""

    model_config = FROZEN

    metric: Annotated[str, Field(min_length=1)] = "test_accuracy"  # final value per trial
    higher_is_better: StrictBool = True
    alpha: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.05
    margin: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = (
        0.01  # equivalence margin: |difference| below it does not matter (metric units)
    )
    confidence: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.95
    min_seeds: Annotated[int, Field(strict=True, ge=2)] = 5
    n_mc: Annotated[int, Field(strict=True, ge=999)] = 99_999  # sign patterns beyond 20 seeds
    seed: NonNegInt = 0
    adequacy: AdequacySpec = AdequacySpec()  # training adequacy: each arm's η at twice the budget, a floor


class CompareStudySpec(ArmStudySpec):
    """The compare study (``studies/specs/affine_divergence_table.yaml``).

    ``model`` is an ``mlp`` or ``cnn`` whose ``layer`` the arms replace; ``arms`` and ``contrasts``
    default to the paper's table for that model type.
    """

    kind: Literal["compare"] = "compare"
    name: _NAME = "affine_divergence_table"
    hypothesis: str = CLAIM
    training: CompareTrainingSpec = CompareTrainingSpec()
    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] | None = None  # None: the model's table
    lr_tuning: LRTuningSpec = LRTuningSpec()
    analysis: CompareAnalysisSpec = CompareAnalysisSpec()
    contrasts: dict[_NAME, ContrastSpec] | None = (
        None  # name -> {arm, reference, predicted: better | worse}; None: the paper's, among the arms
    )

    study_label: ClassVar[str] = "compare study"
    set_by_study: ClassVar[Mapping[str, str]] = SET_BY_STUDY
    grid: ClassVar[Mapping[str, str]] = {"arms": "model.layer.type"}
    study_tags: ClassVar[tuple[tuple[str, str], ...]] = (("autonorm.study", "compare"),)
    stored_defaults: ClassVar[Mapping[str, Any]] = {
        **ArmStudySpec.stored_defaults,
        "analysis.adequacy": {"check": False, "max_gain": None, "min_metric": None},
    }
    """:attr:`ArmStudySpec.stored_defaults`, and a study stored before the training-adequacy check
    existed ran without it (its verdict says ``"adequacy": "not measured"``)."""

    def design_issues(self) -> list[SpecIssue]:
        """Contrasts between two distinct arms of the study, at least one, no pair twice; no BatchNorm
        arm at batch size 1."""
        if not self.takes_arms:
            return []
        issues: list[SpecIssue] = []
        arms = set(self.arm_names)
        for name, c in (self.contrasts or {}).items():
            for field in ("arm", "reference"):
                if getattr(c, field) not in arms:
                    issues.append(
                        SpecIssue(
                            f"contrasts.{name}.{field}",
                            f"{getattr(c, field)!r} is not one of the arms {list(self.arm_names)}",
                        )
                    )
            if c.arm == c.reference:
                issues.append(SpecIssue(f"contrasts.{name}", "an arm cannot be contrasted with itself"))
        if not issues and not self.contrast_specs:
            issues.append(
                SpecIssue(
                    "contrasts",
                    "no contrast to test: name one (arm, reference, predicted) or list arms of the paper's table",
                )
            )
        pairs = [(c.arm, c.reference) for c in self.contrast_specs.values()]
        if len(set(pairs)) != len(pairs):
            issues.append(SpecIssue("contrasts", "two contrasts test the same (arm, reference) pair"))
        return issues + self.batchnorm_issues("training.batch_size", (self.training.batch_size,))

    # ---- arms and contrasts ------------------------------------------------------------------------

    @property
    def arm_names(self) -> tuple[str, ...]:
        """The arms (``arms``, else the paper's table for the model type)."""
        if self.arms is not None:
            return tuple(self.arms)
        return _DEFAULT_ARMS.get(self.model.type, ())

    @property
    def contrast_specs(self) -> dict[str, ContrastSpec]:
        """The tested contrasts (``contrasts``, else the paper's whose arms are both present)."""
        if self.contrasts is not None:
            return dict(self.contrasts)
        arms = set(self.arm_names)
        return {
            name: ContrastSpec(arm=a, reference=r, predicted=p)  # type: ignore[arg-type]
            for name, (a, r, p) in DEFAULT_CONTRASTS.get(self.model.type, {}).items()
            if a in arms and r in arms
        }

    @property
    def table_only_arms(self) -> tuple[str, ...]:
        """Arms in no contrast: trained and tabled, never tested."""
        used = {x for c in self.contrast_specs.values() for x in (c.arm, c.reference)}
        return tuple(a for a in self.arm_names if a not in used)

    @property
    def confirmatory_trials(self) -> int:
        """Arms x seeds (:attr:`expected_trials`)."""
        return self.expected_trials

    # ---- the trial configs -----------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data, loadable again (``study_spec.yaml``): arms and contrasts
        resolved, the fields the study sets itself left out."""
        doc = super().to_document()
        doc["arms"] = list(self.arm_names)
        doc["contrasts"] = {name: c.model_dump(mode="json") for name, c in self.contrast_specs.items()}
        return doc

    # ---- plans -----------------------------------------------------------------------------------

    def plan_params(self) -> tuple[tuple[str, str], ...]:
        contrasts = ",".join(f"{n}={c.arm}:{c.reference}" for n, c in self.contrast_specs.items())
        return (
            ("arms", ",".join(self.arm_names)),
            ("contrasts", contrasts),
            ("seeds", ",".join(str(s) for s in self.seeds)),
            ("optimizer", self.training.optimizer),
        )

    def confirmatory_plan(
        self, budget: str, lr: Mapping[str, float], *, look: int = 1, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """Phase ``confirm``: every arm x every seed with its tuned η (FIFO, full budget); one unnamed
        ``budget`` (``""``) and one ``look`` (1), the pipeline's names for them."""
        missing = [a for a in self.arm_names if a not in lr]
        if missing:
            raise ValueError(f"no tuned learning rate for {missing}")
        cells = [self.lr_cell(arm, lr[arm]) for arm in self.arm_names]
        name = phase_name("confirm", budget, look)
        return self.design_phase(name, budget, cells, self.seeds, tuning=False, environ=environ)
