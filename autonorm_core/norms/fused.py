"""The mixture ``Σ_k w_k · branch_k(x)`` of candidate norms, and its fused eager (DyT, LayerNorm) kernel.

:func:`_mix` picks :class:`_DyTLayerNormMix` where it applies (:func:`_fused_pair`), else the
reference expression :func:`_reference_mix`; :func:`autonorm_core.norms.helpers._reference_paths`
switches the fused path off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from autonorm_core.norms.helpers import _FAST_PATHS, _per_sample
from autonorm_core.norms.simple import DyT, LayerNorm


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
    return _mix_outputs([branch(x, mask=mask) for branch in branches], weights)


def _mix_outputs(ys: list[Tensor], weights: Tensor) -> Tensor:
    """``Σ_k w_k · y_k`` of the branch outputs ``ys`` with per-sample weights ``(..., B, K)`` (a member
    stack's ``(K, B, K')`` too: :class:`autonorm_core.stacking.layers.StackedMixture`)."""
    dtype = ys[0].dtype
    for y in ys[1:]:
        dtype = torch.promote_types(dtype, y.dtype)
    # Under CPU autocast LayerNorm returns bfloat16 while DyT (float32 α) returns float32: mix in the wider.
    ys = [y if y.dtype == dtype else y.to(dtype) for y in ys]
    if len(ys) == 2:
        # lerp(y0, y1, w1) = w0 y0 + w1 y1 when w0 = 1 − w1: one kernel instead of three, and the same
        # gradient through a softmax (whose Jacobian columns sum to zero).
        return torch.lerp(ys[0], ys[1], _per_sample(weights[..., 1], ys[1]))
    out = ys[0] * _per_sample(weights[..., 0], ys[0])
    for k in range(1, len(ys)):
        out = torch.addcmul(out, ys[k], _per_sample(weights[..., k], ys[k]))
    return out


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _fused_pair(
    branches: nn.ModuleList, x: Tensor, *, kinds: tuple[type, type] = (DyT, LayerNorm), lead: int = 0
) -> tuple[int, int] | None:
    """Indices ``(dyt, layernorm)`` when the fused eager mixture applies, else ``None``.

    It applies to exactly two branches, a fused :class:`DyT` and a :class:`LayerNorm` with affine
    parameters, in eager mode, without autocast, with parameters of the input's dtype, and when no
    hook watches a branch (hooks must see the branch modules run). ``torch.compile`` graphs take the
    reference expression instead: Inductor fuses it into fewer passes than any eager kernel sequence.
    ``kinds`` and ``lead``: a member stack's (DyT, LayerNorm) types and its ``lead`` leading member
    dimension (:class:`autonorm_core.stacking.layers.StackedMixture`, :class:`_MemberDyTLayerNormMix`).
    """
    if (
        not _FAST_PATHS["on"]
        or len(branches) != 2
        or x.ndim - lead not in (2, 3)
        or torch.compiler.is_compiling()
    ):
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    a, b = branches[0], branches[1]
    if type(a) is kinds[0] and type(b) is kinds[1]:
        pair = (0, 1)
    elif type(a) is kinds[1] and type(b) is kinds[0]:
        pair = (1, 0)
    else:
        return None
    dyt: Any = branches[pair[0]]
    ln: Any = branches[pair[1]]
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


class _MemberDyTLayerNormMix(torch.autograd.Function):
    """:class:`_DyTLayerNormMix` for a member stack: every tensor with a leading member dimension K.

    Inputs: ``x`` (K, B, T, D) or (K, B, D) contiguous; ``w_ln`` (K, B); DyT's ``alpha`` (K, 1),
    ``weight`` and ``bias`` (K, D); LayerNorm's ``weight`` and ``bias`` (K, D) and ``eps``. The same
    plan as the one-model function, with two differences: PyTorch's fused LayerNorm takes one affine
    map, not K, so the forward normalises without it (the kernel's mean and 1/σ saved) and applies
    each member's ``γ, β`` in one ``addcmul``; and every per-member sum is a plain reduction over that
    member's own elements (no batched matmul), so a member's numbers do not depend on the stack it
    trains in. The forward is the stacked layers' own expression (normalised LN, then ``addcmul``;
    ``2γ ⊙ s + (β − γ)``; ``lerp``), value for value; the backward replaces autograd's chain over it.
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
        K, dim = x.shape[0], x.shape[-1]
        x4 = x.reshape(K, x.shape[1], -1, dim)  # (K, B, T, D), T = 1 for vectors
        y_hat, mean, rstd = torch.native_layer_norm(x4, (dim,), None, None, eps)
        s = torch.mul(x4, alpha.reshape(K, 1, 1, 1) * 2.0).sigmoid_()
        y_ln = torch.addcmul(ln_bias.reshape(K, 1, 1, dim), y_hat, ln_weight.reshape(K, 1, 1, dim))
        dw, db = dyt_weight.reshape(K, 1, 1, dim), dyt_bias.reshape(K, 1, 1, dim)
        out = torch.addcmul(db - dw, s, dw * 2.0).lerp_(y_ln, _per_sample(w_ln, x4))
        ctx.save_for_backward(x4, w_ln, alpha, dyt_weight, dyt_bias, ln_weight, ln_bias, s, y_hat, mean, rstd)
        ctx.shape = x.shape
        return out.reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, w_ln, alpha, dyt_weight, dyt_bias, ln_weight, ln_bias, s, y_hat, mean, rstd = ctx.saved_tensors
        need_x, need_w, need_alpha, need_dw, need_db, need_lw, need_lb, _ = ctx.needs_input_grad
        g = grad_out.reshape(x.shape).contiguous()  # (K, B, T, D)
        w = w_ln.to(g.dtype).unsqueeze(-1)  # (K, B, 1)
        keep = 1.0 - w  # DyT's weight per member and sample
        grad_w = grad_alpha = grad_dw = grad_db = grad_x = grad_lw = grad_lb = None
        scratch = torch.empty_like(g)  # serves g ⊙ s, g ⊙ LN-hat(x), the LN input gradient and h in turn
        g0 = g.sum(dim=2)  # (K, B, D)
        if need_db:
            grad_db = (keep * g0).sum(dim=1)
        if need_w or need_dw:
            gt = torch.mul(g, s, out=scratch).sum(dim=2).mul_(2.0).sub_(g0)  # Σ_t g ⊙ tanh(αx)
            if need_dw:
                grad_dw = (keep * gt).sum(dim=1)
        if need_w or need_lw:
            gh = torch.mul(g, y_hat, out=scratch).sum(dim=2)  # Σ_t g ⊙ LN-hat(x), (K, B, D)
            if need_lw:
                grad_lw = (w * gh).sum(dim=1)
        if need_lb:
            grad_lb = (w * g0).sum(dim=1)
        if need_w:
            # ⟨g, LN(x)⟩ − ⟨g, DyT(x)⟩ per member and sample
            lw, lb = ln_weight.unsqueeze(1), ln_bias.unsqueeze(1)
            dw, db = dyt_weight.unsqueeze(1), dyt_bias.unsqueeze(1)
            grad_w = ((gh * lw + g0 * lb) - (gt * dw + g0 * db)).sum(dim=-1).to(w_ln.dtype)
        if need_x:
            g_hat = torch.mul(g, (w.unsqueeze(-1) * ln_weight.reshape(x.shape[0], 1, 1, -1)), out=scratch)
            grad_x = torch.ops.aten.native_layer_norm_backward(
                g_hat, x, (x.shape[-1],), mean, rstd, None, None, [True, False, False]
            )[0]
        if need_x or need_alpha:
            coef = (keep * dyt_weight.unsqueeze(1)).unsqueeze(2)  # (K, B, 1, D)
            h = torch.mul(g, coef, out=scratch)
            torch.ops.aten.sigmoid_backward.grad_input(h, s, grad_input=h)  # × s (1 − s), in place
            a = alpha.reshape(-1, 1, 1, 1)
            if need_alpha:
                grad_alpha = (h * x).sum(dim=(1, 2, 3)).mul_(4.0).reshape(alpha.shape)
            if need_x:
                grad_x = h.mul_(a * 4.0) if grad_x is None else grad_x.addcmul_(h, a * 4.0)
        return (
            (None if grad_x is None else grad_x.reshape(ctx.shape)),
            grad_w,
            grad_alpha,
            grad_dw,
            grad_db,
            grad_lw,
            grad_lb,
            None,
        )
