"""Riding out an MLflow outage inside Tune's driver loop: one try per call, short HTTP limits, and a
doubling back-off during which nothing is sent (results queue); a bounded flush at the end."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator

from workers.tracking.store import MlflowUnavailable, rejected
from workers.tracking.writer import MlflowWriter

logger = logging.getLogger(__name__)


class OutageBackoff(MlflowWriter):
    """The back-off half of :class:`~workers.tracking.MlflowTrackingCallback`.

    State (reset by the callback's ``_reset_runtime``): ``_looping`` (inside a Tune hook),
    ``_down_until`` (monotonic time before which nothing is sent; ``inf`` once the final flush gave
    up), ``_backoff`` (the current pause), ``_recovered`` (MLflow answered again: catch up),
    ``_final_deadline`` (the end of the final flush, once it began).
    """

    _looping: bool
    _down_until: float
    _backoff: float
    _recovered: bool
    _final_deadline: float | None

    def _reset_backoff(self) -> None:
        self._looping = False
        self._down_until = 0.0
        self._backoff = 0.0
        self._recovered = False
        self._final_deadline = None

    def _queued_trials(self) -> int:
        """How many trials have results waiting (for the log line); overridden by the callback."""
        return 0

    def _in_loop(self) -> bool:
        return self._looping

    def _deadline(self) -> float | None:
        return self._final_deadline

    @contextlib.contextmanager
    def _loop(self) -> Iterator[None]:
        """Around every Tune hook: calls inside get one try and the short HTTP limits."""
        self._looping = True
        try:
            yield
        finally:
            self._looping = False

    def _before_call(self) -> None:
        if self._down_until == math.inf:
            raise MlflowUnavailable("MLflow unreachable; the final flush gave up")
        if time.monotonic() < self._down_until:
            raise MlflowUnavailable(
                f"MLflow unreachable; next attempt in {self._down_until - time.monotonic():.0f} s"
            )

    def _after_call(self, error: Exception | None) -> None:
        if error is not None and rejected(error):
            return  # MLflow answered (and said no): not an outage, nothing to back off from
        if error is None:
            if self._backoff > 0 or self._down_until > 0:
                logger.warning("MLflow answers again; catching up on queued results")
                self._recovered = True
            self._backoff = 0.0
            self._down_until = 0.0
            return
        if self._final_deadline is not None:
            self._down_until = math.inf  # one failure ends this pass of the final flush
            logger.error("MLflow unreachable during the final flush: %s", error)
            return
        self._backoff = min(self.retry.reconnect_max_s, max(self.retry.reconnect_s, 2 * self._backoff))
        self._down_until = time.monotonic() + self._backoff
        logger.warning(
            "MLflow unreachable (%s); %d trial(s) with queued results, next attempt in %.0f s",
            error,
            self._queued_trials(),
            self._backoff,
        )

    def _begin_final_flush(self) -> None:
        """The end of the study: one more try even when backed off, then a bounded flush."""
        if self._final_deadline is None:
            from workers.interrupts import received

            # A stopped study must exit within a scheduler's grace period: a short flush then (what
            # is not delivered is delivered by the next run).
            bound = self.retry.final_flush_s if received() is None else min(self.retry.final_flush_s, 15.0)
            self._final_deadline = time.monotonic() + bound
            if self._down_until != math.inf:
                self._down_until = 0.0
