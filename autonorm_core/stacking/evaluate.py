"""Evaluation of a stacked model: every member's loss and accuracy (or RMSE) over one split in eval
mode, and its noise-free gate statistics, as ``autonorm_core.training`` evaluates one model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from autonorm_core.stacking.layers import StackedMixture
from autonorm_core.stacking.models import StackedModel

__all__ = ["evaluate_stacked"]


@torch.no_grad()
def evaluate_stacked(
    stacked: StackedModel,
    data: Sequence[tuple[Tensor, Tensor]],
    task: str,
    *,
    batch_size: int,
    gates: Sequence[StackedMixture] = (),
) -> list[dict[str, Any]]:
    """Per member: loss and accuracy/RMSE over one split in eval mode; noise-free gate statistics."""
    K = len(data)
    shared = all(d is data[0] for d in data)
    n = data[0][0].shape[0]
    dev = data[0][0].device
    loss_sum = torch.zeros(K, dtype=torch.float64, device=dev)
    count = torch.zeros(K, dtype=torch.float64, device=dev)
    correct = torch.zeros(K, dtype=torch.float64, device=dev)
    ent = [torch.zeros(K, dtype=torch.float64, device=dev) for _ in gates]
    probs_sum: list[Tensor | None] = [None] * len(gates)
    n_gate = [0] * len(gates)
    for start in range(0, n, batch_size):
        if shared:
            x0, y0 = data[0][0][start : start + batch_size], data[0][1][start : start + batch_size]
            x = x0.unsqueeze(0).expand(K, *x0.shape)
            y = y0.unsqueeze(0).expand(K, *y0.shape)
        else:
            x = torch.stack([d[0][start : start + batch_size] for d in data])
            y = torch.stack([d[1][start : start + batch_size] for d in data])
        for g in gates:
            g.last_probs = None
        out = stacked(x).float()
        for i, g in enumerate(gates):
            if g.last_probs is None:
                continue
            p = g.last_probs.float()  # (K, b, C)
            ent[i] += -(p * p.clamp_min(1e-12).log()).sum(-1).sum(-1).double()
            s = p.sum(1).double()
            probs_sum[i] = s if probs_sum[i] is None else probs_sum[i] + s  # type: ignore[operator]
            n_gate[i] += p.shape[1]
        if task == "regression":
            loss_sum += (out.reshape(y.shape) - y.float()).pow(2).reshape(K, -1).sum(1).double()
            count += y[0].numel()
        elif task == "tagging":
            flat = y.reshape(K, -1)
            logits = out.reshape(flat.numel(), -1)
            per = F.cross_entropy(logits, flat.reshape(-1), ignore_index=-100, reduction="none").reshape(
                K, -1
            )
            loss_sum += per.sum(1).double()
            mask = flat != -100
            count += mask.sum(1).double()
            correct += ((logits.argmax(-1).reshape(K, -1) == flat) & mask).sum(1).double()
        else:
            C = out.shape[-1]
            per = F.cross_entropy(out.reshape(-1, C), y.reshape(-1), reduction="none").reshape(K, -1)
            loss_sum += per.sum(1).double()
            count += y.shape[1]
            correct += (out.argmax(-1) == y).sum(1).double()
    results = []
    denom = count.clamp_min(1.0)
    losses = (loss_sum / denom).tolist()
    accs = (correct / denom).tolist()
    ents = [e.tolist() for e in ent]
    for k in range(K):
        r: dict[str, Any] = {"loss": losses[k]}
        if task == "regression":
            r["rmse"] = math.sqrt(losses[k]) if losses[k] >= 0 else float("nan")
        else:
            r["accuracy"] = accs[k]
        r["gate_entropy"] = [ents[i][k] / max(n_gate[i], 1) for i in range(len(gates))]
        r["gate_mean_probs"] = [
            (ps[k] / max(n_gate[i], 1)).tolist() if ps is not None else [] for i, ps in enumerate(probs_sum)
        ]
        results.append(r)
    return results
