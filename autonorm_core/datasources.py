"""Where the data sets live and how their distribution files are read: one loader per shipped set.

A loader is ``loader(data_root, **options) -> RawData`` (see :func:`autonorm_core.data.register_dataset`,
which registers these); :mod:`autonorm_core.datasplits` turns the result into :class:`Splits`.
"""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autonorm_core.datasplits import IGNORE_INDEX, RawData, _fixed_test_carve, _fixed_test_indices, _Raw

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


@functools.lru_cache(maxsize=4)
def _sklearn_csv(name: str, delimiter: str | None = None) -> np.ndarray:
    """A CSV that scikit-learn bundles (``sklearn/datasets/data/NAME``), read as its own loaders read
    it, without importing scikit-learn: that import (SciPy and all) costs about a second in every
    trial worker, which loads its data once, and in every plan.

    Parsed once per process (read-only; the loaders copy what they keep): a stacked group loads one
    split per member seed, and the parse (18 ms for digits) was most of a split's cost."""
    spec = importlib.util.find_spec("sklearn")  # finds the package; imports nothing
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(roots[0]) / "datasets" / "data" / name if roots else Path("sklearn/datasets/data") / name
    if not path.is_file():
        raise DatasetNotFoundError(
            f"{name} ships with scikit-learn, but {path} is missing: pip install scikit-learn"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        table = np.loadtxt(f, delimiter=delimiter)
    table.flags.writeable = False
    return table


def forget_parsed_files() -> None:
    """Drop the files parsed once per process (:func:`_sklearn_csv`): the next load opens them again,
    as ``studies.provenance.data_files`` needs to see which files a data set reads."""
    _sklearn_csv.cache_clear()


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


_OANC_FILE = "tagged-en-oanc.txt"
_WSJ_FILE = "tagged-en-wsj.txt"
_OANC_SPLIT_SEED = 0  # the constant seed of the test carve: the same test sentences for every training seed
_OOD_TEST_SETS = ("wsj",)


def _oanc_tag(tag: str, *, wsj: bool = False) -> str:
    """OANC's tags as the training pool names them: an ambiguous ``A|B`` (4 tokens in OANC) is its first
    tag, as the Penn Treebank guidelines read it; WSJ's closing quote ``''`` is OANC's ``"`` (OANC
    tags every closing and most opening quotes ``"``, and has no ``''``)."""
    if wsj and tag == "''":
        return '"'
    return tag.split("|", 1)[0] if "|" in tag else tag


def _oanc_corpus(data_root: str | os.PathLike[str] | None, file: str) -> Path:
    """``file`` in python3-pattern's corpora, or an error naming the path looked at."""
    base = Path(data_root).expanduser() if data_root is not None else cache_root() / "pattern"
    for candidate in (base / _PATTERN_CORPORA, base):
        if (candidate / file).is_file():
            return candidate / file
    raise DatasetNotFoundError(
        f"data set 'oanc_pos': {base / _PATTERN_CORPORA / file} not found (nor {base / file}). It is one of "
        f"python3-pattern's test corpora: run scripts/fetch_data.sh, or `apt-get download python3-pattern && "
        f"dpkg-deb -x python3-pattern_*.deb {base}` (set AUTONORM_DATA_DIR to move the cache root, or pass "
        f"data_root=)."
    )


def _pieces(
    words: list[list[str]], tags: list[list[str]], max_tokens: int | None
) -> tuple[list[list[str]], list[list[str]]]:
    """Each sentence longer than ``max_tokens`` cut into consecutive pieces of at most that many tokens."""
    if max_tokens is None:
        return words, tags
    out_w, out_t = [], []
    for w, t in zip(words, tags):
        for i in range(0, len(w), max_tokens):
            out_w.append(w[i : i + max_tokens])
            out_t.append(t[i : i + max_tokens])
    return out_w, out_t


def _load_oanc_pos(
    data_root: str | os.PathLike[str] | None,
    *,
    test_fraction: float = 0.1,
    ood_test: str | None = None,
    max_tokens: int | None = None,
) -> _Raw:
    """The OANC corpus of python3-pattern (20,000 sentences, 360,524 tokens, Penn Treebank tags).

    The test split is a fixed share ``test_fraction`` of the sentences, drawn with a constant seed (the
    same for every training seed and every run); the rest is the training pool, from which
    :func:`load_dataset` carves the seeded validation split. ``ood_test="wsj"``: the test split is the
    whole WSJ sample (``tagged-en-wsj.txt``, 1,001 sentences) instead, an out-of-domain test of a tagger
    trained on OANC; the training pool is the same. A test token whose tag the training pool lacks
    (OANC's single ``#`` when it falls in test) is not scored (``ignore_index``).

    ``max_tokens``: after the split, a sentence longer than this is cut into consecutive pieces of at
    most ``max_tokens`` tokens, each an example of its own (every token is still trained on and
    scored). Inputs are padded to the longest example: OANC's longest sentence has 220 tokens, its
    median 15, and 1 % have more than 63, so ``max_tokens: 64`` trains about 3x faster."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if ood_test is not None and ood_test not in _OOD_TEST_SETS:
        raise ValueError(f"ood_test must be one of {', '.join(_OOD_TEST_SETS)} or None, got {ood_test!r}")
    words, tags = _parse_tagged(_read_lines(_oanc_corpus(data_root, _OANC_FILE)))
    tags = [[_oanc_tag(t) for t in s] for s in tags]
    perm = np.random.default_rng(_OANC_SPLIT_SEED).permutation(len(words))
    n_test = int(np.floor(test_fraction * len(words) + 0.5))
    test_idx, pool_idx = sorted(perm[:n_test].tolist()), sorted(perm[n_test:].tolist())
    pool = ([words[i] for i in pool_idx], [tags[i] for i in pool_idx])
    if ood_test == "wsj":
        wsj_words, wsj_tags = _parse_tagged(_read_lines(_oanc_corpus(data_root, _WSJ_FILE)))
        test = (wsj_words, [[_oanc_tag(t, wsj=True) for t in s] for s in wsj_tags])
    else:
        test = ([words[i] for i in test_idx], [tags[i] for i in test_idx])
    pool, test = _pieces(*pool, max_tokens), _pieces(*test, max_tokens)
    tag_names = tuple(sorted({t for s in pool[1] for t in s}))
    tag_ids = {t: i for i, t in enumerate(tag_names)}
    pool_y = [[tag_ids[t] for t in s] for s in pool[1]]
    test_y = [[tag_ids.get(t, IGNORE_INDEX) for t in s] for s in test[1]]
    return _Raw(pool[0], pool_y, test[0], test_y, "tagging", tag_names)


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


def _from_file(file: Any) -> RawData:
    if file.test_x is None:
        return RawData.from_pool(
            file.pool_x, file.pool_y, task=file.task, classes=file.classes, layout=file.layout
        )
    return RawData(file.pool_x, file.pool_y, file.test_x, file.test_y, file.task, file.classes, file.layout)


def _load_arrays(data_root: str | os.PathLike[str] | None, *, path: str) -> RawData:
    """``data: {type: arrays, path: x.npz}``: see :mod:`autonorm_core.datafiles`."""
    from autonorm_core.datafiles import read_arrays

    return _from_file(read_arrays(path))


def _load_table(
    data_root: str | os.PathLike[str] | None, *, path: str, target: str, test_path: str | None = None
) -> RawData:
    """``data: {type: table, path: data.csv, target: COLUMN}``: see :mod:`autonorm_core.datafiles`."""
    from autonorm_core.datafiles import read_table

    return _from_file(read_table(path, target, test_path=test_path))
