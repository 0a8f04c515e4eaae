"""Normalization layers of the AutoNorm study behind one name → class registry.

Every layer takes the channel dimension ``dim`` first and everything else keyword-only with a default,
creates its parameters in ``__init__``, initialises them in ``reset_parameters()`` and shows its
configuration in ``extra_repr()`` (the timm convention). Every layer accepts ``(B, T, D)`` token
sequences and ``(B, D)`` vectors and normalizes over the last dimension.

Every ``forward`` takes an optional keyword ``mask`` of shape ``(B, T)``, True at real tokens: layers
that pool over tokens (:class:`FiLMNorm`'s conditioning, :class:`AutoNorm`'s selector) average over
the real tokens only, so that padding, often most of a text batch, does not steer them; per-token
layers ignore it. ``mask=None`` means every position is real (images, tabular rows) and computes
exactly the unmasked mean.

Formulas, defaults and open choices are those of ``docs/science.md``. Modules that draw random numbers
(:class:`AutoNorm`, :class:`RandomSelector`) own a ``torch.Generator`` each, so that a trial is
reproducible without global seeding and a training loop can save and restore the exact noise stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

__all__ = [
    "AdaNorm",
    "AutoNorm",
    "DyT",
    "FiLMNorm",
    "Identity",
    "LayerNorm",
    "NormSelector",
    "RMSNorm",
    "RandomSelector",
    "create_norm",
    "get_norm_layer",
    "list_norms",
    "register_norm",
]

_NORM_REGISTRY: dict[str, type[nn.Module]] = {}

_M = TypeVar("_M", bound=type[nn.Module])
_F = TypeVar("_F", bound=Callable[..., Any])


def _eager_only(fn: _F) -> _F:
    """``torch.compiler.disable`` with its type kept (the decorator itself is untyped)."""
    return cast(_F, torch.compiler.disable(fn))


def register_norm(name: str) -> Callable[[_M], _M]:
    """Class decorator that makes a norm available to :func:`create_norm` under ``name``.

    The shared contract suite (``tests/core/test_norms_contract.py``) runs over :func:`list_norms`,
    so a newly registered norm is tested without further wiring.

    Raises:
        ValueError: if ``name`` is already registered (silently replacing a layer would change every
            study that names it).
    """

    def decorator(cls: _M) -> _M:
        if name in _NORM_REGISTRY:
            raise ValueError(f"norm {name!r} is already registered to {_NORM_REGISTRY[name].__name__}")
        _NORM_REGISTRY[name] = cls
        return cls

    return decorator


def list_norms() -> list[str]:
    """Names accepted by :func:`create_norm`, sorted."""
    return sorted(_NORM_REGISTRY)


def get_norm_layer(name: str) -> type[nn.Module]:
    """Return the norm class registered under ``name`` (a type, not an instance).

    Raises:
        ValueError: for an unknown name; the message lists the valid names.
    """
    try:
        return _NORM_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown norm {name!r}; valid names: {', '.join(list_norms())}") from None


def create_norm(name: str, dim: int, **kwargs: Any) -> nn.Module:
    """Instantiate the norm registered under ``name`` for ``dim`` channels.

    Args:
        name: a registry name, see :func:`list_norms`.
        dim: number of channels (size of the last input dimension).
        **kwargs: keyword options of that norm's constructor.

    Raises:
        ValueError: for an unknown name (listing the valid ones) or an invalid option value.
    """
    return get_norm_layer(name)(dim, **kwargs)


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
    """``x.mean(dim=1)`` of a ``(B, T, D)`` input whose backward returns a broadcast *view*.

    Autograd's ``MeanBackward`` materialises ``grad.expand(B, T, D) / T`` as a full tensor before it
    is added to the input's other gradient; the view costs nothing and the engine adds it in place
    into the dense gradient of the mixture (one memory pass less per AutoNorm layer). Same values:
    the forward is ``x.mean(1)``, the backward ``(grad / T)`` broadcast over the tokens.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.tokens = x.shape[1]
        return x.mean(dim=1)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        b, d = grad.shape
        return (grad / ctx.tokens).unsqueeze(1).expand(b, ctx.tokens, d)


def _pool_tokens(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-sample summary used by the self-conditioned layers: mean over the real tokens of (B, T, D).

    ``mask`` (B, T) is True at real tokens; ``None`` averages over every position (bit-identical to
    ``x.mean(1)``). Padding is excluded with ``where`` rather than a multiplication, so that whatever
    the padded positions hold (even inf or NaN) cannot reach the result. A sample without any real
    token pools to zeros.
    """
    if x.ndim == 3:
        if mask is None:
            if (
                _FAST_PATHS["on"]
                and x.requires_grad
                and torch.is_grad_enabled()
                and not torch.compiler.is_compiling()
            ):
                pooled: Tensor = _TokenMean.apply(x)
                return pooled
            return x.mean(dim=1)  # (B, D)
        if mask.shape != x.shape[:2]:
            raise ValueError(f"mask must have shape {tuple(x.shape[:2])} (B, T), got {tuple(mask.shape)}")
        keep = mask.to(torch.bool).unsqueeze(-1)  # (B, T, 1)
        total = torch.where(keep, x, x.new_zeros(())).sum(dim=1)  # (B, D)
        count = keep.sum(dim=1).clamp_min(1).to(x.dtype)  # (B, 1)
        return total / count
    if x.ndim == 2:
        if mask is not None:
            raise ValueError("a mask applies to (B, T, D) token sequences, not to (B, D) vectors")
        return x
    raise ValueError(f"expected a (B, T, D) or (B, D) input, got shape {tuple(x.shape)}")


def _per_sample(w: Tensor, like: Tensor) -> Tensor:
    """Reshape per-sample weights (B,) to broadcast over the tokens and channels of ``like``."""
    return w.to(like.dtype).reshape(w.shape[0], *([1] * (like.ndim - 1)))


# ---------------------------------------------------------------------------------------------------------
# Plain norms
# ---------------------------------------------------------------------------------------------------------


@register_norm("layernorm")
class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last dimension, with the registry's keyword-only signature.

    Kept as a subclass (not a re-implementation) so that it runs PyTorch's fused kernel, the speed
    baseline every other norm is measured against in ``bench/norms.py``.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        _check_dim(dim)
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine, bias=bias)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Per-token: ``mask`` is accepted for the common norm interface and ignored."""
        return super().forward(x)


@register_norm("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` over the last dimension: ``γ ⊙ x / sqrt(mean(x²) + ε)``.

    ``eps`` defaults to 1e-6 (the LLaMA value) instead of PyTorch's dtype-dependent ``finfo.eps``, so
    that float32 and float64 runs compute the same formula.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, elementwise_affine: bool = True):
        _check_dim(dim)
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Per-token: ``mask`` is accepted for the common norm interface and ignored."""
        return super().forward(x)


@register_norm("identity")
class Identity(nn.Module):
    """No normalization; ``dim`` is accepted so the layer drops in wherever a norm is expected."""

    def __init__(self, dim: int):
        super().__init__()
        _check_dim(dim)
        self.dim = dim

    def reset_parameters(self) -> None:
        """Nothing to reset; present for the registry contract."""

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{self.dim}"


class _DyTFunction(torch.autograd.Function):
    """``γ ⊙ tanh(α x) + β`` with a hand-written backward from what the forward saved.

    ``tanh`` is computed as ``tanh(u) = 2 σ(2u) − 1``: ATen's CPU ``sigmoid`` is ~3x faster than its
    ``tanh`` (bench/norms.py), and the affine map folds into DyT's own, ``γ ⊙ tanh(αx) + β = 2γ ⊙ s +
    (β − γ)`` with ``s = σ(2αx)``, so it costs no extra pass (absolute difference from ``tanh`` under
    2e-7 in float32, 1e-16 in float64). The forward saves ``x`` and ``s`` only; the backward uses
    ``tanh'(u) = 4 σ'(2u) = 4 s (1 − s)`` with the fused ``sigmoid_backward`` kernel, and
    ``Σ g ⊙ tanh = 2 Σ g ⊙ s − Σ g`` for ``∂γ``. Against autograd over the naive expression: fewer
    kernels and saved tensors. First order only: the saved ``s`` is not connected to ``x``, so double
    backward raises instead of silently returning a wrong second derivative.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, alpha: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            # Inside a compiled graph Inductor fuses the whole expression (CPU: its exp form vectorizes
            # well; exp overflow gives 1 − 0 = 1, underflow 1 − 2 = −1: no NaN).
            u = x * alpha
            t = 1.0 - 2.0 / (torch.exp(2.0 * u) + 1.0) if u.device.type == "cpu" else torch.tanh(u)
            ctx.save_for_backward(x, alpha, weight, t)
            ctx.sigmoid_form = False
            return torch.addcmul(bias, t, weight)
        s = torch.mul(x, alpha * 2.0).sigmoid_()  # tanh(αx) = 2s − 1, in place: one temporary
        ctx.save_for_backward(x, alpha, weight, s)
        ctx.sigmoid_form = True
        return torch.addcmul(bias - weight, s, weight * 2.0)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, alpha, weight, saved = ctx.saved_tensors
        need_x, need_alpha, need_weight, need_bias = ctx.needs_input_grad
        grad_x = grad_alpha = grad_weight = grad_bias = None
        dim = weight.shape[-1]
        g2 = grad_out.reshape(-1, dim)
        if ctx.sigmoid_form:
            if need_x or need_alpha:
                grad_u = grad_out * weight
                torch.ops.aten.sigmoid_backward.grad_input(grad_u, saved, grad_input=grad_u)  # × s(1 − s)
                if need_alpha:
                    dot = grad_u.reshape(-1) @ x.reshape(-1).to(grad_u.dtype)
                    grad_alpha = dot.mul_(4.0).reshape(alpha.shape)
                if need_x:
                    grad_x = grad_u.mul_(alpha * 4.0)  # grad_u is no longer needed: reuse its memory
            if need_weight or need_bias:
                g0 = g2.sum(0)
                if need_bias:
                    grad_bias = g0
                if need_weight:
                    gs = torch.mul(g2, saved.reshape(-1, dim)).sum(0)
                    grad_weight = gs.mul_(2.0).sub_(g0)  # Σ g ⊙ (2s − 1)
            return grad_x, grad_alpha, grad_weight, grad_bias
        if need_x or need_alpha:  # compiled graphs saved t = tanh(αx)
            grad_u = grad_out * weight
            torch.ops.aten.tanh_backward.grad_input(grad_u, saved, grad_input=grad_u)
            if need_alpha:
                grad_alpha = (grad_u.reshape(-1) @ x.reshape(-1).to(grad_u.dtype)).reshape(alpha.shape)
            if need_x:
                grad_x = grad_u.mul_(alpha)
        if need_weight:
            grad_weight = (g2 * saved.reshape(-1, dim)).sum(0)
        if need_bias:
            grad_bias = g2.sum(0)
        return grad_x, grad_alpha, grad_weight, grad_bias


@register_norm("dyt")
class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., CVPR 2025): ``γ ⊙ tanh(α x) + β``.

    ``α`` is ONE learnable scalar per layer (shape ``(1,)``, as in the official implementation), ``γ``
    and ``β`` are per channel; parameter names ``alpha``, ``weight``, ``bias`` match the official code so
    its checkpoints load.

    Args:
        dim: number of channels.
        alpha_init: initial value of ``α`` (0.5, the paper's default for non-LLM models).
        fused: use the custom autograd function that saves ``tanh`` (same values and gradients as the
            naive expression, fewer kernels). ``False`` runs the naive expression, e.g. to compare.
    """

    def __init__(self, dim: int, *, alpha_init: float = 0.5, fused: bool = True):
        super().__init__()
        _check_dim(dim)
        self.dim = dim
        self.alpha_init = float(alpha_init)
        self.fused = fused
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Per-token: ``mask`` is accepted for the common norm interface and ignored."""
        if self.fused:
            out: Tensor = _DyTFunction.apply(x, self.alpha, self.weight, self.bias)
            return out
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha_init={self.alpha_init}, fused={self.fused}"


@register_norm("adanorm")
class AdaNorm(nn.Module):
    """AdaNorm (Xu et al., NeurIPS 2019): ``z = C (1 − k y) ⊙ y`` with ``y = (x − μ) / (σ + ε)``.

    ``σ`` is the unbiased standard deviation and the factor ``(1 − k y)`` is detached from the graph,
    which is what the paper's gradient analysis requires (it keeps the backward a plain rescaling).
    There is no gain or bias.

    Args:
        dim: number of channels.
        k: curvature of the adaptive factor (0.1).
        scale: the constant ``C`` (2).
        eps: added to ``σ`` (1e-5).
    """

    def __init__(self, dim: int, *, k: float = 0.1, scale: float = 2.0, eps: float = 1e-5):
        super().__init__()
        _check_dim(dim)
        if dim < 2:
            raise ValueError("AdaNorm needs dim >= 2 (unbiased standard deviation)")
        self.dim = dim
        self.k = float(k)
        self.scale = float(scale)
        self.eps = float(eps)

    def reset_parameters(self) -> None:
        """No parameters; present for the registry contract."""

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Per-token: ``mask`` is accepted for the common norm interface and ignored."""
        mu = x.mean(dim=-1, keepdim=True)
        sigma = x.std(dim=-1, keepdim=True, unbiased=True)
        y = (x - mu) / (sigma + self.eps)
        return self.scale * (1.0 - self.k * y).detach() * y

    def extra_repr(self) -> str:
        return f"{self.dim}, k={self.k}, scale={self.scale}, eps={self.eps}"


@register_norm("film")
class FiLMNorm(nn.Module):
    """Self-conditioned FiLM: ``(1 + Δγ(x̄)) ⊙ LN(x) + β(x̄)``, ``x̄`` the per-sample token mean.

    ``x̄`` averages over the real tokens when a ``mask`` is given (padding excluded), so a sample's
    output at its real positions does not depend on how much padding follows it.

    The AutoNorm paper never defines its FiLM baseline; this is the protocol's reading. ``LN`` has no
    affine parameters of its own; ``Δγ`` and ``β`` come from a 2-layer MLP (hidden ``dim // 2``, ReLU
    as in :class:`NormSelector`) whose output layer is zero-initialised, so the layer equals LayerNorm
    at init.

    Args:
        dim: number of channels.
        eps: LayerNorm epsilon.
        hidden_dim: MLP width; ``None`` means ``max(1, dim // 2)``.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, hidden_dim: int | None = None):
        super().__init__()
        _check_dim(dim)
        self.dim = dim
        self.eps = float(eps)
        self.hidden_dim = hidden_dim if hidden_dim is not None else max(1, dim // 2)
        self.fc1 = nn.Linear(dim, self.hidden_dim)
        self.fc2 = nn.Linear(self.hidden_dim, 2 * dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.fc1.reset_parameters()
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        cond = self.fc2(F.relu(self.fc1(_pool_tokens(x, mask))))  # (B, 2D)
        d_gamma, beta = cond.chunk(2, dim=-1)
        if x.ndim == 3:
            d_gamma, beta = d_gamma.unsqueeze(1), beta.unsqueeze(1)  # (B, 1, D)
        normed = F.layer_norm(x, (self.dim,), eps=self.eps)
        return torch.addcmul(beta, normed, 1.0 + d_gamma)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, hidden_dim={self.hidden_dim}"


# ---------------------------------------------------------------------------------------------------------
# Mixtures of candidate norms
# ---------------------------------------------------------------------------------------------------------


class _OwnsGenerator(nn.Module):
    """Base for modules that draw random numbers from their own ``torch.Generator``.

    The generator is created lazily on the input's device (a CUDA input needs a CUDA generator) and
    seeded with the module's seed (moving the module to another device restarts the stream from the
    seed there). Without an explicit ``seed`` the seed is drawn from the global RNG
    at construction, exactly like the parameter init, so a model built under one ``torch.manual_seed``
    is reproducible and its layers still draw different noise. A training loop seeds each such module
    with :meth:`manual_seed` and checkpoints :meth:`rng_state` for an exact resume.
    """

    def __init__(self, *, seed: int | None) -> None:
        super().__init__()
        self._seed = int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        self.generator: torch.Generator | None = None
        self._pending_state: Tensor | None = None

    def manual_seed(self, seed: int) -> None:
        """Restart the noise stream from ``seed`` (applied now, or when the generator is created)."""
        self._seed = int(seed)
        self._pending_state = None
        if self.generator is not None:
            self.generator.manual_seed(self._seed)

    def rng_state(self) -> dict[str, Any]:
        """Opaque, ``torch.save``-able state of the noise stream, for :meth:`set_rng_state`.

        Works before the first forward too (the generator does not exist yet; the seed and any pending
        state are enough to recreate it).
        """
        if self.generator is not None:
            state: Tensor | None = self.generator.get_state()
        else:
            state = None if self._pending_state is None else self._pending_state.clone()
        return {"seed": self._seed, "state": state}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state returned by :meth:`rng_state` (possibly of another process)."""
        self._seed = int(state["seed"])
        saved: Tensor | None = state["state"]
        if saved is None:
            self.generator = None
            self._pending_state = None
        elif self.generator is not None:
            self.generator.set_state(saved)
        else:
            self._pending_state = saved.clone()

    @_eager_only
    def _uniform(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """float32 U(0, 1) draws from the module's generator (never the global RNG).

        Kept out of ``torch.compile`` graphs: a generator argument is not traceable, and the draw is
        tiny (one number per sample and candidate).
        """
        if self.generator is None or self.generator.device != device:
            gen = torch.Generator(device=device)
            gen.manual_seed(self._seed)
            if self._pending_state is not None:
                gen.set_state(self._pending_state)
                self._pending_state = None
            self.generator = gen
        return torch.rand(shape, generator=self.generator, device=device, dtype=torch.float32)


def _build_branches(
    dim: int, candidates: Sequence[str], candidate_kwargs: Mapping[str, Mapping[str, Any]] | None
) -> tuple[tuple[str, ...], nn.ModuleList]:
    names = tuple(candidates)
    if len(names) < 2:
        raise ValueError(f"need at least 2 candidates, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"candidates must be distinct, got {names!r}")
    for name in names:
        if name in ("autonorm", "random_selector"):
            raise ValueError(f"candidate {name!r} is itself a mixture; use plain norms")
        get_norm_layer(name)  # raises ValueError listing valid names
    kwargs = dict(candidate_kwargs or {})
    unknown = set(kwargs) - set(names)
    if unknown:
        raise ValueError(f"candidate_kwargs for names not in candidates: {sorted(unknown)}")
    branches = nn.ModuleList(create_norm(name, dim, **dict(kwargs.get(name, {}))) for name in names)
    return names, branches


def _at_least_float32(t: Tensor) -> Tensor:
    """Gate arithmetic runs in float32 under reduced precision (NaN-free Gumbel noise), float64 stays."""
    if t.dtype in (torch.float32, torch.float64):
        return t  # no dispatch for the common case
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _no_autocast(device_type: str) -> AbstractContextManager[object]:
    """``autocast(enabled=False)`` where autocast is on, else a free no-op context (the gate runs per layer)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return nullcontext()


def _mix(branches: nn.ModuleList, x: Tensor, weights: Tensor, mask: Tensor | None) -> Tensor:
    """``Σ_k w_k · branch_k(x)`` with per-sample weights ``(B, K)`` that sum to 1.

    A (DyT, LayerNorm) pair in eager mode runs :class:`_DyTLayerNormMix` (see :func:`_fused_pair`);
    everything else, and every ``torch.compile`` graph, runs the reference expression below.
    """
    pair = _fused_pair(branches, x)
    if pair is not None:
        i_dyt, i_ln = pair
        dyt, ln = branches[i_dyt], branches[i_ln]
        out: Tensor = _DyTLayerNormMix.apply(
            x, weights[:, i_ln], dyt.alpha, dyt.weight, dyt.bias, ln.weight, ln.bias, ln.eps
        )
        return out
    return _reference_mix(branches, x, weights, mask)


def _reference_mix(branches: nn.ModuleList, x: Tensor, weights: Tensor, mask: Tensor | None) -> Tensor:
    """The mixture as plain module calls and tensor expressions (the tests' reference)."""
    ys = [branch(x, mask=mask) for branch in branches]
    dtype = ys[0].dtype
    for y in ys[1:]:
        dtype = torch.promote_types(dtype, y.dtype)
    # Under CPU autocast LayerNorm returns bfloat16 while DyT (float32 α) returns float32: mix in the wider.
    ys = [y if y.dtype == dtype else y.to(dtype) for y in ys]
    if len(ys) == 2:
        # lerp(y0, y1, w1) = w0 y0 + w1 y1 when w0 = 1 − w1: one kernel instead of three, and the same
        # gradient through a softmax (whose Jacobian columns sum to zero).
        return torch.lerp(ys[0], ys[1], _per_sample(weights[:, 1], ys[1]))
    out = ys[0] * _per_sample(weights[:, 0], ys[0])
    for k in range(1, len(ys)):
        out = torch.addcmul(out, ys[k], _per_sample(weights[:, k], ys[k]))
    return out


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _fused_pair(branches: nn.ModuleList, x: Tensor) -> tuple[int, int] | None:
    """Indices ``(dyt, layernorm)`` when the fused eager mixture applies, else ``None``.

    It applies to exactly two branches, a fused :class:`DyT` and a :class:`LayerNorm` with affine
    parameters, in eager mode, without autocast, with parameters of the input's dtype, and when no
    hook watches a branch (hooks must see the branch modules run). ``torch.compile`` graphs take the
    reference expression instead: Inductor fuses it into fewer passes than any eager kernel sequence.
    """
    if not _FAST_PATHS["on"] or len(branches) != 2 or x.ndim not in (2, 3) or torch.compiler.is_compiling():
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    a, b = branches[0], branches[1]
    if type(a) is DyT and type(b) is LayerNorm:
        dyt, ln, pair = a, b, (0, 1)
    elif type(a) is LayerNorm and type(b) is DyT:
        dyt, ln, pair = b, a, (1, 0)
    else:
        return None
    if not dyt.fused or ln.weight is None or ln.bias is None or len(ln.normalized_shape) != 1:
        return None
    if _has_hooks(dyt) or _has_hooks(ln) or nn.modules.module._global_forward_hooks:
        return None
    if nn.modules.module._global_forward_pre_hooks:
        return None
    dtype = x.dtype
    if dyt.weight.dtype != dtype or ln.weight.dtype != dtype or not x.is_contiguous():
        return None
    return pair


class _DyTLayerNormMix(torch.autograd.Function):
    """``lerp(DyT(x), LN(x), w)``, i.e. ``(1 − w) ⊙ DyT(x) + w ⊙ LN(x)`` per sample, in one function.

    DyT's ``tanh`` is computed as ``tanh(u) = 2 σ(2u) − 1``: ATen's CPU sigmoid is ~3x faster than
    its tanh, and the affine map folds into DyT's own, ``γ ⊙ tanh(αx) + β = 2γ ⊙ s + (β − γ)`` with
    ``s = σ(2αx)``, so it costs no extra pass (absolute difference from ``tanh``: under 2e-7 in
    float32, 1e-16 in float64). Forward: PyTorch's fused LayerNorm kernel (which also returns the
    mean and 1/σ it used), ``s``, DyT's output and the ``lerp`` in place into it. Backward, from what
    the forward saved (nothing recomputed) and with the per-sample weight ``w`` folded into per-sample
    reductions instead of full-size ``(1 − w) g`` temporaries (``t = 2s − 1``):

    * ``G0 = Σ_t g`` and ``GT = Σ_t g ⊙ t = 2 Σ_t g ⊙ s − G0`` (B, D) give DyT's
      ``∂β = Σ_b (1 − w_b) G0_b``, ``∂γ = Σ_b (1 − w_b) GT_b`` and ``⟨g, DyT(x)⟩_b = GT_b · γ + G0_b · β``;
    * the weight gradient ``⟨g, LN(x)⟩_b − ⟨g, DyT(x)⟩_b``;
    * PyTorch's fused LayerNorm backward on ``w g``;
    * ``h = g ⊙ c ⊙ s (1 − s)`` with the ``(B, 1, D)`` coefficient ``c = (1 − w) γ`` (``σ'``, with
      ``tanh' = 4 σ'``), ``∂α = 4 ⟨h, x⟩`` and the
      input gradient accumulated in place as ``∂x_LN + 4α h``.

    Full-size memory: three fresh tensors in the forward (LN's output and ``s``, both saved, and the
    output), two in the backward (one scratch buffer reused for ``g ⊙ s``, ``g ⊙ LN(x)``, ``w g`` and
    ``h``, and the input gradient); fresh allocations of that size cost page faults on CPU, often
    more than the arithmetic. Against autograd over the module calls this skips the lerp backward's
    full-size temporaries, the ``(1 − w) g`` product, the extra accumulation node and the module
    dispatch. First order only (``once_differentiable``).

    Inputs: ``x`` (B, T, D) or (B, D) contiguous; ``w_ln`` (B,) LayerNorm's weight per sample; DyT's
    ``alpha, weight, bias``; LayerNorm's ``weight, bias, eps``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        w_ln: Tensor,
        alpha: Tensor,
        dyt_weight: Tensor,
        dyt_bias: Tensor,
        ln_weight: Tensor,
        ln_bias: Tensor,
        eps: float,
    ) -> Tensor:
        dim = x.shape[-1]
        y_ln, mean, rstd = torch.native_layer_norm(x, (dim,), ln_weight, ln_bias, eps)
        s = torch.mul(x, alpha * 2.0).sigmoid_()  # tanh(αx) = 2s − 1
        w = _per_sample(w_ln, x)
        # DyT(x) = 2γ s + (β − γ), then mixed in place
        out = torch.addcmul(dyt_bias - dyt_weight, s, dyt_weight * 2.0).lerp_(y_ln, w)
        ctx.save_for_backward(x, w_ln, alpha, dyt_weight, dyt_bias, ln_weight, ln_bias, s, y_ln, mean, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, w_ln, alpha, dyt_weight, dyt_bias, ln_weight, ln_bias, s, y_ln, mean, rstd = ctx.saved_tensors
        need_x, need_w, need_alpha, need_dw, need_db, need_lw, need_lb, _ = ctx.needs_input_grad
        g = grad_out.contiguous()
        batch, dim = g.shape[0], g.shape[-1]
        w = w_ln.to(g.dtype)  # (B,)
        keep = 1.0 - w  # DyT's weight per sample
        g3 = g.reshape(batch, -1, dim)  # (B, T, D)
        grad_w = grad_alpha = grad_dw = grad_db = grad_x = grad_lw = grad_lb = None
        # One full-size scratch buffer serves g ⊙ s, g ⊙ LN(x), w g and h in turn.
        scratch = torch.empty_like(g)
        if need_w or need_db or need_dw:
            g0 = g3.sum(dim=1)  # (B, D)
            if need_db:
                grad_db = keep @ g0
        if need_w or need_dw:
            gs = torch.mul(g, s, out=scratch).reshape(g3.shape).sum(dim=1)  # (B, D)
            gt = gs.mul_(2.0).sub_(g0)  # Σ_t g ⊙ tanh(αx)
            if need_dw:
                grad_dw = keep @ gt
        if need_w:
            # ⟨g, LN(x)⟩ per sample (a (B,1,TD) x (B,TD,1) bmm would skip the temporary, but MKL's
            # batched dot is ~3x slower than this product and row sum on CPU)
            dot_ln = torch.mul(g, y_ln, out=scratch).reshape(batch, -1).sum(dim=1)
            dot_dyt = torch.addmv(g0 @ dyt_bias, gt, dyt_weight)
            grad_w = (dot_ln - dot_dyt).to(w_ln.dtype)
        if need_x or need_lw or need_lb:
            g_ln = torch.mul(g, _per_sample(w, g), out=scratch)
            grad_x, grad_lw, grad_lb = torch.ops.aten.native_layer_norm_backward(
                g_ln, x, (dim,), mean, rstd, ln_weight, ln_bias, [need_x, need_lw, need_lb]
            )
        if need_x or need_alpha:
            # ∂L/∂t of DyT's share (1 − w) γ ⊙ tanh: one broadcast product with a (B, 1, D) coefficient
            coef = (keep.unsqueeze(1) * dyt_weight).unsqueeze(1)  # (B, 1, D)
            h = torch.mul(g3, coef, out=scratch.view(g3.shape)).view(g.shape)
            torch.ops.aten.sigmoid_backward.grad_input(h, s, grad_input=h)  # × s (1 − s), in place
            if need_alpha:
                grad_alpha = (h.reshape(-1) @ x.reshape(-1)).mul_(4.0).reshape(alpha.shape)
            if need_x:
                scale = alpha * 4.0
                grad_x = h.mul_(scale) if grad_x is None else grad_x.addcmul_(h, scale)
        return grad_x, grad_w, grad_alpha, grad_dw, grad_db, grad_lw, grad_lb, None


class NormSelector(nn.Module):
    """Gate network of AutoNorm: token mean → ``Linear(D, D/2)`` → ReLU → ``Linear(D/2, K)`` → logits.

    The token mean runs over the real tokens of a ``mask`` (padding excluded): otherwise the gate of a
    padded text batch mostly sees the sentence length.

    Args:
        dim: number of input channels ``D``.
        num_choices: number of candidates ``K``.
        hidden_dim: hidden width; ``None`` means ``max(1, dim // 2)``.
        init: ``"zeros"`` zero-initialises the last layer, so every gate starts at ``1/K`` (protocol
            default, open choice); ``"default"`` keeps PyTorch's Linear init.
    """

    INITS = ("zeros", "default")

    def __init__(self, dim: int, num_choices: int = 2, *, hidden_dim: int | None = None, init: str = "zeros"):
        super().__init__()
        _check_dim(dim)
        if init not in self.INITS:
            raise ValueError(f"unknown selector init {init!r}; valid: {', '.join(self.INITS)}")
        if num_choices < 2:
            raise ValueError(f"num_choices must be >= 2, got {num_choices}")
        self.dim = dim
        self.num_choices = num_choices
        self.hidden_dim = hidden_dim if hidden_dim is not None else max(1, dim // 2)
        self.init = init
        self.fc1 = nn.Linear(dim, self.hidden_dim)
        self.fc2 = nn.Linear(self.hidden_dim, num_choices)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.fc1.reset_parameters()
        if self.init == "zeros":
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)
        else:
            self.fc2.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Logits ``(B, K)`` for a ``(B, T, D)`` or ``(B, D)`` input; ``mask`` (B, T), True = real token."""
        return self.fc2(F.relu(self.fc1(_pool_tokens(x, mask))))

    def extra_repr(self) -> str:
        return f"{self.dim}, num_choices={self.num_choices}, hidden_dim={self.hidden_dim}, init={self.init!r}"


@register_norm("random_selector")
class RandomSelector(_OwnsGenerator):
    """Baseline of the AutoNorm paper: candidates mixed with random weights, nothing learned.

    In training, each sample of each forward draws weights uniformly from the simplex (for the default
    two candidates: ``w_DyT ~ U(0, 1)``, ``w_LN = 1 − w_DyT``). In evaluation the weights are the
    expectation ``1/K`` (``eval_mode="mean"``, deterministic) or fresh draws (``"sample"``).

    Args:
        dim: number of channels.
        candidates: registry names of the mixed norms.
        eval_mode: ``"mean"`` or ``"sample"``.
        seed: seed of the module's generator; ``None`` draws one from the global RNG at construction.
        candidate_kwargs: per-candidate constructor options, e.g. ``{"dyt": {"alpha_init": 1.0}}``.
    """

    EVAL_MODES = ("mean", "sample")

    def __init__(
        self,
        dim: int,
        *,
        candidates: Sequence[str] = ("dyt", "layernorm"),
        eval_mode: str = "mean",
        seed: int | None = None,
        candidate_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__(seed=seed)
        _check_dim(dim)
        if eval_mode not in self.EVAL_MODES:
            raise ValueError(f"unknown eval_mode {eval_mode!r}; valid: {', '.join(self.EVAL_MODES)}")
        self.dim = dim
        self.eval_mode = eval_mode
        self.candidates, self.branches = _build_branches(dim, candidates, candidate_kwargs)
        self.last_weights: Tensor | None = None

    def reset_parameters(self) -> None:
        for branch in self.branches:
            branch.reset_parameters()  # type: ignore[operator]

    def _weights(self, x: Tensor) -> Tensor:
        batch, k = x.shape[0], len(self.candidates)
        dtype = torch.promote_types(x.dtype, torch.float32)
        if not self.training and self.eval_mode == "mean":
            return torch.full((batch, k), 1.0 / k, device=x.device, dtype=dtype)
        u = self._uniform((batch, k if k > 2 else 1), x.device).to(dtype)
        if k == 2:
            return torch.cat([u, 1.0 - u], dim=1)  # candidate 0 (DyT by default) gets U(0, 1)
        # Normalised Exp(1) draws are uniform on the simplex (Dirichlet(1, ..., 1)).
        e = -torch.log(u.clamp_min(1e-12))
        return e / e.sum(dim=1, keepdim=True)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """The weights do not depend on ``x``; ``mask`` only reaches candidates that pool."""
        if x.ndim not in (2, 3):
            raise ValueError(f"expected a (B, T, D) or (B, D) input, got shape {tuple(x.shape)}")
        weights = self._weights(x)
        self.last_weights = weights.detach()
        return _mix(self.branches, x, weights, mask)

    def extra_repr(self) -> str:
        return f"{self.dim}, candidates={self.candidates}, eval_mode={self.eval_mode!r}"


@register_norm("autonorm")
class AutoNorm(_OwnsGenerator):
    """AutoNorm: a learned per-sample gate mixing candidate norms, ``Σ_k w_k · norm_k(x)``.

    The gate is a :class:`NormSelector` on the sub-layer input (its token mean over the real tokens of
    ``mask``). Training draws the weights with a Gumbel-Softmax at temperature ``tau`` (soft by
    default, straight-through one-hot with ``hard=True``); the noise is our own float32 implementation
    (``u.clamp(1e-6, 1 − 1e-6)``, autocast off) from the module's generator, because
    ``F.gumbel_softmax`` has produced NaNs. Evaluation uses ``eval_mode``: ``"softmax"``
    (deterministic), ``"argmax"`` (one-hot) or ``"sample"`` (noisy).

    With ``hard=True`` evaluation is always one-hot, never the soft mixture the network was not
    trained on: ``"softmax"`` and ``"argmax"`` both give the argmax of the noise-free probabilities,
    ``"sample"`` the one-hot Gumbel-max draw (the argmax of the noisy logits).

    AutoNorm-S freezes the gate after a warm-up: :meth:`freeze` stops the selector's parameters for
    good (``requires_grad`` off and stale gradients dropped, so no optimizer moves them) and switches
    training to deterministic weights unless ``sample_after_freeze``. While frozen, a batch whose every
    sample puts weight ≥ ``fast_path_threshold`` on the same candidate computes only that candidate.

    Args:
        dim: number of channels.
        candidates: registry names of the mixed norms (default ``("dyt", "layernorm")``).
        tau: Gumbel-Softmax temperature; a plain attribute, so a training loop may anneal it.
        hard: straight-through one-hot weights in training (one-hot deterministic weights when
            frozen) and one-hot weights in evaluation, whatever ``eval_mode``.
        eval_mode: ``"softmax"``, ``"argmax"`` or ``"sample"``.
        selector_init: ``"zeros"`` (gate starts uniform) or ``"default"``, see :class:`NormSelector`.
        sample_after_freeze: keep drawing Gumbel noise in training after :meth:`freeze`.
        fast_path_threshold: gate weight from which a frozen batch runs a single branch; the output
            then differs from the full mixture by at most ``1 − threshold`` times the branch gap (set it
            to 1.0 to require an exact one-hot gate).
        hidden_dim: selector hidden width (``None``: ``dim // 2``).
        seed: seed of the module's generator; ``None`` draws one from the global RNG at construction.
        candidate_kwargs: per-candidate constructor options, e.g. ``{"dyt": {"alpha_init": 1.0}}``.
    """

    EVAL_MODES = ("softmax", "argmax", "sample")

    def __init__(
        self,
        dim: int,
        *,
        candidates: Sequence[str] = ("dyt", "layernorm"),
        tau: float = 0.5,
        hard: bool = False,
        eval_mode: str = "softmax",
        selector_init: str = "zeros",
        sample_after_freeze: bool = False,
        fast_path_threshold: float = 1.0 - 1e-3,
        hidden_dim: int | None = None,
        seed: int | None = None,
        candidate_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__(seed=seed)
        _check_dim(dim)
        if eval_mode not in self.EVAL_MODES:
            raise ValueError(f"unknown eval_mode {eval_mode!r}; valid: {', '.join(self.EVAL_MODES)}")
        if not 0.5 < fast_path_threshold <= 1.0:
            raise ValueError(f"fast_path_threshold must be in (0.5, 1], got {fast_path_threshold}")
        self.dim = dim
        self.tau = tau
        self.hard = hard
        self.eval_mode = eval_mode
        self.sample_after_freeze = sample_after_freeze
        self.fast_path_threshold = float(fast_path_threshold)
        self.candidates, self.branches = _build_branches(dim, candidates, candidate_kwargs)
        self.selector = NormSelector(dim, len(self.candidates), hidden_dim=hidden_dim, init=selector_init)
        self._frozen = False
        self.last_probs: Tensor | None = None
        self.last_weights: Tensor | None = None

    # -- configuration ----------------------------------------------------------------------------------

    @property
    def tau(self) -> float:
        """Gumbel-Softmax temperature (settable; must stay positive)."""
        return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        value = float(value)
        if not (value > 0.0 and math.isfinite(value)):
            raise ValueError(f"tau must be a positive finite number, got {value}")
        self._tau = value

    @property
    def frozen(self) -> bool:
        """Whether :meth:`freeze` has stopped the selector."""
        return self._frozen

    def freeze(self) -> None:
        """Stop the selector for good (AutoNorm-S); the candidate norms keep training.

        Turns ``requires_grad`` off and drops stored gradients: optimizers (AdamW's weight decay
        included) skip parameters whose ``grad`` is ``None``, so the selector stays bit-identical even
        with an optimizer built before the freeze. Rebuild optimizers with
        :func:`autonorm_core.optim.param_groups` to also drop their state. The frozen flag is not part
        of the ``state_dict``: a resumed run calls :meth:`freeze` again.
        """
        for p in self.selector.parameters():
            p.requires_grad_(False)
            p.grad = None
        self._frozen = True

    def unfreeze(self) -> None:
        """Let the selector train again."""
        for p in self.selector.parameters():
            p.requires_grad_(True)
        self._frozen = False

    def reset_parameters(self) -> None:
        for branch in self.branches:
            branch.reset_parameters()  # type: ignore[operator]
        self.selector.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, candidates={self.candidates}, tau={self.tau}, hard={self.hard}, "
            f"eval_mode={self.eval_mode!r}, frozen={self.frozen}"
        )

    # -- gate --------------------------------------------------------------------------------------------

    def gate_probs(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Noise-free gate probabilities ``softmax(logits)``, at least float32, shape ``(B, K)``."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            return _at_least_float32(self.selector(x, mask)).softmax(dim=-1)

    def gate_entropy(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Natural-log entropy of :meth:`gate_probs`, shape ``(B,)`` (``ln K`` for a uniform gate)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            log_p = _at_least_float32(self.selector(x, mask)).log_softmax(dim=-1)
            return -(log_p.exp() * log_p).sum(dim=-1)

    def _samples(self) -> bool:
        """Whether this forward draws Gumbel noise (training, or ``eval_mode="sample"``)."""
        if self.training:
            return not self._frozen or self.sample_after_freeze
        return self.eval_mode == "sample"

    def _gumbel_noise(self, batch: int, device: torch.device) -> Tensor:
        """Gumbel(0, 1) noise ``(B, K)``: float32 draws, computed in the gate's dtype (≥ float32)."""
        u = self._uniform((batch, len(self.candidates)), device).clamp(1e-6, 1.0 - 1e-6)
        u = u.to(torch.promote_types(self.selector.fc2.weight.dtype, torch.float32))
        return -torch.log(-torch.log(u))

    @staticmethod
    def _straight_through(soft: Tensor) -> Tensor:
        hard = F.one_hot(soft.argmax(dim=-1), soft.shape[-1]).to(soft.dtype)
        return hard - soft.detach() + soft

    def _gate(self, x: Tensor, gumbel: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Noise-free probabilities and mixing weights, both ``(B, K)`` and at least float32."""
        logits = self.selector(x, mask)  # (B, K)
        with _no_autocast(x.device.type):
            logits = _at_least_float32(logits)
            probs = logits.softmax(dim=-1)
            if gumbel is not None:
                soft = ((logits + gumbel) / self.tau).softmax(dim=-1)
                if self.hard and not self.training:  # evaluation: an exact one-hot draw, no graph trick
                    weights = F.one_hot(soft.argmax(dim=-1), soft.shape[-1]).to(soft.dtype)
                else:
                    weights = self._straight_through(soft) if self.hard else soft
            elif not self.training and (self.hard or self.eval_mode == "argmax"):
                weights = F.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)
            elif self.training and self.hard:  # frozen, noise off: deterministic one-hot
                weights = self._straight_through(probs)
            else:
                weights = probs
        return probs, weights

    @_eager_only
    def _single_branch(self, weights: Tensor) -> int | None:
        """Index of the branch that takes ≥ ``fast_path_threshold`` of the weight for every sample.

        Since the threshold exceeds 0.5, at most one column's minimum over the batch can pass. One
        host sync per forward, only while frozen; kept out of compiled graphs because the control flow
        depends on the data.
        """
        for k, low in enumerate(weights.detach().amin(dim=0).tolist()):
            if low >= self.fast_path_threshold:
                return k
        return None

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Mixture of the candidates; ``mask`` (B, T), True at real tokens, restricts the gate's token
        mean (and any pooling candidate's) to the real tokens."""
        gumbel = self._gumbel_noise(x.shape[0], x.device) if self._samples() else None
        if not self._frozen:
            probs, weights = self._gate(x, gumbel, mask)
        else:
            # Decide the fast path without building a graph through the (frozen) gate.
            with torch.no_grad():
                probs, weights = self._gate(x, gumbel, mask)
            k = self._single_branch(weights)
            if k is not None:
                self.last_probs, self.last_weights = probs, weights
                out: Tensor = self.branches[k](x, mask=mask)
                return out
            if torch.is_grad_enabled() and x.requires_grad:
                # The mixture depends on x through the gate too: recompute it with a graph (same noise).
                probs, weights = self._gate(x, gumbel, mask)
        self.last_probs = probs.detach()
        self.last_weights = weights.detach()
        return _mix(self.branches, x, weights, mask)
