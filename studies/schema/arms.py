"""Fixed designs over layer *arms*: what the kinds whose arms are values of ``model.layer.type`` share.

A kind of this shape (the batch-size and the compare kinds) names arms of an ``mlp`` or ``cnn``,
tunes each arm's learning rate on a log-spaced grid on held-out seeds, then trains every arm on the
same confirmatory seeds with its tuned rate, each phase a FIFO grid plan. This module holds the parts
that do not depend on the kind: the arms per model type, plain-SGD training defaults, the tuning
section (:class:`GridLRTuningSpec`), the validation shared by the kinds' spec classes and the grid
plan of one phase. It never imports a kind.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, Field, StrictBool, model_validator

from studies.schema import sections
from studies.schema.errors import SpecError, SpecIssue
from studies.schema.execution import ExecutionSpec
from studies.schema.metrics import metric_issues
from studies.schema.plan import build_plan, plan_settings, spec_hash
from studies.schema.reading import dump_yaml
from studies.schema.sampling import CategoricalParam, FIFOSpec, GridSpec, SearchSpec
from studies.schema.sections import (
    FROZEN,
    CNNSpec,
    DataSpec,
    FashionMNISTSpec,
    MLPSpec,
    ModelSpec,
    NonNegInt,
    PosFloat,
    PosInt,
    ResourcesSpec,
    Seed,
    StorageSpec,
    TrackingSpec,
    TrainingSpec,
    TrialSections,
    data_task,
)
from studies.schema.space import check_search_space
from studies.schema.urls import StoragePath
from studies.tuning import LRGrid, extension_trials_max, refine_trials
from workers.dotted import ROOT
from workers.plan import StudyPlan

__all__ = [
    "ARMS_BY_MODEL",
    "BATCHNORM_ARMS",
    "CNN_ARMS",
    "MLP_ARMS",
    "Arm",
    "ArmStudySpec",
    "GridLRTuningSpec",
    "PlainSGDTrainingSpec",
    "arm_issues",
    "arm_layer",
    "phase_name",
    "set_by_study_issues",
    "tuned_design_issues",
]

Arm = Literal[
    "linear",
    "linear_batchnorm",
    "linear_layernorm",
    "prenorm_l2",
    "prenorm_rms",
    "corrected",
    "conv",
    "conv_batchnorm",
    "conv_layernorm",
    "patchnorm",
]
"""Every arm: the MLP's hidden-layer types, then the CNN's convolution types."""

MLP_ARMS: tuple[str, ...] = get_args(Arm)[:6]
"""Hidden-layer types of the MLP variant; ``linear`` is the plain affine map."""

CNN_ARMS: tuple[str, ...] = get_args(Arm)[6:]
"""Convolution types of the CNN variant; ``conv`` is the plain convolution."""

ARMS_BY_MODEL: dict[str, tuple[str, ...]] = {"mlp": MLP_ARMS, "cnn": CNN_ARMS}
"""The arms each model type takes."""

BATCHNORM_ARMS = frozenset({"linear_batchnorm", "conv_batchnorm"})
"""The arms that batch size 1 leaves undefined."""


class PlainSGDTrainingSpec(TrainingSpec):
    """:class:`TrainingSpec` with plain-SGD defaults: no momentum, weight decay, schedule, warm-up,
    clipping or label smoothing (the divergence derivation assumes vanilla gradient descent; each is
    an ablation a spec can switch on)."""

    epochs: PosInt = 10
    lr: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = (
        0.05  # never trained with: a placeholder for cost estimates before lr_tuning has run
    )
    optimizer: Literal["adamw", "sgd"] = "sgd"
    weight_decay: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = 0.0
    schedule: Literal["cosine", "constant"] = "constant"
    warmup_fraction: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = 0.0
    grad_clip: PosFloat | None = None
    label_smoothing: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = 0.0


class GridLRTuningSpec(BaseModel):
    """How each arm's learning rate is chosen before the confirmatory phase.

    The arms learn at very different speeds under one η (a plain layer moves its activations by
    −ηg(‖x‖²+1), a corrected one by −ηg), so a shared η would compare a trained arm with an untrained
    one. Each arm's η is therefore tuned: a log-spaced grid of ``points`` rates in [``low``,
    ``high``], every point trained on every tuning seed (held out from the confirmatory seeds); the
    rate with the best mean ``metric`` (a validation metric; a failed trial scores the worst value)
    wins. A grid rather than a sequential sampler: every candidate is scored on the same seeds, the
    phase resumes trial by trial, and "the best η sits on the edge of the range" is exact. Such a
    winner extends the grid by one point of its ratio in that direction, up to ``max_extensions``
    times (:mod:`studies.tuning`); an arm still on the edge afterwards is ``lr-at-range-edge`` (its
    claims inconclusive). An interior winner is refined: ``refine`` more rates between it and its
    neighbours (2: the geometric midpoints) run on the tuning seeds, and the selection is made again.
    A study stored before ``refine`` existed reads as ``refine: 0`` (:attr:`ArmStudySpec.stored_defaults`).
    """

    model_config = FROZEN

    low: PosFloat = 1e-3
    high: PosFloat = 1e2  # wide enough for every arm: corrected layers need ~‖x‖²+1 times plain η
    points: Annotated[int, Field(strict=True, ge=3, le=64)] = 11  # log-spaced grid points
    seeds: Annotated[tuple[Seed, ...], Field(min_length=2)] = (1000, 1001)
    epochs: PosInt | None = None  # tuning budget; None: the confirmatory training.epochs
    metric: Annotated[str, Field(min_length=1)] = "val_accuracy"
    mode: Literal["min", "max"] = "max"
    max_extensions: Annotated[int, Field(strict=True, ge=0, le=20)] = 3  # edge extensions (studies.tuning)
    # even: refine/2 more rates between an interior best η and each neighbour (2: the geometric midpoints; 0: none)
    refine: Annotated[int, Field(strict=True, ge=0, le=8, multiple_of=2)] = 2
    # each rate's mean and standard error over the seeds; a pick ahead of the runner-up by < 1 SE carries
    # the informational reason `lr-tuning-noisy` (studies.tuning.tuning_noise); stored studies read as false
    flag_noisy: StrictBool = True

    @model_validator(mode="after")
    def _range(self) -> GridLRTuningSpec:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.metric.startswith("test_"):
            raise ValueError(f"metric {self.metric!r} selects on the test split; use a validation metric")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"tuning seeds must be distinct, got {list(self.seeds)}")
        return self

    def lr_grid(self) -> LRGrid:
        """The grid before any extension."""
        return LRGrid.absolute(self.low, self.high, self.points)

    def grid(self) -> tuple[float, ...]:
        """The candidate learning rates, log-spaced from ``low`` to ``high`` (both included)."""
        return self.lr_grid().points


def arm_layer(model_type: str, arm: str) -> Any:
    """The layer spec of ``arm`` for the model type (validated through the model's own union)."""
    cls = MLPSpec if model_type == "mlp" else CNNSpec
    return cls.model_validate({"type": model_type, "layer": {"type": arm}}).layer


CELL_STAGE = "-cells"
"""A second tuning stage's phase suffix (``tune[-<budget>]-cells``, its ``-ext<k>`` and ``-refine``)."""


def phase_name(stem: str, budget: str = "", look: int = 1) -> str:
    """A tuned design's phase name (its folder, phase run and ``autonorm.phase`` tag): ``stem``
    (``tune``, ``confirm``), ``-<budget>`` for a named budget, ``-look<j>`` for a sequential
    design's look after the first: ``tune``, ``tune-epochs``, ``confirm-updates-look2``."""
    return stem + (f"-{budget}" if budget else "") + (f"-look{int(look)}" if look > 1 else "")


def arm_issues(model: Any, arms: Sequence[str] | None, *, study: str) -> list[SpecIssue]:
    """The model type takes arms, each of ``arms`` is one of its layers (``None``: the kind's default
    arms, not checked here), the arms are distinct and ``model.layer`` is left to them. An unsupported
    model type is the one issue returned (nothing else can be checked against it)."""
    valid = ARMS_BY_MODEL.get(model.type)
    if valid is None:
        return [SpecIssue("model.type", f"the {study} needs model type 'mlp' or 'cnn', got {model.type!r}")]
    issues = [
        SpecIssue(
            f"arms.{i}",
            f"{arm!r} is not a layer of model type {model.type!r} (valid: {', '.join(valid)})",
        )
        for i, arm in enumerate(arms or ())
        if arm not in valid
    ]
    if arms is not None and len(set(arms)) != len(arms):
        issues.append(SpecIssue("arms", f"arms must be distinct, got {list(arms)}"))
    if getattr(model, "layer", None) is not None and "layer" in model.model_fields_set:
        issues.append(SpecIssue("model.layer", "the arms set the layer type; list them under 'arms' instead"))
    return issues


def set_by_study_issues(training: BaseModel, set_by_study: Mapping[str, str]) -> list[SpecIssue]:
    """One issue per ``training.<field>`` of ``set_by_study`` (path -> what to do instead) the spec
    sets: the kind sets those fields itself."""
    return [
        SpecIssue(path, why)
        for path, why in set_by_study.items()
        if path.removeprefix("training.") in training.model_fields_set
    ]


def tuned_design_issues(spec: Any, earlier: Sequence[SpecIssue]) -> list[SpecIssue]:
    """The checks a fixed design with an ``lr_tuning`` and an ``analysis`` section shares: tuning
    seeds held out from the confirmatory ``seeds``, then (only when neither that nor ``earlier``
    found an issue) :func:`metric_issues` of ``lr_tuning.metric`` / ``lr_tuning.mode`` and of
    ``analysis.metric`` / ``analysis.higher_is_better`` (a test metric allowed there)."""
    issues: list[SpecIssue] = []
    overlap = sorted(set(spec.lr_tuning.seeds) & set(spec.seeds))
    if overlap:
        issues.append(
            SpecIssue(
                "lr_tuning.seeds",
                f"tuning seeds {overlap} are also confirmatory seeds; tune on held-out seeds",
            )
        )
    if not issues and not earlier:
        issues += metric_issues(
            spec.lr_tuning.metric,
            spec.lr_tuning.mode,
            model=spec.model,
            data=spec.data,
            metric_path="lr_tuning.metric",
            mode_path="lr_tuning.mode",
        )
        issues += metric_issues(
            spec.analysis.metric,
            "max" if spec.analysis.higher_is_better else "min",
            model=spec.model,
            data=spec.data,
            metric_path="analysis.metric",
            mode_path="analysis.higher_is_better",
            allow_test=True,
        )
    return issues


class ArmStudySpec(BaseModel):
    """The fields and methods every arm design's spec class shares; a kind's class subclasses it,
    narrowing ``kind``, ``training``, ``arms``, ``lr_tuning`` and ``analysis`` and adding its own
    design fields (which follow these in the spec reference and in ``study_spec.yaml``)."""

    model_config = FROZEN

    kind: str
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "study"
    description: str = ""
    hypothesis: str = ""  # the claim under test, in words (the kind's by default)
    model: ModelSpec = MLPSpec()
    data: DataSpec = FashionMNISTSpec()
    training: PlainSGDTrainingSpec = PlainSGDTrainingSpec()
    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] | None = None
    seeds: Annotated[tuple[Seed, ...], Field(min_length=2)] = (0, 1, 2, 3, 4, 5, 6, 7)  # confirmatory
    lr_tuning: GridLRTuningSpec = GridLRTuningSpec()
    analysis: Any = None
    resources: ResourcesSpec = ResourcesSpec()
    execution: ExecutionSpec = ExecutionSpec()  # stacked trials (seeds, lr points of a cell in one process)
    max_concurrent: PosInt = 2  # trials at once (Tune's max_concurrent_trials)
    retries: NonNegInt = 2  # FailureConfig(max_failures) per trial
    tracking: TrackingSpec = TrackingSpec()
    storage_path: StoragePath = "runs"  # local dir or s3://bucket/prefix
    storage: StorageSpec = StorageSpec()
    exploratory: StrictBool = False  # run a design that cannot decide (report marked exploratory)

    study_label: ClassVar[str] = "study"
    """The kind's study in words, for messages (``"batch-size study"``)."""
    set_by_study: ClassVar[Mapping[str, str]] = {}
    """``training.<field>`` -> what to set instead, for the fields the kind sets itself (refused)."""
    grid: ClassVar[Mapping[str, str]] = {}
    """The kind's trial grid: spec field -> the trial-config path it sets (``{"arms":
    "model.layer.type"}``); every trial of it is checked (:meth:`trial_issues`), none when empty."""
    stored_defaults: ClassVar[Mapping[str, Any]] = {
        "lr_tuning.refine": 0,
        "lr_tuning.flag_noisy": False,
        "execution": {"stack": "off"},
    }
    """Fields added after studies were stored, with what a stored spec without them ran as
    (:func:`studies.schema.stored_defaults_missing`): a study from before ``lr_tuning.refine`` existed
    was not refined, nor flagged for tuning noise before ``lr_tuning.flag_noisy``; one from before
    ``execution`` existed ran every trial in its own process."""

    study_tags: ClassVar[tuple[tuple[str, str], ...]] = ()
    """Tags of every phase run and trial run of the kind's studies (``autonorm.study``, ...)."""
    trial_name: ClassVar[str] = "{model.layer.type}"
    """A trial run's name, a template over its config (``-lr<η>`` on a tuning trial, then ``-s<seed>``)."""

    @model_validator(mode="after")
    def _check_design(self) -> ArmStudySpec:
        issues = arm_issues(self.model, self.arms, study=self.study_label)
        issues += self.design_issues()
        if len(set(self.seeds)) != len(self.seeds):
            issues.append(SpecIssue("seeds", f"seeds must be distinct, got {list(self.seeds)}"))
        issues += set_by_study_issues(self.training, self.set_by_study)
        if data_task(self.data) == "regression":  # (a text set does not fit the model: trial_issues says so)
            hint = (
                " (float targets); give integer class labels"
                if isinstance(self.data, (sections.ArraysDataSpec, sections.TableDataSpec))
                else ""
            )
            issues.append(
                SpecIssue(
                    "data",
                    f"the {self.study_label} analyses classification accuracy, but {self.data.type!r} is a "
                    f"regression data set{hint}",
                )
            )
        issues += tuned_design_issues(self, issues)
        if not issues:  # every trial must be valid on its own: data fits model, budgets, ...
            issues += self.trial_issues()
        if issues:
            raise SpecError(issues)
        return self

    @property
    def takes_arms(self) -> bool:
        """Whether the model type has arms (``mlp``, ``cnn``); nothing about arms can be checked else."""
        return self.model.type in ARMS_BY_MODEL

    def batchnorm_issues(self, path: str, batch_sizes: Sequence[int]) -> list[SpecIssue]:
        """Batch size 1 among ``batch_sizes`` (the field ``path``) with a BatchNorm arm: undefined."""
        if BATCHNORM_ARMS & set(self.arms or ()) and 1 in batch_sizes:
            return [SpecIssue(path, "batch size 1 leaves BatchNorm undefined; drop it or the BatchNorm arms")]
        return []

    def design_issues(self) -> list[SpecIssue]:
        """The kind's checks of its own design fields (the model type may be one without arms)."""
        return []

    def trial_issues(self) -> list[SpecIssue]:
        """Problems of the kind's trials themselves, run only when nothing else was found: every
        trial of its :attr:`grid` must be valid on its own (data fits model, budgets, ...), by
        :func:`check_search_space`, with the spec's field paths."""
        if not self.grid:
            return []
        values = self._grid_values()
        params = tuple(
            CategoricalParam(name=path, choices=values[field]) for field, path in self.grid.items()
        )
        found = check_search_space(
            params, self.base_config(), sampler="grid", seeds=self.seeds, prefix="<grid>"
        )
        return [SpecIssue(self._grid_path(i.path), i.message, i.line, i.source) for i in found]

    def _grid_values(self) -> dict[str, tuple[Any, ...]]:
        """Each field of the :attr:`grid` (the arms alone without one) -> its values."""
        fields = self.grid or {"arms": ""}
        return {f: self.arm_names if f == "arms" else tuple(getattr(self, f)) for f in fields}

    def _grid_path(self, path: str) -> str:
        """``<grid>.k.choices.i`` (from :func:`check_search_space`) -> ``<field k>.i``; the field
        alone for any other part of parameter ``k``, and for arms the kind chose (``arms`` not set)."""
        parts = path.split(".")
        if parts[0] != "<grid>" or len(parts) < 2:
            return path
        field = list(self.grid)[int(parts[1])]
        if len(parts) >= 4 and parts[2] == "choices" and (field != "arms" or self.arms is not None):
            return f"{field}.{parts[3]}"
        return field

    # ---- the trial configs ------------------------------------------------------------------------

    @property
    def default_arm(self) -> str:
        """The arm of :meth:`base_config` when none is named: the model type's plain layer (``linear``,
        ``conv``), whose only field is its type, so that each arm's cell sets the type alone and
        keeps that arm's defaults."""
        return ARMS_BY_MODEL.get(self.model.type, self.arm_names)[0]

    def training_section(self, budget: str | None = None) -> TrainingSpec:
        """The training section of a trial (under ``budget``, for a kind that has several)."""
        return TrainingSpec.model_validate(self.training.model_dump())

    def base_config(
        self, *, arm: str | None = None, seed: int | None = None, budget: str | None = None
    ) -> dict[str, Any]:
        """The trial config of ``arm`` (:attr:`default_arm` by default) under ``budget`` at ``seed``
        (the first by default)."""
        return self.arm_config(arm or self.default_arm, self.training_section(budget), seed=seed)

    # ---- arms, budgets and sizes ------------------------------------------------------------------

    @property
    def arm_names(self) -> tuple[str, ...]:
        """The arms (``arms``; a kind whose arms default per model type says which)."""
        return tuple(self.arms or ())

    @property
    def budget_names(self) -> tuple[str, ...]:
        """The training budgets, each its own tuning and confirmatory phase: one unnamed ``""``
        unless the kind has several."""
        return ("",)

    @property
    def tuning_cells(self) -> tuple[str, ...]:
        """The cells whose η is tuned: one per arm, unless the kind tunes finer."""
        return self.arm_names

    @property
    def tuned_cells(self) -> tuple[str, ...]:
        """The cells the confirmatory phase reads an η for: :attr:`tuning_cells`, unless a second
        tuning stage (:meth:`cell_grids`) tunes finer cells."""
        return self.tuning_cells

    def cell_grids(self, lr_ref: Mapping[str, float]) -> dict[str, LRGrid]:
        """A second tuning stage (``tune[-<budget>]-cells``): each finer cell's grid around the first
        stage's η (``lr_ref``); ``{}``: none (the default)."""
        return {}

    def cell_tuning_plan(
        self, budget: str, grids: Mapping[str, LRGrid], *, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """The second tuning stage's phase; only a kind whose :meth:`cell_grids` returns grids has one."""
        raise NotImplementedError(f"{type(self).__name__} has no second tuning stage")

    @property
    def trials_per_seed(self) -> int:
        """Confirmatory trials one seed adds: every point of the grid under every budget."""
        return math.prod(len(v) for v in self._grid_values().values()) * len(self.budget_names)

    @property
    def expected_trials(self) -> int:
        """Confirmatory trials: :attr:`trials_per_seed` x seeds (a sequential design: through its
        first look, the least it runs)."""
        sequential = getattr(self, "sequential", None)  # a field of the kinds that have it
        return self.trials_per_seed * (len(self.seeds) if sequential is None else sequential.schedule()[0])

    @property
    def total_trials(self) -> int:
        """Every trial with no range extension firing and no refinement (the least a study runs),
        the training-adequacy check's (:attr:`adequacy_trials`) included."""
        return self.expected_trials + self.tuning_trials + self.adequacy_trials

    @property
    def adequacy_trials(self) -> int:
        """The training-adequacy check's trials (:func:`studies.adequacy.adequacy_trials`; 0 when off)."""
        from studies.adequacy import adequacy_trials

        return adequacy_trials(self)

    @property
    def tuning_trials(self) -> int:
        """LR-tuning trials: cells x grid points x tuning seeds x budgets."""
        cells = len(self.tuning_cells) * len(self.budget_names)
        return cells * self.lr_tuning.points * len(self.lr_tuning.seeds)

    @property
    def extension_trials_max(self) -> int:
        """The most trials range extensions can add: every cell, every round, every budget."""
        grids = [self.lr_tuning.lr_grid()] * len(self.tuning_cells)
        seeds, rounds = len(self.lr_tuning.seeds), self.lr_tuning.max_extensions
        return extension_trials_max(grids, seeds, rounds) * len(self.budget_names)

    @property
    def refine_trials(self) -> int:
        """The trials the learning-rate refinement adds when every cell's winner is interior:
        ``lr_tuning.refine`` rates x tuning seeds per cell and budget."""
        grids = [self.lr_tuning.lr_grid()] * len(self.tuning_cells)
        return refine_trials(grids, len(self.lr_tuning.seeds), self.lr_tuning.refine) * len(self.budget_names)

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data, loadable again (``study_spec.yaml``): the layer type (set
        by the arms) and the fields the study sets itself are left out."""
        doc = self.model_dump(mode="json")
        doc["model"].pop("layer", None)
        for path in self.set_by_study:
            doc["training"].pop(path.removeprefix("training."), None)
        return doc

    def to_yaml(self) -> str:
        return dump_yaml(self.to_document())

    def hash(self) -> str:
        return spec_hash(self.to_document())

    def arm_config(self, arm: str, training: TrainingSpec, *, seed: int | None = None) -> dict[str, Any]:
        """The trial config of ``arm`` under ``training`` at ``seed`` (the first seed by default)."""
        model = self.model.model_copy(update={"layer": arm_layer(self.model.type, arm)})
        sections = TrialSections(
            model=model,
            data=self.data,
            training=training,
            seed=self.seeds[0] if seed is None else seed,
        )
        return sections.trial_config()

    def phase_plan(
        self,
        name: str,
        cells: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        *,
        base_config: Mapping[str, Any],
        run_name: str,
        extra_tags: Sequence[tuple[str, str]] = (),
        extra_params: Sequence[tuple[str, str]] = (),
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """Phase ``name``: a FIFO grid plan over ``cells`` (one ``@`` axis: each cell sets the arm, the
        learning rate and what else varies together) x ``seeds`` on ``base_config``, selected on
        ``lr_tuning.metric``, ``max_concurrent`` at once. Its phase tag is ``name``; every trial run
        is tagged with its arm and named by ``run_name`` (a template over the trial config)."""
        search = SearchSpec(
            metric=self.lr_tuning.metric,
            mode=self.lr_tuning.mode,
            sampler=GridSpec(),
            scheduler=FIFOSpec(),
            space=(),
            num_samples=1,
            max_concurrent=self.max_concurrent,
        )
        plan = build_plan(
            name=name,
            base_config=dict(base_config),
            search=search,
            seeds=(seeds[0],),
            **plan_settings(self),
            extra_tags=(("autonorm.phase", name), *extra_tags),
            extra_params=tuple(extra_params),
            environ=environ,
        )
        grid = ((ROOT, tuple(dict(c) for c in cells)), ("seed", tuple(int(s) for s in seeds)))
        tags = (*plan.tags, ("autonorm.trial_tag.arm", "{model.layer.type}"))
        return dataclasses.replace(plan, grid=grid, run_name=run_name, tags=tags)

    # ---- a tuned design's tuning phases (studies.kinds.pipeline runs them per budget) -----------------

    def tuning_plan(self, budget: str = "", *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """Phase ``tune[-<budget>]``: every tuning cell x the LR grid x the tuning seeds."""
        cells = [self.lr_cell(cell, lr) for cell in self.tuning_cells for lr in self.lr_tuning.grid()]
        return self.design_phase(phase_name("tune", budget), budget, cells, tuning=True, environ=environ)

    def extension_plan(
        self,
        budget: str,
        round_: int,
        lrs: Mapping[str, float],
        *,
        environ: Mapping[str, str] | None = None,
        stage: str = "",
    ) -> StudyPlan:
        """Range-extension round ``round_`` of the budget's tuning phase, ``tune[-<budget>][<stage>]-ext<k>``
        (``stage``: a later tuning stage's suffix): each edge cell's one new η x the tuning seeds."""
        cells = [self.lr_cell(cell, lr) for cell, lr in sorted(lrs.items())]
        name = f"{phase_name('tune', budget)}{stage}-ext{int(round_)}"
        return self.design_phase(name, budget, cells, tuning=True, environ=environ)

    def refine_plan(
        self,
        budget: str,
        lrs: Mapping[str, Sequence[float]],
        *,
        environ: Mapping[str, str] | None = None,
        stage: str = "",
    ) -> StudyPlan:
        """The learning-rate refinement of the budget's tuning phase, ``tune[-<budget>][<stage>]-refine``:
        each cell's refinement rates x the tuning seeds."""
        cells = [self.lr_cell(cell, lr) for cell, rates in sorted(lrs.items()) for lr in rates]
        name = f"{phase_name('tune', budget)}{stage}-refine"
        return self.design_phase(name, budget, cells, tuning=True, environ=environ)

    def lr_cell(self, cell: str, lr: float) -> dict[str, Any]:
        """What a tuning trial of ``cell`` (one of :attr:`tuning_cells`: an arm) at ``lr`` sets."""
        return {"model": {"layer": {"type": cell}}, "training": {"lr": float(lr)}}

    def phase_tags(self, budget: str) -> tuple[tuple[str, str], ...]:
        """The tags of a phase of ``budget`` and of its trial runs: the kind's :attr:`study_tags`, then
        ``autonorm.budget`` for a named budget."""
        return (*self.study_tags, *((("autonorm.budget", budget),) if budget else ()))

    def study_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """A plan carrying the study-level settings (name, storage, tracking, tags, params, spec): the
        first tuning phase's, less what is a phase's (the study run has no one budget)."""
        plan = self.tuning_plan(self.budget_names[0], environ=environ)
        return self.study_level_plan(plan, phase_tags=("autonorm.budget",))

    def plan_params(self) -> tuple[tuple[str, str], ...]:
        """The design's params on every phase run."""
        return ()

    def design_phase(
        self,
        name: str,
        budget: str,
        cells: Sequence[Mapping[str, Any]],
        seeds: Sequence[int] | None = None,
        *,
        tuning: bool,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """Phase ``name`` of the design (:meth:`phase_plan`): ``cells`` x ``seeds`` (the tuning seeds by
        default) on the budget's :meth:`base_config`, a tuning phase at ``lr_tuning.epochs`` under an
        epoch budget; its trials named :attr:`trial_name`, tagged :meth:`phase_tags`, with
        :meth:`plan_params`."""
        base = self.base_config(budget=budget)
        if tuning and self.lr_tuning.epochs is not None and base["training"]["budget"] == "epochs":
            base["training"]["epochs"] = int(self.lr_tuning.epochs)
        return self.phase_plan(
            name,
            cells,
            self.lr_tuning.seeds if seeds is None else seeds,
            base_config=base,
            run_name=self.trial_name + ("-lr{training.lr:g}" if tuning else "") + "-s{seed}",
            extra_tags=self.phase_tags(budget),
            extra_params=self.plan_params(),
            environ=environ,
        )

    def study_level_plan(self, phase_plan: StudyPlan, *, phase_tags: Sequence[str] = ()) -> StudyPlan:
        """``phase_plan`` as the plan of the study run (its name, storage, tracking, params, spec): the
        study run is no phase (no ``autonorm.phase`` tag, nor the ``phase_tags``) and trial-tag
        templates are for trial runs only."""
        drop = {"autonorm.phase", *phase_tags}
        return dataclasses.replace(
            phase_plan,
            name=self.name,
            tags=tuple(
                (k, v)
                for k, v in phase_plan.tags
                if k not in drop and not k.startswith("autonorm.trial_tag.")
            ),
            tracking=dataclasses.replace(
                phase_plan.tracking, experiment=self.tracking.experiment or self.name
            ),
        )
