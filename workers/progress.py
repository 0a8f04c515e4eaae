"""A terse progress line for a running study: ``trials done/total, running, ETA``.

Tune's own reporters print wide tables per trial; a study of dozens of trials wants one line every
few seconds, in a job log as much as in a terminal. :func:`quiet_checkpoint_logs` keeps Ray's
per-epoch "Checkpoint successfully created" lines out of it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from ray.tune import Callback

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

__all__ = ["CHECKPOINT_LINE", "ProgressCallback", "SyncFailureOneLine", "format_eta", "quiet_checkpoint_logs"]

CHECKPOINT_LINE = "Checkpoint successfully created"
"""Ray Train's INFO line (logger ``ray.train._internal.storage``) at every checkpoint a trial reports:
once per trial per epoch, forwarded from the trial's process to the driver's output."""
SHOW_CHECKPOINT_LOGS_ENV = "AUTONORM_SHOW_CHECKPOINT_LOGS"


def _without_checkpoint_lines(handler: Callable[[Any], None]) -> Callable[[Any], None]:
    def handle(data: Any) -> None:
        lines = data.get("lines") if isinstance(data, dict) else None
        if isinstance(lines, list):
            kept = [line for line in lines if CHECKPOINT_LINE not in str(line)]
            if lines and not kept:
                return
            if len(kept) != len(lines):
                data = {**data, "lines": kept}
        handler(data)

    handle._autonorm_quiet = True  # type: ignore[attr-defined]
    return handle


class SyncFailureOneLine(logging.Filter):
    """A failed background sync of Tune's driver files, logged as one line without its traceback.

    Tune copies its driver files (experiment state, searcher state) to the study's storage in a
    background sync; the study saves its state on every loop step, so a sync can list a state file
    that Tune has renamed by the time it is copied (``FileNotFoundError``). Ray reports that in two
    places, each with a traceback a user would read as a failure of the study: Ray Train's syncer
    ("Last sync command failed ...", a warning) and Tune's experiment state when it waits for that
    sync ("Saving experiment state to storage at ... failed with exception", an error). The next
    sync copies the files again and the last one at the end of every phase waits for its own copy, so
    nothing is lost; the line stays (a sync that keeps failing is worth knowing), its traceback goes.
    """

    #: logger name -> the message prefix it is rewritten for
    PREFIXES: ClassVar[dict[str, str]] = {
        "ray.train._internal.syncer": "Last sync command failed",
        "ray.tune.execution.experiment_state": "Saving experiment state to storage at",
    }

    def filter(self, record: logging.LogRecord) -> bool:
        prefix = self.PREFIXES.get(record.name)
        message = record.getMessage()
        if prefix is None or not message.startswith(prefix):
            return True
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        else:
            last = [line.strip() for line in message.splitlines() if line.strip()][-1:]
            detail = last[0] if last else "no detail"
        record.msg = (
            f"Tune's sync of its driver files to the study's storage failed once ({detail}); "
            "the next sync copies them again"
        )
        record.args = ()
        record.exc_info = record.exc_text = None
        return True

    @classmethod
    def install(cls) -> None:
        """On Ray Train's syncer logger and Tune's experiment-state logger, once per process."""
        for name in cls.PREFIXES:
            target = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in target.filters):
                target.addFilter(cls())


def quiet_checkpoint_logs(dispatcher: Any = None, *, environ: Mapping[str, str] | None = None) -> bool:
    """Drop Ray's "Checkpoint successfully created" lines from what this driver prints.

    They are logged in each trial's process and forwarded to the driver, which prints them through
    Ray's worker-output dispatcher (``ray._private.ray_logging.global_worker_stdstream_dispatcher``,
    private API): its handlers are wrapped to skip those lines, in this driver only; the trials'
    own log files keep them. Call after ``ray.init`` (the dispatcher's handlers exist from then on).
    ``AUTONORM_SHOW_CHECKPOINT_LOGS=1`` keeps them. Returns whether the filter is in place.
    """
    env = os.environ if environ is None else environ
    if env.get(SHOW_CHECKPOINT_LOGS_ENV) == "1":
        return False
    # A trial run in this very process (local mode) logs it here directly.
    logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
    if dispatcher is None:
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        except ImportError:
            return False
    lock = getattr(dispatcher, "_lock", None)
    handlers = getattr(dispatcher, "handlers", None)
    if lock is None or not isinstance(handlers, list):
        return False
    with lock:
        dispatcher.handlers = [
            (name, h if getattr(h, "_autonorm_quiet", False) else _without_checkpoint_lines(h))
            for name, h in dispatcher.handlers
        ]
    return True


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``4m05s``, ``12s``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


_DONE = ("TERMINATED", "ERROR")


class ProgressCallback(Callback):  # type: ignore[misc]
    """Prints ``[study] trials 3/8 done (1 error), 2 running, 3 pending, ETA 1m20s`` lines.

    Tune calls :meth:`on_step_end` after every loop iteration of its driver; a line is printed at
    most every ``interval_s`` seconds and whenever the number of finished trials changes, plus a
    final line at :meth:`on_experiment_end`. The ETA assumes the remaining trials take as long as
    the ones finished *since this driver started* did on average, at the current parallelism: after a
    resume, trials finished by an earlier driver count as done but not against this driver's clock.

    Args:
        name: study name shown in brackets.
        unit: what Tune's trials are: ``trials``, or ``groups`` of stacked trials (:mod:`workers.members`).
        total: planned trials; Tune's ``total_num_samples`` from :meth:`setup` wins when known.
        interval_s: minimum seconds between two lines.
        stream: where lines go (stdout by default; resolved at print time so pickling is safe).
        clock: time source, injectable for tests.
    """

    def __init__(
        self,
        *,
        name: str,
        total: int | None = None,
        unit: str = "trials",
        interval_s: float = 10.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.total = total
        self.unit = unit
        self.interval_s = interval_s
        self._stream = stream
        self._clock = clock
        self._start: float | None = None
        self._last_print = -float("inf")
        self._last_done = -1
        self._last_count = -float("inf")
        self._done_before: frozenset[str] | None = None
        self.lines: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_stream"] = None  # sys.stdout does not pickle; a restored copy prints to stdout
        state["_start"] = None
        state["_last_print"] = -float("inf")
        state["_last_done"] = -1
        state["_done_before"] = None
        state["lines"] = []
        return state

    def setup(
        self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any
    ) -> None:
        self._start = self._clock()
        if isinstance(total_num_samples, int) and total_num_samples > 0:
            self.total = total_num_samples

    def line(self, trials: list[Trial]) -> str:
        """The progress line for the current trial states."""
        counts = Counter(t.status for t in trials)
        done = counts["TERMINATED"] + counts["ERROR"]
        running = counts["RUNNING"]
        total = max(self.total or 0, len(trials))
        pending = max(0, total - done - running)
        if self._done_before is None:
            self._done_before = self._finished(trials)
        done_here = sum(t.status in _DONE and t.trial_id not in self._done_before for t in trials)
        eta: float | None = None
        if self._start is not None and done_here > 0:
            elapsed = self._clock() - self._start
            per_trial = elapsed / done_here
            eta = per_trial * (total - done)
        errors = f" ({counts['ERROR']} error)" if counts["ERROR"] else ""
        return (
            f"[{self.name}] {getattr(self, 'unit', 'trials')} {done}/{total} done{errors}, {running} running, {pending} pending, "
            f"ETA {format_eta(eta if done < total else 0.0)}"
        )

    @staticmethod
    def _finished(trials: list[Trial]) -> frozenset[str]:
        return frozenset(t.trial_id for t in trials if t.status in _DONE)

    def _emit(self, text: str) -> None:
        self.lines.append(text)
        stream = self._stream or sys.stdout
        print(text, file=stream, flush=True)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._start is None:
            self._start = self._clock()
        if self._done_before is None:
            # The first look at the trials: what is finished now was finished by an earlier driver.
            self._done_before = self._finished(trials)
        now = self._clock()
        # Counting the finished trials is a pass over all of them; Tune's loop steps ~10 times a
        # second: at most 4 counts a second keep a large study's cost per trial flat.
        if now - self._last_count < 0.25:
            return
        self._last_count = now
        done = sum(t.status in _DONE for t in trials)
        if done != self._last_done or now - self._last_print >= self.interval_s:
            self._emit(self.line(trials))
            self._last_print = now
            self._last_done = done

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._emit(self.line(trials))
