"""Tests of autonorm_core.models: shapes per task, specs really used, invalid options, gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from autonorm_core.affine import DivergenceCorrectedLinear, PatchNormConv2d, PreNormAffine
from autonorm_core.data import Splits, load_dataset
from autonorm_core.models import (
    CNN_LAYERS,
    MLP_LAYERS,
    PRESETS,
    TextEncoder,
    ViTLite,
    create_model,
    list_models,
    model_defaults,
)
from autonorm_core.norms import AutoNorm, DyT, FiLMNorm, LayerNorm, get_norm_layer, list_norms

TRANSFORMERS = ("vit_lite", "text_encoder", "tabular")


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    """Model init draws from torch's default generator: fork it so tests neither leak nor depend on order."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        yield


@pytest.fixture(scope="module")
def data() -> dict[str, Splits]:
    return {
        "digits": load_dataset("digits", seed=0, subset=(64, 16)),
        "diabetes": load_dataset("diabetes", seed=0),
        "ptb": load_dataset("ptb_pos_sample", seed=0, subset=(64, 16)),
        "polarity": load_dataset("pang_lee_polarity", seed=0, subset=(64, 16)),
        "fashion": load_dataset("fashion_mnist", seed=0, subset=(32, 8)),
    }


def _batch(s: Splits, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    return s.train[0][:n], s.train[1][:n]


def _loss(out: torch.Tensor, y: torch.Tensor, s: Splits) -> torch.Tensor:
    if s.task == "regression":
        return nn.functional.mse_loss(out, y)
    return nn.functional.cross_entropy(
        out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=s.ignore_index
    )


# (model, data set, expected output shape given batch n)
CASES = [
    ("vit_lite", "digits", lambda s, n: (n, 10)),
    ("vit_lite", "fashion", lambda s, n: (n, 10)),
    ("text_encoder", "ptb", lambda s, n: (n, s.input_shape[0], s.num_classes)),
    ("text_encoder", "polarity", lambda s, n: (n, 2)),
    ("tabular", "diabetes", lambda s, n: (n,)),
    ("mlp", "digits", lambda s, n: (n, 10)),
    ("mlp", "diabetes", lambda s, n: (n,)),
    ("cnn", "fashion", lambda s, n: (n, 10)),
    ("cnn", "diabetes", lambda s, n: (n,)),
]


def test_registry_and_presets() -> None:
    assert list_models() == ("cnn", "mlp", "tabular", "text_encoder", "vit_lite")
    assert set(PRESETS) == set(list_models())
    vit = model_defaults("vit_lite")
    assert (vit["depth"], vit["heads"], vit["dim"], vit["patch_size"], vit["mlp_ratio"]) == (
        8,
        4,
        128,
        4,
        2.0,
    )
    assert (vit["drop_path"], vit["layerscale_init"], vit["final_norm"]) == (0.1, 1e-4, "layernorm")
    text = model_defaults("text_encoder")
    assert (text["depth"], text["heads"], text["dim"]) == (12, 8, 128)
    assert model_defaults("mlp")["hidden"] == (512, 512)
    assert "num_classes" not in vit and "vocab_size" not in text  # data fields are not options


@pytest.mark.parametrize(("name", "ds", "shape"), CASES)
@pytest.mark.parametrize("preset", ["tiny", "paper"])
def test_output_shape_per_task(name: str, ds: str, shape: Any, preset: str, data: dict[str, Splits]) -> None:
    s = data[ds]
    model = create_model(name, s, preset=preset).eval()
    x, _ = _batch(s, 3)
    out = model(x)
    assert tuple(out.shape) == shape(s, 3)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("name", "ds"), [("vit_lite", "digits"), ("text_encoder", "ptb"), ("tabular", "diabetes")]
)
def test_autonorm_replaces_both_sublayer_norms_of_every_block(
    name: str, ds: str, data: dict[str, Splits]
) -> None:
    model = create_model(name, data[ds], preset="tiny", depth=3, norm={"type": "autonorm", "tau": 2.0})
    gates = [m for m in model.modules() if isinstance(m, AutoNorm)]
    assert len(gates) == 2 * 3
    assert all(g.tau == 2.0 for g in gates)
    blocks = model.encoder.blocks
    assert all(isinstance(b.norm1, AutoNorm) and isinstance(b.norm2, AutoNorm) for b in blocks)
    assert type(model.encoder.norm) is LayerNorm  # final norm: open choice, LN
    with_final = create_model(name, data[ds], preset="tiny", depth=3, norm="autonorm", final_norm="autonorm")
    assert sum(isinstance(m, AutoNorm) for m in with_final.modules()) == 2 * 3 + 1


def test_norm_spec_options_and_per_layer_seeds(data: dict[str, Splits]) -> None:
    spec = {"type": "autonorm", "candidates": ("dyt", "layernorm", "rmsnorm"), "seed": 7}
    model = create_model("vit_lite", data["digits"], preset="tiny", norm=spec)
    gates = [m for m in model.modules() if isinstance(m, AutoNorm)]
    assert all(g.candidates == ("dyt", "layernorm", "rmsnorm") for g in gates)
    assert [g.rng_state()["seed"] for g in gates] == [7, 8, 9, 10]  # distinct noise per layer
    dyt = create_model("vit_lite", data["digits"], preset="tiny", norm={"type": "dyt", "alpha_init": 1.5})
    alphas = [m.alpha.item() for m in dyt.modules() if isinstance(m, DyT)]
    assert alphas == [1.5] * 4


LINEAR_TYPES: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {
    "linear": (nn.Linear, {}),
    "prenorm_l2": (PreNormAffine, {"kind": "l2"}),
    "prenorm_rms": (PreNormAffine, {"kind": "rms"}),
    "corrected": (DivergenceCorrectedLinear, {"beta": 1.0}),
}


@pytest.mark.parametrize("kind", list(LINEAR_TYPES))
@pytest.mark.parametrize("in_attention", [False, True])
def test_transformer_linear_kind_is_used_in_every_block(
    kind: str, in_attention: bool, data: dict[str, Splits]
) -> None:
    cls, attrs = LINEAR_TYPES[kind]
    model = create_model(
        "text_encoder", data["ptb"], preset="tiny", linear=kind, linear_in_attention=in_attention
    )
    for block in model.encoder.blocks:
        for layer in (block.mlp.fc1, block.mlp.fc2):
            assert type(layer) is cls and all(getattr(layer, k) == v for k, v in attrs.items())
        for layer in (block.attn.qkv, block.attn.proj):
            assert type(layer) is (cls if in_attention else nn.Linear)
    assert type(model.head) is nn.Linear  # the readout stays plain


def test_corrected_beta_reaches_the_layers(data: dict[str, Splits]) -> None:
    model = create_model(
        "vit_lite", data["digits"], preset="tiny", linear={"type": "corrected", "beta": 0.25}
    )
    layers = [m for m in model.modules() if isinstance(m, DivergenceCorrectedLinear)]
    assert len(layers) == 2 * 2 and all(m.beta == 0.25 for m in layers)


@pytest.mark.parametrize("layer", MLP_LAYERS)
@pytest.mark.parametrize("head_variant", [False, True])
def test_mlp_layer_kind_is_used(layer: str, head_variant: bool, data: dict[str, Splits]) -> None:
    model = create_model(
        "mlp", data["digits"], preset="tiny", hidden=(16, 8, 4), layer=layer, head_variant=head_variant
    )
    affine = {"linear_batchnorm": "linear", "linear_layernorm": "linear"}.get(layer, layer)
    cls, attrs = LINEAR_TYPES[affine]
    hidden = [m for m in model.features if isinstance(m, nn.Linear)]
    assert [m.out_features for m in hidden] == [16, 8, 4]
    assert all(type(m) is cls and all(getattr(m, k) == v for k, v in attrs.items()) for m in hidden)
    norm_type = {"linear_batchnorm": nn.BatchNorm1d, "linear_layernorm": nn.LayerNorm}.get(layer)
    norms = [m for m in model.features if isinstance(m, (nn.BatchNorm1d, nn.LayerNorm))]
    assert len(norms) == (3 if norm_type else 0) and all(type(m) is norm_type for m in norms)
    head_is_variant = head_variant and norm_type is None
    assert type(model.head) is (cls if head_is_variant else nn.Linear)


@pytest.mark.parametrize("layer", CNN_LAYERS)
def test_cnn_layer_kind_is_used(layer: str, data: dict[str, Splits]) -> None:
    model = create_model("cnn", data["fashion"], preset="tiny", layer=layer)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 2
    assert all(type(m) is (PatchNormConv2d if layer == "patchnorm" else nn.Conv2d) for m in convs)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == (
        2 if layer == "conv_batchnorm" else 0
    )
    spec = create_model(
        "cnn", data["fashion"], preset="tiny", layer={"type": "patchnorm", "patch_scale": True}
    )
    assert all(m.patch_scale for m in spec.modules() if isinstance(m, PatchNormConv2d))


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("vit_lite", {"depht": 3}, "depht"),
        ("vit_lite", {"num_classes": 3}, "from the data"),
        ("text_encoder", {"vocab_size": 10}, "from the data"),
        ("vit_lite", {"norm": "batchnorm"}, "layernorm"),
        ("vit_lite", {"norm": {"tau": 1.0}}, "type"),
        ("vit_lite", {"norm": {"type": "autonorm", "temperature": 1.0}}, "temperature"),
        ("vit_lite", {"linear": "prenorm"}, "corrected"),
        ("vit_lite", {"linear": {"type": "prenorm_l2", "beta": 2.0}}, "beta"),
        ("vit_lite", {"patch_size": 3}, "patch_size"),
        ("vit_lite", {"dim": 30, "heads": 4}, "divisible"),
        ("mlp", {"layer": "batchnorm"}, "linear_batchnorm"),
        ("mlp", {"channels": (4,)}, "channels"),
        ("cnn", {"layer": {"type": "patchnorm", "gain": True}}, "gain"),
        ("cnn", {"kernel": 2}, "odd"),
        ("cnn", {"hidden": (4,)}, "hidden"),
    ],
)
def test_invalid_options_raise_value_error(
    name: str, kwargs: dict[str, Any], match: str, data: dict[str, Splits]
) -> None:
    s = data["ptb"] if name == "text_encoder" else data["digits"]
    with pytest.raises(ValueError, match=match):
        create_model(name, s, preset="tiny", **kwargs)


def test_unknown_model_preset_or_data_raise_value_error(data: dict[str, Splits]) -> None:
    with pytest.raises(ValueError, match="vit_lite"):
        create_model("resnet", data["digits"])
    with pytest.raises(ValueError, match="tiny"):
        create_model("mlp", data["digits"], preset="huge")
    with pytest.raises(ValueError, match="image"):
        create_model("vit_lite", data["diabetes"])
    with pytest.raises(ValueError, match="text"):
        create_model("mlp", data["ptb"])
    with pytest.raises(ValueError, match="tokenised"):
        create_model("text_encoder", data["digits"])


def test_overrides_compose_with_preset(data: dict[str, Splits]) -> None:
    model = create_model(
        "vit_lite", data["fashion"], preset="tiny", depth=3, drop_path=0.2, layerscale_init=None
    )
    assert isinstance(model, ViTLite)
    assert model.config.dim == 32 and len(model.encoder.blocks) == 3
    rates = [b.drop_path.p for b in model.encoder.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2])  # linear over depth, first block never dropped
    assert not any(n.endswith("gamma") for n, _ in model.named_parameters())
    mlp = create_model("mlp", data["digits"], preset="tiny", hidden=[8, 8])  # YAML lists become tuples
    assert mlp.config.hidden == (8, 8)


@pytest.mark.parametrize(
    ("name", "ds", "kwargs"),
    [
        ("vit_lite", "digits", {"norm": "autonorm", "linear": "corrected", "linear_in_attention": True}),
        ("vit_lite", "digits", {"norm": "film"}),
        ("text_encoder", "ptb", {"norm": "autonorm", "linear": "prenorm_rms"}),
        ("text_encoder", "polarity", {"norm": "autonorm", "pool": "cls"}),
        ("text_encoder", "polarity", {"norm": "adanorm", "pool": "mean"}),
        ("tabular", "diabetes", {"norm": "autonorm", "linear": "prenorm_l2"}),
        ("mlp", "digits", {"layer": "linear_batchnorm"}),
        ("mlp", "diabetes", {"layer": "corrected", "head_variant": True}),
        ("cnn", "fashion", {"layer": "patchnorm"}),
        ("cnn", "digits", {"layer": "conv_batchnorm"}),
    ],
)
def test_gradients_reach_every_parameter(
    name: str, ds: str, kwargs: dict[str, Any], data: dict[str, Splits]
) -> None:
    s = data[ds]
    extra = {"drop_path": 0.0} if name in TRANSFORMERS else {}
    model = create_model(name, s, preset="tiny", **kwargs, **extra).train()
    x, y = _batch(s, 8)
    # AutoNorm's selector output starts at zero, which blocks the gradient of its first layer: take a
    # few steps first, then every parameter must receive a non-zero, finite gradient.
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        _loss(model(x), y, s).backward()
        opt.step()
    opt.zero_grad()
    _loss(model(x), y, s).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


def _perturb_zero_init_outputs(model: nn.Module) -> None:
    """AutoNorm's selector and FiLM's conditioning start at zero output, i.e. input-independent, which
    would hide whether they see the padding; give their output layers non-zero weights."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (AutoNorm, FiLMNorm)):
                fc2 = m.selector.fc2 if isinstance(m, AutoNorm) else m.fc2
                fc2.weight.normal_(0.0, 1.0, generator=gen)


@pytest.mark.parametrize("norm", ["layernorm", "autonorm", "film"])
@pytest.mark.parametrize("ds", ["ptb", "polarity"])
def test_text_encoder_ignores_padding(ds: str, norm: str, data: dict[str, Splits]) -> None:
    s = data[ds]
    # No LayerScale, so attention and the norms really move the output; the pooling norms average over
    # real tokens, so the output of a sentence must not depend on the batch's padding.
    model = create_model("text_encoder", s, preset="tiny", layerscale_init=None, norm=norm).eval()
    _perturb_zero_init_outputs(model)
    assert isinstance(model, TextEncoder)
    x, _ = _batch(s, 4)
    lengths = (x != s.pad_index).sum(1)
    trimmed = x[:, : int(lengths.max())]
    full, short = model(x), model(trimmed)
    if s.task == "tagging":
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(full[i, :n], short[i, :n], rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(full, short, rtol=1e-4, atol=1e-5)


def _record_norm_masks(model: nn.Module) -> list[object]:
    masks: list[object] = []

    def hook(_: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        masks.append(kwargs.get("mask", "missing"))

    encoder: Any = model.encoder
    for m in [*(n for b in encoder.blocks for n in (b.norm1, b.norm2)), encoder.norm]:
        m.register_forward_pre_hook(hook, with_kwargs=True)
    return masks


@pytest.mark.parametrize("ds", ["ptb", "polarity"])
def test_every_text_norm_receives_the_padding_mask(ds: str, data: dict[str, Splits]) -> None:
    s = data[ds]
    model = create_model("text_encoder", s, preset="tiny", depth=2, norm="autonorm").eval()
    masks = _record_norm_masks(model)
    x, _ = _batch(s, 4)
    model(x)
    expected = x != s.pad_index
    if s.task == "classification":  # the CLS token is a real token
        expected = torch.cat([torch.ones(4, 1, dtype=torch.bool), expected], dim=1)
    assert len(masks) == 2 * 2 + 1  # both sub-layer norms of each block and the final norm
    assert all(isinstance(m, torch.Tensor) and torch.equal(m, expected) for m in masks)
    assert (~expected).any()  # the batch really has padding


def test_vision_norms_get_no_mask_and_the_plain_token_mean(data: dict[str, Splits]) -> None:
    model = create_model("vit_lite", data["digits"], preset="tiny", norm="autonorm").eval()
    _perturb_zero_init_outputs(model)
    masks = _record_norm_masks(model)
    inputs: list[torch.Tensor] = []
    assert isinstance(model, ViTLite)
    gate = model.encoder.blocks[1].norm2
    assert isinstance(gate, AutoNorm)
    gate.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    model(_batch(data["digits"], 3)[0])
    assert len(masks) == 2 * 2 + 1 and all(m is None for m in masks)
    sel = gate.selector
    expected = sel.fc2(torch.relu(sel.fc1(inputs[0].mean(1)))).softmax(-1)
    assert gate.last_probs is not None
    assert torch.equal(gate.last_probs, expected)  # bit-identical to the unmasked mean over tokens


def test_eval_is_deterministic_and_train_mode_draws_noise(data: dict[str, Splits]) -> None:
    s = data["digits"]
    model = create_model("vit_lite", s, preset="tiny", norm="autonorm", drop_path=0.0)
    x, _ = _batch(s)
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
    model.train()
    assert not torch.equal(model(x), model(x))  # Gumbel noise of the gates


@pytest.mark.parametrize("norm", list_norms())
def test_every_registered_norm_builds_every_transformer(norm: str, data: dict[str, Splits]) -> None:
    for name, ds in (("vit_lite", "digits"), ("text_encoder", "polarity"), ("tabular", "diabetes")):
        model = create_model(name, data[ds], preset="tiny", depth=1, norm=norm).eval()
        block = model.encoder.blocks[0]
        assert type(block.norm1) is type(block.norm2) is get_norm_layer(norm)
        out = model(_batch(data[ds], 2)[0])
        assert out.shape[0] == 2 and torch.isfinite(out).all()
