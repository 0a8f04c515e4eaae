"""Readable trial names (Tune's trial name and the MLflow run name), trial tags, source tags and the
Optuna study saved beside the experiment: unit checks, then two tiny studies on a local Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.tracking import (
    SOURCE_GIT_COMMIT,
    SOURCE_NAME,
    SOURCE_TYPE,
    TrialDirnamer,
    TrialNamer,
    mlflow_links,
    render_run_name,
    source_tags,
    trial_index,
    trial_tag_templates,
)

BATCH_TEMPLATE = "{model.layer.type}-B{training.batch_size}-s{seed}"


class _Trial:
    def __init__(self, trial_id: str, config: dict[str, Any], experiment_tag: str = "") -> None:
        self.trial_id, self.config, self.experiment_tag = trial_id, config, experiment_tag
        self.last_result: dict[str, Any] = {}


def test_templates_read_dotted_paths_with_formats() -> None:
    config = {
        "model": {"layer": {"type": "corrected"}},
        "training": {"batch_size": 32, "lr": 0.003},
        "seed": 0,
    }
    assert render_run_name(BATCH_TEMPLATE, config, 1) == "corrected-B32-s0"
    assert render_run_name(BATCH_TEMPLATE + "-lr{training.lr:g}", config, 1) == "corrected-B32-s0-lr0.003"
    assert render_run_name("search-{index:03d}", config, 17) == "search-017"
    assert render_run_name("autonorm_s-s{seed}", {"seed": 103}, 4) == "autonorm_s-s103"
    assert render_run_name("{model.norm.tau}-{index:03d}", config, "a1b2") == "?-a1b2"  # missing, non-int


def test_trial_index_from_tune_ids() -> None:
    assert trial_index(_Trial("5f3e1_00000", {})) == 1  # grid generator: counter from 0 in the id
    assert trial_index(_Trial("5f3e1_00016", {})) == 17
    assert trial_index(_Trial("a1b2c3d4", {}, experiment_tag="17_x=0.3")) == 17  # searcher: tag from 1
    assert trial_index(_Trial("a1b2c3d4", {})) is None


def test_namer_applies_the_trial_params_over_the_base_config() -> None:
    base = {"model": {"layer": {"type": "linear"}}, "training": {"batch_size": 64}, "seed": 0}
    namer = TrialNamer(BATCH_TEMPLATE, plan_name="confirm-short", base_config=base)
    trial = _Trial("5f3e1_00002", {"model.layer.type": "corrected", "training.batch_size": 32, "seed": 1})
    assert namer(trial) == "corrected-B32-s1"
    default = TrialNamer("", plan_name="confirm-short", base_config=base)
    assert default(trial) == "confirm-short-003"
    assert default(_Trial("a1b2c3d4", {})) == "confirm-short-a1b2c3d4"


def test_trial_tags_come_from_the_plan_tags() -> None:
    parent, trial = trial_tag_templates(
        {
            "autonorm.phase": "confirmatory",
            "autonorm.spec_hash": "abc",
            "autonorm.study_key": "k",
            "autonorm.study_name": "s",
            "autonorm.kind": "batchsize",
            "autonorm.budget": "epochs",
            "autonorm.trial_tag.arm": "{model.layer.type}",
        }
    )
    study_wide = {"autonorm.spec_hash": "abc", "autonorm.study_key": "k", "autonorm.study_name": "s"}
    assert parent == {
        "autonorm.phase": "confirmatory",
        "autonorm.budget": "epochs",
        "autonorm.kind": "batchsize",
        **study_wide,
    }
    # The study-wide tags go on every trial run as they are; the template only on the trial runs.
    assert trial == {
        "autonorm.phase": "confirmatory",
        "autonorm.arm": "{model.layer.type}",
        "autonorm.kind": "batchsize",
        **study_wide,
    }


def test_source_tags(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = source_tags({"AUTONORM_GIT_COMMIT": "c0ffee"}, ["/x/studies/cli.py", "run"])
    assert tags == {SOURCE_GIT_COMMIT: "c0ffee", SOURCE_NAME: "autonorm-study", SOURCE_TYPE: "JOB"}
    root = Path(__file__).resolve().parents[2]
    script = str(root / "studies" / "autonorm_search.py")
    assert (
        source_tags({"AUTONORM_GIT_COMMIT": "c0ffee"}, [script])[SOURCE_NAME] == "studies/autonorm_search.py"
    )
    assert source_tags({}, ["/usr/bin/autonorm-study"])[SOURCE_NAME] == "autonorm-study"
    # Without the variable: this checkout's HEAD (a 40-hex commit) when git knows one.
    commit = source_tags({}, ["x"]).get(SOURCE_GIT_COMMIT)
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)


def test_mlflow_links_go_to_the_runs_table() -> None:
    # The training view ("Model training"): MLflow 3.17's UI otherwise shows the GenAI view.
    assert mlflow_links("http://mlflow:5000/", "3", "abc") == [
        "http://mlflow:5000/#/experiments/3/runs?workflowType=machine_learning",
        "http://mlflow:5000/#/experiments/3/runs/abc?workflowType=machine_learning",
    ]
    assert mlflow_links("sqlite:////tmp/m.db", "1") == [
        "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"
    ]


class _Namer:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, trial: Any) -> str:
        return self.name


def test_trial_folders_are_named_after_the_readable_name() -> None:
    trial = _Trial("5f3e1_00002", {})
    assert TrialDirnamer(_Namer("corrected-B32-lr0.1-s0"))(trial) == "corrected-B32-lr0.1-s0"  # type: ignore[arg-type]
    assert TrialDirnamer(_Namer("a b/c"))(trial) == "a_b_c"  # type: ignore[arg-type]
    # A name with a field the config lacked (``?``), or none at all, keeps the trial id: never shared.
    assert TrialDirnamer(_Namer("?-B32"))(trial) == "B32_5f3e1_00002"  # type: ignore[arg-type]
    assert TrialDirnamer(_Namer(""))(trial) == "trial_5f3e1_00002"  # type: ignore[arg-type]
    # A name from the trial's index is not unique once a study is restored: it keeps the id too.
    indexed = TrialNamer("", plan_name="search", base_config={})
    assert TrialDirnamer(indexed)(trial) == f"{indexed(trial)}_5f3e1_00002"
    assert TrialDirnamer(indexed)(trial).startswith("search-003")


def _group(trial_id: str, stacks: list[list[dict[str, Any]]]) -> _Trial:
    return _Trial(trial_id, {"__members__": stacks})


def test_a_stacked_group_is_named_for_the_group_and_its_folder_lists_its_members(tmp_path: Path) -> None:
    import json
    import pickle
    from types import SimpleNamespace

    import pyarrow.fs

    from workers.members import views
    from workers.tracking import GROUP_MEMBERS_FILE, group_members, group_name
    from workers.tracking.callback import write_group_members

    base = {"model": {"layer": {"type": "linear"}}, "training": {"batch_size": 8}, "seed": 0}
    namer = TrialNamer(BATCH_TEMPLATE, plan_name="confirm-epochs", base_config=base)
    # Two cells' stacks in one group (Tune's grid trial 3 of the phase): no member's name fits it.
    stacks: list[list[dict[str, Any]]] = [
        [{"seed": 0}, {"seed": 1}],
        [{"model.layer.type": "corrected", "training.batch_size": 32, "seed": 0}],
    ]
    group = _group("5f3e1_00002", stacks)
    assert namer(group) == group_name("confirm-epochs", 3) == "confirm-epochs-group03"
    assert TrialDirnamer(namer)(group) == "confirm-epochs-group03"  # no trial id: unique as it is
    assert group_name("p", 117) == "p-group117" and group_name("", 1) == "group01"
    # ...its members' runs keep their own names; a group of one member is named as that member.
    assert [namer(v) for v in views(group)] == ["linear-B8-s0", "linear-B8-s1", "corrected-B32-s0"]
    assert namer(_group("5f3e1_00000", [[{"seed": 4}]])) == "linear-B8-s4"
    # A namer pickled by a study stored before it kept its plan's name: the experiment folder's name.
    old = pickle.loads(pickle.dumps(namer))
    del old.__dict__["plan_name"]
    group.storage = SimpleNamespace(experiment_dir_name="confirm-epochs")  # type: ignore[attr-defined]
    assert old(group) == "confirm-epochs-group03"

    record = group_members(group, namer)
    assert record["group"] == "confirm-epochs-group03" and record["trial_id"] == "5f3e1_00002"
    assert [(m["name"], m["trial_id"], m["stack"]) for m in record["members"]] == [
        ("linear-B8-s0", "5f3e1_00002-m0", 0),
        ("linear-B8-s1", "5f3e1_00002-m1", 0),
        ("corrected-B32-s0", "5f3e1_00002-m2", 1),
    ]
    assert group_members(_Trial("5f3e1_00004", {"seed": 0}), namer) == {}  # no group

    # Written by the tracking callback into the group's folder on the study's storage.
    folder = tmp_path / "confirm-epochs" / TrialDirnamer(namer)(group)
    group.storage = SimpleNamespace(  # type: ignore[attr-defined]
        storage_filesystem=pyarrow.fs.LocalFileSystem(), trial_fs_path=str(folder)
    )
    write_group_members(group, namer)
    assert json.loads((folder / GROUP_MEMBERS_FILE).read_text()) == json.loads(json.dumps(record))
    plain = _Trial("5f3e1_00005", {"seed": 0})
    plain.storage = SimpleNamespace(  # type: ignore[attr-defined]
        storage_filesystem=pyarrow.fs.LocalFileSystem(), trial_fs_path=str(tmp_path / "plain")
    )
    write_group_members(plain, namer)
    assert not (tmp_path / "plain").exists()
    broken = _group("5f3e1_00006", stacks)  # no storage: logged, never raised
    write_group_members(broken, namer)


# ---- real studies ------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_tiny_studies_name_tag_and_save_their_optuna_study(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna
    from mlflow import MlflowClient

    from tests.workers.trials import quadratic_trial
    from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig
    from workers.runner import run_study

    monkeypatch.setenv("AUTONORM_GIT_COMMIT", "feedc0de")
    storage = StorageConfig(path=str(tmp_path / "runs"))
    search = StudyPlan(
        name="srch",
        base_config={"training": {"epochs": 2}, "seed": 0},
        space=(ParamDef("x", "float", low=0.0, high=1.0),),
        sampler=SamplerConfig(type="random", seed=3),
        num_samples=3,
        max_concurrent=2,
        storage=storage,
        tracking=TrackingConfig(experiment="names"),
        tags=(("autonorm.phase", "search"),),
        run_name="search-{index:03d}",
    )
    result = run_study(search, trainable=quadratic_trial, progress=False)
    grid = StudyPlan(
        name="bs",
        base_config={
            "model": {"layer": {"type": "linear"}},
            "training": {"epochs": 1, "batch_size": 32},
            "seed": 0,
        },
        grid=(("model.layer.type", ("linear", "corrected")), ("seed", (0, 1))),
        sampler=SamplerConfig(type="grid"),
        num_samples=1,
        max_concurrent=2,
        storage=storage,
        tracking=TrackingConfig(experiment="names"),
        tags=(("autonorm.phase", "confirmatory"), ("autonorm.trial_tag.arm", "{model.layer.type}")),
        run_name=BATCH_TEMPLATE,
    )
    grid_result = run_study(grid, trainable=quadratic_trial, progress=False)
    out = capsys.readouterr().out

    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("names")
    assert experiment is not None
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert len(runs) == 2 + 3 + 4
    for run in runs.values():  # study and trial runs alike
        assert run.data.tags[SOURCE_GIT_COMMIT] == "feedc0de"
        assert run.data.tags[SOURCE_TYPE] == "JOB" and run.data.tags[SOURCE_NAME]
        assert not run.info.run_name.startswith("tune_entry")
    search_names = sorted(runs[t.mlflow_run_id].info.run_name for t in result.trials if t.mlflow_run_id)
    assert search_names == ["search-001", "search-002", "search-003"]
    grid_runs = [runs[t.mlflow_run_id] for t in grid_result.trials if t.mlflow_run_id]
    assert sorted(r.info.run_name for r in grid_runs) == [
        "corrected-B32-s0",
        "corrected-B32-s1",
        "linear-B32-s0",
        "linear-B32-s1",
    ]
    for run in grid_runs:
        assert run.data.tags["autonorm.phase"] == "confirmatory"
        assert run.info.run_name.startswith(run.data.tags["autonorm.arm"] + "-B32")
        assert "autonorm.trial_tag.arm" not in runs[grid_result.parent_run_id].data.tags  # type: ignore[index]

    # Tune's own trial names are the same readable names.
    from ray.tune import ExperimentAnalysis

    analysis = ExperimentAnalysis(str(tmp_path / "runs" / "srch"))
    assert sorted(str(t) for t in analysis.trials) == ["search-001", "search-002", "search-003"]

    # The Optuna study: every trial, with the state and value the searcher told Optuna.
    db = tmp_path / "runs" / "srch" / "optuna.db"
    assert f"optuna-dashboard sqlite:///{db}" in out
    loaded = optuna.load_study(storage=f"sqlite:///{db}", study_name="srch")
    frozen = loaded.get_trials(deepcopy=False)
    assert len(frozen) == 3 and all(t.state.name == "COMPLETE" for t in frozen)
    expected = sorted(t.metrics["val_accuracy"] for t in result.trials)
    assert sorted(float(t.value or 0.0) for t in frozen) == pytest.approx(expected)
    assert sorted(t.params["x"] for t in frozen) == pytest.approx(
        sorted(t.params["x"] for t in result.trials)
    )
    artifacts = [a.path for a in client.list_artifacts(result.parent_run_id)]  # type: ignore[arg-type]
    assert "optuna.db" in artifacts
    assert not (tmp_path / "runs" / "bs" / "optuna.db").exists()  # grid plans have no Optuna study
