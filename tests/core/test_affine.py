"""The affine divergence and its fixes, checked against the algebra of one real SGD step (float64)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.affine import (
    LINEAR_KINDS,
    DivergenceCorrectedLinear,
    PatchNormConv2d,
    PreNormAffine,
    affine_divergence_factor,
    create_linear,
)

N_IN, N_OUT, LR = 7, 5, 0.03


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sample(seed: int = 0, scale: float = 2.0) -> tuple[Tensor, Tensor]:
    """One input with ‖x‖² far from 0 and 1 (so the factor is visible) and an upstream gradient g."""
    x = torch.randn(1, N_IN, generator=_gen(seed), dtype=torch.float64) * scale
    g = torch.randn(1, N_OUT, generator=_gen(seed + 100), dtype=torch.float64)
    return x, g


def _sgd_step_delta(layer: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    """Δz after one real ``torch.optim.SGD`` step on the loss ⟨g, z⟩ (so ∂L/∂z = g exactly)."""
    layer = layer.double()
    opt = torch.optim.SGD(layer.parameters(), lr=LR)
    z0 = layer(x)
    (z0 * g).sum().backward()
    opt.step()
    with torch.no_grad():
        return layer(x) - z0.detach()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sgd_step_on_plain_linear_overshoots_by_the_affine_divergence(seed: int) -> None:
    x, g = _sample(seed)
    delta = _sgd_step_delta(nn.Linear(N_IN, N_OUT), x, g)
    expected = -LR * g * affine_divergence_factor(x)[:, None]
    torch.testing.assert_close(delta, expected, rtol=0, atol=1e-10)
    assert affine_divergence_factor(x).item() > 5  # the identity is not trivially ≈ −η g


@pytest.mark.parametrize("beta", [1.0, 0.3, 2.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_sgd_step_on_corrected_linear_is_steepest_descent(beta: float, seed: int) -> None:
    x, g = _sample(seed)
    delta = _sgd_step_delta(DivergenceCorrectedLinear(N_IN, N_OUT, beta=beta), x, g)
    torch.testing.assert_close(delta, -LR * g, rtol=0, atol=1e-10)


def test_corrected_linear_without_bias_is_only_partially_corrected() -> None:
    x, g = _sample(3)
    beta = 0.5
    delta = _sgd_step_delta(DivergenceCorrectedLinear(N_IN, N_OUT, beta=beta, bias=False), x, g)
    sq = x.pow(2).sum()
    torch.testing.assert_close(delta, -LR * g * sq / (sq + beta**2), rtol=0, atol=1e-10)


@pytest.mark.parametrize(("kind", "factor"), [("l2", 2.0), ("rms", N_IN + 1.0)])
def test_sgd_step_on_prenorm_affine_has_a_constant_factor(kind: str, factor: float) -> None:
    for scale in (0.1, 3.0):  # the factor must not depend on the input norm
        x, g = _sample(4, scale=scale)
        delta = _sgd_step_delta(PreNormAffine(N_IN, N_OUT, kind=kind), x, g)
        torch.testing.assert_close(delta, -LR * g * factor, rtol=0, atol=1e-10)


def test_affine_divergence_factor_per_sample_and_per_token() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert torch.equal(affine_divergence_factor(x), torch.tensor([26.0, 1.0]))
    assert affine_divergence_factor(torch.ones(2, 3, 4)).shape == (2, 3)


def test_corrected_linear_matches_its_formula_and_is_not_scale_invariant() -> None:
    layer = DivergenceCorrectedLinear(N_IN, N_OUT, beta=0.7).double()
    x = torch.randn(3, 4, N_IN, generator=_gen(0), dtype=torch.float64)
    expected = (x @ layer.weight.T + 0.7 * layer.bias) / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 0.49)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(layer(3 * x), layer(x))


@pytest.mark.parametrize("kind", ["l2", "rms"])
def test_prenorm_affine_is_scale_invariant_and_finite_at_zero(kind: str) -> None:
    layer = PreNormAffine(N_IN, N_OUT, kind=kind).double()
    x = torch.randn(3, N_IN, generator=_gen(0), dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer(5.0 * x), rtol=1e-12, atol=1e-12)
    norm = math.sqrt(N_IN) if kind == "rms" else 1.0
    expected = norm * x / x.norm(dim=-1, keepdim=True) @ layer.weight.T + layer.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(layer(torch.zeros(2, N_IN, dtype=torch.float64))).all()


def test_parameters_are_shaped_like_torch_layers() -> None:
    ref_lin = nn.Linear(N_IN, N_OUT)
    for layer in (PreNormAffine(N_IN, N_OUT), DivergenceCorrectedLinear(N_IN, N_OUT)):
        assert {k: v.shape for k, v in layer.state_dict().items()} == {
            k: v.shape for k, v in ref_lin.state_dict().items()
        }
    ref_conv = nn.Conv2d(3, 4, (2, 3))
    assert {k: v.shape for k, v in PatchNormConv2d(3, 4, (2, 3)).state_dict().items()} == {
        k: v.shape for k, v in ref_conv.state_dict().items()
    }


# -- PatchNormConv2d -----------------------------------------------------------------------------------------

CONV_CONFIGS = [
    {"kernel_size": 3, "stride": 1, "padding": 0, "dilation": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 0), "dilation": 1},
]


def _unfold_reference(layer: PatchNormConv2d, x: Tensor) -> tuple[Tensor, Tensor]:
    """Brute force: every receptive-field patch explicitly, its ‖P‖² and ⟨W_o, P⟩."""
    patches = F.unfold(
        x, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride
    )
    b = x.shape[0]
    # Output size from nn.Conv2d's own arithmetic; the reshape below fails if unfold disagrees.
    h_out, w_out = nn.functional.conv2d(
        x, layer.weight, None, layer.stride, layer.padding, layer.dilation
    ).shape[-2:]
    denom = torch.sqrt(patches.pow(2).sum(1) + 1.0).reshape(b, 1, h_out, w_out)
    dots = (layer.weight.reshape(layer.out_channels, -1) @ patches).reshape(b, -1, h_out, w_out)
    return denom, dots


@pytest.mark.parametrize("config", CONV_CONFIGS)
def test_patchnorm_denominator_equals_brute_force_unfold(config: dict) -> None:
    layer = PatchNormConv2d(3, 4, **config).double()
    x = torch.randn(2, 3, 9, 10, generator=_gen(0), dtype=torch.float64)
    denom, dots = _unfold_reference(layer, x)
    torch.testing.assert_close(layer.patch_denominator(x), denom, rtol=1e-12, atol=1e-12)
    assert layer.bias is not None
    expected = (dots + layer.bias.reshape(1, -1, 1, 1)) / denom
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_patchnorm_options() -> None:
    x = torch.randn(2, 3, 6, 6, generator=_gen(1), dtype=torch.float64)
    base = PatchNormConv2d(3, 4, 3, padding=1).double()
    denom, dots = _unfold_reference(base, x)
    assert base.bias is not None
    bias = base.bias.reshape(1, -1, 1, 1)

    outside = PatchNormConv2d(3, 4, 3, padding=1, bias_in_division=False).double()
    outside.load_state_dict(base.state_dict())
    torch.testing.assert_close(outside(x), dots / denom + bias, rtol=1e-12, atol=1e-12)

    scaled = PatchNormConv2d(3, 4, 3, padding=1, patch_scale=True).double()
    scaled.load_state_dict(base.state_dict())
    torch.testing.assert_close(scaled(x), base(x) * math.sqrt(3 * 3 * 3), rtol=1e-12, atol=1e-12)

    gained = PatchNormConv2d(3, 4, 3, padding=1, learnable_gain=True).double()
    assert gained.gain is not None and torch.equal(gained.gain, torch.ones(4, dtype=torch.float64))
    with torch.no_grad():
        gained.gain.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    gained.load_state_dict({**base.state_dict(), "gain": gained.gain.detach().clone()})
    torch.testing.assert_close(gained(x), base(x) * gained.gain.reshape(1, -1, 1, 1), rtol=1e-12, atol=1e-12)
    gained(x).sum().backward()
    assert gained.gain.grad is not None and gained.gain.grad.abs().sum() > 0

    with pytest.raises(ValueError):
        PatchNormConv2d(3, 4, 3, padding="same")  # type: ignore[arg-type]


def test_patchnorm_sgd_step_is_corrected_for_a_single_location() -> None:
    # A 1×1 output location is exactly a DivergenceCorrectedLinear on the flattened patch.
    layer = PatchNormConv2d(2, 3, 3).double()
    x = torch.randn(1, 2, 3, 3, generator=_gen(2), dtype=torch.float64) * 2
    g = torch.randn(1, 3, 1, 1, generator=_gen(3), dtype=torch.float64)
    delta = _sgd_step_delta(layer, x, g)
    torch.testing.assert_close(delta, -LR * g, rtol=0, atol=1e-10)


# -- factory -------------------------------------------------------------------------------------------------


def test_create_linear_builds_every_kind() -> None:
    expected = {
        "linear": nn.Linear,
        "prenorm_l2": PreNormAffine,
        "prenorm_rms": PreNormAffine,
        "corrected": DivergenceCorrectedLinear,
    }
    assert set(LINEAR_KINDS) == set(expected)
    x = torch.randn(2, 3, N_IN, generator=_gen(0))
    for kind in LINEAR_KINDS:
        layer = create_linear(kind, N_IN, N_OUT, bias=False, beta=0.5)
        assert type(layer) is expected[kind]
        assert layer(x).shape == (2, 3, N_OUT)
        assert getattr(layer, "bias", "missing") is None
    assert create_linear("prenorm_rms", N_IN, N_OUT).kind == "rms"  # type: ignore[union-attr]
    assert create_linear("corrected", N_IN, N_OUT, beta=0.5).beta == 0.5  # type: ignore[union-attr]


def test_create_linear_rejects_unknown_kind_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        create_linear("batchnorm", N_IN, N_OUT)
    assert all(kind in str(info.value) for kind in LINEAR_KINDS)
    with pytest.raises(ValueError):
        DivergenceCorrectedLinear(N_IN, N_OUT, beta=0.0)
    with pytest.raises(ValueError):
        PreNormAffine(N_IN, N_OUT, kind="l1")
