"""Normalization layers of the AutoNorm study behind one name → class registry.

Every layer takes the channel dimension ``dim`` first and everything else keyword-only with a default,
creates its parameters in ``__init__``, initialises them in ``reset_parameters()`` and shows its
configuration in ``extra_repr()`` (the timm convention). Every layer accepts ``(B, T, D)`` token
sequences and ``(B, D)`` vectors and normalizes over the last dimension.

Every ``forward`` takes an optional keyword ``mask`` of shape ``(B, T)``, True at real tokens: layers
that pool over tokens (:class:`FiLMNorm`'s conditioning, :class:`AutoNorm`'s selector) average over
the real tokens only, so that padding, often most of a text batch, does not steer them; per-token
layers ignore it. ``mask=None`` means every position is real (images, tabular rows) and computes
exactly the unmasked mean.

Formulas, defaults and open choices are those of ``docs/science.md``. Modules that draw random numbers
(:class:`AutoNorm`, :class:`RandomSelector`) own a ``torch.Generator`` each, so that a trial is
reproducible without global seeding and a training loop can save and restore the exact noise stream.

Layout (shared pieces below, the classes above them, the way ``timm.layers`` keeps its helpers):
``registry.py`` (the name → class registry), ``helpers.py`` (argument check, the fast-path switch,
token pooling), ``simple.py`` (the single norms), ``fused.py`` (the fused eager DyT/LayerNorm
mixture and its dispatch), ``selector.py`` (the mixtures: :class:`NormSelector`,
:class:`RandomSelector`, :class:`AutoNorm`). Importing this package registers every norm.
"""

from __future__ import annotations

from autonorm_core.norms.registry import create_norm, get_norm_layer, list_norms, register_norm
from autonorm_core.norms.selector import AutoNorm, NormSelector, RandomSelector
from autonorm_core.norms.simple import AdaNorm, DyT, FiLMNorm, Identity, LayerNorm, RMSNorm

__all__ = [
    "AdaNorm",
    "AutoNorm",
    "DyT",
    "FiLMNorm",
    "Identity",
    "LayerNorm",
    "NormSelector",
    "RMSNorm",
    "RandomSelector",
    "create_norm",
    "get_norm_layer",
    "list_norms",
    "register_norm",
]
