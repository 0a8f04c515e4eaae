"""Shared pieces of the norm modules: the ``dim`` check, the fast-path switch, token pooling.

Private to :mod:`autonorm_core.norms`; tests and benches import :func:`_reference_paths` from here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

_F = TypeVar("_F", bound=Callable[..., Any])


def _eager_only(fn: _F) -> _F:
    """``torch.compiler.disable``, applied when first needed, with its type kept.

    ``torch.compiler.disable`` imports ``torch._dynamo`` at once: 1.5 s of every process that imports
    the norms (each trial worker, each CLI), nearly all of which never compile. The wrapper calls ``fn``
    as it is; only while Dynamo traces it does it call the disabled version (made on the first
    trace, kept in :data:`_DISABLED`), which Dynamo leaves out of the graph, as a decorated ``fn``."""

    @functools.wraps(fn)
    def eager_only(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return _disabled(fn)(*args, **kwargs)
        return fn(*args, **kwargs)

    return cast(_F, eager_only)


#: ``fn`` -> ``torch.compiler.disable(fn)``, made on the first compiled call of each.
_DISABLED: dict[Callable[..., Any], Callable[..., Any]] = {}


def _disabled(fn: Callable[..., Any]) -> Callable[..., Any]:
    out = _DISABLED.get(fn)
    if out is None:
        out = _DISABLED[fn] = torch.compiler.disable(fn)
    return out


def _check_dim(dim: int) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")


# Hand-written eager fast paths (:class:`_TokenMean`, :class:`_DyTLayerNormMix`) are on unless a caller
# asks for the reference expressions (tests compare the two; bench/norms.py times both in one run).
_FAST_PATHS = {"on": True}


@contextmanager
def _reference_paths() -> Iterator[None]:
    """Within the block, mixtures and token pooling run the plain reference expressions (private)."""
    previous = _FAST_PATHS["on"]
    _FAST_PATHS["on"] = False
    try:
        yield
    finally:
        _FAST_PATHS["on"] = previous


class _TokenMean(torch.autograd.Function):
    """``x.mean(dim=-2)`` of a ``(..., T, D)`` input whose backward returns a broadcast *view*.

    Autograd's ``MeanBackward`` materialises ``grad.expand(B, T, D) / T`` as a full tensor before it
    is added to the input's other gradient; the view costs nothing and the engine adds it in place
    into the dense gradient of the mixture (one memory pass less per AutoNorm layer). Same values:
    the forward is ``x.mean(-2)``, the backward ``(grad / T)`` broadcast over the tokens.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.shape = x.shape
        return x.mean(dim=-2)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return (grad / ctx.shape[-2]).unsqueeze(-2).expand(ctx.shape)


def _pool_tokens(x: Tensor, mask: Tensor | None = None, *, members: bool = False) -> Tensor:
    """Per-sample summary used by the self-conditioned layers: mean over the real tokens of (B, T, D).

    ``mask`` (B, T) is True at real tokens; ``None`` averages over every position (bit-identical to
    ``x.mean(1)``). Padding is excluded with ``where`` rather than a multiplication, so that whatever
    the padded positions hold (even inf or NaN) cannot reach the result. A sample without any real
    token pools to zeros. ``members``: a member stack's ``(K, B, T, D)`` or ``(K, B, D)`` input and
    ``(K, B, T)`` mask (:mod:`autonorm_core.stacking`), pooled per member as each member's alone.
    """
    lead = int(members)
    if x.ndim == 3 + lead:
        if mask is None:
            if (
                _FAST_PATHS["on"]
                and x.requires_grad
                and torch.is_grad_enabled()
                and not torch.compiler.is_compiling()
            ):
                pooled: Tensor = _TokenMean.apply(x)
                return pooled
            return x.mean(dim=-2)  # (B, D)
        if mask.shape != x.shape[:-1]:
            raise ValueError(f"mask must have shape {tuple(x.shape[:-1])} (B, T), got {tuple(mask.shape)}")
        keep = mask.to(torch.bool).unsqueeze(-1)  # (B, T, 1)
        total = torch.where(keep, x, x.new_zeros(())).sum(dim=-2)  # (B, D)
        count = keep.sum(dim=-2).clamp_min(1).to(x.dtype)  # (B, 1)
        return total / count
    if x.ndim == 2 + lead:
        if mask is not None:
            raise ValueError("a mask applies to (B, T, D) token sequences, not to (B, D) vectors")
        return x
    raise ValueError(f"expected a (B, T, D) or (B, D) input, got shape {tuple(x.shape)}")


def _per_sample(w: Tensor, like: Tensor) -> Tensor:
    """Reshape per-sample weights (B,) (a member stack's (K, B)) to broadcast over the tokens and
    channels of ``like``."""
    return w.to(like.dtype).reshape(*w.shape, *([1] * (like.ndim - w.ndim)))
