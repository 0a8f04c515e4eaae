"""Ctrl-C and SIGTERM in a study driver: stop launching trials, save, mark, clean up, say how to resume.

A terminal sends SIGINT to the driver's whole process group; Kubernetes, SLURM and spot reclaims send
SIGTERM to the driver and SIGKILL after a grace period. Both take the same path here:

* The first signal asks Tune to stop: the handler calls Tune's own stop handler (Tune registers it
  for SIGUSR1 in every ``Tuner.fit``; its SIGINT handler is turned off with
  ``TUNE_DISABLE_SIGINT_HANDLER=1`` so that the signal is ours to record). Tune then stops its
  trials, saves the experiment state one last time and returns; the runner closes the unfinished
  trial runs and the study run as KILLED and raises :class:`StudyInterrupted`, which unwinds the
  study (no further phase, no analysis) through every ``finally`` (Ray is shut down, its worker
  processes waited for). Outside ``Tuner.fit`` the handler raises :class:`StudyInterrupted` at once.
* A second signal during that shutdown stops at once: the Ray processes this driver started are
  killed and the process exits with the same status, without a traceback. The next run resumes from
  the last experiment state Tune saved and re-opens the runs left open.
* The exit status is the shells' ``128 + signal``: 130 for SIGINT, 143 for SIGTERM.

Ray replaces the driver's SIGTERM handler when it connects (``ray.init`` installs a Python handler
calling ``sys.exit``, and its core worker a native one that aborts with a stack dump), so
:func:`reinstall` puts ours back after every ``ray.init`` (:func:`workers.session.ray_session`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from workers.ray_internals import is_tune_stop_handler

__all__ = [
    "StudyInterrupted",
    "fitting",
    "install",
    "installed",
    "raise_if_interrupted",
    "received",
    "reinstall",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state: dict[str, object] = {"installed": False, "fitting": False}
_received: list[int] = []


class StudyInterrupted(KeyboardInterrupt):
    """The study was stopped by a signal; its state is saved and the same command resumes it.

    A ``KeyboardInterrupt``, not an ``Exception``: every ``except Exception`` that keeps a study going
    past a failure of its own (an estimate that cannot be made, a plot that cannot be drawn) must let
    a stop through. (It was a ``StudyError`` once: Ctrl-C during the start-up estimate printed "no
    estimate" and the study ran on.)

    Attributes:
        signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
        exit_code: ``128 + signum``, as shells report a process ended by that signal.
    """

    def __init__(self, signum: int, message: str | None = None) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(
            message or f"study stopped by {name}: its state is saved; run the same command again to resume it"
        )


def installed() -> bool:
    """Whether this process handles SIGINT/SIGTERM as a study driver (:func:`install` was called)."""
    return bool(_state["installed"])


def received() -> int | None:
    """The first stop signal this process received, ``None`` if none."""
    return _received[0] if _received else None


def raise_if_interrupted() -> None:
    """Raise :class:`StudyInterrupted` when a stop signal was received."""
    if _received:
        raise StudyInterrupted(_received[0])


def _stop_now(signum: int) -> None:
    """The second signal: kill the Ray processes this driver started and exit without unwinding."""
    sys.stderr.write(
        f"\n{signal.Signals(signum).name} again: stopping now; the study resumes from its last saved "
        "state when the same command runs again\n"
    )
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    os._exit(128 + signum)


def _tune_stop_handler() -> object | None:
    handler = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
    return handler if is_tune_stop_handler(handler) else None


def _handle(signum: int, frame: FrameType | None) -> None:
    if _received:
        _stop_now(signum)
    _received.append(signum)
    name = signal.Signals(signum).name
    tune_stop = _tune_stop_handler() if _state["fitting"] else None
    if tune_stop is not None:
        sys.stderr.write(
            f"\n{name} received: stopping the study (no new trials; saving its state; "
            "press Ctrl-C again to stop at once)\n"
        )
        sys.stderr.flush()
        tune_stop(signal.SIGUSR1, frame)  # type: ignore[operator]
        return
    raise StudyInterrupted(signum)


def install() -> None:
    """Handle SIGINT and SIGTERM as a study driver (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    _state["installed"] = True
    reinstall()


def reinstall() -> None:
    """Put the handlers back after something replaced them (``ray.init`` does, for SIGTERM)."""
    if not _state["installed"] or threading.current_thread() is not threading.main_thread():
        return
    for signum in _SIGNALS:
        signal.signal(signum, _handle)


@contextlib.contextmanager
def fitting() -> Iterator[None]:
    """Around ``Tuner.fit``: a stop signal asks Tune to stop instead of raising at once."""
    reinstall()
    if installed() and hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        # A previous fit's stop handler is stale (its event is dead): a signal before this fit
        # installs its own must raise instead of being handed to it.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _state["fitting"] = True
    try:
        yield
    finally:
        _state["fitting"] = False
