"""Tests of the GPU path of ``fit``: ``TrainConfig.precision`` (bf16 autocast) and ``TrainConfig.compile``.

Everything runs on CPU: bf16 autocast exists there, and ``compile="on"`` compiles on any device. The
compiled fits share one module-scoped run (Inductor's CPU compile takes tens of seconds on a loaded
2-core machine); the tiny model has no dropout, so an eager and a compiled fit draw the same numbers
(AutoNorm's Gumbel noise comes from its own generator, outside the graphs) and differ by rounding only.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from autonorm_core.norms import create_norm
from autonorm_core.training import (
    COMPILE_SETTINGS,
    PRECISIONS,
    FitResult,
    GateFreeze,
    TrainConfig,
    fit,
    resolve_compile,
)
from tests.core.blobs import make_splits

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------- helpers


class TinyNet(nn.Module):
    """Linear -> norm -> GELU, twice, then a head; no dropout (eager and compiled draw the same noise)."""

    def __init__(self, norm: str = "autonorm", *, in_features: int = 8, classes: int = 3, width: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.norm1 = create_norm(norm, width)
        self.fc2 = nn.Linear(width, width)
        self.norm2 = create_norm(norm, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm1(self.fc1(x)))
        h = nn.functional.gelu(self.norm2(self.fc2(h)))
        return self.head(h)


def make_model(norm: str = "autonorm", seed: int = 0) -> TinyNet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyNet(norm)


def selector_params(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in state.items() if ".selector." in f".{k}"}
    assert out
    return out


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("precision", "fp16"),
        ("precision", "bfloat16"),
        ("compile", "yes"),
        ("compile", True),
        ("compile", "max"),
    ],
)
def test_bad_precision_or_compile_raises_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{field}="):
        TrainConfig.from_dict({field: value})


def test_defaults_and_round_trip() -> None:
    cfg = TrainConfig()
    assert (cfg.precision, cfg.compile) == ("fp32", "auto")
    assert set(PRECISIONS) == {"fp32", "bf16"} and set(COMPILE_SETTINGS) == {"auto", "on", "off"}
    cfg = TrainConfig.from_dict({"precision": "bf16", "compile": "on"})
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("field", "value"), [("precision", "fp16"), ("compile", "yes"), ("compile", True), ("precision", 16)]
)
def test_spec_refuses_bad_values_with_the_field_path(field: str, value: Any) -> None:
    from studies.kinds.search.spec import StudySpec
    from studies.schema import SpecError, validate_spec

    doc = {
        "name": "gpu_path",
        "model": {"type": "mlp", "preset": "tiny"},
        "data": {"type": "digits"},
        "training": {"epochs": 2, field: value},
        "search": {"space": [{"name": "training.lr", "type": "float", "low": 1e-4, "high": 1e-2}]},
    }
    with pytest.raises(SpecError) as info:
        validate_spec(doc, model=StudySpec)
    assert [i.path for i in info.value.issues] == [f"training.{field}"]


def test_spec_passes_both_fields_to_the_core_config() -> None:
    from studies.kinds.search.spec import StudySpec
    from studies.schema import validate_spec

    doc = {
        "name": "gpu_path",
        "model": {"type": "mlp", "preset": "tiny"},
        "data": {"type": "digits"},
        "training": {"epochs": 2, "precision": "bf16", "compile": "off"},
        "search": {"space": [{"name": "training.lr", "type": "float", "low": 1e-4, "high": 1e-2}]},
    }
    cfg = TrainConfig.from_dict(validate_spec(doc, model=StudySpec).base_config()["training"])
    assert (cfg.precision, cfg.compile) == ("bf16", "off")


def test_resolve_compile() -> None:
    assert resolve_compile("auto", "cpu") is False
    assert resolve_compile("auto", torch.device("cpu")) is False
    assert resolve_compile("auto", torch.device("cuda")) is True  # resolving needs no GPU
    assert resolve_compile("auto", "cuda:1") is True
    for device in ("cpu", torch.device("cuda")):
        assert resolve_compile("on", device) is True
        assert resolve_compile("off", device) is False
    with pytest.raises(ValueError, match=r"^compile="):
        resolve_compile("sometimes", "cpu")


# ------------------------------------------------------------------------------------------ bf16


def test_bf16_on_cpu_trains_under_autocast_with_float32_state() -> None:
    # LayerNorm, not AutoNorm: on CPU, autocast keeps layer_norm in bf16 while DyT's float32 alpha
    # promotes its output to float32, and the AutoNorm mixture refuses the mixed pair (an
    # autonorm_core.norms matter; on CUDA autocast runs layer_norm in float32).
    model = make_model("layernorm")
    seen: list[tuple[bool, torch.dtype]] = []
    model.fc1.register_forward_hook(lambda m, a, out: seen.append((m.training, out.dtype)))
    states: dict[int, dict[str, Any]] = {}
    cfg = TrainConfig(epochs=3, batch_size=32, lr=3e-3, precision="bf16", compile="auto")
    result: FitResult = fit(
        model, make_splits(), cfg, seed=0, checkpoint_fn=lambda e, s: states.__setitem__(e, s)
    )
    assert result.status == "completed"
    assert {dtype for _, dtype in seen} == {torch.bfloat16}
    assert {training for training, _ in seen} == {True, False}  # training and evaluation forwards
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    opt_state = states[3]["optimizer"]["state"]
    assert opt_state and all(
        t.dtype == torch.float32 for s in opt_state.values() for k, t in s.items() if k != "step"
    )
    assert all(math.isfinite(v) for row in result.history for v in row.values())
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.final["val_accuracy"] > 0.6  # chance: 1/3


def test_fp32_forward_runs_without_autocast() -> None:
    model = make_model("layernorm")
    seen: list[torch.dtype] = []
    model.fc1.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    fit(model, make_splits(), TrainConfig(epochs=1, batch_size=32), seed=0)
    assert set(seen) == {torch.float32}


# --------------------------------------------------------------------------------------- compile

# eval_batch_size 48 on 64 rows: a full and a partial (16-row) evaluation batch, both unlike the 32 of
# training; the freeze after epoch 1 flips requires_grad and the gates' frozen flag mid-run.
COMPILE_CFG = TrainConfig(
    epochs=3,
    batch_size=32,
    lr=3e-3,
    eval_batch_size=48,
    freeze=GateFreeze(t_freeze=1, rule="always"),
)


def _run(compile_setting: str) -> tuple[FitResult, TinyNet, dict[int, dict[str, Any]]]:
    cfg = TrainConfig.from_dict({**COMPILE_CFG.to_dict(), "compile": compile_setting})
    model = make_model()
    states: dict[int, dict[str, Any]] = {}
    result = fit(model, make_splits(), cfg, seed=0, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    return result, model, states


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """An eager and a compiled fit. The compiled one goes through Dynamo and AOTAutograd like any
    ``torch.compile`` but with the ``aot_eager`` backend: what these tests check is the training loop's
    side (wrapper, keys, freeze, gate statistics, resume), and Inductor's C++ code generation would add
    a minute of compiling on 2 cores. Inductor's numerics are checked by the compiled-step tests in
    tests/core/test_autonorm.py and tests/core/test_norms_contract.py."""
    import functools

    from torch._dynamo.utils import counters

    out: dict[str, Any] = {"eager": _run("off")}
    before = counters["stats"]["calls_captured"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
        out["compiled"] = _run("on")
    out["captured"] = counters["stats"]["calls_captured"] - before
    return out


def test_compiled_fit_matches_eager_after_one_epoch(runs: dict[str, Any]) -> None:
    assert runs["captured"] > 0  # Dynamo traced the forward: the fit really compiled
    eager, compiled = runs["eager"][0].history[0], runs["compiled"][0].history[0]
    for key in (
        "train_loss",
        "val_loss",
        "test_loss",
        "gate_entropy",
        "dyt_weight/layer_0",
        "dyt_weight/layer_1",
    ):
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-4), key


def test_compiled_checkpoint_keeps_the_model_keys(runs: dict[str, Any]) -> None:
    _, model, states = runs["compiled"]
    keys = list(make_model().state_dict())
    assert list(states[3]["model"]) == keys == list(runs["eager"][2][3]["model"])
    assert not any("_orig_mod" in k for k in keys)
    assert type(model) is TinyNet and getattr(model, "_compiled_call_impl", None) is None  # left uncompiled


def test_compiled_autonorm_freezes_and_logs_gate_statistics(runs: dict[str, Any]) -> None:
    result, _, states = runs["compiled"]
    assert result.status == "completed" and result.freeze_epoch == 1 and len(result.history) == 3
    for row in result.history:
        for key in ("gate_entropy", "gate_entropy/layer_0", "gate_entropy/layer_1", "dyt_weight/layer_0"):
            assert math.isfinite(row[key]), key
        assert 0.0 <= row["gate_entropy"] <= math.log(2.0) + 1e-6
        assert row["selector_frozen"] == 1.0
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    # frozen: the selector does not move after epoch 1, the rest does
    after_freeze, last = selector_params(states[1]["model"]), selector_params(states[3]["model"])
    assert all(torch.equal(after_freeze[k], last[k]) for k in after_freeze)
    assert not torch.equal(states[1]["model"]["fc1.weight"], states[3]["model"]["fc1.weight"])


def test_compiled_state_resumes_eagerly_and_vice_versa(runs: dict[str, Any]) -> None:
    eager_cfg = TrainConfig.from_dict({**COMPILE_CFG.to_dict(), "compile": "off"})
    resumed = fit(make_model(), make_splits(), eager_cfg, seed=0, resume_state=runs["compiled"][2][1])
    assert resumed.status == "completed" and len(resumed.history) == 3
    assert resumed.history[0] == runs["compiled"][0].history[0]  # the compiled epoch, carried over
    full = runs["eager"][0].history[-1]
    assert resumed.history[-1]["val_loss"] == pytest.approx(full["val_loss"], rel=1e-3, abs=1e-4)
    # precision is not an execution detail: a state of another precision is refused
    bf16_cfg = TrainConfig.from_dict({**eager_cfg.to_dict(), "precision": "bf16"})
    with pytest.raises(ValueError, match="another config"):
        fit(make_model(), make_splits(), bf16_cfg, seed=0, resume_state=runs["compiled"][2][1])


def test_state_written_before_the_fields_existed_resumes() -> None:
    states: dict[int, dict[str, Any]] = {}
    cfg = TrainConfig(epochs=2, batch_size=32)
    full = fit(make_model(), make_splits(), cfg, seed=0, checkpoint_fn=lambda e, s: states.__setitem__(e, s))
    old = dict(states[1])
    old["config"] = {k: v for k, v in old["config"].items() if k not in ("precision", "compile")}
    resumed = fit(make_model(), make_splits(), cfg, seed=0, resume_state=old)
    assert resumed.history[-1]["val_loss"] == full.history[-1]["val_loss"]
