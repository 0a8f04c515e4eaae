"""MLflow tracking from the Tune driver: one parent run per study, one child run per trial.

Our own Tune callback instead of Ray's ``MLflowLoggerCallback``, which sends one request per
metric, logs Ray internals, makes no parent run and duplicates runs after ``Tuner.restore``
(docs/architecture.md). What makes this one duplicate-free across driver crashes:

* Nothing is remembered across processes. ``Tuner.restore`` brings back the callback pickled at
  the first start; pickling drops the client and every cache, and :meth:`setup` rebuilds the
  ``trial_id -> run`` map by searching the parent's children for their ``ray.trial_id`` tag.
* The parent is found again by a stable key (``autonorm.study_key``, a hash of the experiment
  path), never stored.
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

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from ray.tune import Callback

from workers.dotted import get_path
from workers.trainable import config_from_result

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from ray.tune.experiment import Trial

__all__ = [
    "ROLE_PHASE",
    "ROLE_STUDY",
    "ROLE_TRIAL",
    "TAG_ROLE",
    "TAG_STUDY_KEY",
    "TAG_TRIAL_ID",
    "TAG_TRIAL_STATUS",
    "TAG_UNDELIVERED",
    "TRIAL_TAG_PREFIX",
    "MlflowTrackingCallback",
    "MlflowUnavailable",
    "RetryPolicy",
    "StudyTracker",
    "TrialNamer",
    "check_tracking_uri",
    "default_tracking_uri",
    "ensure_sqlite_schema",
    "flatten_params",
    "mlflow_links",
    "render_run_name",
    "source_tags",
    "study_key",
    "trial_index",
    "trial_tag_templates",
]

logger = logging.getLogger(__name__)

TAG_ROLE = "autonorm.role"
TAG_STUDY_KEY = "autonorm.study_key"
TAG_TRIAL_ID = "ray.trial_id"
TAG_TRIAL_STATUS = "autonorm.trial_status"
TAG_PARENT = "mlflow.parentRunId"
TAG_UNDELIVERED = "autonorm.undelivered_trials"
ROLE_STUDY = "study"
ROLE_PHASE = "phase"
ROLE_TRIAL = "trial"
TAG_PHASE = "autonorm.phase"
TAG_ARM = "autonorm.arm"
TRIAL_TAG_PREFIX = "autonorm.trial_tag."
"""A plan tag ``autonorm.trial_tag.<name>`` is not put on the plan's run: each trial run gets the tag
``autonorm.<name>``, its value a :func:`render_run_name` template (``{model.layer.type}``)."""
SOURCE_GIT_COMMIT = "mlflow.source.git.commit"
SOURCE_NAME = "mlflow.source.name"
SOURCE_TYPE = "mlflow.source.type"
DEFAULT_UI = "http://127.0.0.1:5000"

_T = TypeVar("_T")
_REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------- naming, source


_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_MAX_RUN_NAME = 250


def render_run_name(template: str, config: Mapping[str, Any], index: int | str | None) -> str:
    """``template`` with each ``{dotted.path[:format]}`` replaced by the config's value there.

    ``{index}`` is the trial's number; a missing path renders as ``?``; a format spec that does not
    fit the value (``{index:03d}`` of a trial id) falls back to ``str``.
    """

    def field(match: re.Match[str]) -> str:
        path, spec = match.group(1).strip(), match.group(2) or ""
        value = index if path == "index" else get_path(config, path, default=None)
        if value is None:
            return "?"
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return str(value)

    return _FIELD.sub(field, template)[:_MAX_RUN_NAME]


_GENERATED_ID = re.compile(r"[0-9a-f]+_(\d{5})")
_LEADING_INT = re.compile(r"(\d+)")


def trial_index(trial: Any) -> int | None:
    """A trial's 1-based number in its experiment, from the ids Tune gives it.

    Tune's grid generator makes ids ``<prefix>_<counter:05d>`` (counter from 0); its searcher wrapper
    makes random ids and an ``experiment_tag`` starting with a counter from 1. ``None`` otherwise.
    """
    match = _GENERATED_ID.fullmatch(str(getattr(trial, "trial_id", "")))
    if match:
        return int(match.group(1)) + 1
    match = _LEADING_INT.match(str(getattr(trial, "experiment_tag", "") or ""))
    return int(match.group(1)) if match else None


class TrialNamer:
    """Tune's ``trial_name_creator`` and the trial run's MLflow name: ``template`` rendered with the
    trial's resolved config (:func:`render_run_name`). Picklable: Tune stores it with the experiment.

    Args:
        template: the plan's ``run_name``; empty means ``<plan name>-{index:03d}``.
        plan_name: the plan's name.
        base_config: the plan's base trial config (the trial's own params are applied on top).
    """

    def __init__(self, template: str, *, plan_name: str, base_config: Mapping[str, Any]) -> None:
        self.template = template or f"{plan_name}-{{index:03d}}"
        self.base_config = dict(base_config)

    def config(self, trial: Any) -> dict[str, Any]:
        try:
            return config_from_result(trial.last_result, self.base_config, dict(trial.config or {}))
        except Exception:  # a config the trial itself will reject: name it from what we have
            return dict(self.base_config)

    def __call__(self, trial: Any) -> str:
        index = trial_index(trial)
        return render_run_name(
            self.template, self.config(trial), index if index is not None else trial.trial_id
        )


def trial_tag_templates(plan_tags: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split a plan's tags into ``(tags of the plan's run, tag templates of every trial run)``.

    Trial runs get the plan's ``autonorm.phase`` and ``autonorm.arm`` as they are, and
    ``autonorm.<name>`` for every ``autonorm.trial_tag.<name>`` (a template, rendered per trial),
    which does not go on the plan's run.
    """
    parent = {k: v for k, v in plan_tags.items() if not k.startswith(TRIAL_TAG_PREFIX)}
    trial = {k: v for k, v in parent.items() if k in (TAG_PHASE, TAG_ARM)}
    for key, value in plan_tags.items():
        if key.startswith(TRIAL_TAG_PREFIX):
            trial[f"autonorm.{key[len(TRIAL_TAG_PREFIX) :]}"] = value
    return parent, trial


@functools.lru_cache(maxsize=4)
def _git_head(root: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def _source_name(argv: Sequence[str]) -> str:
    script = argv[0] if argv else ""
    path = Path(script)
    if not script or path.name in ("autonorm-study", "__main__.py", "-c", "-m") or path.name == "cli.py":
        return "autonorm-study"
    with contextlib.suppress(ValueError, OSError):
        return path.resolve().relative_to(_REPO_ROOT).as_posix()
    return path.name


def source_tags(
    environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> dict[str, str]:
    """MLflow's standard source tags for every run of a study (study, phase and trial runs).

    ``mlflow.source.git.commit`` from ``AUTONORM_GIT_COMMIT`` (what ``autonorm-study submit`` passes to
    a job, whose working dir has no ``.git``), else ``git rev-parse HEAD`` of this checkout (once per
    process), omitted when neither is known; ``mlflow.source.name`` the entry script (``autonorm-study``
    for the CLI); ``mlflow.source.type`` ``JOB``.
    """
    env = os.environ if environ is None else environ
    tags = {SOURCE_NAME: _source_name(sys.argv if argv is None else argv), SOURCE_TYPE: "JOB"}
    commit = env.get("AUTONORM_GIT_COMMIT") or _git_head(str(_REPO_ROOT))
    if commit and commit != "unknown":
        tags[SOURCE_GIT_COMMIT] = commit
    return tags


def mlflow_links(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> list[str]:
    """Direct links into the MLflow UI: the experiment's runs table, then the run (when given).

    The tracking server's own address for ``http(s)://`` URIs, ``http://127.0.0.1:5000`` otherwise
    (``mlflow ui --backend-store-uri <uri>`` serves it there). The runs table, not the experiment's
    default page: MLflow 3 opens an experiment on its GenAI overview.
    """
    base = tracking_uri.rstrip("/") if urlparse(tracking_uri).scheme in ("http", "https") else DEFAULT_UI
    links = [f"{base}/#/experiments/{experiment_id}/runs"]
    if run_id:
        links.append(f"{base}/#/experiments/{experiment_id}/runs/{run_id}")
    return links


def study_key(experiment_uri: str) -> str:
    """Stable key of a study: the same experiment path always finds the same parent run."""
    return hashlib.sha256(experiment_uri.encode()).hexdigest()[:16]


def default_tracking_uri(storage_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<absolute storage dir>/mlflow.db``: absolute, because a relative sqlite path is
    resolved against each process's working directory."""
    return f"sqlite:///{Path(storage_dir).resolve() / 'mlflow.db'}"


class MlflowUnavailable(ConnectionError):
    """Raised instead of a request while MLflow is backed off after a failure (no request is sent)."""


def check_tracking_uri(uri: str) -> None:
    """Reject a tracking URI MLflow has no tracking store for: a configuration error, not an outage.

    Raises:
        ValueError: an unknown scheme (``ftp://``), or a file store (a plain path, ``file://``), which
            MLflow 3 refuses at first use -- the study would otherwise retry it as an outage forever.
    """
    if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's profile-less Databricks shorthands
        return
    scheme = urlparse(uri).scheme.lower()
    if scheme in ("", "file"):
        raise ValueError(
            f"tracking URI {uri!r} is an MLflow file store, which MLflow 3 refuses; use "
            "sqlite:////absolute/path/mlflow.db or a tracking server (http://host:5000)"
        )
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        _tracking_store_registry.get_store_builder(uri)  # looks the scheme up; builds nothing
    except (ImportError, AttributeError):  # MLflow moved its registry: fall back to the known schemes
        base = scheme.split("+", 1)[0]
        known = {
            "http",
            "https",
            "sqlite",
            "postgresql",
            "mysql",
            "mssql",
            "databricks",
            "databricks-uc",
            "uc",
        }
        if base not in known and uri not in known:
            raise ValueError(f"tracking URI {uri!r}: MLflow has no tracking store for {scheme!r}") from None
    except Exception as exc:
        raise ValueError(
            f"tracking URI {uri!r}: MLflow has no tracking store for scheme {scheme!r} "
            "(valid: http(s)://, sqlite:////abs/path.db, postgresql://, mysql://, mssql://, databricks)"
        ) from exc


_TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"


@contextlib.contextmanager
def _http_limits(timeout_s: int, retries: int, *, override: bool) -> Iterator[None]:
    """MLflow's per-request HTTP timeout and retry count for the calls inside, restored afterwards.

    MLflow reads both from the environment at every request. ``override=False`` keeps values the
    user set explicitly.
    """
    saved = {name: os.environ.get(name) for name in (_TIMEOUT_ENV, _RETRIES_ENV)}
    for name, value in ((_TIMEOUT_ENV, timeout_s), (_RETRIES_ENV, retries)):
        if override or saved[name] is None:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _rejected(error: Exception) -> bool:
    """MLflow answered and refused the request (a 4xx: bad value, run deleted), as opposed to an
    outage (no answer, a timeout, a 5xx), which :class:`MlflowTrackingCallback` backs off from."""
    status = getattr(error, "get_http_status_code", None)
    if not callable(status):
        return False
    try:
        return 400 <= int(status()) < 500
    except (TypeError, ValueError):
        return False


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urlparse(uri).path)


def ensure_sqlite_schema(uri: str, *, artifact_root: str) -> None:
    """Create an sqlite tracking database atomically (no-op for other URIs or an existing file).

    MLflow creates its schema on first use; several processes doing that at once, or a kill in the
    middle of it, left the database unusable. The schema is built in a temporary file and then
    linked into place, so the database either does not exist or is complete.
    """
    path = _sqlite_path(uri)
    if path is None or path.exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mlflow-", suffix=".db")
    os.close(fd)
    os.unlink(tmp)  # sqlite must create the file itself
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", artifact_root)
        store.engine.dispose()
        with contextlib.suppress(FileExistsError):  # someone else won the race: theirs is complete too
            os.link(tmp, path)
    finally:
        for leftover in (tmp, f"{tmp}-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested trial config -> MLflow params (``model.norm.tau -> "0.5"``), values truncated to
    MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=f"{path}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[path] = text[:6000]
    return out


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
    final_flush_s: float = 60.0


def _numeric(value: Any) -> float | None:
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
            limits = _http_limits(self.retry.loop_timeout_s, self.retry.loop_http_retries, override=True)
        else:
            limits = _http_limits(self.retry.timeout_s, self.retry.http_retries, override=False)
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
        if self._experiment_id is None:
            artifact_root = self.artifact_location or ""
            ensure_sqlite_schema(self.tracking_uri, artifact_root=artifact_root or tempfile.gettempdir())
            experiment = self._call(self.client.get_experiment_by_name, self.experiment_name)
            if experiment is None:
                try:
                    self._experiment_id = self._call(
                        self.client.create_experiment,
                        self.experiment_name,
                        artifact_location=self.artifact_location,
                    )
                except Exception:
                    # Another study created it in between: use theirs.
                    experiment = self.client.get_experiment_by_name(self.experiment_name)
                    if experiment is None:
                        raise
                    self._experiment_id = experiment.experiment_id
            else:
                if experiment.lifecycle_stage == "deleted":
                    self._call(self.client.restore_experiment, experiment.experiment_id)
                self._experiment_id = experiment.experiment_id
        return self._experiment_id


@dataclass
class _ChildRun:
    run_id: str
    last_epoch: float = -math.inf
    status: str = "RUNNING"


class MlflowTrackingCallback(MlflowWriter, Callback):  # type: ignore[misc]
    """Tune callback writing the study's parent run and one child run per trial.

    Tune calls (in the driver): :meth:`setup` when ``Tuner.fit`` starts (also after a restore),
    :meth:`on_trial_result` per reported epoch, :meth:`on_trial_complete` / :meth:`on_trial_error`
    once per finished trial, :meth:`on_experiment_end` at the end. The runner calls :meth:`prepare`
    before ``fit`` and :meth:`close` in its ``finally``.

    Args:
        tracking_uri: resolved MLflow URI (absolute sqlite path or server URL).
        experiment_name: MLflow experiment (the study name).
        key: the study's stable key (:func:`study_key` of the experiment path).
        base_config: the plan's base trial config; child params are the resolved trial config.
        metric_whitelist: prefixes of result keys logged as metrics (``epoch`` always is).
        artifact_location: artifact root for a newly created experiment.
        parent_tags / parent_params / artifacts: written on the parent run at :meth:`prepare`.
        expected_trials: planned number of trials (parent param ``expected_trials``).
        retry: retry policy for MLflow calls.
        run_namer: names each trial's run (:class:`TrialNamer`); ``str(trial)`` when ``None``.
        trial_tags: tags of every trial run, values rendered per trial (:func:`trial_tag_templates`).

    Every run it creates also gets MLflow's source tags (:func:`source_tags`).
    """

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment_name: str,
        key: str,
        base_config: Mapping[str, Any],
        metric_whitelist: Sequence[str],
        artifact_location: str | None = None,
        parent_tags: Mapping[str, str] | None = None,
        parent_params: Mapping[str, str] | None = None,
        artifacts: Mapping[str, str] | None = None,
        expected_trials: int | None = None,
        retry: RetryPolicy | None = None,
        study_name: str | None = None,
        role: str = ROLE_STUDY,
        nest_under: str | None = None,
        run_namer: Callable[[Any], str] | None = None,
        trial_tags: Mapping[str, str] | None = None,
    ) -> None:
        self.run_namer = run_namer
        self.trial_tags = dict(trial_tags or {})
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.key = key
        self.base_config = dict(base_config)
        self.metric_whitelist = tuple(metric_whitelist)
        self.artifact_location = artifact_location
        self.parent_tags = dict(parent_tags or {})
        self.parent_params = dict(parent_params or {})
        self.artifacts = dict(artifacts or {})
        self.expected_trials = expected_trials
        self.retry = retry or RetryPolicy()
        self.study_name = study_name or experiment_name
        # A phase of a multi-plan study: its run is nested under the study's run (``nest_under``).
        self.role = role
        self.nest_under = nest_under
        check_tracking_uri(tracking_uri)
        self._reset_runtime()

    # ---------------------------------------------------------------------------------- pickling

    _RUNTIME = (
        "_client",
        "_experiment_id",
        "_parent_id",
        "_children",
        "_pending",
        "_uncreated",
        "_artifacts_logged",
        "_trials",
        "_finals",
        "_looping",
        "_down_until",
        "_backoff",
        "_recovered",
        "_final_deadline",
    )

    def _reset_runtime(self) -> None:
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._parent_id: str | None = None
        self._children: dict[str, _ChildRun] = {}
        self._pending: dict[str, list[tuple[float, dict[str, float], int]]] = {}
        self._uncreated: set[str] = set()
        self._artifacts_logged = False
        # Outage handling: the trials seen (to flush their queues when MLflow is back), the final
        # (status, outcome) of finished trials whose runs are not closed yet, the back-off state.
        self._trials: dict[str, Trial] = {}
        self._finals: dict[str, tuple[str, str]] = {}
        self._looping = False
        self._down_until = 0.0
        self._backoff = 0.0
        self._recovered = False
        self._final_deadline: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state; a restored copy must not trust anything
        # learnt at runtime (the run map may be stale), so only the configuration travels.
        state = self.__dict__.copy()
        for name in self._RUNTIME:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    # ------------------------------------------------------------------------------------ MLflow

    @property
    def parent_run_id(self) -> str | None:
        return self._parent_id

    # ------------------------------------------------------------------------------ outages

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
        if error is not None and _rejected(error):
            return  # MLflow answered (and said no): not an outage, nothing to back off from
        if error is None:
            if self._backoff > 0 or self._down_until > 0:
                logger.warning("MLflow answers again; catching up on queued results")
                self._recovered = True
            self._backoff = 0.0
            self._down_until = 0.0
            return
        if self._final_deadline is not None:
            self._down_until = math.inf  # the last flush: one failure ends it
            logger.error("MLflow unreachable during the final flush: %s", error)
            return
        self._backoff = min(self.retry.reconnect_max_s, max(self.retry.reconnect_s, 2 * self._backoff))
        self._down_until = time.monotonic() + self._backoff
        logger.warning(
            "MLflow unreachable (%s); %d trial(s) with queued results, next attempt in %.0f s",
            error,
            len(self._pending),
            self._backoff,
        )

    def _begin_final_flush(self) -> None:
        """The end of the study: one more try even when backed off, then a bounded flush."""
        if self._final_deadline is None:
            self._final_deadline = time.monotonic() + self.retry.final_flush_s
            if self._down_until != math.inf:
                self._down_until = 0.0

    def _catch_up(self) -> None:
        """MLflow answers again: flush every trial's queue, close the runs of finished trials."""
        self._recovered = False
        for trial_id in sorted(set(self._pending) | set(self._finals)):
            trial = self._trials.get(trial_id)
            if trial is None or time.monotonic() < self._down_until:
                continue
            self._sync(trial)
            final = self._finals.get(trial_id)
            if final is not None:
                self._close_trial(trial, *final)

    def undelivered_trials(self) -> list[str]:
        """Trials whose queued metrics or final run status have not reached MLflow (yet)."""
        stuck = {trial_id for trial_id, queue in self._pending.items() if queue} | set(self._finals)
        return sorted(stuck)

    def _find_parent(self) -> Any | None:
        runs = self._search(f"tags.`{TAG_STUDY_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{self.role}'")
        if not runs:
            return None
        return min(runs, key=lambda r: r.info.start_time or 0)

    def prepare(self, *, fresh: bool, log_artifacts: bool = True) -> str:
        """Create (or find again) the experiment and the study's parent run; returns its id.

        Call in the driver before any trial starts: it also creates the sqlite schema.

        Args:
            fresh: Tune starts this experiment from scratch (no state to restore). A parent with the
                same key that already has children then belongs to a study whose Tune state is gone:
                it is closed and re-keyed, and a new parent is made.
        """
        from mlflow.entities import Param, RunTag

        experiment_id = self._ensure_experiment()
        parent = self._find_parent()
        if parent is not None and fresh and self._children_of(parent.info.run_id):
            old = parent.info.run_id
            logger.warning("experiment state is gone; superseding the previous parent run %s", old)
            self._call(self.client.set_tag, old, TAG_STUDY_KEY, f"{self.key}:superseded")
            for run in self._children_of(old):
                if run.info.status == "RUNNING":
                    self._call(self.client.set_terminated, run.info.run_id, "KILLED")
            if parent.info.status == "RUNNING":
                self._call(self.client.set_terminated, old, "KILLED")
            parent = None
        if parent is None:
            tags = {TAG_ROLE: self.role, TAG_STUDY_KEY: self.key, **source_tags(), **self.parent_tags}
            if self.nest_under:
                tags[TAG_PARENT] = self.nest_under
            run = self._call(self.client.create_run, experiment_id, tags=tags, run_name=self.study_name)
            parent_id = self._parent_id = run.info.run_id
            params = dict(self.parent_params)
            if self.expected_trials is not None:
                params["expected_trials"] = str(self.expected_trials)
            param_items = [Param(k, str(v)[:6000]) for k, v in params.items()]
            for i in range(0, len(param_items), 100):
                chunk = param_items[i : i + 100]
                self._call(self.client.log_batch, parent_id, params=chunk)
        else:
            parent_id = self._parent_id = parent.info.run_id
            if parent.info.status != "RUNNING":
                self._call(self.client.update_run, parent_id, status="RUNNING")
            if log_artifacts:
                tags_list = [RunTag(k, str(v)) for k, v in {**source_tags(), **self.parent_tags}.items()]
                self._call(self.client.log_batch, parent_id, tags=tags_list)
        if log_artifacts or not self._artifacts_logged:
            for name, text in self.artifacts.items():
                self._call(self.client.log_text, parent_id, text, name)
            self._artifacts_logged = True
        return parent_id

    def _children_of(self, parent_id: str) -> list[Any]:
        return self._search(f"tags.`{TAG_PARENT}` = '{parent_id}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'")

    def _rebuild(self) -> None:
        """The trial -> run map from MLflow itself (the only source that survives a driver crash)."""
        if self._parent_id is None:
            raise RuntimeError("not attached to a parent run")
        self._children = {}
        for run in sorted(self._children_of(self._parent_id), key=lambda r: r.info.start_time or 0):
            trial_id = run.data.tags.get(TAG_TRIAL_ID)
            if trial_id is None or trial_id in self._children:
                continue
            self._children[trial_id] = _ChildRun(
                run_id=run.info.run_id,
                last_epoch=run.data.metrics.get("epoch", -math.inf),
                status=run.info.status,
            )

    def _connect(self) -> bool:
        """Make sure parent and run map are known; False while MLflow is unreachable."""
        if self._parent_id is not None:
            return True
        try:
            self.prepare(fresh=False, log_artifacts=False)
            self._rebuild()
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("MLflow unreachable (%s); results are queued and logged later", exc)
            self._parent_id = None
            return False
        return True

    # ------------------------------------------------------------------------------- Tune hooks

    def setup(
        self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any
    ) -> None:
        # The instance the runner prepared is already attached; a restored (unpickled) copy is not.
        if self._parent_id is None or not self._children:
            self._parent_id = None
            with self._loop():
                self._connect()

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        with self._loop():
            self._queue(trial.trial_id, result)
            self._sync(trial)
            if self._recovered:
                self._catch_up()

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        with self._loop():
            self._sync(trial)
            self._close_trial(trial, "FINISHED", _trial_outcome(trial, errored=False))
            if self._recovered:
                self._catch_up()

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        with self._loop():
            self._sync(trial)
            self._close_trial(trial, "FAILED", "error")
            if self._recovered:
                self._catch_up()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.close_trials(trials)

    # ---------------------------------------------------------------------------------- logging

    def _whitelisted(self, key: str) -> bool:
        return key == "epoch" or any(key.startswith(prefix) for prefix in self.metric_whitelist)

    def _queue(self, trial_id: str, result: Mapping[str, Any]) -> None:
        epoch = _numeric(result.get("epoch"))
        if epoch is None:
            return
        child = self._children.get(trial_id)
        if child is not None and epoch <= child.last_epoch:
            return  # logged before a restart/restore
        pending = self._pending.setdefault(trial_id, [])
        if any(step == epoch for step, _, _ in pending):
            return
        metrics = {}
        for key, value in result.items():
            number = _numeric(value)
            if number is not None and self._whitelisted(key):
                metrics[key] = number
        pending.append((epoch, metrics, int(time.time() * 1000)))

    def _sync(self, trial: Trial, *, attempts: int | None = None, create: bool = False) -> None:
        """Create the trial's run if needed and log its queued epochs. Never raises.

        A run is created at the trial's first queued result (or when ``create``: a trial that
        errored before reporting still gets a FAILED run).
        """
        self._trials[trial.trial_id] = trial
        if not self._connect():
            return
        try:
            child = self._children.get(trial.trial_id)
            if child is None:
                if not (self._pending.get(trial.trial_id) or create):
                    return
                child = self._create_child(trial)
            self._flush(trial.trial_id, child, attempts=attempts)
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("MLflow logging for trial %s deferred: %s", trial.trial_id, exc)

    def _create_child(self, trial: Trial) -> _ChildRun:
        from mlflow.entities import Param

        assert self._parent_id is not None and self._experiment_id is not None
        if trial.trial_id in self._uncreated:
            # An earlier create_run failed: it may have reached the server anyway. Look first.
            for run in self._children_of(self._parent_id):
                if run.data.tags.get(TAG_TRIAL_ID) == trial.trial_id:
                    found = _ChildRun(
                        run.info.run_id, run.data.metrics.get("epoch", -math.inf), run.info.status
                    )
                    self._children[trial.trial_id] = found
                    self._uncreated.discard(trial.trial_id)
                    return found
        self._uncreated.add(trial.trial_id)
        # The trial's own resolved config when its result carries it; resolved here otherwise.
        config = config_from_result(trial.last_result, self.base_config, dict(trial.config or {}))
        index = trial_index(trial)
        tags = {
            **source_tags(),
            **{
                k: render_run_name(v, config, index if index is not None else trial.trial_id)
                for k, v in getattr(self, "trial_tags", {}).items()
            },
            TAG_ROLE: ROLE_TRIAL,
            TAG_TRIAL_ID: trial.trial_id,
            TAG_PARENT: self._parent_id,
            TAG_STUDY_KEY: self.key,
        }
        node_id = (trial.last_result or {}).get("node_id")
        if node_id:
            tags["autonorm.node_id"] = str(node_id)
        # One attempt only (a retried create could make two runs); the next result tries again.
        run = self._call(
            self.client.create_run, self._experiment_id, tags=tags, run_name=self._run_name(trial), attempts=1
        )
        child = _ChildRun(run_id=run.info.run_id)
        self._children[trial.trial_id] = child
        self._uncreated.discard(trial.trial_id)
        params = [Param(k, v) for k, v in flatten_params(config).items()]
        for i in range(0, len(params), 100):
            chunk = params[i : i + 100]
            self._call(self.client.log_batch, child.run_id, params=chunk)
        return child

    def _run_name(self, trial: Trial) -> str:
        """The trial run's name: the plan's :class:`TrialNamer`, else Tune's display name of the trial
        unless that is the internal trainable's (``tune_entry_...``)."""
        namer = getattr(self, "run_namer", None)  # callbacks pickled by an older version have none
        if namer is not None:
            with contextlib.suppress(Exception):
                return str(namer(trial))
        name = str(trial)
        if name.startswith("tune_entry"):
            return f"{self.study_name}-{trial.trial_id}"
        return name

    def _flush(self, trial_id: str, child: _ChildRun, *, attempts: int | None) -> None:
        from mlflow.entities import Metric

        pending = [p for p in self._pending.get(trial_id, []) if p[0] > child.last_epoch]
        if not pending:
            self._pending.pop(trial_id, None)
            return
        pending.sort(key=lambda p: p[0])
        metrics = [
            Metric(key, value, timestamp, int(step))
            for step, values, timestamp in pending
            for key, value in values.items()
        ]
        for i in range(0, len(metrics), 1000):
            chunk = metrics[i : i + 1000]
            self._call(self.client.log_batch, child.run_id, metrics=chunk, attempts=attempts)
        child.last_epoch = max(child.last_epoch, pending[-1][0])
        self._pending.pop(trial_id, None)

    def _close_trial(self, trial: Trial, status: str, outcome: str, *, attempts: int | None = None) -> None:
        self._trials[trial.trial_id] = trial
        child = self._children.get(trial.trial_id)
        # Re-closing with another status is allowed: a trial KILLED by an interrupted study may
        # have been resumed and finished since.
        if child is not None and child.status == status:
            self._finals.pop(trial.trial_id, None)
            return
        if child is None:
            # No run yet: remembered when it is owed (queued results, a failed create, an outage);
            # a trial that never reported an epoch has no run and owes nothing.
            owed = (
                bool(self._pending.get(trial.trial_id))
                or trial.trial_id in self._uncreated
                or time.monotonic() < self._down_until
            )
            if owed:
                self._finals[trial.trial_id] = (status, outcome)
            return
        self._finals[trial.trial_id] = (status, outcome)  # until it is written
        from mlflow.entities import RunTag

        try:
            tags = [RunTag(TAG_TRIAL_STATUS, outcome)]
            node_id = (trial.last_result or {}).get("node_id")
            if node_id:
                tags.append(RunTag("autonorm.node_id", str(node_id)))
            self._call(self.client.log_batch, child.run_id, tags=tags, attempts=attempts)
            self._call(self.client.set_terminated, child.run_id, status, attempts=attempts)
            child.status = status
            self._finals.pop(trial.trial_id, None)
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not close MLflow run of trial %s yet: %s", trial.trial_id, exc)

    def close_trials(self, trials: Iterable[Trial]) -> None:
        """Catch up on queued epochs and close every child run still RUNNING.

        Terminated trials -> FINISHED, errored -> FAILED, trials that did not finish (the study was
        interrupted) -> KILLED. Children whose trial Tune no longer knows (created after Tune's last
        snapshot before a crash) are closed and deleted so the study has one run per trial.
        """
        attempts = self.retry.final_attempts
        trials = list(trials)
        self._begin_final_flush()
        if not self._connect():
            return
        # MLflow is the truth: this may be the runner's instance, not the one Tune used.
        pending_children = self._children
        try:
            self._rebuild()
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not list MLflow runs: %s", exc)
            self._children = pending_children
        for trial in trials:
            self._sync(trial, attempts=attempts, create=trial.status == "ERROR")
        for trial in trials:
            if trial.status == "TERMINATED":
                self._close_trial(trial, "FINISHED", _trial_outcome(trial, errored=False), attempts=attempts)
            elif trial.status == "ERROR":
                self._close_trial(trial, "FAILED", "error", attempts=attempts)
            else:
                self._close_trial(trial, "KILLED", "interrupted", attempts=attempts)
        known = {t.trial_id for t in trials}
        parent_id = self._parent_id
        if parent_id is None:
            return
        try:
            for run in self._children_of(parent_id):
                trial_id = run.data.tags.get(TAG_TRIAL_ID)
                if trial_id not in known and trials:
                    if run.info.status == "RUNNING":
                        self._call(self.client.set_terminated, run.info.run_id, "KILLED")
                    self._call(self.client.delete_run, run.info.run_id)
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not check for orphaned MLflow runs: %s", exc)

    def close(
        self,
        *,
        status: str,
        trials: Iterable[Trial] | None = None,
        summary: Mapping[str, float] | None = None,
    ) -> None:
        """End of the study (runner's ``finally``): close children, log ``summary``, close the parent.

        Never raises for MLflow: bounded by ``RetryPolicy.final_flush_s`` (plus the same again for
        the parent run); what could not be delivered is logged as an error and listed by
        :meth:`undelivered_trials` (and in the parent's :data:`TAG_UNDELIVERED` tag when only some
        trials failed).
        """
        self._begin_final_flush()
        if trials is not None:
            self.close_trials(trials)
        if self._down_until != math.inf:
            # The parent gets its own window, even if the trials' flush used up the first one.
            self._final_deadline = time.monotonic() + self.retry.final_flush_s
        undelivered = self.undelivered_trials()
        if undelivered:
            logger.error(
                "MLflow: results of %d trial(s) could not be delivered: %s",
                len(undelivered),
                ", ".join(undelivered),
            )
        if not self._connect():
            logger.error("MLflow unreachable at the end of the study; runs stay open until the next run")
            return
        parent_id = self._parent_id
        if parent_id is None:
            return
        attempts = self.retry.final_attempts
        try:
            if trials is None:
                for run in self._children_of(parent_id):
                    if run.info.status == "RUNNING":
                        self._call(self.client.set_terminated, run.info.run_id, "KILLED")
            from mlflow.entities import Metric, RunTag

            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, 0) for k, v in (summary or {}).items()]
            tags = [RunTag(TAG_UNDELIVERED, ",".join(undelivered)[:5000])] if undelivered else []
            if metrics or tags:
                self._call(self.client.log_batch, parent_id, metrics=metrics, tags=tags, attempts=attempts)
        except Exception as exc:
            logger.error("could not write the study summary to MLflow: %s", exc)
        try:
            self._call(self.client.set_terminated, parent_id, status, attempts=attempts)
        except Exception as exc:
            logger.error("could not close the MLflow parent run %s: %s", parent_id, exc)

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        """A file as an artifact of the plan's run (raises when MLflow does not take it)."""
        if not self._connect() or self._parent_id is None:
            raise MlflowUnavailable(f"MLflow unreachable; {path.name} not logged")
        self._call(
            self.client.log_artifact,
            self._parent_id,
            str(path),
            artifact_path,
            attempts=self.retry.final_attempts,
        )

    def child_run_ids(self) -> dict[str, str]:
        """``trial_id -> MLflow run id`` as MLflow knows it now (what this tracker knows, when MLflow
        does not answer)."""
        if self._connect():
            known = dict(self._children)
            try:
                self._rebuild()
            except Exception as exc:
                if not isinstance(exc, MlflowUnavailable):
                    logger.warning("could not list MLflow runs: %s", exc)
                self._children = known
        return {trial_id: child.run_id for trial_id, child in self._children.items()}


def _trial_outcome(trial: Trial, *, errored: bool) -> str:
    """``completed`` / ``diverged`` from the trial's own last report; ``pruned`` when it never sent a
    final status (a scheduler stopped it)."""
    if errored:
        return "error"
    status = (trial.last_result or {}).get("status")
    return str(status) if status in ("completed", "diverged", "error") else "pruned"


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
        found = self._search(f"tags.`{TAG_STUDY_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{ROLE_STUDY}'")
        if found:
            run = min(found, key=lambda r: r.info.start_time or 0)
            self.run_id = run.info.run_id
            existing = dict(run.data.params)
            if run.info.status != "RUNNING":
                self._call(self.client.update_run, self.run_id, status="RUNNING")
        else:
            all_tags = {TAG_ROLE: ROLE_STUDY, TAG_STUDY_KEY: self.key, **source_tags(), **dict(tags or {})}
            run = self._call(self.client.create_run, experiment_id, tags=all_tags, run_name=self.run_name)
            self.run_id = run.info.run_id
            existing = {}
        # Params are immutable in MLflow: only the ones the run does not have yet.
        new_params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items() if k not in existing]
        tag_items = [RunTag(k, str(v)) for k, v in {**source_tags(), **dict(tags or {})}.items()]
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

    def close(self, status: str) -> None:
        if self.run_id is not None:
            self._call(self.client.set_terminated, self.run_id, status, attempts=self.retry.final_attempts)
