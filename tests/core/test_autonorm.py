"""AutoNorm and RandomSelector: gate, Gumbel noise, generator ownership, freezing, fast path."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from autonorm_core.norms import AutoNorm, NormSelector, RandomSelector, create_norm
from autonorm_core.optim import param_groups

DIM = 8


def _input(shape: tuple[int, ...], seed: int = 0) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 1.5 + 0.3


def _set_gate_bias(m: AutoNorm, bias: list[float]) -> None:
    """Make the gate input-independent with the given logits."""
    with torch.no_grad():
        m.selector.fc2.weight.zero_()
        m.selector.fc2.bias.copy_(torch.tensor(bias))


def _count_calls(module: nn.Module) -> list[int]:
    calls = [0]

    def hook(*_: object) -> None:
        calls[0] += 1

    module.register_forward_hook(hook)
    return calls


# -- gate ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 7, DIM), (5, DIM)], ids=["BTD", "BD"])
def test_gate_probs_sum_to_one(shape: tuple[int, ...]) -> None:
    # Seeded: with 4 ReLU units in the gate, some draws leave every unit dead on both samples (then the
    # gate is its bias alone and the last check cannot tell per-sample from per-batch).
    torch.manual_seed(0)
    m = AutoNorm(DIM, selector_init="default", candidates=("dyt", "layernorm", "rmsnorm"))
    p = m.gate_probs(_input(shape))
    assert p.shape == (5, 3)
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(5), rtol=0, atol=1e-6)
    assert not torch.allclose(p[0], p[1])  # per-sample, not one gate for the batch


def test_uniform_gate_entropy_is_ln_k() -> None:
    x = _input((4, 6, DIM))
    torch.testing.assert_close(AutoNorm(DIM).gate_entropy(x), torch.full((4,), math.log(2)))
    three = AutoNorm(DIM, candidates=("dyt", "layernorm", "rmsnorm"))
    torch.testing.assert_close(three.gate_entropy(x), torch.full((4,), math.log(3)))


def test_gate_entropy_is_natural_log_entropy_of_the_probs() -> None:
    m = AutoNorm(DIM, selector_init="default")
    _set_gate_bias(m, [2.0, -1.0])
    x = _input((3, DIM))
    p = m.gate_probs(x)
    expected = -(p * p.log()).sum(-1)
    torch.testing.assert_close(m.gate_entropy(x), expected)
    assert (expected < math.log(2)).all()


def test_selector_pools_tokens_by_mean() -> None:
    m = AutoNorm(DIM, selector_init="default")
    x = _input((3, 5, DIM))
    shuffled = x[:, torch.randperm(5, generator=torch.Generator().manual_seed(0))]
    torch.testing.assert_close(m.gate_probs(x), m.gate_probs(shuffled))
    torch.testing.assert_close(m.gate_probs(x), m.gate_probs(x.mean(1)))


def _lengths_mask(lengths: list[int], t: int) -> Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T), True at real tokens


def test_selector_pools_the_real_tokens_only() -> None:
    m = AutoNorm(DIM, selector_init="default")
    lengths = [6, 1, 3, 4]
    mask = _lengths_mask(lengths, 6)
    x = _input((4, 6, DIM))
    probs = m.gate_probs(x, mask=mask)
    for i, n in enumerate(lengths):  # = the gate of each sentence without its padding
        torch.testing.assert_close(probs[i], m.gate_probs(x[i : i + 1, :n])[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(probs[i], m.gate_probs(x[i, :n].mean(0, keepdim=True))[0])
    padded = torch.where(mask[..., None], x, torch.tensor(float("nan")))
    assert torch.equal(m.gate_probs(padded, mask=mask), probs)  # whatever the padding holds
    assert torch.equal(m.gate_entropy(padded, mask=mask), m.gate_entropy(x, mask=mask))
    assert not torch.allclose(m.gate_probs(x), probs)  # the mean over all positions differs


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_gate_weights_ignore_padding_content(training: bool) -> None:
    m = AutoNorm(DIM, selector_init="default").train(training)
    mask = _lengths_mask([5, 2, 3], 5)
    x = _input((3, 5, DIM))
    weights = []
    for fill in (0.0, 1e4, -7.0):
        m.manual_seed(3)
        m(torch.where(mask[..., None], x, torch.tensor(fill)), mask=mask)
        assert m.last_weights is not None
        weights.append(m.last_weights)
    assert all(torch.equal(w, weights[0]) for w in weights[1:])
    m.manual_seed(3)
    m(torch.where(mask[..., None], x, torch.tensor(1e4)))  # without the mask the padding steers the gate
    assert m.last_weights is not None and not torch.allclose(m.last_weights, weights[0])


def test_mask_must_match_the_token_axes() -> None:
    m = AutoNorm(DIM)
    with pytest.raises(ValueError, match="mask"):
        m(_input((3, 5, DIM)), mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        m(_input((3, DIM)), mask=torch.ones(3, 1, dtype=torch.bool))


def test_a_sample_without_real_tokens_gets_a_finite_gate() -> None:
    m = AutoNorm(DIM, selector_init="default")
    mask = _lengths_mask([0, 3], 3)
    probs = m.gate_probs(_input((2, 3, DIM)), mask=mask)
    assert torch.isfinite(probs).all()
    torch.testing.assert_close(probs[0], m.gate_probs(torch.zeros(1, DIM))[0])  # pools to zeros


def test_selector_architecture() -> None:
    s = NormSelector(DIM, 3)
    assert (s.fc1.in_features, s.fc1.out_features, s.fc2.out_features) == (DIM, DIM // 2, 3)
    assert torch.equal(s.fc2.weight, torch.zeros(3, DIM // 2))


def test_last_probs_are_detached_noise_free_probs_of_the_last_forward() -> None:
    m = AutoNorm(DIM, selector_init="default").train()
    assert m.last_probs is None
    x = _input((4, 3, DIM))
    m(x)
    assert m.last_probs is not None and not m.last_probs.requires_grad
    torch.testing.assert_close(m.last_probs, m.gate_probs(x).detach())
    assert m.last_weights is not None and not torch.allclose(m.last_weights, m.last_probs)  # noisy


def test_gate_runs_in_float32_under_bf16_autocast() -> None:
    m = AutoNorm(DIM, selector_init="default").train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(_input((4, 3, DIM)))
    assert m.last_probs is not None and m.last_probs.dtype == torch.float32
    assert m.last_weights is not None and m.last_weights.dtype == torch.float32
    assert torch.isfinite(y.float()).all()


# -- Gumbel-Softmax ------------------------------------------------------------------------------------------


def test_training_weights_are_gumbel_softmax_from_the_module_generator() -> None:
    m = AutoNorm(DIM, selector_init="default", tau=0.7).train()
    m.manual_seed(42)
    x = _input((6, 4, DIM))
    y = m(x)
    logits = m.selector(x).detach()
    u = torch.rand((6, 2), generator=torch.Generator().manual_seed(42)).clamp(1e-6, 1 - 1e-6)
    expected = ((logits - torch.log(-torch.log(u))) / 0.7).softmax(-1)
    assert m.last_weights is not None
    torch.testing.assert_close(m.last_weights, expected)
    ys = [b(x) for b in m.branches]
    w = expected[:, :, None, None]
    torch.testing.assert_close(y, w[:, 0] * ys[0] + w[:, 1] * ys[1], rtol=1e-5, atol=1e-5)


def test_hard_gumbel_argmax_frequencies_follow_the_softmax() -> None:
    # Gumbel-max trick: argmax(logits + g) ~ Categorical(softmax(logits)). A sign error in g or
    # uniform instead of Gumbel noise moves these frequencies far outside the tolerance.
    m = AutoNorm(DIM, candidates=("dyt", "layernorm", "rmsnorm"), hard=True).train()
    target = torch.tensor([0.6, 0.3, 0.1])
    _set_gate_bias(m, target.log().tolist())
    m.manual_seed(0)
    m(_input((20000, DIM)))
    assert m.last_weights is not None
    assert set(m.last_weights.unique().tolist()) == {0.0, 1.0}
    freq = m.last_weights.mean(0)
    torch.testing.assert_close(freq, target, rtol=0, atol=0.015)


def test_hard_weights_are_one_hot_with_straight_through_gradient() -> None:
    m = AutoNorm(DIM, hard=True).train()
    x = _input((5, 3, DIM))
    (m(x) * _input((5, 3, DIM), seed=9)).sum().backward()
    assert m.last_weights is not None
    assert torch.equal(m.last_weights.sum(-1), torch.ones(5))
    assert set(m.last_weights.unique().tolist()) <= {0.0, 1.0}
    assert m.selector.fc2.weight.grad is not None and m.selector.fc2.weight.grad.abs().sum() > 0


def test_extreme_logits_give_finite_outputs_and_gradients() -> None:
    m = AutoNorm(DIM).train()
    _set_gate_bias(m, [1e4, -1e4])
    x = _input((4, 3, DIM)).requires_grad_(True)
    m(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for p in m.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_tau_is_settable_and_sharpens_the_gate() -> None:
    weights = []
    for tau in (5.0, 0.05):
        m = AutoNorm(DIM, selector_init="default").train()
        m.tau = tau
        m.manual_seed(3)
        m(_input((64, DIM)))
        assert m.last_weights is not None
        weights.append(m.last_weights.max(-1).values.mean().item())
    assert weights[1] > weights[0] + 0.2
    with pytest.raises(ValueError):
        AutoNorm(DIM).tau = 0.0


# -- generator ownership -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [AutoNorm, RandomSelector])
def test_same_seed_same_noise_other_seed_other_noise(cls: type[nn.Module]) -> None:
    x = _input((4, 3, DIM))
    outs = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)  # identical parameters
        m = cls(DIM).train()
        m.manual_seed(seed)  # type: ignore[operator]
        outs.append(m(x))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("cls", [AutoNorm, RandomSelector])
def test_layers_built_without_seed_draw_different_noise(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    a, b = cls(DIM).train(), cls(DIM).train()
    b.load_state_dict(a.state_dict())
    x = _input((4, DIM))
    assert not torch.equal(a(x), b(x))


@pytest.mark.parametrize("cls", [AutoNorm, RandomSelector])
def test_rng_state_gives_an_exact_resume(cls: type[nn.Module]) -> None:
    m = cls(DIM).train()
    m.manual_seed(7)  # type: ignore[operator]
    x = _input((4, 3, DIM))
    for _ in range(3):
        m(x)
    state = m.rng_state()  # type: ignore[operator]
    expected = [m(x) for _ in range(2)]
    m.set_rng_state(state)  # type: ignore[operator]
    assert all(torch.equal(a, m(x)) for a in expected)
    # A fresh module in a "new process": the generator does not exist yet when the state arrives.
    fresh = cls(DIM).train()
    fresh.load_state_dict(m.state_dict())
    fresh.set_rng_state(copy.deepcopy(state))  # type: ignore[operator]
    assert fresh.generator is None  # type: ignore[attr-defined]
    assert all(torch.equal(a, fresh(x)) for a in expected)


@pytest.mark.parametrize("cls", [AutoNorm, RandomSelector])
def test_rng_state_before_first_forward_restores_the_seed(cls: type[nn.Module]) -> None:
    a = cls(DIM, seed=11).train()
    state = a.rng_state()  # type: ignore[operator]
    b = cls(DIM, seed=99).train()
    b.load_state_dict(a.state_dict())
    b.set_rng_state(state)  # type: ignore[operator]
    x = _input((4, DIM))
    assert torch.equal(a(x), b(x))


def test_deepcopy_copies_the_noise_stream_without_sharing_it() -> None:
    m = AutoNorm(DIM, seed=5).train()
    x = _input((4, DIM))
    m(x)
    clone = copy.deepcopy(m)
    assert torch.equal(clone(x), m(x))  # same next draw
    clone(x)  # advancing the copy must not advance the original
    state_after = m.rng_state()["state"]
    clone2 = copy.deepcopy(m)
    assert torch.equal(clone2.rng_state()["state"], state_after)


# -- evaluation modes ----------------------------------------------------------------------------------------


def test_eval_modes() -> None:
    x = _input((6, 3, DIM))
    torch.manual_seed(0)
    base = AutoNorm(DIM, selector_init="default")
    soft = copy.deepcopy(base).eval()
    soft(x)
    assert soft.last_weights is not None and soft.last_probs is not None
    assert torch.equal(soft.last_weights, soft.last_probs)

    arg = copy.deepcopy(base).eval()
    arg.eval_mode = "argmax"
    arg(x)
    assert arg.last_weights is not None
    assert torch.equal(arg.last_weights.argmax(-1), soft.last_probs.argmax(-1))
    assert set(arg.last_weights.unique().tolist()) <= {0.0, 1.0}

    sample = copy.deepcopy(base).eval()
    sample.eval_mode = "sample"
    sample.manual_seed(1)
    first = sample(x)
    assert not torch.equal(first, sample(x))
    sample.manual_seed(1)
    assert torch.equal(first, sample(x))


@pytest.mark.parametrize("eval_mode", AutoNorm.EVAL_MODES)
def test_hard_evaluation_is_one_hot_whatever_eval_mode(eval_mode: str) -> None:
    torch.manual_seed(0)
    m = AutoNorm(DIM, selector_init="default", hard=True, eval_mode=eval_mode).eval()
    with torch.no_grad():  # logits (relu(mean of channel 0), 0.5): varied, mostly far from one-hot
        m.selector.fc1.weight.copy_(torch.eye(DIM // 2, DIM))
        m.selector.fc1.bias.zero_()
        m.selector.fc2.weight.zero_()
        m.selector.fc2.weight[0, 0] = 1.0
        m.selector.fc2.bias.copy_(torch.tensor([0.0, 0.5]))
    x = _input((64, 3, DIM))
    m.manual_seed(0)
    y = m(x)
    w, p = m.last_weights, m.last_probs
    assert w is not None and p is not None
    assert set(w.unique().tolist()) == {0.0, 1.0} and torch.equal(w.sum(-1), torch.ones(64))
    assert len(w.argmax(-1).unique()) == 2  # both candidates chosen somewhere: no single-branch path
    if eval_mode != "sample":  # argmax of the noise-free probabilities, deterministic
        assert torch.equal(w.argmax(-1), p.argmax(-1))
        assert torch.equal(m(x), y)
    ys = [b(x) for b in m.branches]
    pick = w.argmax(-1)[:, None, None]
    torch.testing.assert_close(y, torch.where(pick == 0, ys[0], ys[1]), rtol=0, atol=1e-6)
    soft = p[:, :1, None] * ys[0] + p[:, 1:, None] * ys[1]
    assert not torch.allclose(y, soft, atol=1e-3)  # never the soft mixture


def test_invalid_options_raise_value_error() -> None:
    with pytest.raises(ValueError, match="softmax"):
        AutoNorm(DIM, eval_mode="mean")
    with pytest.raises(ValueError, match="layernorm"):
        AutoNorm(DIM, candidates=("dyt", "layer_norm"))
    with pytest.raises(ValueError):
        AutoNorm(DIM, candidates=("dyt",))
    with pytest.raises(ValueError):
        AutoNorm(DIM, candidates=("dyt", "dyt"))
    with pytest.raises(ValueError):
        AutoNorm(DIM, selector_init="xavier")
    with pytest.raises(ValueError):
        AutoNorm(DIM, candidate_kwargs={"rmsnorm": {"eps": 1e-3}})
    with pytest.raises(ValueError, match="mean"):
        RandomSelector(DIM, eval_mode="softmax")


def test_candidate_kwargs_reach_the_candidates() -> None:
    m = AutoNorm(DIM, candidate_kwargs={"dyt": {"alpha_init": 2.0}})
    assert m.candidates == ("dyt", "layernorm")
    assert m.branches[m.candidates.index("dyt")].alpha.item() == 2.0


# -- freezing (AutoNorm-S) -----------------------------------------------------------------------------------


def test_frozen_selector_is_bit_identical_after_adamw_steps_with_weight_decay() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM), AutoNorm(DIM, selector_init="default"), nn.Linear(DIM, 3))
    norm = model[1]
    assert isinstance(norm, AutoNorm)
    # Worst case: an optimizer built BEFORE the freeze, holding the selector and its moment state.
    stale = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.5)
    x, target = _input((16, 5, DIM)), torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(1))

    def step(opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=False)  # zeros instead of None would let weight decay act
        loss = nn.functional.cross_entropy(model(x).mean(1), target)
        loss.backward()
        opt.step()

    for _ in range(2):
        step(stale)
    assert not norm.frozen
    norm.freeze()
    assert norm.frozen and all(not p.requires_grad for p in norm.selector.parameters())
    frozen_before = copy.deepcopy(norm.selector.state_dict())
    branches_before = copy.deepcopy(norm.branches.state_dict())
    fresh = torch.optim.AdamW(param_groups(model, weight_decay=0.5), lr=1e-2)
    for i in range(10):
        step(stale if i % 2 else fresh)
    for key, value in norm.selector.state_dict().items():
        assert torch.equal(value, frozen_before[key]), key
    assert any(not torch.equal(v, branches_before[k]) for k, v in norm.branches.state_dict().items())
    norm.unfreeze()
    assert not norm.frozen and all(p.requires_grad for p in norm.selector.parameters())


def test_frozen_training_uses_noise_free_weights_unless_asked() -> None:
    m = AutoNorm(DIM, selector_init="default").train()
    m.freeze()
    x = _input((4, DIM))
    m(x)
    assert m.last_weights is not None and m.last_probs is not None
    assert torch.equal(m.last_weights, m.last_probs)
    m.sample_after_freeze = True
    m(x)
    assert not torch.equal(m.last_weights, m.last_probs)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_frozen_hard_gate_computes_only_the_selected_branch(training: bool) -> None:
    m = AutoNorm(DIM).train(training)
    _set_gate_bias(m, [-9.0, 9.0])  # layernorm with weight 1 − 1.5e-8
    x = _input((4, 3, DIM))
    full = m(x)  # not frozen yet: mixes both
    m.freeze()
    calls = [_count_calls(b) for b in m.branches]
    fast = m(x)
    assert calls[0][0] == 0 and calls[1][0] == 1  # DyT skipped
    assert torch.equal(fast, m.branches[1](x))
    torch.testing.assert_close(fast, full, rtol=0, atol=1e-6)


def test_hard_frozen_fast_path_is_exact_and_mixed_batches_use_both_branches() -> None:
    m = AutoNorm(DIM, hard=True, selector_init="default").eval()
    m.eval_mode = "argmax"
    x = _input((2, DIM))
    with torch.no_grad():  # gate: sample 0 → candidate 0 (positive mean), sample 1 → candidate 1
        m.selector.fc1.weight.copy_(torch.eye(DIM // 2, DIM))
        m.selector.fc1.bias.zero_()
        m.selector.fc2.weight.zero_()
        m.selector.fc2.weight[0, 0] = 10.0
        m.selector.fc2.bias.copy_(torch.tensor([0.0, 5.0]))
        x[0, 0], x[1, 0] = 3.0, -3.0
    m.freeze()
    calls = [_count_calls(b) for b in m.branches]
    mixed = m(x)
    assert calls == [[1], [1]]
    ys = [b(x) for b in m.branches]
    assert torch.equal(mixed[0], ys[0][0]) and torch.equal(mixed[1], ys[1][1])
    single = m(x[:1])
    assert calls == [[3], [2]]  # one more call of branch 0 only (plus the two reference calls)
    # Exact: the branch's own output on the same input (vectorised kernels may round a 1-row batch's
    # elements differently from the same row inside a larger batch, so compare like with like).
    assert torch.equal(single, m.branches[0](x[:1]))


def test_frozen_soft_gate_keeps_mixing() -> None:
    m = AutoNorm(DIM)  # uniform gate
    m.freeze()
    calls = [_count_calls(b) for b in m.branches]
    m(_input((3, DIM)))
    assert calls == [[1], [1]]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_freezing_changes_no_value_or_input_gradient_of_a_soft_gate(training: bool) -> None:
    # Frozen means "parameters stop", not "stop-gradient": the mixture still depends on x through the
    # gate, so x's gradient must equal the unfrozen module's under the same deterministic weights.
    torch.manual_seed(0)
    live = AutoNorm(DIM, selector_init="default").train(training)
    live.sample_after_freeze = False
    frozen = copy.deepcopy(live)
    frozen.freeze()
    if training:  # unfrozen training draws noise; compare against eval-mode softmax weights instead
        live.eval()
    outs, grads = [], []
    for m in (live, frozen):
        x = _input((4, 3, DIM)).requires_grad_(True)
        y = m(x)
        (y * _input((4, 3, DIM), seed=4)).sum().backward()
        outs.append(y)
        grads.append(x.grad)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-6)
    gate_free = copy.deepcopy(frozen)
    x = _input((4, 3, DIM)).requires_grad_(True)
    with torch.no_grad():
        w = gate_free.gate_probs(x)
    ys = [b(x) for b in gate_free.branches]
    ((w[:, :1, None] * ys[0] + w[:, 1:, None] * ys[1]) * _input((4, 3, DIM), seed=4)).sum().backward()
    assert not torch.allclose(x.grad, grads[1], atol=1e-6)  # the gate path really contributes


# -- RandomSelector ------------------------------------------------------------------------------------------


def test_random_selector_draws_w_dyt_uniform_per_sample() -> None:
    m = RandomSelector(DIM, seed=0).train()
    x = _input((5000, DIM))
    y = m(x)
    w = m.last_weights
    assert w is not None and m.candidates[0] == "dyt"
    torch.testing.assert_close(w.sum(-1), torch.ones(5000))
    u = w[:, 0].sort().values
    ecdf_gap = (u - torch.arange(1, 5001) / 5000).abs().max().item()  # Kolmogorov-Smirnov statistic
    assert ecdf_gap < 0.03
    ys = [b(x) for b in m.branches]
    torch.testing.assert_close(y, w[:, :1] * ys[0] + w[:, 1:] * ys[1], rtol=1e-5, atol=1e-5)
    m(x)
    assert not torch.equal(m.last_weights, w)  # a fresh draw per forward


def test_random_selector_eval_uses_the_mean_weight() -> None:
    m = RandomSelector(DIM).eval()
    x = _input((3, DIM))
    y = m(x)
    assert m.last_weights is not None and torch.equal(m.last_weights, torch.full((3, 2), 0.5))
    torch.testing.assert_close(y, 0.5 * (m.branches[0](x) + m.branches[1](x)))


def test_compiled_training_step_matches_eager() -> None:
    # Training mode exercises what eval does not: the DyT branch's custom backward (with its
    # compile-only exp form of tanh) and the Gumbel draw from the module's generator across a graph
    # break. One module covers both, to keep CPU compile time down.
    torch.manual_seed(0)
    eager = AutoNorm(DIM, selector_init="default").train()
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    compiled_module = copy.deepcopy(eager)
    for m in (eager, compiled_module):
        m.manual_seed(3)
    compiled = torch.compile(compiled_module)
    results = []
    for fn, m in ((eager, eager), (compiled, compiled_module)):
        x = _input((2, 3, DIM)).requires_grad_(True)
        y = fn(x)
        (y * _input((2, 3, DIM), seed=8)).sum().backward()
        results.append([y, x.grad, *(p.grad for p in m.parameters())])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -- eager fast paths: the fused (DyT, LayerNorm) mixture and the token mean's backward ---------------------


def _fast_and_reference(m: nn.Module, x: Tensor, mask: Tensor | None, seed: int = 4) -> list[list[Tensor]]:
    """Output, input gradient and every parameter gradient, with the fast paths and without."""
    from autonorm_core.norms.helpers import _reference_paths

    dy = _input(x.shape, seed=11).to(x.dtype)
    runs = []
    for reference in (False, True):
        if hasattr(m, "manual_seed"):
            m.manual_seed(seed)  # the same Gumbel noise for both runs
        xi = x.detach().clone().requires_grad_(True)
        params = [p for p in m.parameters() if p.requires_grad]
        if reference:
            with _reference_paths():
                y = m(xi, mask=mask)
        else:
            y = m(xi, mask=mask)
        grads = torch.autograd.grad(y, [xi, *params], dy, allow_unused=True)
        runs.append([y, *(torch.zeros_like(p) if g is None else g for g, p in zip(grads, [xi, *params]))])
    return runs


def _perturbed(m: AutoNorm) -> AutoNorm:
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.add_(
                0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + i), dtype=p.dtype)
            )
    return m


# A mask applies to (B, T, D) inputs only: (B, D) runs unmasked.
@pytest.mark.parametrize(
    ("shape", "masked"),
    [((4, 7, DIM), False), ((4, 7, DIM), True), ((5, DIM), False)],
    ids=["BTD-nomask", "BTD-mask", "BD-nomask"],
)
@pytest.mark.parametrize("candidates", [("dyt", "layernorm"), ("layernorm", "dyt")], ids=["dyt_ln", "ln_dyt"])
@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_fused_mixture_matches_the_reference_in_values_and_every_gradient(
    shape: tuple[int, ...], candidates: tuple[str, str], hard: bool, masked: bool
) -> None:
    m = _perturbed(AutoNorm(DIM, candidates=candidates, hard=hard, selector_init="default", seed=2).double())
    x = _input(shape).double()
    mask = (torch.arange(shape[1])[None, :] < torch.tensor([7, 3, 1, 5])[:, None]) if masked else None
    fast, reference = _fast_and_reference(m.train(), x, mask)
    names = ["out", "x", *(n for n, _ in m.named_parameters())]
    assert len(fast) == len(names)
    for name, a, b in zip(names, fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    if not hard:  # α, γ and β of both branches and the selector really receive gradient
        for name, g in zip(names[2:], fast[2:]):
            assert g.abs().sum() > 0, name


def test_fused_mixture_float32_matches_reference_within_float_tolerance() -> None:
    m = _perturbed(AutoNorm(DIM, selector_init="default", seed=1)).train()
    fast, reference = _fast_and_reference(m, _input((6, 9, DIM)), None)
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_fused_mixture_is_the_path_taken_and_passes_gradcheck() -> None:
    from autonorm_core.norms.fused import _DyTLayerNormMix

    m = AutoNorm(DIM, selector_init="default").train()
    y = m(_input((2, 3, DIM)).requires_grad_(True))
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "_DyTLayerNormMixBackward"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, DIM, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, generator=g, requires_grad=True)
    params = [
        torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
        for shape in ((1,), (DIM,), (DIM,), (DIM,), (DIM,))
    ]
    assert torch.autograd.gradcheck(lambda *a: _DyTLayerNormMix.apply(*a, 1e-5), (x, w, *params))


def test_fused_mixture_frozen_soft_gate_matches_reference() -> None:
    m = _perturbed(AutoNorm(DIM, selector_init="default", seed=0).double())
    m.freeze()  # soft weights: the mixture still runs, its gradient reaches x through the gate
    fast, reference = _fast_and_reference(m.train(), _input((3, 5, DIM)).double(), None)
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fused_mixture_gives_way_to_hooks_autocast_and_other_candidates() -> None:
    x = _input((2, 3, DIM)).requires_grad_(True)
    m = AutoNorm(DIM).train()
    calls = _count_calls(m.branches[0])
    y = m(x)
    assert calls == [1] and type(y.grad_fn).__name__ != "_DyTLayerNormMixBackward"  # hooks see the branch
    plain = AutoNorm(DIM).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert type(plain(x).grad_fn).__name__ != "_DyTLayerNormMixBackward"
    three = AutoNorm(DIM, candidates=("dyt", "layernorm", "rmsnorm")).train()
    assert type(three(x).grad_fn).__name__ != "_DyTLayerNormMixBackward"


def test_random_selector_uses_the_fused_mixture_with_reference_values() -> None:
    m = RandomSelector(DIM, seed=0).double().train()
    fast, reference = _fast_and_reference(m, _input((3, 4, DIM)).double(), None)
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_token_mean_backward_equals_autograd_mean() -> None:
    from autonorm_core.norms.helpers import _pool_tokens

    x = _input((3, 5, DIM)).requires_grad_(True)
    pooled = _pool_tokens(x)
    assert torch.equal(pooled, x.detach().mean(1))
    dy = _input((3, DIM), seed=3)
    (fast,) = torch.autograd.grad(pooled, x, dy)
    (ref,) = torch.autograd.grad(x.mean(1), x, dy)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-7)


@pytest.mark.parametrize("name", ["autonorm", "random_selector"])
def test_mixtures_run_under_cpu_bf16_autocast(name: str) -> None:
    # CPU autocast runs layer_norm in bfloat16 but DyT (float32 α) stays float32: the mix must promote.
    m = create_norm(name, DIM, seed=0).train()
    x = _input((3, 5, DIM)).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    y.float().square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
