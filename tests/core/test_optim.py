"""Weight-decay grouping: frozen parameters out, 0-/1-D parameters undecayed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autonorm_core.norms import AutoNorm, DyT
from autonorm_core.optim import adamw, param_groups


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), DyT(6), AutoNorm(6), nn.Conv1d(6, 6, 1), nn.LayerNorm(6))


def _ids(params: list[nn.Parameter]) -> set[int]:
    return {id(p) for p in params}


def test_every_trainable_parameter_once_split_by_dimension() -> None:
    model = _model()
    groups = param_groups(model, weight_decay=0.1)
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    assert all(p.ndim <= 1 for p in no_decay["params"])
    everything = decay["params"] + no_decay["params"]
    assert len(everything) == len(_ids(everything)) == len(list(model.parameters()))
    dyt = model[1]
    assert isinstance(dyt, DyT)
    assert _ids([dyt.alpha, dyt.weight, dyt.bias]) <= _ids(no_decay["params"])


def test_frozen_parameters_are_left_out() -> None:
    model = _model()
    norm = model[2]
    assert isinstance(norm, AutoNorm)
    norm.freeze()
    groups = param_groups(model, weight_decay=0.1)
    kept = _ids([p for g in groups for p in g["params"]])
    assert not kept & _ids(list(norm.selector.parameters()))
    assert _ids(list(norm.branches.parameters())) <= kept
    assert len(kept) == sum(1 for p in model.parameters() if p.requires_grad)


def test_tied_parameters_appear_once_and_empty_groups_are_dropped() -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    groups = param_groups(nn.ModuleList([emb, head]), weight_decay=0.01)
    assert [g["name"] for g in groups] == ["decay"]
    assert len(groups[0]["params"]) == 1
    assert [g["name"] for g in param_groups(nn.LayerNorm(3), weight_decay=0.01)] == ["no_decay"]


def test_groups_feed_adamw_and_decay_only_matrices() -> None:
    torch.manual_seed(0)
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(param_groups(model, weight_decay=0.5), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradients: only weight decay can move anything
    opt.step()
    for name, p in model.named_parameters():
        moved = not torch.equal(p, before[name])
        assert moved == (p.ndim >= 2 and bool(before[name].abs().sum() > 0)), name


def test_negative_weight_decay_is_rejected() -> None:
    with pytest.raises(ValueError):
        param_groups(nn.Linear(2, 2), weight_decay=-1.0)


def test_adamw_is_fused_on_cpu_and_takes_the_same_steps_as_the_default() -> None:
    def make() -> nn.Sequential:
        return nn.Sequential(nn.Linear(4, 6), DyT(6), AutoNorm(6, selector_init="default"), nn.Linear(6, 2))

    torch.manual_seed(0)
    models = [make(), make()]
    models[1].load_state_dict(models[0].state_dict())
    for model in models:
        model.eval()  # deterministic gate (no Gumbel draws): the two runs see the same function
    fused = adamw(param_groups(models[0], weight_decay=0.1), lr=1e-2)
    plain = torch.optim.AdamW(param_groups(models[1], weight_decay=0.1), lr=1e-2, foreach=False)
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    x = torch.randn(5, 3, 4)
    for _ in range(5):
        for model, opt in zip(models, (fused, plain), strict=True):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(models[0][0].weight, make()[0].weight)  # it did move
    # The state dict is the same format: a checkpoint of one resumes in the other.
    plain.load_state_dict(fused.state_dict())
    assert plain.state_dict()["state"].keys() == fused.state_dict()["state"].keys()


def test_adamw_falls_back_to_the_default_off_the_fused_devices() -> None:
    p = nn.Parameter(torch.ones(2, 2))
    opt = adamw([{"params": [p], "weight_decay": 0.0}], lr=1e-3)
    assert opt.defaults["fused"] is True
    meta = nn.Parameter(torch.ones(2, 2, device="meta"))
    opt = adamw([{"params": [meta], "weight_decay": 0.0}], lr=1e-3)
    assert not opt.defaults["fused"]


def test_building_and_checkpointing_an_optimizer_imports_no_dynamo() -> None:
    # torch wraps Optimizer.add_param_group (every constructor), zero_grad, state_dict and
    # load_state_dict in torch._disable_dynamo, which imported torch._dynamo (1.5 s) at the first call:
    # a stacked trial's checkpoint builds one per member. A fresh process, as a trial worker is.
    import subprocess
    import sys

    code = """
import sys
import torch
import autonorm_core.optim  # noqa: F401
from autonorm_core.optim import adamw, param_groups
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
for opt in (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), adamw(param_groups(m, weight_decay=0.1), lr=0.1)):
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
print('torch._dynamo' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    # Pinned: where torch caches a method's disabled function, and the methods that have one.
    import inspect

    from torch import _compile

    assert '"__dynamo_disable"' in inspect.getsource(_compile._disable_dynamo)
    from autonorm_core.optim import _DYNAMO_DISABLED_METHODS

    for name in _DYNAMO_DISABLED_METHODS:
        assert hasattr(getattr(torch.optim.Optimizer, name), "__wrapped__"), name


def test_a_compiled_caller_of_the_optimizer_still_gets_torchs_disabled_method() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)

    def step() -> torch.Tensor:
        opt.zero_grad()
        return model(x).sum()

    expected = step()
    assert torch.equal(torch.compile(step, backend="eager")(), expected)
    cached = getattr(torch.optim.Optimizer.zero_grad.__wrapped__, "__dynamo_disable")
    assert callable(getattr(cached, "disabled", None))  # made while Dynamo traced the caller
