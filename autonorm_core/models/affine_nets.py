"""MLP and small CNN for the affine-divergence studies, with a selectable layer type.

The layer type is the study's arm (docs/science.md): a plain affine layer, the controls affine +
BatchNorm / affine + LayerNorm, and the fixes ``prenorm_l2`` / ``prenorm_rms`` / ``corrected`` of
:mod:`autonorm_core.affine` (``conv`` / ``conv_batchnorm`` / ``patchnorm`` for the CNN). Both models
take images ``(N, C, H, W)`` and tabular rows ``(N, F)``; the MLP flattens, the CNN reads a row as
``F`` channels of a 1x1 image (its convolutions then act as dense layers over the features).

Outputs: ``(N, num_classes)`` logits, or ``(N,)`` when ``num_classes == 0`` (regression).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from autonorm_core.affine import PatchNormConv2d
from autonorm_core.models._layers import linear_factory, split_spec

__all__ = ["CNN", "CNN_LAYERS", "MLP", "MLP_LAYERS", "CNNConfig", "MLPConfig"]

MLP_LAYERS = ("linear", "linear_batchnorm", "linear_layernorm", "prenorm_l2", "prenorm_rms", "corrected")
CNN_LAYERS = ("conv", "conv_batchnorm", "conv_layernorm", "patchnorm")
_PATCHNORM_OPTIONS = frozenset({"bias", "bias_in_division", "patch_scale", "learnable_gain"})
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}

LayerSpec = str | Mapping[str, Any]


def _activation(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


def _check_task(num_classes: int, input_shape: tuple[int, ...]) -> None:
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0 (0 = regression), got {num_classes}")
    if len(input_shape) not in (1, 3) or min(input_shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) or (F,), got {input_shape}")


# ----------------------------------------------------------------------------------------------
# MLP


@dataclass(frozen=True)
class MLPConfig:
    """MLP of ``len(hidden)`` hidden layers of the chosen type; input and outputs from the data."""

    input_shape: tuple[int, ...] = (1, 28, 28)
    num_classes: int = 10  # 0: regression, output (N,)
    hidden: tuple[int, ...] = (512, 512)  # protocol: 2-4 hidden layers of width 256-1024
    layer: LayerSpec = "linear"  # one of MLP_LAYERS, or {"type": "corrected", "beta": 1.0}
    # Open choice: the output layer is a plain nn.Linear by default, so every arm shares the same
    # readout; True makes it the chosen fix too (prenorm_* / corrected; the BatchNorm / LayerNorm
    # controls never normalize the logits).
    head_variant: bool = False
    activation: str = "relu"

    def __post_init__(self) -> None:
        _check_task(self.num_classes, self.input_shape)
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty sequence of positive widths, got {self.hidden}")
        _activation(self.activation)


class MLP(nn.Module):
    """``[layer -> activation] * len(hidden) -> head``; ``layer`` is affine (+ norm) or a fix."""

    def __init__(self, config: MLPConfig):
        super().__init__()
        self.config = config
        c = config
        kind, options = split_spec(c.layer, field="layer")
        if kind not in MLP_LAYERS:
            raise ValueError(f"layer: unknown MLP layer {kind!r}; valid: {', '.join(MLP_LAYERS)}")
        norm: type[nn.Module] | None = None
        if kind in ("linear_batchnorm", "linear_layernorm"):
            norm = nn.BatchNorm1d if kind == "linear_batchnorm" else nn.LayerNorm
            affine_spec: LayerSpec = {"type": "linear", **options}
        else:
            affine_spec = c.layer
        make_linear = linear_factory(affine_spec, field="layer")
        layers: list[nn.Module] = []
        width = math.prod(c.input_shape)
        for h in c.hidden:
            layers.append(make_linear(width, h))
            if norm is not None:
                layers.append(norm(h))
            layers.append(_activation(c.activation))
            width = h
        self.features = nn.Sequential(*layers)
        out = max(c.num_classes, 1)
        use_variant = c.head_variant and norm is None
        self.head = make_linear(width, out) if use_variant else nn.Linear(width, out)

    def forward(self, x: Tensor) -> Tensor:
        out = self.head(self.features(x.flatten(1)))  # (N, num_classes or 1)
        return out.squeeze(-1) if self.config.num_classes == 0 else out


# ----------------------------------------------------------------------------------------------
# CNN


@dataclass(frozen=True)
class CNNConfig:
    """Small CNN: per stage conv (+BN) -> activation -> 2x2 max-pool, then global average pool + linear.

    Sizes are an open choice (the protocol only asks for "a CNN variant for PatchNorm").
    """

    input_shape: tuple[int, ...] = (1, 28, 28)
    num_classes: int = 10  # 0: regression, output (N,)
    channels: tuple[int, ...] = (32, 64, 128)
    kernel: int = 3  # odd, with "same" padding kernel // 2
    layer: LayerSpec = "conv"  # one of CNN_LAYERS, or {"type": "patchnorm", "patch_scale": True}
    activation: str = "relu"

    def __post_init__(self) -> None:
        _check_task(self.num_classes, self.input_shape)
        if not self.channels or min(self.channels) < 1:
            raise ValueError(f"channels must be a non-empty sequence of positive widths, got {self.channels}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be a positive odd size, got {self.kernel}")
        _activation(self.activation)


class CNN(nn.Module):
    """Convolutional stages of the chosen layer type; pooling only while the feature map is >= 2x2."""

    def __init__(self, config: CNNConfig):
        super().__init__()
        self.config = config
        c = config
        kind, options = split_spec(c.layer, field="layer")
        if kind not in CNN_LAYERS:
            raise ValueError(f"layer: unknown CNN layer {kind!r}; valid: {', '.join(CNN_LAYERS)}")
        allowed = _PATCHNORM_OPTIONS if kind == "patchnorm" else frozenset({"bias"})
        unknown = set(options) - allowed
        if unknown:
            raise ValueError(
                f"layer: unknown options {sorted(unknown)} for {kind!r}; valid: {', '.join(sorted(allowed))}"
            )
        in_ch, h, w = c.input_shape if len(c.input_shape) == 3 else (c.input_shape[0], 1, 1)
        pad = c.kernel // 2
        layers: list[nn.Module] = []
        for ch in c.channels:
            if kind == "patchnorm":
                layers.append(PatchNormConv2d(in_ch, ch, c.kernel, padding=pad, **options))
            else:
                layers.append(nn.Conv2d(in_ch, ch, c.kernel, padding=pad, **options))
                if kind == "conv_batchnorm":
                    layers.append(nn.BatchNorm2d(ch))
                elif kind == "conv_layernorm":
                    # LayerNorm of a feature map: per sample over (C, H, W), i.e. one group.
                    layers.append(nn.GroupNorm(1, ch))
            layers.append(_activation(c.activation))
            if min(h, w) >= 2:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            in_ch = ch
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(in_ch, max(c.num_classes, 1))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 2:
            x = x[:, :, None, None]  # (N, F) -> (N, F, 1, 1)
        x = self.features(x).mean(dim=(2, 3))  # (N, channels[-1])
        out = self.head(x)
        return out.squeeze(-1) if self.config.num_classes == 0 else out
