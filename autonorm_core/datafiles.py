"""Your own data set from a file, no code: ``.npz`` arrays or a CSV / Parquet table (numpy only).

Two generic formats, read and checked here without torch, so that spec validation can refuse a bad
file before any trial starts (:mod:`autonorm_core.data` turns the result into :class:`Splits`):

* **arrays** — an ``.npz`` (``numpy.savez``) with ``x_train`` and ``y_train`` and, optionally,
  ``x_test`` and ``y_test`` (both or neither). Inputs are images ``(N, C, H, W)`` or feature rows
  ``(N, D)``; targets ``(N,)``. Integer (or boolean) targets are class labels, float targets a
  regression. Without a test pair, a fixed 20 % of the training pool (the same for every seed) is
  the test split, as for the offline sets without an official test split.
* **table** — a ``.csv`` or ``.parquet`` file: one row per example, the ``target`` column the
  label, every other column a numeric feature. Integer or text targets are classes (text labels
  sorted, so the class ids do not depend on row order), float targets a regression. An optional
  second file with the same columns is the test split; else the fixed 20 % carve.

Class ids are the sorted distinct labels of the training pool (labels ``3`` and ``7`` become
classes 0 and 1, named ``"3"`` and ``"7"``); a test label that the training pool lacks is an error,
because sizing the output layer from test labels would leak. Refused with :class:`DataFileError`
(a ``ValueError`` whose message names the file and the array or column): a missing file, key or
column; a wrong number of dimensions; NaN or infinite values; arrays of different lengths (both
named); a target with a single class; a non-numeric feature column.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["DataFile", "DataFileError", "inspect_data_file", "read_arrays", "read_table"]

Layout = Literal["image", "tabular"]
FileTask = Literal["classification", "regression"]

_TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


class DataFileError(ValueError):
    """A data file that cannot be used as it is; the message says which file, array or column, and why."""


@dataclass(frozen=True, eq=False)
class DataFile:
    """A checked data file: the training pool, the optional test split and what they hold.

    Attributes:
        pool_x / pool_y: the training pool (train + validation before the seeded carve).
        test_x / test_y: the file's own test split, or ``None`` (the loader carves a fixed one).
        task: ``classification`` (``pool_y`` int64 class ids) or ``regression`` (float32).
        layout: ``image`` (inputs ``(N, C, H, W)``) or ``tabular`` (``(N, D)``).
        classes: the class names, index-aligned with the ids; empty for a regression.
    """

    pool_x: np.ndarray
    pool_y: np.ndarray
    test_x: np.ndarray | None
    test_y: np.ndarray | None
    task: FileTask
    layout: Layout
    classes: tuple[str, ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example's input."""
        return tuple(int(d) for d in self.pool_x.shape[1:])

    @property
    def num_classes(self) -> int:
        """Number of classes; 0 for a regression."""
        return len(self.classes)


def _existing(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataFileError(
            f"{what} {p} does not exist (relative paths are resolved from the working directory)"
        )
    return p


def _check_finite(a: np.ndarray, name: str, where: Path) -> None:
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        raise DataFileError(f"{where}: {name} holds {bad} NaN or infinite value(s); remove or impute them")


def _labels(
    pool: np.ndarray, test: np.ndarray | None, where: Path, names: tuple[str, str]
) -> tuple[np.ndarray, np.ndarray | None, FileTask, tuple[str, ...]]:
    """Targets as class ids (integer, boolean or text labels) or float32 (a regression)."""
    if pool.dtype.kind == "f":
        if test is not None and test.dtype.kind != "f":
            raise DataFileError(f"{where}: {names[0]} is float (a regression) but {names[1]} is {test.dtype}")
        return pool.astype(np.float32), None if test is None else test.astype(np.float32), "regression", ()
    if pool.dtype.kind not in "iubUSO":
        raise DataFileError(
            f"{where}: {names[0]} has dtype {pool.dtype}; targets must be integer or text (classes) or float "
            "(a regression)"
        )
    values = np.unique(pool)
    if len(values) < 2:
        raise DataFileError(
            f"{where}: {names[0]} holds a single class ({values[0] if len(values) else 'none'}); a classifier "
            "needs at least two"
        )
    if test is not None:
        unseen = np.setdiff1d(np.unique(test), values)
        if len(unseen):
            shown = ", ".join(str(v) for v in unseen[:5])
            raise DataFileError(
                f"{where}: {names[1]} has labels the training pool lacks ({shown}); every test class must "
                f"occur in {names[0]}"
            )
    ids = np.searchsorted(values, pool).astype(np.int64)
    test_ids = None if test is None else np.searchsorted(values, test).astype(np.int64)
    return ids, test_ids, "classification", tuple(str(v) for v in values.tolist())


def _inputs(x: np.ndarray, name: str, where: Path) -> Layout:
    if x.ndim not in (2, 4):
        raise DataFileError(
            f"{where}: {name} has shape {tuple(x.shape)}; inputs must be images (N, C, H, W) or features (N, D)"
        )
    if x.dtype.kind not in "fiub":
        raise DataFileError(f"{where}: {name} has dtype {x.dtype}; inputs must be numeric")
    if min(x.shape[1:]) < 1:
        raise DataFileError(f"{where}: {name} has an empty dimension, shape {tuple(x.shape)}")
    _check_finite(x, name, where)
    return "image" if x.ndim == 4 else "tabular"


def _same_length(x: np.ndarray, y: np.ndarray, names: tuple[str, str], where: Path) -> None:
    if y.ndim != 1:
        raise DataFileError(
            f"{where}: {names[1]} has shape {tuple(y.shape)}; targets must be one value per example (N,)"
        )
    if len(x) != len(y):
        raise DataFileError(
            f"{where}: {names[0]} has {len(x)} examples but {names[1]} has {len(y)}; they must have the same length"
        )


def read_arrays(path: str | os.PathLike[str]) -> DataFile:
    """Read and check an ``.npz`` of ``x_train``, ``y_train`` (and optionally ``x_test``, ``y_test``).

    Raises:
        DataFileError: see the module docstring.
    """
    where = _existing(path, "arrays file")
    try:
        with np.load(where, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        raise DataFileError(f"{where}: not a readable .npz (numpy.savez) file: {e}") from None
    missing = [k for k in ("x_train", "y_train") if k not in arrays]
    if missing:
        raise DataFileError(
            f"{where}: missing array(s) {', '.join(missing)}; it holds {', '.join(sorted(arrays)) or 'nothing'} "
            "(expected x_train, y_train and optionally x_test, y_test)"
        )
    has_test = [k for k in ("x_test", "y_test") if k in arrays]
    if len(has_test) == 1:
        other = "y_test" if has_test[0] == "x_test" else "x_test"
        raise DataFileError(f"{where}: {has_test[0]} without {other}; give both or neither")
    extra = sorted(set(arrays) - {"x_train", "y_train", "x_test", "y_test"})
    if extra:
        raise DataFileError(
            f"{where}: unexpected array(s) {', '.join(extra)} (valid: x_train, y_train, x_test, y_test)"
        )
    x, y = arrays["x_train"], arrays["y_train"]
    layout = _inputs(x, "x_train", where)
    _same_length(x, y, ("x_train", "y_train"), where)
    xt = yt = None
    if has_test:
        xt, yt = arrays["x_test"], arrays["y_test"]
        _inputs(xt, "x_test", where)
        if xt.shape[1:] != x.shape[1:]:
            raise DataFileError(
                f"{where}: x_test examples have shape {tuple(xt.shape[1:])} but x_train's {tuple(x.shape[1:])}"
            )
        _same_length(xt, yt, ("x_test", "y_test"), where)
    for name, a in (("y_train", y), ("y_test", yt)):
        if a is not None:
            _check_finite(a, name, where)
    ids, test_ids, task, classes = _labels(y, yt, where, ("y_train", "y_test"))
    return DataFile(x, ids, xt, test_ids, task, layout, classes)


def _read_frame(path: Path) -> Any:
    import pandas as pd  # only the table loader needs pandas

    suffix = path.suffix.lower()
    if suffix not in _TABLE_SUFFIXES:
        raise DataFileError(f"{path}: a table must be .csv or .parquet, got {suffix or 'no suffix'!r}")
    try:
        return pd.read_parquet(path) if suffix in (".parquet", ".pq") else pd.read_csv(path)
    except Exception as e:  # pandas raises many types for a malformed file
        raise DataFileError(f"{path}: cannot read the table: {e}") from None


def _split_frame(frame: Any, target: str, where: Path) -> tuple[np.ndarray, np.ndarray]:
    if target not in frame.columns:
        raise DataFileError(
            f"{where}: no target column {target!r}; columns: {', '.join(map(str, frame.columns))}"
        )
    features = [c for c in frame.columns if c != target]
    if not features:
        raise DataFileError(f"{where}: no feature columns besides the target {target!r}")
    for c in features:
        if frame[c].dtype.kind not in "fiub":
            raise DataFileError(
                f"{where}: column {c!r} is not numeric (dtype {frame[c].dtype}); encode it as numbers or drop it"
            )
        if frame[c].isna().any():
            raise DataFileError(
                f"{where}: column {c!r} holds {int(frame[c].isna().sum())} missing value(s) (NaN)"
            )
    if frame[target].isna().any():
        raise DataFileError(
            f"{where}: target column {target!r} holds {int(frame[target].isna().sum())} missing value(s)"
        )
    y = frame[target].to_numpy()
    if y.dtype.kind == "O":
        y = y.astype(str)
    return frame[features].to_numpy(dtype=np.float32), y


def read_table(
    path: str | os.PathLike[str], target: str, *, test_path: str | os.PathLike[str] | None = None
) -> DataFile:
    """Read and check a CSV / Parquet table whose ``target`` column is the label.

    Args:
        path: the training pool's table.
        target: the label column; every other column is a numeric feature.
        test_path: an optional test table with the same columns; else a fixed 20 % carve.

    Raises:
        DataFileError: see the module docstring.
    """
    where = _existing(path, "table")
    frame = _read_frame(where)
    if len(frame) < 2:
        raise DataFileError(f"{where}: {len(frame)} row(s); a training pool needs at least 2")
    x, y = _split_frame(frame, target, where)
    _check_finite(x, "the features", where)
    xt = yt = None
    names = (f"column {target!r}", f"column {target!r} of the test table")
    if test_path is not None:
        twhere = _existing(test_path, "test table")
        tframe = _read_frame(twhere)
        if list(tframe.columns) != list(frame.columns):
            raise DataFileError(
                f"{twhere}: columns {list(map(str, tframe.columns))} differ from {where}'s {list(map(str, frame.columns))}"
            )
        xt, yt = _split_frame(tframe, target, twhere)
        _check_finite(xt, "the features", twhere)
        if y.dtype.kind == "f" and yt.dtype.kind in "iu":
            yt = yt.astype(np.float64)
    ids, test_ids, task, classes = _labels(y, yt, where, names)
    return DataFile(x, ids, xt, test_ids, task, "tabular", classes)


@functools.lru_cache(maxsize=16)
def _cached(
    kind: str, path: str, target: str | None, test_path: str | None, stamp: tuple[Any, ...]
) -> DataFile:
    del stamp  # part of the cache key only: a rewritten file is read again
    if kind == "arrays":
        return read_arrays(path)
    if target is None:
        raise DataFileError("a table needs a target column")
    return read_table(path, target, test_path=test_path)


def _stamp(path: str | None) -> tuple[Any, ...]:
    if path is None:
        return ()
    try:
        st = os.stat(path)
    except OSError:
        return ("missing",)
    return (st.st_mtime_ns, st.st_size)


def inspect_data_file(
    kind: Literal["arrays", "table"], path: str, *, target: str | None = None, test_path: str | None = None
) -> DataFile:
    """:func:`read_arrays` / :func:`read_table`, memoised while the files are unchanged (spec
    validation asks many times: once per trial configuration it checks)."""
    return _cached(kind, path, target, test_path, (*_stamp(path), *_stamp(test_path)))
