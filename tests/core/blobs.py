"""Three Gaussian blobs in 8 dimensions: an easy classification task for short fits."""

from __future__ import annotations

import torch

from autonorm_core.data import Splits


def _blobs(
    n: int, gen: torch.Generator, *, features: int = 8, classes: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    centers = torch.linspace(-2.0, 2.0, classes).unsqueeze(1).expand(classes, features)
    y = torch.randint(0, classes, (n,), generator=gen)
    x = centers[y] + torch.randn(n, features, generator=gen)
    return x, y


def make_splits(*, n_train: int = 160, seed: int = 0) -> Splits:
    gen = torch.Generator().manual_seed(seed)
    return Splits(
        name="blobs",
        train=_blobs(n_train, gen),
        val=_blobs(64, gen),
        test=_blobs(64, gen),
        task="classification",
        num_classes=3,
        input_shape=(8,),
    )
