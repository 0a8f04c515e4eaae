"""Member-stacked training (autonorm_core.stacking) against the separate ``fit`` it replaces.

Member k of a stacked run must start from exactly what the separate run with its seed starts from
(weights, data order, noise: bit for bit) and, after 10 updates, hold the same weights up to float
rounding (1e-5 relative, fp32, CPU), with the same metric names and statuses. Arms without a stacked
form must be refused by ``stackable`` with a reason, and ``fit_stacked`` must then fall back to
separate fits. Tiny models, 2 members, 10 updates: the whole file runs in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from autonorm_core.data import Splits
from autonorm_core.fitcore import derive_seed
from autonorm_core.stacking import create_members, fit_stacked, stack_models, stackable
from autonorm_core.stacking.fit import _StackedRun
from autonorm_core.stacking.layers import StackedLinear
from autonorm_core.stacking.optim import StackedOptimizer
from autonorm_core.training import GateFreeze, TrainConfig, fit
from tests.core.blobs import make_splits

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
SEEDS = [3, 11]


def _images(n: int = 80, seed: int = 0) -> Splits:
    g = torch.Generator().manual_seed(seed)

    def part(m: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(0, 3, (m,), generator=g)
        return torch.randn(m, 1, 8, 8, generator=g) + 0.5 * y[:, None, None, None].float(), y

    return Splits("images", part(n), part(24), part(24), "classification", 3, (1, 8, 8))


def _text(n: int = 40) -> Splits:
    g = torch.Generator().manual_seed(0)

    def part(m: int) -> tuple[Tensor, Tensor]:
        ids = torch.randint(2, 12, (m, 6), generator=g)
        ids[: m // 2, 4:] = 0  # padding: masks reach attention and the gates' token means
        y = ids % 3
        y[ids == 0] = -100
        return ids, y

    return Splits("text", part(n), part(16), part(16), "tagging", 3, (6,), vocab_size=12)


def _rows(n: int = 80) -> Splits:
    g = torch.Generator().manual_seed(0)

    def part(m: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(m, 5, generator=g)
        return x, x.sum(1) + 0.1 * torch.randn(m, generator=g)

    return Splits("rows", part(n), part(24), part(24), "regression", 0, (5,))


def _sgd(lr: float, **kw: Any) -> TrainConfig:
    base = dict(
        epochs=2, batch_size=16, lr=lr, optimizer="sgd", weight_decay=0.0, schedule="constant",
        warmup_fraction=0.0, grad_clip=None, label_smoothing=0.0,
    )  # fmt: skip
    return TrainConfig(**{**base, **kw})


def _adamw(lr: float, **kw: Any) -> TrainConfig:
    return TrainConfig(**{"epochs": 2, "batch_size": 16, "lr": lr, **kw})  # clip 1.0, smoothing 0.1, wd 1e-4


def _max_rel(
    stacked: dict[str, Tensor], separate: dict[str, Tensor], *, skip_key_bias: bool = False
) -> float:
    """Relative error of member k's weights: ``‖a − b‖ / ‖b‖`` over all its floating-point tensors.

    Also asserts every tensor elementwise (``rtol`` 1e-4, ``atol`` 1e-6), so a wrong slice cannot hide in
    the norm of the whole (a per-tensor norm ratio would blow up for tensors that start at zero and
    move by float noise, like AutoNorm's zero-initialised gate output bias).
    """
    diff = 0.0
    norm = 0.0
    for name, ref in separate.items():
        got = stacked[name]
        if not ref.is_floating_point():
            assert torch.equal(got, ref), name
            continue
        if skip_key_bias and name.endswith("attn.qkv.bias"):
            # The key third of the qkv bias has a mathematically zero gradient (softmax ignores a
            # constant shift of every key's score); AdamW normalises that float noise into ±lr steps
            # in either run, so its value is noise, not a property of stacking.
            d = ref.shape[0] // 3
            got, ref = torch.cat([got[:d], got[2 * d :]]), torch.cat([ref[:d], ref[2 * d :]])
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-6), (name, float((got - ref).abs().max()))
        diff += float((got.double() - ref.double()).pow(2).sum())
        norm += float(ref.double().pow(2).sum())
    return (diff / max(norm, 1e-24)) ** 0.5


def _compare(
    name: str,
    splits: Splits,
    model_kw: dict[str, Any],
    cfgs: list[TrainConfig],
    *,
    skip_key_bias: bool = False,
) -> tuple[Any, list[Any], list[nn.Module]]:
    members = create_members(name, splits, SEEDS, **model_kw)
    separate_models = create_members(name, splits, SEEDS, **model_kw)
    for m, s in zip(members, separate_models):  # same code, same seed: the same init, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), s.state_dict().values()))
    out = fit_stacked(members, splits, cfgs, seeds=SEEDS)
    assert out.stacked, out.reason
    separate = [fit(m, splits, c, seed=s) for m, c, s in zip(separate_models, cfgs, SEEDS)]
    for k in range(len(SEEDS)):
        got, ref = out.results[k], separate[k]
        assert got.status == ref.status and got.updates == ref.updates == 10
        assert len(got.history) == len(ref.history) == 2
        for hs, hr in zip(got.history, ref.history):
            assert hs.keys() == hr.keys()
            for key in hr:
                if key != "examples_per_s":
                    assert hs[key] == pytest.approx(hr[key], rel=1e-4, abs=1e-5), key
        err = _max_rel(out.states[k], separate_models[k].state_dict(), skip_key_bias=skip_key_bias)
        assert err < TOL, (name, model_kw, k, err)
        # fit_stacked trains the caller's models in place, like fit
        assert (
            _max_rel(members[k].state_dict(), separate_models[k].state_dict(), skip_key_bias=skip_key_bias)
            < TOL
        )
    return out, separate, separate_models


# ------------------------------------------------------------------------------------ step 0: bit for bit


def test_member_starts_from_the_separate_runs_weights_data_order_and_noise() -> None:
    splits = _images()
    kw = {"preset": "tiny", "norm": "autonorm", "patch_size": 4}
    members = create_members("vit_lite", splits, SEEDS, **kw)
    stacked = stack_models(members)
    for k, m in enumerate(create_members("vit_lite", splits, SEEDS, **kw)):
        own = stacked.member_state_dict(k)
        assert own.keys() == m.state_dict().keys()
        assert all(torch.equal(own[n], t) for n, t in m.state_dict().items())
    run = _StackedRun(
        stacked, members, [splits] * 2, [_adamw(1e-3)] * 2, SEEDS, [(), ()], torch.device("cpu"), None
    )
    for k, seed in enumerate(SEEDS):
        run.seed(k)
        # data order: fit's shuffling generator
        ref_gen = torch.Generator().manual_seed(derive_seed(seed, 0))
        assert torch.equal(
            torch.randperm(80, generator=run.shuffle[k]), torch.randperm(80, generator=ref_gen)
        )
        # DropPath: fit seeds (a fork of) torch's default generator
        ref_default = torch.Generator().manual_seed(derive_seed(seed, 1))
        a = torch.empty(64).bernoulli_(0.9, generator=run.global_dev[k])
        b = torch.empty(64).bernoulli_(0.9, generator=ref_default)
        assert torch.equal(a, b)
        # Gumbel noise: fit seeds module i with derive(seed, 2, i). With the selector's zero-initialised
        # output layer the logits are exactly 0 in both forms, so the training-mode mixing weights are
        # softmax(gumbel / tau): equal bit for bit exactly when the noise is.
        sep = create_members("vit_lite", splits, [seed], **kw)[0].train()
        seeded: list[Any] = [m for m in sep.modules() if callable(getattr(m, "manual_seed", None))]
        assert len(seeded) == len(run.seeded_names) == 4
        x = torch.randn(8, 5, 32, generator=torch.Generator().manual_seed(1))
        for i, (mod, name) in enumerate(zip(seeded, run.seeded_names)):
            mod.manual_seed(derive_seed(seed, 2, i))
            mod(x)
            layer: Any = stacked.get_submodule(name)
            layer.train()
            layer(x.unsqueeze(0).expand(2, *x.shape))
            assert torch.equal(layer.last_weights[k], mod.last_weights)
            assert not torch.equal(layer.last_weights[k], layer.last_weights[1 - k])  # members' own noise
            assert layer.rngs[k].rng_state()["seed"] == mod.rng_state()["seed"]


# ------------------------------------------------------------------------------ after 10 updates: 1e-5

MLP_ARMS = ["linear", "linear_batchnorm", "linear_layernorm", "prenorm_l2", "prenorm_rms", "corrected"]
CNN_ARMS = ["conv", "conv_batchnorm", "conv_layernorm", "patchnorm"]


@pytest.mark.parametrize("layer", MLP_ARMS)
def test_mlp_arms_match_separate_runs(layer: str) -> None:
    _compare("mlp", make_splits(n_train=80), {"preset": "tiny", "layer": layer}, [_sgd(0.05), _sgd(0.3)])


@pytest.mark.parametrize("layer", MLP_ARMS)
def test_mlp_plain_sgd_at_one_lr_steps_the_first_layer_in_its_backward(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One plain-SGD lr for every member: the first linear (fed by data) applies W -= lr xᵀ∂z in its
    # backward instead of writing a gradient (BackwardSGD); the same weights as the separate runs.
    applied: list[float] = []
    update = StackedLinear._update_weight

    def spy(self: StackedLinear, x3: Tensor, grad: Tensor) -> None:
        assert self.backward_sgd is not None
        applied.append(-1.0 if self.backward_sgd.lr is None else self.backward_sgd.lr)
        update(self, x3, grad)

    monkeypatch.setattr(StackedLinear, "_update_weight", spy)
    _compare("mlp", make_splits(n_train=80), {"preset": "tiny", "layer": layer}, [_sgd(0.1), _sgd(0.1)])
    assert applied == [0.1] * 10  # every update, the first layer only


def test_one_member_steps_after_its_backward_as_the_separate_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # One member: no BackwardSGD hook (its weight is the separate run's; the hook costs more than the
    # passes it saves). Its step is the separate run's W -= lr ∂W, as in a stack at other lrs.
    calls: list[int] = []
    update = StackedLinear._update_weight

    def spy(self: StackedLinear, x3: Tensor, grad: Tensor) -> None:
        calls.append(x3.shape[0])
        update(self, x3, grad)

    monkeypatch.setattr(StackedLinear, "_update_weight", spy)
    splits = make_splits(n_train=80)
    alone = fit_stacked(
        create_members("mlp", splits, SEEDS[:1], preset="tiny"), splits, _sgd(0.1), seeds=SEEDS[:1]
    )
    assert alone.stacked and calls == []
    cfgs = [_sgd(0.1), _sgd(0.05)]
    pair = fit_stacked(create_members("mlp", splits, SEEDS, preset="tiny"), splits, cfgs, seeds=SEEDS)
    assert pair.stacked and calls == []
    assert all(torch.equal(pair.states[0][n], t) for n, t in alone.states[0].items())


def test_mlp_per_member_hyperparameters_and_adamw() -> None:
    # Different beta per member (a searched hyperparameter), AdamW with decay, clipping, smoothing, warm-up.
    splits = make_splits(n_train=80)
    members = create_members(
        "mlp", splits, SEEDS[:1], preset="tiny", layer={"type": "corrected", "beta": 0.5}
    )
    members += create_members(
        "mlp", splits, SEEDS[1:], preset="tiny", layer={"type": "corrected", "beta": 2.0}
    )
    seps = [create_members("mlp", splits, [s], preset="tiny", layer={"type": "corrected", "beta": b})[0]
            for s, b in zip(SEEDS, (0.5, 2.0))]  # fmt: skip
    cfgs = [
        _adamw(3e-3, warmup_fraction=0.2, grad_clip=0.05),
        _adamw(1e-2, weight_decay=0.1, label_smoothing=0.0),
    ]
    out = fit_stacked(members, splits, cfgs, seeds=SEEDS)
    assert out.stacked
    for k, m in enumerate(seps):
        ref = fit(m, splits, cfgs[k], seed=SEEDS[k])
        assert out.results[k].final["lr"] == pytest.approx(ref.final["lr"])
        assert _max_rel(out.states[k], m.state_dict()) < TOL


@pytest.mark.parametrize("layer", CNN_ARMS)
def test_cnn_arms_match_separate_runs(layer: str) -> None:
    spec: Any = (
        {"type": "patchnorm", "patch_scale": True, "learnable_gain": True} if layer == "patchnorm" else layer
    )
    _compare("cnn", _images(), {"preset": "tiny", "layer": spec}, [_sgd(0.05), _sgd(0.1, momentum=0.9)])


VIT_NORMS = ["layernorm", "dyt", "rmsnorm", "random_selector", "autonorm"]


@pytest.mark.parametrize("norm", VIT_NORMS)
def test_vit_lite_arms_match_separate_runs_adamw(norm: str) -> None:
    kw = {"preset": "tiny", "norm": norm, "patch_size": 4}
    out, _, _ = _compare("vit_lite", _images(), kw, [_adamw(1e-3), _adamw(3e-3)], skip_key_bias=True)
    if norm == "autonorm":  # per-member gate logs, the keys fit reports
        for r in out.results:
            assert {"gate_entropy", "gate_entropy/layer_3", "dyt_weight/layer_0"} <= r.final.keys()


def test_vit_lite_matches_with_sgd_momentum_every_parameter() -> None:
    # Under SGD nothing amplifies float noise: every tensor, the key bias included, within 1e-5.
    kw = {
        "preset": "tiny",
        "norm": "autonorm",
        "patch_size": 4,
        "linear": "prenorm_rms",
        "linear_in_attention": True,
    }
    _compare("vit_lite", _images(), kw, [_sgd(0.02, momentum=0.9), _sgd(0.05, momentum=0.5)])


def test_autonorm_s_members_freeze_independently() -> None:
    kw = {"preset": "tiny", "norm": {"type": "autonorm", "tau": 0.7}, "patch_size": 4}
    cfgs = [
        _adamw(1e-3, freeze=GateFreeze(t_freeze=1, rule="always")),
        _adamw(2e-3, freeze=GateFreeze(t_freeze=1, eps_h=9.0)),
    ]
    out, separate, models = _compare("vit_lite", _images(), kw, cfgs, skip_key_bias=True)
    assert [r.freeze_epoch for r in out.results] == [r.freeze_epoch for r in separate] == [1, None]
    assert [r.final["selector_frozen"] for r in out.results] == [1.0, 0.0]
    # the frozen member's selectors did not move in epoch 2, in either run
    assert all(not p.requires_grad for n, p in models[0].named_parameters() if ".selector." in n)


def test_tau_annealing_member_matches_its_separate_fit() -> None:
    # One member anneals the Gumbel temperature (tau_final), the other keeps its own tau: each as fit does.
    kw = {"preset": "tiny", "norm": {"type": "autonorm", "tau": 0.7}, "patch_size": 4}
    cfgs = [_adamw(1e-3, tau_final=0.2), _adamw(2e-3)]
    out, separate, _ = _compare("vit_lite", _images(), kw, cfgs, skip_key_bias=True)
    assert out.results[0].final["tau"] == separate[0].final["tau"] == pytest.approx(0.2)
    assert "tau" not in out.results[1].final


def test_a_frozen_member_resumes_stacked() -> None:
    # AutoNorm-S froze member 0's selector at epoch 1: its state's optimizer leaves the selector out (as
    # fit's does), and the stacked loop resumes it (it used to build the optimizer over the unfrozen
    # separate model and fail to load that state).
    kw = {"preset": "tiny", "norm": {"type": "autonorm", "tau": 0.7}, "patch_size": 4}
    cfgs = [_adamw(1e-3, epochs=3, freeze=GateFreeze(t_freeze=1, rule="always")), _adamw(2e-3, epochs=3)]
    states: dict[int, dict[int, dict[str, Any]]] = {}
    full = fit_stacked(
        create_members("vit_lite", _images(), SEEDS, **kw), _images(), cfgs, seeds=SEEDS,
        checkpoint_fn=lambda epoch, st: states.__setitem__(epoch, st),
    )  # fmt: skip
    assert states[1][0]["freeze"]["frozen"] and not states[1][1]["freeze"]["frozen"]
    resumed = fit_stacked(
        create_members("vit_lite", _images(), SEEDS, **kw), _images(), cfgs, seeds=SEEDS,
        resume_states=[states[1][0], states[1][1]],
    )  # fmt: skip
    for k in range(2):
        assert [h["val_loss"] for h in resumed.results[k].history] == [
            h["val_loss"] for h in full.results[k].history
        ]
        assert resumed.results[k].freeze_epoch == full.results[k].freeze_epoch
        assert _max_rel(resumed.states[k], full.states[k]) == 0.0


def test_text_encoder_tagging_with_padding_matches() -> None:
    cfgs = [_adamw(lr, batch_size=8, budget="updates", max_updates=10) for lr in (1e-3, 3e-3)]
    _compare("text_encoder", _text(), {"preset": "tiny", "norm": "autonorm"}, cfgs, skip_key_bias=True)


def test_tabular_regression_matches() -> None:
    _compare("tabular", _rows(), {"preset": "tiny"}, [_adamw(1e-3), _adamw(3e-3)], skip_key_bias=True)


def test_members_with_their_own_splits() -> None:
    # A trial's split depends on its seed: members may bring their own (same sizes).
    splits = [make_splits(n_train=80, seed=s) for s in SEEDS]
    members = [create_members("mlp", s, [seed], preset="tiny")[0] for s, seed in zip(splits, SEEDS)]
    seps = [create_members("mlp", s, [seed], preset="tiny")[0] for s, seed in zip(splits, SEEDS)]
    out = fit_stacked(members, splits, _sgd(0.1), seeds=SEEDS)
    for k in range(2):
        ref = fit(seps[k], splits[k], _sgd(0.1), seed=SEEDS[k])
        assert out.results[k].final["val_accuracy"] == pytest.approx(ref.final["val_accuracy"])
        assert _max_rel(out.states[k], seps[k].state_dict()) < TOL


# ------------------------------------------------------------------- a member whatever stack it is in


@pytest.mark.parametrize(
    ("name", "kw", "make_splits_", "cfg", "lr"),
    [
        *[("mlp", {"preset": "tiny", "layer": a}, make_splits, _sgd, 1.0) for a in MLP_ARMS],
        ("vit_lite", {"preset": "tiny", "norm": "autonorm", "patch_size": 4}, _images, _adamw, 1e-3),
    ],
)
def test_a_members_numbers_do_not_depend_on_the_stack_it_trains_in(
    name: str, kw: dict[str, Any], make_splits_: Any, cfg: Any, lr: float
) -> None:
    # A group's stacks are dealt by work and slots (workers/members.py), so one member trains beside
    # other members on another machine, with another stack cap or after a rerun. For the MLP and
    # ViT-Lite it ends bit for bit the same: alone, among 4 at its own lr (the first layer's step
    # applied in the backward), or among 4 at other lrs (the step applied after it). The CNN's
    # grouped convolutions are not: measured 1.8e-7 (conv_batchnorm) after 10 updates, K=1 vs K=4.
    splits = make_splits_(n_train=80) if make_splits_ is make_splits else make_splits_()
    others = [11, 5, 7]
    runs = {
        "alone": ([3], [lr]),
        "same lr": ([3, *others], [lr] * 4),
        "other lrs": ([3, *others], [lr, *[lr / 3] * 3]),
    }
    states = {}
    for label, (seeds, lrs) in runs.items():
        out = fit_stacked(
            create_members(name, splits, seeds, **kw), splits, [cfg(x) for x in lrs], seeds=seeds
        )
        assert out.stacked, out.reason
        states[label] = out.states[0]
    alone = states.pop("alone")
    for label, state in states.items():
        assert state.keys() == alone.keys()
        assert all(torch.equal(state[n], t) for n, t in alone.items() if isinstance(t, Tensor)), (
            name,
            kw,
            label,
        )


def test_adamw_updates_a_member_alike_in_any_stack() -> None:
    # The fused AdamW kernel's vectorized loop and its scalar tail round apart (a few % of random
    # 2-element cases after two steps): one call over the whole stack would make member 0's update
    # depend on K. The stacked optimizer calls it per member.
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        scale = 10.0 ** float(torch.empty(1).uniform_(-12.0, 0.0, generator=g))
        p0 = torch.randn(4, 2, generator=g) * 0.01
        grads = torch.randn(2, 4, 2, generator=g) * scale
        finals = []
        for K in (1, 4):
            param = nn.Parameter(p0[:K].clone())
            opt = StackedOptimizer([("b", param)], kind="adamw", num_members=K)
            masks = {"b": torch.ones(K, dtype=torch.bool)}
            for step in range(2):
                param.grad = grads[step, :K].clone()
                opt.step(lr=[1e-3] * K, weight_decay=[0.0] * K, momentum=[0.0] * K, masks=masks)
            finals.append(param.detach()[0].clone())
        assert torch.equal(finals[0], finals[1]), trial


# ----------------------------------------------------------------------------------------- divergence


def _fields(divergence: Any) -> tuple[Any, ...] | None:
    """A typed divergence record by field (its value as text: a NaN is not equal to itself)."""
    if divergence is None:
        return None
    return (divergence.loss, divergence.epoch, divergence.update, str(divergence.value))


def test_a_diverging_member_stops_and_the_others_still_match() -> None:
    splits = make_splits(n_train=80)
    cfgs = [_sgd(1e6), _sgd(0.1)]
    members = create_members("mlp", splits, SEEDS, preset="tiny")
    seps = create_members("mlp", splits, SEEDS, preset="tiny")
    out = fit_stacked(members, splits, cfgs, seeds=SEEDS)
    refs = [fit(m, splits, c, seed=s) for m, c, s in zip(seps, cfgs, SEEDS)]
    assert refs[0].status == "diverged"  # the setting really diverges
    assert out.results[0].status == "diverged" and "non-finite" in out.results[0].message
    assert out.results[0].message == refs[0].message and out.results[0].updates == refs[0].updates
    assert _fields(out.results[0].divergence) == _fields(refs[0].divergence) is not None
    assert out.results[1].divergence is None
    assert out.results[1].status == "completed" and out.results[1].updates == 10
    assert _max_rel(out.states[1], seps[1].state_dict()) < TOL
    # the diverged member's recorded weights are those it had when it stopped
    assert out.states[0].keys() == seps[0].state_dict().keys()
    assert all(torch.isfinite(t).all() for t in out.states[0].values())


def test_a_member_diverging_under_one_shared_sgd_lr_leaves_the_others_matching() -> None:
    # One lr for both (the backward-applied SGD step is armed), but member 0's data overflow its first
    # forward: from that update on, the first layer computes its gradient and the masked step applies.
    ok = make_splits(n_train=80, seed=SEEDS[1])
    x, y = ok.train
    bad = Splits("blobs", (x * 1e38, y), ok.val, ok.test, "classification", 3, (8,))
    splits = [bad, ok]
    members = [create_members("mlp", s, [seed], preset="tiny")[0] for s, seed in zip(splits, SEEDS)]
    seps = [create_members("mlp", s, [seed], preset="tiny")[0] for s, seed in zip(splits, SEEDS)]
    out = fit_stacked(members, splits, _sgd(0.1), seeds=SEEDS)
    refs = [fit(m, s, _sgd(0.1), seed=seed) for m, s, seed in zip(seps, splits, SEEDS)]
    assert refs[0].status == out.results[0].status == "diverged"
    assert out.results[0].message == refs[0].message and out.results[0].updates == refs[0].updates == 0
    assert _fields(out.results[0].divergence) == _fields(refs[0].divergence) is not None
    assert out.results[1].divergence is None
    assert out.results[1].status == "completed" and out.results[1].updates == 10
    assert _max_rel(out.states[0], seps[0].state_dict()) == 0.0  # as it was when it diverged: its init
    assert _max_rel(out.states[1], seps[1].state_dict()) < TOL


# ---------------------------------------------------------------------------------- checkpoint, resume


@pytest.mark.parametrize(
    ("layer", "optimizer"),
    [("linear", "adamw"), ("linear_batchnorm", "sgd")],  # AdamW moments and steps; SGD momentum, BN buffers
)
def test_member_states_resume_stacked_and_separately(layer: str, optimizer: str) -> None:
    # (Not AdamW with BatchNorm: the bias of a linear before BatchNorm has a zero gradient, float noise
    # that AdamW turns into ±lr steps in any two runs whose kernels differ.)
    splits = make_splits(n_train=80)
    kw = {"preset": "tiny", "layer": layer}
    if optimizer == "adamw":
        cfgs = [_adamw(3e-3, epochs=3), _adamw(1e-2, epochs=3)]
    else:
        cfgs = [_sgd(0.05, epochs=3, momentum=0.9), _sgd(0.1, epochs=3, momentum=0.5)]
    states: dict[int, dict[int, dict[str, Any]]] = {}
    full = fit_stacked(
        create_members("mlp", splits, SEEDS, **kw), splits, cfgs, seeds=SEEDS,
        checkpoint_fn=lambda epoch, st: states.__setitem__(epoch, st),
    )  # fmt: skip
    assert sorted(states) == [1, 2, 3] and sorted(states[1]) == [0, 1]
    resumed = fit_stacked(
        create_members("mlp", splits, SEEDS, **kw),
        splits,
        cfgs,
        seeds=SEEDS,
        resume_states=[states[1][0], states[1][1]],
    )
    for k in range(2):
        assert [h["val_loss"] for h in resumed.results[k].history] == [
            h["val_loss"] for h in full.results[k].history
        ]
        assert _max_rel(resumed.states[k], full.states[k]) == 0.0
        # the same state continues that member alone in a separate fit
        alone = create_members("mlp", splits, [SEEDS[k]], **kw)[0]
        fit(alone, splits, cfgs[k], seed=SEEDS[k], resume_state=states[1][k])
        assert _max_rel(full.states[k], alone.state_dict()) < TOL


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 99},  # another seed
        {"config": {"lr": 0.5}},  # another value of a field
        {"config": {"no_such_field": 1}},  # a field this version does not know
    ],
)
def test_stacked_and_ordinary_resume_refuse_the_same_foreign_states(change: dict[str, Any]) -> None:
    """One rule for both loops (``same_run``): a state of another run is refused by the stacked loop
    exactly when the ordinary loop refuses it; an execution choice (``compile``) is not another run."""
    splits = make_splits(n_train=80)
    cfg = _sgd(0.05, epochs=2)
    states: dict[int, dict[int, dict[str, Any]]] = {}
    fit_stacked(
        create_members("mlp", splits, SEEDS, preset="tiny"), splits, [cfg, cfg], seeds=SEEDS,
        checkpoint_fn=lambda epoch, st: states.__setitem__(epoch, st),
    )  # fmt: skip
    state = dict(states[1][0])
    state["config"] = {**state["config"], "compile": "on", **change.get("config", {})}
    state["seed"] = change.get("seed", state["seed"])
    with pytest.raises(ValueError, match="another config or seed"):
        fit(
            create_members("mlp", splits, SEEDS[:1], preset="tiny")[0],
            splits,
            cfg,
            seed=SEEDS[0],
            resume_state=state,
        )
    with pytest.raises(ValueError, match="another config or seed"):
        fit_stacked(
            create_members("mlp", splits, SEEDS, preset="tiny"), splits, [cfg, cfg], seeds=SEEDS,
            resume_states=[state, states[1][1]],
        )  # fmt: skip
    # compile differs alone: the same run, resumed by both
    same = {**states[1][0], "config": {**states[1][0]["config"], "compile": "on"}}
    fit(
        create_members("mlp", splits, SEEDS[:1], preset="tiny")[0],
        splits,
        cfg,
        seed=SEEDS[0],
        resume_state=same,
    )
    out = fit_stacked(
        create_members("mlp", splits, SEEDS, preset="tiny"), splits, [cfg, cfg], seeds=SEEDS,
        resume_states=[same, states[1][1]],
    )  # fmt: skip
    assert [len(r.history) for r in out.results] == [2, 2]


# --------------------------------------------------------------------------------------------- fallbacks


@pytest.fixture
def quiet_rng() -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        yield


@pytest.mark.parametrize(
    ("config", "training", "needle"),
    [
        ({"type": "vit_lite", "preset": "tiny", "norm": "adanorm"}, None, "AdaNorm"),
        ({"type": "text_encoder", "preset": "tiny", "norm": "film"}, None, "FiLMNorm"),
        (
            {"type": "vit_lite", "preset": "tiny", "norm": {"type": "autonorm", "hard": True}},
            None,
            "hard=True",
        ),
        (
            {
                "type": "vit_lite",
                "preset": "tiny",
                "norm": {"type": "autonorm", "candidates": ["adanorm", "layernorm"]},
            },
            None,
            "AdaNorm",
        ),
        ({"type": "mlp", "preset": "tiny"}, {"precision": "bf16"}, "float32"),
        ({"model": {"type": "cnn", "preset": "tiny"}, "training": {"precision": "bf16"}}, None, "float32"),
    ],
)
def test_stackable_refuses_with_a_reason(
    config: dict[str, Any], training: Any, needle: str, quiet_rng: None
) -> None:
    ok, reason = stackable(config, training)
    assert not ok
    assert needle in reason


def test_stackable_accepts_every_shipped_arm(quiet_rng: None) -> None:
    arms: list[dict[str, Any]] = [{"type": "mlp", "layer": a} for a in MLP_ARMS]
    arms += [{"type": "cnn", "layer": a} for a in CNN_ARMS]
    arms += [
        {"type": "vit_lite", "norm": n, "linear": lin} for n in VIT_NORMS for lin in ("linear", "corrected")
    ]
    arms += [{"type": "text_encoder", "norm": "autonorm", "depth": 4}]
    for arm in arms:
        assert stackable({**arm, "preset": "tiny"}) == (True, ""), arm


def test_stackable_refuses_a_foreign_module() -> None:
    ok, reason = stackable(nn.Sequential(nn.Linear(3, 3)))
    assert not ok and "Sequential" in reason


def test_fit_stacked_falls_back_to_separate_fits_and_says_why() -> None:
    splits = _images()
    kw = {"preset": "tiny", "norm": "adanorm", "patch_size": 4}
    cfg = _adamw(1e-3, epochs=1)
    out = fit_stacked(create_members("vit_lite", splits, SEEDS, **kw), splits, cfg, seeds=SEEDS)
    assert not out.stacked and "AdaNorm" in out.reason
    for k, m in enumerate(create_members("vit_lite", splits, SEEDS, **kw)):
        ref = fit(m, splits, cfg, seed=SEEDS[k])
        assert out.results[k].final["val_loss"] == ref.final["val_loss"]  # the same code: identical
        assert _max_rel(out.states[k], m.state_dict()) == 0.0


def test_members_must_share_the_step_structure() -> None:
    splits = make_splits(n_train=80)
    with pytest.raises(ValueError, match="batch_size"):
        fit_stacked(
            create_members("mlp", splits, SEEDS, preset="tiny"),
            splits,
            [_sgd(0.1), _sgd(0.1, batch_size=8)],
            seeds=SEEDS,
        )


# ------------------------------------------------------------- the fused (DyT, LayerNorm) mixture, stacked


def _stacked_autonorms(candidates: tuple[str, str], frozen: int | None = None) -> Any:
    from autonorm_core.norms import AutoNorm
    from autonorm_core.stacking.layers import stack_norm

    members = []
    for k in range(3):
        m = AutoNorm(6, candidates=candidates, selector_init="default", seed=k).double()
        with torch.no_grad():
            for i, p in enumerate(m.parameters()):
                p.add_(
                    0.3
                    * torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * k + i), dtype=p.dtype)
                )
        members.append(m)
    layer = stack_norm(members).train()
    if frozen is not None:
        layer.freeze(frozen, sample=False)
    return layer


@pytest.mark.parametrize("shape", [(3, 4, 5, 6), (3, 4, 6)], ids=["KBTD", "KBD"])
@pytest.mark.parametrize("candidates", [("dyt", "layernorm"), ("layernorm", "dyt")], ids=["dyt_ln", "ln_dyt"])
@pytest.mark.parametrize("frozen", [None, 1], ids=["learning", "member1-frozen"])
def test_the_stacked_fused_mixture_matches_the_stacked_reference_expression(
    shape: tuple[int, ...], candidates: tuple[str, str], frozen: int | None
) -> None:
    # StackedMixture runs the (DyT, LayerNorm) pair through _MemberDyTLayerNormMix, the ordinary
    # layer's fused plan with a member dimension: the same output (the forward is the stacked layers'
    # own expression) and every gradient to float64 rounding, per member.
    from autonorm_core.norms.helpers import _reference_paths

    layer = _stacked_autonorms(candidates, frozen)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, generator=g)
    dy = torch.randn(shape, dtype=torch.float64, generator=g)
    runs = []
    for reference in (False, True):
        for k in range(3):
            layer.rngs[k].manual_seed(k)  # the same Gumbel noise both times
        xi = x.clone().requires_grad_(True)
        with _reference_paths() if reference else torch.enable_grad():
            y = layer(xi)
        fused = type(y.grad_fn).__name__ == "_MemberDyTLayerNormMixBackward"
        assert fused == (not reference and candidates[0] == "dyt")  # (LN, DyT): the reference expression
        params = list(layer.parameters())
        grads = torch.autograd.grad(y, [xi, *params], dy, allow_unused=True)
        runs.append([y, *(torch.zeros_like(p) if gr is None else gr for gr, p in zip(grads, [xi, *params]))])
    names = ["out", "x", *(n for n, _ in layer.named_parameters())]
    assert torch.equal(runs[0][0], runs[1][0])
    for name, a, b in zip(names[1:], runs[0][1:], runs[1][1:]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert all(gr.abs().sum() > 0 for n, gr in zip(names[2:], runs[0][2:]) if "branches" in n)


def test_the_stacked_fused_mixture_passes_gradcheck() -> None:
    from autonorm_core.norms.fused import _MemberDyTLayerNormMix

    g = torch.Generator().manual_seed(0)

    def t(*shape: int) -> Tensor:
        return torch.randn(shape, dtype=torch.float64, generator=g).requires_grad_(True)

    K, B, T, D = 2, 3, 4, 5
    w = torch.rand(K, B, dtype=torch.float64, generator=g).requires_grad_(True)
    inputs = (t(K, B, T, D), w, t(K, 1), t(K, D), t(K, D), t(K, D), t(K, D))
    assert torch.autograd.gradcheck(lambda *a: _MemberDyTLayerNormMix.apply(*a, 1e-5), inputs)
