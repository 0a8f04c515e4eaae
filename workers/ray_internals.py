"""Every place this project touches Ray's private internals, in one module (issue #51).

Ray is pinned at 2.60.0 (:data:`RAY_VERSION_CHECKED`); each touch point below was checked against
that release and is pinned by a test of ``tests/workers/`` that fails when the private name is gone
or changed shape (``test_ray_internals.py`` holds those without a home elsewhere). No other module of
``autonorm_core/``, ``workers/`` or ``studies/`` imports from ``ray._private``, ``ray.*._internal``
or ``ray.tune.execution``, reads a private Ray attribute (:data:`PRIVATE_NAMES`), names a private
Ray logger or assigns an attribute of a Ray module, class or object: ``tests/test_layering.py``
scans for it. The other modules call the named functions here; the reasons stay in their
docstrings and in those of the functions below.

Replaced at run time (16 attributes of Ray; each once per process, each wrapper marked so that a
second install is a no-op), all checked against Ray 2.60.0:

1. ``ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE`` -- no S3 credentials copied into every
   trial actor's runtime_env (and from there into Ray's log files): :func:`stop_credential_propagation`.
2. ``ray.tune.execution.tune_controller.TuneController.checkpoint`` -- no experiment snapshot when
   no trial changed since the last one (``TUNE_GLOBAL_CHECKPOINT_S=0`` snapshots at every loop
   step); reads ``_running_trials``, ``_paused_trials``, ``_pending_trials``, ``_stopped_trials``,
   ``_failed_trials``, ``_trials``, ``_checkpoint_manager``, ``_should_force_sync_up`` and
   ``_last_save_time``: :func:`skip_idle_snapshots`.
3. ``ray.train._internal.checkpoint_manager._delete_fs_path`` -- an old checkpoint already deleted
   by a killed driver is not an error: :func:`tolerate_gone_checkpoints`.
4. ``ray.train._internal.storage.StorageContext.__init__`` (and its ``_timestamp``) -- a staging
   folder per driver, not per second: :func:`unique_staging_dirs`.
5. ``ray.train._internal.storage._FilesystemSyncer._sync_up_command`` -- whole files on local
   storage (a killed copy left an empty ``tuner.pkl``): :func:`whole_file_uploads`.
6.-8. ``json`` of ``ray.tune.experiment.trial``, ``ray.tune.trainable.metadata`` and
   ``ray.tune.execution.tune_controller`` -- Python's C encoder for every trial state and snapshot:
   :func:`compact_snapshot_json`.
9. ``ray.tune.trainable.metadata._TrainingRunMetadata.update_metric`` -- no statistics of stacked
   members' keys: :func:`no_member_metric_statistics`.
10. ``TuneController.save_to_dir`` -- finished trials written once (``workers/tune_state.py``),
    reading ``_get_trial_checkpoints``, ``_trials``, ``_stopped_trials``, ``_failed_trials``,
    ``_storage`` and ``_search_alg``: :func:`wrap_snapshot_io`, :func:`trial_checkpoints`,
    :func:`controller_trials`, :func:`stopped_trials`, :func:`failed_trials`,
    :func:`controller_storage`.
11. ``TuneController.resume`` -- the experiment's location known to the searcher it restores:
    :func:`wrap_snapshot_io`.
12. ``TuneController._restore_trials`` -- a restore reads the finished-trials files back:
    :func:`wrap_snapshot_io`.
13. ``ray.tune.analysis.experiment_analysis.ExperimentAnalysis._load_trials`` (reading ``_fs`` and
    ``_experiment_fs_path``) -- ``ExperimentAnalysis`` reads them back: :func:`wrap_snapshot_io`,
    :func:`analysis_location`.
14. ``ray.tune.analysis.experiment_analysis._loads_with_cloudpickle`` -- where that read merges
    them: :func:`wrap_snapshot_io`.
15. ``save_to_dir`` of the controller's searcher (``TuneController._search_alg``), shadowed on the
    instance for one snapshot -- the searcher pickled only when a trial came or ended:
    :func:`searcher_not_saved`.
16. ``handlers`` of ``ray._private.ray_logging.global_worker_stdstream_dispatcher`` (under its
    ``_lock``) -- what trial workers print goes to the study's ``driver.log`` (``workers/console.py``)
    and Ray's per-epoch checkpoint lines are dropped (``workers/progress.py``):
    :func:`worker_stream_dispatcher`, :func:`wrap_dispatcher_handlers`.

Read, not replaced (Ray 2.60.0):

- ``OptunaSearch._ot_trials``, ``_ot_study``, ``_completed_trials`` -- ``workers/search.py``'s
  completion hook tells Optuna PRUNED for a trial a scheduler stopped; ``workers/optuna_export.py``
  copies the study: :func:`optuna_trials`, :func:`optuna_study`, :func:`optuna_completed`,
  :func:`has_optuna_study`.
- ``TrialRunnerWrapper._tune_controller``, ``TuneController._pending_trials``, ``_paused_trials``
  -- the schedulers' next trial from Tune's sets of waiting trials (``workers/search.py``):
  :func:`unwrapped_controller`, :func:`pending_trials`, :func:`paused_trials`.
- ``Tuner._local_tuner._tune_config`` -- the searcher a Tuner ran with (restored in place after a
  restore): :func:`tuner_search_alg`.
- ``ray.train._internal.storage._upload_to_fs_path`` -- Ray's upload to remote storage
  (``workers/uploads.py``): :func:`upload_to_fs_path`.
- ``ray.tune.impl.tuner_internal._TUNER_PKL`` -- the name of Tune's ``tuner.pkl``, which the runner
  checks before a restore: :data:`TUNER_STATE_FILE`.
- ``ray._private.worker.filter_autoscaler_events`` -- what marks the autoscaler lines Ray prints:
  :data:`AUTOSCALER_EVENT`.
- Loggers ``ray.train._internal.storage`` (its per-epoch checkpoint line), ``ray.train._internal.syncer``
  and ``ray.tune.execution.experiment_state`` (a failed background sync): :data:`TRAIN_STORAGE_LOGGER`,
  :data:`TRAIN_SYNCER_LOGGER`, :data:`EXPERIMENT_STATE_LOGGER`.

- ``ray._private.runtime_env.packaging.RAY_PKG_PREFIX`` -- how Ray names an unpacked job
  ``working_dir`` package, which Ray deletes (``studies/entrypoints.py`` keeps no study there):
  :data:`RAY_PACKAGE_PREFIX`.
- ``ray.tune.tune.signal_interrupt_tune_run`` -- the name of the SIGUSR1 handler Tune installs in
  ``Tuner.fit``, which ``workers/interrupts.py`` calls to stop a study gracefully:
  :func:`is_tune_stop_handler`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import types
import uuid
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "AUTOSCALER_EVENT",
    "EXPERIMENT_STATE_LOGGER",
    "PRIVATE_NAMES",
    "RAY_PACKAGE_PREFIX",
    "RAY_VERSION_CHECKED",
    "TRAIN_STORAGE_LOGGER",
    "TRAIN_SYNCER_LOGGER",
    "TUNER_STATE_FILE",
    "analysis_location",
    "cheaper_results",
    "compact_snapshot_json",
    "controller_storage",
    "controller_trials",
    "failed_trials",
    "has_optuna_study",
    "is_tune_stop_handler",
    "no_member_metric_statistics",
    "optuna_completed",
    "optuna_study",
    "optuna_trials",
    "paused_trials",
    "pending_trials",
    "searcher_not_saved",
    "skip_idle_snapshots",
    "stop_credential_propagation",
    "stopped_trials",
    "tolerate_gone_checkpoints",
    "trial_checkpoints",
    "tuner_search_alg",
    "unique_staging_dirs",
    "unwrapped_controller",
    "upload_to_fs_path",
    "whole_file_uploads",
    "worker_stream_dispatcher",
    "wrap_dispatcher_handlers",
    "wrap_snapshot_io",
]

RAY_VERSION_CHECKED = "2.60.0"
"""The Ray release every touch point of this module was checked against (the pinned one)."""

PRIVATE_NAMES = (
    # Tune's controller and its experiment-state manager
    "_trials",
    "_running_trials",
    "_pending_trials",
    "_paused_trials",
    "_stopped_trials",
    "_failed_trials",
    "_checkpoint_manager",
    "_should_force_sync_up",
    "_last_save_time",
    "_get_trial_checkpoints",
    "_storage",
    "_search_alg",
    "_restore_trials",
    "_tune_controller",
    # the Tuner
    "_local_tuner",
    "_tune_config",
    "_TUNER_PKL",
    # ExperimentAnalysis
    "_load_trials",
    "_loads_with_cloudpickle",
    "_fs",
    "_experiment_fs_path",
    # Ray Train's storage
    "_delete_fs_path",
    "_FilesystemSyncer",
    "_sync_up_command",
    "_upload_to_fs_path",
    "_timestamp",
    "_TrainingRunMetadata",
    # OptunaSearch
    "_ot_trials",
    "_ot_study",
    "_completed_trials",
    # the worker-output dispatcher
    "_lock",
)
"""The private attribute names of Ray this module reads or replaces; no other module names them
(``tests/test_layering.py``)."""

TUNER_STATE_FILE = "tuner.pkl"
"""Tune's name for the Tuner's pickle in the experiment directory (``ray.tune.impl.tuner_internal.
_TUNER_PKL``)."""
AUTOSCALER_EVENT = ":event_summary:"
"""What marks an autoscaler line Ray would print (``ray._private.worker.filter_autoscaler_events``)."""
TRAIN_STORAGE_LOGGER = "ray.train._internal.storage"
"""Ray Train's storage logger: "Checkpoint successfully created" at every checkpoint a trial reports."""
TRAIN_SYNCER_LOGGER = "ray.train._internal.syncer"
"""Ray Train's syncer logger: "Last sync command failed" with a traceback."""
EXPERIMENT_STATE_LOGGER = "ray.tune.execution.experiment_state"
"""Tune's experiment-state logger: "Saving experiment state to storage at ... failed"."""
RAY_PACKAGE_PREFIX = "_ray_pkg_"
"""How Ray names an unpacked ``working_dir`` package (``ray._private.runtime_env.packaging.
RAY_PKG_PREFIX``)."""
TUNE_STOP_HANDLER = "signal_interrupt_tune_run"
"""The name of the SIGUSR1 handler ``Tuner.fit`` installs (``ray.tune.tune``)."""


def is_tune_stop_handler(handler: object) -> bool:
    """Whether ``handler`` (from ``signal.getsignal``) is Tune's graceful-stop handler."""
    return callable(handler) and getattr(handler, "__name__", "") == TUNE_STOP_HANDLER


logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ Tune's machinery, changed once per driver
#
# Process-wide changes to Ray Tune's own machinery, made once per driver (private Ray API, pinned by
# tests): no credentials in the trial actors' runtime_env, no experiment snapshot when nothing changed,
# no error for an old checkpoint that is already gone, no staging folder shared by two studies, no
# file half written on local storage by a killed driver, and a snapshot that costs the driver less per
# result (compact JSON, no statistics of stacked members' keys, no TensorBoard event files).

# Ray Tune copies these from the driver's environment into every trainable actor's runtime_env,
# and Ray's runtime-env agent writes that runtime_env verbatim into its log files: the S3 secret
# would end up in session logs (and in what the dashboard shows). Trial processes get credentials
# the way every other Ray process does: inherited by a local cluster, from the node's own
# environment (Kubernetes Secrets, instance profiles) on a real one.
_CREDENTIAL_ENV_VARS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


def stop_credential_propagation() -> None:
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


def skip_idle_snapshots(book: Callable[[Any], Any]) -> None:
    """Tune saves its experiment state at every step of its loop here (``TUNE_GLOBAL_CHECKPOINT_S=0``,
    so that a driver killed right after a trial finished does not run it again), and the loop steps
    every 0.1 s while it waits for a trial actor or a result: about ten identical snapshots a second,
    each a JSON dump of every trial, the searcher's and callbacks' state and a background copy to the
    study's storage (measured: ~156 snapshots and ~0.9 of 3.1 driver CPU s for a two-phase tiny
    study). A snapshot is skipped when no trial changed since the last one saved; forced and final
    snapshots (``force``/``wait``, or Tune's own forced sync after trial checkpoints) always run.
    Wraps ``TuneController.checkpoint`` once per process (private Ray API, pinned by a test).
    ``book`` is :func:`workers.tune_state.book` (the controller's notes; passed in, so that this
    module imports none of ours: tune_state reads Tune through it)."""
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


def tolerate_gone_checkpoints() -> None:
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


def unique_staging_dirs() -> None:
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


def _whole_file_sync(original: Any, is_local: Callable[[Any], bool], upload_tree: Callable[..., Any]) -> Any:
    """``_FilesystemSyncer._sync_up_command`` that uploads whole files to a local destination."""

    @functools.wraps(original)
    def sync_up_command(self: Any, local_path: str, uri: str, exclude: list[str] | None = None) -> Any:
        if exclude or not is_local(self.storage_filesystem):
            return original(self, local_path, uri, exclude)
        return upload_tree, {"local_path": local_path, "fs_path": uri}

    sync_up_command._autonorm_whole_files = True  # type: ignore[attr-defined]
    return sync_up_command


def whole_file_uploads(is_local: Callable[[Any], bool], upload_tree: Callable[..., Any]) -> None:
    """Tune's background copy of the driver's staging folder to a study's local storage writes each
    file whole (a temporary file renamed over it) and skips files already there: a SIGKILL
    mid-copy left an empty ``tuner.pkl`` that no rerun could restore (workers/uploads.py). Wraps
    ``ray.train._internal.storage._FilesystemSyncer._sync_up_command`` once per process (private
    Ray API, pinned by a test). ``is_local`` and ``upload_tree`` are :mod:`workers.uploads`' (passed
    in: uploads reaches Ray's upload through this module)."""
    from ray.train._internal.storage import _FilesystemSyncer

    if getattr(_FilesystemSyncer._sync_up_command, "_autonorm_whole_files", False):
        return
    _FilesystemSyncer._sync_up_command = _whole_file_sync(  # type: ignore[method-assign]
        _FilesystemSyncer._sync_up_command, is_local, upload_tree
    )


# ------------------------------------------------------------------------- what a result costs the driver
#
# Tune snapshots its experiment state at every trial start, result and end here (see
# skip_idle_snapshots), and a stacked group's result carries every member's metrics (``<key>@m<k>``,
# workers/members.py). Profiled on the batch-size `local` preset stacked (cProfile of the driver, 1,800
# results, 2,051 snapshots): 25 s in re-encoding changed trials' states, 15 s in Tune's TensorBoard
# logger (workers/tune_loggers.py), 8 s in writing the snapshot, on a machine whose two cores the
# trials need. Private Ray API, pinned by tests/workers/test_units.py and test_ray_internals.py.


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


def compact_snapshot_json() -> None:
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


def no_member_metric_statistics() -> None:
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
    compact_snapshot_json()
    no_member_metric_statistics()


# ------------------------------------------------------------------- Tune's snapshot (workers/tune_state.py)


def controller_trials(controller: Any) -> Any:
    """Every trial of Tune's controller, in the study's order (``TuneController._trials``)."""
    return controller._trials


def stopped_trials(controller: Any) -> Any:
    """Tune's set of ``TERMINATED`` trials (``TuneController._stopped_trials``)."""
    return controller._stopped_trials


def failed_trials(controller: Any) -> Any:
    """Tune's set of ``ERROR`` trials (``TuneController._failed_trials``)."""
    return controller._failed_trials


def trial_checkpoints(controller: Any) -> dict[str, Any]:
    """``{trial id: [trial state json, run metadata json]}`` as the next snapshot writes them, the
    changed trials' JSON brought up to date (``TuneController._get_trial_checkpoints``)."""
    metadata: dict[str, Any] = controller._get_trial_checkpoints()
    return metadata


def controller_storage(controller: Any) -> Any:
    """The experiment's ``StorageContext`` (``TuneController._storage``)."""
    return controller._storage


@contextlib.contextmanager
def searcher_not_saved(controller: Any) -> Iterator[None]:
    """Tune's searcher (``TuneController._search_alg``) not saved by the snapshot taken in the block:
    its ``save_to_dir`` is shadowed on the instance, and the method is back afterwards."""
    search_alg = controller._search_alg
    if "save_to_dir" in vars(search_alg):  # already shadowed (a wrapper around this wrapper)
        yield
        return
    search_alg.save_to_dir = lambda *args, **kwargs: None  # shadows the method for one snapshot
    try:
        yield
    finally:
        del search_alg.save_to_dir


def analysis_location(analysis: Any) -> tuple[Any, str]:
    """``(filesystem, experiment path)`` of an ``ExperimentAnalysis`` (its ``_fs`` and
    ``_experiment_fs_path``)."""
    return analysis._fs, str(analysis._experiment_fs_path)


def _wrap_once(owner: Any, name: str, factory: Callable[[Any], Any], marker: str) -> None:
    """``owner.name`` replaced by ``factory(owner.name)``, unless it is already (``marker`` set)."""
    original = getattr(owner, name)
    if not getattr(original, marker, False):
        setattr(owner, name, factory(original))


def wrap_snapshot_io(
    *,
    save_to_dir: Callable[[Any], Any],
    resume: Callable[[Any], Any],
    restore_trials: Callable[[Any], Any],
    load_trials: Callable[[Any], Any],
    loads: Callable[[Any], Any],
) -> None:
    """Wrap Tune's snapshot writer and both of its readers, once per process, with the wrappers
    ``workers/tune_state.py`` makes (each marks what it returns, as named here):
    ``TuneController.save_to_dir`` (``_autonorm_compacts``), ``TuneController.resume``
    (``_autonorm_at_experiment``), ``TuneController._restore_trials`` (``_autonorm_restores_finished``),
    ``ExperimentAnalysis._load_trials`` (``_autonorm_reads_finished``) and ``experiment_analysis.
    _loads_with_cloudpickle`` (``_autonorm_merges``)."""
    from ray.tune.analysis import experiment_analysis
    from ray.tune.execution.tune_controller import TuneController

    _wrap_once(TuneController, "save_to_dir", save_to_dir, "_autonorm_compacts")
    _wrap_once(TuneController, "resume", resume, "_autonorm_at_experiment")
    _wrap_once(TuneController, "_restore_trials", restore_trials, "_autonorm_restores_finished")
    _wrap_once(
        experiment_analysis.ExperimentAnalysis, "_load_trials", load_trials, "_autonorm_reads_finished"
    )
    _wrap_once(experiment_analysis, "_loads_with_cloudpickle", loads, "_autonorm_merges")


# --------------------------------------------------------------------- the schedulers (workers/search.py)


def unwrapped_controller(tune_controller: Any) -> Any:
    """The controller itself: Tune hands schedulers a ``TrialRunnerWrapper`` that warns at the first
    private attribute read through it; the controller is its ``_tune_controller`` (read from its
    ``__dict__``, which does not warn). Anything else is returned as it is."""
    return vars(tune_controller).get("_tune_controller", tune_controller)


def pending_trials(controller: Any) -> Any:
    """Tune's set of ``PENDING`` trials (``TuneController._pending_trials``), ``None`` without one."""
    return getattr(controller, "_pending_trials", None)


def paused_trials(controller: Any) -> Any:
    """Tune's set of ``PAUSED`` trials (``TuneController._paused_trials``), ``None`` without one."""
    return getattr(controller, "_paused_trials", None)


# ------------------------------------------------- OptunaSearch (workers/search.py, workers/optuna_export.py)


def optuna_trials(searcher: Any) -> dict[str, Any]:
    """Tune trial id -> the Optuna trial still open for it (``OptunaSearch._ot_trials``)."""
    trials: dict[str, Any] = searcher._ot_trials
    return trials


def optuna_study(searcher: Any) -> Any:
    """The searcher's in-memory Optuna study (``OptunaSearch._ot_study``)."""
    return searcher._ot_study


def optuna_completed(searcher: Any) -> set[str]:
    """The Tune trial ids already told to Optuna (``OptunaSearch._completed_trials``)."""
    completed: set[str] = searcher._completed_trials
    return completed


def has_optuna_study(searcher: Any) -> bool:
    """Whether ``searcher`` is an ``OptunaSearch`` holding a study (has ``_ot_study``)."""
    return hasattr(searcher, "_ot_study")


def tuner_search_alg(tuner: Any) -> Any:
    """The search algorithm a ``Tuner`` ran with (``Tuner._local_tuner._tune_config.search_alg``:
    after a restore, the one Tune unpickled), ``None`` if that path is gone."""
    config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    return getattr(config, "search_alg", None)


# ------------------------------------------------------------------------ storage (workers/uploads.py)


def upload_to_fs_path(local_path: str, fs: Any, fs_path: str) -> None:
    """Ray's upload of a local file or folder to ``fs_path`` on ``fs``
    (``ray.train._internal.storage._upload_to_fs_path``, no exclusions)."""
    from ray.train._internal.storage import _upload_to_fs_path

    _upload_to_fs_path(local_path, fs, fs_path)


# ------------------------------------------- what trial workers print (workers/console.py, workers/progress.py)


def worker_stream_dispatcher() -> Any:
    """Ray's dispatcher of what workers print to this driver (``ray._private.ray_logging.
    global_worker_stdstream_dispatcher``; its handlers exist once ``ray.init`` has run), ``None`` if
    that module is gone."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return None
    return dispatcher


def wrap_dispatcher_handlers(dispatcher: Any, wrap: Callable[[Any], Any], marker: str) -> bool:
    """Each handler of ``dispatcher`` replaced by ``wrap(handler)`` under the dispatcher's ``_lock``,
    except those already wrapped (``marker`` set on them). False, changing nothing, for a dispatcher
    without that lock or a list of handlers."""
    lock = getattr(dispatcher, "_lock", None)
    handlers = getattr(dispatcher, "handlers", None)
    if lock is None or not isinstance(handlers, list):
        return False
    with lock:
        dispatcher.handlers = [
            (name, h if getattr(h, marker, False) else wrap(h)) for name, h in dispatcher.handlers
        ]
    return True
