"""From a parsed data set to tensor splits: :class:`RawData` in, :class:`Splits` out.

The seeded validation carve, the fixed test carve, train-only standardisation and the text
vocabulary, with the conventions of :mod:`autonorm_core.data` (its docstring states them); the
parsers of the distribution files are in :mod:`autonorm_core.datasources`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

Task = Literal["classification", "tagging", "regression"]

PAD_INDEX = 0
UNK_INDEX = 1
# PyTorch's cross_entropy default, so tagging losses need no extra argument.
IGNORE_INDEX = -100
# Seed of the fixed test carve for sets without an official test split: a constant, so the test
# examples are the same for every training seed (paired comparisons across arms stay paired).
_TEST_SPLIT_SEED = 0
_TEST_FRACTION = 0.2


@dataclass(frozen=True, eq=False)
class Splits:
    """A data set as tensors, split three ways, with the conventions of :mod:`autonorm_core.data`.

    Attributes:
        name: Registry name of the data set.
        train: ``(inputs, targets)`` used for fitting.
        val: ``(inputs, targets)`` carved from the training pool by the seed; for model selection
            and early stopping.
        test: ``(inputs, targets)``; for reporting only, never for selection.
        task: ``classification`` (targets ``(N,)``), ``tagging`` (targets ``(N, T)``, pads at
            ``ignore_index``) or ``regression`` (float targets ``(N,)``).
        num_classes: Number of classes or tags; 0 for regression.
        input_shape: Shape of one example's input, e.g. ``(1, 28, 28)``, ``(T,)``, ``(F,)``.
        vocab_size: Size of the token vocabulary (including pad and unk) for text, else None.
        pad_index: Token id of padding in text inputs.
        unk_index: Token id of out-of-vocabulary words in text inputs.
        ignore_index: Target value at padded positions of tagging targets.
        classes: Names of the classes (tags, digits, ...), index-aligned with the targets.
        vocab: Tokens by id for text, else None.
        target_offset: Regression only: original-unit target = standardised * scale + offset.
        target_scale: Regression only; see ``target_offset``.
        indices: Provenance: for ``train`` and ``val`` the positions of their examples in the data
            set's training pool (the official train split, or what the fixed test carve left),
            for ``test`` the positions in the test source. Lets a run record exactly which
            examples it saw.
    """

    name: str
    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    task: Task
    num_classes: int
    input_shape: tuple[int, ...]
    vocab_size: int | None = None
    pad_index: int = PAD_INDEX
    unk_index: int = UNK_INDEX
    ignore_index: int = IGNORE_INDEX
    classes: tuple[str, ...] = ()
    vocab: tuple[str, ...] | None = None
    target_offset: float = 0.0
    target_scale: float = 1.0
    indices: dict[str, Tensor] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> Splits:
        """Returns a copy whose tensors live on ``device``."""

        def move(pair: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
            return pair[0].to(device), pair[1].to(device)

        return replace(self, train=move(self.train), val=move(self.val), test=move(self.test))

    @property
    def sizes(self) -> dict[str, int]:
        """Number of examples per split."""
        return {"train": len(self.train[0]), "val": len(self.val[0]), "test": len(self.test[0])}

    def __repr__(self) -> str:
        return (
            f"Splits(name={self.name!r}, task={self.task!r}, sizes={self.sizes}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape}, vocab_size={self.vocab_size})"
        )


# ----------------------------------------------------------------------------------------------
# Splitting and normalisation


def split_sizes(n_pool: int, val_fraction: float) -> tuple[int, int]:
    """Sizes ``(n_train, n_val)`` of the seeded carve of a training pool of ``n_pool`` examples.

    ``n_val = floor(val_fraction * n_pool + 0.5)`` clipped to ``[1, n_pool - 1]``, so both splits
    are non-empty.
    """
    if n_pool < 2:
        raise ValueError(
            f"a training pool needs at least 2 examples to carve a validation split, got {n_pool}"
        )
    n_val = min(max(1, math.floor(val_fraction * n_pool + 0.5)), n_pool - 1)
    return n_pool - n_val, n_val


def _perm(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def _subset_sizes(subset: int | tuple[int, int] | None) -> tuple[int | None, int | None]:
    if subset is None:
        return None, None
    if isinstance(subset, int) and not isinstance(subset, bool):
        sizes: tuple[int, int] = (subset, subset)
    elif isinstance(subset, tuple) and len(subset) == 2 and all(isinstance(s, int) for s in subset):
        sizes = subset
    else:
        raise ValueError(f"subset must be None, an int or a (n_train_pool, n_test) tuple, got {subset!r}")
    if min(sizes) < 2:
        raise ValueError(f"subset sizes must be at least 2, got {subset!r}")
    return sizes


@dataclass(frozen=True)
class RawData:
    """A parsed data set before splitting: what a registered loader returns.

    Attributes:
        pool_x / pool_y: the training pool (train + validation; :func:`load_dataset` carves the
            validation split from it by the seed). Arrays (or lists of token lists for text).
        test_x / test_y: the test split (official, or a fixed carve: :meth:`from_pool`).
        task: ``classification`` / ``tagging`` (integer class ids) or ``regression`` (floats).
        classes: class names, index-aligned with the ids; empty for a regression.
        layout: overrides the registry entry's layout (``image`` / ``tabular`` / ``text``); the
            generic loaders set it from the file.
    """

    pool_x: Any
    pool_y: Any
    test_x: Any
    test_y: Any
    task: Task
    classes: tuple[str, ...]
    layout: Literal["image", "tabular", "text"] | None = None

    @classmethod
    def from_pool(
        cls,
        x: Any,
        y: Any,
        *,
        task: Task,
        classes: tuple[str, ...],
        layout: Literal["image", "tabular", "text"] | None = None,
    ) -> RawData:
        """A set without an official test split: a fixed 20 % (constant seed, the same for every
        training seed) becomes the test split, the rest the training pool."""
        test_idx, pool_idx = (torch.tensor(i, dtype=torch.long) for i in _fixed_test_indices(len(y)))
        return cls(
            _take(x, pool_idx),
            _take(y, pool_idx),
            _take(x, test_idx),
            _take(y, test_idx),
            task,
            classes,
            layout,
        )


_Raw = RawData


def _take(items: Any, index: Tensor) -> Any:
    if isinstance(items, list):
        return [items[i] for i in index.tolist()]
    return items[index.numpy()]


def _carve(
    raw: _Raw, *, seed: int, val_fraction: float, subset: int | tuple[int, int] | None
) -> tuple[tuple[Any, ...], dict[str, Tensor]]:
    """Seeded pool subset + validation carve; fixed (seed-independent) test subset.

    Returns ``(x_train, y_train, x_val, y_val, x_test, y_test)`` and the indices of each split.
    """
    n_pool_cap, n_test_cap = _subset_sizes(subset)
    perm = _perm(len(raw.pool_y), seed)
    if n_pool_cap is not None:
        perm = perm[:n_pool_cap]
    _, n_val = split_sizes(len(perm), val_fraction)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    test_idx = torch.arange(len(raw.test_y))
    if n_test_cap is not None and n_test_cap < len(test_idx):
        test_idx = _perm(len(test_idx), _TEST_SPLIT_SEED)[:n_test_cap].sort().values
    parts = (
        _take(raw.pool_x, train_idx),
        _take(raw.pool_y, train_idx),
        _take(raw.pool_x, val_idx),
        _take(raw.pool_y, val_idx),
        _take(raw.test_x, test_idx),
        _take(raw.test_y, test_idx),
    )
    return parts, {"train": train_idx, "val": val_idx, "test": test_idx}


def _fixed_test_indices(n: int) -> tuple[list[int], list[int]]:
    """``(test, pool)`` indices for sets without an official test split: a constant-seed slice."""
    perm = _perm(n, _TEST_SPLIT_SEED)
    n_test = math.floor(_TEST_FRACTION * n + 0.5)
    return sorted(perm[:n_test].tolist()), sorted(perm[n_test:].tolist())


def _fixed_test_carve(x: Any, y: Any, task: Task, classes: tuple[str, ...]) -> _Raw:
    return RawData.from_pool(x, y, task=task, classes=classes)


def _standardise(train: Tensor, *others: Tensor, dims: tuple[int, ...]) -> list[Tensor]:
    """Standardise with the train split's statistics over ``dims`` (per channel / per feature).

    In place: the tensors are fresh copies made by the loaders, and full CIFAR / Fashion-MNIST would
    otherwise hold a second float32 copy at peak.
    """
    mean = train.mean(dim=dims, keepdim=True)
    std = train.std(dim=dims, keepdim=True).clamp_min(1e-6)  # constant pixels/features stay finite
    return [t.sub_(mean).div_(std) for t in (train, *others)]


def _image_splits(
    name: str, raw: _Raw, *, seed: int, val_fraction: float, subset: int | tuple[int, int] | None
) -> Splits:
    """``raw`` holds uint8/float arrays (N, C, H, W) and integer labels (or float regression targets)."""
    return _dense_splits(name, raw, seed=seed, val_fraction=val_fraction, subset=subset, dims=(0, 2, 3))


def _dense_splits(
    name: str,
    raw: _Raw,
    *,
    seed: int,
    val_fraction: float,
    subset: int | tuple[int, int] | None,
    dims: tuple[int, ...],
) -> Splits:
    """Images (``dims`` (0, 2, 3): per channel) or feature rows (``(0,)``: per feature), standardised
    with the train split's statistics; class ids, or regression targets standardised likewise."""
    (xtr, ytr, xva, yva, xte, yte), indices = _carve(raw, seed=seed, val_fraction=val_fraction, subset=subset)
    tr, va, te = (torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32) for a in (xtr, xva, xte))
    tr, va, te = _standardise(tr, va, te, dims=dims)
    offset, scale = 0.0, 1.0
    if raw.task == "regression":
        ys = [torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32) for a in (ytr, yva, yte)]
        offset, scale = ys[0].mean().item(), max(ys[0].std().item(), 1e-6)
        ys = [(y - offset) / scale for y in ys]
    else:
        ys = [torch.as_tensor(np.asarray(a, dtype=np.int64)) for a in (ytr, yva, yte)]
    return Splits(
        name=name,
        train=(tr, ys[0]),
        val=(va, ys[1]),
        test=(te, ys[2]),
        task=raw.task,
        num_classes=len(raw.classes),
        input_shape=tuple(tr.shape[1:]),
        classes=raw.classes,
        target_offset=offset,
        target_scale=scale,
        indices=indices,
    )


def _build_vocab(sentences: list[list[str]], min_freq: int) -> tuple[str, ...]:
    counts = Counter(w for s in sentences for w in s)
    # Sorted by (-count, word): deterministic ids, independent of hash seeds and input order.
    words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
    return ("<pad>", "<unk>", *words)


def _text_splits(
    name: str,
    raw: _Raw,
    *,
    seed: int,
    val_fraction: float,
    subset: int | tuple[int, int] | None,
    min_freq: int = 1,
) -> Splits:
    """``raw`` holds token lists; targets are tag lists (tagging) or ints (classification)."""
    (xtr, ytr, xva, yva, xte, yte), indices = _carve(raw, seed=seed, val_fraction=val_fraction, subset=subset)
    vocab = _build_vocab(xtr, min_freq)
    ids = {w: i for i, w in enumerate(vocab)}
    max_len = max(len(s) for s in (*xtr, *xva, *xte))

    def encode(sentences: list[list[str]]) -> Tensor:
        out = torch.full((len(sentences), max_len), PAD_INDEX, dtype=torch.long)
        for i, s in enumerate(sentences):
            out[i, : len(s)] = torch.tensor([ids.get(w, UNK_INDEX) for w in s], dtype=torch.long)
        return out

    def targets(ys: list[Any]) -> Tensor:
        if raw.task == "classification":
            return torch.tensor(ys, dtype=torch.long)
        out = torch.full((len(ys), max_len), IGNORE_INDEX, dtype=torch.long)
        for i, tags in enumerate(ys):
            out[i, : len(tags)] = torch.tensor(tags, dtype=torch.long)
        return out

    return Splits(
        name=name,
        train=(encode(xtr), targets(ytr)),
        val=(encode(xva), targets(yva)),
        test=(encode(xte), targets(yte)),
        task=raw.task,
        num_classes=len(raw.classes),
        input_shape=(max_len,),
        vocab_size=len(vocab),
        classes=raw.classes,
        vocab=vocab,
        indices=indices,
    )


def _tabular_splits(
    name: str, raw: _Raw, *, seed: int, val_fraction: float, subset: int | tuple[int, int] | None
) -> Splits:
    return _dense_splits(name, raw, seed=seed, val_fraction=val_fraction, subset=subset, dims=(0,))
