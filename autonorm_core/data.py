"""Real data sets as in-memory tensor splits: offline ones first, the rest from a data root.

Every loader returns a :class:`Splits` with the same conventions, so that models and the training
loop never special-case a data set:

* **Splits.** ``train`` and ``val`` are a seeded partition of the data set's training pool;
  ``test`` is the official test split (or, for sets without one, a *fixed* slice carved with a
  constant seed, identical for every ``seed``). The test split is never used to fit anything:
  normalisation statistics, the vocabulary and the regression target scaling all come from the
  ``train`` split alone (after the validation carve).
* **Sizes.** With a training pool of ``n`` examples (after ``subset``),
  ``len(val) = round_half_up(val_fraction * n)`` (at least 1) and ``len(train) = n - len(val)``;
  see :func:`split_sizes`.
* **Images** are float32 ``(N, C, H, W)``, standardised per channel with the train split's mean and
  standard deviation. Labels are int64 class indices.
* **Text** inputs are int64 token ids ``(N, T)``, right-padded with ``pad_index`` (0) to the
  longest loaded sequence (all three splits, after ``subset``); ``unk_index`` (1) stands for words
  outside the vocabulary. The vocabulary holds the train split's words seen at least ``min_freq``
  times (default 1: every train word). ``min_freq=2`` trains the ``<unk>`` row on rare words, but
  on ``ptb_pos_sample`` it turns 15 % of train and 23 % of test tokens into ``<unk>`` (15 % of test
  tokens with 1), and a tiny tagger then scored 0.77 instead of 0.81 test accuracy (20 epochs,
  seed 0).
* **Tagging** targets are int64 ``(N, T)`` with ``ignore_index`` (-100, PyTorch's
  ``cross_entropy`` default) at padded positions. Sentence classification targets are ``(N,)``.
* **Regression** targets are float32 ``(N,)`` standardised with the train split's mean and standard
  deviation; ``target_offset`` and ``target_scale`` map predictions back to the original units
  (``y = pred * target_scale + target_offset``). Features are standardised the same way.

Offline sets, full sizes ("pool" = train + val before ``subset``; "fixed" = the constant-seed 20 %
test carve of a set without an official test split):

================= ============== ===== ============ ========= ===========================================
name              task           pool  test         input     source
================= ============== ===== ============ ========= ===========================================
fashion_mnist     10 classes     60000 10000        (1,28,28) Debian dataset-fashion-mnist (IDX files)
digits            10 classes     1438  359 fixed    (1,8,8)   scikit-learn's ``digits.csv.gz``
diabetes          regression     354   88 fixed     (10,)     scikit-learn's raw diabetes CSVs
ptb_pos_sample    tagging, 44    801   200 fixed    (104,)    pattern ``tagged-en-wsj.txt`` (1001 lines)
pang_lee_polarity 2 classes      3200  800 fixed    (59,)     pattern ``polarity-en-pang&lee2.csv``
================= ============== ===== ============ ========= ===========================================

Offline sets (no network after ``scripts/fetch_data.sh``): ``fashion_mnist`` (Debian
``dataset-fashion-mnist``), ``digits`` and ``diabetes`` (bundled with scikit-learn),
``ptb_pos_sample`` and ``pang_lee_polarity`` (test corpora inside the Debian ``python3-pattern``
package, read at run time from its extraction directory and never copied: the corpora are for
personal use only). The others (``mnist``, ``cifar10``, ``cifar100``, ``svhn``, ``sst2``,
``ptb_pos``) read their standard distribution files from ``data_root``; the expected layout is in
:data:`DATA_ROOT_LAYOUT` and in the error raised when files are missing.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import math
import os
import pickle
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DATA_ROOT_LAYOUT",
    "IGNORE_INDEX",
    "PAD_INDEX",
    "UNK_INDEX",
    "DatasetNotFoundError",
    "RawData",
    "Splits",
    "cache_root",
    "class_count",
    "list_datasets",
    "load_dataset",
    "pattern_corpora_dir",
    "register_dataset",
    "split_sizes",
]

Task = Literal["classification", "tagging", "regression"]

PAD_INDEX = 0
UNK_INDEX = 1
# PyTorch's cross_entropy default, so tagging losses need no extra argument.
IGNORE_INDEX = -100
# Seed of the fixed test carve for sets without an official test split: a constant, so the test
# examples are the same for every training seed (paired comparisons across arms stay paired).
_TEST_SPLIT_SEED = 0
_TEST_FRACTION = 0.2

_PATTERN_CORPORA = Path("usr/share/doc/python3-pattern/test/corpora")
_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

DATA_ROOT_LAYOUT: dict[str, str] = {
    "mnist": "<data_root>/MNIST/raw/ (or <data_root>/) with the four IDX files train-images-idx3-ubyte, "
    "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (optionally .gz), "
    "as distributed by Yann LeCun / torchvision",
    "cifar10": "<data_root>/cifar-10-batches-py/ with data_batch_1..data_batch_5 and test_batch "
    "(the python pickle version, cifar-10-python.tar.gz extracted)",
    "cifar100": "<data_root>/cifar-100-python/ with train and test (cifar-100-python.tar.gz extracted; "
    "fine labels are used)",
    "svhn": "<data_root>/ (or <data_root>/svhn/) with train_32x32.mat and test_32x32.mat "
    "(the cropped-digits format 2 files, read with scipy.io.loadmat; label 10 means digit 0)",
    "sst2": "<data_root>/SST-2/ (or <data_root>/) with the GLUE TSV files train.tsv and dev.tsv "
    "(header 'sentence<TAB>label'); GLUE's dev.tsv is the test split because test.tsv has no labels",
    "ptb_pos": "<data_root>/ptb_pos/ (or <data_root>/) with train.txt and test.txt: one sentence per line, "
    "tokens as word/TAG separated by spaces (the format of pattern's tagged-en-wsj.txt); a dev.txt is "
    "not used (validation is carved from train by the seed, as for every data set)",
}


class DatasetNotFoundError(FileNotFoundError):
    """The files of a data set are not where the loader looks; the message says what to put where."""


@dataclass(frozen=True, eq=False)
class Splits:
    """A data set as tensors, split three ways, with the conventions of this module.

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
# Paths


def cache_root() -> Path:
    """Root of this project's data cache: ``$AUTONORM_DATA_DIR`` or ``~/.cache/autonorm-studies``."""
    env = os.environ.get("AUTONORM_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "autonorm-studies"


def pattern_corpora_dir(data_root: str | os.PathLike[str] | None = None) -> Path:
    """Directory holding python3-pattern's test corpora.

    Args:
        data_root: The ``dpkg-deb -x`` extraction directory or the corpora directory itself;
            defaults to ``cache_root() / "pattern"`` where ``scripts/fetch_data.sh`` extracts it.

    Raises:
        DatasetNotFoundError: Neither place holds ``tagged-en-wsj.txt``.
    """
    base = Path(data_root).expanduser() if data_root is not None else cache_root() / "pattern"
    for candidate in (base / _PATTERN_CORPORA, base):
        if (candidate / "tagged-en-wsj.txt").is_file():
            return candidate
    raise DatasetNotFoundError(
        f"python3-pattern's test corpora were not found under {base} (looked for "
        f"{base / _PATTERN_CORPORA}/tagged-en-wsj.txt). Run scripts/fetch_data.sh, or extract the "
        f"Debian package yourself: `apt-get download python3-pattern && dpkg-deb -x python3-pattern_*.deb "
        f"{base}` (set AUTONORM_DATA_DIR to move the cache root, or pass data_root=)."
    )


def _find_dir(
    name: str, data_root: str | os.PathLike[str] | None, subdirs: Sequence[str], probe: str
) -> Path:
    """First of ``data_root/<subdir>`` holding ``probe`` (a file name or its .gz), else a clear error."""
    if data_root is None:
        raise DatasetNotFoundError(
            f"data set {name!r} is not available offline: pass data_root=PATH with {DATA_ROOT_LAYOUT[name]}."
        )
    root = Path(data_root).expanduser()
    for sub in subdirs:
        d = root / sub if sub else root
        if (d / probe).is_file() or (d / f"{probe}.gz").is_file():
            return d
    raise DatasetNotFoundError(
        f"data set {name!r}: {probe} not found under data_root={root}. Expected {DATA_ROOT_LAYOUT[name]}."
    )


def _require(path: Path, name: str) -> Path:
    for p in (path, path.with_name(path.name + ".gz")):
        if p.is_file():
            return p
    raise DatasetNotFoundError(
        f"data set {name!r}: missing {path} (or {path.name}.gz). Expected {DATA_ROOT_LAYOUT[name]}."
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


# ----------------------------------------------------------------------------------------------
# Parsers of the distribution formats


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format), gzipped or not, as a numpy array."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _idx_raw(directory: Path, name: str, classes: tuple[str, ...]) -> _Raw:
    def read(stem: str) -> np.ndarray:
        return _read_idx(_require(directory / stem, name))

    xtr, ytr = read("train-images-idx3-ubyte"), read("train-labels-idx1-ubyte")
    xte, yte = read("t10k-images-idx3-ubyte"), read("t10k-labels-idx1-ubyte")
    return _Raw(xtr[:, None], ytr, xte[:, None], yte, "classification", classes)


def _parse_tagged(lines: Sequence[str]) -> tuple[list[list[str]], list[list[str]]]:
    """word/TAG lines -> (words, tags); a token's tag follows its last slash (words may hold '/')."""
    words, tags = [], []
    for line in lines:
        tokens = line.split()
        if not tokens:
            continue
        pairs = [t.rsplit("/", 1) for t in tokens]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"token without /TAG in line {line[:80]!r}")
        words.append([p[0] for p in pairs])
        tags.append([p[1] for p in pairs])
    return words, tags


def _tagging_raw(
    pool: tuple[list[list[str]], list[list[str]]], test: tuple[list[list[str]], list[list[str]]]
) -> _Raw:
    # The tag set is taken from the pool: a tag that occurs only in test cannot be predicted anyway,
    # and looking at test labels to size the output layer would leak.
    tag_names = tuple(sorted({t for s in pool[1] for t in s}))
    tag_ids = {t: i for i, t in enumerate(tag_names)}
    unknown = {t for s in test[1] for t in s} - set(tag_ids)
    if unknown:
        raise ValueError(f"tags in the test split but not in the training pool: {sorted(unknown)}")
    to_ids = [[tag_ids[t] for t in s] for s in (*pool[1], *test[1])]
    n = len(pool[1])
    return _Raw(pool[0], to_ids[:n], test[0], to_ids[n:], "tagging", tag_names)


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


# ----------------------------------------------------------------------------------------------
# Loaders, one per data set: (data_root) -> _Raw


def _load_fashion_mnist(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = Path(data_root).expanduser() if data_root is not None else _FASHION_MNIST_DIR
    if not any((directory / f"train-images-idx3-ubyte{s}").is_file() for s in ("", ".gz")):
        raise DatasetNotFoundError(
            f"Fashion-MNIST IDX files not found in {directory}. Run scripts/fetch_data.sh (installs the "
            f"Debian package dataset-fashion-mnist into {_FASHION_MNIST_DIR}) or pass data_root= a directory "
            f"with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
            f"t10k-labels-idx1-ubyte.gz."
        )
    classes = (
        "t-shirt/top",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle boot",
    )
    return _idx_raw(directory, "fashion_mnist", classes)


def _load_mnist(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("mnist", data_root, ("MNIST/raw", "mnist", ""), "train-images-idx3-ubyte")
    return _idx_raw(directory, "mnist", tuple(str(i) for i in range(10)))


def _sklearn_csv(name: str, delimiter: str | None = None) -> np.ndarray:
    """A CSV that scikit-learn bundles (``sklearn/datasets/data/NAME``), read as its own loaders read
    it, without importing scikit-learn: that import (SciPy and all) costs about a second in every
    trial worker, which loads its data once, and in every plan."""
    spec = importlib.util.find_spec("sklearn")  # finds the package; imports nothing
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(roots[0]) / "datasets" / "data" / name if roots else Path("sklearn/datasets/data") / name
    if not path.is_file():
        raise DatasetNotFoundError(
            f"{name} ships with scikit-learn, but {path} is missing: pip install scikit-learn"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return np.loadtxt(f, delimiter=delimiter)


def _load_digits(data_root: str | os.PathLike[str] | None) -> _Raw:
    # sklearn.datasets.load_digits(): the last column is the class, the rest an 8x8 image
    table = _sklearn_csv("digits.csv.gz", delimiter=",")
    images = table[:, :-1].reshape(-1, 1, 8, 8).astype(np.float32)  # (N, 1, 8, 8), values 0..16
    return _fixed_test_carve(
        images, table[:, -1].astype(np.int64), "classification", tuple(str(i) for i in range(10))
    )


def _load_diabetes(data_root: str | os.PathLike[str] | None) -> _Raw:
    # sklearn.datasets.load_diabetes(scaled=False): raw units, one file of features, one of targets
    features = _sklearn_csv("diabetes_data_raw.csv.gz")
    target = _sklearn_csv("diabetes_target.csv.gz")
    return _fixed_test_carve(features.astype(np.float32), target.astype(np.float32), "regression", ())


def _unpickle(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return pickle.load(f, encoding="latin1")  # type: ignore[no-any-return]


def _load_cifar10(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("cifar10", data_root, ("cifar-10-batches-py",), "data_batch_1")
    batches = [_unpickle(_require(directory / f"data_batch_{i}", "cifar10")) for i in range(1, 6)]
    test = _unpickle(_require(directory / "test_batch", "cifar10"))
    meta_path = directory / "batches.meta"
    classes = (
        tuple(_unpickle(meta_path)["label_names"])
        if meta_path.is_file()
        else ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    )
    x = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches]).reshape(-1, 3, 32, 32)
    y = np.concatenate([np.asarray(b["labels"], dtype=np.int64) for b in batches])
    xt = np.asarray(test["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return _Raw(x, y, xt, np.asarray(test["labels"], dtype=np.int64), "classification", classes)


def _load_cifar100(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("cifar100", data_root, ("cifar-100-python",), "train")
    train = _unpickle(_require(directory / "train", "cifar100"))
    test = _unpickle(_require(directory / "test", "cifar100"))
    meta_path = directory / "meta"
    classes = (
        tuple(_unpickle(meta_path)["fine_label_names"])
        if meta_path.is_file()
        else tuple(str(i) for i in range(100))
    )

    def arrays(d: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(d["fine_labels"], dtype=np.int64)

    return _Raw(*arrays(train), *arrays(test), "classification", classes)


def _load_svhn(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("svhn", data_root, ("", "svhn", "SVHN"), "train_32x32.mat")
    from scipy.io import loadmat  # only this loader needs scipy

    def arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
        mat = loadmat(str(_require(directory / f"{split}_32x32.mat", "svhn")))
        x = np.transpose(mat["X"], (3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
        y = mat["y"].reshape(-1).astype(np.int64) % 10  # SVHN stores digit 0 as label 10
        return x, y

    return _Raw(*arrays("train"), *arrays("test"), "classification", tuple(str(i) for i in range(10)))


def _load_ptb_pos_sample(data_root: str | os.PathLike[str] | None) -> _Raw:
    words, tags = _parse_tagged(_read_lines(pattern_corpora_dir(data_root) / "tagged-en-wsj.txt"))
    test_idx, pool_idx = _fixed_test_indices(len(words))
    return _tagging_raw(
        ([words[i] for i in pool_idx], [tags[i] for i in pool_idx]),
        ([words[i] for i in test_idx], [tags[i] for i in test_idx]),
    )


def _load_ptb_pos(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("ptb_pos", data_root, ("ptb_pos", ""), "train.txt")
    pool = _parse_tagged(_read_lines(_require(directory / "train.txt", "ptb_pos")))
    test = _parse_tagged(_read_lines(_require(directory / "test.txt", "ptb_pos")))
    return _tagging_raw(pool, test)


def _load_pang_lee_polarity(data_root: str | os.PathLike[str] | None) -> _Raw:
    # polarity-en-pang&lee2.csv holds the sentence polarity data set v1.0 (rows "1"/"-1", sentence),
    # despite pattern's README swapping the descriptions of the two pang&lee files.
    path = pattern_corpora_dir(data_root) / "polarity-en-pang&lee2.csv"
    with path.open(encoding="utf-8-sig", newline="") as f:  # the file starts with a BOM
        rows = [r for r in csv.reader(f) if r]
    labels = {"-1": 0, "1": 1}
    sentences = [r[1].split() for r in rows]
    y = [labels[r[0].strip()] for r in rows]
    return _fixed_test_carve(sentences, y, "classification", ("negative", "positive"))


def _load_sst2(data_root: str | os.PathLike[str] | None) -> _Raw:
    directory = _find_dir("sst2", data_root, ("SST-2", "sst2", ""), "train.tsv")

    def read(split: str) -> tuple[list[list[str]], list[int]]:
        path = _require(directory / f"{split}.tsv", "sst2")
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            rows = list(reader)
        if not rows or "sentence" not in rows[0] or "label" not in rows[0]:
            raise ValueError(f"{path}: expected a header 'sentence<TAB>label'")
        return [r["sentence"].split() for r in rows], [int(r["label"]) for r in rows]

    return _Raw(*read("train"), *read("dev"), "classification", ("negative", "positive"))


_Loader = Callable[..., "RawData"]
Layout = Literal["image", "tabular", "text"]


@dataclass(frozen=True)
class _Entry:
    loader: _Loader
    layout: Layout | None  # None: the loader's RawData says (the generic loaders: from the file)
    offline: bool
    num_classes: int | None


_REGISTRY: dict[str, _Entry] = {}


def register_dataset(
    name: str, *, layout: Layout | None, offline: bool = False, num_classes: int | None = None
) -> Callable[[_Loader], _Loader]:
    """Register a data-set loader under ``name`` (like :func:`autonorm_core.norms.register_norm`).

    A loader is ``loader(data_root, **options) -> RawData``: it parses the files into a training
    pool and a test split (:meth:`RawData.from_pool` carves the fixed test split of a set without an
    official one) and :func:`load_dataset` does the rest with the conventions of this module (seeded
    validation carve, train-only statistics, the test split never used for fitting).

    Args:
        name: the registry name (the spec's ``data.type``).
        layout: ``image`` ((N, C, H, W), per-channel standardisation), ``tabular`` ((N, D),
            per-feature), ``text`` (token lists -> ids); ``None`` when the loader's ``RawData.layout``
            says it.
        offline: the set needs no ``data_root`` (listed by ``list_datasets(offline_only=True)``).
        num_classes: classes (0: regression) when fixed without loading; None: known once loaded.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def deco(loader: _Loader) -> _Loader:
        if name in _REGISTRY:
            raise ValueError(f"data set {name!r} is already registered")
        _REGISTRY[name] = _Entry(loader, layout, offline, num_classes)
        return loader

    return deco


# The shipped sets (tests/core/test_data.py checks the class counts against loaded splits).
for _name, _loader, _layout, _offline, _classes in (
    ("fashion_mnist", _load_fashion_mnist, "image", True, 10),
    ("digits", _load_digits, "image", True, 10),
    ("diabetes", _load_diabetes, "tabular", True, 0),
    ("ptb_pos_sample", _load_ptb_pos_sample, "text", True, None),
    ("pang_lee_polarity", _load_pang_lee_polarity, "text", True, 2),
    ("mnist", _load_mnist, "image", False, 10),
    ("cifar10", _load_cifar10, "image", False, 10),
    ("cifar100", _load_cifar100, "image", False, 100),
    ("svhn", _load_svhn, "image", False, 10),
    ("sst2", _load_sst2, "text", False, 2),
    ("ptb_pos", _load_ptb_pos, "text", False, None),
):
    register_dataset(_name, layout=_layout, offline=_offline, num_classes=_classes)(_loader)  # type: ignore[arg-type]


def _from_file(file: Any) -> RawData:
    if file.test_x is None:
        return RawData.from_pool(
            file.pool_x, file.pool_y, task=file.task, classes=file.classes, layout=file.layout
        )
    return RawData(file.pool_x, file.pool_y, file.test_x, file.test_y, file.task, file.classes, file.layout)


@register_dataset("arrays", layout=None)
def _load_arrays(data_root: str | os.PathLike[str] | None, *, path: str) -> RawData:
    """``data: {type: arrays, path: x.npz}``: see :mod:`autonorm_core.datafiles`."""
    from autonorm_core.datafiles import read_arrays

    return _from_file(read_arrays(path))


@register_dataset("table", layout="tabular")
def _load_table(
    data_root: str | os.PathLike[str] | None, *, path: str, target: str, test_path: str | None = None
) -> RawData:
    """``data: {type: table, path: data.csv, target: COLUMN}``: see :mod:`autonorm_core.datafiles`."""
    from autonorm_core.datafiles import read_table

    return _from_file(read_table(path, target, test_path=test_path))


def class_count(name: str) -> int | None:
    """Number of classes of a data set without loading it (0: regression; ``None``: known only once
    loaded, e.g. a tagging corpus or a file of one's own). What "chance" means for a study's verdict gates."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown data set {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name].num_classes


def list_datasets(*, offline_only: bool = False) -> tuple[str, ...]:
    """Registered data set names (sorted); ``offline_only`` keeps the shipped sets that load with no
    argument at all (no ``data_root``, no file of one's own: ``arrays`` and ``table`` need a ``path``)."""
    return tuple(sorted(n for n, e in _REGISTRY.items() if e.offline or not offline_only))


def _tabular_splits(
    name: str, raw: _Raw, *, seed: int, val_fraction: float, subset: int | tuple[int, int] | None
) -> Splits:
    return _dense_splits(name, raw, seed=seed, val_fraction=val_fraction, subset=subset, dims=(0,))


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    data_root: str | os.PathLike[str] | None = None,
    val_fraction: float = 0.1,
    subset: int | tuple[int, int] | None = None,
    device: torch.device | str = "cpu",
    min_freq: int = 1,
    **options: Any,
) -> Splits:
    """Loads a data set as tensors split into train / val / test.

    Args:
        name: One of :func:`list_datasets`.
        seed: Picks the training-pool subset and the validation carve (a local generator; the
            global RNG is untouched). The test split does not depend on it.
        data_root: Directory with the distribution files of a data-root set (layout in
            :data:`DATA_ROOT_LAYOUT`); for offline sets it overrides the default location
            (Fashion-MNIST IDX directory, python3-pattern extraction directory).
        val_fraction: Share of the training pool carved out as validation split, in (0, 1).
        subset: ``n`` keeps a seeded random ``n`` examples of the training pool and a fixed
            (seed-independent) ``n`` of the test split; ``(n_pool, n_test)`` sets them apart. For
            fast runs and tests; None keeps everything.
        device: Where the tensors are put (small sets fit on any accelerator).
        min_freq: Text only: train-split count a word needs to enter the vocabulary; rarer words
            become ``<unk>`` (see the module docstring for why the default is 1).
        **options: The loader's own keywords: ``path`` for ``arrays``; ``path``, ``target`` and
            ``test_path`` for ``table`` (see :mod:`autonorm_core.datafiles`).

    Returns:
        The splits with the conventions in this module's docstring.

    Raises:
        ValueError: Unknown name or invalid fraction / subset.
        DatasetNotFoundError: The files are missing; the message says which files go where.
        autonorm_core.datafiles.DataFileError: A file of one's own that cannot be used (a
            ``ValueError`` naming the file and the array or column).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown data set {name!r}; valid names: {', '.join(list_datasets())}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if min_freq < 1:
        raise ValueError(f"min_freq must be at least 1, got {min_freq}")
    _subset_sizes(subset)  # validate before any (possibly slow) parsing
    entry = _REGISTRY[name]
    try:
        raw: RawData = entry.loader(data_root, **options)
    except TypeError as e:
        # A missing or unknown loader keyword: say which data set, not which Python function.
        raise ValueError(f"data set {name!r}: {e}") from None
    kind = raw.layout or entry.layout
    if kind == "text":
        splits = _text_splits(
            name, raw, seed=seed, val_fraction=val_fraction, subset=subset, min_freq=min_freq
        )
    elif kind == "image":
        splits = _image_splits(name, raw, seed=seed, val_fraction=val_fraction, subset=subset)
    else:
        splits = _tabular_splits(name, raw, seed=seed, val_fraction=val_fraction, subset=subset)
    return splits if torch.device(device).type == "cpu" else splits.to(device)
