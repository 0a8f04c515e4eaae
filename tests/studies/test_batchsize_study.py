"""The batch-size correlation study: its spec (no Ray) and the smoke preset end to end on a local Ray."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from studies.batchsize_correlation import (
    DEFAULT_SPEC,
    BatchSizeStudyOutcome,
    main,
    run_batchsize_study,
    trials_table,
)
from studies.batchsize_spec import BatchSizeStudySpec, cell_key
from studies.spec import SpecError, load_spec
from tests.services import embedded_ray
from workers.runner import TrialRecord
from workers.trainable import TrialSession

REPO_ROOT = Path(__file__).resolve().parents[2]
ARM_KEYS = {
    "n",
    "n_failed",
    "spearman_rho",
    "slope",
    "slope_ci",
    "interaction",
    "interaction_ci",
    "p_value",
    "p_value_holm",
}


def smoke_spec(*overrides: str) -> BatchSizeStudySpec:
    spec: BatchSizeStudySpec = load_spec(
        DEFAULT_SPEC, list(overrides), preset="smoke", model=BatchSizeStudySpec
    )
    return spec


# ---- the spec -------------------------------------------------------------------------------------


def test_every_shipped_preset_validates_and_plans_the_full_grid() -> None:
    for preset in (None, "smoke", "cnn", "local"):
        spec = load_spec(DEFAULT_SPEC, preset=preset, model=BatchSizeStudySpec)
        plan = spec.confirmatory_plan()
        grid = dict(plan.grid)
        assert grid["model.layer.type"] == tuple(spec.arms)
        assert grid["training.batch_size"] == tuple(spec.batch_sizes)
        assert grid["seed"] == tuple(spec.seeds)
        assert (plan.sampler.type, plan.scheduler.type, plan.num_samples) == ("grid", "fifo", 1)
        assert plan.base_config["model"]["layer"] == {"type": spec.control}
        assert math.prod(len(v) for v in grid.values()) == spec.expected_trials


def test_default_spec_follows_the_protocol() -> None:
    spec = load_spec(DEFAULT_SPEC, model=BatchSizeStudySpec)
    training = spec.confirmatory_plan().base_config["training"]
    assert (training["optimizer"], training["momentum"], training["weight_decay"]) == ("sgd", 0.0, 0.0)
    assert (training["schedule"], training["grad_clip"], training["label_smoothing"]) == (
        "constant",
        None,
        0.0,
    )
    assert training["lr_scaling"] == "constant"
    assert len(spec.seeds) >= 5 and len(spec.batch_sizes) >= 4
    assert spec.arms == (
        "linear",
        "linear_batchnorm",
        "linear_layernorm",
        "prenorm_l2",
        "prenorm_rms",
        "corrected",
    )
    cnn = load_spec(DEFAULT_SPEC, preset="cnn", model=BatchSizeStudySpec)
    assert (cnn.model.type, cnn.control, cnn.arms) == ("cnn", "conv", ("conv", "conv_batchnorm", "patchnorm"))


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("control=prenorm_l2", "control"),
        ("arms=[linear,conv]", "arms.1"),
        ("training.lr_scaling=sqrt", "training.lr_scaling"),
        ("batch_sizes=[1,8]", "batch_sizes"),
        ("batch_sizes=[8,8]", "batch_sizes"),
        ("model.layer={type: corrected}", "model.layer"),
        ("seeds=[0]", "seeds"),
        ("data.type=ptb_pos_sample", "data.type"),
        ("training.budget=updates", "training.max_updates"),
        ("analysis.n_perm=10", "analysis.n_perm"),
        ("lr_tuning.metric=test_accuracy", "lr_tuning"),
    ],
)
def test_invalid_specs_name_the_field(override: str, path: str) -> None:
    with pytest.raises(SpecError) as err:
        smoke_spec(override)
    assert any(issue.path == path for issue in err.value.issues), err.value.format()


def test_tuned_policy_uses_a_held_out_seed_and_per_cell_learning_rates() -> None:
    with pytest.raises(SpecError, match=r"lr_tuning\.seed"):
        smoke_spec("lr_policy=tuned", "lr_tuning.seed=1")
    spec = smoke_spec("lr_policy=tuned")
    tune = spec.tuning_plan("corrected", 32)
    assert tune.base_config["seed"] == spec.lr_tuning.seed not in spec.seeds
    assert tune.base_config["training"]["batch_size"] == 32
    assert tune.base_config["model"]["layer"]["type"] == "corrected"
    assert [(p.name, p.log) for p in tune.space] == [("training.lr", True)]
    assert (tune.sampler.type, tune.num_samples) == ("tpe", spec.lr_tuning.trials)
    with pytest.raises(ValueError, match="tuned_lr"):
        spec.confirmatory_plan()
    table = {cell_key(a, b): 0.01 * b for a in spec.arms for b in spec.batch_sizes}
    plan = spec.confirmatory_plan(tuned_lr=table, arms=["corrected"])
    grid = dict(plan.grid)
    assert grid["seed"] == spec.seeds
    assert grid["training"] == tuple({"batch_size": b, "lr": 0.01 * b} for b in spec.batch_sizes)
    assert plan.base_config["training"]["lr_scaling"] == "constant"
    assert spec.tuning_trials == len(spec.arms) * len(spec.batch_sizes) * spec.lr_tuning.trials


def test_lr_policy_sets_lr_scaling() -> None:
    for policy in ("linear", "sqrt"):
        plan = smoke_spec(f"lr_policy={policy}").confirmatory_plan()
        assert plan.base_config["training"]["lr_scaling"] == policy


def test_trials_table_reads_arm_batch_seed_and_status() -> None:
    def record(arm: str, b: int, seed: int, status: Any, acc: Any) -> TrialRecord:
        config = {"model": {"layer": {"type": arm}}, "training": {"batch_size": b, "lr": 0.1}, "seed": seed}
        return TrialRecord(f"t{arm}{b}{seed}", {}, config, status, {"test_accuracy": acc, "epoch": 3})

    df = trials_table(
        [record("linear", 32, 1, "completed", 0.9), record("linear", 8, 0, "diverged", None)],
        metric="test_accuracy",
    )
    assert list(df[["arm", "batch_size", "seed", "status"]].itertuples(index=False, name=None)) == [
        ("linear", 8, 0, "diverged"),
        ("linear", 32, 1, "completed"),
    ]
    assert math.isnan(df.loc[0, "test_accuracy"]) and df.loc[1, "test_accuracy"] == 0.9


def test_cli_exits_2_on_a_bad_spec_and_dry_run_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "smoke", "--set", "control=prenorm_l2"]) == 2
    err = capsys.readouterr().err
    assert "control" in err and "Traceback" not in err
    assert main(["--preset", "smoke", "--dry-run"]) == 0
    assert "# 18 confirmatory trials, 0 tuning trials" in capsys.readouterr().out


# ---- the smoke preset, end to end on a local Ray -------------------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A loopback Ray cluster for this module, its own short temp dir, stopped by this process."""
    path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with embedded_ray("rt_h7_", {"PYTHONPATH": path}):
        yield


@pytest.fixture(scope="module")
def smoke(
    local_ray: None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[BatchSizeStudySpec, BatchSizeStudyOutcome]:
    storage = tmp_path_factory.mktemp("bs_smoke")
    spec = smoke_spec(f"storage_path={storage}")
    return spec, run_batchsize_study(spec, progress=False, environ={})


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_writes_every_output(smoke: tuple[BatchSizeStudySpec, BatchSizeStudyOutcome]) -> None:
    spec, out = smoke
    study_dir = Path(out.study_dir)
    assert study_dir == Path(spec.storage_path) / spec.name
    for name in ("verdict.json", "report.md", "report.html", "trials.csv", "spec.yaml"):
        assert (study_dir / name).stat().st_size > 0, name
    for png in ("metric_vs_batch_size.png", "forest.png"):
        assert (study_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (study_dir / "report.md").read_text()
    for arm in spec.arms:
        assert f"| {arm}" in md
    assert "wall time:" in md and "CPU hours:" in md
    assert out.wall_time_s > 0 and out.cpu_hours > 0 and out.gpu_hours == 0


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_verdict_has_every_arm(smoke: tuple[BatchSizeStudySpec, BatchSizeStudyOutcome]) -> None:
    spec, out = smoke
    verdict = json.loads((Path(out.study_dir) / "verdict.json").read_text())
    assert verdict == json.loads(json.dumps(out.verdict))
    assert {"hypothesis", "metric", "control", "arms", "verdict"} <= set(verdict)
    assert set(verdict["arms"]) == set(verdict["verdict"]) == set(spec.arms)
    for arm, res in verdict["arms"].items():
        assert set(res) >= ARM_KEYS
        assert res["n"] + res["n_failed"] == len(spec.batch_sizes) * len(spec.seeds)
        assert verdict["verdict"][arm] in {"supported", "refuted", "inconclusive"}
    ctrl = verdict["arms"][spec.control]
    assert ctrl["interaction"] is None and ctrl["p_value"] is None
    assert verdict["metric"] == "test_accuracy" and verdict["n_perm"] == 9999


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_runs_the_same_seeds_and_data_for_every_arm(
    smoke: tuple[BatchSizeStudySpec, BatchSizeStudyOutcome],
) -> None:
    spec, out = smoke
    table = out.table
    assert len(table) == spec.expected_trials
    cells = {arm: set(zip(g["batch_size"], g["seed"])) for arm, g in table.groupby("arm")}
    expected = {(b, s) for b in spec.batch_sizes for s in spec.seeds}
    assert all(c == expected for c in cells.values()), cells
    assert (table["status"] == "completed").all()
    # Common random numbers: for one (B, seed), trial configs differ only in the layer type.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=out.tracking_uri)
    params = {rid: client.get_run(rid).data.params for rid in table["mlflow_run_id"]}
    for (b, seed), g in table.groupby(["batch_size", "seed"]):
        views = [
            {k: v for k, v in params[rid].items() if not k.startswith("model.layer")}
            for rid in g["mlflow_run_id"]
        ]
        assert all(v == views[0] for v in views), (b, seed)
        assert {params[rid].get("seed") for rid in g["mlflow_run_id"]} == {str(seed)}


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_logs_outputs_and_verdict_tags_on_the_parent_run(
    smoke: tuple[BatchSizeStudySpec, BatchSizeStudyOutcome],
) -> None:
    from mlflow import MlflowClient

    spec, out = smoke
    assert out.parent_run_id is not None
    client = MlflowClient(tracking_uri=out.tracking_uri)
    parent = client.get_run(out.parent_run_id)
    tags = parent.data.tags
    for arm, verdict in out.verdict["verdict"].items():
        assert tags[f"verdict/{arm}"] == verdict
    assert tags["autonorm.phase"] == "confirmatory"
    artifacts = {a.path for a in client.list_artifacts(out.parent_run_id)}
    assert {"verdict.json", "report.md", "report.html", "metric_vs_batch_size.png", "forest.png"} <= artifacts
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{out.parent_run_id}'"
    )
    assert len(children) == spec.expected_trials
    assert set(out.table["mlflow_run_id"]) == {c.info.run_id for c in children}
    assert parent.data.metrics["n/linear"] == out.verdict["arms"]["linear"]["n"]


# ---- the tuned LR policy, with a cheap deterministic trial function -------------------------------

#: Planted: accuracy falls by 0.05 per doubling of B for `corrected` only; validation accuracy peaks
#: at lr = 0.1 for every cell, so tuning must find ~0.1.
_PLANTED_SLOPE = {"linear": 0.0, "corrected": -0.05}


def planted_trial(config: dict[str, Any], session: TrialSession) -> None:
    arm = config["model"]["layer"]["type"]
    b = int(config["training"]["batch_size"])
    lr = float(config["training"]["lr"])
    seed = int(config["seed"])
    val = 0.95 - 0.2 * (math.log10(lr) + 1.0) ** 2
    test = 0.9 + _PLANTED_SLOPE[arm] * math.log2(b) + 0.003 * ((seed * 7 + b) % 5)
    session.report({"epoch": 1, "val_accuracy": val, "test_accuracy": test, "lr": lr}, status="completed")


@pytest.mark.ray
@pytest.mark.slow
def test_tuned_policy_end_to_end(local_ray: None, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    spec = smoke_spec(
        f"storage_path={tmp_path}",
        "lr_policy=tuned",
        "arms=[linear,corrected]",
        "batch_sizes=[8,32]",
        "seeds=[0,1,2]",
        "lr_tuning.trials=6",
        "lr_tuning.n_startup_trials=6",
        "lr_tuning.low=0.01",
        "lr_tuning.high=1.0",
        "analysis.n_boot=200",
    )
    out = run_batchsize_study(spec, trainable=planted_trial, progress=False, environ={})
    assert out.tuned_lr is not None and set(out.tuned_lr) == {
        cell_key(a, b) for a in spec.arms for b in spec.batch_sizes
    }
    # Six random draws in [0.01, 1] (log): the best is the one closest to 0.1, well inside x3.
    assert all(0.1 / 3 < lr < 0.1 * 3 for lr in out.tuned_lr.values()), out.tuned_lr
    # The confirmatory trials ran with their own cell's tuned lr, on the confirmatory seeds only.
    for row in out.table.itertuples():
        assert row.lr == pytest.approx(out.tuned_lr[cell_key(row.arm, row.batch_size)])
    assert set(out.table["seed"]) == set(spec.seeds)
    assert out.verdict["verdict"]["corrected"] == "supported"
    assert out.verdict["arms"]["corrected"]["slope"] == pytest.approx(-0.05, abs=0.01)
    record = json.loads((Path(out.study_dir) / "lr_tuning.json").read_text())
    assert {k: v["lr"] for k, v in record.items()} == pytest.approx(out.tuned_lr)
    # One study-level run; the 4 tuning and 2 confirmatory parent runs are nested under it.
    client = MlflowClient(tracking_uri=out.tracking_uri)
    assert len(out.phase_runs) == 4 + 2
    for run_id in out.phase_runs.values():
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == out.parent_run_id
    assert out.parent_run_id is not None
    tags = client.get_run(out.parent_run_id).data.tags
    assert tags["verdict/corrected"] == "supported"
    assert "lr_tuning.json" in {a.path for a in client.list_artifacts(out.parent_run_id)}
