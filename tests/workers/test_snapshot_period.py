"""``AUTONORM_TUNE_SNAPSHOT_S``: the snapshot period the runner hands Tune (``TUNE_GLOBAL_CHECKPOINT_S``;
``0`` unless overridden, to measure Tune's own period: docs/reliability.md). No Ray cluster needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.plan import StorageConfig, StudyPlan, TrackingConfig
from workers.runner import SNAPSHOT_PERIOD_ENV, run_study, snapshot_period


@pytest.mark.parametrize(
    ("value", "period"), [(None, "0"), ("", "0"), ("auto", "auto"), ("10", "10"), ("0.5", "0.5")]
)
def test_snapshot_period(value: str | None, period: str) -> None:
    environ = {} if value is None else {SNAPSHOT_PERIOD_ENV: value}
    assert snapshot_period(environ) == period


@pytest.mark.parametrize("value", ["-1", "nan", "ten", "Auto"])
def test_snapshot_period_refuses_what_tune_would_not_take(value: str) -> None:
    with pytest.raises(ValueError, match=SNAPSHOT_PERIOD_ENV):
        snapshot_period({SNAPSHOT_PERIOD_ENV: value})


@pytest.mark.parametrize(("value", "period"), [(None, "0"), ("auto", "auto")])
def test_the_runner_hands_tune_the_period(
    value: str | None, period: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "stale")
    if value is None:
        monkeypatch.delenv(SNAPSHOT_PERIOD_ENV, raising=False)
    else:
        monkeypatch.setenv(SNAPSHOT_PERIOD_ENV, value)
    # A relative sqlite URI is refused after the period is set and before Ray or storage is touched.
    plan = StudyPlan(
        name="s",
        base_config={"training": {"epochs": 1}},
        storage=StorageConfig(path=str(tmp_path / "runs")),
        tracking=TrackingConfig(uri="sqlite:///mlflow.db"),
    )
    with pytest.raises(ValueError, match="relative sqlite path"):
        run_study(plan, progress=False)
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == period
    assert not (tmp_path / "runs").exists()
