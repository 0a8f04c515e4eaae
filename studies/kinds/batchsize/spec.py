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

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, Field, StrictBool, model_validator

from studies.kinds.batchsize.analysis import HYPOTHESIS
from studies.sequential import SequentialSpec, look_seeds
from studies.spec import (
    CategoricalParam,
    DataSpec,
    FIFOSpec,
    GridSpec,
    MLPSpec,
    ModelSpec,
    NonNegInt,
    PosFloat,
    PosInt,
    ResourcesSpec,
    SearchSpec,
    Seed,
    SpecError,
    SpecIssue,
    StoragePath,
    StorageSpec,
    TrackingSpec,
    TrainingSpec,
    TrialSections,
    build_plan,
    check_search_space,
    dump_yaml,
    plan_settings,
    spec_hash,
)
from studies.spec.sections import (
    FROZEN,
    ArraysDataSpec,
    FashionMNISTSpec,
    TableDataSpec,
    data_task,
    tuned_design_issues,
)
from studies.tuning import LRGrid, extension_trials_max
from workers.dotted import ROOT
from workers.plan import StudyPlan

__all__ = [
    "CNN_ARMS",
    "MLP_ARMS",
    "SET_BY_STUDY",
    "AnalysisSpec",
    "BatchSizeStudySpec",
    "BatchSizeTrainingSpec",
    "LRTuningSpec",
    "cell_key",
]

_CONTROLS_BY_MODEL = {
    "mlp": ("linear", "linear_batchnorm", "linear_layernorm"),
    "cnn": ("conv", "conv_batchnorm", "conv_layernorm"),
}
"""The arms the claim says do NOT decline with B (plain affine, + BatchNorm, + LayerNorm)."""
_BATCHNORM_ARMS = frozenset({"linear_batchnorm", "conv_batchnorm"})

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
"""Hidden-layer types of the MLP variant; ``linear`` is the control."""

CNN_ARMS: tuple[str, ...] = get_args(Arm)[6:]
"""Convolution types of the CNN variant; ``conv`` is the control."""

_ARMS_BY_MODEL = {"mlp": MLP_ARMS, "cnn": CNN_ARMS}


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


class BatchSizeTrainingSpec(TrainingSpec):
    """:class:`TrainingSpec` with the protocol's plain-SGD defaults.

    The divergence derivation assumes vanilla gradient descent; momentum, Adam, weight decay,
    clipping and schedules are ablations a spec can switch on. The fields in :data:`SET_BY_STUDY`
    are set by the study and refused here.
    """

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


class LRTuningSpec(BaseModel):
    """How each arm's learning rate is chosen before the confirmatory grid.

    The arms learn at very different speeds under one η (a plain layer moves its activations by
    −ηg(‖x‖²+1), a corrected one by −ηg), so a shared η compares a trained arm with an untrained
    one. Each arm's η is therefore tuned: a log-spaced grid of ``points`` learning rates in
    [``low``, ``high``], each trained on every tuning seed (held out from the confirmatory seeds), the
    η with the best mean ``metric`` (a validation metric) wins. A grid rather than a sequential
    sampler: every candidate is scored on the same seeds, the phase resumes trial by trial, and
    "the best η sits on the edge of the range" is exact. Such a winner extends the grid by one point
    of its ratio in that direction, up to ``max_extensions`` times (:mod:`studies.tuning`); an arm
    still on the edge after that is ``lr-at-range-edge`` (inconclusive). Policies ``constant``/``linear``/``sqrt`` tune at ``reference_batch_size``
    (one η per arm, then held fixed or scaled with B); ``tuned`` tunes every (arm, B) cell.
    """

    model_config = FROZEN

    low: PosFloat = 1e-3
    high: PosFloat = 1e2  # wide enough for every arm: corrected layers need ~‖x‖²+1 times plain η
    points: Annotated[int, Field(strict=True, ge=3, le=64)] = 11  # log-spaced grid points
    seeds: Annotated[tuple[Seed, ...], Field(min_length=2)] = (1000, 1001)
    reference_batch_size: PosInt = 64
    epochs: PosInt | None = None  # tuning budget; None: the confirmatory training.epochs
    metric: Annotated[str, Field(min_length=1)] = "val_accuracy"
    mode: Literal["min", "max"] = "max"
    max_extensions: Annotated[int, Field(strict=True, ge=0, le=20)] = 3  # edge extensions (studies.tuning)

    @model_validator(mode="after")
    def _range(self) -> LRTuningSpec:
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


Budget = Literal["epochs", "updates"]


class BatchSizeStudySpec(BaseModel):
    """The batch-size correlation study (``studies/specs/batchsize_correlation.yaml``).

    ``model`` is an ``mlp`` or ``cnn`` whose ``layer`` the arms replace; every other section is
    shared with the search studies.
    """

    model_config = FROZEN

    kind: Literal["batchsize"] = "batchsize"
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "batchsize_correlation"
    description: str = ""
    hypothesis: str = HYPOTHESIS
    model: ModelSpec = MLPSpec()
    data: DataSpec = FashionMNISTSpec()
    training: BatchSizeTrainingSpec = BatchSizeTrainingSpec()
    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] = MLP_ARMS  # type: ignore[assignment]
    control: Arm = "linear"  # the arm each fix arm's interaction is measured against
    controls: tuple[Arm, ...] | None = None  # arms the claim says do NOT decline; None: the model's
    batch_sizes: Annotated[tuple[PosInt, ...], Field(min_length=2)] = (8, 16, 32, 64, 128, 256, 512)
    seeds: Annotated[tuple[Seed, ...], Field(min_length=2)] = (0, 1, 2, 3, 4, 5, 6, 7)
    budgets: Annotated[tuple[Budget, ...], Field(min_length=1)] = ("epochs", "updates")
    lr_policy: Literal["constant", "linear", "sqrt", "tuned"] = "constant"
    lr_tuning: LRTuningSpec = LRTuningSpec()
    sequential: SequentialSpec | None = None  # seeds in looks (studies.sequential); None: fixed design
    analysis: AnalysisSpec = AnalysisSpec()
    resources: ResourcesSpec = ResourcesSpec()
    max_concurrent: PosInt = 2  # trials at once (Tune's max_concurrent_trials)
    retries: NonNegInt = 2  # FailureConfig(max_failures) per trial
    tracking: TrackingSpec = TrackingSpec()
    storage_path: StoragePath = "runs"  # local dir or s3://bucket/prefix
    storage: StorageSpec = StorageSpec()
    exploratory: StrictBool = False  # run a design that cannot decide (report marked exploratory)

    @model_validator(mode="after")
    def _cross(self) -> BatchSizeStudySpec:
        issues: list[SpecIssue] = []
        valid_arms = _ARMS_BY_MODEL.get(self.model.type)
        if valid_arms is None:
            issues.append(
                SpecIssue(
                    "model.type",
                    f"the batch-size study needs model type 'mlp' or 'cnn', got {self.model.type!r}",
                )
            )
        else:
            for i, arm in enumerate(self.arms):
                if arm not in valid_arms:
                    issues.append(
                        SpecIssue(
                            f"arms.{i}",
                            f"{arm!r} is not a layer of model type {self.model.type!r} (valid: {', '.join(valid_arms)})",
                        )
                    )
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
            if getattr(self.model, "layer", None) is not None and "layer" in self.model.model_fields_set:
                issues.append(
                    SpecIssue("model.layer", "the arms set the layer type; list them under 'arms' instead")
                )
        for field, values in (
            ("arms", self.arms),
            ("batch_sizes", self.batch_sizes),
            ("seeds", self.seeds),
            ("budgets", self.budgets),
        ):
            if len(set(values)) != len(values):
                issues.append(SpecIssue(field, f"{field} must be distinct, got {list(values)}"))
        if _BATCHNORM_ARMS & set(self.arms) and 1 in self.batch_sizes:
            issues.append(
                SpecIssue(
                    "batch_sizes", "batch size 1 leaves BatchNorm undefined; drop it or the BatchNorm arms"
                )
            )
        for path, why in SET_BY_STUDY.items():
            if path.removeprefix("training.") in self.training.model_fields_set:
                issues.append(SpecIssue(path, why))
        if "updates" not in self.budgets and self.training.max_updates is not None:
            issues.append(
                SpecIssue("training.max_updates", "only used when budgets include 'updates'; drop it")
            )
        task = data_task(self.data)
        if task == "regression":  # (text sets do not fit the model: refused below, naming data.type)
            issues.append(
                SpecIssue(
                    "data",
                    f"the batch-size study analyses accuracy, but {self.data.type!r} is a regression data set"
                    + (
                        " (float targets); give integer class labels"
                        if isinstance(self.data, (ArraysDataSpec, TableDataSpec))
                        else ""
                    ),
                )
            )
        if self.sequential is not None and len(self.seeds) < self.sequential.max_seeds:
            issues.append(
                SpecIssue(
                    "sequential.max_seeds",
                    f"{self.sequential.max_seeds} seeds planned but `seeds` lists {len(self.seeds)}; "
                    "list at least max_seeds confirmatory seeds (they are taken in order)",
                )
            )
        issues += tuned_design_issues(self, issues)
        if not issues:
            # Every (arm, batch size) trial must be valid on its own: data fits model, budgets, ...
            issues += check_search_space(
                self._grid_params(), self.base_config(), sampler="grid", seeds=self.seeds, prefix="<grid>"
            )
            issues = [
                SpecIssue(_grid_issue_path(i.path, self.arms, self.batch_sizes), i.message, i.line, i.source)
                for i in issues
            ]
        if issues:
            raise SpecError(issues)
        return self

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

    def base_config(
        self, *, arm: str | None = None, seed: int | None = None, budget: str | None = None
    ) -> dict[str, Any]:
        """The trial config of ``arm`` (the control by default) at the first seed."""
        model = self.model.model_copy(update={"layer": _layer(self.model.type, arm or self.control)})
        sections = TrialSections(
            model=model,
            data=self.data,
            training=self.training_section(budget),
            seed=self.seeds[0] if seed is None else seed,
        )
        return sections.trial_config()

    def _grid_params(self) -> tuple[CategoricalParam, ...]:
        return (
            CategoricalParam(name="model.layer.type", choices=tuple(self.arms)),
            CategoricalParam(name="training.batch_size", choices=tuple(self.batch_sizes)),
        )

    # ---- sizes ----------------------------------------------------------------------------------

    @property
    def sequential_family(self) -> int:
        """Hypotheses a sequential design must decide: the fix arms under every budget."""
        return len(self.fix_arms) * len(self.budgets)

    @property
    def trials_per_seed(self) -> int:
        """Confirmatory trials one seed adds: arms x batch sizes x budgets."""
        return len(self.arms) * len(self.batch_sizes) * len(self.budgets)

    @property
    def expected_trials(self) -> int:
        """Confirmatory trials: arms x batch sizes x seeds x budgets (a sequential design: through its
        first look, the least it runs)."""
        seeds = len(self.seeds) if self.sequential is None else self.sequential.schedule()[0]
        return self.trials_per_seed * seeds

    @property
    def confirmatory_trials_max(self) -> int:
        """Confirmatory trials when every look runs (``max_seeds``), or the fixed design's."""
        return self.trials_per_seed * (
            len(self.seeds) if self.sequential is None else self.sequential.max_seeds
        )

    @property
    def tuning_trials(self) -> int:
        """LR-tuning trials: arms (x batch sizes for ``tuned``) x grid points x tuning seeds x budgets."""
        cells = len(self.arms) * (len(self.batch_sizes) if self.lr_policy == "tuned" else 1)
        return cells * self.lr_tuning.points * len(self.lr_tuning.seeds) * len(self.budgets)

    @property
    def total_trials(self) -> int:
        """Every trial with no range extension firing."""
        return self.expected_trials + self.tuning_trials

    @property
    def tuning_cells(self) -> tuple[str, ...]:
        """The cells whose η is tuned: ``arm`` (``cell_key(arm, B)`` for ``tuned``)."""
        if self.lr_policy == "tuned":
            return tuple(cell_key(a, b) for a in self.arms for b in self.batch_sizes)
        return tuple(self.arms)

    @property
    def extension_trials_max(self) -> int:
        """The most trials range extensions can add: every cell, every round, every budget."""
        grids = [self.lr_tuning.lr_grid()] * len(self.tuning_cells)
        return extension_trials_max(grids, len(self.lr_tuning.seeds), self.lr_tuning.max_extensions) * len(
            self.budgets
        )

    # ---- plans --------------------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data, loadable again (``study_spec.yaml``): the fields the study
        derives (the layer type from the arms, lr scaling and budget per plan) are left out."""
        doc = self.model_dump(mode="json")
        doc["model"].pop("layer", None)
        if doc.get("sequential") is None:  # a fixed design's document stays what it was
            doc.pop("sequential", None)
        for path in SET_BY_STUDY:
            doc["training"].pop(path.removeprefix("training."), None)
        return doc

    def to_yaml(self) -> str:
        return dump_yaml(self.to_document())

    def hash(self) -> str:
        return spec_hash(self.to_document())

    def _plan(
        self,
        *,
        name: str,
        budget: str,
        cells: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        phase: str,
        epochs: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """A FIFO grid plan over ``cells`` (``@`` axis: arm, batch size, lr together) x ``seeds``."""
        base = self.base_config(budget=budget)
        if epochs is not None and budget == "epochs":
            base["training"]["epochs"] = int(epochs)
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
            base_config=base,
            search=search,
            seeds=(seeds[0],),
            **plan_settings(self),
            extra_tags=(
                ("autonorm.phase", name),
                ("autonorm.budget", budget),
            ),
            extra_params=self._plan_params(),
            environ=environ,
        )
        grid = ((ROOT, tuple(dict(c) for c in cells)), ("seed", tuple(int(s) for s in seeds)))
        # Readable trial names (MLflow legends, run lists): the arm, the batch size, the seed.
        name = (
            "{model.layer.type}-B{training.batch_size}"
            + ("-lr{training.lr:g}" if phase == "lr_tuning" else "")
            + "-s{seed}"
        )
        tags = (*plan.tags, ("autonorm.trial_tag.arm", "{model.layer.type}"))
        return dataclasses.replace(plan, grid=grid, run_name=name, tags=tags)

    def tuning_plan(self, budget: str, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """Phase 1: every arm (x batch size for ``tuned``) x the LR grid x the tuning seeds."""
        sizes = self.batch_sizes if self.lr_policy == "tuned" else (self.lr_tuning.reference_batch_size,)
        cells = [_cell(arm, b, lr) for arm in self.arms for b in sizes for lr in self.lr_tuning.grid()]
        return self._tuning(f"tune-{budget}", budget, cells, environ)

    def extension_plan(
        self,
        budget: str,
        round_: int,
        lrs: Mapping[str, float],
        *,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """Range extension ``round_`` of the tuning phase: each cell's one new η x the tuning seeds."""
        cells = []
        for key, lr in sorted(lrs.items()):
            arm, _, b = key.partition("@")
            cells.append(_cell(arm, int(b) if b else self.lr_tuning.reference_batch_size, lr))
        return self._tuning(f"tune-{budget}-ext{int(round_)}", budget, cells, environ)

    def _tuning(
        self, name: str, budget: str, cells: Sequence[Mapping[str, Any]], environ: Mapping[str, str] | None
    ) -> StudyPlan:
        """A tuning phase's plan: ``cells`` x the tuning seeds, at the tuning budget."""
        return self._plan(
            name=name,
            budget=budget,
            cells=list(cells),
            seeds=self.lr_tuning.seeds,
            phase="lr_tuning",
            epochs=self.lr_tuning.epochs,
            environ=environ,
        )

    def look_plan_name(self, budget: str, look: int) -> str:
        """The folder of a confirmatory look: ``confirm-<budget>`` (the first, or the fixed design's
        only one), ``confirm-<budget>-look<j>`` after it."""
        return f"confirm-{budget}" if look <= 1 else f"confirm-{budget}-look{int(look)}"

    def confirmatory_plan(
        self,
        budget: str,
        lr: Mapping[str, float],
        *,
        look: int = 1,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """Phase 2: every arm x batch size x seed with the tuned learning rates (FIFO, full budget).

        Args:
            lr: ``cell_key(arm, B) -> lr`` for ``tuned``; else ``arm -> lr`` (the η at the reference
                batch size, scaled with B by the trial for ``linear`` / ``sqrt``).
            look: a sequential design's look (1-based): the plan runs the seeds that look adds.
        """
        cells = []
        for arm in self.arms:
            for b in self.batch_sizes:
                key = cell_key(arm, b) if self.lr_policy == "tuned" else arm
                if key not in lr:
                    raise ValueError(f"no tuned learning rate for {key!r}")
                cells.append(_cell(arm, b, float(lr[key])))
        seeds: Sequence[int] = self.seeds
        if self.sequential is not None:
            seeds = dict(look_seeds(self.seeds, self.sequential.schedule()))[look]
        return self._plan(
            name=self.look_plan_name(budget, look),
            budget=budget,
            cells=cells,
            seeds=seeds,
            phase="confirmatory",
            environ=environ,
        )

    def study_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """A plan carrying the study-level settings (name, storage, tracking, tags, params, spec)."""
        plan = self.tuning_plan(self.budgets[0], environ=environ)
        return dataclasses.replace(
            plan,
            name=self.name,
            # The study run is no phase and has no one budget; trial-tag templates are for trial runs.
            tags=tuple(
                (k, v)
                for k, v in plan.tags
                if k not in ("autonorm.phase", "autonorm.budget") and not k.startswith("autonorm.trial_tag.")
            ),
            tracking=dataclasses.replace(plan.tracking, experiment=self.tracking.experiment or self.name),
        )

    def _plan_params(self) -> tuple[tuple[str, str], ...]:
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


def _layer(model_type: str, arm: str) -> Any:
    """The layer spec of ``arm`` for the model type (validated through the model's own union)."""
    from studies.spec import CNNSpec, MLPSpec

    cls = MLPSpec if model_type == "mlp" else CNNSpec
    return cls.model_validate({"type": model_type, "layer": {"type": arm}}).layer


def _grid_issue_path(path: str, arms: Sequence[str], batch_sizes: Sequence[int]) -> str:
    """``<grid>.0.choices.2`` (from check_search_space) -> ``arms.2``; ``<grid>.1...`` -> ``batch_sizes.i``."""
    parts = path.split(".")
    if parts[0] != "<grid>" or len(parts) < 2:
        return path
    field = "arms" if parts[1] == "0" else "batch_sizes"
    if len(parts) >= 4 and parts[2] == "choices":
        return f"{field}.{parts[3]}"
    return field
