"""Pre-norm Transformer encoders of the AutoNorm study: ViT-Lite, a text encoder, a tabular encoder.

One block type serves all three (nanoGPT's layout, read top to bottom)::

    x = x + drop_path(layerscale(attn(norm1(x))))
    x = x + drop_path(layerscale(mlp(norm2(x))))

``norm1`` and ``norm2`` come from the ``norm`` spec (so ``norm="autonorm"`` gives 2 AutoNorm layers
per block, see docs/science.md); the final encoder norm comes from ``final_norm`` (LayerNorm by default,
an open choice). The MLP's two linears (and, with ``linear_in_attention``, the attention projections)
come from the ``linear`` spec: the divergence-fix variant a search may combine with AutoNorm.
Patch / token / feature embeddings and the output head stay plain.

Padding: the text encoder's key-padding mask ``(B, T)`` (True at real tokens) reaches the attention
AND every norm, as ``norm(x, mask=key_mask)``: norms that pool over tokens (AutoNorm's selector,
FiLMNorm's conditioning) average over the real tokens only; per-token norms ignore it. Images and
tabular rows have no padding and pass ``mask=None``.

Initialisation (open choice): every layer keeps its own ``reset_parameters`` (PyTorch's defaults for
linears, each norm's own init, so AutoNorm's zero-initialised selector output is left alone);
positions and the CLS token are drawn from a truncated normal with std 0.02 as in ViT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.models._layers import (
    DropPath,
    LayerScale,
    LinearFactory,
    LinearSpec,
    NormFactory,
    NormSpec,
    linear_factory,
    norm_factory,
)

__all__ = [
    "Block",
    "TabularTransformer",
    "TabularTransformerConfig",
    "TextEncoder",
    "TextEncoderConfig",
    "TransformerConfig",
    "ViTLite",
    "ViTLiteConfig",
]


@dataclass(frozen=True)
class TransformerConfig:
    """Encoder hyperparameters shared by every Transformer here (ViT-Lite defaults of docs/science.md)."""

    depth: int = 8
    dim: int = 128
    heads: int = 4
    mlp_ratio: float = 2.0
    drop_path: float = 0.1  # stochastic-depth rate of the LAST block; linear from 0 over depth
    layerscale_init: float | None = 1e-4  # None: no LayerScale
    qkv_bias: bool = True
    norm: NormSpec = "layernorm"  # both pre-norm sub-layer norms of every block
    final_norm: NormSpec = "layernorm"  # open choice: the final encoder norm stays LayerNorm
    linear: LinearSpec = "linear"  # divergence-fix variant of the MLP linears
    linear_in_attention: bool = False  # also use `linear` for the qkv and output projections

    def __post_init__(self) -> None:
        if self.depth < 1 or self.dim < 1 or self.heads < 1:
            raise ValueError(
                f"depth, dim and heads must be positive, got {self.depth}, {self.dim}, {self.heads}"
            )
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {self.drop_path}")


class Attention(nn.Module):
    """Multi-head self-attention with an optional key-padding mask."""

    def __init__(self, dim: int, heads: int, *, qkv_bias: bool, make_linear: LinearFactory | None):
        super().__init__()
        self.heads = heads
        if make_linear is None:
            self.qkv: nn.Module = nn.Linear(dim, 3 * dim, bias=qkv_bias)
            self.proj: nn.Module = nn.Linear(dim, dim)
        else:
            self.qkv = make_linear(dim, 3 * dim)
            self.proj = make_linear(dim, dim)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        *lead, T, C = x.shape  # (B, T, C); a member stack's (K, B, T, C) attends as K*B sequences
        qkv = self.qkv(x).reshape(-1, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, T, C/H)
        # key_mask (B, T), True at real tokens; broadcast over heads and queries.
        attn_mask = None if key_mask is None else key_mask.reshape(-1, 1, 1, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, T, C/H)
        return self.proj(y.transpose(1, 2).reshape(*lead, T, C))  # (B, T, C)


class FeedForward(nn.Module):
    """``fc2(GELU(fc1(x)))`` with both linears from the ``linear`` spec."""

    def __init__(self, dim: int, hidden: int, *, make_linear: LinearFactory):
        super().__init__()
        self.fc1 = make_linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = make_linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm residual block: attention and MLP sub-layers, each behind its own norm."""

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        drop_path: float,
        make_norm: NormFactory,
        make_linear: LinearFactory,
    ):
        super().__init__()
        self.norm1 = make_norm(cfg.dim)
        self.attn = Attention(
            cfg.dim,
            cfg.heads,
            qkv_bias=cfg.qkv_bias,
            make_linear=make_linear if cfg.linear_in_attention else None,
        )
        self.ls1: nn.Module = (
            nn.Identity() if cfg.layerscale_init is None else LayerScale(cfg.dim, init=cfg.layerscale_init)
        )
        self.norm2 = make_norm(cfg.dim)
        self.mlp = FeedForward(cfg.dim, int(cfg.dim * cfg.mlp_ratio), make_linear=make_linear)
        self.ls2: nn.Module = (
            nn.Identity() if cfg.layerscale_init is None else LayerScale(cfg.dim, init=cfg.layerscale_init)
        )
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        # key_mask (B, T), True at real tokens: masks attention keys and the norms' token pooling.
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x, mask=key_mask), key_mask)))  # (B, T, C)
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x, mask=key_mask))))
        return x


class Encoder(nn.Module):
    """``depth`` blocks and the final norm; specs resolved here, once, at the model boundary."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        make_norm = norm_factory(cfg.norm, field="norm")
        make_linear = linear_factory(cfg.linear, field="linear")
        # Stochastic depth grows linearly with depth (timm / ViT-Lite): the first block is never dropped.
        rates = torch.linspace(0.0, cfg.drop_path, cfg.depth).tolist() if cfg.depth > 1 else [cfg.drop_path]
        self.blocks = nn.ModuleList(
            Block(cfg, drop_path=r, make_norm=make_norm, make_linear=make_linear) for r in rates
        )
        self.norm = norm_factory(cfg.final_norm, field="final_norm")(cfg.dim)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        for block in self.blocks:
            x = block(x, key_mask)
        return self.norm(x, mask=key_mask)  # (B, T, C)


def _init_tokens(*params: nn.Parameter) -> None:
    for p in params:
        nn.init.trunc_normal_(p, std=0.02)


# ----------------------------------------------------------------------------------------------
# ViT-Lite


@dataclass(frozen=True)
class ViTLiteConfig(TransformerConfig):
    """ViT-Lite image classifier; ``in_channels``, ``image_size``, ``num_classes`` come from the data."""

    in_channels: int = 3
    image_size: tuple[int, int] = (32, 32)
    num_classes: int = 10
    patch_size: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        h, w = self.image_size
        if self.patch_size < 1 or h % self.patch_size or w % self.patch_size:
            raise ValueError(f"patch_size {self.patch_size} must divide the image size {self.image_size}")


class ViTLite(nn.Module):
    """Patch embedding + CLS token + learned positions + encoder + linear head on the CLS token."""

    def __init__(self, config: ViTLiteConfig):
        super().__init__()
        self.config = config
        c = config
        n_patches = (c.image_size[0] // c.patch_size) * (c.image_size[1] // c.patch_size)
        self.patch_embed = nn.Conv2d(c.in_channels, c.dim, kernel_size=c.patch_size, stride=c.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n_patches + 1, c.dim))
        self.encoder = Encoder(c)
        self.head = nn.Linear(c.dim, c.num_classes)
        _init_tokens(self.cls_token, self.pos_embed)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed  # (B, N+1, C)
        x = self.encoder(x)
        return self.head(x[:, 0])  # (B, num_classes)


# ----------------------------------------------------------------------------------------------
# Text encoder


@dataclass(frozen=True)
class TextEncoderConfig(TransformerConfig):
    """Token tagging (per-token logits) or sentence classification; sizes from docs/science.md."""

    depth: int = 12
    heads: int = 8
    vocab_size: int = 2
    max_len: int = 128
    num_classes: int = 2
    pad_index: int = 0
    task: Literal["tagging", "classification"] = "tagging"
    pool: Literal["cls", "mean"] = "cls"  # sentence classification: CLS token or mean over real tokens

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in ("tagging", "classification"):
            raise ValueError(f"text_encoder task must be tagging or classification, got {self.task!r}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")


class TextEncoder(nn.Module):
    """Token + position embeddings, encoder with a key-padding mask, linear head.

    Input ``(B, T)`` token ids padded with ``pad_index``; output ``(B, T, num_classes)`` for tagging
    (logits at padded positions are meaningless; the targets there are ``ignore_index``) or
    ``(B, num_classes)`` for classification. The padding mask reaches every norm, so AutoNorm's
    selector and FiLMNorm's conditioning average over the real tokens (and the CLS token), never over
    padding: a sentence's outputs do not depend on how much padding the batch adds.
    """

    def __init__(self, config: TextEncoderConfig):
        super().__init__()
        self.config = config
        c = config
        self.use_cls = c.task == "classification" and c.pool == "cls"
        self.tok_embed = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_index)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if self.use_cls else None
        self.pos_embed = nn.Parameter(torch.zeros(1, c.max_len + int(self.use_cls), c.dim))
        self.encoder = Encoder(c)
        self.head = nn.Linear(c.dim, c.num_classes)
        _init_tokens(self.pos_embed, *([self.cls_token] if self.cls_token is not None else []))
        # nanoGPT's std 0.02 instead of nn.Embedding's N(0, 1): with Adam steps of ~lr per update, rows of
        # unit scale barely move for words seen in few batches (tiny PTB-sample tagger, 20
        # epochs: 0.74 test accuracy with N(0, 1), 0.81 with std 0.02).
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        with torch.no_grad():
            self.tok_embed.weight[c.pad_index].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        B, T = ids.shape
        if self.config.max_len < T:
            raise ValueError(f"sequence length {T} exceeds max_len {self.config.max_len}")
        key_mask = ids != self.config.pad_index  # (B, T)
        x = self.tok_embed(ids)  # (B, T, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, T+1, C)
            key_mask = torch.cat([key_mask.new_ones(B, 1), key_mask], dim=1)
        x = x + self.pos_embed[:, : x.shape[1]]
        x = self.encoder(x, key_mask)
        if self.config.task == "tagging":
            return self.head(x)  # (B, T, num_classes)
        if self.use_cls:
            return self.head(x[:, 0])  # (B, num_classes)
        m = key_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        return self.head((x * m).sum(1) / m.sum(1).clamp_min(1.0))  # (B, num_classes)


# ----------------------------------------------------------------------------------------------
# Tabular encoder


@dataclass(frozen=True)
class TabularTransformerConfig(TransformerConfig):
    """Feature-token encoder (FT-Transformer style). Sizes are an open choice: the papers give none."""

    depth: int = 4
    num_features: int = 10
    num_classes: int = 0  # 0: regression, one output per example


class TabularTransformer(nn.Module):
    """Each feature ``j`` becomes a token ``x_j · w_j + b_j``; a CLS token reads out the prediction.

    Per-feature embeddings identify the features, so no position embedding is needed. Output
    ``(B,)`` for regression, ``(B, num_classes)`` for classification.
    """

    def __init__(self, config: TabularTransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.feature_weight = nn.Parameter(torch.empty(c.num_features, c.dim))
        self.feature_bias = nn.Parameter(torch.zeros(c.num_features, c.dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.encoder = Encoder(c)
        self.head = nn.Linear(c.dim, max(c.num_classes, 1))
        # Unit-variance features times N(0, 1/dim) weights: tokens start at the scale of the CLS token's
        # neighbours rather than dwarfing them.
        nn.init.normal_(self.feature_weight, std=c.dim**-0.5)
        _init_tokens(self.cls_token)

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.unsqueeze(-1) * self.feature_weight + self.feature_bias  # (B, F, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)  # (B, F+1, C)
        out = self.head(self.encoder(x)[:, 0])  # (B, num_classes or 1)
        return out.squeeze(-1) if self.config.num_classes == 0 else out
