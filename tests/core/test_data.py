"""Tests of autonorm_core.data: split conventions on the offline sets, data-root formats, errors.

The offline sets must be present (``scripts/fetch_data.sh``); data-root formats are exercised on
tiny files written in the standard distribution formats.
"""

from __future__ import annotations

import gzip
import pickle
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from autonorm_core import data
from autonorm_core.data import DatasetNotFoundError, Splits, load_dataset, split_sizes
from autonorm_core.datasources import _load_diabetes, _load_digits, _load_oanc_pos, pattern_corpora_dir
from autonorm_core.datasplits import _fixed_test_indices

OFFLINE = ("fashion_mnist", "digits", "diabetes", "ptb_pos_sample", "pang_lee_polarity")
DATA_ROOT_SETS = ("mnist", "cifar10", "cifar100", "svhn", "sst2", "ptb_pos")
GENERIC = ("arrays", "table")  # a file of one's own: tests/core/test_datafiles.py
# Small subsets keep the suite fast; None where the whole set is already small.
SUBSET: dict[str, int | tuple[int, int] | None] = {
    "fashion_mnist": (600, 200),
    "digits": None,
    "diabetes": None,
    "ptb_pos_sample": None,
    "pang_lee_polarity": (1000, 300),
}
# Examples in each offline set's training pool and test split (documented behaviour).
FULL_SIZES = {
    "fashion_mnist": (60000, 10000),
    "digits": (1797 - 359, 359),  # fixed 20 % test carve: round_half_up(0.2 * 1797) = 359
    "diabetes": (442 - 88, 88),
    "ptb_pos_sample": (1001 - 200, 200),
    "pang_lee_polarity": (4000 - 800, 800),
}


@pytest.fixture(scope="module")
def loaded() -> dict[tuple[str, int], Splits]:
    """Each offline set under seeds 0 and 1 (loaded once per module)."""
    return {(n, s): load_dataset(n, seed=s, subset=SUBSET[n]) for n in OFFLINE for s in (0, 1)}


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}


def test_registry_lists_offline_and_data_root_sets() -> None:
    assert set(data.list_datasets()) == set(OFFLINE) | {"oanc_pos"} | set(DATA_ROOT_SETS) | set(GENERIC)
    assert set(data.list_datasets(offline_only=True)) == set(OFFLINE) | {"oanc_pos"}
    assert set(data.DATA_ROOT_LAYOUT) == set(DATA_ROOT_SETS)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="fashion_mnist") as info:
        load_dataset("imagenet")
    assert "pang_lee_polarity" in str(info.value)


@pytest.mark.parametrize(
    "kwargs", [{"val_fraction": 0.0}, {"val_fraction": 1.0}, {"subset": 1}, {"subset": True}, {"min_freq": 0}]
)
def test_invalid_arguments_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        load_dataset("diabetes", **kwargs)


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_splits_sized_as_documented_and_disjoint(
    name: str, loaded: dict[tuple[str, int], Splits]
) -> None:
    s = loaded[(name, 0)]
    n_pool, n_test = FULL_SIZES[name]
    sub = SUBSET[name]
    if sub is not None:
        n_pool, n_test = (sub, sub) if isinstance(sub, int) else sub
    n_train, n_val = split_sizes(n_pool, 0.1)
    assert n_val == int(0.1 * n_pool + 0.5)
    assert s.sizes == {"train": n_train, "val": n_val, "test": n_test}
    for split in ("train", "val", "test"):
        x, y = getattr(s, split)
        assert len(x) == len(y) == len(s.indices[split])
        assert tuple(x.shape[1:]) == s.input_shape
    train_idx, val_idx = set(s.indices["train"].tolist()), set(s.indices["val"].tolist())
    assert not train_idx & val_idx
    assert len(train_idx) + len(val_idx) == n_pool


@pytest.mark.parametrize("name", OFFLINE)
def test_carve_is_deterministic_by_seed_and_test_split_is_not(
    name: str, loaded: dict[tuple[str, int], Splits]
) -> None:
    again = load_dataset(name, seed=0, subset=SUBSET[name])
    first, other = loaded[(name, 0)], loaded[(name, 1)]
    for split in ("train", "val", "test"):
        for a, b in zip(getattr(first, split), getattr(again, split)):
            assert torch.equal(a, b)
    assert not torch.equal(first.indices["val"], other.indices["val"])
    assert torch.equal(first.indices["test"], other.indices["test"])

    # Same test examples for every seed (ids, scaling and statistics may follow the train split).
    def test_targets(s: Splits) -> torch.Tensor:
        return s.test[1] * s.target_scale + s.target_offset if s.task == "regression" else s.test[1]

    assert torch.allclose(test_targets(first).double(), test_targets(other).double(), atol=1e-3)


def test_fixed_test_carve_is_disjoint_from_the_pool() -> None:
    test_idx, pool_idx = _fixed_test_indices(1797)
    assert not set(test_idx) & set(pool_idx)
    assert sorted(test_idx + pool_idx) == list(range(1797))
    # Content check on digits: no test image is in train or val (digits has no duplicate images).
    from sklearn.datasets import load_digits

    images = load_digits().images.reshape(1797, -1)
    assert len({r.tobytes() for r in images}) == 1797
    s = load_dataset("digits", seed=3)
    test_rows = _rows(s.test[0])
    assert not test_rows & _rows(s.train[0])
    assert not test_rows & _rows(s.val[0])


@pytest.mark.parametrize("name", ["digits", "diabetes"])
def test_bundled_sets_are_scikit_learns_own_rows(name: str) -> None:
    # read from scikit-learn's CSVs directly (no sklearn import in a trial worker): the same rows,
    # in the same order, as its loaders give
    from sklearn.datasets import load_diabetes, load_digits

    if name == "digits":
        bunch = load_digits()
        want_x, want_y, raw = bunch.images, bunch.target, _load_digits(None)
    else:
        bunch = load_diabetes(scaled=False)
        want_x, want_y, raw = bunch.data, bunch.target, _load_diabetes(None)
    got_x = np.concatenate([np.asarray(raw.pool_x), np.asarray(raw.test_x)])
    got_y = np.concatenate([np.asarray(raw.pool_y), np.asarray(raw.test_y)])
    order = np.concatenate(_fixed_test_indices(len(want_y))[::-1])  # pool rows, then test rows
    want_x = want_x.reshape(len(want_x), -1)[order].astype(got_x.dtype)  # the loaders' float32
    np.testing.assert_array_equal(got_x.reshape(len(got_x), -1), want_x)
    np.testing.assert_array_equal(got_y, want_y[order].astype(got_y.dtype))


def test_loading_the_bundled_sets_never_imports_scikit_learn() -> None:
    code = (
        "import sys; from autonorm_core.data import load_dataset; "
        "load_dataset('digits', seed=0); load_dataset('diabetes', seed=0); "
        "print('sklearn' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("name", ["fashion_mnist", "digits"])
def test_images_standardised_with_train_statistics(name: str, loaded: dict[tuple[str, int], Splits]) -> None:
    s = loaded[(name, 0)]
    x = s.train[0]
    assert x.dtype == torch.float32 and x.dim() == 4
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(x.shape[1]), atol=1e-4)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(x.shape[1]), atol=1e-3)
    # val/test use the train statistics, so they are not exactly standardised themselves.
    assert abs(s.test[0].mean().item()) > 1e-6
    assert s.train[1].dtype == torch.int64
    assert int(s.train[1].max()) < s.num_classes == len(s.classes) == 10


def test_diabetes_targets_standardised_with_train_statistics(loaded: dict[tuple[str, int], Splits]) -> None:
    from sklearn.datasets import load_diabetes

    s = loaded[("diabetes", 0)]
    assert s.task == "regression" and s.num_classes == 0 and s.input_shape == (10,)
    y = s.train[1]
    assert y.dtype == torch.float32 and y.shape == (len(s.train[0]),)
    assert abs(y.mean().item()) < 1e-5 and abs(y.std().item() - 1) < 1e-5
    original = set(np.round(load_diabetes().target).astype(int).tolist())
    for split in ("train", "val", "test"):
        restored = getattr(s, split)[1] * s.target_scale + s.target_offset
        assert set(restored.round().int().tolist()) <= original
    assert torch.allclose(s.train[0].mean(0), torch.zeros(10), atol=1e-5)


def test_ptb_pos_sample_tagging_conventions(loaded: dict[tuple[str, int], Splits]) -> None:
    s = loaded[("ptb_pos_sample", 0)]
    assert s.task == "tagging" and s.vocab is not None and s.vocab_size == len(s.vocab)
    assert s.vocab[s.pad_index] == "<pad>" and s.vocab[s.unk_index] == "<unk>"
    assert {"NN", "NNP", "DT", "VBD", ","} <= set(s.classes) and s.num_classes == len(s.classes)
    for split in ("train", "val", "test"):
        x, y = getattr(s, split)
        assert x.shape == y.shape and x.dtype == y.dtype == torch.int64
        assert torch.equal(y == s.ignore_index, x == s.pad_index)  # -100 exactly at the pads
        assert int(y[y != s.ignore_index].min()) >= 0 and int(y.max()) < s.num_classes
    assert s.ignore_index == -100


@pytest.mark.parametrize("name", ["ptb_pos_sample", "pang_lee_polarity"])
def test_vocabulary_comes_from_the_train_split_only(name: str, loaded: dict[tuple[str, int], Splits]) -> None:
    s = loaded[(name, 0)]
    assert s.vocab_size is not None
    counts = torch.bincount(s.train[0].flatten(), minlength=s.vocab_size)
    # Every real word id occurs in train (default min_freq 1); val/test add no ids.
    assert int(counts[2:].min()) >= 1 and int(counts[s.unk_index]) == 0
    assert int(s.val[0].max()) < s.vocab_size and int(s.test[0].max()) < s.vocab_size
    assert (s.test[0] == s.unk_index).any()  # unseen test words exist and map to <unk>
    rare = load_dataset(name, seed=0, subset=SUBSET[name], min_freq=2)
    assert rare.vocab_size is not None and rare.vocab_size < s.vocab_size
    rare_counts = torch.bincount(rare.train[0].flatten(), minlength=rare.vocab_size)
    assert int(rare_counts[2:].min()) >= 2 and int(rare_counts[rare.unk_index]) > 0


def test_pang_lee_polarity_is_balanced_binary(loaded: dict[tuple[str, int], Splits]) -> None:
    s = load_dataset("pang_lee_polarity", seed=0)
    assert s.task == "classification" and s.classes == ("negative", "positive")
    all_y = torch.cat([s.train[1], s.val[1], s.test[1]])
    assert torch.bincount(all_y).tolist() == [2000, 2000]
    assert s.train[1].shape == (len(s.train[0]),)


def test_missing_pattern_corpora_tell_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTONORM_DATA_DIR", str(tmp_path))
    assert data.cache_root() == tmp_path
    for name in ("ptb_pos_sample", "pang_lee_polarity"):
        with pytest.raises(DatasetNotFoundError, match=r"fetch_data\.sh"):
            load_dataset(name)


def test_missing_fashion_mnist_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset("fashion_mnist", data_root=tmp_path)


@pytest.mark.parametrize("name", DATA_ROOT_SETS)
def test_data_root_sets_fail_clearly_without_files(name: str, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="data_root") as no_root:
        load_dataset(name)
    assert data.DATA_ROOT_LAYOUT[name] in str(no_root.value)
    with pytest.raises(DatasetNotFoundError) as empty_root:
        load_dataset(name, data_root=tmp_path)
    assert str(tmp_path) in str(empty_root.value) and data.DATA_ROOT_LAYOUT[name] in str(empty_root.value)


# ----------------------------------------------------------------------------------------------
# Tiny files in the standard distribution formats


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_idx_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    _write_idx(raw / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (50, 28, 28)))
    _write_idx(raw / "train-labels-idx1-ubyte.gz", np.arange(50) % 10)
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (20, 28, 28)))
    test_labels = (np.arange(20) * 3) % 10
    _write_idx(raw / "t10k-labels-idx1-ubyte.gz", test_labels)
    s = load_dataset("mnist", data_root=tmp_path, val_fraction=0.2)
    assert s.sizes == {"train": 40, "val": 10, "test": 20}
    assert s.input_shape == (1, 28, 28) and s.num_classes == 10
    assert s.test[1].tolist() == test_labels.tolist()


def _pickle(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f)


def test_cifar10_and_cifar100_pickle_layouts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    c10 = tmp_path / "cifar-10-batches-py"
    c10.mkdir()
    for i in range(1, 6):
        _pickle(
            c10 / f"data_batch_{i}",
            {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": [i] * 4},
        )
    _pickle(c10 / "test_batch", {"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8), "labels": [9] * 6})
    s = load_dataset("cifar10", data_root=tmp_path)
    assert s.input_shape == (3, 32, 32) and s.num_classes == 10 and s.classes[0] == "airplane"
    assert s.sizes == {"train": 18, "val": 2, "test": 6}
    assert sorted(torch.cat([s.train[1], s.val[1]]).tolist()) == sorted(
        [i for i in range(1, 6) for _ in range(4)]
    )

    c100 = tmp_path / "cifar-100-python"
    c100.mkdir()
    train = {"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8), "fine_labels": list(range(90, 100))}
    _pickle(c100 / "train", {**train, "coarse_labels": [0] * 10})
    _pickle(
        c100 / "test", {"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), "fine_labels": [99, 0, 5]}
    )
    s = load_dataset("cifar100", data_root=tmp_path)
    assert s.num_classes == 100 and s.test[1].tolist() == [99, 0, 5]


def test_svhn_mat_layout_maps_label_10_to_0(tmp_path: Path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 5)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = (np.arange(n) % 10 + 1).reshape(-1, 1)  # labels 1..10, 10 = digit 0
        savemat(str(tmp_path / f"{split}_32x32.mat"), {"X": x, "y": y})
    s = load_dataset("svhn", data_root=tmp_path)
    assert s.input_shape == (3, 32, 32)
    assert s.test[1].tolist() == [1, 2, 3, 4, 5]
    assert 0 in torch.cat([s.train[1], s.val[1]]).tolist()


def test_sst2_tsv_layout_uses_dev_as_test(tmp_path: Path) -> None:
    d = tmp_path / "SST-2"
    d.mkdir()
    train = ["a fine film", "a dull film", "fine acting", "dull plot", "fine fine", "dull dull"] * 2
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{int('fine' in t)}\n" for t in train))
    (d / "dev.tsv").write_text("sentence\tlabel\nan unseenword film\t1\ndull\t0\n")
    s = load_dataset("sst2", data_root=tmp_path, val_fraction=0.25)
    assert s.task == "classification" and s.test[1].tolist() == [1, 0]
    assert s.vocab is not None and "unseenword" not in s.vocab
    first = s.test[0][0].tolist()
    assert first[1] == s.unk_index and first[3:] == [s.pad_index] * (len(first) - 3)


def test_ptb_pos_text_layout(tmp_path: Path) -> None:
    d = tmp_path / "ptb_pos"
    d.mkdir()
    train = ["The/DT cat/NN sat/VBD ./.", "A/DT dog/NN ran/VBD ./.", "3/4/CD dog/NN sat/VBD ./."] * 3
    (d / "train.txt").write_text("\n".join(train) + "\n\n")
    (d / "test.txt").write_text("The/DT zebra/NN sat/VBD ./.\n1/2/CD ./.\n")
    s = load_dataset("ptb_pos", data_root=tmp_path)
    assert s.task == "tagging" and s.classes == tuple(sorted({"DT", "NN", "VBD", ".", "CD"}))
    assert s.sizes["test"] == 2 and s.sizes["train"] + s.sizes["val"] == 9
    x, y = s.test
    assert x[0, 1] == s.unk_index  # "zebra" is not in train
    assert [s.classes[i] for i in y[0, :4].tolist()] == ["DT", "NN", "VBD", "."]
    assert s.classes[int(y[1, 0])] == "CD"  # "1/2/CD": the tag follows the last slash
    assert y[1, 2:].eq(s.ignore_index).all()


def test_ptb_pos_tag_only_in_test_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "ptb_pos"
    d.mkdir()
    (d / "train.txt").write_text("The/DT cat/NN ./.\nA/DT dog/NN ./.\n")
    (d / "test.txt").write_text("Wow/UH ./.\n")
    with pytest.raises(ValueError, match="UH"):
        load_dataset("ptb_pos", data_root=tmp_path)


def test_splits_to_moves_every_tensor() -> None:
    s = load_dataset("diabetes", seed=0)
    moved = s.to("meta")
    assert moved.train[0].device.type == moved.test[1].device.type == "meta"
    assert s.train[0].device.type == "cpu"  # the original is untouched (frozen dataclass copy)
    on_meta = load_dataset("diabetes", seed=0, device="meta")
    assert on_meta.val[0].device.type == "meta" and on_meta.sizes == s.sizes


@pytest.mark.parametrize("name", ["digits", "diabetes", "fashion_mnist", "pang_lee_polarity"])
def test_class_count_matches_the_loaded_splits(name: str) -> None:
    from autonorm_core.data import class_count

    splits = load_dataset(name, seed=0, subset=200 if name == "fashion_mnist" else None)
    assert class_count(name) == splits.num_classes


def test_class_count_unknown_name_and_tagging_set() -> None:
    from autonorm_core.data import class_count

    assert class_count("ptb_pos_sample") is None  # tags counted from the corpus
    with pytest.raises(ValueError, match="valid:"):
        class_count("imagenet")


# ---- oanc_pos: python3-pattern's OANC corpus (20,000 sentences, 360,524 tokens) ------------------------


def _sentences(x: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(r[r != data.PAD_INDEX].tolist()) for r in x]


def _tokens(y: torch.Tensor) -> int:
    return int((y != data.IGNORE_INDEX).sum())


@pytest.fixture(scope="module")
def oanc() -> dict[int, Splits]:
    return {seed: load_dataset("oanc_pos", seed=seed) for seed in (0, 1)}


def test_oanc_pos_sizes_and_tags(oanc: dict[int, Splits]) -> None:
    s = oanc[0]
    assert s.task == "tagging" and len(s.classes) == 45  # 48 tags, the 3 ambiguous "A|B" read as A
    assert {"NN", "VBD", "DT", '"', "``"} <= set(s.classes) and not any("|" in c for c in s.classes)
    # test_fraction 0.1 of 20,000 sentences, val_fraction 0.1 of the 18,000 left
    assert s.sizes == {"train": 16200, "val": 1800, "test": 2000}
    assert sum(_tokens(y) for _, y in (s.train, s.val, s.test)) >= 360_524 - 1  # one "#" may be unscored
    assert 280_000 < _tokens(s.train[1]) < 310_000
    assert s.vocab is not None and len(s.vocab) > 20_000


def test_oanc_pos_split_is_deterministic_and_disjoint(oanc: dict[int, Splits]) -> None:
    a, b, again = oanc[0], oanc[1], load_dataset("oanc_pos", seed=0)
    # the test split is the same sentences for every seed; the vocabulary comes from train, so ids differ
    # between seeds: compare the tags, which have one numbering
    assert torch.equal(a.test[1], b.test[1])
    assert torch.equal(a.train[0], again.train[0]) and torch.equal(a.val[1], again.val[1])
    assert not torch.equal(a.val[1], b.val[1])  # the validation carve follows the seed
    train, val = (set(a.indices[k].tolist()) for k in ("train", "val"))
    assert not train & val and len(train | val) == 18000
    # the test carve and the pool partition the corpus by sentence: every sentence in exactly one
    raw = _load_oanc_pos(None)
    corpus = Path(pattern_corpora_dir()) / "tagged-en-oanc.txt"
    lines = [ln.split() for ln in corpus.read_text(encoding="utf-8").split("\n") if ln.split()]
    every = Counter(tuple(t.rsplit("/", 1)[0] for t in ln) for ln in lines)
    assert Counter(map(tuple, raw.pool_x)) + Counter(map(tuple, raw.test_x)) == every
    assert len(raw.test_x) == 2000 and raw.test_x == _load_oanc_pos(None).test_x


def test_oanc_pos_test_fraction_and_ood_wsj(oanc: dict[int, Splits]) -> None:
    small = load_dataset("oanc_pos", test_fraction=0.05, val_fraction=0.2)
    assert small.sizes == {"train": 15200, "val": 3800, "test": 1000}
    wsj = load_dataset("oanc_pos", ood_test="wsj")
    assert wsj.sizes["test"] == 1001 and wsj.classes == oanc[0].classes
    assert torch.equal(wsj.train[1], oanc[0].train[1])  # the same training pool as the in-domain test
    sample = load_dataset("ptb_pos_sample")
    wsj_tokens = sum(_tokens(y) for _, y in (sample.train, sample.val, sample.test))
    assert _tokens(wsj.test[1]) == wsj_tokens  # every WSJ token scored: '' read as OANC's "
    with pytest.raises(ValueError, match="ood_test"):
        load_dataset("oanc_pos", ood_test="brown")
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("oanc_pos", test_fraction=1.0)


def test_oanc_pos_missing_corpus_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("oanc_pos", data_root=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "usr/share/doc/python3-pattern/test/corpora/tagged-en-oanc.txt") in message
    assert "fetch_data.sh" in message
