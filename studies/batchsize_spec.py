"""The batch-size correlation study's spec: H4's section models composed into :class:`BatchSizeStudySpec`.

The study tests PROTOCOL.md §2's hypothesis with a fixed design, so its spec does not expose a free
search space: it names *arms* (the value of ``model.layer.type``), *batch sizes*, *seeds* and an
*LR policy*, and the study builds its plans from them:

* ``lr_policy: constant | linear | sqrt`` -> one confirmatory grid plan over ``model.layer.type x
  training.batch_size x seed`` with ``training.lr_scaling`` set to the policy;
* ``lr_policy: tuned`` -> first one Optuna (TPE) plan per ``(arm, batch size)`` cell that searches
  ``training.lr`` on a tuning seed that is not a confirmatory seed, then the confirmatory grid with
  each cell's tuned learning rate.

The confirmatory phase always uses the FIFO scheduler (no early stopping) and the same seeds — so
the same initialisation seed and data order — for every arm (common random numbers).

Training defaults follow the protocol (plain SGD: no momentum, no weight decay, constant schedule, no
warm-up, no clipping, no label smoothing), which differ from the AutoNorm studies' AdamW defaults, so
the training section here is :class:`BatchSizeTrainingSpec`, a :class:`TrainingSpec` with other
defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, model_validator

from studies.analysis import HYPOTHESIS
from studies.spec import (
    _FROZEN,
    CategoricalParam,
    DataSpec,
    FIFOSpec,
    FloatParam,
    GridSpec,
    ModelSpec,
    NonNegInt,
    PosFloat,
    PosInt,
    ResourcesSpec,
    SearchSpec,
    SpecError,
    SpecIssue,
    StorageSpec,
    TPESpec,
    TrackingSpec,
    TrainingSpec,
    TrialSections,
    build_plan,
    check_search_space,
    dump_yaml,
    spec_hash,
)
from workers.plan import StudyPlan

__all__ = [
    "CNN_ARMS",
    "MLP_ARMS",
    "AnalysisSpec",
    "BatchSizeStudySpec",
    "BatchSizeTrainingSpec",
    "LRTuningSpec",
    "cell_key",
]

MLP_ARMS: tuple[str, ...] = (
    "linear",
    "linear_batchnorm",
    "linear_layernorm",
    "prenorm_l2",
    "prenorm_rms",
    "corrected",
)
"""Hidden-layer types of the MLP variant; ``linear`` is the control."""

CNN_ARMS: tuple[str, ...] = ("conv", "conv_batchnorm", "patchnorm")
"""Convolution types of the CNN variant; ``conv`` is the control."""

_ARMS_BY_MODEL = {"mlp": MLP_ARMS, "cnn": CNN_ARMS}
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
    "patchnorm",
]


def cell_key(arm: str, batch_size: int) -> str:
    """The name of an ``(arm, batch size)`` cell (tuning plan names, tuned-LR tables)."""
    return f"{arm}@{int(batch_size)}"


class BatchSizeTrainingSpec(TrainingSpec):
    """:class:`TrainingSpec` with the protocol's plain-SGD defaults.

    The divergence derivation assumes vanilla gradient descent; momentum, Adam, weight decay,
    clipping and schedules are ablations a spec can switch on. ``lr_scaling`` is set by the study's
    ``lr_policy`` and must not be set here.
    """

    epochs: PosInt = 10
    lr: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = (
        0.05  # at reference_batch_size
    )
    optimizer: Literal["adamw", "sgd"] = "sgd"
    weight_decay: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = 0.0
    schedule: Literal["cosine", "constant"] = "constant"
    warmup_fraction: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = 0.0
    grad_clip: PosFloat | None = None
    label_smoothing: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = 0.0


class LRTuningSpec(BaseModel):
    """The ``tuned`` LR policy: an Optuna TPE search of ``training.lr`` per ``(arm, batch size)`` cell.

    Tuning trials train on ``seed``, which must not be one of the confirmatory seeds: picking the
    learning rate on the very runs that are then analysed would bias the trend towards noise. They
    are selected on ``metric`` (a validation metric, never test).
    """

    model_config = _FROZEN

    trials: PosInt = 12  # per cell
    low: PosFloat = 1e-3
    high: PosFloat = 1.0
    seed: NonNegInt = 1000  # training seed of the tuning trials
    sampler_seed: NonNegInt = 0
    n_startup_trials: PosInt = 5
    epochs: PosInt | None = None  # tuning budget; None: the confirmatory training.epochs
    metric: Annotated[str, Field(min_length=1)] = "val_accuracy"
    mode: Literal["min", "max"] = "max"

    @model_validator(mode="after")
    def _range(self) -> LRTuningSpec:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.metric.startswith("test_"):
            raise ValueError(f"metric {self.metric!r} selects on the test split; use a validation metric")
        return self


class AnalysisSpec(BaseModel):
    """Arguments of :func:`studies.analysis.batchsize_trend` (PROTOCOL.md §2)."""

    model_config = _FROZEN

    metric: Annotated[str, Field(min_length=1)] = (
        "test_accuracy"  # final value of this reported metric per trial
    )
    higher_is_better: StrictBool = True
    n_boot: PosInt = 2000
    n_perm: Annotated[int, Field(strict=True, ge=99)] = 9999  # >= 9,999 for a confirmatory claim
    seed: NonNegInt = 0
    confidence: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.95


class BatchSizeStudySpec(BaseModel):
    """The batch-size correlation study (``studies/specs/batchsize_correlation.yaml``).

    ``model`` is an ``mlp`` or ``cnn`` whose ``layer`` the arms replace; every other section is H4's.
    """

    model_config = _FROZEN

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "batchsize_correlation"
    description: str = ""
    hypothesis: str = HYPOTHESIS
    model: ModelSpec
    data: DataSpec
    training: BatchSizeTrainingSpec = BatchSizeTrainingSpec()
    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] = MLP_ARMS  # type: ignore[assignment]
    control: Arm = "linear"
    batch_sizes: Annotated[tuple[PosInt, ...], Field(min_length=2)] = (8, 16, 32, 64, 128, 256, 512)
    seeds: Annotated[tuple[NonNegInt, ...], Field(min_length=2)] = (0, 1, 2, 3, 4)
    lr_policy: Literal["constant", "linear", "sqrt", "tuned"] = "constant"
    lr_tuning: LRTuningSpec = LRTuningSpec()
    analysis: AnalysisSpec = AnalysisSpec()
    resources: ResourcesSpec = ResourcesSpec()
    max_concurrent: PosInt = 2  # trials at once (Tune's max_concurrent_trials)
    retries: NonNegInt = 2  # FailureConfig(max_failures) per trial
    tracking: TrackingSpec = TrackingSpec()
    storage_path: Annotated[str, Field(min_length=1)] = "runs"  # local dir or s3://bucket/prefix
    storage: StorageSpec = StorageSpec()

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
            if getattr(self.model, "layer", None) is not None and "layer" in self.model.model_fields_set:
                issues.append(
                    SpecIssue("model.layer", "the arms set the layer type; list them under 'arms' instead")
                )
        for field, values in (("arms", self.arms), ("batch_sizes", self.batch_sizes), ("seeds", self.seeds)):
            if len(set(values)) != len(values):
                issues.append(SpecIssue(field, f"{field} must be distinct, got {list(values)}"))
        if _BATCHNORM_ARMS & set(self.arms) and 1 in self.batch_sizes:
            issues.append(
                SpecIssue(
                    "batch_sizes", "batch size 1 leaves BatchNorm undefined; drop it or the BatchNorm arms"
                )
            )
        if "lr_scaling" in self.training.model_fields_set:
            issues.append(
                SpecIssue(
                    "training.lr_scaling",
                    "set by lr_policy (constant | linear | sqrt | tuned); set that instead",
                )
            )
        if self.lr_policy == "tuned" and self.lr_tuning.seed in self.seeds:
            issues.append(
                SpecIssue(
                    "lr_tuning.seed",
                    f"the tuning seed {self.lr_tuning.seed} is also a confirmatory seed; tune on a held-out seed",
                )
            )
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

    # ---- the trial configs --------------------------------------------------------------------

    def training_section(self) -> TrainingSpec:
        """The training section trials get: ``lr_scaling`` from the LR policy (tuned -> constant)."""
        scaling = "constant" if self.lr_policy == "tuned" else self.lr_policy
        return TrainingSpec.model_validate({**self.training.model_dump(), "lr_scaling": scaling})

    def base_config(self, *, arm: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """The trial config of ``arm`` (the control by default) at the first seed."""
        model = self.model.model_copy(update={"layer": _layer(self.model.type, arm or self.control)})
        sections = TrialSections(
            model=model,
            data=self.data,
            training=self.training_section(),
            seed=self.seeds[0] if seed is None else seed,
        )
        return sections.trial_config()

    def _grid_params(self) -> tuple[CategoricalParam, ...]:
        return (
            CategoricalParam(name="model.layer.type", choices=tuple(self.arms)),
            CategoricalParam(name="training.batch_size", choices=tuple(self.batch_sizes)),
        )

    @property
    def expected_trials(self) -> int:
        """Confirmatory trials: arms x batch sizes x seeds."""
        return len(self.arms) * len(self.batch_sizes) * len(self.seeds)

    @property
    def tuning_trials(self) -> int:
        """Tuning trials (0 unless ``lr_policy`` is ``tuned``)."""
        if self.lr_policy != "tuned":
            return 0
        return len(self.arms) * len(self.batch_sizes) * self.lr_tuning.trials

    # ---- plans --------------------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return dump_yaml(self.to_document())

    def hash(self) -> str:
        return spec_hash(self.to_document())

    def _common_plan_args(self, environ: Mapping[str, str] | None) -> dict[str, Any]:
        return {
            "resources": self.resources,
            "retries": self.retries,
            "storage_path": self.storage_path,
            "storage": self.storage,
            "tracking": self.tracking,
            "document": self.to_document(),
            "description": self.description,
            "hypothesis": self.hypothesis,
            "environ": environ,
        }

    def confirmatory_plan(
        self,
        *,
        tuned_lr: Mapping[str, float] | None = None,
        arms: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> StudyPlan:
        """The grid plan over ``model.layer.type x training.batch_size x seed`` (FIFO, full budget).

        Args:
            tuned_lr: for ``lr_policy: tuned``, ``cell_key(arm, B) -> lr``. A learning rate that
                depends on the cell cannot be a grid axis of its own, so the tuned plan's grid has
                one axis ``training`` whose values are ``{batch_size, lr}`` pairs, and is built per arm
                (``arms`` must then name exactly one arm).
            arms: restrict the grid to these arms (default: all).
            environ: environment for the tracking URI / git commit (``os.environ`` by default).
        """
        arms = tuple(arms) if arms is not None else tuple(self.arms)
        tuned = self.lr_policy == "tuned"
        if tuned and tuned_lr is None:
            raise ValueError("lr_policy 'tuned' needs tuned_lr (run the tuning phase first)")
        if tuned and len(arms) != 1:
            raise ValueError("a tuned confirmatory plan is built per arm: pass exactly one arm")
        grid_space = (
            ()
            if tuned
            else (
                CategoricalParam(name="model.layer.type", choices=arms),
                CategoricalParam(name="training.batch_size", choices=tuple(self.batch_sizes)),
            )
        )
        search = SearchSpec(
            metric=self.lr_tuning.metric,
            mode=self.lr_tuning.mode,
            sampler=GridSpec(),
            scheduler=FIFOSpec(),
            space=grid_space,
            num_samples=1,
            max_concurrent=self.max_concurrent,
        )
        plan = build_plan(
            name=f"{self.name}-{arms[0]}" if tuned else self.name,
            base_config=self.base_config(arm=arms[0]),
            search=search,
            seeds=self.seeds,
            extra_tags=(("autonorm.study", "batchsize_correlation"), ("autonorm.phase", "confirmatory")),
            extra_params=self._plan_params(),
            **self._common_plan_args(environ),
        )
        if not tuned:
            return plan
        arm = arms[0]
        lr_table = dict(tuned_lr or {})
        missing = [b for b in self.batch_sizes if cell_key(arm, b) not in lr_table]
        if missing:
            raise ValueError(f"tuned_lr has no learning rate for arm {arm!r} at batch sizes {missing}")
        # One axis of {batch_size, lr} pairs; workers apply nested values leaf by leaf.
        training_axis = tuple(
            {"batch_size": int(b), "lr": float(lr_table[cell_key(arm, b)])} for b in self.batch_sizes
        )
        return dataclasses.replace(plan, grid=(("training", training_axis), *plan.grid))

    def tuning_plan(
        self, arm: str, batch_size: int, *, environ: Mapping[str, str] | None = None
    ) -> StudyPlan:
        """The Optuna plan that tunes ``training.lr`` for one ``(arm, batch size)`` cell."""
        base = self.base_config(arm=arm, seed=self.lr_tuning.seed)
        base["training"]["batch_size"] = int(batch_size)
        if self.lr_tuning.epochs is not None:
            base["training"]["epochs"] = int(self.lr_tuning.epochs)
        search = SearchSpec(
            metric=self.lr_tuning.metric,
            mode=self.lr_tuning.mode,
            space=(
                FloatParam(name="training.lr", low=self.lr_tuning.low, high=self.lr_tuning.high, log=True),
            ),
            sampler=TPESpec(
                seed=self.lr_tuning.sampler_seed, n_startup_trials=self.lr_tuning.n_startup_trials
            ),
            scheduler=FIFOSpec(),
            num_samples=self.lr_tuning.trials,
            max_concurrent=self.max_concurrent,
        )
        return build_plan(
            name=f"{self.name}-tune-{arm}-b{int(batch_size)}",
            base_config=base,
            search=search,
            seeds=(self.lr_tuning.seed,),
            extra_tags=(
                ("autonorm.study", "batchsize_correlation"),
                ("autonorm.phase", "lr_tuning"),
                ("autonorm.cell", cell_key(arm, batch_size)),
            ),
            extra_params=self._plan_params(),
            **self._common_plan_args(environ),
        )

    def _plan_params(self) -> tuple[tuple[str, str], ...]:
        return (
            ("arms", ",".join(self.arms)),
            ("control", self.control),
            ("batch_sizes", ",".join(str(b) for b in self.batch_sizes)),
            ("seeds", ",".join(str(s) for s in self.seeds)),
            ("lr_policy", self.lr_policy),
            ("budget", self.training.budget),
            ("optimizer", self.training.optimizer),
        )


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
