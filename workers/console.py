"""What a study prints, and what goes to its ``driver.log`` instead.

A study's terminal holds the service's own lines (``[<study>] ...``, ``[<phase>] ...``, the verdict);
everything Ray, Tune, MLflow and Optuna say goes to ``<study dir>/driver.log``:

* the ``ray`` (``ray.tune``, ``ray.train`` included), ``mlflow``, ``optuna`` and ``alembic`` loggers,
  and Python warnings (``logging.captureWarnings``). Their ERROR records from Ray's core and MLflow
  (not from ``ray.tune`` / ``ray.train``, whose trial failures the progress line counts) are also
  printed, as the one kind of foreign line worth seeing at once;
* what Tune itself prints while a phase runs (its ``Configuration for experiment`` box, "View
  detailed results here", the TensorBoard hint): ``sys.stdout`` is the log during ``Tuner.fit``
  (:func:`tune_output`), while the progress line writes to the terminal captured before
  (:func:`terminal`);
* what trial workers print that Ray forwards to the driver, except the service's own lines (those
  that start with ``[<name>] ``, :data:`OWN_LINE`), which stay on the terminal.

One :class:`StudyConsole` is active per process at a time (:class:`workers.study.StudyRunner` opens
it); without one, nothing here changes anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TextIO

from workers import ray_internals
from workers.ray_internals import AUTOSCALER_EVENT

__all__ = [
    "CHECKPOINT_LINE",
    "DRIVER_LOG",
    "OWN_LINE",
    "ROUTED_LOGGERS",
    "StudyConsole",
    "active",
    "format_wall",
    "route_worker_output",
    "terminal",
    "tune_output",
]

DRIVER_LOG = "driver.log"
"""The file in the study directory that holds what Ray, Tune, MLflow and Optuna printed."""
ROUTED_LOGGERS = ("ray", "mlflow", "optuna", "alembic", "py.warnings")
"""Loggers whose records go to the driver log (their children's too)."""
_LOG_ONLY = ("ray.tune", "ray.train")
"""Loggers whose records never reach the terminal, whatever their level."""
CHECKPOINT_LINE = "Checkpoint successfully created"
"""Ray Train's INFO line (its storage logger, :data:`workers.ray_internals.TRAIN_STORAGE_LOGGER`) at
every checkpoint a trial reports:
once per trial per epoch, forwarded from the trial's process to the driver's output."""
SHOW_CHECKPOINT_LOGS_ENV = "AUTONORM_SHOW_CHECKPOINT_LOGS"
OWN_LINE = re.compile(r"^\[[^\]\s]+\] ")
"""A line of the service's own (``[<study or phase>] ...``), forwarded from a trial worker."""


def format_wall(seconds: float | None) -> str:
    """A study's wall time as every output prints it (the run's closing lines, ``status``, ``ls``,
    the report): minutes, one decimal (``0.6 min``); ``-`` when unknown. ``verdict.json``,
    ``status --json`` and ``ls --json`` keep the seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds != seconds:
        return "-"
    if seconds in (float("inf"), float("-inf")):
        return "-"
    return f"{seconds / 60:.1f} min"


class _LogFile:
    """The driver log as a text stream, safe to write from several threads; whole lines only."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8", errors="replace")
        self._write_lock = threading.Lock()
        self._partial = ""

    def write(self, text: str) -> int:
        with self._write_lock:
            if self._file.closed:
                return len(text)
            self._partial += text
            if "\n" in self._partial:
                done, _, self._partial = self._partial.rpartition("\n")
                self._file.write(done + "\n")
                self._file.flush()
        return len(text)

    def flush(self) -> None:
        with self._write_lock:
            if not self._file.closed:
                self._file.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        with self._write_lock:
            if self._partial and not self._file.closed:
                self._file.write(self._partial + "\n")
            self._partial = ""
            self._file.close()


class _TerminalErrors(logging.Handler):
    """ERROR records of the routed loggers (not Tune's or Train's) on ``sys.stderr``, as Python's
    last-resort handler would print them."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if _log_only(record.name):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _log_only(name: str) -> bool:
    return any(name == n or name.startswith(n + ".") for n in _LOG_ONLY)


class StudyConsole:
    """Route a study's foreign output to ``log_path`` for the ``with`` block (see the module).

    Args:
        log_path: the driver log (appended to: a resumed study adds to its log).
        name: the study's name, for the one line that says where the log is.
        announce: print that line (``[<name>] Ray, Tune and MLflow output -> <log_path>``).
        stream: the terminal (default: ``sys.stdout`` when the block starts).
    """

    _active: ClassVar[StudyConsole | None] = None

    def __init__(
        self, log_path: Path, *, name: str = "", announce: bool = True, stream: TextIO | None = None
    ):
        self.log_path = Path(log_path)
        self.name = name
        self.announce = announce
        self.stream = stream
        self.log: _LogFile | None = None
        self._saved: dict[str, tuple[list[logging.Handler], bool]] = {}
        self._handler: logging.Handler | None = None
        self._errors = _TerminalErrors()
        self._captured_warnings = False
        self._outer: StudyConsole | None = None

    # ------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> StudyConsole:
        self._outer = StudyConsole._active
        if self.stream is None:
            self.stream = terminal()
        self.log = _LogFile(self.log_path)
        self.log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} driver started\n")
        handler = logging.StreamHandler(self.log)  # type: ignore[arg-type]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._handler = handler
        self._captured_warnings = not _warnings_captured()
        logging.captureWarnings(True)
        StudyConsole._active = self
        # Optuna gives its logger a terminal handler when it is imported (a search phase imports it
        # later, and logs at once): imported first (~25 ms once Ray and MLflow are), so that it is routed.
        with contextlib.suppress(ImportError):
            import optuna.logging  # noqa: F401
        self.adopt_loggers()
        if self.announce:
            tag = f"[{self.name}] " if self.name else ""
            print(f"{tag}Ray, Tune and MLflow output -> {self.log_path}", file=self.stream, flush=True)
        return self

    def adopt_loggers(self) -> None:
        """Route the loggers of :data:`ROUTED_LOGGERS` (again: a library imported since may have
        given its logger a terminal handler of its own, as Optuna does at its import)."""
        assert self._handler is not None
        for name in ROUTED_LOGGERS:
            target = logging.getLogger(name)
            kept, _ = self._saved.setdefault(name, ([], target.propagate))
            kept += [h for h in target.handlers if h not in (self._handler, self._errors, *kept)]
            target.handlers = [self._handler, self._errors]
            target.propagate = False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for name, (handlers, propagate) in self._saved.items():
            target = logging.getLogger(name)
            target.handlers = handlers
            target.propagate = propagate
        self._saved.clear()
        if self._captured_warnings:
            logging.captureWarnings(False)
        StudyConsole._active = self._outer
        if self.log is not None:
            self.log.close()


def _warnings_captured() -> bool:
    return getattr(logging, "_warnings_showwarning", None) is not None


def active() -> StudyConsole | None:
    """The console of the study running in this process, if any."""
    return StudyConsole._active


def terminal() -> TextIO:
    """Where the service's own lines go: the active console's terminal, else ``sys.stdout``."""
    console = StudyConsole._active
    if console is not None and console.stream is not None:
        return console.stream
    return sys.stdout


@contextlib.contextmanager
def tune_output() -> Iterator[None]:
    """``sys.stdout`` is the driver log for the block (what Tune prints while it runs a phase);
    nothing changes without an active console."""
    console = StudyConsole._active
    if console is None or console.log is None:
        yield
        return
    console.adopt_loggers()
    with contextlib.redirect_stdout(console.log):  # type: ignore[type-var]
        yield


def _routing(handler: Callable[[Any], None]) -> Callable[[Any], None]:
    def handle(data: Any) -> None:
        console = StudyConsole._active
        log = console.log if console is not None else None
        lines = data.get("lines") if isinstance(data, dict) else None
        if log is None or not isinstance(lines, list) or not lines:
            handler(data)
            return
        if data.get("pid") == "autoscaler":  # Ray prints only its events of these: so does the log
            lines = [line for line in lines if AUTOSCALER_EVENT in str(line)]
        if (
            os.environ.get(SHOW_CHECKPOINT_LOGS_ENV) != "1"
        ):  # one a trial epoch: the trials' own logs have them
            lines = [line for line in lines if CHECKPOINT_LINE not in str(line)]
        own = [line for line in lines if OWN_LINE.match(str(line))]
        if len(own) != len(lines):
            who = data.get("actor_name") or data.get("task_name") or ""
            prefix = f"({who} pid={data.get('pid')}) " if who else f"(pid={data.get('pid')}) "
            log.write("".join(f"{prefix}{line}\n" for line in lines if not OWN_LINE.match(str(line))))
        if own:
            handler(data if own == data["lines"] else {**data, "lines": own})

    handle._autonorm_routed = True  # type: ignore[attr-defined]
    return handle


def route_worker_output(dispatcher: Any = None) -> bool:
    """What Ray forwards from the trial workers to this driver goes to the driver log, except the
    service's own lines (:data:`OWN_LINE`). Wraps the handlers of Ray's worker-output dispatcher
    (private API, :func:`workers.ray_internals.worker_stream_dispatcher`; they exist once ``ray.init``
    has run). Returns whether the routing is in place (``False`` without a console)."""
    console = StudyConsole._active
    if console is None or console.log is None:
        return False
    if dispatcher is None:
        dispatcher = ray_internals.worker_stream_dispatcher()
        if dispatcher is None:
            return False
    return ray_internals.wrap_dispatcher_handlers(dispatcher, _routing, "_autonorm_routed")
