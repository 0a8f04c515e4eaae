"""Affine layers that remove the "affine divergence" (docs/science.md, "The affine divergence").

For ``z = W x + b`` and ``g = ∂L/∂z``, one SGD step on one sample moves the activation by
``Δz = −η g (‖x‖² + 1)`` instead of the steepest-descent ``−η g``: the effective learning rate grows
with the squared input norm (:func:`affine_divergence_factor`). Each fix is its own module with an
explicit name; ``weight`` and ``bias`` are shaped as in ``nn.Linear`` / ``nn.Conv2d`` (the modules
subclass them, so initialisation, ``extra_repr`` and weight-decay grouping carry over).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

__all__ = [
    "LINEAR_KINDS",
    "DivergenceCorrectedLinear",
    "PatchNormConv2d",
    "PreNormAffine",
    "affine_divergence_factor",
    "corrected_denominator",
    "create_linear",
    "prenormalize",
]

LINEAR_KINDS = ("linear", "prenorm_l2", "prenorm_rms", "corrected")


def affine_divergence_factor(x: Tensor) -> Tensor:
    """``‖x‖² + 1`` over the last dimension: how much one SGD step on a plain affine layer overshoots.

    Shape: ``x.shape[:-1]`` (one factor per sample, or per token for ``(B, T, D)``).
    """
    return x.pow(2).sum(dim=-1) + 1.0


def prenormalize(x: Tensor, kind: str, eps: float) -> Tensor:
    """:class:`PreNormAffine`'s input ``x / ‖x‖`` (``l2``) or ``√n · x / ‖x‖`` (``rms``), last dimension."""
    x_hat = F.normalize(x, p=2.0, dim=-1, eps=eps)
    return x_hat * math.sqrt(x.shape[-1]) if kind == "rms" else x_hat


def corrected_denominator(x: Tensor, beta_sq: float | Tensor) -> Tensor:
    """:class:`DivergenceCorrectedLinear`'s ``sqrt(‖x‖² + β²)`` over the last dimension (kept)."""
    return torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + beta_sq)


class PreNormAffine(nn.Linear):
    """``z = W x̂ + b`` with ``x̂ = x / ‖x‖`` (``kind="l2"``) or ``√n · x / ‖x‖`` (``kind="rms"``).

    The divergence factor becomes the constant 2 (``l2``) or ``n + 1`` (``rms``) that the learning rate
    absorbs. Scale invariant, so the input's radius is lost. Initialisation is ``nn.Linear``'s; with
    ``kind="rms"`` the pre-activations then have the scale of a plain Linear on unit-variance inputs.

    Args:
        in_features: input size ``n``.
        out_features: output size.
        kind: ``"l2"`` or ``"rms"``.
        bias: learn ``b``.
        eps: lower bound on ``‖x‖`` (as in ``F.normalize``), so a zero input gives zero instead of NaN.
    """

    KINDS = ("l2", "rms")

    def __init__(
        self, in_features: int, out_features: int, *, kind: str = "l2", bias: bool = True, eps: float = 1e-12
    ):
        if kind not in self.KINDS:
            raise ValueError(f"unknown PreNormAffine kind {kind!r}; valid: {', '.join(self.KINDS)}")
        super().__init__(in_features, out_features, bias=bias)
        self.kind = kind
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(prenormalize(x, self.kind, self.eps), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kind={self.kind!r}"


class DivergenceCorrectedLinear(nn.Linear):
    """``z = (W x + β b) / sqrt(‖x‖² + β²)``: the non-normalizing fix.

    One SGD step on one sample moves ``z`` by exactly ``−η g``: the gradient of ``W`` carries
    ``x / s`` and that of ``b`` carries ``β / s`` with ``s² = ‖x‖² + β²``, so ``Δz = −η g (‖x‖² + β²) / s²``.
    Keeps every degree of freedom, needs no ε, no extra parameter and no batch statistics, and is NOT
    scale invariant. Without a bias the step becomes ``−η g ‖x‖² / (‖x‖² + β²)``: the correction is
    exact only with ``bias=True``.

    Args:
        in_features: input size.
        out_features: output size.
        beta: weight of the bias "input" (1.0); must be positive.
        bias: learn ``b``.
    """

    def __init__(self, in_features: int, out_features: int, *, beta: float = 1.0, bias: bool = True):
        if not beta > 0.0:
            raise ValueError(f"beta must be positive, got {beta}")
        super().__init__(in_features, out_features, bias=bias)
        self.beta = float(beta)

    def forward(self, x: Tensor) -> Tensor:
        denom = corrected_denominator(x, self.beta**2)
        bias = None if self.bias is None else self.beta * self.bias
        return F.linear(x, self.weight, bias) / denom

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta}"


class PatchNormConv2d(nn.Conv2d):
    """``z[o, p] = (⟨W_o, P_p(x)⟩ + b_o) / sqrt(‖P_p(x)‖² + 1)``, ``P_p`` the receptive field at ``p``.

    The denominator is ``conv2d(Σ_c x², ones(1, 1, kh, kw))`` with the convolution's own stride, padding
    and dilation: one value per sample and location, shared over output channels. The protocol's
    open choices are options, defaults as written there.

    Args:
        in_channels, out_channels, kernel_size: as ``nn.Conv2d``.
        stride, padding, dilation: as ``nn.Conv2d`` (integers or pairs; zero padding).
        bias: learn ``b``.
        bias_in_division: ``True`` divides ``⟨W, P⟩ + b`` (protocol); ``False`` adds ``b`` after.
        patch_scale: multiply by ``√(C·kh·kw)``, the RMS counterpart of the plain L2 patch norm.
        learnable_gain: a per-output-channel gain (init 1) applied last.
    """

    _ones_kernel: Tensor

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        *,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        bias_in_division: bool = True,
        patch_scale: bool = False,
        learnable_gain: bool = False,
    ):
        if isinstance(padding, str):
            raise ValueError("PatchNormConv2d takes integer padding (the denominator mirrors it)")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            bias=bias,
        )
        self.bias_in_division = bias_in_division
        self.patch_scale = patch_scale
        self.learnable_gain = learnable_gain
        self.gain: nn.Parameter | None = nn.Parameter(torch.ones(out_channels)) if learnable_gain else None
        # A fixed all-ones kernel; a buffer so it follows .to(device/dtype), not saved in the state_dict.
        self.register_buffer("_ones_kernel", torch.ones(1, 1, *_pair(kernel_size)), persistent=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if getattr(self, "gain", None) is not None:
            nn.init.ones_(self.gain)  # type: ignore[arg-type]

    def patch_denominator(self, x: Tensor) -> Tensor:
        """``sqrt(‖P_p(x)‖² + 1)`` per sample and output location, shape ``(B, 1, H_out, W_out)``."""
        sq = x.pow(2).sum(dim=1, keepdim=True)  # (B, 1, H, W)
        kernel: Tensor = self._ones_kernel
        energy = F.conv2d(
            sq, kernel.to(sq.dtype), stride=self.stride, padding=self.padding, dilation=self.dilation
        )
        return torch.sqrt(energy + 1.0)

    def forward(self, x: Tensor) -> Tensor:
        denom = self.patch_denominator(x)
        if self.bias_in_division or self.bias is None:
            z = self._conv_forward(x, self.weight, self.bias) / denom
        else:
            z = self._conv_forward(x, self.weight, None) / denom + self.bias.reshape(1, -1, 1, 1)
        if self.patch_scale:
            kh, kw = self.kernel_size
            z = z * math.sqrt(self.in_channels * kh * kw)
        if self.gain is not None:
            z = z * self.gain.reshape(1, -1, 1, 1)
        return z

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bias_in_division={self.bias_in_division}, "
            f"patch_scale={self.patch_scale}, learnable_gain={self.learnable_gain}"
        )


def create_linear(
    kind: str, in_features: int, out_features: int, *, bias: bool = True, beta: float = 1.0
) -> nn.Module:
    """Build the affine layer a search names: the divergence-fix variant of a model's linears.

    Args:
        kind: one of :data:`LINEAR_KINDS`: ``"linear"`` (plain ``nn.Linear``), ``"prenorm_l2"``,
            ``"prenorm_rms"`` (:class:`PreNormAffine`), ``"corrected"``
            (:class:`DivergenceCorrectedLinear`).
        in_features: input size.
        out_features: output size.
        bias: learn a bias.
        beta: ``β`` of the corrected layer; ignored by the other kinds (a search samples it only when
            ``kind == "corrected"``).

    Raises:
        ValueError: for an unknown kind, listing the valid ones.
    """
    if kind == "linear":
        return nn.Linear(in_features, out_features, bias=bias)
    if kind == "prenorm_l2":
        return PreNormAffine(in_features, out_features, kind="l2", bias=bias)
    if kind == "prenorm_rms":
        return PreNormAffine(in_features, out_features, kind="rms", bias=bias)
    if kind == "corrected":
        return DivergenceCorrectedLinear(in_features, out_features, beta=beta, bias=bias)
    raise ValueError(f"unknown linear kind {kind!r}; valid: {', '.join(LINEAR_KINDS)}")
