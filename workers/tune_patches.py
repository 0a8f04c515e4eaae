"""Process-wide changes to Ray Tune's own machinery, made once per driver (private Ray API, pinned by
tests): no credentials in the trial actors' runtime_env, no experiment snapshot when nothing changed,
no error for an old checkpoint that is already gone, no staging folder shared by two studies, no file
half written on local storage by a killed driver, and a snapshot that costs the driver less per
result (compact JSON, no statistics of stacked members' keys, no TensorBoard event files)."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import types
import uuid
from typing import Any

from workers.tune_state import book

logger = logging.getLogger(__name__)

# Ray Tune copies these from the driver's environment into every trainable actor's runtime_env,
# and Ray's runtime-env agent writes that runtime_env verbatim into its log files: the S3 secret
# would end up in session logs (and in what the dashboard shows). Trial processes get credentials
# the way every other Ray process does: inherited by a local cluster, from the node's own
# environment (Kubernetes Secrets, instance profiles) on a real one.
_CREDENTIAL_ENV_VARS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


def _stop_credential_propagation() -> None:
    """Remove credential names from Tune's env propagation list (private Ray API, pinned by tests)."""
    from ray.tune.execution import class_cache

    propagated = set(class_cache.ENV_VARS_TO_PROPAGATE)
    class_cache.ENV_VARS_TO_PROPAGATE = propagated - _CREDENTIAL_ENV_VARS


def _trials_state(controller: Any) -> tuple[Any, ...]:
    """What Tune's experiment snapshot records of the trials, in a form that changes with it: how
    many there are in each of Tune's status sets, and for each running or paused trial its status,
    the time of its last result (a result, a checkpoint, a searcher or scheduler update all come with
    one), failures and error file. Equal between two loop steps: nothing to save again. Read from
    Tune's status sets, not from every trial: the loop steps ~10 times a second, and a pass over a
    1,000-trial study's trials at each step was a cost per trial that grew with the study."""
    live = (*controller._running_trials, *controller._paused_trials)
    return (
        len(controller._trials),
        len(controller._pending_trials),
        len(controller._stopped_trials),
        len(controller._failed_trials),
        frozenset(
            (
                t.trial_id,
                t.status,
                t.run_metadata.last_result_time,
                t.run_metadata.num_failures,
                t.run_metadata.error_filename,
            )
            for t in live
        ),
    )


def _skip_idle_snapshots() -> None:
    """Tune saves its experiment state at every step of its loop here (``TUNE_GLOBAL_CHECKPOINT_S=0``,
    so that a driver killed right after a trial finished does not run it again), and the loop steps
    every 0.1 s while it waits for a trial actor or a result: about ten identical snapshots a second,
    each a JSON dump of every trial, the searcher's and callbacks' state and a background copy to the
    study's storage (measured: ~156 snapshots and ~0.9 of 3.1 driver CPU s for a two-phase tiny
    study). A snapshot is skipped when no trial changed since the last one saved; forced and final
    snapshots (``force``/``wait``, or Tune's own forced sync after trial checkpoints) always run.
    Wraps ``TuneController.checkpoint`` once per process (private Ray API, pinned by a test)."""
    from ray.tune.execution.tune_controller import TuneController

    if getattr(TuneController.checkpoint, "_autonorm_skips_idle", False):
        return
    original = TuneController.checkpoint

    @functools.wraps(original)  # keeps Tune's signature visible (the test that pins the API reads it)
    def checkpoint(self: Any, force: bool = False, wait: bool = False) -> None:
        manager = self._checkpoint_manager
        state = _trials_state(self)
        notes = book(self)  # not on the controller: Tune writes its __dict__ into every snapshot
        if not (force or wait or manager._should_force_sync_up) and state == notes.saved_state:
            return
        saved_at = manager._last_save_time
        original(self, force=force, wait=wait)
        if manager._last_save_time != saved_at:
            notes.saved_state = state

    checkpoint._autonorm_skips_idle = True  # type: ignore[attr-defined]
    TuneController.checkpoint = checkpoint  # type: ignore[method-assign]


def _delete_unless_gone(original: Any) -> Any:
    """Ray's ``_delete_fs_path`` for the checkpoint manager, a no-op for a path that is already gone."""

    @functools.wraps(original)
    def delete(fs: Any, fs_path: str) -> None:
        import pyarrow.fs

        try:
            gone = fs.get_file_info(fs_path).type == pyarrow.fs.FileType.NotFound
        except Exception:
            gone = False  # Ray's own call says what is wrong with the storage
        if gone:
            logger.info("old checkpoint %s is already gone; nothing to delete", fs_path)
            return
        original(fs, fs_path)

    delete._autonorm_unless_gone = True  # type: ignore[attr-defined]
    return delete


def _tolerate_gone_checkpoints() -> None:
    """A trial's checkpoint manager (kept in Tune's experiment state) deletes a trial's oldest
    checkpoint when a new one comes (``CheckpointConfig(num_to_keep=2)``), *then* the state is
    saved. A driver killed in between leaves a state that still lists the deleted folder, and the
    next driver deletes it again at the trial's next checkpoint: Ray's ``_delete_fs_path`` raises
    ``FileNotFoundError`` for a missing path (``_is_directory``, outside its own ``try``), which
    aborts ``Trial.on_checkpoint`` half-way. Tune then logs ``ERROR ... Error handling checkpoint``
    with the traceback, and the new checkpoint's index and the trial's saved state are not updated
    (a later restore resumes from an older checkpoint). A folder that is already gone is what the
    deletion wanted: it is skipped (said at INFO), every other deletion runs as before, failures
    included. Replaces the name in ``ray.train._internal.checkpoint_manager`` once per process
    (private Ray API, pinned by a test)."""
    from ray.train._internal import checkpoint_manager

    original = getattr(checkpoint_manager, "_delete_fs_path")  # noqa: B009 - imported there, not exported
    if getattr(original, "_autonorm_unless_gone", False):
        return
    setattr(checkpoint_manager, "_delete_fs_path", _delete_unless_gone(original))  # noqa: B010


def _unique_staging(original: Any) -> Any:
    """``StorageContext.__init__`` whose session timestamp also names this driver process."""

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._timestamp = f"{self._timestamp}_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    init._autonorm_unique_staging = True  # type: ignore[attr-defined]
    return init


def _unique_staging_dirs() -> None:
    """Tune stages every trial's files on the node under ``<ray session>/artifacts/<timestamp>/
    <experiment name>/`` before it copies them to the study's storage, the timestamp in whole seconds
    (``StorageContext._timestamp``, "to avoid conflicts when multiple training jobs run with the same
    name in the same cluster"). Two studies on one cluster whose phases have the same name
    (``confirm-epochs`` of two batch-size studies) and start within the same second share that
    folder: each study's storage then receives the other's trial folders too (found by the
    four-study concurrency test, issue #40). The timestamp is made unique per driver and per
    experiment; it is set once on the driver and travels with the pickled context to the trials and
    into Tune's experiment state (a resumed study keeps its own). Wraps
    ``ray.train._internal.storage.StorageContext.__init__`` once per process (private Ray API,
    pinned by a test)."""
    from ray.train._internal.storage import StorageContext

    if getattr(StorageContext.__init__, "_autonorm_unique_staging", False):
        return
    StorageContext.__init__ = _unique_staging(StorageContext.__init__)  # type: ignore[method-assign]


def _whole_file_sync(original: Any) -> Any:
    """``_FilesystemSyncer._sync_up_command`` that uploads whole files to a local destination."""

    @functools.wraps(original)
    def sync_up_command(self: Any, local_path: str, uri: str, exclude: list[str] | None = None) -> Any:
        from workers.uploads import is_local, upload_tree

        if exclude or not is_local(self.storage_filesystem):
            return original(self, local_path, uri, exclude)
        return upload_tree, {"local_path": local_path, "fs_path": uri}

    sync_up_command._autonorm_whole_files = True  # type: ignore[attr-defined]
    return sync_up_command


def _whole_file_uploads() -> None:
    """Tune's background copy of the driver's staging folder to a study's local storage writes each
    file whole (a temporary file renamed over it) and skips files already there: a SIGKILL
    mid-copy left an empty ``tuner.pkl`` that no rerun could restore (workers/uploads.py). Wraps
    ``ray.train._internal.storage._FilesystemSyncer._sync_up_command`` once per process (private
    Ray API, pinned by a test)."""
    from ray.train._internal.storage import _FilesystemSyncer

    if getattr(_FilesystemSyncer._sync_up_command, "_autonorm_whole_files", False):
        return
    _FilesystemSyncer._sync_up_command = _whole_file_sync(_FilesystemSyncer._sync_up_command)  # type: ignore[method-assign]


# ------------------------------------------------------------------------- what a result costs the driver
#
# Tune snapshots its experiment state at every trial start, result and end here (see
# _skip_idle_snapshots), and a stacked group's result carries every member's metrics (``<key>@m<k>``,
# workers/members.py). Profiled on the batch-size `local` preset stacked (cProfile of the driver, 1,800
# results, 2,051 snapshots): 25 s in re-encoding changed trials' states, 15 s in Tune's TensorBoard
# logger (workers/tune_loggers.py), 8 s in writing the snapshot, on a machine whose two cores the
# trials need. Private Ray API, pinned by tests/workers/test_units.py.


class _CompactJson(types.ModuleType):
    """The ``json`` module, as Tune's trial-state modules see it, minus the pretty-printing: ``dumps``
    ignores ``indent`` and ``dump`` writes one ``dumps`` string. Python's C encoder only runs for a
    one-shot encode without ``indent``: Tune's ``json.dumps(state, indent=2, ...)`` and its streaming
    ``json.dump`` both ran the pure-Python encoder, ~5x slower. The JSON read back is the same."""

    def __init__(self) -> None:
        super().__init__("json")

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    @staticmethod
    def dumps(obj: Any, **kwargs: Any) -> str:
        kwargs.pop("indent", None)
        return json.dumps(obj, **kwargs)

    @staticmethod
    def dump(obj: Any, fp: Any, **kwargs: Any) -> None:  # ``cls`` is the encoder, as json.dump's
        fp.write(_CompactJson.dumps(obj, **kwargs))


#: The Ray modules whose ``json`` is :class:`_CompactJson`: a trial's state and its run metadata
#: (encoded again at every result of that trial) and the experiment snapshot (written at every one).
_COMPACT_JSON_MODULES = (
    "ray.tune.experiment.trial",
    "ray.tune.trainable.metadata",
    "ray.tune.execution.tune_controller",
)


def _compact_snapshot_json() -> None:
    """Tune's trial states and experiment snapshot encoded by Python's C JSON encoder (one line, no
    indent: every reader parses it the same). Replaces the ``json`` name of the modules in
    :data:`_COMPACT_JSON_MODULES` once per process."""
    import importlib

    for name in _COMPACT_JSON_MODULES:
        module = importlib.import_module(name)
        if not isinstance(getattr(module, "json", None), _CompactJson):
            module.json = _CompactJson()  # type: ignore[attr-defined]


_MEMBER_KEY = re.compile(r"@m\d+$")


def _skipping_member_keys(original: Any) -> Any:
    @functools.wraps(original)
    def update_metric(self: Any, metric: str, value: Any, step: int | None = 1) -> None:
        if _MEMBER_KEY.search(metric):
            return
        original(self, metric, value, step)

    update_metric._autonorm_skips_members = True  # type: ignore[attr-defined]
    return update_metric


def _no_member_metric_statistics() -> None:
    """Tune keeps, for every numeric key of a trial's results, its max, min, mean, last and last-5 and
    last-10 means, with the last values in deques that its snapshot pickles to hex: for a stacked
    group of K members that is K times every metric (35 of a 6-member group's 100 KB state, encoded
    again at every result). Nothing reads them for members (the service reads each member's results,
    workers/members.py); the group's own keys keep them. Wraps
    ``_TrainingRunMetadata.update_metric`` once per process."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    if getattr(_TrainingRunMetadata.update_metric, "_autonorm_skips_members", False):
        return
    _TrainingRunMetadata.update_metric = _skipping_member_keys(_TrainingRunMetadata.update_metric)  # type: ignore[method-assign]


def cheaper_results() -> None:
    """The driver-side patches of this section, once per process."""
    _compact_snapshot_json()
    _no_member_metric_statistics()
