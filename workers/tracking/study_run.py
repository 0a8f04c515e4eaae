"""The study's own MLflow run (:class:`StudyTracker`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from workers.tracking.names import (
    ROLE_STUDY,
    ROLE_SUMMARY,
    TAG_ARM,
    TAG_PARENT,
    TAG_PHASE,
    TAG_ROLE,
    TAG_RUN_KEY,
    TAG_STUDY_KEY,
    TRIAL_TAG_PREFIX,
    source_tags,
)
from workers.tracking.store import check_tracking_uri
from workers.tracking.writer import MlflowWriter, RetryPolicy


class StudyTracker(MlflowWriter):
    """The study's own MLflow run: parent of every phase run (or of the trial runs of a one-plan
    study), carrier of the study-level outputs (spec, verdict, reports, plots, verdict tags).

    Found again by its stable ``key`` (:func:`study_key` of the study directory), never remembered,
    so a rerun after a crash re-opens the same run.
    """

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment_name: str,
        key: str,
        artifact_location: str | None = None,
        retry: RetryPolicy | None = None,
        run_name: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.key = key
        self.artifact_location = artifact_location
        self.retry = retry or RetryPolicy()
        self.run_name = run_name or experiment_name
        check_tracking_uri(tracking_uri)
        self._client = None
        self._experiment_id = None
        self.run_id: str | None = None
        self._final_deadline: float | None = None

    def _deadline(self) -> float | None:
        return self._final_deadline

    def open(
        self,
        *,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        artifacts: Mapping[str, str] | None = None,
    ) -> str:
        """Find (or create) the study run, mark it RUNNING, add missing params, write ``artifacts``."""
        from mlflow.entities import Param, RunTag

        experiment_id = self._ensure_experiment()
        # A phase's tags (its phase, trial-tag templates) are no study run's.
        tags = {
            k: v for k, v in (tags or {}).items() if k != TAG_PHASE and not k.startswith(TRIAL_TAG_PREFIX)
        }
        own = {TAG_ROLE: ROLE_STUDY, TAG_RUN_KEY: self.key, TAG_STUDY_KEY: self.key}
        found = self._search(f"tags.`{TAG_RUN_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{ROLE_STUDY}'")
        if not found:  # made before runs carried their own key
            found = self._search(
                f"tags.`{TAG_STUDY_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{ROLE_STUDY}'"
            )
        if found:
            run = min(found, key=lambda r: r.info.start_time or 0)
            self.run_id = run.info.run_id
            existing = dict(run.data.params)
            if run.info.status != "RUNNING":
                self._call(self.client.update_run, self.run_id, status="RUNNING")
        else:
            all_tags = {**own, **source_tags(), **tags}
            run = self._call(self.client.create_run, experiment_id, tags=all_tags, run_name=self.run_name)
            self.run_id = run.info.run_id
            existing = {}
        # Params are immutable in MLflow: only the ones the run does not have yet.
        new_params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items() if k not in existing]
        tag_items = [RunTag(k, str(v)) for k, v in {**own, **source_tags(), **tags}.items()]
        for i in range(0, max(len(new_params), 1), 100):
            self._call(self.client.log_batch, self.run_id, params=new_params[i : i + 100], tags=tag_items)
            tag_items = []
        for name, text in (artifacts or {}).items():
            self._call(self.client.log_text, self.run_id, text, name)
        return self.run_id

    def log_outputs(
        self,
        *,
        files: Iterable[Path] = (),
        tags: Mapping[str, str] | None = None,
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        artifact_path: str | None = None,
    ) -> None:
        """Study outputs on the study run: files (at the artifact root unless ``artifact_path``),
        tags, final metrics (step 0), params not yet set."""
        from mlflow.entities import Metric, Param, RunTag

        if self.run_id is None:
            raise RuntimeError("StudyTracker.open() first")
        attempts = self.retry.final_attempts
        for path in files:
            self._call(self.client.log_artifact, self.run_id, str(path), artifact_path, attempts=attempts)
        now = int(time.time() * 1000)
        metric_items = [
            Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if math.isfinite(float(v))
        ]
        tag_items = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        existing = self._call(self.client.get_run, self.run_id).data.params
        param_items = [Param(k, str(v)[:6000]) for k, v in (params or {}).items() if k not in existing]
        for i in range(0, max(len(metric_items), 1), 1000):
            self._call(
                self.client.log_batch,
                self.run_id,
                metrics=metric_items[i : i + 1000],
                tags=tag_items if i == 0 else [],
                params=param_items if i == 0 else [],
                attempts=attempts,
            )

    def log_summary(
        self,
        parent_run_id: str,
        *,
        arm: str,
        metrics: Mapping[str, Sequence[tuple[int, float]]],
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """One arm's summary run under ``parent_run_id`` (a phase run): ``autonorm.role=summary``,
        named ``arm``, tagged ``autonorm.arm`` and the study-wide tags, ``metrics[key]`` logged as
        ``(step, value)`` points (non-finite values left out). Found again by parent and arm, so a
        resumed study adds no second one and re-logs no point it already has. Returns its run id."""
        from mlflow.entities import Metric, RunTag

        experiment_id = self._ensure_experiment()
        found = self._search(
            f"tags.`{TAG_PARENT}` = '{parent_run_id}' and tags.`{TAG_ROLE}` = '{ROLE_SUMMARY}' "
            f"and tags.`{TAG_ARM}` = '{arm}'"
        )
        all_tags = {
            **{k: v for k, v in (tags or {}).items() if not k.startswith(TRIAL_TAG_PREFIX)},
            TAG_ROLE: ROLE_SUMMARY,
            TAG_ARM: arm,
            TAG_PARENT: parent_run_id,
            TAG_STUDY_KEY: (tags or {}).get(TAG_STUDY_KEY, self.key),
            **source_tags(),
        }
        logged: set[tuple[str, int]] = set()
        if found:
            run = min(found, key=lambda r: r.info.start_time or 0)
            run_id = run.info.run_id
            for key in run.data.metrics:
                history = self._call(self.client.get_metric_history, run_id, key)
                logged.update((key, int(m.step)) for m in history)
        else:
            run = self._call(self.client.create_run, experiment_id, tags=all_tags, run_name=arm)
            run_id = run.info.run_id
        now = int(time.time() * 1000)
        items = [
            Metric(key, float(value), now, int(step))
            for key, points in metrics.items()
            for step, value in points
            if math.isfinite(float(value)) and (key, int(step)) not in logged
        ]
        tag_items = [RunTag(k, str(v)) for k, v in all_tags.items()] if found else []
        attempts = self.retry.final_attempts
        for i in range(0, max(len(items), 1), 1000):
            self._call(
                self.client.log_batch,
                run_id,
                metrics=items[i : i + 1000],
                tags=tag_items if i == 0 else [],
                attempts=attempts,
            )
        self._call(self.client.set_terminated, run_id, "FINISHED", attempts=attempts)
        return run_id

    def close(self, status: str) -> None:
        """Mark the study run ``status``: one try, then more for at most ``retry.final_flush_s`` (then
        raises), so a study that ends while MLflow is away exits when ``tracking.final_flush_s`` says,
        not after ``final_attempts`` tries with the long HTTP limits."""
        if self.run_id is None:
            return
        try:  # one try whatever the bound (final_flush_s = 0 must still close a run MLflow takes)
            self._call(self.client.set_terminated, self.run_id, status, attempts=1)
            return
        except Exception:
            if self.retry.final_attempts <= 1:
                raise
        self._final_deadline = time.monotonic() + self.retry.final_flush_s
        try:
            self._call(
                self.client.set_terminated, self.run_id, status, attempts=self.retry.final_attempts - 1
            )
        finally:
            self._final_deadline = None
