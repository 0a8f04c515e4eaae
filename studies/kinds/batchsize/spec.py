"""The batch-size correlation study's spec (``kind: batchsize``).

The study tests a fixed design (docs/science.md, "The batch-size hypothesis"), so its spec does not
expose a free search space: it names *arms* (values of ``model.layer.type``), which arms are
*controls*, *batch sizes*, *seeds*, *budgets* and an *LR policy*, and :mod:`studies.kinds.batchsize`
builds its phases from them, each a FIFO grid plan:

1. ``lr_tuning`` (one plan per budget): each arm's η on a log-spaced grid at the reference batch
   size (per (arm, B) for ``lr_policy: tuned``), on held-out tuning seeds, selected on a validation
   metric.
2. ``confirmatory`` (one plan per budget): arms x batch sizes x seeds with the tuned η (held fixed,
   or scaled with B for ``linear`` / ``sqrt``), the same seeds — same initialisation and data order —
   for every arm (common random numbers), full budget, no early stopping.

Training defaults follow the protocol (plain SGD: no momentum, no weight decay, constant schedule, no
warm-up, no clipping, no label smoothing), which differ from the AutoNorm studies' AdamW defaults, so
the training section here is :class:`BatchSizeTrainingSpec`, a :class:`TrainingSpec` with other
defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StrictBool

from studies.adequacy import AdequacySpec
from studies.kinds.batchsize.hypothesis import HYPOTHESIS
from studies.schema import (
    NonNegInt,
    PosInt,
    SpecIssue,
    TrainingSpec,
)
from studies.schema.arms import (
    CELL_STAGE,
    CNN_ARMS,
    MLP_ARMS,
    Arm,
    ArmStudySpec,
    GridLRTuningSpec,
    PlainSGDTrainingSpec,
    phase_name,
)
from studies.schema.sections import FROZEN
from studies.sequential import SequentialSpec, look_seeds
from studies.tuning import LRGrid, extension_trials_max, refine_trials
from workers.plan import StudyPlan

__all__ = [
    "CNN_ARMS",
    "MLP_ARMS",
    "SET_BY_STUDY",
    "AnalysisSpec",
    "BatchSizeStudySpec",
    "BatchSizeTrainingSpec",
    "CellTuningSpec",
    "LRTuningSpec",
    "cell_key",
]

_CONTROLS_BY_MODEL = {
    "mlp": ("linear", "linear_batchnorm", "linear_layernorm"),
    "cnn": ("conv", "conv_batchnorm", "conv_layernorm"),
}
"""The arms the claim says do NOT decline with B (plain affine, + BatchNorm, + LayerNorm)."""


def cell_key(arm: str, batch_size: int) -> str:
    """The name of an ``(arm, batch size)`` cell (tuning plan names, tuned-LR tables)."""
    return f"{arm}@{int(batch_size)}"


SET_BY_STUDY: dict[str, str] = {
    "training.lr": "set per arm by lr_tuning (the best point of its grid); use lr_tuning.low/high",
    "training.batch_size": "set per trial from batch_sizes; list them there",
    "training.reference_batch_size": "set by lr_tuning.reference_batch_size; set that instead",
    "training.lr_scaling": "set by lr_policy; set that instead",
    "training.budget": "set per phase from budgets (e.g. budgets: [epochs, updates]); set that instead",
}
"""Fields of the shared sections that this kind sets itself, with what to set instead: refused when
given, left out of the spec reference (``scripts/gen_spec_reference.py``)."""


class BatchSizeTrainingSpec(PlainSGDTrainingSpec):
    """The batch-size study's training section: :class:`PlainSGDTrainingSpec` (the protocol's plain
    SGD); the fields in :data:`SET_BY_STUDY` are set by the study and refused here."""


class CellTuningSpec(BaseModel):
    """The second tuning stage of ``lr_policy: tuned`` (Shallue et al. 2019: η tuned per batch size).

    After each arm's η_ref is tuned at ``reference_batch_size`` on the spec's grid, every (arm, B)
    cell tunes on ``points`` rates a factor ``ratio`` apart, centred on η_ref · (B / B_ref)^``exponent``
    (0.5: the square-root rule's guess), with range extension and refinement as the first stage. The
    points x tuning seeds of a cell train as the members of one stacked model (``execution.stack``).
    """

    model_config = FROZEN

    points: Annotated[int, Field(strict=True, ge=3, le=16)] = 4  # rates per cell (>= 3: an interior)
    ratio: Annotated[float, Field(strict=True, gt=1)] = 2.0  # between neighbouring rates
    exponent: Annotated[float, Field(strict=True, ge=0, le=1)] = 0.5  # centre = η_ref (B/B_ref)^exponent

    def grid(self, lr_ref: float, batch_size: int, reference_batch_size: int) -> LRGrid:
        """The cell's grid: ``points`` rates ``ratio`` apart, centred on the scaled η_ref."""
        centre = float(lr_ref) * (int(batch_size) / int(reference_batch_size)) ** self.exponent
        return LRGrid.relative(centre, self.ratio ** ((self.points - 1) / 2), self.points)


class LRTuningSpec(GridLRTuningSpec):
    """How each arm's learning rate is chosen before the confirmatory grid: :class:`GridLRTuningSpec`.

    Policies ``constant`` / ``linear`` / ``sqrt`` tune at ``reference_batch_size`` (one η per arm,
    then held fixed or scaled with B); ``tuned`` tunes every (arm, B) cell: on the whole grid, or,
    with ``cells`` set, in two stages (η_ref per arm at the reference batch size, then a short grid
    per cell around the scaled η_ref: :class:`CellTuningSpec`).
    """

    reference_batch_size: PosInt = 64
    cells: CellTuningSpec | None = None  # lr_policy tuned: each cell's grid around the scaled η_ref


class AnalysisSpec(BaseModel):
    """Arguments of :func:`studies.kinds.batchsize.analysis.batchsize_trend` (docs/science.md, "The verdict")."""

    model_config = FROZEN

    metric: Annotated[str, Field(min_length=1)] = (
        "test_accuracy"  # final value of this reported metric per trial
    )
    higher_is_better: StrictBool = True
    alpha: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.05
    delta: Annotated[float, Field(strict=True, ge=0)] = (
        0.005  # a control "declines" below -delta per doubling
    )
    min_seeds: Annotated[int, Field(strict=True, ge=2)] = 5
    n_boot: PosInt = 2000
    n_perm: Annotated[int, Field(strict=True, ge=99)] = 9999  # >= 9,999 for a confirmatory claim
    seed: NonNegInt = 0
    confidence: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.95
    adequacy: AdequacySpec = (
        AdequacySpec()
    )  # training adequacy: each (arm, B) cell at twice the budget, a floor


Budget = Literal["epochs", "updates"]


class BatchSizeStudySpec(ArmStudySpec):
    """The batch-size correlation study (``studies/specs/batchsize_correlation.yaml``).

    ``model`` is an ``mlp`` or ``cnn`` whose ``layer`` the arms replace; every other section is
    shared with the search studies.
    """

    kind: Literal["batchsize"] = "batchsize"
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "batchsize_correlation"
    hypothesis: str = HYPOTHESIS
    training: BatchSizeTrainingSpec = BatchSizeTrainingSpec()
    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] = MLP_ARMS  # type: ignore[assignment]
    lr_tuning: LRTuningSpec = LRTuningSpec()
    analysis: AnalysisSpec = AnalysisSpec()
    control: Arm = "linear"  # the arm each fix arm's interaction is measured against
    controls: tuple[Arm, ...] | None = None  # arms the claim says do NOT decline; None: the model's
    batch_sizes: Annotated[tuple[PosInt, ...], Field(min_length=2)] = (8, 16, 32, 64, 128, 256, 512)
    budgets: Annotated[tuple[Budget, ...], Field(min_length=1)] = ("epochs", "updates")
    lr_policy: Literal["constant", "linear", "sqrt", "tuned"] = "constant"
    sequential: SequentialSpec | None = None  # seeds in looks (studies.sequential); None: fixed design

    study_label: ClassVar[str] = "batch-size study"
    set_by_study: ClassVar[Mapping[str, str]] = SET_BY_STUDY
    grid: ClassVar[Mapping[str, str]] = {"arms": "model.layer.type", "batch_sizes": "training.batch_size"}
    # Readable trial names (MLflow legends, run lists): the arm, the batch size (then the seed).
    trial_name: ClassVar[str] = "{model.layer.type}-B{training.batch_size}"
    adequacy_seed_count: ClassVar[int] = 1  # the adequacy check runs each (arm, B) cell on one tuning seed
    stored_defaults: ClassVar[Mapping[str, Any]] = {
        **ArmStudySpec.stored_defaults,
        "analysis.adequacy": {"check": False, "max_gain": None, "min_metric": None},
    }
    """:attr:`ArmStudySpec.stored_defaults`, and a study stored before the training-adequacy check
    existed ran without it (its verdict says ``"adequacy": "not measured"``)."""

    def design_issues(self) -> list[SpecIssue]:
        """The control and the controls among the arms, at least one fix arm; distinct batch sizes and
        budgets; no BatchNorm arm at batch size 1; ``max_updates`` only with the updates budget; a
        sequential design's ``max_seeds`` within ``seeds``."""
        issues: list[SpecIssue] = []
        if self.takes_arms:
            if self.control not in self.arms:
                issues.append(
                    SpecIssue(
                        "control", f"the control {self.control!r} must be one of the arms {list(self.arms)}"
                    )
                )
            for i, arm in enumerate(self.controls or ()):
                if arm not in self.arms:
                    issues.append(
                        SpecIssue(f"controls.{i}", f"{arm!r} is not one of the arms {list(self.arms)}")
                    )
            if self.controls is not None and self.control not in self.controls:
                issues.append(SpecIssue("controls", f"must include the control {self.control!r}"))
            if not self.fix_arms:
                issues.append(
                    SpecIssue("arms", "no fix arm: every arm is a control, so there is no claim to test")
                )
        for field, values in (("batch_sizes", self.batch_sizes), ("budgets", self.budgets)):
            if len(set(values)) != len(values):
                issues.append(SpecIssue(field, f"{field} must be distinct, got {list(values)}"))
        issues += self.batchnorm_issues("batch_sizes", self.batch_sizes)
        if self.lr_tuning.cells is not None and self.lr_policy != "tuned":
            issues.append(
                SpecIssue("lr_tuning.cells", "tunes each (arm, B) cell: only with lr_policy: tuned; drop it")
            )
        if "updates" not in self.budgets and self.training.max_updates is not None:
            issues.append(
                SpecIssue("training.max_updates", "only used when budgets include 'updates'; drop it")
            )
        if self.sequential is not None and len(self.seeds) < self.sequential.max_seeds:
            issues.append(
                SpecIssue(
                    "sequential.max_seeds",
                    f"{self.sequential.max_seeds} seeds planned but `seeds` lists {len(self.seeds)}; "
                    "list at least max_seeds confirmatory seeds (they are taken in order)",
                )
            )
        return issues

    # ---- arms -----------------------------------------------------------------------------------

    @property
    def control_arms(self) -> tuple[str, ...]:
        """The arms the claim says do not decline (``controls``, else the model's controls present)."""
        if self.controls is not None:
            return tuple(self.controls)
        defaults = _CONTROLS_BY_MODEL.get(self.model.type, (self.control,))
        return tuple(a for a in self.arms if a in defaults or a == self.control)

    @property
    def fix_arms(self) -> tuple[str, ...]:
        controls = set(self.control_arms)
        return tuple(a for a in self.arms if a not in controls)

    # ---- the trial configs --------------------------------------------------------------------

    def training_section(self, budget: str | None = None) -> TrainingSpec:
        """The training section of a trial under ``budget`` (the first budget by default).

        ``lr_scaling`` comes from the LR policy (``tuned`` and ``constant`` -> no scaling), the
        reference batch size from ``lr_tuning``, ``max_updates`` only under the updates budget.
        """
        budget = budget or self.budgets[0]
        scaling = self.lr_policy if self.lr_policy in ("linear", "sqrt") else "constant"
        doc = self.training.model_dump()
        doc.update(
            lr_scaling=scaling,
            reference_batch_size=self.lr_tuning.reference_batch_size,
            budget=budget,
            max_updates=self.training.max_updates if budget == "updates" else None,
        )
        return TrainingSpec.model_validate(doc)

    @property
    def default_arm(self) -> str:
        """The control."""
        return self.control

    # ---- sizes ----------------------------------------------------------------------------------

    @property
    def sequential_family(self) -> int:
        """Hypotheses a sequential design must decide: the fix arms under every budget."""
        return len(self.fix_arms) * len(self.budgets)

    @property
    def confirmatory_trials_max(self) -> int:
        """Confirmatory trials when every look runs (``max_seeds``), or the fixed design's."""
        return self.trials_per_seed * (
            len(self.seeds) if self.sequential is None else self.sequential.max_seeds
        )

    @property
    def budget_names(self) -> tuple[str, ...]:
        return tuple(self.budgets)

    @property
    def tuning_cells(self) -> tuple[str, ...]:
        """The cells of the first tuning phase: ``arm`` (``cell_key(arm, B)`` for ``tuned`` without
        ``lr_tuning.cells``)."""
        if self.lr_policy == "tuned" and self.lr_tuning.cells is None:
            return self.tuned_cells
        return tuple(self.arms)

    @property
    def tuned_cells(self) -> tuple[str, ...]:
        """The cells the confirmatory phase reads an η for: ``arm``, or ``cell_key(arm, B)`` for
        ``tuned``."""
        if self.lr_policy == "tuned":
            return tuple(cell_key(a, b) for a in self.arms for b in self.batch_sizes)
        return tuple(self.arms)

    def cell_grids(self, lr_ref: Mapping[str, float]) -> dict[str, LRGrid]:
        """The second tuning stage's grid per (arm, B) cell around each arm's η_ref (``lr_ref``, arm ->
        η at the reference batch size; an arm without one gets no cells); ``{}`` without
        ``lr_tuning.cells``."""
        cells, ref = self.lr_tuning.cells, self.lr_tuning.reference_batch_size
        if cells is None or self.lr_policy != "tuned":
            return {}
        return {
            cell_key(a, b): cells.grid(lr_ref[a], b, ref)
            for a in self.arms
            if a in lr_ref
            for b in self.batch_sizes
        }

    def cell_tuning_plan(
        self, budget: str, grids: Mapping[str, LRGrid], *, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """Phase ``tune[-<budget>]-cells``: every cell's grid (:meth:`cell_grids`) x the tuning seeds."""
        cells = [self.lr_cell(cell, lr) for cell, grid in sorted(grids.items()) for lr in grid.points]
        name = f"{phase_name('tune', budget)}{CELL_STAGE}"
        return self.design_phase(name, budget, cells, tuning=True, environ=environ)

    @property
    def tuning_trials(self) -> int:
        """Both tuning stages: the first's cells x grid points, the second's cells x its points, x
        tuning seeds x budgets."""
        per_seed = len(self.tuning_cells) * self.lr_tuning.points
        if self.lr_tuning.cells is not None and self.lr_policy == "tuned":
            per_seed += len(self.tuned_cells) * self.lr_tuning.cells.points
        return per_seed * len(self.lr_tuning.seeds) * len(self.budget_names)

    def _stage_grids(self) -> list[LRGrid]:
        first = [self.lr_tuning.lr_grid()] * len(self.tuning_cells)
        second = list(self.cell_grids(dict.fromkeys(self.arms, float(self.training.lr))).values())
        return first + second

    @property
    def extension_trials_max(self) -> int:
        """The most trials range extensions can add: every cell of both stages, every round, budget."""
        seeds, rounds = len(self.lr_tuning.seeds), self.lr_tuning.max_extensions
        return extension_trials_max(self._stage_grids(), seeds, rounds) * len(self.budget_names)

    @property
    def refine_trials(self) -> int:
        """The refinement's trials when every winner of both stages is interior."""
        seeds, n = len(self.lr_tuning.seeds), self.lr_tuning.refine
        return refine_trials(self._stage_grids(), seeds, n) * len(self.budget_names)

    # ---- plans --------------------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data, loadable again (``study_spec.yaml``): the fields the study
        derives (the layer type from the arms, lr scaling and budget per plan) are left out."""
        doc = super().to_document()
        if doc.get("sequential") is None:  # a fixed design's document stays what it was
            doc.pop("sequential", None)
        return doc

    def lr_cell(self, cell: str, lr: float) -> dict[str, Any]:
        """A tuning cell ``arm`` (at the reference batch size) or ``arm@B`` (``tuned``) at ``lr``."""
        arm, _, b = cell.partition("@")
        return _cell(arm, int(b) if b else self.lr_tuning.reference_batch_size, lr)

    def look_plan_name(self, budget: str, look: int) -> str:
        """The folder of a confirmatory look: ``confirm-<budget>`` (the first, or the fixed design's
        only one), ``confirm-<budget>-look<j>`` after it."""
        return phase_name("confirm", budget, look)

    def confirmatory_plan(
        self,
        budget: str,
        lr: Mapping[str, float],
        *,
        look: int = 1,
        environ: Mapping[str, str] | None = None,
        arms: Sequence[str] | None = None,
    ) -> StudyPlan:
        """Phase 2: every arm x batch size x seed with the tuned learning rates (FIFO, full budget).

        Args:
            lr: ``cell_key(arm, B) -> lr`` for ``tuned``; else ``arm -> lr`` (the η at the reference
                batch size, scaled with B by the trial for ``linear`` / ``sqrt``).
            look: a sequential design's look (1-based): the plan runs the seeds that look adds.
            arms: only these arms (a later look under per-arm stopping); ``None``: every arm.
        """
        cells = []
        for arm in self.arms:
            if arms is not None and arm not in arms:
                continue
            for b in self.batch_sizes:
                key = cell_key(arm, b) if self.lr_policy == "tuned" else arm
                if key not in lr:
                    raise ValueError(f"no tuned learning rate for {key!r}")
                cells.append(_cell(arm, b, float(lr[key])))
        seeds: Sequence[int] = self.seeds
        if self.sequential is not None:
            seeds = dict(look_seeds(self.seeds, self.sequential.schedule()))[look]
        return self.design_phase(
            self.look_plan_name(budget, look), budget, cells, seeds, tuning=False, environ=environ
        )

    def plan_params(self) -> tuple[tuple[str, str], ...]:
        return (
            ("arms", ",".join(self.arms)),
            ("control", self.control),
            ("controls", ",".join(self.control_arms)),
            ("batch_sizes", ",".join(str(b) for b in self.batch_sizes)),
            ("seeds", ",".join(str(s) for s in self.seeds)),
            ("budgets", ",".join(self.budgets)),
            ("lr_policy", self.lr_policy),
            ("optimizer", self.training.optimizer),
        )


def _cell(arm: str, batch_size: int, lr: float) -> dict[str, Any]:
    return {"model": {"layer": {"type": arm}}, "training": {"batch_size": int(batch_size), "lr": float(lr)}}
