"""Optimizer parameter groups: the one place that decides weight decay.

Used by the training loop for every model so that (a) AdamW's decoupled weight decay never touches
scales, shifts, biases, DyT's ``α`` or gate parameters, and (b) parameters frozen with
``requires_grad_(False)`` (a frozen AutoNorm selector) are not in the optimizer at all and therefore
cannot move.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["adamw", "param_groups"]

#: ``torch.optim.Optimizer`` methods torch wraps in ``torch._disable_dynamo``, whose first call imports
#: ``torch._dynamo`` (pinned by tests/core/test_optim.py).
_DYNAMO_DISABLED_METHODS = ("state_dict", "load_state_dict", "zero_grad", "add_param_group")


def _eager_unless_compiling(fn: Any) -> Any:
    """What ``torch._disable_dynamo`` calls for ``fn``: ``fn`` itself, and ``torch.compiler.disable(fn)``
    (made on first need) only while Dynamo traces, which is when the disabling matters."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            disabled = getattr(call, "disabled", None)
            if disabled is None:
                disabled = call.disabled = torch.compiler.disable(fn)  # type: ignore[attr-defined]
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def _optimizers_without_dynamo_import() -> None:
    """Building or checkpointing any ``torch.optim`` optimizer imported ``torch._dynamo``: torch wraps
    ``Optimizer.add_param_group`` (called by every constructor), ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` in ``torch._disable_dynamo``, which imports it on the first call to make the
    disabled function. That is 1.5 s of every trial worker process (one per slot and phase: a study
    of ten phases paid it twenty times) and of every ``plan``, nearly none of which compile. Each
    method's disabled function is set up front instead (the attribute torch caches it in), as
    :func:`_eager_unless_compiling`; a process that compiles gets torch's own disabled function at its
    first traced call, as before. Once per process, at import."""
    for name in _DYNAMO_DISABLED_METHODS:
        fn = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", _eager_unless_compiling(fn))


_optimizers_without_dynamo_import()

#: Devices whose fused AdamW kernel PyTorch ships (one kernel per parameter instead of ~10 ``foreach``
#: passes over all of them: on 2 CPU cores, 5.7 ms vs 16.5 ms per step for ViT-Lite ``paper`` with AutoNorm).
_FUSED_DEVICES = ("cpu", "cuda")


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


def adamw(groups: list[dict[str, Any]], *, lr: float) -> torch.optim.AdamW:
    """AdamW over ``groups`` (from :func:`param_groups`), fused where PyTorch has the kernel.

    The fused implementation runs the same update as the ``foreach`` one (same state dict, so
    checkpoints move between them) in one pass per parameter. It is used when every parameter is a
    floating-point tensor on a CPU or CUDA device (all on one device type); otherwise PyTorch's default.
    """
    params = [p for g in groups for p in g["params"]]
    devices = {p.device.type for p in params}
    fused = (
        len(devices) == 1
        and next(iter(devices)) in _FUSED_DEVICES
        and all(torch.is_floating_point(p) for p in params)
    )
    return torch.optim.AdamW(groups, lr=lr, fused=True) if fused else torch.optim.AdamW(groups, lr=lr)
