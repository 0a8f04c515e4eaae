"""The compare study's spec (``kind: compare``): arms x seeds, paired contrasts against reference arms.

The Affine Divergence paper's main table as a fixed design (docs/science.md, "The Affine Divergence
main table"). The spec names *arms* (values of ``model.layer.type`` of an ``mlp`` or ``cnn``),
*contrasts* (an arm against a reference arm, with the direction the paper predicts), *seeds* and
an *equivalence margin*; :mod:`studies.kinds.compare.kind` builds its phases from them, each a FIFO
grid plan:

1. ``tune``: each arm's η on a log-spaced grid on held-out tuning seeds, selected on a validation
   metric (:mod:`studies.tuning`; a winner on the grid's edge extends it in the optional phases
   ``tune-ext<k>``).
2. ``confirm``: arms x seeds with the tuned η, the same seeds — same split, data order and, where
   the shapes agree, initialisation — for every arm, full budget, no early stopping.

Arms that appear in no contrast (``prenorm_l2``, the paper's PreNormAffine) are trained and shown
in the tables, never tested. Training defaults are plain SGD (the divergence derivation assumes
vanilla gradient descent); momentum, Adam, weight decay are ablations a spec can switch on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StrictBool

from studies.schema import (
    CategoricalParam,
    NonNegInt,
    SpecIssue,
    TrainingSpec,
    check_search_space,
)
from studies.schema.arms import Arm, ArmStudySpec, GridLRTuningSpec, PlainSGDTrainingSpec
from studies.schema.sections import FROZEN
from studies.tuning import extension_trials_max
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

DEFAULT_CONTRASTS: dict[str, dict[str, tuple[str, str, str]]] = {
    "mlp": {
        "corrected_vs_batchnorm": ("corrected", "linear_batchnorm", "better"),
        "corrected_vs_layernorm": ("corrected", "linear_layernorm", "better"),
        "batchnorm_vs_plain": ("linear_batchnorm", "linear", "better"),
        "layernorm_vs_plain": ("linear_layernorm", "linear", "better"),
    },
    "cnn": {
        "patchnorm_vs_batchnorm": ("patchnorm", "conv_batchnorm", "better"),
        "patchnorm_vs_layernorm": ("patchnorm", "conv_layernorm", "better"),
        "batchnorm_vs_plain": ("conv_batchnorm", "conv", "better"),
        "layernorm_vs_plain": ("conv_layernorm", "conv", "better"),
    },
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

    def trial_issues(self) -> list[SpecIssue]:
        """Every arm's trial must be valid on its own (data fits model, ...)."""
        found = check_search_space(
            (CategoricalParam(name="model.layer.type", choices=tuple(self.arm_names)),),
            self.base_config(),
            sampler="grid",
            seeds=self.seeds,
            prefix="<arms>",
        )
        return [
            SpecIssue(_arms_path(i.path, self.arms is not None), i.message, i.line, i.source) for i in found
        ]

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

    # ---- sizes -----------------------------------------------------------------------------------

    @property
    def confirmatory_trials(self) -> int:
        return len(self.arm_names) * len(self.seeds)

    @property
    def tuning_trials(self) -> int:
        return len(self.arm_names) * self.lr_tuning.points * len(self.lr_tuning.seeds)

    @property
    def total_trials(self) -> int:
        """Every trial with no range extension firing."""
        return self.confirmatory_trials + self.tuning_trials

    @property
    def extension_trials_max(self) -> int:
        grids = [self.lr_tuning.lr_grid()] * len(self.arm_names)
        return extension_trials_max(grids, len(self.lr_tuning.seeds), self.lr_tuning.max_extensions)

    # ---- the trial configs -----------------------------------------------------------------------

    def base_config(self, *, arm: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """The trial config of ``arm`` at the first seed; by default the model's plain layer, whose only
        field is its type, so that each arm's cell sets the type alone and keeps that arm's defaults."""
        plain = "conv" if self.model.type == "cnn" else "linear"
        training = TrainingSpec.model_validate(self.training.model_dump())
        return self.arm_config(arm or plain, training, seed=seed)

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data, loadable again (``study_spec.yaml``): arms and contrasts
        resolved, the fields the study sets itself left out."""
        doc = super().to_document()
        doc["arms"] = list(self.arm_names)
        doc["contrasts"] = {name: c.model_dump(mode="json") for name, c in self.contrast_specs.items()}
        return doc

    # ---- plans -----------------------------------------------------------------------------------

    def _plan(
        self,
        *,
        name: str,
        cells: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        tuning: bool,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """Phase ``name``: a FIFO grid plan over ``cells`` (arm and lr together) x ``seeds``."""
        base = self.base_config()
        if tuning and self.lr_tuning.epochs is not None:
            base["training"]["epochs"] = int(self.lr_tuning.epochs)
        contrasts = ",".join(f"{n}={c.arm}:{c.reference}" for n, c in self.contrast_specs.items())
        return self.phase_plan(
            name,
            cells,
            seeds,
            base_config=base,
            run_name="{model.layer.type}" + ("-lr{training.lr:g}" if tuning else "") + "-s{seed}",
            extra_tags=(("autonorm.study", "compare"),),
            extra_params=(
                ("arms", ",".join(self.arm_names)),
                ("contrasts", contrasts),
                ("seeds", ",".join(str(s) for s in self.seeds)),
                ("optimizer", self.training.optimizer),
            ),
            environ=environ,
        )

    def tuning_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """Phase ``tune``: every arm x the LR grid x the tuning seeds."""
        cells = [_cell(arm, lr) for arm in self.arm_names for lr in self.lr_tuning.grid()]
        return self._plan(name="tune", cells=cells, seeds=self.lr_tuning.seeds, tuning=True, environ=environ)

    def extension_plan(
        self, round_: int, lrs: Mapping[str, float], *, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """Phase ``tune-ext<round>``: each edge arm's one new η x the tuning seeds."""
        cells = [_cell(arm, lr) for arm, lr in sorted(lrs.items())]
        return self._plan(
            name=f"tune-ext{int(round_)}",
            cells=cells,
            seeds=self.lr_tuning.seeds,
            tuning=True,
            environ=environ,
        )

    def confirmatory_plan(
        self, lr: Mapping[str, float], *, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """Phase ``confirm``: every arm x every seed with its tuned η (FIFO, full budget)."""
        missing = [a for a in self.arm_names if a not in lr]
        if missing:
            raise ValueError(f"no tuned learning rate for {missing}")
        cells = [_cell(arm, float(lr[arm])) for arm in self.arm_names]
        return self._plan(name="confirm", cells=cells, seeds=self.seeds, tuning=False, environ=environ)

    def study_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """A plan carrying the study-level settings (name, storage, tracking, tags, params, spec)."""
        return self.study_level_plan(self.tuning_plan(environ=environ))


def _cell(arm: str, lr: float) -> dict[str, Any]:
    return {"model": {"layer": {"type": arm}}, "training": {"lr": float(lr)}}


def _arms_path(path: str, explicit: bool) -> str:
    """``<arms>.0.choices.2`` (from check_search_space) -> ``arms.2`` (``arms`` for defaulted arms)."""
    parts = path.split(".")
    if parts[0] != "<arms>":
        return path
    if explicit and len(parts) >= 4 and parts[2] == "choices":
        return f"arms.{parts[3]}"
    return "arms"
