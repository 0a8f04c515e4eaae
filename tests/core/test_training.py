"""Tests of autonorm_core.training: determinism, resume, AutoNorm-S freezing, divergence, budgets.

Small synthetic tensors and tiny models keep most fits here under a second on one core; two tests use
the real digits loader and tiny ViT-Lite (resume with stochastic depth; the loop really learns).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from torch import nn

from autonorm_core.data import Splits
from autonorm_core.norms import create_norm
from autonorm_core.training import (
    TIMING_KEYS,
    FitResult,
    GateFreeze,
    StopTraining,
    TrainConfig,
    fit,
    load_state,
    lr_at_step,
    save_state,
    should_freeze,
)
from tests.core.blobs import make_splits

LN2 = math.log(2.0)


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------- helpers


class GatedMLP(nn.Module):
    """Linear -> AutoNorm -> GELU, twice (dropout between), then a head: two gate layers."""

    def __init__(
        self, in_features: int, num_classes: int, *, width: int = 16, norm: str = "autonorm"
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.norm1 = create_norm(norm, width)
        self.fc2 = nn.Linear(width, width)
        self.norm2 = create_norm(norm, width)
        # Dropout draws from torch's default generator: resume must restore that stream too.
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm1(self.fc1(x)))
        h = nn.functional.gelu(self.norm2(self.fc2(self.drop(h))))
        return self.head(h)


class Tagger(nn.Module):
    """Embedding -> AutoNorm -> per-token head; (B, T) token ids to (B, T, C) logits."""

    def __init__(self, vocab: int, num_tags: int, width: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.norm = create_norm("autonorm", width)
        self.head = nn.Linear(width, num_tags)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(x)))  # (B, T, C)


def make_model(norm: str = "autonorm", seed: int = 0) -> nn.Module:
    # The test, not fit, decides the initialisation; fork so the caller's global RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GatedMLP(8, 3, norm=norm)


def strip_timing(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]


def selector_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of the gate selectors (what freezing must keep bit-identical)."""
    out = {}
    for name, p in model.named_parameters():
        if ".selector." in f".{name}":
            out[name] = p.detach().clone()
    assert out, "the model has no selector parameters; the naming convention changed"
    return out


CFG = TrainConfig(epochs=3, batch_size=32, lr=3e-3, warmup_fraction=0.1)


# ------------------------------------------------------------------------------------ determinism


def test_same_seed_gives_identical_history_and_weights() -> None:
    splits = make_splits()
    a, b = make_model(), make_model()
    ra = fit(a, splits, CFG, seed=7)
    rb = fit(b, splits, CFG, seed=7)
    assert ra.status == rb.status == "completed"
    assert len(ra.history) == CFG.epochs
    assert strip_timing(ra.history) == strip_timing(rb.history)
    for (na, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), na


def test_other_seed_gives_other_history() -> None:
    splits = make_splits()
    ra = fit(make_model(), splits, CFG, seed=1)
    rb = fit(make_model(), splits, CFG, seed=2)
    assert strip_timing(ra.history) != strip_timing(rb.history)


def test_fit_leaves_the_global_rng_untouched() -> None:
    before = torch.get_rng_state()
    fit(make_model(), make_splits(), CFG, seed=3)
    assert torch.equal(before, torch.get_rng_state())


# ------------------------------------------------------------------------------------- resume


@pytest.mark.parametrize("resume_after", [1, 2, 3])
def test_resumed_fit_equals_uninterrupted(tmp_path: Any, resume_after: int) -> None:
    """Resume before, at and after the freeze epoch (t_freeze=2): the rest of the run is unchanged."""
    cfg = TrainConfig(
        epochs=4, batch_size=32, lr=3e-3, freeze=GateFreeze(t_freeze=2, eps_h=0.1, rule="always")
    )
    splits = make_splits()
    states: dict[int, dict[str, Any]] = {}
    full_model = make_model()
    full = fit(full_model, splits, cfg, seed=5, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    assert sorted(states) == [1, 2, 3, 4]

    path = tmp_path / "state.pt"
    save_state(path, states[resume_after])
    resumed_model = make_model(seed=99)  # a different init: everything must come from the state
    resumed = fit(resumed_model, splits, cfg, seed=5, resume_state=load_state(path))
    assert resumed.status == "completed"
    assert strip_timing(resumed.history) == strip_timing(full.history)
    assert resumed.freeze_epoch == full.freeze_epoch == 2
    for (name, p), q in zip(full_model.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(p, q), name


def test_checkpoint_state_is_a_snapshot_not_a_view() -> None:
    states: dict[int, dict[str, Any]] = {}
    model = make_model()
    fit(model, make_splits(), CFG, seed=0, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    first = states[1]["model"]
    last = states[CFG.epochs]["model"]
    assert any(not torch.equal(first[k], last[k]) for k in first)
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())


def test_resume_with_other_config_is_refused() -> None:
    states: dict[int, dict[str, Any]] = {}
    fit(make_model(), make_splits(), CFG, seed=0, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    with pytest.raises(ValueError, match="another config or seed"):
        fit(make_model(), make_splits(), CFG, seed=1, resume_state=states[1])


# ------------------------------------------------------------------------------------- freezing


def test_selector_is_bit_identical_after_the_freeze_epoch() -> None:
    cfg = TrainConfig(
        epochs=4,
        batch_size=32,
        lr=1e-2,
        weight_decay=0.5,  # large decay: AdamW would visibly shrink the selector if it still held it
        freeze=GateFreeze(t_freeze=2, eps_h=0.1, rule="always"),
    )
    model = make_model()
    init = selector_params(model)
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    backbone: dict[int, torch.Tensor] = {}

    class Snap:
        def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> None:
            snapshots[epoch] = selector_params(model)
            backbone[epoch] = model.fc2.weight.detach().clone()

    result = fit(model, make_splits(), cfg, seed=0, callbacks=[Snap()])
    assert result.freeze_epoch == 2
    assert [row["selector_frozen"] for row in result.history] == [0.0, 1.0, 1.0, 1.0]
    # The selector trained before the freeze ...
    assert any(not torch.equal(init[k], snapshots[2][k]) for k in init)
    # ... and not one bit after it, while the backbone kept training.
    for epoch in (3, 4):
        for k in init:
            assert torch.equal(snapshots[2][k], snapshots[epoch][k]), (epoch, k)
    assert not torch.equal(backbone[2], backbone[4])


@pytest.mark.parametrize(
    ("rule", "eps_h", "expect_frozen"),
    [
        ("freeze_if_high", 0.1, True),  # H ~ ln 2 after one epoch: has not fallen below 0.1
        ("freeze_if_high", 1.0, False),  # H < 1.0 always (max ln 2)
        ("freeze_if_low", 0.1, False),
        ("freeze_if_low", 1.0, True),
        ("always", 1.0, True),
        ("always", 0.0, True),
    ],
)
def test_freeze_rule_semantics(rule: str, eps_h: float, expect_frozen: bool) -> None:
    cfg = TrainConfig(epochs=2, batch_size=32, freeze=GateFreeze(t_freeze=1, eps_h=eps_h, rule=rule))  # type: ignore[arg-type]
    model = make_model()
    result = fit(model, make_splits(), cfg, seed=0)
    entropy = result.history[0]["gate_entropy"]
    assert 0.0 < entropy <= LN2 + 1e-6
    assert result.freeze_entropy == entropy
    assert result.freeze_epoch == (1 if expect_frozen else None)
    assert [row["selector_frozen"] for row in result.history] == [float(expect_frozen)] * 2
    assert all(m.frozen == expect_frozen for m in (model.norm1, model.norm2))


def test_should_freeze_rules() -> None:
    assert should_freeze("freeze_if_high", 0.5, 0.1) and not should_freeze("freeze_if_high", 0.05, 0.1)
    assert should_freeze("freeze_if_low", 0.05, 0.1) and not should_freeze("freeze_if_low", 0.5, 0.1)
    assert should_freeze("always", 0.0, 0.1) and should_freeze("always", 0.7, 0.1)
    with pytest.raises(ValueError, match="freeze_if_low"):
        should_freeze("sometimes", 0.5, 0.1)


def test_t_freeze_beyond_the_run_never_freezes() -> None:
    cfg = TrainConfig(epochs=2, batch_size=32, freeze=GateFreeze(t_freeze=5, rule="always"))
    result = fit(make_model(), make_splits(), cfg, seed=0)
    assert result.freeze_epoch is None
    assert all(row["selector_frozen"] == 0.0 for row in result.history)


@pytest.mark.parametrize("sample", [False, True])
def test_noise_after_freezing_follows_the_config(sample: bool) -> None:
    cfg = TrainConfig(
        epochs=2, batch_size=32, freeze=GateFreeze(t_freeze=1, rule="always", sample_after_freeze=sample)
    )
    model = make_model()
    fit(model, make_splits(), cfg, seed=0)
    norm = model.norm1
    norm.train()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = norm(x), norm(x)
    assert norm.frozen
    assert torch.equal(a, b) != sample  # frozen + no sampling: deterministic softmax weights


def test_tau_anneals_linearly_to_tau_final() -> None:
    cfg = TrainConfig(epochs=2, batch_size=32, tau_final=0.1)  # 5 updates per epoch, 10 in all
    model = make_model()
    result = fit(model, make_splits(n_train=160), cfg, seed=0)
    assert [row["tau"] for row in result.history] == [pytest.approx(0.5 - 0.4 * 4 / 9), pytest.approx(0.1)]
    assert model.norm1.tau == pytest.approx(0.1) and model.norm2.tau == pytest.approx(0.1)


# ------------------------------------------------------------------------------------- metrics


def test_gate_metrics_are_noise_free_validation_statistics() -> None:
    """Recompute entropy and DyT weight from gate_probs on the validation split in eval mode."""
    splits = make_splits()
    recomputed: dict[str, float] = {}
    reported: dict[str, float] = {}

    class Check:
        def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> None:
            model.eval()
            inputs: dict[int, torch.Tensor] = {}
            norms = [model.norm1, model.norm2]
            hooks = [
                n.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
                for i, n in enumerate(norms)
            ]
            with torch.no_grad():
                model(splits.val[0])
                for h in hooks:
                    h.remove()
                for i, n in enumerate(norms):
                    p = n.gate_probs(inputs[i])
                    dyt = list(n.candidates).index("dyt")
                    recomputed[f"gate_entropy/layer_{i}"] = float(
                        -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
                    )
                    recomputed[f"dyt_weight/layer_{i}"] = float(p[:, dyt].mean())
            reported.update(metrics)

    # A large lr so the gates move away from the uniform start within one epoch.
    fit(make_model(), splits, TrainConfig(epochs=1, batch_size=32, lr=3e-2), seed=0, callbacks=[Check()])
    for key, value in recomputed.items():
        assert reported[key] == pytest.approx(value, abs=1e-6), key
    assert reported["gate_entropy"] == pytest.approx(
        (recomputed["gate_entropy/layer_0"] + recomputed["gate_entropy/layer_1"]) / 2, abs=1e-6
    )
    assert any(abs(recomputed[f"dyt_weight/layer_{i}"] - 0.5) > 1e-4 for i in (0, 1)), "gates never moved"


def test_history_keys_and_json_floats() -> None:
    result = fit(make_model(), make_splits(), CFG, seed=0)
    row = result.history[-1]
    for key in (
        "epoch",
        "train_loss",
        "val_loss",
        "val_accuracy",
        "test_accuracy",
        "gate_entropy",
        "gate_entropy/layer_0",
        "gate_entropy/layer_1",
        "dyt_weight/layer_0",
        "dyt_weight/layer_1",
        "selector_frozen",
        "examples_per_s",
        "lr",
    ):
        assert key in row, key
    assert all(type(v) is float and math.isfinite(v) for v in row.values())
    assert row["gate_entropy"] == pytest.approx(
        (row["gate_entropy/layer_0"] + row["gate_entropy/layer_1"]) / 2
    )
    assert 0.0 <= row["dyt_weight/layer_0"] <= 1.0


def test_models_without_gates_have_no_gate_keys() -> None:
    result = fit(make_model(norm="layernorm"), make_splits(), CFG, seed=0)
    assert result.status == "completed"
    assert not any(k.startswith(("gate_entropy", "dyt_weight")) for k in result.history[-1])


def test_tagging_ignores_pad_positions() -> None:
    gen = torch.Generator().manual_seed(0)

    def tagged(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(1, 20, (n, 6), generator=gen)
        y = x % 4  # the tag is a function of the token: learnable
        lengths = torch.randint(2, 7, (n,), generator=gen)
        pad = torch.arange(6).unsqueeze(0) >= lengths.unsqueeze(1)
        x = x.masked_fill(pad, 0)
        # Pad targets that a pad-blind loop would count: tag 0 where the model will predict anything.
        return x, y.masked_fill(pad, -100)

    splits = Splits(
        name="toy_tags",
        train=tagged(128),
        val=tagged(48),
        test=tagged(48),
        task="tagging",
        num_classes=4,
        input_shape=(6,),
        vocab_size=20,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Tagger(20, 4)
    checked: list[float] = []

    class Check:
        def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> None:
            model.eval()
            with torch.no_grad():
                pred = model(splits.val[0]).argmax(-1)
            mask = splits.val[1] != -100
            manual = (pred[mask] == splits.val[1][mask]).sum().item() / mask.sum().item()
            assert metrics["val_accuracy"] == pytest.approx(manual, abs=1e-9)
            checked.append(manual)

    result = fit(
        model,
        splits,
        TrainConfig(epochs=3, batch_size=16, lr=1e-2, label_smoothing=0.1),
        seed=0,
        callbacks=[Check()],
    )
    assert result.status == "completed" and len(checked) == 3
    assert math.isfinite(result.history[-1]["train_loss"])


def test_regression_reports_rmse() -> None:
    gen = torch.Generator().manual_seed(0)

    def reg(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 8, generator=gen)
        return x, x[:, 0] - 0.5 * x[:, 1]

    splits = Splits(
        name="toy_reg",
        train=reg(160),
        val=reg(64),
        test=reg(64),
        task="regression",
        num_classes=0,
        input_shape=(8,),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GatedMLP(8, 1)
    result = fit(model, splits, TrainConfig(epochs=6, batch_size=16, lr=1e-2), seed=0)
    rows = result.history
    assert "val_rmse" in rows[-1] and "test_rmse" in rows[-1] and "val_accuracy" not in rows[-1]
    assert rows[-1]["val_rmse"] == pytest.approx(math.sqrt(rows[-1]["val_loss"]))
    assert rows[-1]["val_rmse"] < rows[0]["val_rmse"]


# --------------------------------------------------------------------------------- divergence


def test_absurd_learning_rate_diverges_without_exception() -> None:
    cfg = TrainConfig(epochs=5, batch_size=32, lr=1e12, optimizer="sgd", grad_clip=None, warmup_fraction=0.0)
    result = fit(make_model(norm="identity"), make_splits(), cfg, seed=0)
    assert result.status == "diverged"
    # a typed record of where: the update's training loss, in the epoch after the last whole one
    assert result.divergence is not None and result.divergence.loss == "training"
    assert not math.isfinite(result.divergence.value)
    assert result.divergence.epoch == len(result.history) + 1
    assert result.divergence.update == result.updates
    assert result.message == str(result.divergence) and "non-finite" in result.message
    assert len(result.history) < cfg.epochs
    assert all(math.isfinite(v) for row in result.history for v in row.values())


def test_stop_training_from_a_callback() -> None:
    class StopAtTwo:
        def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> None:
            if epoch == 2:
                raise StopTraining("enough")

    result = fit(
        make_model(), make_splits(), TrainConfig(epochs=5, batch_size=32), seed=0, callbacks=[StopAtTwo()]
    )
    assert result.status == "stopped" and len(result.history) == 2 and result.message == "enough"


# ------------------------------------------------------------------------- schedule and budgets


@pytest.mark.parametrize(
    ("scaling", "batch", "expected"),
    [
        ("constant", 256, 1e-3),
        ("linear", 256, 4e-3),
        ("linear", 16, 2.5e-4),
        ("sqrt", 256, 2e-3),
        ("sqrt", 16, 5e-4),
    ],
)
def test_lr_scaling(scaling: str, batch: int, expected: float) -> None:
    cfg = TrainConfig(lr=1e-3, batch_size=batch, reference_batch_size=64, lr_scaling=scaling)  # type: ignore[arg-type]
    assert cfg.effective_lr == pytest.approx(expected)


def test_fit_uses_the_scaled_lr_and_schedule() -> None:
    cfg = TrainConfig(
        epochs=2,
        batch_size=16,
        lr=1e-3,
        lr_scaling="sqrt",
        reference_batch_size=64,
        schedule="constant",
        warmup_fraction=0.0,
    )
    result = fit(make_model(), make_splits(), cfg, seed=0)
    assert [row["lr"] for row in result.history] == [pytest.approx(5e-4)] * 2


def test_warmup_then_cosine_to_zero() -> None:
    total, warmup, peak = 100, 10, 1.0
    lrs = [lr_at_step(s, total=total, warmup=warmup, peak=peak) for s in range(total)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0) and lrs[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lrs[-1] == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert lr_at_step(50, total=total, warmup=warmup, peak=peak, schedule="constant") == 1.0


def test_updates_budget_derives_epochs() -> None:
    # 160 examples, batch 32 -> 5 updates per epoch; 12 updates -> 3 epochs, the last one partial.
    cfg = TrainConfig(batch_size=32, budget="updates", max_updates=12, epochs=1)
    assert cfg.steps_per_epoch(160) == 5 and cfg.total_updates(160) == 12 and cfg.num_epochs(160) == 3
    result = fit(make_model(), make_splits(n_train=160), cfg, seed=0)
    assert result.updates == 12 and len(result.history) == 3
    assert [row["updates"] for row in result.history] == [5.0, 10.0, 12.0]


def test_updates_budget_without_max_updates_is_epochs_at_the_reference_batch_size() -> None:
    # 160 examples, reference B=32 -> 5 updates per reference epoch; 2 epochs -> 10 updates at every B.
    for batch_size in (16, 32, 64):
        cfg = TrainConfig(batch_size=batch_size, reference_batch_size=32, budget="updates", epochs=2)
        assert cfg.total_updates(160) == 10
    with pytest.raises(ValueError, match="fewer than reference_batch_size"):
        TrainConfig(budget="updates", reference_batch_size=512).total_updates(160)


def test_epochs_budget_counts_full_batches() -> None:
    cfg = TrainConfig(epochs=2, batch_size=48)
    assert cfg.steps_per_epoch(160) == 3 and cfg.total_updates(160) == 6
    assert fit(make_model(), make_splits(n_train=160), cfg, seed=0).updates == 6
    with pytest.raises(ValueError, match="fewer than batch_size"):
        TrainConfig(batch_size=512).steps_per_epoch(160)


# ------------------------------------------------------------------------------------- config


def test_from_dict_builds_nested_freeze_and_round_trips() -> None:
    cfg = TrainConfig.from_dict(
        {"epochs": 3, "freeze": {"t_freeze": 2, "rule": "freeze_if_low"}, "grad_clip": None}
    )
    assert cfg.freeze == GateFreeze(t_freeze=2, rule="freeze_if_low")
    assert cfg.grad_clip is None
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"epoch": 3}, "unknown TrainConfig key"),
        ({"freeze": {"t_frz": 3}}, "unknown GateFreeze key"),
        ({"optimizer": "adam"}, "'adamw', 'sgd'"),
        ({"freeze": {"rule": "never"}}, "freeze_if_high"),
        ({"budget": "updates", "max_updates": 0}, "max_updates"),
        ({"max_updates": 10}, "only used with budget='updates'"),
        ({"lr": -1.0}, "lr must be"),
        ({"lr_scaling": "cubic"}, "'sqrt'"),
    ],
)
def test_invalid_configs_raise_value_error(d: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(d)


# ---------------------------------------------------------------------------- the loop learns


def test_digits_accuracy_after_a_short_fit() -> None:
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model

    splits = load_dataset("digits", seed=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = create_model("vit_lite", splits, norm="autonorm", preset="tiny")
    result: FitResult = fit(model, splits, TrainConfig(epochs=8, batch_size=64, lr=3e-3), seed=0)
    assert result.status == "completed"
    assert result.final["test_accuracy"] > 0.8
    assert result.final["val_accuracy"] > 0.8


def test_real_vit_resume_across_the_freeze_equals_uninterrupted() -> None:
    """The real tiny ViT-Lite (stochastic depth from the default generator, AutoNorm noise) resumes exactly."""
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model

    splits = load_dataset("digits", seed=0, subset=(320, 64))

    def build() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return create_model("vit_lite", splits, norm="autonorm", preset="tiny", drop_path=0.2)

    cfg = TrainConfig(epochs=3, batch_size=32, lr=3e-3, freeze=GateFreeze(t_freeze=1, rule="always"))
    states: dict[int, dict[str, Any]] = {}
    full = fit(build(), splits, cfg, seed=11, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    resumed = fit(build(), splits, cfg, seed=11, resume_state=states[1])
    assert full.freeze_epoch == 1 and len(full.history) == 3
    assert strip_timing(resumed.history) == strip_timing(full.history)


def test_text_gate_metrics_use_the_gates_own_padding_mask() -> None:
    """On padded text the logged gate statistics are what the gate computes: pooled over real tokens."""
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model
    from autonorm_core.norms import AutoNorm

    splits = load_dataset("pang_lee_polarity", seed=0, subset=(96, 64))
    model = create_model("text_encoder", splits, preset="tiny", depth=1, norm={"type": "autonorm"})
    gates = [m for m in model.modules() if isinstance(m, AutoNorm)]
    reported: dict[str, float] = {}
    recomputed: dict[str, float] = {}
    unmasked: dict[str, float] = {}

    class Check:
        def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> None:
            model.eval()
            seen: dict[int, tuple[torch.Tensor, Any]] = {}
            hooks = [
                g.register_forward_pre_hook(
                    lambda m, a, kw, i=i: seen.__setitem__(i, (a[0], kw.get("mask"))), with_kwargs=True
                )
                for i, g in enumerate(gates)
            ]
            with torch.no_grad():
                model(splits.val[0])
                for h in hooks:
                    h.remove()
                for i, g in enumerate(gates):
                    x, mask = seen[i]
                    assert mask is not None and not bool(mask.all())  # there is padding to exclude
                    p = g.gate_probs(x, mask=mask)
                    recomputed[f"gate_entropy/layer_{i}"] = float(
                        -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
                    )
                    q = g.gate_probs(x)
                    unmasked[f"gate_entropy/layer_{i}"] = float(
                        -(q * q.clamp_min(1e-12).log()).sum(-1).mean()
                    )
            reported.update(metrics)

    fit(model, splits, TrainConfig(epochs=1, batch_size=32, lr=3e-2), seed=0, callbacks=[Check()])
    for key, value in recomputed.items():
        assert reported[key] == pytest.approx(value, abs=1e-6), key
    assert any(abs(unmasked[k] - recomputed[k]) > 1e-6 for k in recomputed), "the mask changed nothing"
