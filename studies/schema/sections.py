"""The shared spec sections every study kind composes: field types, norms, affine layers, models, data,
metrics, training, search space / sampler / scheduler, resources, tracking, storage, and the trial
sections (``model``, ``data``, ``training`` + seed) one trial receives."""

from __future__ import annotations

import math
import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from studies.schema.errors import _SCALAR, SpecError, SpecIssue
from studies.schema.urls import (
    ArtifactLocation,
    EndpointURL,
    TrackingURI,
)

# --------------------------------------------------------------------------------------------------
# Field types
# --------------------------------------------------------------------------------------------------

LN2 = math.log(2.0)
"""Maximum gate entropy for two candidates; ``eps_h`` above it would make every rule trivial."""

FROZEN = ConfigDict(extra="forbid", frozen=True)

_INT64_MAX = 2**63 - 1  # larger integers overflow torch, numpy and MLflow's params
PosInt = Annotated[int, Field(strict=True, ge=1, le=_INT64_MAX)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=_INT64_MAX)]
PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)]
Seed = Annotated[int, Field(strict=True, ge=0, lt=2**32)]
"""A random seed: Optuna's samplers and numpy refuse seeds of 2**32 and above."""


def _scalar(value: Any) -> Any:
    if not isinstance(value, _SCALAR):
        raise ValueError(
            f"must be a single value (string, number, boolean or null), got {type(value).__name__}"
        )
    return value


Scalar = Annotated[Any, AfterValidator(_scalar)]
"""A YAML scalar: what Optuna accepts as a categorical choice and ``when`` compares against."""


class SpecModel(BaseModel):
    model_config = FROZEN


# ---- norms ---------------------------------------------------------------------------------------

NormName = Literal["dyt", "layernorm", "rmsnorm"]


class LayerNormSpec(SpecModel):
    """LayerNorm (FrozenLN baseline)."""

    type: Literal["layernorm"] = "layernorm"
    eps: PosFloat = 1e-5


class RMSNormSpec(SpecModel):
    type: Literal["rmsnorm"] = "rmsnorm"
    eps: PosFloat = 1e-6


class DyTSpec(SpecModel):
    """Dynamic Tanh; ``alpha_init`` is the one learnable scalar's start (Zhu et al.: 0.5)."""

    type: Literal["dyt"] = "dyt"
    alpha_init: PosFloat = 0.5


class AdaNormSpec(SpecModel):
    """AdaNorm (Xu et al. 2019): ``C (1 - k y) y`` with the factor detached."""

    type: Literal["adanorm"] = "adanorm"
    k: Fraction = 0.1
    scale: PosFloat = 2.0  # the paper's C
    eps: PosFloat = 1e-5


class FiLMSpec(SpecModel):
    """Self-conditioned FiLM over a LayerNorm without affine; starts as LN (zero-initialised MLP)."""

    type: Literal["film"] = "film"
    eps: PosFloat = 1e-5
    hidden_dim: PosInt | None = None  # None: dim // 2


def _distinct_candidates(cls: Any, v: tuple[str, ...]) -> tuple[str, ...]:
    if len(v) < 2 or len(set(v)) != len(v):
        raise ValueError(f"candidates must be at least two distinct norms, got {list(v)}")
    return v


class AutoNormSpec(SpecModel):
    """Gumbel-softmax gate mixing candidate norms per sample (AutoNorm)."""

    type: Literal["autonorm"] = "autonorm"
    candidates: tuple[NormName, ...] = ("dyt", "layernorm")
    tau: Annotated[float, Field(strict=True, gt=0, le=100, allow_inf_nan=False)] = 0.5
    hard: StrictBool = False  # straight-through one-hot samples in training
    eval_mode: Literal["softmax", "argmax", "sample"] = "softmax"
    selector_init: Literal["zeros", "default"] = "zeros"  # zeros: the gate starts at uniform weights
    # (noise after freezing is training.freeze.sample_after_freeze: the fit's freeze rule decides it)
    hidden_dim: PosInt | None = None  # selector MLP width; None: dim // 2
    # once frozen, a batch whose gate weight is at least this for one branch computes only that branch
    fast_path_threshold: Annotated[float, Field(strict=True, gt=0.5, le=1.0)] = 1.0 - 1e-3

    _distinct = field_validator("candidates")(_distinct_candidates)


class RandomSelectorSpec(SpecModel):
    """Control: ``w_DyT ~ U(0, 1)`` per sample per forward, no learning."""

    type: Literal["random_selector"] = "random_selector"
    candidates: tuple[NormName, ...] = ("dyt", "layernorm")
    eval_mode: Literal["mean", "sample"] = "mean"  # mean: the expected weights, deterministic

    _distinct = field_validator("candidates")(_distinct_candidates)


class IdentitySpec(SpecModel):
    type: Literal["identity"] = "identity"


NormSpec = Annotated[
    LayerNormSpec
    | RMSNormSpec
    | DyTSpec
    | AdaNormSpec
    | FiLMSpec
    | AutoNormSpec
    | RandomSelectorSpec
    | IdentitySpec,
    Field(discriminator="type"),
]


# ---- affine layers ---------------------------------------------------------------------------------


class PlainLinearSpec(SpecModel):
    type: Literal["linear"] = "linear"


class PreNormL2Spec(SpecModel):
    """``W x/‖x‖ + b``: scale invariant, loses the radius."""

    type: Literal["prenorm_l2"] = "prenorm_l2"


class PreNormRMSSpec(SpecModel):
    type: Literal["prenorm_rms"] = "prenorm_rms"


class CorrectedLinearSpec(SpecModel):
    """``(W x + β b) / sqrt(‖x‖² + β²)``: removes the affine divergence for one sample."""

    type: Literal["corrected"] = "corrected"
    beta: PosFloat = 1.0


class LinearBatchNormSpec(SpecModel):
    type: Literal["linear_batchnorm"] = "linear_batchnorm"


class LinearLayerNormSpec(SpecModel):
    type: Literal["linear_layernorm"] = "linear_layernorm"


LinearSpec = Annotated[
    PlainLinearSpec | PreNormL2Spec | PreNormRMSSpec | CorrectedLinearSpec,
    Field(discriminator="type"),
]
"""Linear layers inside transformer blocks (the divergence-fix variant)."""

MLPLayerSpec = Annotated[
    PlainLinearSpec
    | LinearBatchNormSpec
    | LinearLayerNormSpec
    | PreNormL2Spec
    | PreNormRMSSpec
    | CorrectedLinearSpec,
    Field(discriminator="type"),
]
"""Hidden layers of the MLP, including the BatchNorm / LayerNorm controls."""


class ConvSpec(SpecModel):
    type: Literal["conv"] = "conv"


class ConvBatchNormSpec(SpecModel):
    type: Literal["conv_batchnorm"] = "conv_batchnorm"


class ConvLayerNormSpec(SpecModel):
    """Convolution + LayerNorm over each sample's (C, H, W) feature map (GroupNorm with one group)."""

    type: Literal["conv_layernorm"] = "conv_layernorm"


class PatchNormSpec(SpecModel):
    """Per-location divergence correction of a convolution (PatchNormConv2d)."""

    type: Literal["patchnorm"] = "patchnorm"
    bias_in_division: StrictBool = True  # (<W, P> + b) / sqrt(|P|^2 + 1), as written in the paper
    patch_scale: StrictBool = False  # extra sqrt(C kh kw) factor
    learnable_gain: StrictBool = False


ConvLayerSpec = Annotated[
    ConvSpec | ConvBatchNormSpec | ConvLayerNormSpec | PatchNormSpec, Field(discriminator="type")
]


# ---- models ------------------------------------------------------------------------------------------


class _TransformerSpec(SpecModel):
    """Fields shared by the transformer encoders. ``None`` sizes take the preset's value."""

    preset: Literal["paper", "tiny"] = "paper"
    depth: PosInt | None = None
    dim: PosInt | None = None
    heads: PosInt | None = None
    mlp_ratio: PosFloat | None = None
    drop_path: Fraction | None = None
    layerscale_init: NonNegFloat | None = None
    qkv_bias: StrictBool | None = None
    norm: NormSpec = LayerNormSpec()
    final_norm: NormSpec = LayerNormSpec()  # the paper keeps LN after the last block
    linear: LinearSpec = PlainLinearSpec()
    linear_in_attention: StrictBool = False  # also use `linear` for the q/k/v/out projections

    @field_validator("heads")
    @classmethod
    def _heads_divide_dim(cls, v: int | None, info: ValidationInfo) -> int | None:
        dim = info.data.get("dim")
        if v is not None and dim is not None and dim % v:
            raise ValueError(f"heads ({v}) must divide dim ({dim})")
        return v


class ViTLiteSpec(_TransformerSpec):
    """ViT-Lite vision encoder (paper: depth 8, dim 128, heads 4, patch 4)."""

    type: Literal["vit_lite"] = "vit_lite"
    patch_size: PosInt | None = None


class TextEncoderSpec(_TransformerSpec):
    """Text encoder for token tagging and sentence classification (paper: depth 12, dim 128, heads 8)."""

    type: Literal["text_encoder"] = "text_encoder"
    pool: Literal["cls", "mean"] | None = None  # sentence classification: CLS token or token mean


class TabularSpec(_TransformerSpec):
    """Feature-token encoder for tabular regression/classification."""

    type: Literal["tabular"] = "tabular"


class MLPSpec(SpecModel):
    """Plain MLP for the batch-size hypothesis; ``hidden`` overrides the preset's widths."""

    type: Literal["mlp"] = "mlp"
    preset: Literal["paper", "tiny"] = "paper"
    hidden: Annotated[tuple[PosInt, ...], Field(min_length=1)] | None = None
    layer: MLPLayerSpec = PlainLinearSpec()
    activation: Literal["relu", "gelu", "tanh"] | None = None
    head_variant: StrictBool | None = None  # the output layer uses `layer` too (not for +BN/+LN)


class CNNSpec(SpecModel):
    """Small CNN (the PatchNorm variant of the batch-size hypothesis)."""

    type: Literal["cnn"] = "cnn"
    preset: Literal["paper", "tiny"] = "paper"
    channels: Annotated[tuple[PosInt, ...], Field(min_length=1)] | None = None
    kernel: PosInt | None = None
    layer: ConvLayerSpec = ConvSpec()
    activation: Literal["relu", "gelu", "tanh"] | None = None


ModelSpec = Annotated[
    ViTLiteSpec | TextEncoderSpec | TabularSpec | MLPSpec | CNNSpec,
    Field(discriminator="type"),
]


# ---- data --------------------------------------------------------------------------------------------


class _DataSpec(SpecModel):
    subset: PosInt | None = None  # use the first N training examples (CPU smoke runs)
    val_fraction: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.1  # held out of train for selection


class _RootedDataSpec(_DataSpec):
    data_root: str | None = None  # None: the data set's offline default location


class FashionMNISTSpec(_RootedDataSpec):
    type: Literal["fashion_mnist"] = "fashion_mnist"


class DigitsSpec(_DataSpec):
    """scikit-learn's 8x8 digits (bundled with the package, hence no ``data_root``)."""

    type: Literal["digits"] = "digits"


class DiabetesSpec(_DataSpec):
    type: Literal["diabetes"] = "diabetes"


class PTBPosSampleSpec(_RootedDataSpec):
    type: Literal["ptb_pos_sample"] = "ptb_pos_sample"


class OANCPosSpec(_RootedDataSpec):
    """The OANC corpus of python3-pattern's ``tagged-en-oanc.txt`` (20,000 sentences, 360,524 tokens, Penn
    Treebank tags): ``test_fraction`` of the sentences, drawn with a constant seed, is the test split (the
    same for every seed), ``val_fraction`` of the rest the seeded validation split. ``ood_test: wsj``
    tests on the WSJ sample (``tagged-en-wsj.txt``, 1,001 sentences) instead: out of domain."""

    type: Literal["oanc_pos"] = "oanc_pos"
    test_fraction: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.1
    ood_test: Literal["wsj"] | None = None  # None: the in-domain OANC test split
    # A sentence longer than this is cut into pieces of at most max_tokens (every token still scored):
    # inputs are padded to the longest example (OANC: 220 tokens, median 15, 99 % <= 63). None: whole.
    max_tokens: PosInt | None = None


class PangLeePolaritySpec(_RootedDataSpec):
    type: Literal["pang_lee_polarity"] = "pang_lee_polarity"


class MNISTSpec(_RootedDataSpec):
    type: Literal["mnist"] = "mnist"


class CIFAR10Spec(_RootedDataSpec):
    type: Literal["cifar10"] = "cifar10"


class CIFAR100Spec(_RootedDataSpec):
    type: Literal["cifar100"] = "cifar100"


class SVHNSpec(_RootedDataSpec):
    type: Literal["svhn"] = "svhn"


class SST2Spec(_RootedDataSpec):
    type: Literal["sst2"] = "sst2"


class PTBPosSpec(_RootedDataSpec):
    type: Literal["ptb_pos"] = "ptb_pos"


def _absolute(path: str) -> str:
    # Trials run in Ray workers whose working directory is not the driver's: a path is made absolute
    # where the spec is read (relative to the working directory, like --set and every CLI path).
    return os.path.abspath(os.path.expanduser(path)) if path else path


class FileDataSpec(_DataSpec):
    """A data set of one's own read from a file (``autonorm_core.datafiles``), checked at validation:
    a file that cannot be used is refused before any trial starts."""

    path: Annotated[str, Field(min_length=1)]

    @field_validator("path")
    @classmethod
    def _abs_path(cls, v: str) -> str:
        return _absolute(v)

    def file_info(self) -> Any:
        """The checked file (``autonorm_core.datafiles.DataFile``, memoised while it is unchanged)."""
        from autonorm_core.datafiles import inspect_data_file

        return inspect_data_file(
            self.type,  # type: ignore[attr-defined]
            self.path,
            target=getattr(self, "target", None),
            test_path=getattr(self, "test_path", None),
        )

    @model_validator(mode="after")
    def _readable(self) -> FileDataSpec:
        from autonorm_core.datafiles import DataFileError

        try:
            self.file_info()
        except DataFileError as e:
            raise ValueError(str(e)) from None
        return self


class ArraysDataSpec(FileDataSpec):
    """``.npz`` with ``x_train``, ``y_train`` (optionally ``x_test``, ``y_test``): images (N, C, H, W) or
    features (N, D); integer targets are classes, float targets a regression."""

    type: Literal["arrays"] = "arrays"


class TableDataSpec(FileDataSpec):
    """A ``.csv`` / ``.parquet`` table: the ``target`` column is the label, every other column a numeric
    feature; ``test_path`` an optional test table with the same columns."""

    type: Literal["table"] = "table"
    target: Annotated[str, Field(min_length=1)]
    test_path: str | None = None

    @field_validator("test_path")
    @classmethod
    def _abs_test_path(cls, v: str | None) -> str | None:
        return None if v is None else _absolute(v)


DataSpec = Annotated[
    FashionMNISTSpec
    | DigitsSpec
    | DiabetesSpec
    | PTBPosSampleSpec
    | OANCPosSpec
    | PangLeePolaritySpec
    | MNISTSpec
    | CIFAR10Spec
    | CIFAR100Spec
    | SVHNSpec
    | SST2Spec
    | PTBPosSpec
    | ArraysDataSpec
    | TableDataSpec,
    Field(discriminator="type"),
]

_IMAGE_SIDE = {"fashion_mnist": 28, "mnist": 28, "digits": 8, "cifar10": 32, "cifar100": 32, "svhn": 32}
_TEXT = {"ptb_pos_sample", "oanc_pos", "pang_lee_polarity", "sst2", "ptb_pos"}
_MODEL_DATA = {
    "vit_lite": set(_IMAGE_SIDE),
    "cnn": set(_IMAGE_SIDE),
    "text_encoder": _TEXT,
    "tabular": {"diabetes", "digits"},
    "mlp": {*_IMAGE_SIDE, "diabetes"},
}
# A file of one's own fits by its layout (images or feature rows), known once the file is read.
_MODEL_LAYOUTS = {
    "vit_lite": {"image"},
    "cnn": {"image"},
    "text_encoder": set(),
    "tabular": {"tabular"},
    "mlp": {"image", "tabular"},
}


def data_task(data: Any) -> str | None:
    """The task of a data section: from the registry's table, or from the file of a generic loader."""
    if isinstance(data, FileDataSpec):
        return str(data.file_info().task)
    return DATA_TASKS.get(data.type)


def data_classes(data: Any) -> int | None:
    """Number of classes of a data section (0: regression; None: known only once loaded)."""
    if isinstance(data, FileDataSpec):
        return int(data.file_info().num_classes)
    from autonorm_core.data import class_count

    return class_count(data.type)


# ---- metrics: what a trial reports, and which way is better -------------------------------------------

DATA_TASKS: dict[str, str] = {
    "fashion_mnist": "classification",
    "digits": "classification",
    "diabetes": "regression",
    "ptb_pos_sample": "tagging",
    "oanc_pos": "tagging",
    "pang_lee_polarity": "classification",
    "mnist": "classification",
    "cifar10": "classification",
    "cifar100": "classification",
    "svhn": "classification",
    "sst2": "classification",
    "ptb_pos": "tagging",
}
"""The task of each data set (``autonorm_core.data``'s ``Splits.task``); a contract test keeps them equal."""

# ---- training ------------------------------------------------------------------------------------------


class FreezeSpec(SpecModel):
    """AutoNorm-S: at the end of epoch ``t_freeze`` the rule decides whether to freeze the selector.

    ``freeze_if_high`` is the paper's literal wording (freeze if the gate entropy has NOT fallen below
    ``eps_h``); the other rules are the alternatives a study can compare.
    """

    t_freeze: PosInt = 10
    eps_h: Annotated[float, Field(strict=True, ge=0, le=LN2)] = 0.1
    rule: Literal["freeze_if_high", "freeze_if_low", "always"] = "freeze_if_high"
    sample_after_freeze: StrictBool = False


class TrainingSpec(SpecModel):
    """The training loop's settings (defaults as in ``docs/science.md``)."""

    epochs: PosInt = 20
    batch_size: PosInt = 64
    lr: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = 1e-3
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: Fraction = 0.0  # sgd only; the divergence derivation assumes none
    weight_decay: NonNegFloat = 1e-4
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_fraction: Fraction = 0.05
    grad_clip: PosFloat | None = 1.0  # None: no clipping
    label_smoothing: Fraction = 0.1
    freeze: FreezeSpec | None = None  # None: the gate trains throughout (plain AutoNorm)
    lr_scaling: Literal["constant", "linear", "sqrt"] = "constant"  # lr vs batch_size/reference_batch_size
    reference_batch_size: PosInt = 64
    budget: Literal["epochs", "updates"] = "epochs"
    max_updates: PosInt | None = None  # budget "updates"; None: epochs x (n_train // reference_batch_size)
    eval_batch_size: PosInt = 256
    tau_final: PosFloat | None = None  # anneal AutoNorm's tau to this by the last epoch; None: fixed
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: every forward (training and evaluation) under bf16 autocast; loss, parameters, gradients
    and optimizer state stay float32. Valid on CPU and CUDA (on most CPUs slower than ``fp32``)."""
    compile: Literal["auto", "on", "off"] = "auto"
    """Run the model's forward through ``torch.compile``: ``auto`` on CUDA only (eager on CPU, where
    compiling does not pay off in a short trial), ``on`` on any device, ``off`` never."""


# --------------------------------------------------------------------------------------------------
# Resources, tracking, storage
# --------------------------------------------------------------------------------------------------


class ResourcesSpec(SpecModel):
    """Per trial. Fractional GPUs share a device (``0.25`` = four trials per GPU)."""

    cpu: NonNegFloat = 1.0
    gpu: NonNegFloat = 0.0

    @field_validator("gpu")
    @classmethod
    def _whole_gpus_above_one(cls, v: float, info: ValidationInfo) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError(f"fractions of a GPU must be below 1; above 1 use whole GPUs, got {v}")
        if v == 0 and info.data.get("cpu") == 0:
            raise ValueError("a trial needs some resource: cpu and gpu are both 0")
        return v

    def as_plan(self) -> tuple[tuple[str, float], ...]:
        res: list[tuple[str, float]] = [("cpu", float(self.cpu))]
        if self.gpu:
            res.append(("gpu", float(self.gpu)))
        return tuple(res)


class TrackingSpec(SpecModel):
    """MLflow. ``uri`` None: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<storage>/mlflow.db``."""

    uri: TrackingURI | None = None  # http(s), sqlite:////abs, postgresql, mysql, databricks
    experiment: Annotated[str, Field(min_length=1, max_length=500)] | None = None  # None: the study's name
    artifact_location: ArtifactLocation | None = None  # e.g. s3://bucket/prefix for a new experiment
    # At the end of a phase: how long to keep delivering results MLflow has not taken (an outage)
    # before keeping them in the study directory and exiting non-zero (the same command delivers them).
    final_flush_s: Annotated[float, Field(ge=0, le=86400)] = 120.0


class StorageSpec(SpecModel):
    """How to reach ``storage_path`` when it is ``s3://...``; keys come from the environment only."""

    endpoint_override: EndpointURL | None = None  # S3-compatible server, e.g. http://127.0.0.1:8333
    region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")] = "us-east-1"


# --------------------------------------------------------------------------------------------------
# The trial sections and cross-field checks
# --------------------------------------------------------------------------------------------------


def section_issues(model: Any, data: Any, training: TrainingSpec) -> list[SpecIssue]:
    """Checks that need more than one section; paths are those of the trial config."""
    issues: list[SpecIssue] = []
    allowed = _MODEL_DATA.get(model.type, set())
    side: int | None = _IMAGE_SIDE.get(data.type)
    if isinstance(data, FileDataSpec):
        info = data.file_info()
        if info.layout not in _MODEL_LAYOUTS.get(model.type, set()):
            shape = "images (N, C, H, W)" if info.layout == "image" else "feature rows (N, D)"
            fits = sorted(m for m, layouts in _MODEL_LAYOUTS.items() if info.layout in layouts)
            issues.append(
                SpecIssue(
                    "model.type",
                    f"{data.path} holds {shape}, which model type {model.type!r} does not take "
                    f"(valid: {', '.join(fits)})",
                )
            )
        if info.layout == "image" and info.input_shape[1] == info.input_shape[2]:
            side = info.input_shape[1]
    elif data.type not in allowed:
        issues.append(
            SpecIssue(
                "data.type",
                f"{data.type!r} does not fit model type {model.type!r} (valid: {', '.join(sorted(allowed))})",
            )
        )
    patch = getattr(model, "patch_size", None)
    if patch is not None and side is not None and side % patch:
        issues.append(
            SpecIssue(
                "model.patch_size",
                f"patch_size {patch} does not divide the {side}x{side} images of {data.type!r}",
            )
        )
    if training.freeze is not None:
        if training.freeze.t_freeze > training.epochs:
            issues.append(
                SpecIssue(
                    "training.freeze.t_freeze",
                    f"t_freeze ({training.freeze.t_freeze}) is after the last epoch ({training.epochs})",
                )
            )
        if getattr(getattr(model, "norm", None), "type", None) != "autonorm":
            issues.append(
                SpecIssue(
                    "training.freeze",
                    "gate freezing needs model.norm.type 'autonorm' (set training.freeze: null otherwise)",
                )
            )
    if training.budget == "epochs" and training.max_updates is not None:
        issues.append(SpecIssue("training.max_updates", "only used when training.budget is 'updates'"))
    if training.optimizer == "adamw" and training.momentum:
        issues.append(SpecIssue("training.momentum", "momentum is an sgd setting; adamw ignores it"))
    if training.tau_final is not None and getattr(getattr(model, "norm", None), "type", None) != "autonorm":
        issues.append(SpecIssue("training.tau_final", "tau annealing needs model.norm.type 'autonorm'"))
    return issues


class TrialSections(SpecModel):
    """What one trial receives: the spec's model, data and training sections plus a seed.

    Validating a candidate trial config against this model is how the search space is checked:
    every value a parameter can take is written into the base config and re-validated.
    """

    model: ModelSpec
    data: DataSpec
    training: TrainingSpec = TrainingSpec()
    seed: Seed = 0

    @model_validator(mode="after")
    def _cross(self) -> TrialSections:
        issues = section_issues(self.model, self.data, self.training)
        if issues:
            raise SpecError(issues)
        return self

    def trial_config(self) -> dict[str, Any]:
        """The plain dict workers hand to a trial (see ``workers/plan.py``)."""
        return trial_config(self.model, self.data, self.training, self.seed)


def type_first(obj: Any) -> Any:
    """Put each variant's ``type`` first, so a resolved spec reads like the YAML people write."""
    if isinstance(obj, dict):
        head = {"type": obj["type"]} if "type" in obj else {}
        return {**head, **{k: type_first(v) for k, v in obj.items() if k != "type"}}
    if isinstance(obj, list):
        return [type_first(v) for v in obj]
    return obj


def trial_config(model: Any, data: Any, training: TrainingSpec, seed: int) -> dict[str, Any]:
    """Trial config from sections; ``None`` model sizes are dropped so the preset's values apply."""
    return {
        "model": model.model_dump(mode="json", exclude_none=True),
        "data": data.model_dump(mode="json"),
        "training": training.model_dump(mode="json"),
        "seed": seed,
    }
