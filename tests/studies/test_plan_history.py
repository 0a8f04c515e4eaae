"""``plan``'s wall time counts what the ``run`` command pays before its first trial, and
``plan --history`` reads past estimates against the real runs from a tracking store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from studies.cli import main
from studies.kinds import kind_for, load_study
from studies.plan_history import plan_history
from studies.planning import plan_study

ROOT = Path(__file__).resolve().parents[2]
BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"


def _cal(**extra: float) -> dict[str, Any]:
    return {"step_s": {"*": 0.001}, "eval_s": 0.01, "setup_s": 0.01, **extra}


def test_the_estimates_own_measurement_is_part_of_the_run() -> None:
    spec = load_study(BATCHSIZE, preset="smoke")
    base = plan_study(spec, kind_for(spec), calibration=_cal(), calibrate=False, cpus=2)
    timed = plan_study(spec, kind_for(spec), calibration=_cal(calibration_s=7.5), calibrate=False, cpus=2)
    assert base["calibration_s"] == 0.0 and timed["calibration_s"] == 7.5
    assert timed["wall_s"] - base["wall_s"] == pytest.approx(7.5)
    assert timed["wall_s_max"] - base["wall_s_max"] == pytest.approx(7.5)
    assert timed["calibration"]["calibration_s"] == 7.5  # saved with it, so a saved plan replans the same


def test_a_phase_without_work_costs_its_fixed_costs_once() -> None:
    # With no work at all, a phase costs its start, one worker start per slot, and per trial only the
    # turnaround and the reports: the smoke's 42 trials on 2 slots, 3 epochs each.
    # one process per trial; no adequacy check (its 2x-budget trials report 6 epochs, not 3)
    spec = load_study(BATCHSIZE, ["execution.stack=off", "analysis.adequacy.check=false"], preset="smoke")
    zero = {"step_s": {"*": 0.0}, "eval_s": 0.0, "setup_s": 0.0}
    plan = plan_study(spec, kind_for(spec), calibration=zero, calibrate=False, cpus=2)
    c = plan["calibration"]
    per_trial = c["trial_start_s"] + 3 * c["report_s"]
    for phase in plan["phases"]:
        slots = phase["slots"]
        expected = c["phase_start_s"] + c["worker_start_s"] + -(-phase["trials"] // slots) * per_trial
        assert phase["wall_s"] == pytest.approx(expected)
    assert plan["wall_s"] == pytest.approx(
        c["study_start_s"] + sum(p["wall_s"] for p in plan["phases"] if not p["optional"])
    )


def _study_run(client: Any, exp: str, name: str, params: dict[str, str], metrics: dict[str, float]) -> str:
    run = client.create_run(exp, tags={"autonorm.role": "study"}, run_name=name)
    for k, v in params.items():
        client.log_param(run.info.run_id, k, v)
    for k, v in metrics.items():
        client.log_metric(run.info.run_id, k, v)
    client.set_terminated(run.info.run_id, "FINISHED")
    return str(run.info.run_id)


def test_history_reads_planned_against_actual(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("history")
    _study_run(
        client, exp, "a", {"planned_wall_s": "50"}, {"actual_command_wall_s": 40.0, "actual_wall_s": 30.0}
    )
    _study_run(client, exp, "b", {"planned_wall_s": "100"}, {"actual_wall_s": 200.0})
    _study_run(client, exp, "no-estimate", {}, {"actual_wall_s": 10.0})
    trial = client.create_run(exp, tags={"autonorm.role": "trial"}, run_name="t")
    client.log_param(trial.info.run_id, "planned_wall_s", "1")
    history = plan_history(uri)
    rows = {r["study"]: r for r in history["studies"]}
    assert set(rows) == {"a", "b"}
    assert (rows["a"]["ratio"], rows["a"]["measured"]) == (pytest.approx(0.8), "command")
    assert (rows["b"]["ratio"], rows["b"]["measured"]) == (pytest.approx(2.0), "session")
    assert history["summary"]["within_band"] == 1
    assert history["summary"]["median_ratio"] == pytest.approx(1.4)
    assert main(["plan", "--history", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "0.80" in out and "2.00" in out and "2 studies" in out and "1 within 0.67-1.5x" in out
    assert main(["plan"]) == 2  # neither a spec nor --history
