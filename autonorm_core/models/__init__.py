"""Models of the studies, built from a data set's :class:`~autonorm_core.data.Splits` by name.

``create_model(name, splits, preset="paper" | "tiny", **overrides)``: the preset gives the sizes
(the paper's for ``paper``, see docs/science.md; seconds-on-CPU ones for ``tiny``), every config
field can be overridden by keyword, and the data decides input shape, classes and vocabulary.
Unknown keywords raise ``ValueError`` listing the valid ones; nothing is silently dropped.

=============== ============================== ==============================================
name            data                           output
=============== ============================== ==============================================
vit_lite        images, classification         ``(B, num_classes)``
text_encoder    text, tagging / classification ``(B, T, num_classes)`` / ``(B, num_classes)``
tabular         rows ``(B, F)``                ``(B,)`` regression / ``(B, num_classes)``
mlp, cnn        images or rows                 ``(B, num_classes)`` / ``(B,)`` regression
=============== ============================== ==============================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from autonorm_core.data import Splits
from autonorm_core.models._layers import DropPath, LayerScale, LinearSpec, NormSpec
from autonorm_core.models.affine_nets import CNN, CNN_LAYERS, MLP, MLP_LAYERS, CNNConfig, MLPConfig
from autonorm_core.models.transformer import (
    Block,
    TabularTransformer,
    TabularTransformerConfig,
    TextEncoder,
    TextEncoderConfig,
    TransformerConfig,
    ViTLite,
    ViTLiteConfig,
)

__all__ = [
    "CNN",
    "CNN_LAYERS",
    "MLP",
    "MLP_LAYERS",
    "PRESETS",
    "Block",
    "CNNConfig",
    "DropPath",
    "LayerScale",
    "LinearSpec",
    "MLPConfig",
    "NormSpec",
    "TabularTransformer",
    "TabularTransformerConfig",
    "TextEncoder",
    "TextEncoderConfig",
    "TransformerConfig",
    "ViTLite",
    "ViTLiteConfig",
    "create_model",
    "list_models",
    "model_defaults",
]

# Sizes per preset; anything not named keeps the config class default (= the paper value).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vit_lite": {
        "paper": {"depth": 8, "dim": 128, "heads": 4, "mlp_ratio": 2.0, "patch_size": 4},
        "tiny": {"depth": 2, "dim": 32, "heads": 2, "mlp_ratio": 2.0, "patch_size": 4},
    },
    "text_encoder": {
        "paper": {"depth": 12, "dim": 128, "heads": 8, "mlp_ratio": 2.0},
        "tiny": {"depth": 2, "dim": 32, "heads": 2, "mlp_ratio": 2.0},
    },
    "tabular": {
        "paper": {"depth": 4, "dim": 128, "heads": 4, "mlp_ratio": 2.0},
        "tiny": {"depth": 2, "dim": 16, "heads": 2, "mlp_ratio": 2.0},
    },
    "mlp": {"paper": {"hidden": (512, 512)}, "tiny": {"hidden": (32, 32)}},
    "cnn": {"paper": {"channels": (32, 64, 128)}, "tiny": {"channels": (8, 16)}},
}


def _vit_lite_data(s: Splits) -> dict[str, Any]:
    if s.task != "classification" or len(s.input_shape) != 3:
        raise ValueError(
            f"vit_lite needs image classification data, got task {s.task!r} with inputs {s.input_shape}"
        )
    c, h, w = s.input_shape
    return {"in_channels": c, "image_size": (h, w), "num_classes": s.num_classes}


def _text_data(s: Splits) -> dict[str, Any]:
    if s.vocab_size is None or s.task not in ("tagging", "classification") or len(s.input_shape) != 1:
        raise ValueError(f"text_encoder needs tokenised text (tagging or classification), got {s!r}")
    return {
        "vocab_size": s.vocab_size,
        "max_len": s.input_shape[0],
        "num_classes": s.num_classes,
        "pad_index": s.pad_index,
        "task": s.task,
    }


def _tabular_data(s: Splits) -> dict[str, Any]:
    if s.task == "tagging" or len(s.input_shape) != 1 or s.vocab_size is not None:
        raise ValueError(f"tabular needs feature rows (F,), got task {s.task!r} with inputs {s.input_shape}")
    return {"num_features": s.input_shape[0], "num_classes": s.num_classes}


def _dense_data(name: str) -> Callable[[Splits], dict[str, Any]]:
    def fields(s: Splits) -> dict[str, Any]:
        if s.task == "tagging" or s.vocab_size is not None:
            raise ValueError(f"{name} takes images or feature rows, not text (task {s.task!r})")
        return {"input_shape": tuple(s.input_shape), "num_classes": s.num_classes}

    return fields


# name -> (model class, config class, fields taken from the data)
_REGISTRY: dict[str, tuple[Callable[[Any], nn.Module], type, Callable[[Splits], dict[str, Any]]]] = {
    "vit_lite": (ViTLite, ViTLiteConfig, _vit_lite_data),
    "text_encoder": (TextEncoder, TextEncoderConfig, _text_data),
    "tabular": (TabularTransformer, TabularTransformerConfig, _tabular_data),
    "mlp": (MLP, MLPConfig, _dense_data("mlp")),
    "cnn": (CNN, CNNConfig, _dense_data("cnn")),
}
_DATA_FIELDS: dict[str, frozenset[str]] = {
    "vit_lite": frozenset({"in_channels", "image_size", "num_classes"}),
    "text_encoder": frozenset({"vocab_size", "max_len", "num_classes", "pad_index", "task"}),
    "tabular": frozenset({"num_features", "num_classes"}),
    "mlp": frozenset({"input_shape", "num_classes"}),
    "cnn": frozenset({"input_shape", "num_classes"}),
}


def list_models() -> tuple[str, ...]:
    """Names accepted by :func:`create_model`, sorted."""
    return tuple(sorted(_REGISTRY))


def _lookup(
    name: str, preset: str
) -> tuple[Callable[[Any], nn.Module], type, Callable[[Splits], dict[str, Any]]]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(list_models())}")
    if preset not in PRESETS[name]:
        raise ValueError(f"unknown preset {preset!r} for {name!r}; valid: {', '.join(PRESETS[name])}")
    return _REGISTRY[name]


def model_defaults(name: str, *, preset: str = "paper") -> dict[str, Any]:
    """The overridable fields of ``name`` and their values under ``preset`` (data fields excluded)."""
    _, config_cls, _ = _lookup(name, preset)
    values = {f.name: f.default for f in dataclasses.fields(config_cls) if f.name not in _DATA_FIELDS[name]}
    return {**values, **PRESETS[name][preset]}


def create_model(name: str, splits: Splits, *, preset: str = "paper", **kwargs: Any) -> nn.Module:
    """Builds model ``name`` for the data in ``splits``.

    Args:
        name: One of :func:`list_models`.
        splits: The data set; gives the input shape, number of classes, vocabulary and task.
        preset: ``"paper"`` (the paper's sizes, docs/science.md) or ``"tiny"`` (for CPU tests).
        **kwargs: Overrides of the model's config fields (see :func:`model_defaults`), e.g.
            ``depth=4``, ``norm="autonorm"`` or ``norm={"type": "autonorm", "tau": 1.0}``,
            ``linear={"type": "corrected", "beta": 1.0}``, ``layer="patchnorm"``.

    Returns:
        The model, with its resolved config as ``model.config``. Parameters are initialised from
        torch's default generator (seed it, or fork it, for a reproducible init).

    Raises:
        ValueError: Unknown name, preset or keyword; a keyword that the data decides; data the
            model cannot take; invalid sizes or specs.
    """
    model_cls, config_cls, data_fields = _lookup(name, preset)
    valid = set(model_defaults(name, preset=preset))
    unknown = set(kwargs) - valid
    if unknown:
        fixed = unknown & _DATA_FIELDS[name]
        if fixed:
            raise ValueError(f"{name}: {sorted(fixed)} come from the data (splits), not from keywords")
        raise ValueError(f"{name}: unknown options {sorted(unknown)}; valid: {', '.join(sorted(valid))}")
    fields = {**PRESETS[name][preset], **kwargs}
    # Lists from YAML / JSON become the tuples the frozen configs hold.
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    config = config_cls(**fields, **data_fields(splits))
    return model_cls(config)
