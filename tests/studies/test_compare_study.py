"""The compare kind end to end through ``autonorm-study validate | plan | run | status | report`` on its
smoke preset, shrunk by ``--set`` (digits, 1 epoch, 3-point grid, 2 seeds; real trainable, the shared
local Ray, sqlite MLflow), plus the plan of the shipped presets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from studies import cli
from studies.kinds import KINDS, load_study
from studies.kinds.compare.analysis import GATES

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "studies" / "specs" / "affine_divergence_table.yaml"
#: A flat step time: plan's trial counts, not its clock, are under test (no calibration run).
CAL = {"step_s": {"*": 0.01}, "eval_s": 0.1, "setup_s": 0.5}
#: The smoke, smaller: 2 arms x (3 lrs x 2 tuning seeds + 2 seeds) = 16 trials of 1 epoch.
SMALL = (
    "training.epochs=1",
    "max_concurrent=1",
    "arms=[corrected, linear_batchnorm]",
    "seeds=[0, 1]",
    "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], max_extensions: 0, refine: 0}",
)


def _sets(*overrides: str) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def test_every_preset_validates_and_plans_its_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CAL))
    assert cli.main(["validate", str(SPEC)]) == 0  # the file and every preset
    for preset, arms, contrasts in (("local", 5, 4), ("local_cnn", 4, 4), ("smoke", 4, 2)):
        capsys.readouterr()
        args = ["plan", str(SPEC), "--preset", preset, "--json", "--calibration", str(cal), "--no-calibrate"]
        assert cli.main([*args, "--cpus", "2"]) == 0
        plan = json.loads(capsys.readouterr().out)
        spec = load_study(SPEC, preset=preset)
        assert len(spec.arm_names) == arms and len(spec.contrast_specs) == contrasts
        assert [p["name"] for p in plan["phases"]] == [p.name for p in KINDS["compare"].phases(spec)]
        # the training-adequacy check: every arm at its tuned η for twice the budget on each tuning seed
        # (the 1x runs are the tuning's own where the tuning ran the study's budget, else run too)
        once = spec.lr_tuning.epochs in (None, spec.training.epochs)
        assert spec.adequacy_trials == arms * len(spec.lr_tuning.seeds) * (1 if once else 2)
        assert spec.total_trials == spec.tuning_trials + spec.confirmatory_trials + spec.adequacy_trials
        # every arm's winner refined (the local presets: the default 2 rates; the smoke: refine 0)
        assert spec.refine_trials == (0 if preset == "smoke" else 2 * arms * len(spec.lr_tuning.seeds))
        assert plan["trials"] == spec.total_trials + spec.refine_trials
        assert plan["trials_max"] == plan["trials"] + spec.extension_trials_max
        assert plan["wall_s"] > 0 and plan["cpu_hours"] > 0


@pytest.fixture(scope="module")
def smoke(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("compare_smoke")
    cal = root / "cal.json"
    cal.write_text(json.dumps(CAL))
    overrides = [*SMALL, f"storage_path={root}", f"tracking.uri=sqlite:///{root}/mlflow.db"]
    spec = load_study(SPEC, overrides, preset="smoke")
    return {"root": root, "cal": cal, "sets": _sets(*overrides), "spec": spec}


@pytest.mark.ray
@pytest.mark.slow
def test_cli_validate_plan_run_status_report(
    smoke: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    spec, sets = smoke["spec"], smoke["sets"]
    target = ["--preset", "smoke", *sets]
    assert cli.main(["validate", str(SPEC), *target]) == 0
    capsys.readouterr()
    cal = ["--calibration", str(smoke["cal"]), "--no-calibrate"]
    assert cli.main(["plan", str(SPEC), *target, "--json", *cal]) == 0
    plan = json.loads(capsys.readouterr().out)
    # tune + the adequacy check (2 arms x 2 tuning seeds at twice the budget) + confirm; no extension
    # planned (max_extensions 0)
    assert plan["trials"] == 2 * 3 * 2 + 2 * 2 + 2 * 2

    assert cli.main(["run", str(SPEC), *target]) == 0
    study_dir = Path(spec.storage_path) / spec.name
    verdict = json.loads((study_dir / "verdict.json").read_text())
    assert verdict["kind"] == "compare"
    assert set(verdict["contrasts"]) == {"corrected_vs_batchnorm"}  # the paper's contrast among the arms
    for c in verdict["contrasts"].values():
        assert c["verdict"] in ("better", "worse", "equivalent", "inconclusive")
        assert isinstance(c["reasons"], list)
        assert {"arm", "reference", "estimate", "ci", "p_value", "p_value_holm"} <= set(c)
    # 2 seeds: the smallest sign-flip p is 1/2; underpowered by rule whatever the data (the other
    # gates depend on what one epoch reached).
    reasons = verdict["contrasts"]["corrected_vs_batchnorm"]["reasons"]
    # (lr-tuning-noisy is informational: it names the arm whose tuning pick was within one SE)
    assert "underpowered" in reasons
    assert {r.split(":")[0].split(" (")[0] for r in reasons} <= {*GATES, "lr-tuning-noisy"}
    # The adequacy check measured both arms; a contrast resting on one that failed it says so.
    assert set(verdict["adequacy"]) == set(spec.arm_names)
    flagged = [a for a, e in verdict["adequacy"].items() if not e["passed"]]
    assert any(r.startswith("under-trained: ") for r in reasons) == bool(flagged)
    assert verdict["contrasts"]["corrected_vs_batchnorm"]["verdict"] == "inconclusive"
    assert verdict["study_verdict"] == "inconclusive" and verdict["exploratory"] is True
    assert set(verdict["hypotheses"]) == set(verdict["contrasts"])
    assert {a: r["n"] for a, r in verdict["arms"].items()} == {"corrected": 2, "linear_batchnorm": 2}
    for name in ("report.md", "report.html", "trials.csv", "lr_tuning.json", "study_spec.yaml"):
        assert (study_dir / name).stat().st_size > 0, name
    assert (study_dir / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The two plots a researcher expects, in the study directory and linked from its report.
    for plot in ("lr_tuning.png", "learning_curves.png"):
        assert (study_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot
        assert f"]({plot})" in (study_dir / "report.md").read_text(), plot
    # Every arm trained on the same seeds with its own tuned rate.
    tuned = json.loads((study_dir / "lr_tuning.json").read_text())
    assert set(tuned) == set(spec.arm_names)
    import pandas as pd

    table = pd.read_csv(study_dir / "trials.csv")
    assert {a: sorted(g["seed"]) for a, g in table.groupby("arm")} == {a: [0, 1] for a in spec.arm_names}
    for arm, g in table.groupby("arm"):
        assert set(g["lr"]) == {tuned[arm]["lr"]}

    capsys.readouterr()
    assert cli.main(["status", str(study_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["kind"] == "compare" and status["study_verdict"] == verdict["study_verdict"]
    assert status["trials"] == status["expected_trials"] == plan["trials"]
    assert set(status["phases"]) == {"tune", "tune-adequacy", "confirm"}

    assert cli.main(["report", str(study_dir)]) == 0
    again = json.loads((study_dir / "report" / "verdict.json").read_text())
    assert again["study_verdict"] == verdict["study_verdict"]
    assert again["adequacy"] == verdict["adequacy"]  # the check read back from its phase
    for key in ("verdict", "reasons", "estimate", "ci", "p_value", "p_value_holm"):
        assert {n: c[key] for n, c in again["contrasts"].items()} == {
            n: c[key] for n, c in verdict["contrasts"].items()
        }
    md = (study_dir / "report" / "report.md").read_text()
    assert md.startswith("**Study verdict: inconclusive**") and "## Tuned learning rates" in md

    client = MlflowClient(tracking_uri=f"sqlite:///{smoke['root']}/mlflow.db")
    exp = client.get_experiment_by_name(spec.name)
    assert exp is not None
    trials = client.search_runs(
        [exp.experiment_id], filter_string="tags.`autonorm.role` = 'trial'", max_results=1000
    )
    assert len(trials) == plan["trials"]
    assert {r.info.status for r in trials} == {"FINISHED"}
    assert {r.data.tags["autonorm.phase"] for r in trials} == {"tune", "tune-adequacy", "confirm"}
    # ... and the plots are artifacts of the study run
    study_runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`autonorm.role` = 'study'", max_results=10
    )
    assert len(study_runs) == 1
    logged = {a.path.rsplit("/", 1)[-1] for a in _all_artifacts(client, study_runs[0].info.run_id)}
    assert {"lr_tuning.png", "learning_curves.png"} <= logged


def _all_artifacts(client: Any, run_id: str, path: str | None = None) -> list[Any]:
    out = []
    for a in client.list_artifacts(run_id, path):
        out += _all_artifacts(client, run_id, a.path) if a.is_dir else [a]
    return out
