"""MLflow tracking from the Tune driver: one parent run per study, one child run per trial.

Modules: :mod:`~workers.tracking.names` (tag keys, run names, source tags, links),
:mod:`~workers.tracking.store` (tracking URIs, the sqlite schema, HTTP limits),
:mod:`~workers.tracking.writer` (client + retries), :mod:`~workers.tracking.outage` (back-off),
:mod:`~workers.tracking.runs` (finding/creating runs), :mod:`~workers.tracking.callback` (the Tune
callback), :mod:`~workers.tracking.study_run` (the study's own run).

Our own Tune callback instead of Ray's ``MLflowLoggerCallback``, which sends one request per
metric, logs Ray internals, makes no parent run and duplicates runs after ``Tuner.restore``
(docs/architecture.md). What makes this one duplicate-free across driver crashes:

* Nothing is remembered across processes. ``Tuner.restore`` brings back the callback pickled at
  the first start; pickling drops the client and every cache, and :meth:`setup` rebuilds the
  ``trial_id -> run`` map by searching the parent's children for their ``ray.trial_id`` tag.
* The parent is found again by a stable key (``autonorm.run_key``, a hash of the experiment
  path), never stored. Every run of a study also carries the study's own key
  (``autonorm.study_key``, the study run's ``autonorm.run_key``), name and kind.
* A child is created at its trial's first result; metrics are logged with ``step = epoch`` (the
  trial's own epoch, which survives restarts) and epochs already logged are skipped.
* Runs are closed at the end: children still RUNNING as FINISHED (or FAILED / KILLED), the parent in
  the runner's ``finally``.

Only this driver-side callback talks to MLflow, so the sqlite default never sees concurrent writers.

An MLflow outage does not stop the study, nor slow it down (:class:`RetryPolicy`):

* Inside Tune's driver loop every request is one try with a short HTTP timeout and no HTTP retries
  (``MLFLOW_HTTP_REQUEST_TIMEOUT`` / ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, set around each call), so
  a dead server costs the loop at most one timeout per reconnect attempt.
* After a failure nothing is sent until a back-off has passed (doubling up to a cap); results that
  arrive meanwhile are queued in memory. The first call that succeeds again flushes every trial's
  queue and closes the runs of trials that finished meanwhile.
* At the end one last flush runs with longer timeouts and retries, bounded in time; trials whose
  metrics or final status could not be delivered are listed (:meth:`MlflowTrackingCallback.undelivered_trials`,
  and the parent's ``autonorm.undelivered_trials`` tag when the parent can still be written).
* A tracking URI MLflow has no store for (``ftp://...``, a file store) is a ``ValueError`` when the
  tracker is built, at study start, never an outage.
"""

from __future__ import annotations

from workers.tracking.callback import MlflowTrackingCallback
from workers.tracking.names import (
    DEFAULT_UI,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    GROUP_MEMBERS_FILE,
    ROLE_PHASE,
    ROLE_STUDY,
    ROLE_SUMMARY,
    ROLE_TRIAL,
    SOURCE_GIT_COMMIT,
    SOURCE_NAME,
    SOURCE_TYPE,
    STUDY_WIDE_TAGS,
    TAG_ARM,
    TAG_KIND,
    TAG_PARENT,
    TAG_PHASE,
    TAG_ROLE,
    TAG_RUN_KEY,
    TAG_SPEC_HASH,
    TAG_STUDY_KEY,
    TAG_STUDY_NAME,
    TAG_TRIAL_ID,
    TAG_TRIAL_STATUS,
    TAG_UNDELIVERED,
    TRIAL_TAG_PREFIX,
    TrialDirnamer,
    TrialNamer,
    group_members,
    group_name,
    mlflow_links,
    render_run_name,
    source_tags,
    study_key,
    trial_index,
    trial_tag_templates,
)
from workers.tracking.store import (
    MlflowUnavailable,
    check_tracking_uri,
    default_tracking_uri,
    ensure_sqlite_schema,
    flatten_params,
    http_limits,
    redact_uri,
)
from workers.tracking.study_run import StudyTracker
from workers.tracking.writer import MlflowWriter, RetryPolicy

__all__ = [
    "DEFAULT_UI",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "GROUP_MEMBERS_FILE",
    "ROLE_PHASE",
    "ROLE_STUDY",
    "ROLE_SUMMARY",
    "ROLE_TRIAL",
    "SOURCE_GIT_COMMIT",
    "SOURCE_NAME",
    "SOURCE_TYPE",
    "STUDY_WIDE_TAGS",
    "TAG_ARM",
    "TAG_KIND",
    "TAG_PARENT",
    "TAG_PHASE",
    "TAG_ROLE",
    "TAG_RUN_KEY",
    "TAG_SPEC_HASH",
    "TAG_STUDY_KEY",
    "TAG_STUDY_NAME",
    "TAG_TRIAL_ID",
    "TAG_TRIAL_STATUS",
    "TAG_UNDELIVERED",
    "TRIAL_TAG_PREFIX",
    "MlflowTrackingCallback",
    "MlflowUnavailable",
    "MlflowWriter",
    "RetryPolicy",
    "StudyTracker",
    "TrialDirnamer",
    "TrialNamer",
    "check_tracking_uri",
    "default_tracking_uri",
    "ensure_sqlite_schema",
    "flatten_params",
    "group_members",
    "group_name",
    "http_limits",
    "mlflow_links",
    "redact_uri",
    "render_run_name",
    "source_tags",
    "study_key",
    "trial_index",
    "trial_tag_templates",
]
