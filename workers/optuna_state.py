"""The Optuna searcher's saved state at a cost that does not grow with the finished trials.

Tune saves the searcher with its experiment snapshot whenever a trial is added or ends
(``workers/tune_state.py``): Ray's ``OptunaSearch.save`` pickles the searcher's whole ``__dict__``,
its in-memory Optuna study included, about 0.8 KB a trial. At a study of N trials that is 2N
pickles of up to N trials: measured with py-spy on the 1,000-trial search study of
``bench/study_scale.py``, the pickle was 17% of the driver's CPU at 200 trials and 33% at 850, most
of why its CPU per trial grew from 0.155 s (first 100) to 0.267 s (last 100) (issue #40).

A finished Optuna trial never changes again, so it is written once: when at least
:func:`workers.tune_state.chunk_trials` finished trials are not in a file yet, they go to one
immutable file ``optuna-trials-<time ns>-<id>.bin`` (a pickled list of ``FrozenTrial``) in the
experiment directory, written straight to the study's storage (local or S3) before the searcher
state that leaves them out. The searcher state then holds a reference (``("optuna-trial", number)``,
a pickle persistent id) in place of each such trial; restoring it reads the files and puts each
trial back where it was. A driver killed between the two writes loses nothing: the older searcher
state still holds those trials itself, and a trial in two files (written again after such a
restore) is the same finished trial.

The location comes from :func:`workers.tune_state.experiment_location`, which Tune's snapshot and
resume set; a searcher saved outside them (no location) is pickled whole, as Ray does, and one
restored outside them reads the files next to its state file (``restore_from_dir`` on a local
experiment directory).

The files end in ``.bin``: Tune's ``sync_down_experiment_state`` copies only ``.json`` and ``.pkl``
files of the experiment directory into the driver's staging folder, from where every snapshot
would upload them again.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

from workers.tune_state import chunk_paths, chunk_trials, experiment_location, write_chunk

logger = logging.getLogger(__name__)

__all__ = ["ARCHIVE_PREFIX", "ARCHIVE_SUFFIX", "dump_searcher", "load_searcher", "read_archived_trials"]

ARCHIVE_PREFIX = "optuna-trials-"
ARCHIVE_SUFFIX = ".bin"
_REF = "optuna-trial"


class _ArchivingPickler(pickle.Pickler):
    """Pickles every ``FrozenTrial`` whose number is in ``archived`` as a reference to it."""

    def __init__(self, file: io.BufferedWriter, archived: set[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        from optuna.trial import FrozenTrial

        self._frozen = FrozenTrial
        self._archived = archived

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is self._frozen and obj.number in self._archived:
            return (_REF, obj.number)
        return None


class _ArchiveUnpickler(pickle.Unpickler):
    """Puts each referenced ``FrozenTrial`` back, read (once, at the first reference) by ``load``."""

    def __init__(self, file: io.BufferedReader, load: Callable[[], dict[int, Any]]) -> None:
        super().__init__(file)
        self._load = load
        self._by_number: dict[int, Any] | None = None

    def persistent_load(self, pid: Any) -> Any:
        if self._by_number is None:
            self._by_number = self._load()
        kind, number = pid
        if kind != _REF or number not in self._by_number:
            raise pickle.UnpicklingError(
                f"the searcher state refers to Optuna trial {number}, which no {ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX} "
                "file of the experiment holds"
            )
        return self._by_number[number]


def read_archived_trials(fs: Any, experiment_fs_path: str) -> dict[int, Any]:
    """``{number: FrozenTrial}`` of every finished Optuna trial in the experiment's files (a later
    file wins for a number in two). A file that does not load is skipped, with a warning: it was cut
    short by a killed driver, and no saved searcher state refers to its trials."""
    out: dict[int, Any] = {}
    for path in chunk_paths(fs, experiment_fs_path, ARCHIVE_PREFIX, ARCHIVE_SUFFIX):
        try:
            with fs.open_input_stream(path) as f:
                trials = pickle.loads(f.readall())
        except Exception as exc:
            logger.warning("Optuna trials file %s is unreadable (%s); skipped", path, exc)
            continue
        for trial in trials:
            out[trial.number] = trial
    return out


def _in_memory_trials(study: Any) -> list[Any] | None:
    """The study's trials as its in-memory storage holds them, or ``None`` for another storage."""
    from optuna.storages import InMemoryStorage

    storage = getattr(study, "_storage", None)
    if not isinstance(storage, InMemoryStorage):
        return None
    return list(storage.get_all_trials(study._study_id, deepcopy=False))


def dump_searcher(state: dict[str, Any], study: Any, archived: set[int], checkpoint_path: str) -> bool:
    """Write ``state`` (a searcher's ``__dict__``) to ``checkpoint_path``, the finished trials of
    ``study`` not in ``archived`` first to a file of their own once there are enough of them
    (``archived`` grows by them). False, writing nothing, when there is no experiment location or the
    study is not in memory: the caller pickles everything."""
    where = experiment_location()
    trials = _in_memory_trials(study)
    if where is None or trials is None:
        return False
    fresh = [t for t in trials if t.state.is_finished() and t.number not in archived]
    if fresh and len(fresh) >= chunk_trials():
        fs, experiment_fs_path = where
        path = write_chunk(fs, experiment_fs_path, ARCHIVE_PREFIX, ARCHIVE_SUFFIX, pickle.dumps(fresh))
        archived.update(t.number for t in fresh)
        logger.debug("wrote %d finished Optuna trials to %s", len(fresh), path)
    with open(checkpoint_path, "wb") as f:
        _ArchivingPickler(f, archived).dump(state)  # type: ignore[arg-type]
    return True


def load_searcher(checkpoint_path: str) -> Any:
    """What :func:`dump_searcher` (or Ray's ``OptunaSearch.save``) wrote to ``checkpoint_path``, the
    referenced trials read from the experiment's files (where Tune resumes, else the state file's
    own directory)."""

    def load() -> dict[int, Any]:
        where = experiment_location()
        if where is None:
            import pyarrow.fs

            where = (pyarrow.fs.LocalFileSystem(), os.path.dirname(os.path.abspath(checkpoint_path)))
        return read_archived_trials(*where)

    with open(checkpoint_path, "rb") as f:
        return _ArchiveUnpickler(f, load).load()  # type: ignore[arg-type]
