"""Contract suite: every norm in the registry must pass these, including norms registered later.

Each test is parametrized over ``list_norms()``. A new norm also needs a float64 reference formula in
``_REFERENCES`` below; its absence fails ``test_float64_matches_reference_formula`` on purpose.
The end of the file holds the formula-specific checks (DyT's fused backward, AdaNorm's detached
factor, FiLM = LayerNorm at init).
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.norms import (
    AdaNorm,
    AutoNorm,
    DyT,
    FiLMNorm,
    LayerNorm,
    RandomSelector,
    create_norm,
    get_norm_layer,
    list_norms,
    register_norm,
)

NORMS = list_norms()
DIM = 8
SHAPES = [(3, 5, DIM), (4, DIM)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _input(shape: tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    # Non-zero mean and non-unit scale so that centring and scaling actually matter.
    return (torch.randn(shape, generator=_gen(seed)) * 1.7 + 0.4).to(dtype)


def _perturb(module: nn.Module, seed: int = 1, scale: float = 0.3) -> None:
    """Move every parameter away from its init: zero-initialised layers (selector, FiLM output) would
    otherwise hide disconnected gradients, and γ=1/β=0 would hide a missing affine."""
    gen = _gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale)


def _make(name: str, dim: int = DIM) -> nn.Module:
    module = create_norm(name, dim)
    if hasattr(module, "manual_seed"):
        module.manual_seed(1234)
    return module


def test_registry_has_the_protocol_norms() -> None:
    required = {"layernorm", "rmsnorm", "dyt", "adanorm", "film", "autonorm", "random_selector", "identity"}
    assert required <= set(NORMS)


def test_unknown_name_raises_value_error_listing_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        create_norm("batchnorm_typo", DIM)
    for name in NORMS:
        assert name in str(info.value)
    with pytest.raises(ValueError):
        get_norm_layer("LayerNorm")  # names are exact


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_norm("layernorm")(LayerNorm)


def test_layernorm_is_torch_layernorm() -> None:
    assert isinstance(create_norm("layernorm", DIM), nn.LayerNorm)


@pytest.mark.parametrize("name", NORMS)
def test_signature_dim_first_then_keyword_only_with_defaults(name: str) -> None:
    params = list(inspect.signature(get_norm_layer(name).__init__).parameters.values())[1:]
    assert params[0].name == "dim"
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for p in params[1:]:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
        assert p.default is not inspect.Parameter.empty, p.name


@pytest.mark.parametrize("name", NORMS)
def test_extra_repr_starts_with_dim(name: str) -> None:
    first = create_norm(name, 12).extra_repr().split(",")[0]
    assert re.search(r"\b12\b", first), first


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=["BTD", "BD"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_shape_kept_and_output_finite(name: str, shape: tuple[int, ...], training: bool) -> None:
    module = _make(name)
    _perturb(module)
    module.train(training)
    for scale in (1.0, 1e3, 1e-3):
        y = module(_input(shape) * scale)
        assert y.shape == shape
        assert torch.isfinite(y).all(), scale


@pytest.mark.parametrize("name", NORMS)
def test_bf16_autocast_keeps_shape_and_is_finite(name: str) -> None:
    module = _make(name)
    x = _input(SHAPES[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x)
    assert y.shape == x.shape
    assert torch.isfinite(y.float()).all()


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=["BTD", "BD"])
def test_gradients_reach_every_parameter_and_the_input(name: str, shape: tuple[int, ...]) -> None:
    module = _make(name).train()
    _perturb(module)
    x = _input(shape).requires_grad_(True)
    (module(x) * torch.randn(shape, generator=_gen(7))).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in module.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NORMS)
def test_state_dict_round_trip(name: str) -> None:
    source = _make(name)
    _perturb(source, seed=3)
    target = _make(name)
    x = _input(SHAPES[0])
    source.eval()
    target.eval()
    if any(True for _ in source.parameters()):
        assert not torch.equal(source(x), target(x))  # otherwise the round trip proves nothing
    target.load_state_dict(source.state_dict())
    assert source.state_dict().keys() == target.state_dict().keys()
    assert torch.equal(source(x), target(x))
    source.train()
    target.train()
    assert torch.equal(source(x), target(x))  # same seed, same parameters: same training output too


@pytest.mark.parametrize("name", NORMS)
def test_eval_is_deterministic(name: str) -> None:
    module = _make(name)
    _perturb(module)
    module.eval()
    x = _input(SHAPES[0])
    assert torch.equal(module(x), module(x))


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_forward_never_touches_the_global_rng(name: str, training: bool) -> None:
    module = _make(name).train(training)
    before = torch.get_rng_state()
    module(_input(SHAPES[0]))
    module(_input(SHAPES[1]))
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("name", NORMS)
def test_reset_parameters_restores_the_init(name: str) -> None:
    torch.manual_seed(0)
    fresh_a = create_norm(name, DIM)
    torch.manual_seed(1)
    fresh_b = create_norm(name, DIM)
    module = create_norm(name, DIM)
    _perturb(module)
    perturbed = copy.deepcopy(module.state_dict())
    module.reset_parameters()  # type: ignore[operator]
    for key, value in module.state_dict().items():
        a, b = fresh_a.state_dict()[key], fresh_b.state_dict()[key]
        if torch.equal(a, b):  # deterministic init (ones, zeros, α=0.5): must come back exactly
            assert torch.equal(value, a), key
        else:  # random init: must at least be redrawn
            assert not torch.equal(value, perturbed[key]), key


@pytest.mark.parametrize("name", NORMS)
def test_torch_compile_matches_eager(name: str) -> None:
    module = _make(name)
    _perturb(module)
    module.eval()
    x = _input((2, 3, DIM))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    compiled = torch.compile(module)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(x, mask=mask), module(x, mask=mask), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Padding mask: every norm takes ``mask`` (B, T), True at real tokens; pooling norms average over real
# tokens only, per-token norms ignore it. The properties below hold for both kinds.
# ---------------------------------------------------------------------------------------------------------

LENGTHS = [5, 2, 3]  # real tokens per sample of a (3, 5, DIM) batch; sample 0 has no padding


def _padding_mask(lengths: list[int], t: int) -> Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)


def _with_padding(x: Tensor, mask: Tensor, fill: Tensor) -> Tensor:
    return torch.where(mask[..., None], x, fill)


@pytest.mark.parametrize("name", NORMS)
def test_all_true_mask_equals_no_mask(name: str) -> None:
    module = _make(name)
    _perturb(module)
    module.eval()
    x = _input(SHAPES[0])
    torch.testing.assert_close(module(x, mask=torch.ones(x.shape[:2], dtype=torch.bool)), module(x))


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_padding_content_never_reaches_real_positions(name: str, training: bool) -> None:
    module = _make(name)
    _perturb(module)
    module.train(training)
    mask = _padding_mask(LENGTHS, 5)
    x = _input((3, 5, DIM))
    outs = []
    for fill in (torch.zeros(()), _input((3, 5, DIM), seed=9) * 1e3, torch.tensor(float("nan"))):
        if hasattr(module, "manual_seed"):
            module.manual_seed(5)  # the same noise for every padding content
        outs.append(module(_with_padding(x, mask, fill), mask=mask))
    for out in outs[1:]:
        assert torch.equal(out[mask], outs[0][mask])  # bit-identical, even with NaN padding


@pytest.mark.parametrize("name", NORMS)
def test_padded_batch_equals_each_unpadded_sequence(name: str) -> None:
    module = _make(name).double()
    _perturb(module)
    module.eval()
    mask = _padding_mask(LENGTHS, 5)
    x = _input((3, 5, DIM), dtype=torch.float64)
    with torch.no_grad():
        padded = module(x, mask=mask)
        for i, n in enumerate(LENGTHS):
            alone = module(x[i : i + 1, :n])  # no padding, no mask
            torch.testing.assert_close(padded[i, :n], alone[0], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# float64 reference formulas, written independently of the implementation
# ---------------------------------------------------------------------------------------------------------


def _ref_layernorm(m: nn.Module, x: Tensor) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased, as torch's LayerNorm
    return (x - mu) / torch.sqrt(var + m.eps) * m.weight + m.bias


def _ref_rmsnorm(m: nn.Module, x: Tensor) -> Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + m.eps) * m.weight


def _ref_dyt(m: nn.Module, x: Tensor) -> Tensor:
    return m.weight * torch.tanh(m.alpha * x) + m.bias


def _ref_adanorm(m: nn.Module, x: Tensor) -> Tensor:
    n = x.shape[-1]
    mu = x.mean(-1, keepdim=True)
    sigma = torch.sqrt(((x - mu) ** 2).sum(-1, keepdim=True) / (n - 1))
    y = (x - mu) / (sigma + 1e-5)
    return 2.0 * (1.0 - 0.1 * y) * y


def _mlp(fc1: nn.Linear, fc2: nn.Linear, x: Tensor) -> Tensor:
    pooled = x.mean(1) if x.ndim == 3 else x
    hidden = torch.clamp(pooled @ fc1.weight.T + fc1.bias, min=0.0)
    return hidden @ fc2.weight.T + fc2.bias


def _ref_film(m: nn.Module, x: Tensor) -> Tensor:
    cond = _mlp(m.fc1, m.fc2, x)
    d_gamma, beta = cond[:, :DIM], cond[:, DIM:]
    if x.ndim == 3:
        d_gamma, beta = d_gamma[:, None, :], beta[:, None, :]
    mu = x.mean(-1, keepdim=True)
    normed = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
    return (1.0 + d_gamma) * normed + beta


def _ref_mixture(m: nn.Module, x: Tensor, weights: Tensor) -> Tensor:
    out = torch.zeros_like(x)
    for k, (name, branch) in enumerate(zip(m.candidates, m.branches)):
        w = weights[:, k].reshape(-1, *([1] * (x.ndim - 1)))
        out = out + w * _REFERENCES[name](branch, x)
    return out


def _ref_autonorm(m: nn.Module, x: Tensor) -> Tensor:  # eval, eval_mode="softmax"
    logits = _mlp(m.selector.fc1, m.selector.fc2, x)
    probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    return _ref_mixture(m, x, probs)


def _ref_random_selector(m: nn.Module, x: Tensor) -> Tensor:  # eval, eval_mode="mean"
    k = len(m.candidates)
    return _ref_mixture(m, x, torch.full((x.shape[0], k), 1.0 / k, dtype=x.dtype))


_REFERENCES: dict[str, Callable[[nn.Module, Tensor], Tensor]] = {
    "layernorm": _ref_layernorm,
    "rmsnorm": _ref_rmsnorm,
    "dyt": _ref_dyt,
    "adanorm": _ref_adanorm,
    "film": _ref_film,
    "identity": lambda m, x: x,
    "autonorm": _ref_autonorm,
    "random_selector": _ref_random_selector,
}


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=["BTD", "BD"])
def test_float64_matches_reference_formula(name: str, shape: tuple[int, ...]) -> None:
    assert name in _REFERENCES, f"add a float64 reference formula for the new norm {name!r}"
    module = _make(name).double()
    _perturb(module)
    module.eval()
    x = _input(shape, dtype=torch.float64)
    with torch.no_grad():
        expected = _REFERENCES[name](module, x)
        actual = module(x)
    assert actual.dtype == torch.float64
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------------------
# Formula-specific checks
# ---------------------------------------------------------------------------------------------------------


def test_dyt_parameters_follow_the_official_implementation() -> None:
    m = DyT(DIM)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == {
        "alpha": (1,),
        "weight": (DIM,),
        "bias": (DIM,),
    }
    assert (
        m.alpha.item() == 0.5
        and torch.equal(m.weight, torch.ones(DIM))
        and torch.equal(m.bias, torch.zeros(DIM))
    )


def test_dyt_fused_backward_passes_gradcheck() -> None:
    m = DyT(5).double()
    _perturb(m)
    x = _input((2, 3, 5), dtype=torch.float64).requires_grad_(True)
    assert "DyTFunction" in type(m(x).grad_fn).__name__  # the custom backward is the one checked
    inputs = (x, m.alpha, m.weight, m.bias)
    assert torch.autograd.gradcheck(_dyt_apply, inputs)
    y = _dyt_apply(*inputs).sum()
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    with pytest.raises(RuntimeError):  # first order only, by design: no silently wrong Hessian
        gx.sum().backward()


def _dyt_apply(x: Tensor, alpha: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    from autonorm_core.norms.simple import _DyTFunction

    out: Tensor = _DyTFunction.apply(x, alpha, weight, bias)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=["BTD", "BD"])
def test_dyt_fused_equals_naive_in_values_and_gradients(shape: tuple[int, ...]) -> None:
    fused, naive = DyT(DIM, fused=True), DyT(DIM, fused=False)
    _perturb(fused)
    naive.load_state_dict(fused.state_dict())
    grads = []
    for m in (fused, naive):
        x = _input(shape).requires_grad_(True)
        y = m(x)
        (y * torch.randn(shape, generator=_gen(5))).sum().backward()
        grads.append([y, x.grad, *(p.grad for p in m.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_adanorm_factor_carries_no_gradient() -> None:
    m = AdaNorm(DIM).double()
    x = _input((3, 5, DIM), dtype=torch.float64)
    g = torch.randn(3, 5, DIM, generator=_gen(2), dtype=torch.float64)

    def grad_of(fn: Callable[[Tensor], Tensor]) -> Tensor:
        xx = x.clone().requires_grad_(True)
        (fn(xx) * g).sum().backward()
        assert xx.grad is not None
        return xx.grad

    def reference(xx: Tensor, *, detach: bool) -> Tensor:
        mu = xx.mean(-1, keepdim=True)
        y = (xx - mu) / (xx.std(-1, keepdim=True) + 1e-5)
        factor = 1.0 - 0.1 * y
        return 2.0 * (factor.detach() if detach else factor) * y

    actual = grad_of(m)
    torch.testing.assert_close(actual, grad_of(lambda xx: reference(xx, detach=True)), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(actual, grad_of(lambda xx: reference(xx, detach=False)), atol=1e-6)


def test_film_conditions_on_the_mean_of_real_tokens_only() -> None:
    film = FiLMNorm(DIM).double()
    _perturb(film)
    mask = _padding_mask(LENGTHS, 5)
    x = _input((3, 5, DIM), dtype=torch.float64)
    m = mask[..., None].double()
    real_mean = (x * m).sum(1) / m.sum(1)  # (B, D)
    cond = _mlp(film.fc1, film.fc2, real_mean)
    normed = F.layer_norm(x, (DIM,))
    expected = (1.0 + cond[:, None, :DIM]) * normed + cond[:, None, DIM:]
    with torch.no_grad():
        actual = film(x, mask=mask)
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
        # The plain mean over all positions (padding included) gives another output: the mask matters.
        assert not torch.allclose(film(x)[mask], actual[mask], atol=1e-6)


def test_film_equals_layernorm_at_init() -> None:
    film, ln = FiLMNorm(DIM), nn.LayerNorm(DIM)
    for shape in SHAPES:
        x = _input(shape)
        torch.testing.assert_close(film(x), ln(x), rtol=0, atol=1e-6)


def test_mixtures_build_their_candidates_from_the_registry() -> None:
    for cls in (AutoNorm, RandomSelector):
        m = cls(DIM, candidates=("dyt", "layernorm", "rmsnorm"))
        assert [type(b) for b in m.branches] == [get_norm_layer(n) for n in ("dyt", "layernorm", "rmsnorm")]
        assert m(_input(SHAPES[0])).shape == SHAPES[0]


def test_rms_and_layer_norm_agree_on_centred_inputs() -> None:
    # A cross-check between two references: on zero-mean rows LN and RMSNorm differ only by ε.
    x = _input((4, DIM), dtype=torch.float64)
    x = x - x.mean(-1, keepdim=True)
    ln, rms = create_norm("layernorm", DIM, eps=0.0).double(), create_norm("rmsnorm", DIM, eps=0.0).double()
    torch.testing.assert_close(ln(x), rms(x), rtol=1e-12, atol=1e-12)
    assert math.isclose(float(F.layer_norm(x, (DIM,)).pow(2).mean()), 1.0, rel_tol=1e-4)


@pytest.mark.parametrize("name", ["autonorm", "random_selector"])
def test_three_way_mixtures_match_reference_in_float64(name: str) -> None:
    module = create_norm(name, DIM, candidates=("dyt", "layernorm", "rmsnorm")).double()
    _perturb(module)
    module.eval()
    x = _input(SHAPES[0], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(module(x), _REFERENCES[name](module, x), rtol=1e-10, atol=1e-10)
