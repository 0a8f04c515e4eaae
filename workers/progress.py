"""A terse progress line for a running study phase: ``12/18 trials, 2 running, ETA 3 s, best so far``.

Tune's own reporters print wide tables per trial (:mod:`workers.console` sends them to the study's
``driver.log``); a study of dozens of trials wants one line, refreshed in place on a terminal, and a
few lines in a job log. :func:`quiet_checkpoint_logs` keeps Ray's per-epoch "Checkpoint successfully
created" lines out of what the driver prints.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from ray.tune import Callback

from workers import ray_internals
from workers.console import CHECKPOINT_LINE, SHOW_CHECKPOINT_LOGS_ENV

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

__all__ = [
    "CHECKPOINT_LINE",
    "Counts",
    "ProgressCallback",
    "SyncFailureOneLine",
    "close_progress_lines",
    "format_eta",
    "quiet_checkpoint_logs",
]


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
        ray_internals.TRAIN_SYNCER_LOGGER: "Last sync command failed",
        ray_internals.EXPERIMENT_STATE_LOGGER: "Saving experiment state to storage at",
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
    Ray's worker-output dispatcher (private API, :func:`workers.ray_internals.worker_stream_dispatcher`):
    its handlers are wrapped to skip those lines, in this driver only; the trials'
    own log files keep them. Call after ``ray.init`` (the dispatcher's handlers exist from then on).
    ``AUTONORM_SHOW_CHECKPOINT_LOGS=1`` keeps them. Returns whether the filter is in place.
    """
    env = os.environ if environ is None else environ
    if env.get(SHOW_CHECKPOINT_LOGS_ENV) == "1":
        return False
    # A trial run in this very process (local mode) logs it here directly.
    logging.getLogger(ray_internals.TRAIN_STORAGE_LOGGER).setLevel(logging.WARNING)
    if dispatcher is None:
        dispatcher = ray_internals.worker_stream_dispatcher()
        if dispatcher is None:
            return False
    return ray_internals.wrap_dispatcher_handlers(dispatcher, _without_checkpoint_lines, "_autonorm_quiet")


def format_eta(seconds: float | None) -> str:
    """``1 h 02 min``, ``4 min 05 s``, ``12 s``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def _trials(n: int) -> str:
    """``trial`` for one, ``trials`` for any other count."""
    return "trial" if n == 1 else "trials"


_DONE = ("TERMINATED", "ERROR")
_OPEN: weakref.WeakSet[ProgressCallback] = weakref.WeakSet()


def close_progress_lines() -> None:
    """End every line still refreshed in place (a phase stopped short: Ctrl-C, an error), so what
    is printed next starts on a line of its own. Tune's restored callbacks are its own copies,
    which the runner never sees: they are found here."""
    for callback in list(_OPEN):
        callback.close()


_MEMBER_DONE = ("completed", "diverged", "error", "pruned")
_FAILED = ("diverged", "error")


@dataclass
class Counts:
    """What the progress line says, counted in trials (a stacked group's members each count)."""

    done: int = 0
    running: int = 0
    failed: int = 0
    total: int = 0
    done_ids: set[str] = field(default_factory=set)
    best: tuple[float, Any] | None = None  # (value, the trial or member view)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


class ProgressCallback(Callback):  # type: ignore[misc]
    """A study phase's progress, counted in trials (the members of a stacked group count one each).

    ``[confirm-epochs] 12/18 trials, 2 running, ETA 3 s, best so far: linear 0.94``

    On a terminal the line is refreshed in place (tqdm). Elsewhere (CI, a pipe, a job log) one line
    when the phase starts, at most one progress line every ``interval_s`` (30 s) and one when it
    ends. The ETA assumes the remaining trials take as long as the ones finished *since this driver
    started* did on average: after a resume, trials finished by an earlier driver count as done but
    not against this driver's clock. "Best so far" is the best finite ``metric`` among completed
    trials, named by ``label`` (the trial's arm, or its readable name).

    Args:
        name: the phase (or study) name shown in brackets.
        total: planned trials (members, for stacked groups).
        metric / mode: the phase's selection metric and its direction (no "best" without them).
        label: names a trial (or a member view) in "best so far"; picklable (Tune pickles callbacks).
        interval_s: minimum seconds between two progress lines when not on a terminal.
        stream: where lines go (default: :func:`workers.console.terminal`, resolved at print time so
            pickling is safe).
        clock: time source, injectable for tests.
        tty: whether ``stream`` is a terminal (default: ask it).
    """

    def __init__(
        self,
        *,
        name: str,
        total: int | None = None,
        metric: str | None = None,
        mode: str = "max",
        label: Callable[[Any], str] | None = None,
        interval_s: float = 30.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ) -> None:
        self.name = name
        self.total = total
        self.metric = metric
        self.mode = mode
        self.label = label
        self.interval_s = interval_s
        self._stream = stream
        self._clock = clock
        self._tty = tty
        self._reset()

    def _reset(self) -> None:
        self._start: float | None = None
        self._last_print = -float("inf")
        self._last_count = -float("inf")
        self._done_before: frozenset[str] | None = None
        self._bar: Any = None
        self._started = False
        self._ended = False
        self.lines: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_stream"] = None  # sys.stdout does not pickle; a restored copy prints to the terminal
        state["_tty"] = None
        for key in (
            "_start",
            "_last_print",
            "_last_count",
            "_done_before",
            "_bar",
            "_started",
            "_ended",
            "lines",
        ):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A study started before this version pickled fewer fields (``unit``, a 10 s interval).
        self.__dict__.update(state)
        self.__dict__.pop("unit", None)
        for key, default in (
            ("metric", None),
            ("mode", "max"),
            ("label", None),
            ("_tty", None),
            ("_stream", None),
        ):
            self.__dict__.setdefault(key, default)
        self.interval_s = max(float(getattr(self, "interval_s", 30.0)), 30.0)
        if not callable(getattr(self, "_clock", None)):
            self._clock = time.monotonic
        self._reset()

    # ---------------------------------------------------------------------------- counting

    def counts(self, trials: list[Trial]) -> Counts:
        """Done, running and failed trials (members of groups each count), and the best one."""
        from workers.members import MemberTrial, member_params

        out = Counts()
        sign = -1.0 if self.mode == "min" else 1.0
        for trial in trials:
            members = member_params(getattr(trial, "config", None))
            result = getattr(trial, "last_result", None) or {}
            status = trial.status
            if members is None:
                if status in _DONE:
                    out.done += 1
                    out.done_ids.add(trial.trial_id)
                    own = result.get("status")
                    if status == "ERROR" or own in _FAILED:
                        out.failed += 1
                    elif self.metric and own in (None, "completed"):
                        self._consider(out, _finite(result.get(self.metric)), sign, trial)
                elif status == "RUNNING":
                    out.running += 1
                continue
            for k in range(len(members)):
                own = result.get(f"status@m{k}")
                if status in _DONE or own in _MEMBER_DONE:
                    out.done += 1
                    out.done_ids.add(f"{trial.trial_id}-m{k}")
                    if status == "ERROR" or own in _FAILED:
                        out.failed += 1
                    elif own == "completed" and self.metric:
                        value = _finite(result.get(f"{self.metric}@m{k}"))
                        if value is not None:
                            self._consider(out, value, sign, (trial, k, members[k]))
                elif status == "RUNNING":
                    out.running += 1
        out.total = max(self.total or 0, out.done + out.running)
        if out.best is not None and isinstance(out.best[1], tuple):
            trial, k, params = out.best[1]
            out.best = (out.best[0], MemberTrial(trial, k, params))
        return out

    @staticmethod
    def _consider(out: Counts, value: float | None, sign: float, who: Any) -> None:
        if value is not None and (out.best is None or sign * value > sign * out.best[0]):
            out.best = (value, who)

    def _best(self, counts: Counts) -> str:
        if counts.best is None:
            return ""
        value, who = counts.best
        name = ""
        if self.label is not None:
            try:
                name = str(self.label(who))
            except Exception:
                name = ""
        return f"{name} {value:.4g}".strip()

    def _eta(self, counts: Counts) -> float | None:
        if counts.done >= counts.total:
            return 0.0
        if self._done_before is None:
            self._done_before = frozenset(counts.done_ids)
        done_here = len(counts.done_ids - self._done_before)
        if self._start is None or done_here == 0:
            return None
        return (self._clock() - self._start) / done_here * (counts.total - counts.done)

    def line(self, trials: list[Trial]) -> str:
        """``[phase] 12/18 trials, 2 running, ETA 3 s, best so far: linear 0.94``."""
        return self._line(self.counts(trials))

    def _line(self, counts: Counts) -> str:
        failed = f" ({counts.failed} failed)" if counts.failed else ""
        best = self._best(counts)
        return (
            f"[{self.name}] {counts.done}/{counts.total} {_trials(counts.total)}{failed}, {counts.running} running, "
            f"ETA {format_eta(self._eta(counts))}" + (f", best so far: {best}" if best else "")
        )

    def _end_line(self, counts: Counts) -> str:
        took = format_eta(self._clock() - self._start) if self._start is not None else "?"
        failed = f" ({counts.failed} failed)" if counts.failed else ""
        best = self._best(counts)
        return (
            f"[{self.name}] done: {counts.done}/{counts.total} {_trials(counts.total)}{failed} in {took}"
            + (f", best: {best}" if best else "")
        )

    # ---------------------------------------------------------------------------- output

    def _out(self) -> TextIO:
        if self._stream is not None:
            return self._stream
        from workers.console import terminal

        return terminal()

    def _is_tty(self) -> bool:
        if self._tty is None:
            try:
                self._tty = bool(self._out().isatty())
            except Exception:
                self._tty = False
        return self._tty

    def _emit(self, text: str) -> None:
        self.lines.append(text)
        print(text, file=self._out(), flush=True)

    def _show(self, text: str) -> None:
        """The line refreshed in place on a terminal."""
        self.lines.append(text)
        if self._bar is None:
            from tqdm import tqdm

            # The terminal's size, given (a pseudo-terminal may say 0 x 0, which tqdm takes for "no room":
            # it then shows nothing); the line is trimmed to the width, as a wrapped line would not be
            # overwritten by the next refresh.
            size = shutil.get_terminal_size((120, 24))
            self._bar = tqdm(
                total=None,
                bar_format="{desc}",
                file=self._out(),
                leave=True,
                ncols=size.columns,
                nrows=max(size.lines, 2),
                mininterval=0,
            )
            _OPEN.add(self)
        self._bar.set_description_str(text, refresh=True)

    def close(self) -> None:
        """End the in-place line (a phase stopped short leaves its last state on the terminal)."""
        bar, self._bar = getattr(self, "_bar", None), None
        _OPEN.discard(self)
        if bar is not None:
            bar.close()

    def _begin(self) -> None:
        """The phase's start: its first line off a terminal (on one, the refreshed line shows it)."""
        if self._started:
            return
        self._started = True
        if self._start is None:
            self._start = self._clock()
        if self._is_tty():
            return
        n = self.total
        self._emit(f"[{self.name}] started: {n} {_trials(n)}" if n else f"[{self.name}] started")
        self._last_print = self._clock()

    # ---------------------------------------------------------------------------- Tune's hooks

    def setup(
        self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any
    ) -> None:
        self._start = self._clock()
        self._begin()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        now = self._clock()
        if self._start is None:
            self._start = now
        if self._done_before is None:
            # The first look at the trials: what is finished now was finished by an earlier driver.
            self._done_before = frozenset(self.counts(trials).done_ids)
        self._begin()
        if self._is_tty():
            # Counting is a pass over every trial; Tune's loop steps ~10 times a second.
            if now - self._last_count < 0.5:
                return
            self._last_count = now
            self._show(self.line(trials))
            return
        if now - self._last_print < self.interval_s:
            return
        self._last_print = now
        self._emit(self.line(trials))

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        if self._ended:
            return
        self._ended = True
        self._begin()
        counts = self.counts(trials)
        if self._is_tty():
            self._show(self._end_line(counts))
            self.close()
            return
        self._emit(self._end_line(counts))
