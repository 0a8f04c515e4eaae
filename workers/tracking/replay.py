"""A study's trials rebuilt from MLflow alone, and read back as if from the study directory.

Every trial run carries what re-analysis needs: its resolved config as params (``flatten_params``),
Tune's own parameters (tag :data:`TAG_TRIAL_PARAMS`), its phase (``autonorm.phase``), its status
(``autonorm.trial_status``), its Tune trial id (``ray.trial_id``) and every epoch's metrics (one step
per epoch). :class:`TrackedTrials` walks a study run's children (phase runs, then their trial runs)
and turns each trial run back into a :class:`workers.records.TrialRecord`; inside :func:`replaying`,
:func:`workers.results.read_trials` answers with those records instead of reading Tune's experiment
directory, so a kind's own ``report`` re-analyses a study whose directory is gone.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from workers.records import TrialRecord
from workers.tracking.names import (
    ROLE_TRIAL,
    TAG_PARENT,
    TAG_PHASE,
    TAG_ROLE,
    TAG_STUDY_KEY,
    TAG_TRIAL_ID,
    TAG_TRIAL_STATUS,
)

__all__ = [
    "TAG_TRIAL_PARAMS",
    "TrackedTrials",
    "read_trial_params",
    "replayed",
    "replaying",
    "trial_params_tag",
    "unflatten_params",
]

TAG_TRIAL_PARAMS = "autonorm.trial_params"
"""Tune's parameters of the trial (``trial.config``: dotted path -> value), as a query string of JSON
values (``training.lr=0.1&model.layer.type=%22corrected%22``): no tag value holds a brace, so a
filter or a check for an unfilled ``{template}`` never trips on it."""
_MAX_TAG = 5000
_STATUSES = ("completed", "diverged", "error", "pruned")


def trial_params_tag(params: Mapping[str, Any] | None) -> dict[str, str]:
    """``{TAG_TRIAL_PARAMS: encoded}`` for a trial run; empty when it would not fit a tag."""
    from urllib.parse import urlencode

    try:
        text = urlencode(
            [(str(k), json.dumps(v, sort_keys=True, default=str)) for k, v in sorted((params or {}).items())]
        )
    except (TypeError, ValueError):
        return {}
    return {TAG_TRIAL_PARAMS: text} if len(text) <= _MAX_TAG else {}


def read_trial_params(text: str | None) -> dict[str, Any]:
    """The parameters :func:`trial_params_tag` wrote (a JSON object, as runs before it held, too)."""
    from urllib.parse import parse_qsl

    if not text:
        return {}
    if text.startswith("{"):
        return dict(json.loads(text))
    return {k: json.loads(v) for k, v in parse_qsl(text, keep_blank_values=True)}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def unflatten_params(params: Mapping[str, str]) -> dict[str, Any]:
    """MLflow params of a trial run (``workers.tracking.store.flatten_params``) -> the nested config."""
    out: dict[str, Any] = {}
    for key in sorted(params):
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = _value(params[key])
    return out


class TrackedTrials:
    """The trial runs under one study run, by phase, as :class:`workers.records.TrialRecord`.

    Args:
        client: an ``mlflow.MlflowClient`` of the study's tracking store.
        study_run_id: the study's own run.
    """

    def __init__(self, client: Any, study_run_id: str) -> None:
        self.client = client
        self.study_run_id = study_run_id
        study = client.get_run(study_run_id)
        self.experiment_id = study.info.experiment_id
        self.runs: dict[str, list[Any]] = {}  # phase -> trial runs (earliest per Tune trial)
        self._records: dict[tuple[str, bool], list[TrialRecord]] = {}
        self._histories: dict[str, dict[int, dict[str, Any]]] = {}  # run id -> step -> row, prefetched
        self._walk()

    def _children(self, parent_id: str) -> list[Any]:
        out: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{TAG_PARENT}` = '{parent_id}'",
                max_results=1000,
                page_token=token,
            )
            out.extend(page)
            token = getattr(page, "token", None)
            if not token:
                return out

    def _walk(self) -> None:
        seen: dict[str, dict[str, Any]] = {}
        stack: list[tuple[str, str | None, int]] = [(self.study_run_id, None, 0)]
        while stack:
            parent_id, phase, depth = stack.pop()
            for run in self._children(parent_id):
                tags = run.data.tags
                role = tags.get(TAG_ROLE)
                if str(tags.get(TAG_STUDY_KEY, "")).endswith(":superseded"):
                    continue  # a parent whose Tune state was gone: its trials ran again elsewhere
                if role == ROLE_TRIAL:
                    # Under a phase run: that run's name, which is the phase's name (its folder, what
                    # read_trials is asked for); directly under the study run: the trial's phase tag.
                    name = phase or tags.get(TAG_PHASE) or "study"
                    trial_id = tags.get(TAG_TRIAL_ID) or run.info.run_id
                    known = seen.setdefault(name, {})
                    old = known.get(trial_id)
                    if old is None or (run.info.start_time or 0) < (old.info.start_time or 0):
                        known[trial_id] = run
                elif role in ("phase", None) and depth < 3:
                    stack.append((run.info.run_id, run.info.run_name or tags.get(TAG_PHASE), depth + 1))
        self.runs = {
            phase: sorted(by_id.values(), key=lambda r: (r.info.start_time or 0, r.info.run_id))
            for phase, by_id in seen.items()
        }

    @property
    def run_names(self) -> dict[str, str]:
        """Trial run id -> its run name."""
        return {r.info.run_id: r.info.run_name for runs in self.runs.values() for r in runs}

    def _history(self, run: Any) -> tuple[dict[str, Any], ...]:
        rows = self._histories.pop(run.info.run_id, None)
        if rows is None:
            rows = {}
            for key in sorted(run.data.metrics):
                for m in self.client.get_metric_history(run.info.run_id, key):
                    row = rows.setdefault(int(m.step), {"epoch": int(m.step)})
                    row[key] = m.value  # a step logged twice: its latest value (MLflow's order)
        return tuple(rows[step] for step in sorted(rows))

    def _prefetch_histories(self, runs: list[Any]) -> None:
        """Every epoch of every metric of ``runs`` in one request per metric per 100 runs (MLflow's
        bulk metric history, what its UI's charts read), instead of one request per metric per run:
        a 1,000-trial study's ``reproduce`` made ~10,000 requests. A store without the bulk read
        (or a run with more epochs than one bulk answer holds) falls back to the per-run read."""
        by_key: dict[str, list[str]] = {}
        for run in runs:
            if run.info.run_id not in self._histories:
                for key in run.data.metrics:
                    by_key.setdefault(key, []).append(run.info.run_id)
        fetched: dict[str, dict[int, dict[str, Any]]] = {}
        full: set[str] = set()  # runs an answer may have cut short: read on their own
        for key in sorted(by_key):
            ids = by_key[key]
            for i in range(0, len(ids), _BULK_RUNS):
                chunk = ids[i : i + _BULK_RUNS]
                answer = bulk_metric_history(self.client, chunk, key)
                if answer is None:
                    return  # no bulk read here: each run is read on its own
                points, cut = answer
                full |= cut
                for run_id, step, _timestamp, value in points:
                    rows = fetched.setdefault(run_id, {})
                    row = rows.setdefault(step, {"epoch": step})
                    row[key] = value  # ordered by step then time: a step logged twice keeps its latest
        for run_id, rows in fetched.items():
            if run_id not in full:
                self._histories[run_id] = rows

    def record(self, run: Any, *, history: bool) -> TrialRecord:
        tags = run.data.tags
        status = tags.get(TAG_TRIAL_STATUS)
        if status not in _STATUSES:
            status = "error" if run.info.status == "FAILED" else "pruned"
        params = read_trial_params(tags.get(TAG_TRIAL_PARAMS))
        metrics: dict[str, Any] = {
            k: (int(v) if k == "epoch" and math.isfinite(v) and float(v).is_integer() else v)
            for k, v in run.data.metrics.items()
        }
        metrics["status"] = status
        return TrialRecord(
            trial_id=tags.get(TAG_TRIAL_ID) or run.info.run_id,
            params=params,
            config=unflatten_params(run.data.params),
            status=status,  # type: ignore[arg-type]
            metrics=metrics,
            node_id=tags.get("autonorm.node_id"),
            mlflow_run_id=run.info.run_id,
            history=self._history(run) if history else (),
        )

    def trials(self, phase: str, *, history: bool = True) -> list[TrialRecord]:
        """The records of one phase (empty for a phase without trial runs)."""
        key = (phase, history)
        if key not in self._records:
            runs = self.runs.get(phase, [])
            if history:
                self._prefetch_histories(runs)
            self._records[key] = [self.record(r, history=history) for r in runs]
        return list(self._records[key])


_BULK_RUNS = 100  # MLflow's limit of run ids per bulk history request
_BULK_MAX_POINTS = 25000  # ... and of points in one answer of the plain bulk read
_BULK_MAX_PER_RUN = 2500  # ... and of points per run in one answer of the interval read (then sampled)

Points = list[tuple[str, int, int, float]]


def bulk_metric_history(client: Any, run_ids: list[str], key: str) -> tuple[Points, set[str]] | None:
    """``(run id, step, timestamp, value)`` of metric ``key`` of up to 100 runs in one read, ordered
    by run, step and time, and the runs whose history the answer may have cut short (read those on
    their own); ``None`` when the store has no bulk read.

    A REST store asks the server's ``metrics/get-history-bulk`` (one SQL query for all the runs:
    the route MLflow's UI draws its charts from; ~0.02 s for 100 runs here), else its public
    ``metrics/get-history-bulk-interval`` (one query per run, ~10x slower); a database store (a
    ``sqlite:`` URI) answers the plain bulk query in process."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    if store is None:
        return None
    if hasattr(store, "get_host_creds"):  # RestStore
        from mlflow.utils.rest_utils import http_request

        creds = store.get_host_creds()
        plain = http_request(
            creds,
            "/ajax-api/2.0/mlflow/metrics/get-history-bulk",
            "GET",
            params={"run_id": run_ids, "metric_key": key, "max_results": _BULK_MAX_POINTS},
            raise_on_status=False,
        )
        if plain.status_code == 200:
            points = _points(plain.json())
            return _ordered(points), (set(run_ids) if len(points) >= _BULK_MAX_POINTS else set())
        interval = http_request(
            creds,
            "/api/2.0/mlflow/metrics/get-history-bulk-interval",
            "GET",
            params={"run_ids": run_ids, "metric_key": key, "max_results": _BULK_MAX_PER_RUN},
            raise_on_status=False,
        )
        if interval.status_code != 200:
            return None
        points = _points(interval.json())
        counts: dict[str, int] = {}
        for run_id, *_ in points:
            counts[run_id] = counts.get(run_id, 0) + 1
        return _ordered(points), {r for r, n in counts.items() if n >= _BULK_MAX_PER_RUN}
    if hasattr(store, "get_metric_history_bulk"):
        found = store.get_metric_history_bulk(run_ids, key, _BULK_MAX_POINTS)
        points = [(str(m.run_id), int(m.step), int(m.timestamp), float(m.value)) for m in found]
        return _ordered(points), (set(run_ids) if len(points) >= _BULK_MAX_POINTS else set())
    return None


def _points(answer: Mapping[str, Any]) -> Points:
    return [
        (str(m["run_id"]), int(m.get("step", 0)), int(m.get("timestamp", 0)), float(m["value"]))
        for m in answer.get("metrics", [])
    ]


def _ordered(points: Points) -> Points:
    return sorted(points, key=lambda p: (p[0], p[1], p[2]))


_SOURCE: contextvars.ContextVar[TrackedTrials | None] = contextvars.ContextVar(
    "autonorm_replayed_trials", default=None
)


@contextlib.contextmanager
def replaying(source: TrackedTrials) -> Iterator[TrackedTrials]:
    """Inside the block :func:`workers.results.read_trials` reads ``source``, not the study directory."""
    token = _SOURCE.set(source)
    try:
        yield source
    finally:
        _SOURCE.reset(token)


def replayed(phase: str, *, history: bool) -> list[TrialRecord] | None:
    """The replayed records of ``phase`` inside :func:`replaying`; ``None`` outside it."""
    source = _SOURCE.get()
    return None if source is None else source.trials(phase, history=history)
