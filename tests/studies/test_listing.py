"""``autonorm-study ls``: every study of a real (sqlite) MLflow store, one line each, newest first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.cli import main


def _store(tmp_path: Path) -> str:
    from mlflow import MlflowClient

    from workers.tracking.store import ensure_sqlite_schema

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_sqlite_schema(uri, artifact_root=str(tmp_path / "artifacts"))  # a copy of the kept schema
    client = MlflowClient(tracking_uri=uri)
    first, second = client.create_experiment("lab-a"), client.create_experiment("lab-b")
    t0 = 1_760_000_000_000
    studies = [  # (experiment, name, kind, start offset in s, verdict, trials, wall s, finished)
        (first, "bs_smoke", "batchsize", 0, "inconclusive", 42, 61.0, True),
        (second, "table_smoke", "compare", 300, "refuted", 16, 30.0, True),
        (first, "search_smoke", "search", 600, None, None, None, False),  # still running
    ]
    for exp, name, kind, offset, verdict, trials, wall, finished in studies:
        tags = {"autonorm.role": "study", "autonorm.kind": kind}
        if verdict:
            tags["verdict/study"] = verdict
        run = client.create_run(exp, start_time=t0 + offset * 1000, tags=tags, run_name=name)
        client.log_param(run.info.run_id, "expected_trials", "12")
        if trials is not None:
            client.log_metric(run.info.run_id, "actual_trials", trials)
            client.log_metric(run.info.run_id, "actual_wall_s", wall)
            # the command's own time (imports, Ray's start): plan --history's, never ls's wall time
            client.log_metric(run.info.run_id, "actual_command_wall_s", wall + 100.0)
        if finished:
            client.set_terminated(run.info.run_id, "FINISHED")
        trial = client.create_run(exp, tags={"autonorm.role": "trial", "mlflow.parentRunId": run.info.run_id})
        client.set_terminated(trial.info.run_id, "FINISHED")
    return uri


def test_ls_lists_each_study_once_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = _store(tmp_path)
    assert main(["ls", "--tracking-uri", uri]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("study") and len(lines) == 4  # a header, one line per study, no trial run
    assert [ln.split()[0] for ln in lines[1:]] == ["search_smoke", "table_smoke", "bs_smoke"]
    assert lines[2].split()[1:5] == ["compare", "FINISHED", "refuted", "16"] and "0.5 min" in lines[2]
    assert lines[1].split()[1:5] == ["search", "RUNNING", "-", "12"]  # no verdict yet; the planned count

    assert main(["ls", "--tracking-uri", uri, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["study"], r["kind"], r["experiment"]) for r in rows] == [
        ("search_smoke", "search", "lab-a"),
        ("table_smoke", "compare", "lab-b"),
        ("bs_smoke", "batchsize", "lab-a"),
    ]
    assert (
        rows[2]["study_verdict"] == "inconclusive" and rows[2]["trials"] == 42 and rows[2]["wall_s"] == 61.0
    )


def test_ls_needs_a_store(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["ls"]) == 2
    assert "--tracking-uri" in capsys.readouterr().err


def test_ls_on_an_empty_store_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.tracking.store import ensure_sqlite_schema

    uri = f"sqlite:///{tmp_path}/empty.db"
    ensure_sqlite_schema(uri, artifact_root=str(tmp_path / "artifacts"))
    assert main(["ls", "--tracking-uri", uri]) == 0
    assert capsys.readouterr().out.strip() == "no study in this tracking store"
