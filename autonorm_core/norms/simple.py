"""The single norms: LayerNorm, RMSNorm, Identity, DyT (with its autograd function), AdaNorm, FiLMNorm.

Conventions of every layer: :mod:`autonorm_core.norms`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from autonorm_core.norms.helpers import _check_dim, _pool_tokens
from autonorm_core.norms.registry import register_norm


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
