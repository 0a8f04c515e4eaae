"""A study directory written before the one-house restructuring (issue #37) resumes and reports under today's code.

``fixtures/study_before_37.tar.gz`` is a finished tiny compare study (2 arms, a 3-point η grid on 2
tuning seeds, 2 confirmatory seeds, 1 epoch: 16 trials) with its sqlite MLflow store, written by
commit 49c576e (``studies/spec/``, ``studies/kinds/base.py``, ``workers/runner.py`` in one
module). Tune's state pickles class paths and the study's ``study_spec.yaml`` is checked against
today's spec classes, so a moved class, a renamed phase or a changed spec field fails here. The study
lives at a fixed absolute path, as its spec and its sqlite URI name it.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "study_before_37.tar.gz"
WHERE = Path("/tmp/autonorm-study-before-37")
STUDY = WHERE / "runs" / "before_37"
#: What ``verdict.json`` says about the science (the rest: paths and timings).
DECIDED = ("kind", "study_verdict", "hypotheses", "contrasts", "arms", "family_size", "study_reasons")


@pytest.fixture
def old_study() -> Iterator[Path]:
    shutil.rmtree(WHERE, ignore_errors=True)
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(WHERE.parent, filter="data")
    yield STUDY
    shutil.rmtree(WHERE, ignore_errors=True)


def _decided(verdict: dict[str, Any]) -> dict[str, Any]:
    return {k: verdict.get(k) for k in DECIDED}


def _same_science(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """The decided fields agree, as ``reproduce`` compares them: a field added to ``verdict.json``
    since the study was written (the ``arms`` a hypothesis rests on) is no difference."""
    from studies.verdict_diff import compare_verdicts

    diffs = compare_verdicts(_decided(before), _decided(after))
    assert not diffs, [d.line() for d in diffs]
    return True


def _trial_runs() -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{WHERE}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=5000)
    return {r.info.run_id: r.info.status for r in runs if r.data.tags.get("autonorm.role") == "trial"}


@pytest.mark.ray
@pytest.mark.slow
def test_a_study_written_before_the_restructuring_resumes_and_reports(
    old_study: Path, local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from studies.cli import main

    before = json.loads((old_study / "verdict.json").read_text())
    runs_before = _trial_runs()
    assert len(runs_before) == 16 and set(runs_before.values()) == {"FINISHED"}

    assert main(["status", str(old_study), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (
        status["trials"] == status["expected_trials"] == 16
        and status["study_verdict"] == before["study_verdict"]
    )

    assert main(["report", str(old_study), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert _same_science(before, json.loads((tmp_path / "report" / "verdict.json").read_text()))

    # Resuming a finished study restores every phase from Tune's state: nothing trains again, no
    # MLflow run is added, and the verdict it writes is the one the old code wrote.
    assert main(["resume", str(old_study)]) == 0
    out = capsys.readouterr().out
    assert "STUDY VERDICT: inconclusive" in out, out
    assert _trial_runs() == runs_before
    assert _same_science(before, json.loads((old_study / "verdict.json").read_text()))
