"""Optimizer parameter groups: the one place that decides weight decay.

Used by the training loop for every model so that (a) AdamW's decoupled weight decay never touches
scales, shifts, biases, DyT's ``α`` or gate parameters, and (b) parameters frozen with
``requires_grad_(False)`` (a frozen AutoNorm selector) are not in the optimizer at all and therefore
cannot move.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["param_groups"]


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """Split ``model``'s trainable parameters into a decayed and a non-decayed group.

    Parameters with ``requires_grad=False`` are left out. Parameters with at most one dimension
    (gains, biases, DyT's scalar ``α``) get no weight decay; matrices and kernels get ``weight_decay``.
    Shared (tied) parameters appear once. Empty groups are omitted.

    Returns:
        Groups for a ``torch.optim`` constructor; each has ``params``, ``weight_decay`` and a ``name``
        (``"decay"`` / ``"no_decay"``) for logging.

    Raises:
        ValueError: if ``weight_decay`` is negative.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # deduplicates shared parameters
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups: list[dict[str, Any]] = []
    if decay:
        groups.append({"params": decay, "weight_decay": float(weight_decay), "name": "decay"})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    return groups
