"""Member-stacked forms of the models of :mod:`autonorm_core.models`, and :func:`stackable`.

:func:`stack_models` turns K members of one architecture (MLP, CNN, ViT-Lite, text encoder, tabular
encoder) into one :class:`StackedModel` whose ``state_dict`` has exactly the member's keys, each entry
with a leading member dimension. Inputs and outputs carry that dimension too: ``(K, B, ...)`` in,
``(K, B, classes)`` (or ``(K, B)`` for regression, ``(K, B, T, classes)`` for tagging) out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.data import Splits
from autonorm_core.models import (
    CNN,
    MLP,
    DropPath,
    LayerScale,
    TabularTransformer,
    TextEncoder,
    ViTLite,
    create_model,
)
from autonorm_core.models.transformer import Attention, Block, Encoder, FeedForward
from autonorm_core.stacking.layers import (
    MemberGenerators,
    NotStackableError,
    StackedDropPath,
    StackedLayerScale,
    StackedMixture,
    stack_channel_layer,
    stack_norm,
    stack_token_layer,
)

__all__ = ["StackedModel", "create_members", "stack_models", "stackable", "training_reason"]


class StackedModel(nn.Module):
    """Base of the stacked models: K members, per-member ``state_dict`` views, the members' RNG holder."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        self.config: Any = members[0].config
        self.num_members = len(members)
        self.member_rng = MemberGenerators()

    def member_state_dict(self, k: int) -> dict[str, Tensor]:
        """Member ``k``'s ``state_dict`` (contiguous copies), loadable into a member model of the architecture."""
        return {
            name: t[k].detach().clone(memory_format=torch.contiguous_format)
            for name, t in self.state_dict().items()
        }

    def load_member_state_dict(self, k: int, state: Mapping[str, Tensor]) -> None:
        """Writes a member model's ``state_dict`` into slot ``k`` (same keys, one member's shapes)."""
        own = self.state_dict()
        missing, extra = set(own) - set(state), set(state) - set(own)
        if missing or extra:
            raise ValueError(
                f"member state keys differ: missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        with torch.no_grad():
            for name, t in own.items():
                t[k].copy_(state[name])

    def mixtures(self) -> list[tuple[str, StackedMixture]]:
        """AutoNorm / RandomSelector layers by member module name."""
        return [(n, m) for n, m in self.named_modules() if isinstance(m, StackedMixture)]


def _check_same_config(members: Sequence[nn.Module]) -> None:
    """Members must share one architecture; per-member hyperparameters the stacked layers carry
    (AutoNorm's ``tau``, the corrected layer's ``beta``, a norm's ``seed``) may differ."""

    def normal(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: normal(v) for k, v in value.items() if k not in ("tau", "beta", "seed")}
        return value

    configs = [getattr(m, "config", None) for m in members]
    if configs[0] is None or not dataclasses.is_dataclass(configs[0]):
        raise NotStackableError(f"{type(members[0]).__name__} has no model config")
    base = {f.name: normal(getattr(configs[0], f.name)) for f in dataclasses.fields(configs[0])}
    for c in configs[1:]:
        if c == configs[0]:
            continue  # the common case (same architecture, same per-member values): nothing to normalise
        other = {f.name: normal(getattr(c, f.name)) for f in dataclasses.fields(c)}  # type: ignore[arg-type]
        if other != base:
            diff = sorted(k for k in base if base[k] != other.get(k))
            raise NotStackableError(f"members differ in model config fields {diff}")


class StackedMLP(StackedModel):
    def __init__(self, members: Sequence[MLP]):
        super().__init__(members)
        n = len(members[0].features)
        self.features = nn.Sequential(
            *(stack_token_layer([m.features[i] for m in members]) for i in range(n))
        )
        self.head = stack_token_layer([m.head for m in members])

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.features(x.flatten(2)))  # (K, B, classes or 1)
        return out.squeeze(-1) if self.config.num_classes == 0 else out


class StackedCNN(StackedModel):
    def __init__(self, members: Sequence[CNN]):
        super().__init__(members)
        n = len(members[0].features)
        self.features = nn.Sequential(
            *(stack_channel_layer([m.features[i] for m in members]) for i in range(n))
        )
        self.head = stack_token_layer([m.head for m in members])

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 3:
            x = x[..., None, None]  # (K, B, F) -> (K, B, F, 1, 1)
        K, B = x.shape[:2]
        x = x.transpose(0, 1).reshape(B, K * x.shape[2], *x.shape[3:])  # (B, K*C, H, W)
        # Channels-last through the stages: the K members' channels side by side make every map wide,
        # and on CPU max-pooling a wide NCHW map is ~30x slower than the same map channels-last (4.5 ms
        # against 0.15 ms for 8x128x28x28, one thread); a separate member's 8-16 channels gain nothing
        # from it (measured 20.8 -> 19.3 ms for 16 members' steps). Same values; sums may round apart.
        feats = self.features(x.contiguous(memory_format=torch.channels_last)).mean(dim=(2, 3))  # (B, K*C')
        out: Tensor = self.head(feats.reshape(B, K, -1).transpose(0, 1))  # (K, B, classes or 1)
        return out.squeeze(-1) if self.config.num_classes == 0 else out


# ---------------------------------------------------------------------------------------- transformers


class _StackedAttention(Attention):
    """K attentions: :class:`Attention`'s forward, the members' ``B`` sequences side by side."""

    def __init__(self, members: Sequence[Any]):
        nn.Module.__init__(self)
        self.heads = int(members[0].heads)
        self.qkv = stack_token_layer([m.qkv for m in members])
        self.proj = stack_token_layer([m.proj for m in members])


class _StackedFeedForward(FeedForward):
    def __init__(self, members: Sequence[Any]):
        nn.Module.__init__(self)
        self.fc1 = stack_token_layer([m.fc1 for m in members])
        self.act = stack_token_layer([m.act for m in members])  # type: ignore[assignment]
        self.fc2 = stack_token_layer([m.fc2 for m in members])


def _stack_misc(members: Sequence[nn.Module], rng: MemberGenerators) -> nn.Module:
    first = members[0]
    if type(first) is LayerScale:
        return StackedLayerScale(members)
    if type(first) is nn.Identity:
        return first
    if type(first) is DropPath:
        return StackedDropPath(members, rng)
    raise NotStackableError(f"no stacked form for {type(first).__name__}")


class _StackedBlock(Block):
    def __init__(self, members: Sequence[Any], rng: MemberGenerators):
        nn.Module.__init__(self)
        self.norm1 = stack_norm([m.norm1 for m in members])
        self.attn = _StackedAttention([m.attn for m in members])
        self.ls1 = _stack_misc([m.ls1 for m in members], rng)
        self.norm2 = stack_norm([m.norm2 for m in members])
        self.mlp = _StackedFeedForward([m.mlp for m in members])
        self.ls2 = _stack_misc([m.ls2 for m in members], rng)
        self.drop_path = _stack_misc([m.drop_path for m in members], rng)  # type: ignore[assignment]


class _StackedEncoder(Encoder):
    def __init__(self, members: Sequence[Any], rng: MemberGenerators):
        nn.Module.__init__(self)
        depth = len(members[0].blocks)
        self.blocks = nn.ModuleList(_StackedBlock([m.blocks[i] for m in members], rng) for i in range(depth))
        self.norm = stack_norm([m.norm for m in members])


def _stacked_param(tensors: Sequence[Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))


class _StackedPatchEmbed(nn.Module):
    """K patch embeddings (``Conv2d`` with stride = kernel, no padding) as one batched matmul over patches."""

    def __init__(self, members: Sequence[nn.Conv2d]):
        super().__init__()
        first = members[0]
        if (
            first.stride != first.kernel_size
            or first.padding != (0, 0)
            or first.dilation != (1, 1)
            or first.groups != 1
            or first.bias is None
        ):
            raise NotStackableError("patch embedding is not a plain stride = kernel convolution")
        self.patch = tuple(first.kernel_size)
        self.weight = _stacked_param([m.weight for m in members])  # (K, dim, C, p, p)
        self.bias = _stacked_param([m.bias for m in members if m.bias is not None])  # (K, dim)

    def forward(self, x: Tensor) -> Tensor:
        """``(K, B, C, H, W)`` -> ``(K, B, N, dim)``, patches in the conv's row-major order."""
        K, B, C, H, W = x.shape
        ph, pw = self.patch
        h, w = H // ph, W // pw
        patches = x.reshape(K, B, C, h, ph, w, pw).permute(0, 1, 3, 5, 2, 4, 6).reshape(K, B * h * w, -1)
        weight = self.weight.reshape(K, self.weight.shape[1], -1)
        out = torch.baddbmm(self.bias.unsqueeze(1), patches, weight.transpose(1, 2))
        return out.reshape(K, B, h * w, -1)


class StackedViTLite(StackedModel):
    def __init__(self, members: Sequence[ViTLite]):
        super().__init__(members)
        self.patch_embed = _StackedPatchEmbed([m.patch_embed for m in members])
        self.cls_token = _stacked_param([m.cls_token for m in members])  # (K, 1, 1, dim)
        self.pos_embed = _stacked_param([m.pos_embed for m in members])  # (K, 1, N+1, dim)
        self.encoder = _StackedEncoder([m.encoder for m in members], self.member_rng)
        self.head = stack_token_layer([m.head for m in members])

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch_embed(x)  # (K, B, N, C)
        K, B = tokens.shape[:2]
        cls = self.cls_token.expand(K, B, 1, tokens.shape[-1])
        h = torch.cat([cls, tokens], dim=2) + self.pos_embed  # (K, B, N+1, C)
        out: Tensor = self.head(self.encoder(h)[:, :, 0])
        return out


class StackedTextEncoder(StackedModel):
    def __init__(self, members: Sequence[TextEncoder]):
        super().__init__(members)
        c = self.config
        self.use_cls = members[0].use_cls
        self.tok_embed = _StackedEmbedding([m.tok_embed for m in members])
        self.cls_token = (
            _stacked_param([m.cls_token for m in members if m.cls_token is not None])
            if self.use_cls
            else None
        )
        self.pos_embed = _stacked_param([m.pos_embed for m in members])
        self.encoder = _StackedEncoder([m.encoder for m in members], self.member_rng)
        self.head = stack_token_layer([m.head for m in members])
        self.pad_index = c.pad_index

    def forward(self, ids: Tensor) -> Tensor:
        K, B, T = ids.shape
        if self.config.max_len < T:
            raise ValueError(f"sequence length {T} exceeds max_len {self.config.max_len}")
        key_mask = ids != self.pad_index  # (K, B, T)
        x = self.tok_embed(ids)  # (K, B, T, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(K, B, 1, x.shape[-1]), x], dim=2)
            key_mask = torch.cat([key_mask.new_ones(K, B, 1), key_mask], dim=2)
        x = x + self.pos_embed[:, :, : x.shape[2]]
        x = self.encoder(x, key_mask)
        if self.config.task == "tagging":
            out: Tensor = self.head(x)  # (K, B, T, classes)
            return out
        if self.use_cls:
            out = self.head(x[:, :, 0])
            return out
        m = key_mask.unsqueeze(-1).to(x.dtype)
        out = self.head((x * m).sum(2) / m.sum(2).clamp_min(1.0))
        return out


class _StackedEmbedding(nn.Module):
    """K ``nn.Embedding`` tables ``(K, V, D)``; the padding row gets no gradient, as in ``nn.Embedding``."""

    def __init__(self, members: Sequence[nn.Embedding]):
        super().__init__()
        first = members[0]
        if first.max_norm is not None or first.sparse or first.scale_grad_by_freq:
            raise NotStackableError(
                "embeddings with max_norm / sparse / scale_grad_by_freq have no stacked form"
            )
        self.num_embeddings = first.num_embeddings
        self.padding_idx = first.padding_idx
        self.weight = _stacked_param([m.weight for m in members])
        if self.padding_idx is not None:
            pad = int(self.padding_idx)
            self.weight.register_hook(lambda g: g.index_fill(1, torch.tensor([pad], device=g.device), 0.0))

    def forward(self, ids: Tensor) -> Tensor:
        K = ids.shape[0]
        offset = torch.arange(K, device=ids.device).reshape(K, *([1] * (ids.ndim - 1))) * self.num_embeddings
        return F.embedding(ids + offset, self.weight.reshape(K * self.num_embeddings, -1))


class StackedTabularTransformer(StackedModel):
    def __init__(self, members: Sequence[TabularTransformer]):
        super().__init__(members)
        self.feature_weight = _stacked_param([m.feature_weight for m in members])  # (K, F, C)
        self.feature_bias = _stacked_param([m.feature_bias for m in members])
        self.cls_token = _stacked_param([m.cls_token for m in members])  # (K, 1, 1, C)
        self.encoder = _StackedEncoder([m.encoder for m in members], self.member_rng)
        self.head = stack_token_layer([m.head for m in members])

    def forward(self, x: Tensor) -> Tensor:
        K, B = x.shape[:2]
        tokens = x.unsqueeze(-1) * self.feature_weight.unsqueeze(1) + self.feature_bias.unsqueeze(1)
        h = torch.cat([self.cls_token.expand(K, B, 1, tokens.shape[-1]), tokens], dim=2)
        out: Tensor = self.head(self.encoder(h)[:, :, 0])
        return out.squeeze(-1) if self.config.num_classes == 0 else out


_STACKED: dict[type[nn.Module], type[StackedModel]] = {
    MLP: StackedMLP,
    CNN: StackedCNN,
    ViTLite: StackedViTLite,
    TextEncoder: StackedTextEncoder,
    TabularTransformer: StackedTabularTransformer,
}


def stack_models(members: Sequence[nn.Module]) -> StackedModel:
    """One stacked model holding copies of the members' parameters and buffers, bit for bit.

    Raises:
        NotStackableError: a model or layer type without a stacked form, or members that differ in
            architecture; the message says which.
    """
    if not members:
        raise ValueError("stack_models needs at least one member")
    kinds = {type(m) for m in members}
    if len(kinds) != 1:
        raise NotStackableError(f"members mix model types {sorted(k.__name__ for k in kinds)}")
    cls = _STACKED.get(type(members[0]))
    if cls is None:
        raise NotStackableError(f"model {type(members[0]).__name__} has no stacked form")
    _check_same_config(members)
    stacked = cls(members)  # type: ignore[arg-type]
    # The stacked state mirrors the member's exactly (names and shapes): the guarantee that member k's
    # state_dict can be read out of and written into slot k.
    own = stacked.state_dict()
    ref = members[0].state_dict()
    if set(own) != set(ref):
        raise NotStackableError(
            f"stacked state keys differ from the member's: {sorted(set(own) ^ set(ref))[:6]}"
        )
    for name, t in ref.items():
        if tuple(own[name].shape) != (len(members), *t.shape):
            raise NotStackableError(
                f"stacked {name} has shape {tuple(own[name].shape)}, member {tuple(t.shape)}"
            )
    for name, m in stacked.mixtures():
        for k, member in enumerate(members):
            sub: Any = member.get_submodule(name)
            m.rngs[k].set_rng_state(sub.rng_state())
    stacked.train(members[0].training)
    return stacked


# ------------------------------------------------------------------------------------------- stackable


def _probe_splits(model_type: str) -> Splits:
    """Synthetic data of the shape each model takes, to build a member from a config without data."""
    g = torch.Generator().manual_seed(0)
    if model_type == "text_encoder":
        ids = torch.randint(2, 10, (4, 8), generator=g)
        y = torch.randint(0, 3, (4, 8), generator=g)
        pair = (ids, y)
        return Splits("probe", pair, pair, pair, "tagging", 3, (8,), vocab_size=10)
    if model_type == "tabular":
        rows = (torch.randn(4, 5, generator=g), torch.randn(4, generator=g))
        return Splits("probe", rows, rows, rows, "regression", 0, (5,))
    images = (torch.randn(4, 1, 28, 28, generator=g), torch.randint(0, 3, (4,), generator=g))
    return Splits("probe", images, images, images, "classification", 3, (1, 28, 28))


def training_reason(training: Any) -> str:
    """Why a training configuration (TrainConfig or mapping) has no stacked form; empty if it has one."""
    precision = training.get("precision") if isinstance(training, Mapping) else training.precision
    if precision not in (None, "fp32"):
        return f"precision={precision!r}: the stacked path runs float32 only"
    return ""


def stackable(config: nn.Module | Mapping[str, Any], training: Any = None) -> tuple[bool, str]:
    """Whether members of this model (and training configuration) train stacked; else why not.

    Args:
        config: a member model, a model config mapping (``{"type": "mlp", "layer": "corrected", ...}``,
            the ``model`` section of a trial config) or a whole trial config (``model`` and ``training``).
        training: a :class:`~autonorm_core.training.TrainConfig` or its mapping (else taken from a trial
            config's ``training``).

    Returns:
        ``(True, "")`` or ``(False, reason)``; the reason is a sentence callers can print.
    """
    if isinstance(config, Mapping) and "model" in config:
        training = config.get("training") if training is None else training
        config = config["model"]
    if training is not None:
        reason = training_reason(training)
        if reason:
            return False, reason
    try:
        if isinstance(config, nn.Module):
            stack_models([config])
            return True, ""
        options = dict(config)
        model_type = options.pop("type", None)
        preset = options.pop("preset", "paper")
        if not isinstance(model_type, str):
            return False, f"model config without a 'type': {dict(config)!r}"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            member = create_model(model_type, _probe_splits(model_type), preset=str(preset), **options)
        stack_models([member])
    except NotStackableError as err:
        return False, str(err)
    except ValueError as err:
        return False, f"invalid model config: {err}"
    return True, ""


def create_members(name: str, splits: Splits, seeds: Sequence[int], **kwargs: Any) -> list[nn.Module]:
    """K models built as a separate trial builds its one (``workers.trainable``): each under a forked
    default generator seeded with its seed, so member k's init is the separate run's, bit for bit."""
    members = []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            members.append(create_model(name, splits, **kwargs))
    return members
