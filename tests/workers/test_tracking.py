"""The driver-side MLflow callback against a real sqlite tracking store (and a real ``mlflow server``
for the outage test), with stand-in Tune trials."""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

import workers.tracking.callback
import workers.tracking.outage
import workers.tracking.store
import workers.tracking.writer
from tests.services import free_port, start_mlflow_server
from workers.tracking import (
    TAG_ROLE,
    TAG_TRIAL_ID,
    TAG_TRIAL_STATUS,
    TAG_UNDELIVERED,
    MlflowTrackingCallback,
    MlflowUnavailable,
    RetryPolicy,
    StudyTracker,
    check_tracking_uri,
    default_tracking_uri,
    ensure_sqlite_schema,
    flatten_params,
    study_key,
)

WHITELIST = ("epoch", "train_loss", "val_", "gate_entropy")


class FakeTrial:
    """The parts of ``ray.tune.experiment.Trial`` the callback reads."""

    def __init__(self, trial_id: str, config: dict[str, Any]) -> None:
        self.trial_id = trial_id
        self.config = config
        self.status = "RUNNING"
        self.last_result: dict[str, Any] = {}

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


def _result(epoch: int, status: str = "running") -> dict[str, Any]:
    return {
        "epoch": epoch,
        "val_accuracy": 0.1 * epoch,
        "train_loss": 1.0 / epoch,
        "gate_entropy/layer_0": 0.5,
        "training_iteration": epoch,  # Ray bookkeeping: must not reach MLflow
        "time_this_iter_s": 0.2,
        "status": status,
        "node_id": "n1",
        "done": False,
    }


@pytest.fixture
def tmp_path(tracking_dir: Path) -> Path:
    """Every test here logs into a directory with a ready MLflow database."""
    return tracking_dir


def _callback(tmp_path: Path, **kwargs: Any) -> Any:
    """A callback, typed ``Any``: the tests hand it duck-typed :class:`FakeTrial` objects."""
    defaults: dict[str, Any] = {
        "tracking_uri": default_tracking_uri(tmp_path),
        "experiment_name": "exp",
        "key": study_key(str(tmp_path / "study")),
        "base_config": {"training": {"epochs": 3, "lr": 1e-3}, "seed": 0},
        "metric_whitelist": WHITELIST,
        "artifact_location": f"file://{tmp_path}/artifacts",
        "parent_tags": {"autonorm.spec_hash": "abc123"},
        "parent_params": {"sampler": "tpe"},
        "artifacts": {"spec.yaml": "name: exp\n"},
        "expected_trials": 2,
        "retry": RetryPolicy(attempts=2, delay_s=0.01, final_attempts=2),
    }
    defaults.update(kwargs)
    return MlflowTrackingCallback(**defaults)


def _feed(cb: Any, trial: FakeTrial, epochs: range, *, final: int | None = None) -> None:
    for epoch in epochs:
        result = _result(epoch, "completed" if epoch == final else "running")
        trial.last_result = result
        cb.on_trial_result(iteration=epoch, trials=[trial], trial=trial, result=result)


def _runs(client: MlflowClient, role: str) -> list[Any]:
    exp = client.get_experiment_by_name("exp")
    assert exp is not None
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(TAG_ROLE) == role]


def test_parent_children_metrics_params_and_whitelist(tmp_path: Path) -> None:
    cb = _callback(tmp_path)
    parent_id = cb.prepare(fresh=True)
    cb.setup(total_num_samples=2)
    a = FakeTrial("a0001", {"training.lr": 0.01, "seed": 3})
    b = FakeTrial("b0002", {"training.lr": 0.02, "seed": 4})
    _feed(cb, a, range(1, 4), final=3)
    _feed(cb, b, range(1, 3))
    a.status = "TERMINATED"
    cb.on_trial_complete(iteration=3, trials=[a, b], trial=a)
    b.status = "TERMINATED"  # stopped by a scheduler after epoch 2: last status "running"
    cb.on_trial_complete(iteration=4, trials=[a, b], trial=b)
    cb.close(status="FINISHED", trials=[a, b])

    client = MlflowClient(cb.tracking_uri)
    (parent,) = _runs(client, "study")
    assert parent.info.run_id == parent_id
    assert parent.info.status == "FINISHED"
    assert parent.data.params == {"sampler": "tpe", "expected_trials": "2"}
    assert parent.data.tags["autonorm.spec_hash"] == "abc123"
    assert [f.path for f in client.list_artifacts(parent_id)] == ["spec.yaml"]
    exp = client.get_experiment_by_name("exp")
    assert exp is not None and exp.artifact_location == f"file://{tmp_path}/artifacts"
    # MLflow 3 opens it in the training view (runs table), not the GenAI one.
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    key = study_key(str(tmp_path / "study"))
    assert parent.data.tags["autonorm.run_key"] == parent.data.tags["autonorm.study_key"] == key

    children = {r.data.tags[TAG_TRIAL_ID]: r for r in _runs(client, "trial")}
    assert set(children) == {"a0001", "b0002"}
    for run in children.values():
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        # One filter selects the study: its trial runs carry its key and spec hash.
        assert run.data.tags["autonorm.study_key"] == key
        assert run.data.tags["autonorm.spec_hash"] == "abc123"
        assert run.info.status == "FINISHED"
        assert set(run.data.metrics) == {"epoch", "val_accuracy", "train_loss", "gate_entropy/layer_0"}
    assert children["a0001"].data.tags[TAG_TRIAL_STATUS] == "completed"
    assert children["b0002"].data.tags[TAG_TRIAL_STATUS] == "pruned"
    # params = the resolved trial config, sampled values applied
    assert children["a0001"].data.params == {"training.epochs": "3", "training.lr": "0.01", "seed": "3"}
    history = client.get_metric_history(children["a0001"].info.run_id, "val_accuracy")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_phase_run_carries_the_study_key_and_is_found_by_its_own(tmp_path: Path) -> None:
    """A phase run (study key from its plan's tags) is found again by its run key, not the study's:
    two phases of one study share ``autonorm.study_key`` and still get one run each."""
    client = MlflowClient(default_tracking_uri(tmp_path))
    exp_id = client.create_experiment("exp")  # made elsewhere: the study marks it anyway
    assert "mlflow.experimentKind" not in client.get_experiment(exp_id).tags
    ids = []
    for phase in ("tune", "confirm"):
        cb = _callback(
            tmp_path,
            key=study_key(str(tmp_path / "study" / phase)),
            role="phase",
            parent_tags={"autonorm.study_key": "s" * 16, "autonorm.phase": phase},
        )
        ids.append(cb.prepare(fresh=True))
        assert (
            _callback(
                tmp_path,
                key=study_key(str(tmp_path / "study" / phase)),
                role="phase",
                parent_tags={"autonorm.study_key": "s" * 16},
            ).prepare(fresh=False)
            == ids[-1]
        )
    assert ids[0] != ids[1]
    runs = client.search_runs([exp_id], filter_string="tags.`autonorm.study_key` = 'ssssssssssssssss'")
    assert sorted(r.data.tags["autonorm.phase"] for r in runs) == ["confirm", "tune"]
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_restored_copy_reattaches_and_skips_logged_epochs(tmp_path: Path) -> None:
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t0001", {"seed": 1})
    _feed(cb, trial, range(1, 3))

    # What Tuner.restore does: unpickle the callback saved at the first start, call setup().
    restored = pickle.loads(pickle.dumps(cb))
    assert restored._client is None and restored._children == {}
    restored.setup()
    # The trial resumes from its epoch-1 checkpoint and reports epochs 2 and 3 again.
    _feed(restored, trial, range(2, 4), final=3)
    trial.status = "TERMINATED"
    restored.on_trial_complete(iteration=5, trials=[trial], trial=trial)
    restored.close(status="FINISHED", trials=[trial])

    client = MlflowClient(cb.tracking_uri)
    assert len(_runs(client, "study")) == 1
    (child,) = _runs(client, "trial")
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "epoch")]
    assert sorted(steps) == [1, 2, 3]  # epoch 2 not logged twice
    assert child.info.status == "FINISHED"


def test_mlflow_outage_is_caught_up_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No back-off: the first result after the outage reconnects.
    cb = _callback(tmp_path, retry=RetryPolicy(attempts=2, delay_s=0.01, final_attempts=2, reconnect_s=0.0))
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t0001", {"seed": 1})
    _feed(cb, trial, range(1, 2))  # run created, epoch 1 logged

    real = cb.client.log_batch
    outage = {"on": True}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if outage["on"]:
            raise ConnectionError("mlflow down")
        return real(*args, **kwargs)

    monkeypatch.setattr(cb.client, "log_batch", flaky)
    _feed(cb, trial, range(2, 4))  # epochs 2 and 3 during the outage: must not raise
    assert [p[0] for p in cb._pending["t0001"]] == [2, 3]
    outage["on"] = False
    _feed(cb, trial, range(4, 5), final=4)  # next result catches up
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=4, trials=[trial], trial=trial)
    cb.close(status="FINISHED", trials=[trial])

    client = MlflowClient(cb.tracking_uri)
    (child,) = _runs(client, "trial")
    steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "val_accuracy"))
    assert steps == [1, 2, 3, 4]
    assert child.info.status == "FINISHED"


def test_outage_at_study_start_creates_parent_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cb = _callback(tmp_path)
    calls = {"n": 0}
    original = MlflowTrackingCallback._ensure_experiment

    def down_once(self: MlflowTrackingCallback) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("mlflow down")
        return original(self)

    monkeypatch.setattr(MlflowTrackingCallback, "_ensure_experiment", down_once)
    cb.setup()  # must not raise
    assert cb.parent_run_id is None
    trial = FakeTrial("t0001", {"seed": 1})
    _feed(cb, trial, range(1, 3), final=2)
    trial.status = "TERMINATED"
    cb.close(status="FINISHED", trials=[trial])
    client = MlflowClient(cb.tracking_uri)
    assert len(_runs(client, "study")) == 1
    (child,) = _runs(client, "trial")
    assert child.info.status == "FINISHED"
    # the artifacts of the parent are logged once it exists
    assert [f.path for f in client.list_artifacts(cb.parent_run_id or "")] == ["spec.yaml"]


def test_close_sets_final_statuses_and_drops_orphans(tmp_path: Path) -> None:
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    done, errored, cut, orphan = (FakeTrial(f"t{i}", {}) for i in range(4))
    for trial in (done, errored, cut, orphan):
        _feed(cb, trial, range(1, 2))
    done.status, errored.status, cut.status = "TERMINATED", "ERROR", "PAUSED"
    done.last_result["status"] = "completed"
    never_reported = FakeTrial("t9", {})
    never_reported.status = "ERROR"
    # `orphan` is unknown to Tune at the end (created after Tune's last snapshot before a crash).
    cb.close(status="FINISHED", trials=[done, errored, cut, never_reported])

    client = MlflowClient(cb.tracking_uri)
    status = {r.data.tags[TAG_TRIAL_ID]: r.info.status for r in _runs(client, "trial")}
    assert status == {"t0": "FINISHED", "t1": "FAILED", "t2": "KILLED", "t9": "FAILED"}
    assert not [r for r in _runs(client, "study") if r.info.status == "RUNNING"]


def test_the_study_end_lists_the_trial_runs_once_unless_something_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #40: listing a phase's trial runs took 3.5 s at 1,000 runs, and the study's end listed
    them five times (Tune's end, the runner's close with its orphan check, the run ids). Now one
    listing per closing pass, none for a pass that would find everything as the last one left it."""
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    listings: list[str] = []
    monkeypatch.setattr(cb, "_children_of", _counting(cb._children_of, "list", listings))
    done, later = FakeTrial("t0", {}), FakeTrial("t1", {})
    for trial in (done, later):
        _feed(cb, trial, range(1, 3), final=2)
        trial.status = "TERMINATED"
    cb.on_experiment_end(trials=[done, later])  # Tune's end: one listing (the map and the orphans)
    assert listings == ["list"]
    cb.requeue({"t0": [_result(1), _result(2, "completed")]})  # all of it already in MLflow
    cb.close(status="FINISHED", trials=[done, later])
    ids = cb.child_run_ids()
    assert listings == ["list"] and set(ids) == {"t0", "t1"}
    client = MlflowClient(cb.tracking_uri)
    assert {r.data.tags[TAG_TRIAL_ID]: r.info.status for r in _runs(client, "trial")} == {
        "t0": "FINISHED",
        "t1": "FINISHED",
    }
    # A trial whose status changed (an errored one Tune ran again, say) is a pass of its own.
    again = _callback(tmp_path)
    again.prepare(fresh=False)
    again.setup()
    monkeypatch.setattr(again, "_children_of", _counting(again._children_of, "list", listings))
    again.close_trials([done, later])
    again.close_trials([done, later])
    later.status = "ERROR"
    again.close_trials([done, later])
    assert listings == ["list"] * 3
    assert {r.data.tags[TAG_TRIAL_ID]: r.info.status for r in _runs(client, "trial")}["t1"] == "FAILED"


def test_fresh_start_supersedes_a_parent_whose_tune_state_is_gone(tmp_path: Path) -> None:
    cb = _callback(tmp_path)
    first = cb.prepare(fresh=True)
    cb.setup()
    _feed(cb, FakeTrial("old", {}), range(1, 2))
    # Same experiment path, restored: same parent. Fresh (state deleted): a new one.
    assert _callback(tmp_path).prepare(fresh=False) == first
    second = _callback(tmp_path).prepare(fresh=True)
    assert second != first
    client = MlflowClient(cb.tracking_uri)
    old = client.get_run(first)
    assert old.info.status == "KILLED"
    assert old.data.tags["autonorm.study_key"].endswith(":superseded")
    # a fresh start with an empty previous parent just reuses it
    assert _callback(tmp_path).prepare(fresh=True) == second


def test_pickled_callback_carries_no_client_or_state(tmp_path: Path) -> None:
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    state = cb.__getstate__()
    for name in ("_client", "_parent_id", "_children", "_pending"):
        assert name not in state
    assert state["tracking_uri"] == cb.tracking_uri


def test_sqlite_schema_is_created_atomically_and_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("schema")
    uri = default_tracking_uri(tmp_path / "sub")
    assert uri == f"sqlite:///{tmp_path / 'sub' / 'mlflow.db'}"
    ensure_sqlite_schema(uri, artifact_root=str(tmp_path))
    db = tmp_path / "sub" / "mlflow.db"
    assert db.exists()
    assert sorted(os.listdir(tmp_path / "sub")) == ["mlflow.db"]  # no temporary leftovers
    mtime = db.stat().st_mtime_ns
    ensure_sqlite_schema(uri, artifact_root=str(tmp_path))
    assert db.stat().st_mtime_ns == mtime
    assert MlflowClient(uri).search_experiments()  # a usable database


def _schema(db: Path) -> tuple[list[tuple[str, str, str]], list[tuple[str]]]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as c:
        ddl = sorted(c.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
        return ddl, list(c.execute("SELECT version_num FROM alembic_version"))


def test_new_stores_copy_the_schema_template_and_get_their_own_default_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTONORM_DATA_DIR", str(tmp_path / "cache"))
    template = workers.tracking.store.schema_template()
    assert not template.exists()
    built = tmp_path / "built" / "mlflow.db"
    ensure_sqlite_schema(f"sqlite:///{built}", artifact_root=str(tmp_path / "art"))
    assert template.is_file()  # the first build of this MLflow version is kept
    copied = tmp_path / "copied" / "mlflow.db"
    ensure_sqlite_schema(f"sqlite:///{copied}", artifact_root="s3://bucket/prefix")
    assert _schema(copied) == _schema(built)  # every table, index and the schema version
    assert sorted(os.listdir(copied.parent)) == ["mlflow.db"]
    # its default experiment is the one MLflow would have made for that root, not the template's
    assert MlflowClient(f"sqlite:///{copied}").get_experiment("0").artifact_location == "s3://bucket/prefix/0"
    assert MlflowClient(f"sqlite:///{built}").get_experiment("0").artifact_location == f"{tmp_path / 'art'}/0"
    client = MlflowClient(f"sqlite:///{copied}")
    run = client.create_run(client.create_experiment("x", artifact_location=str(tmp_path / "x")))
    client.log_metric(run.info.run_id, "m", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


def test_a_damaged_schema_template_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTONORM_DATA_DIR", str(tmp_path / "cache"))
    template = workers.tracking.store.schema_template()
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a database" * 100)
    db = tmp_path / "s" / "mlflow.db"
    ensure_sqlite_schema(f"sqlite:///{db}", artifact_root=str(tmp_path))
    assert MlflowClient(f"sqlite:///{db}").search_experiments()  # built by MLflow instead
    assert _schema(template) == _schema(db)  # and kept in place of the damaged one


def test_flatten_params() -> None:
    flat = flatten_params(
        {"model": {"norm": {"type": "autonorm", "tau": 0.5}, "x": None}, "seed": 1, "l": [1, 2]}
    )
    assert flat == {
        "model.norm.type": "autonorm",
        "model.norm.tau": "0.5",
        "model.x": "null",
        "seed": "1",
        "l": "[1, 2]",
    }
    assert len(flatten_params({"long": "x" * 10000})["long"]) == 6000


def test_study_key_is_stable_and_distinct() -> None:
    assert study_key("/a/b") == study_key("/a/b")
    assert study_key("/a/b") != study_key("/a/c")
    assert len(study_key("s3://bucket/x")) == 16


# ----------------------------------------------------------------------------------- outage policy


class FakeClock:
    """``time`` as the tracking module sees it: a monotonic clock that only moves when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _use_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """The fake clock in every tracking module that reads the time."""
    for module in (workers.tracking.callback, workers.tracking.outage, workers.tracking.writer):
        monkeypatch.setattr(module, "time", clock)


class Outage:
    """Makes the callback's client fail (as a dead server would) while ``on``; counts the calls."""

    METHODS = ("log_batch", "create_run", "search_runs", "set_terminated", "get_experiment_by_name")

    def __init__(self, cb: MlflowTrackingCallback, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.calls = 0
        client = cb.client
        for name in self.METHODS:
            monkeypatch.setattr(client, name, self._wrap(getattr(client, name)))
        store = client._tracking_client.store  # a trial run's end goes to the store directly
        monkeypatch.setattr(store, "update_run_info", self._wrap(store.update_run_info))

    def _wrap(self, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls += 1
                raise ConnectionError("connection refused")
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    "uri", ["ftp://host/mlruns", "file:///tmp/mlruns", "/tmp/mlruns", "gopher://x", "s3://bucket/mlruns"]
)
def test_a_tracking_uri_mlflow_cannot_store_to_is_an_error_at_study_start(tmp_path: Path, uri: str) -> None:
    with pytest.raises(ValueError, match="tracking URI"):
        check_tracking_uri(uri)
    with pytest.raises(ValueError, match="tracking URI"):
        _callback(tmp_path, tracking_uri=uri)
    with pytest.raises(ValueError, match="tracking URI"):
        StudyTracker(tracking_uri=uri, experiment_name="exp", key="k")


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "https://mlflow.example.org",
        "sqlite:////abs/mlflow.db",
        "postgresql+psycopg2://u@h/db",
        "mysql+pymysql://u@h/db",
        "databricks",
    ],
)
def test_tracking_uris_mlflow_serves_are_accepted(uri: str) -> None:
    check_tracking_uri(uri)


def test_calls_in_the_tune_loop_get_short_http_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")  # the user's own setting
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    cb = _callback(tmp_path)
    seen: list[tuple[str | None, str | None]] = []
    real = cb.client.log_batch

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(
            (os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT"), os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES"))
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(cb.client, "log_batch", spy)
    cb.prepare(fresh=True)  # outside the loop: the user's timeout stays, retries default to 2
    assert seen and set(seen) == {("77", "2")}
    seen.clear()
    cb.setup()
    _feed(cb, FakeTrial("t1", {}), range(1, 3))  # inside the loop: 5 s, no HTTP retries
    assert seen and set(seen) == {("5", "0")}
    # and the environment is what it was
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_outage_backs_off_queues_and_then_catches_up_every_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    _use_clock(monkeypatch, clock)
    # Every result tries MLflow here (no coalescing window): what is tested is the back-off.
    cb = _callback(tmp_path, retry=RetryPolicy(reconnect_s=1.0, reconnect_max_s=3.0, result_flush_s=0.0))
    cb.prepare(fresh=True)
    cb.setup()
    outage = Outage(cb, monkeypatch)
    a, b = FakeTrial("a", {}), FakeTrial("b", {})
    _feed(cb, a, range(1, 2))
    _feed(cb, b, range(1, 2))

    outage.on = True
    _feed(cb, a, range(2, 3))
    assert outage.calls == 1  # one try, no retries inside the loop
    _feed(cb, b, range(2, 3))
    _feed(cb, a, range(3, 4))
    assert outage.calls == 1  # backed off: no reconnect on every result
    clock.now += 1.5
    _feed(cb, a, range(4, 5))
    assert outage.calls == 2  # one reconnect attempt after the back-off...
    clock.now += 1.5
    _feed(cb, b, range(3, 4), final=3)
    assert outage.calls == 2  # ...which doubled it to 2 s
    b.status = "TERMINATED"
    cb.on_trial_complete(iteration=9, trials=[a, b], trial=b)  # its run's close is owed
    for _ in range(3):
        clock.now += 10.0
        _feed(cb, a, range(5 + _, 6 + _))
    assert outage.calls == 5 and cb._backoff == 3.0  # capped
    assert cb.undelivered_trials() == ["a", "b"]

    outage.on = False
    clock.now += 3.5
    _feed(cb, a, range(8, 9))  # MLflow answers: every queue is flushed, b's run closed
    assert cb.undelivered_trials() == []
    client = MlflowClient(cb.tracking_uri)
    runs = {r.data.tags[TAG_TRIAL_ID]: r for r in _runs(client, "trial")}
    assert runs["b"].info.status == "FINISHED" and runs["b"].data.tags[TAG_TRIAL_STATUS] == "completed"
    steps = {
        k: sorted(m.step for m in client.get_metric_history(r.info.run_id, "epoch")) for k, r in runs.items()
    }
    assert steps == {"a": list(range(1, 9)), "b": [1, 2, 3]}


def test_a_running_trials_epochs_go_out_at_its_first_result_then_at_most_every_flush_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    _use_clock(monkeypatch, clock)
    cb = _callback(tmp_path, retry=RetryPolicy(result_flush_s=2.0))
    cb.prepare(fresh=True)
    cb.setup()
    batches: list[list[int]] = []
    real = cb.client.log_batch

    def counted(run_id: str, metrics: Any = (), **kwargs: Any) -> Any:
        steps = sorted({m.step for m in metrics or ()})
        if steps:
            batches.append(steps)
        return real(run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(cb.client, "log_batch", counted)
    trial = FakeTrial("a", {})
    _feed(cb, trial, range(1, 2))  # the run appears with its first epoch
    clock.now += 0.5
    _feed(cb, trial, range(2, 4))  # inside the window: queued
    assert batches == [[1]]
    client = MlflowClient(cb.tracking_uri)
    (run,) = _runs(client, "trial")
    assert run.info.status == "RUNNING" and run.data.metrics["epoch"] == 1.0
    clock.now += 2.0
    _feed(cb, trial, range(4, 5))  # the window has passed: 2-4 in one call
    _feed(cb, trial, range(5, 7), final=6)
    assert batches == [[1], [2, 3, 4]]
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=6, trials=[trial], trial=trial)  # its end sends the rest
    assert batches == [[1], [2, 3, 4], [5, 6]] and cb.undelivered_trials() == []
    (run,) = _runs(client, "trial")
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch")) == [1, 2, 3, 4, 5, 6]


def _counting(real: Any, name: str, calls: list[str]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    return counted


def test_a_tiny_trials_run_costs_four_requests_create_two_batches_and_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    calls: list[str] = []
    client = cb.client
    store = client._tracking_client.store
    for owner, name in [
        (client, n) for n in ("create_run", "log_batch", "get_run", "update_run", "set_terminated")
    ] + [
        (store, "update_run_info"),
        (store, "get_run"),
    ]:
        monkeypatch.setattr(owner, name, _counting(getattr(owner, name), name, calls))
    trial = FakeTrial("a", {"x": 0.5})
    _feed(cb, trial, range(1, 5), final=4)  # four epochs inside one flush window
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=4, trials=[trial], trial=trial)
    assert calls == ["create_run", "log_batch", "log_batch", "update_run_info"]
    (run,) = _runs(MlflowClient(cb.tracking_uri), "trial")
    assert (
        run.info.status == "FINISHED" and run.info.end_time and run.data.tags[TAG_TRIAL_STATUS] == "completed"
    )
    assert run.data.params["x"] == "0.5" and run.data.metrics["epoch"] == 4.0


def test_in_the_background_a_hook_does_not_wait_for_mlflow_and_close_delivers_everything_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #40: the runner's callback sends from a thread of its own, so Tune's loop goes on while
    a request is pending; the requests keep the hooks' order and ``close`` waits for all of them."""
    import threading

    cb = _callback(tmp_path, background=True)
    cb.prepare(fresh=True)
    cb.setup()
    client = cb.client
    gate, entered = threading.Event(), threading.Event()
    seen: list[tuple[str, int]] = []

    def gated(real: Any, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, threading.get_ident()))
            entered.set()
            gate.wait(timeout=30)  # a sender that blocked the caller would hold the test here
            return real(*args, **kwargs)

        return call

    for name in ("create_run", "log_batch", "set_terminated"):
        monkeypatch.setattr(client, name, gated(getattr(client, name), name))
    store = client._tracking_client.store
    monkeypatch.setattr(store, "update_run_info", gated(store.update_run_info, "update_run_info"))
    trial = FakeTrial("a", {"x": 0.5})
    _feed(cb, trial, range(1, 4), final=3)
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    # Every hook has returned; the first request is on its way and waits for its answer.
    assert entered.wait(timeout=30)
    assert not gate.is_set() and [name for name, _ in seen] == ["create_run"]
    gate.set()
    cb.close(status="FINISHED", trials=[trial])
    assert [name for name, _ in seen][:4] == ["create_run", "log_batch", "log_batch", "update_run_info"]
    assert {ident for _, ident in seen[:4]} != {threading.get_ident()}  # sent from the sender thread
    assert cb._sender is None and not [t for t in threading.enumerate() if t.name.startswith("mlflow-")]
    (run,) = _runs(MlflowClient(cb.tracking_uri), "trial")
    assert run.info.status == "FINISHED" and run.data.tags[TAG_TRIAL_STATUS] == "completed"
    history = MlflowClient(cb.tracking_uri).get_metric_history(run.info.run_id, "epoch")
    assert sorted(m.step for m in history) == [1, 2, 3]


def test_final_flush_is_bounded_and_lists_undelivered_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    _use_clock(monkeypatch, clock)
    cb = _callback(tmp_path, retry=RetryPolicy(final_attempts=3, final_flush_s=30.0))
    cb.prepare(fresh=True)
    cb.setup()
    outage = Outage(cb, monkeypatch)
    trials = [FakeTrial(f"t{i}", {}) for i in range(5)]
    for trial in trials:
        _feed(cb, trial, range(1, 2))
    outage.on = True
    for trial in trials:
        _feed(cb, trial, range(2, 4), final=3)
        trial.status = "TERMINATED"
    cb.on_experiment_end(trials=trials)
    start, calls = clock.now, outage.calls
    cb.close(status="FINISHED", trials=trials, summary={"trials_completed": 5.0})  # never raises
    # it kept trying (several passes, each one call tried 3 times, not 3 tries x every trial)...
    assert outage.calls - calls > 3
    # ...for final_flush_s and no longer (one pass may start just before the bound)
    assert clock.now - start <= 30.0 + 10.0
    assert cb.undelivered_trials() == [t.trial_id for t in trials]
    assert cb.child_run_ids().keys() == {t.trial_id for t in trials}  # what it knows, no raise

    # MLflow answers again for a later close: the parent is written, with the list of what is missing.
    outage.on = False
    cb._final_deadline, cb._down_until = None, 0.0  # a new final flush
    cb._pending.pop("t0")
    cb._finals.pop("t0")
    cb._children["t0"].status = "FINISHED"
    cb.close(status="FINISHED", trials=trials[:1], summary={"trials_completed": 5.0})
    parent = MlflowClient(cb.tracking_uri).get_run(cb.parent_run_id or "")
    assert parent.info.status == "FAILED"  # FINISHED only once every trial's every epoch is in MLflow
    assert parent.data.tags.get(TAG_UNDELIVERED, "") == ",".join(t.trial_id for t in trials[1:])


def test_closed_port_is_an_outage_that_never_raises(tmp_path: Path) -> None:
    cb = _callback(
        tmp_path,
        tracking_uri=f"http://127.0.0.1:{free_port()}",
        retry=RetryPolicy(attempts=1, delay_s=0.01, final_attempts=1, http_retries=0, final_flush_s=1.0),
    )
    with pytest.raises(Exception, match=r"127\.0\.0\.1"):  # what the runner catches and logs at study start
        cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t1", {})
    _feed(cb, trial, range(1, 4), final=3)
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    cb.close(status="FINISHED", trials=[trial])
    assert cb.parent_run_id is None
    assert cb.undelivered_trials() == ["t1"]
    assert [p[0] for p in cb._pending["t1"]] == [1, 2, 3]  # everything still queued, in order


def test_closing_the_study_run_while_mlflow_is_away_stops_at_final_flush_s() -> None:
    # 6 tries with back-off would outlast tracking.final_flush_s many times over; the bound stops
    # the close after the first try with its own error, not the connection error of the sixth
    policy = RetryPolicy(delay_s=5.0, final_attempts=6, http_retries=0, final_flush_s=0.5)
    tracker = StudyTracker(
        tracking_uri=f"http://127.0.0.1:{free_port()}", experiment_name="away", key="k", retry=policy
    )
    tracker.run_id = "0" * 32  # opened earlier, while MLflow answered
    with pytest.raises(MlflowUnavailable, match="time bound"):
        tracker.close("FAILED")
    assert tracker._deadline() is None  # the bound covers this close only


def test_closing_the_study_run_tries_once_even_with_no_time_to_wait(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = StudyTracker(
        tracking_uri=uri, experiment_name="e", key="k", retry=RetryPolicy(final_flush_s=0.0)
    )
    run_id = tracker.open()
    tracker.close("FINISHED")
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


@pytest.mark.services
def test_real_mlflow_server_outage_and_recovery(
    tmp_path: Path, mlflow_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop the server mid-study (results queue), start it again on the same port (they arrive)."""
    import shutil

    db = tmp_path / "server" / "backend.db"
    db.parent.mkdir()
    shutil.copyfile(mlflow_template, db)
    port = free_port()

    def start() -> Any:
        return start_mlflow_server(
            f"sqlite:///{db}",
            str(tmp_path / "server" / "artifacts"),
            {},
            directory=tmp_path / "server",
            port=port,
        )

    server = start()
    try:
        cb = _callback(
            tmp_path,
            tracking_uri=server.tracking_uri,
            artifact_location=None,
            retry=RetryPolicy(attempts=2, delay_s=0.1, reconnect_s=0.0),
        )
        cb.prepare(fresh=True)
        cb.setup()
        trial = FakeTrial("t1", {"seed": 1})
        _feed(cb, trial, range(1, 2))
        server.handle.stop()
        _feed(cb, trial, range(2, 4))  # server down: queued, not raised
        assert [p[0] for p in cb._pending["t1"]] == [2, 3]
        server = start()
        _feed(cb, trial, range(4, 5), final=4)
        assert cb.undelivered_trials() == []
        trial.status = "TERMINATED"
        cb.on_trial_complete(iteration=4, trials=[trial], trial=trial)
        cb.close(status="FINISHED", trials=[trial])
        client = MlflowClient(server.tracking_uri)
        (child,) = _runs(client, "trial")
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "epoch")) == [1, 2, 3, 4]
        assert child.info.status == "FINISHED"
        assert client.get_run(cb.parent_run_id or "").info.status == "FINISHED"
    finally:
        server.handle.stop()


def test_child_params_come_from_the_config_the_trial_reported(tmp_path: Path) -> None:
    import json

    from workers.trainable import CONFIG_RESULT_KEY

    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t1", {"seed": 5})
    result = {**_result(1), CONFIG_RESULT_KEY: json.dumps({"model": {"hidden": [8, 4]}, "seed": 5})}
    trial.last_result = result
    cb.on_trial_result(iteration=1, trials=[trial], trial=trial, result=result)
    (child,) = _runs(MlflowClient(cb.tracking_uri), "trial")
    assert child.data.params == {"model.hidden": "[8, 4]", "seed": "5"}  # not re-resolved from the base
    assert CONFIG_RESULT_KEY not in child.data.metrics


def test_runs_get_readable_names_trial_tags_and_source_tags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tracking import SOURCE_GIT_COMMIT, SOURCE_NAME, SOURCE_TYPE, TrialNamer

    monkeypatch.setenv("AUTONORM_GIT_COMMIT", "0123abcd")
    base = {"model": {"layer": {"type": "linear"}}, "training": {"epochs": 3, "batch_size": 32}, "seed": 0}
    cb = _callback(
        tmp_path,
        base_config=base,
        run_namer=TrialNamer(
            "{model.layer.type}-B{training.batch_size}-s{seed}", plan_name="p", base_config=base
        ),
        trial_tags={"autonorm.phase": "confirmatory", "autonorm.arm": "{model.layer.type}"},
    )
    cb.prepare(fresh=True)
    cb.setup(total_num_samples=1)
    trial = FakeTrial("9f8e7_00000", {"model.layer.type": "corrected", "seed": 2})
    assert str(trial).startswith("trial_")  # what the run would otherwise be called
    _feed(cb, trial, range(1, 2))
    trial.status = "TERMINATED"
    cb.close(status="FINISHED", trials=[trial])
    # A study run opened by the study tracker gets the source tags too.
    tracker = StudyTracker(
        tracking_uri=cb.tracking_uri, experiment_name="exp", key="k", artifact_location=cb.artifact_location
    )
    tracker.open(tags={"autonorm.spec_hash": "abc"})

    client = MlflowClient(cb.tracking_uri)
    (child,) = _runs(client, "trial")
    assert child.info.run_name == "corrected-B32-s2"
    assert child.data.tags["autonorm.arm"] == "corrected"
    assert child.data.tags["autonorm.phase"] == "confirmatory"
    studies = _runs(client, "study")
    assert len(studies) == 2
    for run in [child, *studies]:
        assert run.data.tags[SOURCE_GIT_COMMIT] == "0123abcd"
        assert run.data.tags[SOURCE_TYPE] == "JOB"
        assert run.data.tags[SOURCE_NAME]


def test_without_a_namer_no_run_is_named_after_the_tune_trainable(tmp_path: Path) -> None:
    class TuneNamedTrial(FakeTrial):
        def __str__(self) -> str:
            return f"tune_entry_{self.trial_id}"

    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    trial = TuneNamedTrial("c0003", {"seed": 1})
    _feed(cb, trial, range(1, 2))
    cb.close(status="FINISHED", trials=[trial])
    (child,) = _runs(MlflowClient(cb.tracking_uri), "trial")
    assert child.info.run_name == "exp-c0003"


def test_a_trial_stopped_by_a_signal_is_killed_and_running_again_when_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workers.interrupts as interrupts

    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t1", {})
    _feed(cb, trial, range(1, 3))
    # Tune stops the trials of a study stopped by Ctrl-C through on_trial_complete, as a scheduler
    # would: with 2 of 3 epochs, that run must not look FINISHED.
    monkeypatch.setattr(interrupts, "_received", [2])
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=2, trials=[trial], trial=trial)
    client = MlflowClient(cb.tracking_uri)
    (run,) = _runs(client, "trial")
    assert run.info.status == "KILLED" and run.data.tags[TAG_TRIAL_STATUS] == "interrupted"
    monkeypatch.setattr(interrupts, "_received", [])
    # the next driver restores it: its first result makes the run RUNNING again, its end FINISHED
    resumed = pickle.loads(pickle.dumps(cb))
    resumed.setup()
    trial.status = "RUNNING"
    _feed(resumed, trial, range(2, 3))  # the epoch after its checkpoint, already in MLflow
    assert client.get_run(run.info.run_id).info.status == "RUNNING"
    _feed(resumed, trial, range(3, 4), final=3)
    trial.status = "TERMINATED"
    resumed.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[TAG_TRIAL_STATUS] == "completed"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2, 3]


def test_the_final_flush_delivers_what_mlflow_lacks_from_tunes_result_files(tmp_path: Path) -> None:
    # A driver that queued results during an outage died (or gave up): the next one reads them back.
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t1", {})
    _feed(cb, trial, range(1, 2))
    rerun = pickle.loads(pickle.dumps(cb))  # nothing queued in memory
    rows = [_result(e, "completed" if e == 3 else "running") for e in (1, 2, 2, 3)]  # 2: re-reported
    rows[1]["val_accuracy"] = float("nan")  # a column a row lacks reads back as NaN: not logged
    trial.status, trial.last_result = "TERMINATED", rows[-1]
    rerun.requeue({"t1": rows})
    rerun.close(status="FINISHED", trials=[trial])
    assert rerun.undelivered_trials() == []
    client = MlflowClient(cb.tracking_uri)
    (run,) = _runs(client, "trial")
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 3]


def test_a_restored_phase_fills_an_epoch_mlflow_lacks_below_its_last_logged_one(tmp_path: Path) -> None:
    # A driver killed after epoch 1 reached Tune's result file and checkpoint but not MLflow; the
    # trial resumed after epoch 1 under the next driver, which logged epochs 2 and 3 first.
    cb = _callback(tmp_path)
    cb.prepare(fresh=True)
    cb.setup()
    trial = FakeTrial("t1", {})
    rerun = pickle.loads(pickle.dumps(cb))
    rerun.setup()
    _feed(rerun, trial, range(2, 4), final=3)
    rows = [_result(e, "completed" if e == 3 else "running") for e in (1, 2, 3)]
    trial.status, trial.last_result = "TERMINATED", rows[-1]
    client = MlflowClient(cb.tracking_uri)
    rerun.requeue({"t1": rows})  # not restored: the rule "everything up to the last epoch is in" holds
    rerun.close_trials([trial])
    (run,) = _runs(client, "trial")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epoch")] == [2, 3]
    rerun.requeue({"t1": rows}, restored=True)  # a restored phase: its runs are checked for holes
    rerun.close_trials([trial])
    history = client.get_metric_history(run.info.run_id, "epoch")
    assert sorted(m.step for m in history) == [1, 2, 3]  # filled once
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")) == [1, 2, 3]
    assert client.get_run(run.info.run_id).data.metrics["epoch"] == 3  # the latest is still the last
    rerun.close_trials([trial])  # nothing left to fill: no second copy
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch")) == [1, 2, 3]


@pytest.mark.parametrize(
    ("raw", "expected"), [("", 2.0), ("0", 0.0), ("0.5", 0.5), ("-3", 0.0), ("soon", 2.0)]
)
def test_the_result_flush_window_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: float
) -> None:
    monkeypatch.setenv("AUTONORM_RESULT_FLUSH_S", raw)
    assert RetryPolicy().result_flush_s == expected
    assert RetryPolicy(result_flush_s=7.0).result_flush_s == 7.0  # an explicit value wins
