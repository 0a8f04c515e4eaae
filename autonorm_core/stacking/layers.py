"""Member-stacked layers: K copies of one layer type, each member with its own parameters.

Every class here is built from a list of K member layers (the exact modules a separate run trains) and
copies their parameters into tensors with a leading member dimension ``K``, named exactly as in the
member layer (``weight``, ``bias``, ``alpha``, ``running_mean``, ...), so that ``stacked[k]`` of every
entry of the stacked ``state_dict`` is member ``k``'s entry.

Two activation layouts:

* tokens ``(K, B, ..., D)``: linears (``torch.baddbmm`` over the member dimension), LayerNorm, RMSNorm,
  DyT, AutoNorm / RandomSelector mixtures, BatchNorm1d (per-member statistics), LayerScale, DropPath;
* channels ``(B, K*C, H, W)``: convolutions (one grouped convolution over the members), PatchNorm
  convolutions, BatchNorm2d and GroupNorm (per-member statistics: their channels and groups never mix
  members), pooling and activations.

Randomness: AutoNorm's Gumbel noise and RandomSelector's weights come from one generator per member and
layer (:class:`~autonorm_core.norms.selector.NoiseStream`, the member layer's own kind of stream); DropPath draws from a
per-member stand-in of torch's default generator (:class:`MemberGenerators`), which the stacked fit
seeds as the separate fit seeds the default one. Member k's draws are therefore the separate run's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.affine import (
    DivergenceCorrectedLinear,
    PatchNormConv2d,
    PreNormAffine,
    corrected_denominator,
    prenormalize,
)
from autonorm_core.norms import DyT, Identity, RandomSelector, RMSNorm
from autonorm_core.norms import LayerNorm as _AnyLayerNorm
from autonorm_core.norms.fused import _fused_pair, _MemberDyTLayerNormMix, _mix_outputs
from autonorm_core.norms.helpers import _pool_tokens
from autonorm_core.norms.selector import NoiseStream, gumbel, simplex_weights

__all__ = [
    "BackwardSGD",
    "MemberGenerators",
    "NotStackableError",
    "StackedBatchNorm",
    "StackedConv2d",
    "StackedDropPath",
    "StackedDyT",
    "StackedGroupNorm",
    "StackedLayerNorm",
    "StackedLayerScale",
    "StackedLinear",
    "StackedMixture",
    "StackedRMSNorm",
    "stack_channel_layer",
    "stack_norm",
    "stack_token_layer",
]

# Stateless layers that act per element or per channel: the member's own module serves every member.
_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Identity, nn.MaxPool2d)


class NotStackableError(ValueError):
    """A member layer (or model, or configuration) has no member-stacked form; the message says why."""


def _same(members: Sequence[nn.Module], what: str, values: Sequence[Any]) -> Any:
    if any(v != values[0] for v in values[1:]):
        raise NotStackableError(
            f"{type(members[0]).__name__}: members differ in {what} ({values!r}); only same-shaped "
            "members stack"
        )
    return values[0]


def _exact_type(members: Sequence[nn.Module]) -> type[nn.Module]:
    kinds = {type(m) for m in members}
    if len(kinds) != 1:
        raise NotStackableError(f"members mix layer types {sorted(k.__name__ for k in kinds)}")
    return type(members[0])


def _stack(tensors: Sequence[Tensor | None]) -> Tensor | None:
    if tensors[0] is None:
        if any(t is not None for t in tensors):
            raise NotStackableError("some members have a bias/parameter the others lack")
        return None
    return torch.stack([t.detach() for t in tensors if t is not None])


def _param(tensors: Sequence[Tensor | None]) -> nn.Parameter | None:
    # Always trainable: a member whose slice must not move (a frozen AutoNorm-S selector) is masked by
    # the stacked optimizer instead.
    t = _stack(tensors)
    return None if t is None else nn.Parameter(t)


def _bcast(t: Tensor, ndim: int) -> Tensor:
    """``(K, D)`` (or ``(K,)``) -> ``(K, 1, ..., 1, D)`` broadcasting over an ``ndim``-D token tensor."""
    if t.ndim == 1:
        return t.reshape(t.shape[0], *([1] * (ndim - 1)))
    return t.reshape(t.shape[0], *([1] * (ndim - t.ndim)), *t.shape[1:])


# ---------------------------------------------------------------------------------------------- randomness


class MemberGenerators:
    """Per-member stand-ins for torch's default generator (what DropPath draws from in a separate run).

    ``generators[k]`` lives on the model's device. Unset (``None``), draws fall back to torch's default
    generator (a stacked model used outside :func:`fit_stacked`).
    """

    def __init__(self) -> None:
        self.generators: list[torch.Generator] | None = None


# ------------------------------------------------------------------------------------------------- linears


class BackwardSGD:
    """A plain-SGD step that stacked linears fed by data apply inside their backward (``fit_stacked``).

    Armed per update (``lr``) when the step is plain SGD at one learning rate for every member (no
    weight decay, momentum or clipping, every member updating), it lets a :class:`StackedLinear` whose
    input needs no gradient (the first layer: its input is the batch) replace "write ``∂W`` (K times a
    member's weight), then ``W -= lr ∂W``" by one ``W -= lr xᵀ∂z`` batched matmul into the weight: two
    fewer passes over the largest tensor of an MLP, which at 16 members no longer fits in the core's
    cache. Set back to ``lr = None`` after the forward (a member diverged in this step, or stopped or
    froze before), the layer writes the ordinary gradient instead, for the masked optimizer step.
    ``updated`` lists the weights updated so (they get no ``.grad``), for the optimizer's step counts.
    Same products as the separate run's ``∂W`` and ``W -= lr ∂W``, one rounding fewer. ``fit_stacked``
    arms it for two or more members only: one member's weight fits in cache, and the hook costs more.
    """

    def __init__(self) -> None:
        self.lr: float | None = None
        self.updated: list[Tensor] = []


class StackedLinear(nn.Module):
    """K ``nn.Linear`` / :class:`PreNormAffine` / :class:`DivergenceCorrectedLinear` of one shape.

    ``weight`` ``(K, out, in)``, ``bias`` ``(K, out)``; input ``(K, ..., in)``, output ``(K, ..., out)``.
    The corrected layer's ``beta`` may differ per member.

    ``weight`` is stored transposed: its memory is ``(K, in, out)`` contiguous (strides
    ``(in*out, 1, out)``), so that ``weight.transpose(1, 2)`` is a contiguous ``Wᵀ`` and both passes run
    the batched-matmul layouts CPU bmm is fastest in: forward ``x @ Wᵀ`` into a contiguous output,
    backward ``∂Wᵀ = xᵀ @ ∂z`` straight into the parameter's own layout (no transposing copy into the
    gradient) and ``∂x = ∂z @ W``. With a contiguous ``(K, out, in)`` weight either the forward
    (``W @ xᵀ``) or the backward (a transposed 2-D gradient copied into ``weight.grad``) pays a slow
    layout: 2x per step for the MLP's 784-input layer at 16 members. Values, shapes and the
    ``state_dict`` keys are the member's (:meth:`StackedModel.member_state_dict` returns contiguous
    copies).
    """

    beta: Tensor
    beta_sq: Tensor

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        kind = _exact_type(members)
        if kind not in (nn.Linear, PreNormAffine, DivergenceCorrectedLinear):
            raise NotStackableError(f"no stacked form for linear layer {kind.__name__}")
        lins: list[nn.Linear] = [m for m in members if isinstance(m, nn.Linear)]
        self.num_members = len(lins)
        self.in_features = _same(members, "in_features", [m.in_features for m in lins])
        self.out_features = _same(members, "out_features", [m.out_features for m in lins])
        weight_t = torch.stack([m.weight.detach().t() for m in lins])  # (K, in, out), contiguous
        self.weight = nn.Parameter(weight_t.transpose(1, 2))  # (K, out, in), see the class docstring
        self.bias = _param([m.bias for m in lins])
        self.prenorm: str | None = None
        self.eps = 0.0
        self.corrected = kind is DivergenceCorrectedLinear
        if kind is PreNormAffine:
            self.prenorm = _same(members, "kind", [m.kind for m in members])
            self.eps = _same(members, "eps", [m.eps for m in members])
        self.backward_sgd: BackwardSGD | None = None  # set by fit_stacked
        betas = [float(getattr(m, "beta", 1.0)) for m in members]
        self.register_buffer("beta", torch.tensor(betas).reshape(-1, 1, 1), persistent=False)
        self.register_buffer(
            "beta_sq", torch.tensor([b**2 for b in betas]).reshape(-1, 1, 1), persistent=False
        )

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.ndim == 3  # (K, N, in) already: no reshape (views cost autograd nodes too)
        x3 = x if flat else x.reshape(shape[0], -1, shape[-1])  # (K, N, in)
        weight = self.weight
        assert weight is not None
        if self.prenorm is not None:
            x3 = prenormalize(x3, self.prenorm, self.eps)
        bias = self.bias
        if self.corrected:
            denom = corrected_denominator(x3, self.beta_sq)
            z = self._affine(x3, weight, None if bias is None else self.beta[:, 0] * bias) / denom
        else:
            z = self._affine(x3, weight, bias)
        return z if flat else z.reshape(*shape[:-1], self.out_features)

    def _affine(self, x3: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        sgd = self.backward_sgd
        if (
            sgd is not None
            and sgd.lr is not None
            and not x3.requires_grad
            and bias is not None
            and bias.requires_grad  # the output needs a gradient (for the bias) to carry the hook
            and torch.is_grad_enabled()
        ):
            # The weight enters detached (autograd computes no ∂W); the hook on the output's gradient
            # applies the update (or writes the gradient), see BackwardSGD.
            z = self._matmul(x3, weight.detach(), bias)
            z.register_hook(functools.partial(self._update_weight, x3))
            return z
        return self._matmul(x3, weight, bias)

    @staticmethod
    def _matmul(x3: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        wt = weight.transpose(1, 2)  # (K, in, out), contiguous (the storage layout)
        if bias is None:
            return torch.bmm(x3, wt)
        return torch.baddbmm(bias.unsqueeze(1), x3, wt)

    @torch.no_grad()
    def _update_weight(self, x3: Tensor, grad: Tensor) -> None:
        """``∂z`` ``(K, N, out)`` of an affine whose weight entered detached: ``W -= lr xᵀ∂z`` in place
        (``∂Wᵀ = xᵀ∂z``, the weight's storage layout), or, disarmed, the plain gradient into ``.grad``."""
        sgd = self.backward_sgd
        weight = self.weight
        assert sgd is not None and weight is not None
        xt = x3.transpose(1, 2)
        if sgd.lr is not None:
            weight.transpose(1, 2).baddbmm_(xt, grad, alpha=-sgd.lr)
            sgd.updated.append(weight)
            return
        grad_w = torch.bmm(xt, grad).transpose(1, 2)  # (K, out, in) in the weight's layout
        if weight.grad is None:
            weight.grad = grad_w
        else:
            weight.grad.add_(grad_w)


# --------------------------------------------------------------------------------------------- token norms


class StackedLayerNorm(nn.Module):
    """K LayerNorms over the last dimension (``nn.LayerNorm`` or the registry's ``layernorm``)."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        lns = [m for m in members if isinstance(m, nn.LayerNorm)]
        if len(lns) != len(members):
            raise NotStackableError("StackedLayerNorm takes LayerNorm members only")
        shape = _same(members, "normalized_shape", [tuple(m.normalized_shape) for m in lns])
        if len(shape) != 1:
            raise NotStackableError(f"LayerNorm over {shape}: only a last-dimension LayerNorm stacks")
        self.dim = int(shape[0])
        self.normalized_shape = (self.dim,)
        self.eps = float(_same(members, "eps", [m.eps for m in lns]))
        self.weight = _param([m.weight for m in lns])
        self.bias = _param([m.bias for m in lns])

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        y = F.layer_norm(x, (self.dim,), None, None, self.eps)
        if self.weight is not None and self.bias is not None:
            return torch.addcmul(_bcast(self.bias, x.ndim), y, _bcast(self.weight, x.ndim))
        if self.weight is not None:
            y = y * _bcast(self.weight, x.ndim)
        if self.bias is not None:
            y = y + _bcast(self.bias, x.ndim)
        return y


class StackedRMSNorm(nn.Module):
    """K RMSNorms (the registry's ``rmsnorm``) over the last dimension."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        rms = [m for m in members if isinstance(m, nn.RMSNorm)]
        if len(rms) != len(members):
            raise NotStackableError("StackedRMSNorm takes RMSNorm members only")
        shape = _same(members, "normalized_shape", [tuple(m.normalized_shape) for m in rms])
        if len(shape) != 1:
            raise NotStackableError(f"RMSNorm over {shape}: only a last-dimension RMSNorm stacks")
        self.dim = int(shape[0])
        self.eps = _same(members, "eps", [m.eps for m in rms])
        self.weight = _param([m.weight for m in rms])

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        y = F.rms_norm(x, (self.dim,), None, self.eps)
        return y if self.weight is None else y * _bcast(self.weight, x.ndim)


class StackedDyT(nn.Module):
    """K DyT layers: ``alpha`` ``(K, 1)``, ``weight`` / ``bias`` ``(K, D)``.

    Computes DyT's own fused form ``2γ ⊙ σ(2αx) + (β − γ)`` (``fused=True``) or ``γ ⊙ tanh(αx) + β``.
    """

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        dyts = [m for m in members if isinstance(m, DyT)]
        if len(dyts) != len(members):
            raise NotStackableError("StackedDyT takes DyT members only")
        self.dim = _same(members, "dim", [m.dim for m in dyts])
        self.fused = _same(members, "fused", [m.fused for m in dyts])
        self.alpha = _param([m.alpha for m in dyts])
        self.weight = _param([m.weight for m in dyts])
        self.bias = _param([m.bias for m in dyts])

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        assert self.alpha is not None and self.weight is not None and self.bias is not None
        alpha = _bcast(self.alpha[:, 0], x.ndim)
        w, b = _bcast(self.weight, x.ndim), _bcast(self.bias, x.ndim)
        if self.fused:
            s = torch.sigmoid(x * (alpha * 2.0))
            return torch.addcmul(b - w, s, w * 2.0)
        return torch.tanh(alpha * x) * w + b


class _StackedIdentity(nn.Module):
    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        return x


class _StackedSelector(nn.Module):
    """AutoNorm's NormSelector per member: token mean -> fc1 -> ReLU -> fc2 -> logits ``(K, B, C)``."""

    def __init__(self, members: Sequence[Any]):
        super().__init__()
        self.fc1 = StackedLinear([m.fc1 for m in members])  # type: ignore[misc]
        self.fc2 = StackedLinear([m.fc2 for m in members])  # type: ignore[misc]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.fc2(F.relu(self.fc1(_pool_tokens(x, mask, members=True))))


class StackedMixture(nn.Module):
    """K AutoNorm (learned gate, Gumbel-Softmax, freezing) or RandomSelector layers.

    Per member: its own candidate norms, selector, noise stream, temperature ``tau``,
    ``frozen`` flag (AutoNorm-S) and ``sample_after_freeze``. ``last_probs`` ``(K, B, C)`` holds the
    noise-free gate probabilities of the last forward (what the separate fit's gate statistics read).
    Frozen members take the separate layer's fast path exactly: a batch whose every sample puts at least
    ``fast_path_threshold`` on one candidate outputs that candidate alone (and no gradient through the
    gate); frozen selectors receive gradients here, which the stacked optimizer masks out.
    """

    def __init__(self, members: Sequence[Any]):
        super().__init__()
        kind = _exact_type(members)
        self.learned = hasattr(members[0], "selector") and callable(getattr(members[0], "freeze", None))
        if not self.learned and kind is not RandomSelector:
            raise NotStackableError(f"no stacked form for mixture {kind.__name__}")
        self.num_members = len(members)
        self.candidates: tuple[str, ...] = _same(
            members, "candidates", [tuple(m.candidates) for m in members]
        )
        self.eval_mode: str = _same(members, "eval_mode", [m.eval_mode for m in members])
        self.branches = nn.ModuleList(
            stack_norm([m.branches[i] for m in members]) for i in range(len(self.candidates))
        )
        self.rngs = [NoiseStream(m.noise.seed) for m in members]
        self.last_probs: Tensor | None = None
        self.last_weights: Tensor | None = None
        if self.learned:
            if any(bool(m.hard) for m in members):
                raise NotStackableError("AutoNorm with hard=True (straight-through) has no stacked form")
            self.selector = _StackedSelector([m.selector for m in members])
            self.fast_path_threshold = float(
                _same(members, "fast_path_threshold", [m.fast_path_threshold for m in members])
            )
            self.taus = [float(m.tau) for m in members]
            self._tau: tuple[Any, Tensor] | None = None  # the taus as a (K, 1, 1) tensor
            self.frozen = [bool(m.frozen) for m in members]
            self.sample_after_freeze = [bool(m.sample_after_freeze) for m in members]

    def freeze(self, k: int, *, sample: bool) -> None:
        self.frozen[k] = True
        self.sample_after_freeze[k] = sample

    def _samples(self, k: int) -> bool:
        if not self.learned:
            return self.training or self.eval_mode == "sample"
        if self.training:
            return not self.frozen[k] or self.sample_after_freeze[k]
        return self.eval_mode == "sample"

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        if x.ndim not in (3, 4):
            raise ValueError(f"expected a (K, B, T, D) or (K, B, D) input, got shape {tuple(x.shape)}")
        K, B, C = self.num_members, x.shape[1], len(self.candidates)
        if not self.learned:
            weights = self._random_weights(K, B, C, x)
            self.last_weights = weights.detach()
            return self._mix(x, weights, mask)[0]
        sampling = [self._samples(k) for k in range(K)]
        logits = self.selector(x, mask)  # (K, B, C)
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        probs = logits.softmax(dim=-1)
        weights = probs
        if any(sampling):
            # AutoNorm's Gumbel noise from each member's generator, computed for all members at once
            fill = torch.full((B, C), 0.5, device=x.device)  # a member without noise: its soft is unused
            u = torch.stack([r.uniform((B, C), x.device) if s else fill for r, s in zip(self.rngs, sampling)])
            noise = gumbel(u, logits.dtype)
            key = (tuple(self.taus), logits.dtype, x.device)
            if self._tau is None or self._tau[0] != key:
                self._tau = (
                    key,
                    torch.tensor(self.taus, dtype=logits.dtype, device=x.device).reshape(K, 1, 1),
                )
            soft = ((logits + noise) / self._tau[1]).softmax(dim=-1)
            if all(sampling):
                weights = soft
            else:
                weights = torch.where(torch.tensor(sampling, device=x.device).reshape(K, 1, 1), soft, probs)
        if not self.training and self.eval_mode == "argmax":
            weights = F.one_hot(probs.argmax(dim=-1), C).to(probs.dtype)
        self.last_probs = probs.detach()
        self.last_weights = weights.detach()
        out, ys = self._mix(x, weights, mask)
        if any(self.frozen):
            # The separate layer's frozen fast path, member by member: one candidate for the whole batch.
            low = weights.detach().amin(dim=1)  # (K, C)
            for c in range(C):
                chosen = [self.frozen[k] and float(low[k, c]) >= self.fast_path_threshold for k in range(K)]
                if any(chosen):
                    sel = torch.tensor(chosen, device=x.device).reshape(K, *([1] * (x.ndim - 1)))
                    y = ys[c] if ys is not None else self.branches[c](x, mask=mask)
                    out = torch.where(sel, y.to(out.dtype), out)
        return out

    def _mix(self, x: Tensor, weights: Tensor, mask: Tensor | None) -> tuple[Tensor, list[Tensor] | None]:
        """``Σ_c w_c · branch_c(x)`` per member, and the branch outputs where they were computed: the
        candidates (DyT, LayerNorm), in that order, run the ordinary layer's fused plan
        (:func:`_fused_pair`, :class:`_MemberDyTLayerNormMix`; the same values as the expression it
        replaces), anything else the branches and :func:`_mix_outputs`."""
        pair = _fused_pair(self.branches, x, kinds=(StackedDyT, StackedLayerNorm), lead=1)
        if pair != (0, 1):  # (LayerNorm, DyT) mixes as lerp(LN, DyT, w_DyT): the reference expression
            ys = [branch(x, mask=mask) for branch in self.branches]
            return _mix_outputs(ys, weights), ys
        dyt: Any = self.branches[0]
        ln: Any = self.branches[1]
        out: Tensor = _MemberDyTLayerNormMix.apply(
            x, weights[..., 1], dyt.alpha, dyt.weight, dyt.bias, ln.weight, ln.bias, ln.eps
        )
        return out, None

    def _random_weights(self, K: int, B: int, C: int, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        if not self._samples(0):
            return torch.full((K, B, C), 1.0 / C, device=x.device, dtype=dtype)
        u = torch.stack([r.uniform((B, C if C > 2 else 1), x.device) for r in self.rngs])
        return simplex_weights(u.to(dtype), C)


def stack_norm(members: Sequence[nn.Module]) -> nn.Module:
    """The stacked form of K registry norms (token layout); raises :class:`NotStackableError` otherwise."""
    kind = _exact_type(members)
    if issubclass(kind, nn.LayerNorm) and kind in (nn.LayerNorm, _AnyLayerNorm):
        return StackedLayerNorm(members)
    if kind is RMSNorm or kind is nn.RMSNorm:
        return StackedRMSNorm(members)
    if kind is DyT:
        return StackedDyT(members)
    if kind is Identity or kind is nn.Identity:
        return _StackedIdentity()
    if kind is RandomSelector or (
        hasattr(members[0], "selector") and callable(getattr(members[0], "gate_probs", None))
    ):
        return StackedMixture(members)
    raise NotStackableError(
        f"norm {kind.__name__} has no stacked form (stacked: layernorm, rmsnorm, dyt, "
        "identity, autonorm, random_selector)"
    )


# ---------------------------------------------------------------------------------- other token layers


class StackedBatchNorm(nn.Module):
    """K BatchNorm1d (token layout ``(K, B, H)``) or BatchNorm2d (channel layout) with per-member statistics.

    One ``F.batch_norm`` over the members' channels side by side: statistics are per channel, so per
    member; the running statistics are ``(K, C)`` buffers (``num_batches_tracked`` ``(K,)``).
    """

    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(self, members: Sequence[nn.Module], *, layout: str):
        super().__init__()
        bns = [m for m in members if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if len(bns) != len(members) or not all(m.track_running_stats for m in bns):
            raise NotStackableError("BatchNorm without running statistics has no stacked form")
        self.layout = layout
        self.num_features = _same(members, "num_features", [m.num_features for m in bns])
        self.eps = _same(members, "eps", [m.eps for m in bns])
        self.momentum = _same(members, "momentum", [m.momentum for m in bns])
        if self.momentum is None:
            raise NotStackableError("BatchNorm with momentum=None (cumulative average) has no stacked form")
        self.weight = _param([m.weight for m in bns])
        self.bias = _param([m.bias for m in bns])
        self.register_buffer("running_mean", _stack([m.running_mean for m in bns]))
        self.register_buffer("running_var", _stack([m.running_var for m in bns]))
        self.register_buffer("num_batches_tracked", _stack([m.num_batches_tracked for m in bns]))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.num_batches_tracked.add_(1)
        w = None if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        if self.layout == "channels":
            return F.batch_norm(
                x,
                self.running_mean.view(-1),
                self.running_var.view(-1),
                w,
                b,
                self.training,
                self.momentum,
                self.eps,
            )
        K, B, H = x.shape
        y = F.batch_norm(
            x.transpose(0, 1).reshape(B, K * H),
            self.running_mean.view(-1),
            self.running_var.view(-1),
            w,
            b,
            self.training,
            self.momentum,
            self.eps,
        )
        return y.reshape(B, K, H).transpose(0, 1)


class StackedLayerScale(nn.Module):
    """K LayerScales: ``gamma`` ``(K, D)``."""

    def __init__(self, members: Sequence[Any]):
        super().__init__()
        self.gamma = _param([m.gamma for m in members])

    def forward(self, x: Tensor) -> Tensor:
        assert self.gamma is not None
        return x * _bcast(self.gamma, x.ndim)


class StackedDropPath(nn.Module):
    """K DropPaths of rate ``p``: member k's per-sample mask from member k's default-generator stand-in."""

    def __init__(self, members: Sequence[nn.Module], rng: MemberGenerators):
        super().__init__()
        self.p = float(_same(members, "p", [m.p for m in members]))
        self.rng = rng

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        shape = (x.shape[1],) + (1,) * (x.ndim - 2)  # (B, 1, 1): the separate layer's mask
        gens = self.rng.generators
        if gens is None:
            mask = x.new_empty((x.shape[0], *shape)).bernoulli_(keep)
        else:
            mask = torch.stack([x.new_empty(shape).bernoulli_(keep, generator=g) for g in gens])
        return x * mask / keep


def stack_token_layer(members: Sequence[nn.Module]) -> nn.Module:
    """The stacked form of K layers acting on ``(K, B, ..., D)`` tokens."""
    kind = _exact_type(members)
    if kind in (nn.Linear, PreNormAffine, DivergenceCorrectedLinear):
        return StackedLinear(members)
    if kind is nn.BatchNorm1d:
        return StackedBatchNorm(members, layout="tokens")
    if kind in _ELEMENTWISE:
        return members[0]
    return stack_norm(members)


# ------------------------------------------------------------------------------------------ channel layers


class StackedConv2d(nn.Module):
    """K ``nn.Conv2d`` (zero padding) or :class:`PatchNormConv2d` as one grouped convolution.

    Input and output in the channel layout ``(B, K*C, H, W)``; ``weight`` ``(K, out, in/groups, kh, kw)``.
    """

    _ones_kernel: Tensor

    def __init__(self, members: Sequence[Any]):
        super().__init__()
        kind = _exact_type(members)
        if kind not in (nn.Conv2d, PatchNormConv2d):
            raise NotStackableError(f"no stacked form for convolution {kind.__name__}")
        convs = [m for m in members if isinstance(m, nn.Conv2d)]
        self.num_members = len(convs)
        self.in_channels: int = _same(members, "in_channels", [m.in_channels for m in convs])
        self.out_channels: int = _same(members, "out_channels", [m.out_channels for m in convs])
        self.kernel_size: tuple[int, int] = _same(
            members, "kernel_size", [tuple(m.kernel_size) for m in convs]
        )
        self.stride: Any = _same(members, "stride", [m.stride for m in convs])
        self.padding: Any = _same(members, "padding", [m.padding for m in convs])
        self.dilation: Any = _same(members, "dilation", [m.dilation for m in convs])
        self.groups: int = _same(members, "groups", [m.groups for m in convs])
        if _same(members, "padding_mode", [m.padding_mode for m in convs]) != "zeros":
            raise NotStackableError("convolutions with padding_mode other than zeros have no stacked form")
        if isinstance(self.padding, str):
            raise NotStackableError("string padding has no stacked form")
        self.weight = _param([m.weight for m in convs])
        self.bias = _param([m.bias for m in convs])
        self.patchnorm = kind is PatchNormConv2d
        if self.patchnorm:
            self.bias_in_division = _same(members, "bias_in_division", [m.bias_in_division for m in members])
            self.patch_scale = _same(members, "patch_scale", [m.patch_scale for m in members])
            self.gain = _param([m.gain for m in members])
            kh, kw = self.kernel_size  # type: ignore[misc]
            self.register_buffer("_ones_kernel", torch.ones(self.num_members, 1, kh, kw), persistent=False)

    def _conv(self, x: Tensor, bias: Tensor | None) -> Tensor:
        assert self.weight is not None
        K = self.num_members
        w = self.weight.reshape(K * self.weight.shape[1], *self.weight.shape[2:])
        return F.conv2d(
            x,
            w,
            None if bias is None else bias.reshape(-1),
            self.stride,
            self.padding,  # type: ignore[arg-type]
            self.dilation,
            K * self.groups,  # type: ignore[arg-type,operator]
        )

    def forward(self, x: Tensor) -> Tensor:
        if not self.patchnorm:
            return self._conv(x, self.bias)
        K, B = self.num_members, x.shape[0]
        cin, cout = self.in_channels, self.out_channels  # type: ignore[has-type]
        sq = x.reshape(B, K, cin, *x.shape[2:]).pow(2).sum(dim=2)  # (B, K, H, W)
        kernel: Tensor = self._ones_kernel
        energy = F.conv2d(
            sq,
            kernel.to(sq.dtype),
            stride=self.stride,
            padding=self.padding,  # type: ignore[arg-type]
            dilation=self.dilation,
            groups=K,  # type: ignore[arg-type]
        )
        denom = torch.sqrt(energy + 1.0).unsqueeze(2)  # (B, K, 1, H', W')
        if self.bias_in_division or self.bias is None:
            z = self._conv(x, self.bias)
            z = z.reshape(B, K, cout, *z.shape[2:]) / denom
        else:
            z = self._conv(x, None)
            z = z.reshape(B, K, cout, *z.shape[2:]) / denom + self.bias.reshape(1, K, cout, 1, 1)
        if self.patch_scale:
            kh, kw = self.kernel_size  # type: ignore[misc]
            z = z * math.sqrt(cin * kh * kw)
        if self.gain is not None:
            z = z * self.gain.reshape(1, K, cout, 1, 1)
        return z.reshape(B, K * cout, *z.shape[3:])


class StackedGroupNorm(nn.Module):
    """K ``nn.GroupNorm(G, C)`` as one ``GroupNorm(K*G, K*C)``: groups never span two members."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        gns = [m for m in members if isinstance(m, nn.GroupNorm)]
        self.num_groups = _same(members, "num_groups", [m.num_groups for m in gns])
        self.num_channels = _same(members, "num_channels", [m.num_channels for m in gns])
        self.eps = _same(members, "eps", [m.eps for m in gns])
        self.weight = _param([m.weight for m in gns])
        self.bias = _param([m.bias for m in gns])
        self.num_members = len(gns)

    def forward(self, x: Tensor) -> Tensor:
        w = None if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.group_norm(x, self.num_members * self.num_groups, w, b, self.eps)


def stack_channel_layer(members: Sequence[nn.Module]) -> nn.Module:
    """The stacked form of K layers acting on ``(B, K*C, H, W)`` feature maps."""
    kind = _exact_type(members)
    if kind in (nn.Conv2d, PatchNormConv2d):
        return StackedConv2d(members)
    if kind is nn.BatchNorm2d:
        return StackedBatchNorm(members, layout="channels")
    if kind is nn.GroupNorm:
        return StackedGroupNorm(members)
    if kind in _ELEMENTWISE:
        return members[0]
    raise NotStackableError(f"no stacked form for convolutional-stage layer {kind.__name__}")
