"""Storage resolution, runner helpers and Ray's log lines (no Ray cluster needed; the progress line:
test_progress.py)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.fs
import pytest

from workers.optuna_export import export_optuna_study
from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig, expected_trials
from workers.preflight import _max_epochs, _tracking_uri
from workers.progress import CHECKPOINT_LINE, quiet_checkpoint_logs
from workers.storage import resolve_storage


def test_local_storage_is_made_absolute(tmp_path: Path) -> None:
    storage = resolve_storage(StorageConfig(path="runs"), base_dir=tmp_path)
    assert storage.is_local and storage.filesystem is None
    assert storage.storage_path == str(tmp_path / "runs")
    assert storage.experiment_path("s") == str(tmp_path / "runs" / "s")
    assert resolve_storage(StorageConfig(path=f"file://{tmp_path}/x")).storage_path == str(tmp_path / "x")


def test_s3_storage_uses_the_endpoint_and_leaves_keys_to_each_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    storage = resolve_storage(
        StorageConfig(path="s3://bucket/some/prefix/", endpoint_override="http://127.0.0.1:8333")
    )
    assert not storage.is_local
    assert isinstance(storage.filesystem, pyarrow.fs.S3FileSystem)
    assert storage.storage_path == "bucket/some/prefix"
    assert storage.experiment_uri("s") == "s3://bucket/some/prefix/s"
    # What the trial workers receive: the filesystem as pickled; keys are resolved in each process.
    options = storage.filesystem.__reduce__()[1][0]
    assert options["endpoint_override"] == "127.0.0.1:8333"
    assert options["scheme"] == "http"
    assert options["access_key"] is None and options["secret_key"] is None
    assert options["force_virtual_addressing"] is False


@pytest.mark.parametrize(
    ("path", "match"), [("gs://b/p", "valid: a local path"), ("s3:///p", "names no bucket")]
)
def test_bad_storage_paths(path: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_storage(StorageConfig(path=path))


def _plan(**kwargs: object) -> StudyPlan:
    defaults: dict[str, object] = {"name": "s", "base_config": {"training": {"epochs": 6}}}
    defaults.update(kwargs)
    return StudyPlan(**defaults)  # type: ignore[arg-type]


def test_expected_trials_and_asha_horizon() -> None:
    assert expected_trials(_plan(num_samples=5)) == 5
    grid = _plan(sampler=SamplerConfig(type="grid"), grid=(("a", (1, 2, 3)), ("b", (0, 1))), num_samples=2)
    assert expected_trials(grid) == 12
    assert _max_epochs(_plan()) == 6
    assert _max_epochs(_plan(space=(ParamDef("training.epochs", "int", low=2, high=9),))) == 9
    assert _max_epochs(_plan(base_config={"training": {"budget": "updates", "max_updates": 50}})) >= 10**6


def test_tracking_uri_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = resolve_storage(StorageConfig(path=str(tmp_path)))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert _tracking_uri(_plan(), local) == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert _tracking_uri(_plan(), local) == "http://127.0.0.1:5000"  # env wins over the default
    spec = _plan(tracking=TrackingConfig(uri="http://mlflow:5000"))
    assert _tracking_uri(spec, local) == "http://mlflow:5000"  # the spec wins over the env
    with pytest.raises(ValueError, match="relative sqlite path"):
        _tracking_uri(_plan(tracking=TrackingConfig(uri="sqlite:///mlflow.db")), local)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    remote = resolve_storage(StorageConfig(path="s3://b/p"))
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI"):
        _tracking_uri(_plan(), remote)


def test_s3_storage_pickles_without_the_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tune pickles the filesystem into tuner.pkl in the study's own prefix: keys must not travel.
    import pickle

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPLANTEDKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planted-secret-value")
    storage = resolve_storage(StorageConfig(path="s3://bucket/runs", endpoint_override="http://127.0.0.1:1"))
    blob = pickle.dumps(storage.filesystem)
    assert isinstance(storage.filesystem, pyarrow.fs.S3FileSystem)
    assert b"planted-secret-value" not in blob
    assert b"AKIAPLANTEDKEY" not in blob


def test_tune_no_longer_propagates_credentials() -> None:
    # Pins the private Ray list we edit: if Ray renames it, this fails instead of leaking silently.
    from ray.tune.execution import class_cache

    from workers.ray_internals import _CREDENTIAL_ENV_VARS, stop_credential_propagation

    stop_credential_propagation()
    assert not (_CREDENTIAL_ENV_VARS & set(class_cache.ENV_VARS_TO_PROPAGATE))
    assert "PL_DISABLE_FORK" in class_cache.DEFAULT_ENV_VARS  # the module we patch is still the one we know


class _Dispatcher:
    """The two attributes of Ray's worker-output dispatcher that the filter uses."""

    def __init__(self, handler: Any) -> None:
        import threading

        self._lock = threading.Lock()
        self.handlers = [("ray_print_logs", handler)]

    def emit(self, data: dict[str, Any]) -> None:
        for _, handle in self.handlers:
            handle(data)


def test_checkpoint_lines_are_dropped_from_the_driver_output_only() -> None:
    seen: list[list[str]] = []
    dispatcher = _Dispatcher(lambda data: seen.append(list(data["lines"])))
    assert quiet_checkpoint_logs(dispatcher, environ={})
    assert quiet_checkpoint_logs(dispatcher, environ={})  # idempotent: wrapped once
    ckpt = f"{CHECKPOINT_LINE} at: Checkpoint(filesystem=local, path=/r/s/trial_1/checkpoint_000003)"
    dispatcher.emit({"pid": 7, "is_err": True, "lines": [ckpt]})
    dispatcher.emit({"pid": 7, "is_err": True, "lines": ["epoch 3 done", ckpt, "Traceback (most recent..."]})
    assert seen == [["epoch 3 done", "Traceback (most recent..."]]
    # Opting out keeps them.
    kept: list[list[str]] = []
    other = _Dispatcher(lambda data: kept.append(list(data["lines"])))
    assert not quiet_checkpoint_logs(other, environ={"AUTONORM_SHOW_CHECKPOINT_LOGS": "1"})
    other.emit({"lines": [ckpt]})
    assert kept == [[ckpt]]


def test_ray_still_logs_the_checkpoint_line_we_filter() -> None:
    # Pins the message and the private dispatcher we wrap: if Ray renames either, this fails.
    import inspect

    import ray._private.ray_logging as ray_logging
    import ray.train._internal.storage as train_storage

    assert CHECKPOINT_LINE in inspect.getsource(train_storage)
    dispatcher = ray_logging.global_worker_stdstream_dispatcher
    assert isinstance(dispatcher.handlers, list) and hasattr(dispatcher, "_lock")


def test_optuna_export_copies_finished_trials_once(tmp_path: Path) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    source = optuna.create_study(direction="maximize")
    values = []
    for _ in range(3):
        trial = source.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
        values.append(trial.params["x"])
        source.tell(trial, values[-1])
    pruned = source.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    source.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    running = source.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    db = tmp_path / "optuna.db"
    assert export_optuna_study(source, db, "plan") == 4  # the running trial is not copied yet
    source.tell(running, state=optuna.trial.TrialState.FAIL)
    assert export_optuna_study(source, db, "plan") == 1  # only what finished since
    loaded = optuna.load_study(storage=f"sqlite:///{db}", study_name="plan")
    trials = loaded.get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3 + ["PRUNED", "FAIL"]
    assert [t.value for t in trials[:3]] == values
    assert [t.params["x"] for t in trials[:3]] == values
    assert loaded.direction == optuna.study.StudyDirection.MAXIMIZE
    assert loaded.best_value == max(values)


def test_a_failed_background_sync_is_one_warning_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What Ray Train logs when Tune renamed a state file while its background sync copied it.
    import logging
    import traceback

    from workers.progress import SyncFailureOneLine

    SyncFailureOneLine.install()
    SyncFailureOneLine.install()  # once per process, however often a study starts
    syncer = logging.getLogger("ray.train._internal.syncer")
    assert sum(isinstance(f, SyncFailureOneLine) for f in syncer.filters) == 1
    try:
        raise FileNotFoundError("[Errno 2] Failed to open local file '.tmp-basic-variant-state.json'")
    except FileNotFoundError:
        text = traceback.format_exc()
    with caplog.at_level(logging.WARNING, logger="ray.train._internal.syncer"):
        syncer.warning(f"Last sync command failed with the following error:\n{text}")
        syncer.warning("Last sync still in progress, skipping sync down of a to b")
    first, other = (r.getMessage() for r in caplog.records)
    assert "Traceback" not in first and "\n" not in first
    assert "FileNotFoundError" in first and "next sync" in first
    assert other == "Last sync still in progress, skipping sync down of a to b"  # other warnings untouched


def test_a_failed_wait_for_the_experiment_state_sync_is_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What Tune logs (an error with exc_info) when the sync it waits for at the end of a phase had
    # listed a state file Tune renamed meanwhile; seen in a quickstart run under load.
    import logging

    from workers.progress import SyncFailureOneLine

    SyncFailureOneLine.install()
    SyncFailureOneLine.install()
    state = logging.getLogger("ray.tune.execution.experiment_state")
    assert sum(isinstance(f, SyncFailureOneLine) for f in state.filters) == 1
    with caplog.at_level(logging.WARNING, logger="ray.tune.execution.experiment_state"):
        try:
            raise FileNotFoundError("[Errno 2] Failed to open local file '.tmp-experiment_state.json'")
        except FileNotFoundError:
            state.error(
                "Saving experiment state to storage at '/x/study/tune' failed with exception: ", exc_info=True
            )
        state.warning("Saving the experiment state took ~3.00 seconds")
    first, other = caplog.records
    text = caplog.text
    assert "Traceback" not in text and first.exc_info is None
    assert "\n" not in first.getMessage()
    assert "FileNotFoundError" in first.getMessage() and "next sync" in first.getMessage()
    assert other.getMessage() == "Saving the experiment state took ~3.00 seconds"  # other lines untouched


def test_optuna_copy_for_remote_storage_leaves_no_scratch_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Remote storage (a pyarrow filesystem; the local one stands in for S3): the study's optuna.db is
    # assembled in a scratch directory, uploaded, logged, and the scratch directory removed.
    import tempfile

    import optuna
    import pyarrow.fs

    from workers.optuna_export import OPTUNA_DB, OptunaExport
    from workers.plan import StudyPlan
    from workers.storage import ResolvedStorage

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))

    class Searcher:
        _ot_study = study

    logged: list[bytes] = []

    class Tracker:
        def log_file(self, path: Path) -> None:
            logged.append(path.read_bytes())  # the file exists while it is logged

    bucket = tmp_path / "bucket"
    (bucket / "plan").mkdir(parents=True)
    storage = ResolvedStorage(str(bucket), pyarrow.fs.LocalFileSystem(), "s3://bucket")
    plan = StudyPlan(name="plan", base_config={})
    export = OptunaExport.start(plan, storage, f"{bucket}/plan", Searcher())
    assert export is not None
    export.finish(Tracker())  # type: ignore[arg-type]
    assert (bucket / "plan" / OPTUNA_DB).is_file() and logged and logged[0]
    assert list(scratch_root.iterdir()) == []


def test_the_optuna_export_runs_in_a_child_process_and_a_failure_is_only_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #40: optuna.db is written by ``python -m workers.optuna_export`` while the driver goes
    on (:class:`OptunaExport`); what it writes is what the in-process copy writes, and a child that
    fails costs the study a logged error, not a traceback or its result."""
    import optuna

    from workers.optuna_export import OPTUNA_DB, OptunaExport
    from workers.plan import StudyPlan
    from workers.storage import ResolvedStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    source = optuna.create_study(direction="minimize")
    for i in range(5):
        trial = source.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
        source.tell(trial, float(i))
    source.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})  # still running: not copied

    class Searcher:
        _ot_study = source

    logged: list[Path] = []

    class Tracker:
        def log_file(self, path: Path) -> None:
            logged.append(path)

    plan = StudyPlan(name="plan", base_config={})
    storage = ResolvedStorage(str(tmp_path), None, str(tmp_path))
    (tmp_path / "plan").mkdir()
    export = OptunaExport.start(plan, storage, str(tmp_path / "plan"), Searcher())
    assert export is not None and export.proc.pid != os.getpid()
    export.finish(Tracker())  # type: ignore[arg-type]
    assert logged == [tmp_path / "plan" / OPTUNA_DB] and not export.scratch.exists()
    in_process = tmp_path / "in_process.db"
    export_optuna_study(source, in_process, "plan")

    def rows(db: Path) -> list[tuple[object, ...]]:
        loaded = optuna.load_study(storage=f"sqlite:///{db}", study_name="plan")
        return [(t.number, t.state, t.value, t.params, t.user_attrs) for t in loaded.get_trials()]

    assert rows(logged[0]) == rows(in_process) and len(rows(in_process)) == 5
    # The experiment folder is gone: the child cannot write there. Said once, nothing raised.
    broken = OptunaExport.start(plan, storage, str(tmp_path / "missing" / "plan"), Searcher())
    assert broken is not None
    broken.finish(Tracker())  # type: ignore[arg-type]
    assert "could not save the Optuna study of plan" in caplog.text and len(logged) == 1


def test_an_old_checkpoint_already_deleted_by_a_killed_driver_is_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue #40: a driver killed between deleting a trial's oldest checkpoint and saving its state
    # leaves a state that still lists the folder; the next driver deleted it again and Ray raised
    # FileNotFoundError inside Trial.on_checkpoint (Tune: "ERROR ... Error handling checkpoint" with
    # a traceback, the trial's checkpoint index and saved state not updated).
    import logging

    from ray import tune
    from ray.train._internal import storage as ray_storage
    from ray.train._internal.checkpoint_manager import _CheckpointManager
    from ray.train._internal.session import _TrainingResult

    from workers.ray_internals import tolerate_gone_checkpoints

    def result(index: int) -> _TrainingResult:
        folder = tmp_path / f"checkpoint_{index:06d}"
        folder.mkdir()
        (folder / "state.pt").write_bytes(b"x")
        return _TrainingResult(checkpoint=tune.Checkpoint(str(folder)), metrics={"epoch": index + 1})

    gone = tmp_path / "gone"
    with pytest.raises(FileNotFoundError):  # Ray's own deletion, which the patch guards (pinned)
        ray_storage._delete_fs_path(tune.Checkpoint(str(gone)).filesystem, str(gone))
    tolerate_gone_checkpoints()
    tolerate_gone_checkpoints()  # once per process
    manager = _CheckpointManager(tune.CheckpointConfig(num_to_keep=2))
    first, second = result(0), result(1)
    manager.register_checkpoint(first)
    manager.register_checkpoint(second)
    import shutil

    assert first.checkpoint is not None
    shutil.rmtree(first.checkpoint.path)  # what the killed driver had already done
    with caplog.at_level(logging.INFO):
        manager.register_checkpoint(result(2))
        manager.register_checkpoint(result(3))  # an existing old folder is still deleted
    assert not (tmp_path / "checkpoint_000001").exists()
    assert [r.checkpoint.path for r in manager._checkpoint_results if r.checkpoint] == [
        str(tmp_path / "checkpoint_000002"),
        str(tmp_path / "checkpoint_000003"),
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("already gone" in r.getMessage() for r in caplog.records)


def test_a_checkpoint_deletion_that_fails_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    # Only a folder that is already gone is skipped: a deletion that fails is Ray's error, as before.
    import logging

    from workers.ray_internals import _delete_unless_gone

    calls: list[str] = []

    class Refusing:
        def get_file_info(self, path: str) -> Any:
            return SimpleNamespace(type=pyarrow.fs.FileType.Directory, is_file=False)

        def delete_dir(self, path: str) -> None:
            calls.append(path)
            raise PermissionError(path)

    def ray_delete(fs: Any, fs_path: str) -> None:
        try:
            fs.delete_dir(fs_path)
        except Exception:
            logging.getLogger("ray.train._internal.storage").exception("Caught exception when deleting")

    with caplog.at_level(logging.ERROR):
        _delete_unless_gone(ray_delete)(Refusing(), "/x/checkpoint_000001")
    assert calls == ["/x/checkpoint_000001"]
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_two_studies_starting_in_the_same_second_stage_their_trials_apart(tmp_path: Path) -> None:
    # Tune's staging folder is <session>/artifacts/<timestamp>/<experiment>/: with whole-second
    # timestamps, two studies' phases of one name that start together shared it (issue #40).
    from ray.train._internal.storage import StorageContext

    from workers.ray_internals import unique_staging_dirs

    if not getattr(StorageContext.__init__, "_autonorm_unique_staging", False):
        # Ray's own timestamp: whole seconds, nothing else (pinned: the reason for the patch)
        stamp = StorageContext(str(tmp_path / "a"), "confirm-epochs")._timestamp
        assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", stamp), stamp
    unique_staging_dirs()
    unique_staging_dirs()  # once per process
    patched = [StorageContext(str(tmp_path / name), "confirm-epochs") for name in ("a", "b")]
    assert patched[0]._timestamp != patched[1]._timestamp
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_[0-9a-f]{6}", p._timestamp) for p in patched)
    assert str(os.getpid()) in patched[0]._timestamp
    # It travels with the context (pickled to trials and into Tune's experiment state).
    import pickle

    assert pickle.loads(pickle.dumps(patched[1]))._timestamp == patched[1]._timestamp


# ---- what a result costs the driver (workers/ray_internals.py, workers/tune_loggers.py) -------------


def test_trial_states_and_snapshots_are_written_as_compact_json_that_reads_back_the_same() -> None:
    import inspect
    import json

    from ray.tune.execution import tune_controller
    from ray.tune.experiment import trial as trial_module
    from ray.tune.experiment.trial import Trial
    from ray.tune.trainable import metadata

    from workers.ray_internals import compact_snapshot_json

    # Pinned: what the patch replaces (Tune's pretty-printed and streamed encodes) is still there.
    assert "json.dumps(state, indent=2" in inspect.getsource(Trial.get_json_state)
    assert "json.dumps(data, indent=2" in inspect.getsource(metadata._TrainingRunMetadata.get_json_state)
    assert "json.dump(runner_state, f" in inspect.getsource(tune_controller.TuneController.save_to_dir)
    compact_snapshot_json()
    compact_snapshot_json()  # once per process
    assert all(type(m.json).__name__ == "_CompactJson" for m in (trial_module, metadata, tune_controller))
    trial = Trial("__fake", config={"seed": 3, "training.lr": 0.1}, stub=True)
    trial.run_metadata.update_metric("val_accuracy", 0.5, step=1)
    state, meta = trial.get_json_state()
    assert "\n" not in state and "\n" not in meta  # one line: the C encoder ran
    from ray.tune.utils.serialization import TuneFunctionEncoder

    pretty = trial.__getstate__()
    pretty.pop("run_metadata", None)
    assert json.loads(state) == json.loads(json.dumps(pretty, indent=2, cls=TuneFunctionEncoder))
    assert json.loads(state)["config"] == {"seed": 3, "training.lr": 0.1}
    assert json.loads(meta)["metric_analysis"]["val_accuracy"]["last"] == 0.5
    out = io.StringIO()
    tune_controller.json.dump({"a": [1, 2.5, "x"]}, out, indent=2, cls=json.JSONEncoder)
    assert out.getvalue() == '{"a": [1, 2.5, "x"]}'


def test_tune_keeps_no_statistics_of_stacked_members_keys() -> None:
    from ray.tune.experiment.trial import Trial

    from workers.ray_internals import no_member_metric_statistics

    no_member_metric_statistics()
    no_member_metric_statistics()  # once per process
    trial = Trial("__fake", stub=True)
    trial.update_last_result({"epoch": 1, "members": 2.0, "val_accuracy@m0": 0.5, "val_accuracy@m1": 0.7})
    analysis = trial.run_metadata.metric_analysis
    assert "epoch" in analysis and "members" in analysis  # the group's own keys: as Tune keeps them
    assert not [k for k in analysis if "@m" in k]
    assert trial.last_result["val_accuracy@m1"] == 0.7  # the result itself is untouched


def test_a_study_runs_tunes_csv_and_json_loggers_and_no_tensorboard() -> None:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    from workers.tune_loggers import NoTensorBoard, study_loggers

    callbacks = _create_default_callbacks(study_loggers(), air_verbosity=None)
    loggers = [
        c for c in callbacks if isinstance(c, CSVLoggerCallback | JsonLoggerCallback | TBXLoggerCallback)
    ]
    assert sorted(type(c).__name__ for c in loggers) == [
        "CSVLoggerCallback",
        "JsonLoggerCallback",
        "NoTensorBoard",
    ]
    quiet = next(c for c in loggers if isinstance(c, NoTensorBoard))
    quiet.log_trial_result(1, SimpleNamespace(), {"epoch": 1})  # writes nothing, needs no writer
    # without it Tune adds its own (pinned: the reason for NoTensorBoard)
    plain = _create_default_callbacks([CSVLoggerCallback(), JsonLoggerCallback()], air_verbosity=None)
    assert any(type(c) is TBXLoggerCallback for c in plain)
