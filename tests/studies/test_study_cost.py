"""One cost across a study's sessions, and the claims kind's cost and trial names (issue #48).

A study stopped and resumed runs in several sessions (commands); its wall time is the sum of theirs
(``<study>/sessions.json``, :class:`workers.cost.Sessions`), in every output: the run's closing line,
``verdict.json``, ``status``, ``ls`` and the report. The claims (``search``) kind writes the run's
``trials`` into its ``verdict.json``'s ``resources`` as every kind does, and its ``status`` names
trials as their MLflow runs are named, not by Tune's ids.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from workers.cost import SESSIONS_FILE, Sessions, registered

# ---- the sessions file (no Ray) -----------------------------------------------------------------


def test_each_session_adds_its_wall_time_to_the_earlier_ones(tmp_path: Path) -> None:
    study = tmp_path / "study"
    first = Sessions(None, str(study))  # a local study directory, not there yet
    assert first.earlier == [] and first.earlier_wall_s == 0.0
    first.save(1.5)  # written as it goes (a killed driver's session counts up to here)
    first.save(120.25, "interrupted")
    doc = json.loads((study / SESSIONS_FILE).read_text())
    assert [(e["wall_s"], e["ended"]) for e in doc["sessions"]] == [(120.25, "interrupted")]

    second = Sessions(None, str(study))
    assert second.earlier_wall_s == 120.25
    second.save(30.0, "finished")
    third = Sessions(None, str(study))
    assert third.earlier_wall_s == 150.25
    assert [e["ended"] for e in third.earlier] == ["interrupted", "finished"]

    # A file that cannot be read (or an entry without a number) counts nothing, and is no failure.
    (study / SESSIONS_FILE).write_text("{not json")
    assert Sessions(None, str(study)).earlier_wall_s == 0.0
    (study / SESSIONS_FILE).write_text(json.dumps({"sessions": [{"wall_s": None}, {"wall_s": 2}, 7]}))
    assert Sessions(None, str(study)).earlier_wall_s == 2.0


def test_the_claims_verdict_and_report_carry_the_running_cost(tmp_path: Path) -> None:
    """``write_claims_report`` inside a study run (or ``report``): the run's ``trials`` and wall time in
    ``verdict.json``'s ``resources`` and the report's resources, as ``begin_report`` writes them."""
    from tests.studies.test_claims_report import _write

    cost = {"trials": 149.0, "wall_time_s": 5400.0, "cpu_hours": 2.5, "gpu_hours": 0.0}
    with registered(lambda: dict(cost)):
        _, _, paths = _write(tmp_path, 6, wall_time_s=10.0, cpu_hours=1.0)
    resources = json.loads(paths["verdict"].read_text())["resources"]
    assert resources == cost
    md = paths["markdown"].read_text()
    assert "- trials run: 149\n" in md and "- wall time: 90.0 min\n" in md and "CPU hours: 2.5" in md
    # Outside a study run (a test, a notebook): what it was given, no trial count.
    _, _, paths = _write(tmp_path / "alone", 6, wall_time_s=10.0, cpu_hours=1.0)
    resources = json.loads(paths["verdict"].read_text())["resources"]
    assert resources["wall_time_s"] == 10.0 and "trials" not in resources


# ---- real studies on a local Ray ---------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_a_resumed_study_costs_the_sum_of_its_sessions(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first session stopped after 1000 s (its record on disk, as a Ctrl-C leaves it), then the study
    run to its end, then run again: each time the run's closing line, ``verdict.json``, ``status``,
    ``ls``, the report and the study run's ``actual_wall_s`` show the sessions' sum."""
    from studies import cli
    from studies.running import run_study_spec
    from tests.studies.test_batchsize_study import NO_CHECK, planted_trial, smoke_spec
    from workers.console import format_wall

    spec = smoke_spec(f"storage_path={tmp_path}", "arms=[linear,corrected]", "max_concurrent=1", *NO_CHECK)
    study_dir = tmp_path / spec.name
    study_dir.mkdir()
    stopped = {"started": "2026-12-06T00:00:00+00:00", "wall_s": 1000.0, "ended": "interrupted"}
    (study_dir / SESSIONS_FILE).write_text(json.dumps({"sessions": [stopped]}))

    def run() -> tuple[Any, str]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            out = run_study_spec(spec, trainable=planted_trial, progress=False)
        return out, printed.getvalue()

    for n_sessions in (2, 3):
        out, printed = run()
        sessions = json.loads((study_dir / SESSIONS_FILE).read_text())["sessions"]
        assert len(sessions) == n_sessions and sessions[0] == stopped
        assert sessions[-1]["ended"] == "finished" and 0 < sessions[-1]["wall_s"] < 1000
        resources = json.loads((study_dir / "verdict.json").read_text())["resources"]
        wall = resources["wall_time_s"]
        assert wall == pytest.approx(sum(s["wall_s"] for s in sessions), abs=0.01)
        assert resources["trials"] >= spec.total_trials  # (a range extension may add some)
        shown = format_wall(wall)
        assert out.summary["wall_s"] == wall
        (closing,) = [ln for ln in printed.splitlines() if ln.startswith(f"[{spec.name}] trials run: ")]
        assert f"wall time: {shown}" in closing
        assert f"- wall time: {shown}\n" in (study_dir / "report.md").read_text()
        capsys.readouterr()
        assert cli.main(["status", str(study_dir), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["trials"], status["wall_s"]) == (resources["trials"], wall)
        assert cli.main(["ls", "--tracking-uri", out.tracking_uri, "--json"]) == 0
        (row,) = [r for r in json.loads(capsys.readouterr().out) if r["study"] == spec.name]
        assert row["wall_s"] == pytest.approx(wall)


@pytest.mark.ray
@pytest.mark.slow
def test_search_status_names_trials_as_mlflow_does_and_report_keeps_the_trial_count(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from studies import cli
    from studies.kinds import load_study
    from studies.running import run_study_spec
    from tests.studies.test_cli import SHIPPED, tiny_trial

    spec = load_study(
        SHIPPED,
        [
            f"storage_path={tmp_path}",
            "search.num_samples=3",
            "search.max_concurrent=1",
            "training.epochs=3",
            "confirm=null",
        ],
        preset="smoke",
    )
    out = run_study_spec(spec, trainable=tiny_trial, progress=False)
    study_dir = tmp_path / spec.name
    client = MlflowClient(out.tracking_uri)
    runs = client.search_runs(
        [client.get_run(out.parent_run_id).info.experiment_id],  # type: ignore[arg-type]
        "tags.`autonorm.role` = 'trial'",
    )
    names = {r.info.run_name for r in runs}
    assert names == {"search-001", "search-002", "search-003"}

    capsys.readouterr()
    assert cli.main(["status", str(study_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {row["trial"] for row in status["rows"]} == names  # MLflow's names, not Tune's ids
    best = max(status["rows"], key=lambda r: r["val_accuracy"] if math.isfinite(r["val_accuracy"]) else -1)
    assert status["best_trial"] == best["trial"] and "wall_s" in status
    assert cli.main(["status", str(study_dir)]) == 0
    assert f"best completed: {best['trial']} " in capsys.readouterr().out

    assert cli.main(["report", str(study_dir)]) == 0
    capsys.readouterr()
    verdict = json.loads((study_dir / "report" / "verdict.json").read_text())
    assert verdict["resources"]["trials"] == 3
    report = (study_dir / "report" / "report.md").read_text()
    assert f"## Best completed trial `{best['trial']}`" in report
