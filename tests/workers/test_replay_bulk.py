"""A study's trial histories read back in bulk (one request per metric per 100 runs) are the same
histories the per-run reads give: on a database store and on a real MLflow server."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from workers.tracking import replay
from workers.tracking.names import ROLE_TRIAL, TAG_PARENT, TAG_PHASE, TAG_ROLE, TAG_TRIAL_ID
from workers.tracking.replay import TrackedTrials


def _study(client: MlflowClient, name: str, trials: int) -> str:
    exp = client.create_experiment(name)
    study = client.create_run(exp, run_name="study").info.run_id
    for t in range(trials):
        tags = {TAG_ROLE: ROLE_TRIAL, TAG_PARENT: study, TAG_TRIAL_ID: f"t{t:03d}", TAG_PHASE: "confirm"}
        run = client.create_run(exp, tags=tags, run_name=f"trial-{t}").info.run_id
        metrics = [Metric("epoch", float(e), 1000 + e, e) for e in range(1, 4)]
        metrics += [Metric("val_accuracy", 0.1 * e + 0.01 * t, 1000 + e, e) for e in range(1, 4)]
        if t % 3 == 0:  # a restarted trial logged its epoch 2 again, later: the later value counts
            metrics.append(Metric("val_accuracy", 0.99, 2000, 2))
        if t % 4 == 1:
            metrics.append(Metric("train_loss", math.nan, 1003, 3))  # one epoch only, and NaN
        client.log_batch(run, metrics=metrics)
    return study


def _histories(client: MlflowClient, study: str) -> dict[str, Any]:
    records = TrackedTrials(client, study).trials("confirm")
    return {
        r.trial_id: [{k: ("nan" if v != v else v) for k, v in row.items()} for row in r.history]
        for r in records
    }


def _check_bulk_matches_per_run(
    client: MlflowClient, study: str, monkeypatch: pytest.MonkeyPatch, *, trials: int
) -> None:
    calls: list[int] = []
    real = replay.bulk_metric_history

    def counted(c: Any, run_ids: list[str], key: str) -> Any:
        calls.append(len(run_ids))
        return real(c, run_ids, key)

    monkeypatch.setattr(replay, "bulk_metric_history", counted)
    bulk = _histories(client, study)
    pages = -(-trials // 100)
    assert calls and max(calls) <= 100 and len(calls) == 2 * pages + 1  # epoch, val_accuracy, train_loss
    monkeypatch.setattr(replay, "bulk_metric_history", lambda *a: None)
    per_run = _histories(client, study)
    assert bulk == per_run and len(bulk) == trials
    assert bulk["t000"][1]["val_accuracy"] == 0.99 and bulk["t001"][2]["train_loss"] == "nan"


def test_bulk_histories_match_per_run_reads_on_a_database_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    _check_bulk_matches_per_run(client, _study(client, "bulk-db", 101), monkeypatch, trials=101)


@pytest.mark.services
def test_bulk_histories_match_per_run_reads_on_a_real_mlflow_server(
    mlflow_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    client = MlflowClient(mlflow_server.tracking_uri)
    # Few runs (each costs requests): the pages of 100 are the database test's; here the server's route.
    _check_bulk_matches_per_run(
        client, _study(client, f"bulk-{uuid.uuid4().hex[:8]}", 9), monkeypatch, trials=9
    )
