"""Building blocks shared by the models: norm / linear specs resolved once, stochastic depth, LayerScale."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from autonorm_core.affine import LINEAR_KINDS, create_linear
from autonorm_core.norms import create_norm, get_norm_layer

# A norm by registry name, or {"type": <name>, **constructor options}.
NormSpec = str | Mapping[str, Any]
# A linear kind of autonorm_core.affine.create_linear, or {"type": <kind>, **options}.
LinearSpec = str | Mapping[str, Any]

NormFactory = Callable[[int], nn.Module]
LinearFactory = Callable[[int, int], nn.Module]

# Options create_linear takes per kind; anything else in a spec is an error, never silently dropped
# (create_linear itself ignores beta for kinds other than "corrected").
_LINEAR_OPTIONS: dict[str, frozenset[str]] = {
    "linear": frozenset({"bias"}),
    "prenorm_l2": frozenset({"bias"}),
    "prenorm_rms": frozenset({"bias"}),
    "corrected": frozenset({"bias", "beta"}),
}


def split_spec(spec: str | Mapping[str, Any], *, field: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``{"type": "name", **options}`` -> ``(name, options)``."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("type", None)
        if not isinstance(name, str):
            raise ValueError(f"{field}: a mapping needs a 'type' key naming the layer, got {dict(spec)!r}")
        return name, options
    raise ValueError(f"{field}: expected a name or a mapping with a 'type' key, got {spec!r}")


def norm_factory(spec: NormSpec, *, field: str = "norm") -> NormFactory:
    """Resolves a norm spec once; the returned ``make(dim)`` builds a fresh layer per call.

    A ``seed`` option (AutoNorm, RandomSelector) is offset by the creation index, so that the layers
    of one model draw different noise streams instead of the same one.
    """
    name, options = split_spec(spec, field=field)
    try:
        get_norm_layer(name)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None
    seed = options.pop("seed", None)
    count = 0

    def make(dim: int) -> nn.Module:
        nonlocal count
        kwargs = dict(options)
        if seed is not None:
            kwargs["seed"] = int(seed) + count
        count += 1
        try:
            return create_norm(name, dim, **kwargs)
        except TypeError as err:  # an unknown option: a ValueError like every other bad spec
            raise ValueError(f"{field}: invalid options for norm {name!r}: {err}") from None

    return make


def linear_factory(spec: LinearSpec, *, field: str = "linear") -> LinearFactory:
    """Resolves a divergence-fix linear spec once; ``make(in, out)`` builds a fresh layer per call."""
    kind, options = split_spec(spec, field=field)
    if kind not in _LINEAR_OPTIONS:
        raise ValueError(f"{field}: unknown linear kind {kind!r}; valid: {', '.join(LINEAR_KINDS)}")
    unknown = set(options) - _LINEAR_OPTIONS[kind]
    if unknown:
        valid = sorted(_LINEAR_OPTIONS[kind]) or ["none"]
        raise ValueError(
            f"{field}: unknown options {sorted(unknown)} for kind {kind!r}; valid: {', '.join(valid)}"
        )

    def make(in_features: int, out_features: int) -> nn.Module:
        return create_linear(kind, in_features, out_features, **options)

    return make


class DropPath(nn.Module):
    """Stochastic depth: drops a residual branch per sample with probability ``p`` in training.

    Draws from torch's default generator, like dropout; ``autonorm_core.training.fit`` seeds a forked
    copy of it, so runs stay reproducible without global seeding by the model.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path rate must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, 1)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel residual-branch gain ``γ ⊙ x`` (CaiT), ``γ`` initialised to a small constant."""

    def __init__(self, dim: int, *, init: float):
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"{self.gamma.shape[0]}, init={self.init}"
