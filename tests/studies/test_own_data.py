"""A batch-size study on one's own data: spec validation of the generic loaders (exit 2 naming the
arrays, the regression refusal, model fit) without Ray, and one tiny study on a CSV that ends with a
verdict (the ``.npz`` one is the quick start, run by tests/test_docs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies import cli
from studies.kinds import load_study
from studies.running import run_study_spec
from studies.schema import SpecError

ROOT = Path(__file__).resolve().parents[2]
BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
# The tiniest batch-size study that still runs every phase: 2 arms x 2 batch sizes x 2 seeds, a 3-point
# learning-rate grid, no refinement (20 trials).
TINY = [
    "arms=[linear,corrected]",
    "batch_sizes=[16,64]",
    "lr_tuning={low: 0.01, high: 3.0, points: 3, reference_batch_size: 16, refine: 0}",
    "max_concurrent=1",  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
]


def features(n: int = 2000, d: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 3-class problem on feature rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x, (x @ rng.normal(size=(d, 3))).argmax(axis=1)


def _validate(*overrides: str) -> int:
    return cli.main(
        ["validate", str(BATCHSIZE), "--preset", "smoke", *[a for o in overrides for a in ("--set", o)]]
    )


def test_a_bad_npz_is_refused_with_exit_2_naming_both_arrays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, y = features(n=100)
    np.savez(tmp_path / "short.npz", x_train=x, y_train=y[:90])
    assert _validate(f"data={{type: arrays, path: {tmp_path / 'short.npz'}}}") == 2
    err = capsys.readouterr().err
    assert "data: " in err and "x_train has 100 examples but y_train has 90" in err and "Traceback" not in err
    # Float targets are a regression, which the batch-size study (an accuracy analysis) refuses.
    np.savez(tmp_path / "reg.npz", x_train=x, y_train=x[:, 0])
    assert _validate(f"data={{type: arrays, path: {tmp_path / 'reg.npz'}}}") == 2
    assert "analyses classification accuracy" in capsys.readouterr().err
    # Feature rows do not fit the CNN variant; images (N, C, H, W) do.
    np.savez(tmp_path / "ok.npz", x_train=x, y_train=y)
    assert (
        _validate(
            f"data={{type: arrays, path: {tmp_path / 'ok.npz'}}}",
            "model={type: cnn, preset: tiny}",
            "arms=[conv,patchnorm]",
            "control=conv",
        )
        == 2
    )
    assert "model.type" in capsys.readouterr().err
    images = np.random.default_rng(0).normal(size=(100, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "img.npz", x_train=images, y_train=y)
    assert (
        _validate(
            f"data={{type: arrays, path: {tmp_path / 'img.npz'}}}",
            "model={type: cnn, preset: tiny}",
            "arms=[conv,patchnorm]",
            "control=conv",
        )
        == 0
    )


def test_a_table_spec_resolves_its_paths_and_counts_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y = features(n=100)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(
        label=np.array(["a", "b", "c"])[y]
    )
    frame.to_csv(tmp_path / "data.csv", index=False)
    monkeypatch.chdir(tmp_path)
    spec = load_study(BATCHSIZE, ["data={type: table, path: data.csv, target: label}", *TINY], preset="smoke")
    assert spec.data.path == str(tmp_path / "data.csv")  # absolute: trials run elsewhere
    from studies.schema import data_classes, data_task

    assert (data_task(spec.data), data_classes(spec.data)) == ("classification", 3)
    with pytest.raises(SpecError) as err:
        load_study(BATCHSIZE, ["data={type: table, path: data.csv, target: y}"], preset="smoke")
    assert err.value.issues[0].path == "data" and "no target column 'y'" in err.value.issues[0].message


@pytest.mark.ray
@pytest.mark.slow
def test_batchsize_smoke_on_a_csv_ends_with_a_verdict(local_ray: None, tmp_path: Path) -> None:
    x, y = features()
    pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(label=y).to_csv(
        tmp_path / "data.csv", index=False
    )
    spec: Any = load_study(
        BATCHSIZE,
        [
            "name=own_csv",
            f"storage_path={tmp_path / 'runs'}",
            f"data={{type: table, path: {tmp_path / 'data.csv'}, target: label}}",
            *TINY,
        ],
        preset="smoke",
    )
    out = run_study_spec(spec, progress=False)
    verdict = out.verdict
    assert verdict is not None and verdict["study_verdict"] in ("supported", "refuted", "inconclusive")
    assert set(verdict["verdict"]) == {"corrected"} and set(verdict["controls"]) == {"linear"}
    # Chance is 1/3 (three classes counted from the file), and the tiny design is exploratory by rule.
    assert verdict["chance_metric"] == pytest.approx(1 / 3) and verdict["exploratory"] is True
    trials = pd.read_csv(Path(out.study_dir) / "trials.csv")
    assert len(trials) == 8 and set(trials["status"]) == {"completed"}
    assert trials["test_accuracy"].mean() > 0.5  # the features are informative: the trials learned


@pytest.mark.parametrize("kind", ["search", "batchsize"])
def test_a_minimal_spec_of_every_kind_validates(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "mini.yaml"
    path.write_text(f"kind: {kind}\nname: mini\n", encoding="utf-8")
    spec = load_study(path)
    assert (spec.kind, spec.name, spec.data.type) == (kind, "mini", "fashion_mnist")
    assert cli.main(["validate", "--spec", str(path)]) == 0


def test_images_of_ones_own_are_vision_for_the_claims(tmp_path: Path) -> None:
    from studies.kinds.search.spec import data_kind_of
    from studies.schema import ArraysDataSpec

    _, y = features(n=40)
    images = np.random.default_rng(0).normal(size=(40, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "img.npz", x_train=images, y_train=y)
    np.savez(tmp_path / "rows.npz", x_train=images.reshape(40, -1), y_train=y)
    assert data_kind_of(ArraysDataSpec(path=str(tmp_path / "img.npz"))) == "vision"
    assert data_kind_of(ArraysDataSpec(path=str(tmp_path / "rows.npz"))) == "tabular"
    assert data_kind_of("fashion_mnist") == "vision"
