"""The MLflow writer every study write goes through: a lazy client, retries with back-off."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from workers.tracking.store import MlflowUnavailable, ensure_sqlite_schema, http_limits

if TYPE_CHECKING:
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """How MLflow calls are retried, inside Tune's driver loop and outside it.

    Attributes:
        attempts: tries per call outside the driver loop (study start); inside the loop every call
            is tried once -- the loop waits meanwhile.
        delay_s: first pause between tries of one call; doubles per try.
        final_attempts: tries per call of the last flush at the end of the study.
        loop_timeout_s / loop_http_retries: MLflow's per-request HTTP timeout and retries inside the
            loop (they always apply there).
        timeout_s / http_retries: the same outside the loop, unless set in the environment.
        reconnect_s / reconnect_max_s: after a failed call inside the loop, nothing is sent for
            ``reconnect_s``, doubling per failed reconnect up to ``reconnect_max_s``; results queue.
        final_flush_s: time bound of the last flush (queued metrics, trial runs, the parent run).
        result_flush_s: a running trial's epochs are sent at most this often (its first result and
            its end at once); the epochs in between wait in its queue. 2 s unless the environment
            sets ``AUTONORM_RESULT_FLUSH_S`` (0: every epoch at once, as the fault tests watch them).
    """

    attempts: int = 3
    delay_s: float = 0.5
    final_attempts: int = 6
    loop_timeout_s: int = 5
    loop_http_retries: int = 0
    timeout_s: int = 30
    http_retries: int = 2
    reconnect_s: float = 1.0
    reconnect_max_s: float = 60.0
    final_flush_s: float = 120.0
    result_flush_s: float = field(default_factory=lambda: _env_seconds("AUTONORM_RESULT_FLUSH_S", 2.0))


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return max(0.0, float(raw)) if raw else default
    except ValueError:
        logger.warning("%s=%r is not a number of seconds; using %g", name, raw, default)
        return default


def numeric(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class MlflowWriter:
    """Every MLflow write of a study goes through one of these: a lazily built client, retries with
    exponential back-off (:class:`RetryPolicy`), the sqlite schema created safely, the experiment
    found or created. :class:`MlflowTrackingCallback` (per-trial runs) and :class:`StudyTracker`
    (the study's own run and its outputs) are the two writers.
    """

    tracking_uri: str
    experiment_name: str
    artifact_location: str | None
    retry: RetryPolicy
    _client: MlflowClient | None
    _experiment_id: str | None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    # Overridden by the Tune callback: inside the driver loop, one try with short HTTP limits, and
    # no call at all while backed off after a failure.
    def _in_loop(self) -> bool:
        return False

    def _deadline(self) -> float | None:
        return None

    def _before_call(self) -> None:
        """Raise :class:`MlflowUnavailable` instead of sending a request; nothing by default."""

    def _after_call(self, error: Exception | None) -> None:
        """Told the outcome of every call (after its last try)."""

    def _call(self, fn: Callable[..., _T], *args: Any, attempts: int | None = None, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` with retries and exponential back-off; re-raises the last error."""
        self._before_call()
        live = self._in_loop()
        tries = 1 if live else (attempts or self.retry.attempts)
        deadline = self._deadline()
        delay = self.retry.delay_s
        if live:
            limits = http_limits(self.retry.loop_timeout_s, self.retry.loop_http_retries, override=True)
        else:
            limits = http_limits(self.retry.timeout_s, self.retry.http_retries, override=False)
        with limits:
            for attempt in range(1, tries + 1):
                if deadline is not None and time.monotonic() > deadline:
                    error: Exception = MlflowUnavailable("the final MLflow flush ran past its time bound")
                    self._after_call(error)
                    raise error
                try:
                    result = fn(*args, **kwargs)
                except Exception as exc:
                    if attempt == tries:
                        self._after_call(exc)
                        raise
                    logger.warning("MLflow call failed (attempt %d/%d): %s", attempt, tries, exc)
                    pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
                    time.sleep(pause)
                    delay *= 2
                else:
                    self._after_call(None)
                    return result
        raise AssertionError("unreachable")

    def _end_run(self, run_id: str, status: str) -> None:
        """End a run with ``status`` now: ``MlflowClient.set_terminated`` without the ``get_run`` it
        makes first (only to print the run's URL): one request per trial run instead of two."""
        from mlflow.entities import RunStatus

        self.client._tracking_client.store.update_run_info(
            run_id, run_status=RunStatus.from_string(status), end_time=int(time.time() * 1000), run_name=None
        )

    def _search(self, filter_string: str) -> list[Any]:
        experiment_id = self._ensure_experiment()
        runs: list[Any] = []
        token: str | None = None
        while True:
            page = self._call(
                self.client.search_runs,
                [experiment_id],
                filter_string=filter_string,
                max_results=1000,
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def _ensure_experiment(self) -> str:
        """The experiment's id, created when missing; either way it is marked as a training experiment
        (:data:`~workers.tracking.names.EXPERIMENT_KIND`), so MLflow opens it on its runs table."""
        from workers.tracking.names import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

        if self._experiment_id is None:
            artifact_root = self.artifact_location or ""
            ensure_sqlite_schema(self.tracking_uri, artifact_root=artifact_root or tempfile.gettempdir())
            experiment = self._call(self.client.get_experiment_by_name, self.experiment_name)
            if experiment is None:
                try:
                    experiment_id = self._call(
                        self.client.create_experiment,
                        self.experiment_name,
                        artifact_location=self.artifact_location,
                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                    )
                except Exception:
                    # Another study created it in between: use theirs.
                    experiment = self.client.get_experiment_by_name(self.experiment_name)
                    if experiment is None:
                        raise
                    experiment_id = experiment.experiment_id
            else:
                if experiment.lifecycle_stage == "deleted":
                    self._call(self.client.restore_experiment, experiment.experiment_id)
                experiment_id = experiment.experiment_id
            if experiment is not None and experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                self._call(
                    self.client.set_experiment_tag, experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                )
            self._experiment_id = experiment_id
        return self._experiment_id
