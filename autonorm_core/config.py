"""The training configuration: :class:`TrainConfig`, :class:`GateFreeze`, the learning-rate schedule.

Plain Python, no torch: what a trial trains is decided (and checked, and its update and epoch counts
computed) without importing torch, so planning a study (``autonorm-study plan`` / ``run``'s estimate)
can work from measured step times alone. :mod:`autonorm_core.training` runs it (``fit``) and re-exports
every name here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = [
    "COMPILE_SETTINGS",
    "FREEZE_RULES",
    "PRECISIONS",
    "CompileSetting",
    "FreezeRule",
    "GateFreeze",
    "Precision",
    "TrainConfig",
    "lr_at_step",
    "reported_metrics",
    "should_freeze",
]

FreezeRule = Literal["freeze_if_high", "freeze_if_low", "always"]
FREEZE_RULES: tuple[str, ...] = ("freeze_if_high", "freeze_if_low", "always")
_OPTIMIZERS = ("adamw", "sgd")
_SCHEDULES = ("cosine", "constant")
_LR_SCALINGS = ("constant", "linear", "sqrt")
_BUDGETS = ("epochs", "updates")
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
CompileSetting = Literal["auto", "on", "off"]
COMPILE_SETTINGS: tuple[str, ...] = ("auto", "on", "off")
#: TrainConfig fields that choose how the same computation runs, not what it computes: a resumed fit
#: may differ in them from the one that wrote the state (e.g. ``compile="auto"`` resolves otherwise on
#: a CPU worker than on the GPU one that wrote the checkpoint).
_EXECUTION_FIELDS = ("compile",)


def reported_metrics(task: str, *, gated: bool = False) -> dict[str, str]:
    """The selectable metrics :func:`fit` reports every epoch on ``task``, each with its direction.

    Maps metric name -> ``"max"`` (higher is better) or ``"min"``. Bookkeeping keys (``epoch``, ``lr``,
    ``updates``, ``selector_frozen``, ``examples_per_s``, ``tau``, ``dyt_weight/layer_<i>``) are not
    listed: nothing is selected on them. ``gated``: the model has AutoNorm layers, which add
    ``gate_entropy`` (lower: a more decided gate); the per-layer ``gate_entropy/layer_<i>`` keys depend
    on the depth and are not listed. Needs no tensors (spec validation mirrors this table).

    Raises:
        ValueError: for an unknown task.
    """
    _choice("task", task, ("classification", "tagging", "regression"))
    score, direction = ("rmse", "min") if task == "regression" else ("accuracy", "max")
    out = {
        "train_loss": "min",
        "val_loss": "min",
        "test_loss": "min",
        f"val_{score}": direction,
        f"test_{score}": direction,
    }
    if gated:
        out["gate_entropy"] = "min"
    return out


def _choice(name: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, valid))}")


@dataclass(frozen=True)
class GateFreeze:
    """AutoNorm-S: decide once, at the end of epoch ``t_freeze``, whether to freeze every gate selector.

    The decision uses the mean over AutoNorm layers of the validation gate entropy H of that epoch.

    Attributes:
        t_freeze: 1-based epoch at whose end the rule is applied (default 10, as in the paper). Never reached
            when the run is shorter: the selector then trains throughout.
        eps_h: entropy threshold in nats (0 .. ln 2 for two candidates).
        rule: ``freeze_if_high`` freezes when H >= eps_h -- the paper's literal "has not fallen below
            eps_h", kept as the default although it reads backwards; ``freeze_if_low`` freezes when
            H < eps_h (the gate has already decided); ``always`` freezes regardless of H.
        sample_after_freeze: keep drawing Gumbel noise after freezing. Off by default: a frozen gate
            uses the deterministic softmax weights.
    """

    t_freeze: int = 10
    eps_h: float = 0.1
    rule: FreezeRule = "freeze_if_high"
    sample_after_freeze: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.t_freeze, bool) or not isinstance(self.t_freeze, int) or self.t_freeze < 1:
            raise ValueError(f"t_freeze must be an int >= 1, got {self.t_freeze!r}")
        if not math.isfinite(self.eps_h) or self.eps_h < 0:
            raise ValueError(f"eps_h must be a finite float >= 0, got {self.eps_h!r}")
        _choice("rule", self.rule, FREEZE_RULES)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateFreeze:
        """Builds a GateFreeze from a plain mapping; unknown keys raise ``ValueError``."""
        return cls(**_known_keys(cls, d))


def should_freeze(rule: str, entropy: float, eps_h: float) -> bool:
    """Applies a freeze rule to the mean gate entropy (see :class:`GateFreeze`)."""
    _choice("rule", rule, FREEZE_RULES)
    if rule == "always":
        return True
    if rule == "freeze_if_high":
        return entropy >= eps_h
    return entropy < eps_h


@dataclass(frozen=True)
class TrainConfig:
    """Everything the loop needs besides the model, the data and the seed. Flat, like Lingua's OptimArgs.

    Attributes:
        epochs: passes over the training split (``budget="epochs"``).
        batch_size: examples per update; the last incomplete batch of each epoch is dropped so that
            every update sees exactly ``batch_size`` examples (BatchNorm arms need > 1 per batch, and the
            batch-size study compares update sizes).
        lr: base learning rate at ``reference_batch_size``; see ``lr_scaling``.
        optimizer: ``adamw`` or ``sgd`` (plain SGD for the affine-divergence study).
        momentum: SGD momentum (0 = vanilla gradient descent, as the divergence derivation assumes).
        weight_decay: applied to >= 2-D parameters only; 0-/1-D ones (alpha, gamma, beta, biases) never decay.
        schedule: ``cosine`` (to 0 at the last update) or ``constant``, both after the linear warm-up.
        warmup_fraction: share of all updates spent ramping linearly up to the learning rate.
        grad_clip: maximum global gradient norm; ``None`` turns clipping off.
        label_smoothing: classification only (tagging and regression ignore it).
        freeze: the AutoNorm-S rule; ``None`` keeps the selector trainable throughout.
        lr_scaling: ``constant`` (lr as given), ``linear`` (lr * B / ref) or ``sqrt`` (lr * sqrt(B / ref)),
            B = batch_size, ref = reference_batch_size -- the learning-rate policy of the batch-size study.
        reference_batch_size: the batch size at which ``lr`` was tuned.
        budget: ``epochs`` trains ``epochs`` epochs; ``updates`` trains exactly ``max_updates`` updates,
            as many epochs as that takes (the last one possibly partial).
        max_updates: the update count for ``budget="updates"``; ``None``: the updates of ``epochs``
            epochs at ``reference_batch_size`` (``epochs * (num_train // reference_batch_size)``), the
            same for every batch size.
        eval_batch_size: batch size of evaluation passes (memory only; results do not depend on it
            beyond float rounding).
        tau_final: when set, every AutoNorm's Gumbel temperature anneals linearly per update from its
            initial value to this one; ``None`` keeps tau fixed (the default).
        precision: ``fp32`` (the default) or ``bf16``: every forward pass, training and evaluation, runs
            under ``torch.autocast(device.type, dtype=torch.bfloat16)``; the loss is computed in float32
            from ``logits.float()``, and parameters, gradients and optimizer state stay float32. Valid
            on CPU and CUDA; on most CPUs bf16 is slower than fp32 (it is meant for GPUs).
        compile: ``auto`` (the default), ``on`` or ``off``: whether the model's forward runs through
            ``torch.compile`` (see :func:`resolve_compile`). ``auto`` compiles on CUDA and stays eager on
            CPU, where this project's eager kernels (ATen plus the hand-written AutoNorm mixture) beat
            Inductor's CPU code and the compile time (seconds to a minute) is not repaid in a short
            trial. The first epoch's ``examples_per_s`` includes the compile time. An execution
            choice: a fit may resume a state written with another ``compile`` setting.
    """

    epochs: int = 20
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: float = 0.0
    weight_decay: float = 1e-4
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_fraction: float = 0.05
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.1
    freeze: GateFreeze | None = None
    lr_scaling: Literal["constant", "linear", "sqrt"] = "constant"
    reference_batch_size: int = 64
    budget: Literal["epochs", "updates"] = "epochs"
    max_updates: int | None = None
    eval_batch_size: int = 256
    tau_final: float | None = None
    precision: Precision = "fp32"
    compile: CompileSetting = "auto"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "reference_batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        _choice("optimizer", self.optimizer, _OPTIMIZERS)
        _choice("schedule", self.schedule, _SCHEDULES)
        _choice("lr_scaling", self.lr_scaling, _LR_SCALINGS)
        _choice("budget", self.budget, _BUDGETS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("compile", self.compile, COMPILE_SETTINGS)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite float > 0, got {self.lr!r}")
        if not (0.0 <= self.momentum < 1.0):
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite float >= 0, got {self.weight_decay!r}")
        if not (0.0 <= self.warmup_fraction < 1.0):
            raise ValueError(f"warmup_fraction must lie in [0, 1), got {self.warmup_fraction!r}")
        if self.grad_clip is not None and not (math.isfinite(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be None or a finite float > 0, got {self.grad_clip!r}")
        if not (0.0 <= self.label_smoothing < 1.0):
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing!r}")
        if self.budget == "updates":
            if self.max_updates is not None and (
                isinstance(self.max_updates, bool)
                or not isinstance(self.max_updates, int)
                or self.max_updates < 1
            ):
                raise ValueError(
                    f"budget='updates' needs max_updates, an int >= 1 (or None), got {self.max_updates!r}"
                )
        elif self.max_updates is not None:
            raise ValueError("max_updates is only used with budget='updates'; set budget or drop max_updates")
        if self.tau_final is not None and not (math.isfinite(self.tau_final) and self.tau_final > 0):
            raise ValueError(f"tau_final must be None or a finite float > 0, got {self.tau_final!r}")
        if self.freeze is not None and not isinstance(self.freeze, GateFreeze):
            raise ValueError(f"freeze must be a GateFreeze or None, got {type(self.freeze).__name__}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Builds a config from plain data (YAML, a trial config); unknown keys raise ``ValueError``.

        ``freeze`` may be ``None``, a :class:`GateFreeze` or a mapping of its fields.
        """
        kwargs = _known_keys(cls, d)
        freeze = kwargs.get("freeze")
        if isinstance(freeze, Mapping):
            kwargs["freeze"] = GateFreeze.from_dict(freeze)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form; ``TrainConfig.from_dict(cfg.to_dict()) == cfg``."""
        return asdict(self)

    @property
    def effective_lr(self) -> float:
        """The peak learning rate after ``lr_scaling``."""
        ratio = self.batch_size / self.reference_batch_size
        if self.lr_scaling == "linear":
            return self.lr * ratio
        if self.lr_scaling == "sqrt":
            return self.lr * math.sqrt(ratio)
        return self.lr

    def steps_per_epoch(self, num_train: int) -> int:
        """Full batches per epoch; raises ``ValueError`` when the split is smaller than one batch."""
        steps = num_train // self.batch_size
        if steps < 1:
            raise ValueError(
                f"the training split has {num_train} examples, fewer than batch_size={self.batch_size}"
            )
        return steps

    def total_updates(self, num_train: int) -> int:
        """Optimizer updates of the whole fit."""
        if self.budget == "updates":
            if self.max_updates is None:
                # The updates of `epochs` epochs at the reference batch size, the same for every B.
                steps = num_train // self.reference_batch_size
                if steps < 1:
                    raise ValueError(
                        f"the training split has {num_train} examples, fewer than "
                        f"reference_batch_size={self.reference_batch_size}"
                    )
                return self.epochs * steps
            return self.max_updates
        return self.epochs * self.steps_per_epoch(num_train)

    def num_epochs(self, num_train: int) -> int:
        """Epochs of the whole fit (with ``budget="updates"`` the last one may be partial)."""
        return math.ceil(self.total_updates(num_train) / self.steps_per_epoch(num_train))

    def warmup_updates(self, num_train: int) -> int:
        """Updates of the linear warm-up."""
        return round(self.warmup_fraction * self.total_updates(num_train))


def _known_keys(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise ValueError(f"{cls.__name__} needs a mapping, got {type(d).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} key(s) {unknown}; valid keys: {', '.join(names)}")
    return dict(d)


def lr_at_step(
    step: int, *, total: int, warmup: int, peak: float, schedule: Literal["cosine", "constant"] = "cosine"
) -> float:
    """Learning rate of the 0-based update ``step``: linear warm-up to ``peak``, then cosine to 0 or flat.

    The first warm-up update already uses ``peak / warmup`` (never 0, which would waste an update).
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    decay_steps = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
