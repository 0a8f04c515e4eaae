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
oanc_pos          tagging, 45    18000 2000 fixed   (220,)    pattern ``tagged-en-oanc.txt`` (20000 lines)
pang_lee_polarity 2 classes      3200  800 fixed    (59,)     pattern ``polarity-en-pang&lee2.csv``
================= ============== ===== ============ ========= ===========================================

Offline sets (no network after ``scripts/fetch_data.sh``): ``fashion_mnist`` (Debian
``dataset-fashion-mnist``), ``digits`` and ``diabetes`` (bundled with scikit-learn),
``ptb_pos_sample``, ``oanc_pos`` and ``pang_lee_polarity`` (test corpora inside the Debian
``python3-pattern`` package, read at run time from its extraction directory and never copied: the corpora are for
personal use only). The others (``mnist``, ``cifar10``, ``cifar100``, ``svhn``, ``sst2``,
``ptb_pos``) read their standard distribution files from ``data_root``; the expected layout is in
:data:`DATA_ROOT_LAYOUT` and in the error raised when files are missing.

Layout: this module holds the registry and :func:`load_dataset`; :mod:`autonorm_core.datasources`
the paths, parsers and loaders of the distribution files; :mod:`autonorm_core.datasplits` the
:class:`Splits` and :class:`RawData` types and the carving, standardisation and vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

# Re-exported: tests/deploy/test_image.py checks that the image puts Fashion-MNIST where it is read.
from autonorm_core.datasources import _FASHION_MNIST_DIR as _FASHION_MNIST_DIR
from autonorm_core.datasources import (
    DATA_ROOT_LAYOUT,
    DatasetNotFoundError,
    _load_arrays,
    _load_cifar10,
    _load_cifar100,
    _load_diabetes,
    _load_digits,
    _load_fashion_mnist,
    _load_mnist,
    _load_oanc_pos,
    _load_pang_lee_polarity,
    _load_ptb_pos,
    _load_ptb_pos_sample,
    _load_sst2,
    _load_svhn,
    _load_table,
    cache_root,
    pattern_corpora_dir,
)
from autonorm_core.datasplits import (
    IGNORE_INDEX,
    PAD_INDEX,
    UNK_INDEX,
    RawData,
    Splits,
    _image_splits,
    _subset_sizes,
    _tabular_splits,
    _text_splits,
    split_sizes,
)

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
    ("oanc_pos", _load_oanc_pos, "text", True, None),
    ("pang_lee_polarity", _load_pang_lee_polarity, "text", True, 2),
    ("mnist", _load_mnist, "image", False, 10),
    ("cifar10", _load_cifar10, "image", False, 10),
    ("cifar100", _load_cifar100, "image", False, 100),
    ("svhn", _load_svhn, "image", False, 10),
    ("sst2", _load_sst2, "text", False, 2),
    ("ptb_pos", _load_ptb_pos, "text", False, None),
):
    register_dataset(_name, layout=_layout, offline=_offline, num_classes=_classes)(_loader)  # type: ignore[arg-type]

# Files of one's own, in the generic formats of :mod:`autonorm_core.datafiles`.
register_dataset("arrays", layout=None)(_load_arrays)
register_dataset("table", layout="tabular")(_load_table)


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
            ``test_path`` for ``table`` (see :mod:`autonorm_core.datafiles`); ``test_fraction`` and
            ``ood_test`` and ``max_tokens`` for ``oanc_pos`` (the fixed test carve's share;
            ``"wsj"``: the WSJ sample as an out-of-domain test split instead; long sentences cut
            into pieces of at most this many tokens).

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
