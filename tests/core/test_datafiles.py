"""A data set of one's own: the generic ``arrays`` (.npz) and ``table`` (CSV / Parquet) loaders, the
registry they live in, and the errors a file that cannot be used gets (no Ray, tiny files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from autonorm_core import data
from autonorm_core.data import RawData, load_dataset, register_dataset
from autonorm_core.datafiles import DataFileError, read_arrays, read_table


def _features(n: int = 120, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32) * 3 + 7  # not standardised: the loader does it
    y = (x[:, 0] > 7).astype(np.int64) + 2 * (x[:, 1] > 7)  # 4 classes
    return x, y


def test_arrays_features_follow_the_splits_conventions(tmp_path: Path) -> None:
    x, y = _features()
    np.savez(tmp_path / "f.npz", x_train=x, y_train=y)
    s0 = load_dataset("arrays", path=str(tmp_path / "f.npz"), seed=0)
    s1 = load_dataset("arrays", path=str(tmp_path / "f.npz"), seed=1)
    assert (s0.task, s0.num_classes, s0.input_shape, s0.classes) == (
        "classification",
        4,
        (5,),
        ("0", "1", "2", "3"),
    )
    # No test arrays: a fixed 20 % carve, the same for every seed; train/val reshuffled by the seed.
    assert s0.sizes == {"train": 86, "val": 10, "test": 24}
    # (The test inputs differ by the seed's train statistics only: same examples, same labels.)
    assert torch.equal(s0.indices["test"], s1.indices["test"]) and torch.equal(s0.test[1], s1.test[1])
    assert not torch.equal(s0.indices["train"], s1.indices["train"])
    # Standardised with the train split's statistics only (the test split is never used to fit).
    assert torch.allclose(s0.train[0].mean(0), torch.zeros(5), atol=1e-5)
    assert s0.test[0].mean().abs() > 1e-3
    assert s0.train[1].dtype == torch.int64


def test_arrays_images_with_own_test_split_and_relabelled_classes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(40, 3, 6, 6)).astype(np.uint8)
    y = rng.choice([3, 7], size=40)
    xt, yt = x[:10].copy(), np.full(10, 7)
    np.savez(tmp_path / "img.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    s = load_dataset("arrays", path=str(tmp_path / "img.npz"), seed=0)
    assert (s.input_shape, s.classes, s.sizes["test"]) == ((3, 6, 6), ("3", "7"), 10)
    assert set(s.test[1].tolist()) == {1}  # label 7 is class 1 in train and test alike
    assert torch.allclose(s.train[0].mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)  # per channel


def test_arrays_float_targets_are_a_regression(tmp_path: Path) -> None:
    x, _ = _features()
    np.savez(tmp_path / "r.npz", x_train=x, y_train=x[:, 2] * 10.0)
    s = load_dataset("arrays", path=str(tmp_path / "r.npz"))
    assert (s.task, s.num_classes) == ("regression", 0)
    assert s.train[1].mean().abs() < 1e-4 and s.target_scale > 1  # standardised, scale kept


@pytest.mark.parametrize(
    ("arrays", "needles"),
    [
        ({"x_train": np.zeros((10, 3)), "y_train": np.arange(9) % 2}, ["x_train has 10", "y_train has 9"]),
        ({"x_train": np.zeros((10, 3))}, ["missing array(s) y_train"]),
        ({"x_train": np.zeros((10, 3, 4)), "y_train": np.arange(10) % 2}, ["x_train has shape (10, 3, 4)"]),
        ({"x_train": np.full((10, 3), np.nan), "y_train": np.arange(10) % 2}, ["x_train", "NaN"]),
        ({"x_train": np.zeros((10, 3)), "y_train": np.zeros(10, dtype=np.int64)}, ["single class"]),
        (
            {"x_train": np.zeros((10, 3)), "y_train": np.arange(10) % 2, "x_test": np.zeros((4, 3))},
            ["x_test without y_test"],
        ),
        (
            {
                "x_train": np.zeros((10, 3)),
                "y_train": np.arange(10) % 2,
                "x_test": np.zeros((4, 2)),
                "y_test": np.zeros(4, dtype=np.int64),
            },
            ["x_test examples have shape (2,)"],
        ),
        (
            {
                "x_train": np.zeros((10, 3)),
                "y_train": np.arange(10) % 2,
                "x_test": np.zeros((4, 3)),
                "y_test": np.full(4, 5),
            },
            ["y_test has labels the training pool lacks (5)"],
        ),
        (
            {"x_train": np.zeros((10, 3)), "y_train": np.arange(10) % 2, "z": np.zeros(1)},
            ["unexpected array(s) z"],
        ),
    ],
)
def test_arrays_errors_name_the_arrays(
    tmp_path: Path, arrays: dict[str, np.ndarray], needles: list[str]
) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    with pytest.raises(DataFileError) as info:
        read_arrays(path)
    assert all(n in str(info.value) for n in needles), str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_and_not_an_npz(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="does not exist"):
        read_arrays(tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_text("not a zip", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"not a readable \.npz"):
        read_arrays(tmp_path / "junk.npz")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_text_labels_and_numeric_features(tmp_path: Path, suffix: str) -> None:
    x, y = _features(n=60, d=3)
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2].round().astype(int)})
    frame["label"] = np.where(y % 2 == 0, "even", "odd")
    path = tmp_path / f"t{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    s = load_dataset("table", path=str(path), target="label", seed=0)
    assert (s.task, s.classes, s.input_shape) == ("classification", ("even", "odd"), (3,))
    assert sum(s.sizes.values()) == 60
    # A separate test table with the same columns.
    test_path = tmp_path / f"test{suffix}"
    part = frame.iloc[:8]
    part.to_csv(test_path, index=False) if suffix == ".csv" else part.to_parquet(test_path)
    s2 = load_dataset("table", path=str(path), target="label", test_path=str(test_path))
    assert s2.sizes["test"] == 8 and s2.sizes["train"] + s2.sizes["val"] == 60


def test_table_errors_name_the_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": [1.0, 2.0, None, 4.0], "y": [0, 1, 0, 1]}).to_csv(path, index=False)
    with pytest.raises(DataFileError, match="column 'a' holds 1 missing"):
        read_table(path, "y")
    pd.DataFrame({"a": ["x", "y", "z", "w"], "y": [0, 1, 0, 1]}).to_csv(path, index=False)
    with pytest.raises(DataFileError, match="column 'a' is not numeric"):
        read_table(path, "y")
    pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "y": [0, 1, 0, 1]}).to_csv(path, index=False)
    with pytest.raises(DataFileError, match="no target column 'label'; columns: a, y"):
        read_table(path, "label")
    with pytest.raises(DataFileError, match=r"must be \.csv or \.parquet"):
        read_table(path.rename(tmp_path / "t.txt"), "y")


def test_a_registered_loader_gets_the_same_conventions() -> None:
    @register_dataset("blobs_for_test", layout="tabular", num_classes=2)
    def _blobs(data_root: object) -> RawData:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(50, 2)).astype(np.float32)
        return RawData.from_pool(
            x, (x[:, 0] > 0).astype(np.int64), task="classification", classes=("neg", "pos")
        )

    try:
        s = load_dataset("blobs_for_test", seed=3)
        assert "blobs_for_test" in data.list_datasets() and data.class_count("blobs_for_test") == 2
        assert s.sizes == {"train": 36, "val": 4, "test": 10} and s.classes == ("neg", "pos")
        with pytest.raises(ValueError, match="already registered"):
            register_dataset("blobs_for_test", layout="tabular")(_blobs)
        with pytest.raises(ValueError, match=r"data set .blobs_for_test.*unexpected keyword"):
            load_dataset("blobs_for_test", path="x.npz")
    finally:
        data._REGISTRY.pop("blobs_for_test")
