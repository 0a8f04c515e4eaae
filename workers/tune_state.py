"""Tune's experiment snapshot at a cost that does not grow with the finished trials.

Tune keeps one JSON file per driver session, ``experiment_state-<session>.json``, holding every
trial's state (about 44 KB a trial here: its config, last result, metric summaries and checkpoint
bookkeeping), and rewrites the whole file at every snapshot. This project snapshots at every trial
start, result and end (``TUNE_GLOBAL_CHECKPOINT_S=0``: a driver killed right after a trial finished
must not run it again), so a study of N trials wrote O(N²) bytes: measured at 200 tiny trials, the
driver's CPU per trial grew from 0.31 s (first 100) to 0.72 s (last 100), and the snapshot was 8.6 MB
(issue #40, ``bench/study_scale.py``).

A finished trial's state no longer changes, so it is written once: when at least
:data:`CHUNK_TRIALS` trials have been ``TERMINATED`` for a whole snapshot, their states go to one
immutable file ``finished-trials-<time ns>-<id>.jsonl`` in the experiment directory (written straight
to the study's storage, local or S3, before the snapshot that leaves them out), and the snapshot
keeps only the other trials. Both readers of the snapshot put the two back together:
``TuneController._restore_trials`` (``Tuner.restore`` after a crash, a Ctrl-C or a killed driver)
and ``ExperimentAnalysis._load_trials`` (``status``, ``report``, each phase's final analysis). For a
trial found in both, a terminal state wins over a non-terminal one (the snapshot on storage may be
older than the finished-trials file written just before it), and the snapshot's wins between two
terminal ones. Errored trials stay in the snapshot: a restore runs them again. A half-written
file (a driver killed while writing it) loses nothing: the snapshot that still holds those trials is
only replaced after the file is complete, and unreadable lines are skipped.

The files end in ``.jsonl`` so that Tune's ``sync_down_experiment_state`` (which copies every
``.json`` and ``.pkl`` of the experiment directory into the driver's staging folder, from where each
snapshot uploads it again) leaves them where they are.

Private Ray API (``TuneController._trials``, ``_get_trial_checkpoints``, ``_storage``,
``_search_alg``, ``_restore_trials``, ``ExperimentAnalysis._load_trials``, ``_fs``,
``_experiment_fs_path``, ``experiment_analysis._loads_with_cloudpickle``), read and wrapped through
:mod:`workers.ray_internals` only, pinned by tests in ``tests/workers/test_tune_state.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import os
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from workers import ray_internals

logger = logging.getLogger(__name__)

__all__ = [
    "CHUNK_PREFIX",
    "CHUNK_SUFFIX",
    "CHUNK_TRIALS",
    "CHUNK_TRIALS_ENV",
    "chunk_paths",
    "chunk_trials",
    "experiment_location",
    "install",
    "merge_trial_data",
    "read_finished_trials",
    "write_chunk",
]

CHUNK_PREFIX = "finished-trials-"
CHUNK_SUFFIX = ".jsonl"
# Trials per finished-trials file: the snapshot holds at most this many finished trials more than
# the running ones (~1 MB), and a 1,000-trial study writes about 40 such files. The environment
# variable overrides it (the test suite sets 2, so that every study it runs, resumes and reads
# goes through the files).
CHUNK_TRIALS = 25
CHUNK_TRIALS_ENV = "AUTONORM_TUNE_TRIALS_PER_FILE"
_TERMINATED = "TERMINATED"
_TERMINAL = frozenset({"TERMINATED", "ERROR"})


@dataclass
class SnapshotBook:
    """What this project remembers about one ``TuneController``'s snapshots. Kept outside the
    controller: Tune pickles the controller's ``__dict__`` into every snapshot (``runner_data``)."""

    saved_state: tuple[Any, ...] | None = None  # the trials as of the last snapshot (ray_internals)
    chunked: set[str] = field(default_factory=set)  # trial ids already in a finished-trials file
    terminated_at_last_save: set[str] = field(default_factory=set)
    structure: tuple[Any, ...] | None = None  # trials added and ended at the last snapshot


_BOOKS: weakref.WeakKeyDictionary[Any, SnapshotBook] = weakref.WeakKeyDictionary()


def book(controller: Any) -> SnapshotBook:
    """The bookkeeping of ``controller`` (made at first use)."""
    found = _BOOKS.get(controller)
    if found is None:
        found = _BOOKS[controller] = SnapshotBook()
    return found


def chunk_trials() -> int:
    """:data:`CHUNK_TRIALS`, or the environment's :data:`CHUNK_TRIALS_ENV`."""
    raw = os.environ.get(CHUNK_TRIALS_ENV, "")
    try:
        return max(1, int(raw)) if raw else CHUNK_TRIALS
    except ValueError:
        logger.warning("%s=%r is not a whole number; using %d", CHUNK_TRIALS_ENV, raw, CHUNK_TRIALS)
        return CHUNK_TRIALS


# ------------------------------------------------------------------------------------------ files


def _id_and_status(json_state: str) -> tuple[str, str]:
    state = json.loads(json_state)
    return str(state["trial_id"]), str(state["status"])


def chunk_paths(fs: Any, experiment_fs_path: str, prefix: str, suffix: str) -> list[str]:
    """The experiment directory's files named ``<prefix>...<suffix>``, in the order written."""
    import pyarrow.fs

    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(experiment_fs_path, allow_not_found=True))
    except (FileNotFoundError, OSError):
        return []
    names = [
        i.path
        for i in infos
        if i.type == pyarrow.fs.FileType.File
        and PurePosixPath(i.path).name.startswith(prefix)
        and i.path.endswith(suffix)
    ]
    return sorted(names, key=lambda p: PurePosixPath(p).name)


def write_chunk(fs: Any, experiment_fs_path: str, prefix: str, suffix: str, body: bytes) -> str:
    """An immutable file ``<prefix><time ns>-<id><suffix>`` in the experiment directory, written
    straight to the study's storage; its name sorts in the order written. Its path."""
    name = f"{prefix}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}{suffix}"
    path = str(PurePosixPath(experiment_fs_path) / name)
    fs.create_dir(experiment_fs_path, recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(body)
    return path


def read_finished_trials(fs: Any, experiment_fs_path: str) -> list[tuple[str, list[str]]]:
    """``(trial id, [trial state json, run metadata json])`` of every trial in the experiment's
    finished-trials files, in the order they were written. A line that does not parse (a file cut
    short by a killed driver) is skipped: its trials are still in the snapshot."""
    out: list[tuple[str, list[str]]] = []
    for path in chunk_paths(fs, experiment_fs_path, CHUNK_PREFIX, CHUNK_SUFFIX):
        try:
            with fs.open_input_stream(path) as f:
                text = f.readall().decode("utf-8", errors="replace")
        except (FileNotFoundError, OSError) as exc:
            logger.warning(
                "finished-trials file %s is unreadable (%s); its trials come from the snapshot", path, exc
            )
            continue
        for line in text.splitlines():
            try:
                entry = json.loads(line)
                data = [str(entry["state"]), str(entry["metadata"])]
                out.append((str(entry["trial_id"]), data))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _write_chunk(fs: Any, experiment_fs_path: str, entries: Sequence[tuple[str, Sequence[str]]]) -> str:
    body = "".join(
        json.dumps({"trial_id": tid, "state": data[0], "metadata": data[1]}) + "\n" for tid, data in entries
    )
    return write_chunk(fs, experiment_fs_path, CHUNK_PREFIX, CHUNK_SUFFIX, body.encode("utf-8"))


def merge_trial_data(
    snapshot: Iterable[Sequence[str]], finished: Iterable[tuple[str, Sequence[str]]]
) -> list[list[str]]:
    """The trial list a reader restores: the finished-trials files' trials first (in the order
    written), then the snapshot's. For a trial in both, a terminal state beats a non-terminal one and
    the snapshot's beats the file's between two terminal ones."""
    from_files: dict[str, list[str]] = {}
    for tid, data in finished:
        from_files[tid] = list(data)
    kept_snapshot: list[list[str]] = []
    for data in snapshot:
        tid, status = _id_and_status(data[0])
        if tid in from_files:
            if status not in _TERMINAL:
                continue  # the file is newer: the trial finished after this snapshot was taken
            del from_files[tid]
        kept_snapshot.append(list(data))
    return list(from_files.values()) + kept_snapshot


# ------------------------------------------------------------------------------------ the writer


def compact_finished_trials(controller: Any) -> bool:
    """Move the trials that have been ``TERMINATED`` since the previous snapshot out of the next
    one into a finished-trials file, once there are :data:`CHUNK_TRIALS` of them; a trial already
    in such a file is left out of the snapshot. True when the searcher's state may have changed
    since the previous snapshot: a trial was added (a searcher suggests every trial) or ended (an
    Optuna searcher learns its value; every searcher, Tune's grid included, counts its live trials
    against ``max_concurrent_trials``: a state saved before a trial ended would, restored, wait
    for that trial forever)."""
    notes = book(controller)
    metadata = ray_internals.trial_checkpoints(controller)  # brings changed trials' JSON up to date
    stopped = ray_internals.stopped_trials(controller)  # Tune's set of TERMINATED trials (failed: ERROR)
    structure = (
        len(ray_internals.controller_trials(controller)),
        len(stopped) + len(ray_internals.failed_trials(controller)),
    )
    changed = structure != notes.structure
    notes.structure = structure
    terminated = {t.trial_id for t in stopped}
    for tid in notes.chunked & terminated:
        metadata.pop(tid, None)
    # A trial waits one snapshot after it ended: anything Tune still records about it is in.
    ready = [
        tid
        for tid in metadata
        if tid in terminated and tid in notes.terminated_at_last_save and tid not in notes.chunked
    ]
    notes.terminated_at_last_save = terminated
    if not ready or len(ready) < chunk_trials():
        return changed
    storage = ray_internals.controller_storage(controller)
    path = _write_chunk(
        storage.storage_filesystem, storage.experiment_fs_path, [(t, metadata[t]) for t in ready]
    )
    for tid in ready:
        metadata.pop(tid)
        notes.chunked.add(tid)
    logger.debug("wrote %d finished trials to %s", len(ready), path)
    by_id = {t.trial_id: t for t in ray_internals.controller_trials(controller)}
    retire_staging(storage, [by_id[tid] for tid in ready])
    return changed


def retire_staging(storage: Any, trials: Sequence[Any]) -> None:
    """Upload each finished trial's folder in the driver's staging area (the ``params.json``,
    ``result.json``, ``progress.csv`` and event file Tune's logger callbacks write there) to the
    trial's folder in the study's storage once more, then delete it. Tune uploads the whole staging
    area at every snapshot (``sync_up_experiment_state``), the folders of all finished trials
    included: at 300 trials that copy was most of the driver's CPU, growing with every trial. A sync
    still copying is waited for first (its failure is said in one line and the folders stay)."""
    import shutil

    from workers.uploads import upload

    try:
        storage.syncer.wait()
    except Exception as exc:
        logger.warning("saving the experiment state to %s failed: %s", storage.experiment_fs_path, exc)
        return
    for trial in trials:
        try:
            local = trial.storage.trial_driver_staging_path
            if not os.path.isdir(local):
                continue
            with os.scandir(local) as entries:
                has_files = any(True for _ in entries)
            if has_files:
                upload(local, storage.storage_filesystem, trial.storage.trial_fs_path)
            shutil.rmtree(local)
        except Exception as exc:  # the folder stays and Tune's syncs keep uploading it
            logger.debug("kept the staging folder of trial %s: %s", getattr(trial, "trial_id", trial), exc)


# (filesystem, experiment path) of the study whose snapshot is being saved or resumed in this thread:
# where a searcher keeps what it writes once (workers/optuna_state.py).
_EXPERIMENT: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar(
    "autonorm_experiment", default=None
)


def experiment_location() -> tuple[Any, str] | None:
    """``(filesystem, experiment path)`` while Tune saves or resumes a study's snapshot, else ``None``."""
    return _EXPERIMENT.get()


@contextlib.contextmanager
def _at_experiment(storage: Any) -> Iterator[None]:
    token = _EXPERIMENT.set((storage.storage_filesystem, storage.experiment_fs_path))
    try:
        yield
    finally:
        _EXPERIMENT.reset(token)


def _compacting_save(original: Any) -> Any:
    """``TuneController.save_to_dir`` that writes finished trials once (:func:`compact_finished_trials`)
    and saves the searcher only when a trial was added or ended. Tune pickles the searcher at every
    snapshot, and it grows with the study: an Optuna searcher keeps its whole study in memory (~1.3 KB
    a trial), Tune's grid every variant of the grid (570 KB for a 1,000-trial grid, ~30 ms a pickle:
    43% of a batch-size driver's time at 300 trials, sampled with py-spy). What a result or a
    trial's start alone changes in it is at most the trial's intermediate values, which a restore
    does not need: the trial reports its epochs after its last checkpoint again, and the samplers
    read final values."""

    @functools.wraps(original)
    def save_to_dir(self: Any) -> None:
        with _at_experiment(ray_internals.controller_storage(self)):
            if compact_finished_trials(self):
                original(self)
                return
            with ray_internals.searcher_not_saved(self):
                original(self)

    save_to_dir._autonorm_compacts = True  # type: ignore[attr-defined]
    return save_to_dir


def _resuming_at_experiment(original: Any) -> Any:
    """``TuneController.resume`` with the experiment's location known to the searcher it restores."""

    @functools.wraps(original)
    def resume(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _at_experiment(ray_internals.controller_storage(self)):
            return original(self, *args, **kwargs)

    resume._autonorm_at_experiment = True  # type: ignore[attr-defined]
    return resume


def _restoring_with_finished(original: Any) -> Any:
    @functools.wraps(original)
    def restore_trials(self: Any, experiment_state: dict[str, Any]) -> Any:
        storage = ray_internals.controller_storage(self)
        finished = read_finished_trials(storage.storage_filesystem, storage.experiment_fs_path)
        if finished:
            experiment_state = dict(experiment_state)
            experiment_state["trial_data"] = merge_trial_data(experiment_state["trial_data"], finished)
        trials = original(self, experiment_state)
        in_files = {tid for tid, _ in finished}
        from_files = [t for t in trials if t.trial_id in in_files and t.status == _TERMINATED]
        book(self).chunked |= {t.trial_id for t in from_files}
        retire_staging(storage, from_files)  # the empty folders Tune just made for them
        return trials

    restore_trials._autonorm_restores_finished = True  # type: ignore[attr-defined]
    return restore_trials


# ------------------------------------------------------------------------------------ the reader

# (filesystem, experiment path) of the ExperimentAnalysis being loaded in this thread.
_LOADING: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar(
    "autonorm_loading", default=None
)


def _analysis_loading(original: Any) -> Any:
    @functools.wraps(original)
    def load_trials(self: Any) -> Any:
        token = _LOADING.set(ray_internals.analysis_location(self))
        try:
            return original(self)
        finally:
            _LOADING.reset(token)

    load_trials._autonorm_reads_finished = True  # type: ignore[attr-defined]
    return load_trials


def _merging_loads(original: Any) -> Any:
    """``_loads_with_cloudpickle`` for ``ExperimentAnalysis``: while an analysis is loading, the
    experiment's finished-trials files are merged into the snapshot it read."""

    @functools.wraps(original)
    def loads(data: Any) -> Any:
        state = original(data)
        where = _LOADING.get()
        if where is not None and isinstance(state, dict) and "trial_data" in state:
            finished = read_finished_trials(*where)
            if finished:
                state["trial_data"] = merge_trial_data(state["trial_data"], finished)
        return state

    loads._autonorm_merges = True  # type: ignore[attr-defined]
    return loads


def install() -> None:
    """Write finished trials once and read them back everywhere; once per process."""
    ray_internals.wrap_snapshot_io(
        save_to_dir=_compacting_save,
        resume=_resuming_at_experiment,
        restore_trials=_restoring_with_finished,
        load_trials=_analysis_loading,
        loads=_merging_loads,
    )
