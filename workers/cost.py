"""A running study's cost, for the writers of its outputs: one trial count and one wall time.

:class:`workers.study.StudyRunner` is the source (:meth:`~workers.study.StudyRunner.cost`); while a
study's ``with`` block runs, it is registered here for the thread that runs it, so a report writer
deep in a kind (``studies.reporting.begin_report``) puts the runner's numbers in the ``verdict.json``
and the report it writes, the numbers the run's closing lines and its MLflow run (``ls``) show.

A study stopped (Ctrl-C, a killed driver) and resumed runs in several *sessions*, one per command.
Its cost is the sum of theirs: the trial count and the CPU hours are so by construction (every
session reads every trial back, each with its ``time_total_s`` restored from its checkpoint); the
wall time is kept per session in the study directory's :data:`SESSIONS_FILE` (:class:`Sessions`),
which each session reads at its start and writes as it goes, so its wall time is the earlier
sessions' plus its own. Light: no Ray, no MLflow.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["COST_KEYS", "SESSIONS_FILE", "Sessions", "registered", "running_cost"]

logger = logging.getLogger(__name__)

COST_KEYS = ("trials", "wall_time_s", "cpu_hours", "gpu_hours")
"""The keys of a study's cost (``verdict.json``'s ``resources``)."""

_RUNNING: contextvars.ContextVar[Callable[[], dict[str, float]] | None] = contextvars.ContextVar(
    "autonorm_study_cost", default=None
)


@contextmanager
def registered(cost: Callable[[], dict[str, float]]) -> Iterator[None]:
    """``cost`` answers :func:`running_cost` in this thread (and the contexts copied from it) inside
    the block: a :class:`workers.study.StudyRunner` its :meth:`~workers.study.StudyRunner.cost`."""
    token = _RUNNING.set(cost)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def running_cost() -> dict[str, float] | None:
    """The cost (:data:`COST_KEYS`, or some of them) of the study this thread is running, or whose
    report it regenerates (``autonorm-study report`` registers the study directory's trial count and
    the wall time its run wrote); ``None`` otherwise (``reproduce``: a re-analysis costs nothing)."""
    cost = _RUNNING.get()
    return cost() if cost is not None else None


SESSIONS_FILE = "sessions.json"
"""In a study directory: ``{"sessions": [{"started", "wall_s", "ended"}, ...]}``, one entry per
command that ran the study (``run``, a rerun that resumed it, ``extend``), in order: when it started
(UTC, ISO 8601), its wall time in seconds (the study's clock, :attr:`workers.study.StudyRunner.wall_time_s`,
while it ran) and how it ended: ``finished``, ``interrupted`` (a signal), ``failed``, or ``running``
(still running, or its driver was killed: then its wall time as of its last finished phase)."""


class Sessions:
    """This command's session of a study, beside the earlier ones in :data:`SESSIONS_FILE`.

    Args:
        filesystem: the study storage's ``pyarrow`` filesystem (S3), ``None`` for a local directory.
        directory: the study directory on it.

    The earlier sessions are read once, at the start; :meth:`save` writes them back with this one
    (the study's lease keeps a second driver out, so no one else writes the file meanwhile). A file
    that cannot be read counts as no earlier session (logged): the cost is then this session's, as
    before the file existed."""

    def __init__(self, filesystem: Any, directory: str) -> None:
        import pyarrow.fs

        self.filesystem = filesystem if filesystem is not None else pyarrow.fs.LocalFileSystem()
        self.directory = directory.rstrip("/")
        self.path = f"{self.directory}/{SESSIONS_FILE}"
        self.started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.earlier: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        import pyarrow.fs

        try:
            if self.filesystem.get_file_info(self.path).type == pyarrow.fs.FileType.NotFound:
                return []
            with self.filesystem.open_input_stream(self.path) as stream:
                doc = json.loads(stream.read().decode("utf-8"))
            sessions = doc.get("sessions") if isinstance(doc, dict) else None
            if not isinstance(sessions, list):
                raise ValueError("no list of sessions")
            return [dict(e) for e in sessions if isinstance(e, dict)]
        except Exception as exc:
            logger.warning("could not read the earlier sessions of the study (%s): %s", self.path, exc)
            return []

    @property
    def earlier_wall_s(self) -> float:
        """The earlier sessions' wall time, in seconds (an entry without a finite one counts 0)."""
        return sum(_seconds(e.get("wall_s")) for e in self.earlier)

    def save(self, wall_s: float, ended: str = "running") -> None:
        """Write the earlier sessions and this one (its wall time so far, how it ended) to the file,
        whole; a failure is logged, never raised (the study goes on without it)."""
        entry = {"started": self.started, "wall_s": round(float(wall_s), 3), "ended": ended}
        body = json.dumps({"sessions": [*self.earlier, entry]}, indent=1) + "\n"
        try:
            from workers.uploads import is_local, write_whole

            self.filesystem.create_dir(self.directory, recursive=True)
            if is_local(self.filesystem):  # a reader (or a kill) never sees half a file
                write_whole(self.path, body.encode())
            else:
                with self.filesystem.open_output_stream(self.path) as out:
                    out.write(body.encode())
        except Exception as exc:
            logger.warning("could not record the study's session in %s: %s", self.path, exc)


def _seconds(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0
