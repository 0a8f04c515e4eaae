"""The Tune callback: one child run per trial under the study's (or phase's) run.

Parts: :mod:`workers.tracking.outage` (back-off while MLflow is away), :mod:`workers.tracking.runs`
(finding and creating the runs), this module (Tune's hooks, the per-trial queue of epochs, closing
runs at the end).
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from workers.members import unpack, views
from workers.tracking.names import (
    GROUP_MEMBERS_FILE,
    ROLE_STUDY,
    TAG_TRIAL_ID,
    TAG_TRIAL_STATUS,
    TAG_UNDELIVERED,
    group_members,
)
from workers.tracking.runs import TrialRuns, _ChildRun
from workers.tracking.store import MlflowUnavailable, check_tracking_uri, redact_uri
from workers.tracking.writer import RetryPolicy, numeric

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from ray.tune.experiment import Trial

logger = logging.getLogger(__name__)


class _Sender:
    """One thread that does the hooks' MLflow work, in the order Tune called the hooks, so that
    Tune's loop does not wait for MLflow's answers (:attr:`MlflowTrackingCallback.background`)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        self._queue.put(work)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            try:
                if work is None:
                    return
                work()
            except Exception as exc:  # the hooks never raise for MLflow; anything else is said
                logger.warning("MLflow logging step failed: %s: %s", type(exc).__name__, exc)
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Wait until every submitted piece of work is done."""
        self._queue.join()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()


class MlflowTrackingCallback(TrialRuns, Callback):  # type: ignore[misc]
    """Tune callback writing the study's parent run and one child run per trial.

    Tune calls (in the driver): :meth:`setup` when ``Tuner.fit`` starts (also after a restore),
    :meth:`on_trial_result` per reported epoch, :meth:`on_trial_complete` / :meth:`on_trial_error`
    once per finished trial, :meth:`on_experiment_end` at the end. The runner calls :meth:`prepare`
    before ``fit`` and :meth:`close` in its ``finally``.

    Args:
        tracking_uri: resolved MLflow URI (absolute sqlite path or server URL).
        experiment_name: MLflow experiment (the study name).
        key: the parent run's stable key (:func:`study_key` of the experiment path, its
            ``autonorm.run_key``); also its ``autonorm.study_key`` unless ``parent_tags`` set one.
        base_config: the plan's base trial config; child params are the resolved trial config.
        metric_whitelist: prefixes of result keys logged as metrics (``epoch`` always is).
        artifact_location: artifact root for a newly created experiment.
        parent_tags / parent_params / artifacts: written on the parent run at :meth:`prepare`.
        expected_trials: planned number of trials (parent param ``expected_trials``).
        retry: retry policy for MLflow calls.
        run_namer: names each trial's run (:class:`TrialNamer`); ``str(trial)`` when ``None``.
        trial_tags: tags of every trial run, values rendered per trial (:func:`trial_tag_templates`).
        background: the hooks' MLflow requests go out from a thread of their own, in the order of
            the hooks, and Tune's loop goes on meanwhile (the runner's choice: each request took
            20-60 ms inside the loop, during which no trial started). Every method called outside
            Tune's hooks (:meth:`close`, :meth:`close_trials`, :meth:`undelivered_trials`, ...)
            first waits for that thread to finish what it was given. Off: every hook waits for its
            own requests (what a caller that reads MLflow right after a hook expects).

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
        background: bool = False,
    ) -> None:
        self.background = background
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
        "_history",
        "_holes",
        "_check_holes",
        "_flushed_at",
        "_sender",
        "_settled",
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
        # Every trial's results as Tune keeps them in the study directory (:meth:`requeue`).
        self._history: dict[str, list[Mapping[str, Any]]] = {}
        # After a restore: epochs MLflow lacks below a trial's last logged one (:meth:`_fill_holes`).
        self._holes: dict[str, set[float]] = {}
        self._check_holes = False
        self._flushed_at: dict[str, float] = {}  # when each running trial's epochs last went out
        self._sender: _Sender | None = None
        self._settled = None
        self._reset_backoff()

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

    def _queued_trials(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------------------ outages

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
        self.drain()
        stuck = {trial_id for trial_id, queue in self._pending.items() if queue} | set(self._finals)
        return sorted(stuck)

    # ------------------------------------------------------------------------------- Tune hooks

    def setup(
        self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any
    ) -> None:
        self.drain()
        # The instance the runner prepared is already attached; a restored (unpickled) copy is not.
        if self._parent_id is None or not self._children:
            self._parent_id = None
            with self._loop():
                self._connect()

    def _hook(self, work: Callable[[], None]) -> None:
        """A hook's MLflow work: now, or handed to the sender thread (:attr:`background`)."""
        self._settled = None  # something happens to the runs after the last closing pass

        def run() -> None:
            with self._loop():
                work()
                if self._recovered:
                    self._catch_up()

        if not self.background:
            run()
            return
        if self._sender is None:
            self._sender = _Sender(f"mlflow-{self.study_name}")
        self._sender.submit(run)

    def drain(self) -> None:
        """Wait until the hooks' MLflow work handed to the sender thread is done."""
        if self._sender is not None:
            self._sender.drain()

    def _stop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.stop()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """A stacked group's folder gets its members' list (:func:`write_group_members`), each by
        the name of its trial run; written again, the same, when the group restarts."""
        write_group_members(trial, self._run_name)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        result = dict(result)  # Tune's dict, read later by the sender thread

        def work() -> None:
            for view in views(trial):  # a group of stacked trials: each member has its own run
                self._queue(view.trial_id, result if view is trial else unpack(result, view.k))
                if self._flush_due(view.trial_id):
                    self._sync(view, reopen=True)

        self._hook(work)

    def _flush_due(self, trial_id: str) -> bool:
        """Whether a running trial's queued epochs go to MLflow now: at its first result (its run
        appears at once), then at most every ``RetryPolicy.result_flush_s``; its end flushes the rest.
        Each MLflow call waits inside Tune's loop (no trial starts meanwhile), and tiny trials report
        several epochs a second: one call per epoch was most of a 1,000-trial study's MLflow traffic.
        Queued epochs are also in Tune's result files, so a killed driver's rerun delivers them."""
        now = time.monotonic()
        if (
            trial_id in self._children
            and now - self._flushed_at.get(trial_id, -math.inf) < self.retry.result_flush_s
        ):
            return False
        self._flushed_at[trial_id] = now
        return True

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        from workers.interrupts import received

        # Tune stops the running trials of a study stopped by a signal as if a scheduler had: they did
        # not finish, and must not look finished if the driver dies now. (Read now, not when sent.)
        stopped_by_signal = received() is not None

        def work() -> None:
            for view in views(trial):
                self._sync(view, flush=False)  # its last epochs go with its status tags
                outcome = _trial_outcome(view, errored=False)
                if outcome == "pruned" and stopped_by_signal:
                    self._close_trial(view, "KILLED", "interrupted")
                else:
                    self._close_trial(view, "FINISHED", outcome)

        self._hook(work)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        def work() -> None:
            for view in views(trial):
                self._sync(view)
                self._close_trial(view, "FAILED", "error")

        self._hook(work)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.close_trials(trials)

    # ---------------------------------------------------------------------------------- logging

    def _whitelisted(self, key: str) -> bool:
        return key == "epoch" or any(key.startswith(prefix) for prefix in self.metric_whitelist)

    def _queue(
        self, trial_id: str, result: Mapping[str, Any], *, durable: bool = False, hole: bool = False
    ) -> None:
        """Queue one result's whitelisted numbers under its epoch (skipped when MLflow has it).

        ``durable``: read back from Tune's result files (:meth:`requeue`), whose columns another
        row may lack: missing values (NaN there) are left out rather than logged as NaN. ``hole``:
        an epoch MLflow is known to lack although it has later ones (:meth:`_fill_holes`).
        """
        epoch = numeric(result.get("epoch"))
        if epoch is None:
            return
        child = self._children.get(trial_id)
        if child is not None and epoch <= child.last_epoch and not hole:
            return  # logged before a restart/restore
        pending = self._pending.setdefault(trial_id, [])
        if any(step == epoch for step, _, _ in pending):
            return
        metrics = {}
        for key, value in result.items():
            number = numeric(value)
            if number is not None and self._whitelisted(key) and not (durable and math.isnan(number)):
                metrics[key] = number
        stamp = numeric(result.get("timestamp")) if durable else None  # Tune's, in seconds
        pending.append((epoch, metrics, int((stamp if stamp is not None else time.time()) * 1000)))

    def _sync(
        self,
        trial: Trial,
        *,
        attempts: int | None = None,
        create: bool = False,
        reopen: bool = False,
        flush: bool = True,
    ) -> None:
        """Create the trial's run if needed and log its queued epochs. Never raises.

        A run is created at the trial's first queued result (or when ``create``: a trial that
        errored before reporting still gets a FAILED run). ``reopen``: the trial is running (it
        just reported), so a run closed as KILLED by an earlier, stopped driver is RUNNING again.
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
            if reopen and child.status != "RUNNING" and trial.trial_id not in self._finals:
                self._call(self.client.update_run, child.run_id, status="RUNNING", attempts=attempts)
                child.status = "RUNNING"
            if flush:
                self._flush(trial.trial_id, child, attempts=attempts)
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("MLflow logging for trial %s deferred: %s", trial.trial_id, exc)

    def _flush(
        self, trial_id: str, child: _ChildRun, *, attempts: int | None, tags: Sequence[Any] = ()
    ) -> None:
        """Send the trial's queued epochs, with its params if not sent yet and ``tags``, in as few
        ``log_batch`` calls as MLflow's limits allow (1,000 values, of them at most 100 params and
        100 tags): a tiny trial's run is one create, one batch at its first result, one at its end
        (its last epochs and its status tags) and its end status."""
        from mlflow.entities import Metric

        holes = self._holes.pop(trial_id, set())
        pending = [p for p in self._pending.get(trial_id, []) if p[0] > child.last_epoch or p[0] in holes]
        pending.sort(key=lambda p: p[0])
        metrics = [
            Metric(key, value, timestamp, int(step))
            for step, values, timestamp in pending
            for key, value in values.items()
        ]
        params, tags = list(child.unsent_params), list(tags)
        while metrics or params or tags:
            batch_params, params = params[:100], params[100:]
            batch_tags, tags = tags[:100], tags[100:]
            room = 1000 - len(batch_params) - len(batch_tags)
            batch_metrics, metrics = metrics[:room], metrics[room:]
            self._call(
                self.client.log_batch,
                child.run_id,
                metrics=batch_metrics,
                params=batch_params,
                tags=batch_tags,
                attempts=attempts,
            )
            child.unsent_params = child.unsent_params[len(batch_params) :]
        if pending:
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
            self._flush(trial.trial_id, child, attempts=attempts, tags=tags)  # and any queued epochs
            self._call(self._end_run, child.run_id, status, attempts=attempts)
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
        self.drain()
        attempts = self.retry.final_attempts
        trials = [view for trial in trials for view in views(trial)]  # stacked members: one run each
        self._begin_final_flush()
        for trial_id, rows in self._history.items():
            for row in rows:
                self._queue(trial_id, row, durable=True)
        settled = tuple(sorted((t.trial_id, str(t.status)) for t in trials))
        if settled == self._settled and not any(self._pending.values()) and not self._finals:
            return  # the last pass delivered and closed these trials as they are, and nothing came since
        self._settled = None
        if not self._connect():
            return
        # MLflow is the truth: this may be the runner's instance, not the one Tune used. One listing
        # of the trial runs (3.5 s at 1,000 runs here) serves the map and the orphans below.
        pending_children = self._children
        listed: list[Any] | None = None
        try:
            listed = self._rebuild()
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not list MLflow runs: %s", exc)
            self._children = pending_children
        if listed is not None and self._check_holes:
            self._fill_holes()
        for trial in trials:
            self._sync(trial, attempts=attempts, create=trial.status == "ERROR")
        from workers.interrupts import received

        stopped_by_signal = received() is not None
        for trial in trials:
            outcome = _trial_outcome(trial, errored=False)
            if trial.status == "TERMINATED" and outcome == "pruned" and stopped_by_signal:
                # As in on_trial_complete: Tune stopped it because of the signal; it did not finish.
                self._close_trial(trial, "KILLED", "interrupted", attempts=attempts)
            elif trial.status == "TERMINATED":
                self._close_trial(trial, "FINISHED", outcome, attempts=attempts)
            elif trial.status == "ERROR":
                self._close_trial(trial, "FAILED", "error", attempts=attempts)
            else:
                self._close_trial(trial, "KILLED", "interrupted", attempts=attempts)
        known = {t.trial_id for t in trials}
        parent_id = self._parent_id
        if parent_id is None:
            return
        try:
            for run in listed if listed is not None else self._children_of(parent_id):
                trial_id = run.data.tags.get(TAG_TRIAL_ID)
                if trial_id not in known and trials:
                    if run.info.status == "RUNNING":
                        self._call(self.client.set_terminated, run.info.run_id, "KILLED")
                    self._call(self.client.delete_run, run.info.run_id)
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not check for orphaned MLflow runs: %s", exc)
            return
        if listed is not None and not self.undelivered_trials():
            self._settled = settled

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
        trials failed). The sender thread (:attr:`background`) finishes its work first, then stops.
        """
        self.drain()
        try:
            self._close(status=status, trials=trials, summary=summary)
        finally:
            self._stop_sender()

    def _close(
        self,
        *,
        status: str,
        trials: Iterable[Trial] | None,
        summary: Mapping[str, float] | None,
    ) -> None:
        if trials is not None:
            self._final_flush(list(trials))
        else:
            self._begin_final_flush()
        if self._down_until != math.inf:
            # The parent gets its own window, even if the trials' flush used up the first one.
            self._final_deadline = time.monotonic() + self.retry.final_flush_s
        undelivered = self.undelivered_trials()
        if undelivered and status == "FINISHED":
            status = "FAILED"  # FINISHED only when every epoch of every trial is in MLflow
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

    def requeue(
        self, histories: Mapping[str, Sequence[Mapping[str, Any]]], *, restored: bool = False
    ) -> None:
        """Every trial's reported results, read back from the study directory (Tune's per-trial
        result files), to deliver at the end whatever MLflow lacks: results an outage kept from
        MLflow survive the driver, and a rerun delivers them without training anything.
        ``restored``: the phase ran under an earlier driver too; its runs are checked for holes
        (:meth:`_fill_holes`)."""
        self.drain()
        self._history = {trial_id: list(rows) for trial_id, rows in histories.items()}
        self._check_holes = restored
        if restored:
            self._settled = None  # a settled pass did not look for holes: the next one must

    def _fill_holes(self) -> None:
        """Queue the epochs of Tune's result files that MLflow lacks below a trial's last logged one.

        A driver killed after a result reached Tune's files and checkpoint but before it reached
        MLflow leaves one when the trial then resumes past that epoch: the rerun delivers the later
        epochs first, and "everything up to the last logged epoch is in" no longer holds for that run.
        A stacked group, whose first report carries every member's first epoch, makes it likely. One
        bulk read of the ``epoch`` history per 100 runs, only for a restored phase's runs whose
        result files hold an epoch at or below their last logged one."""
        from workers.tracking.replay import bulk_metric_history

        owners: dict[str, str] = {}  # run id -> trial id
        for trial_id, rows in self._history.items():
            child = self._children.get(trial_id)
            if child is None:
                continue
            epochs = (numeric(r.get("epoch")) for r in rows)
            if any(e is not None and e <= child.last_epoch for e in epochs):
                owners[child.run_id] = trial_id
        run_ids = list(owners)
        logged: dict[str, set[float]] = {}
        try:
            for start in range(0, len(run_ids), 100):
                chunk = run_ids[start : start + 100]
                answer = bulk_metric_history(self.client, chunk, "epoch")
                if answer is None:
                    points = [
                        (r, int(m.step), 0, 0.0)
                        for r in chunk
                        for m in self.client.get_metric_history(r, "epoch")
                    ]
                    cut: set[str] = set()
                else:
                    points, cut = answer
                for run_id in cut:  # an answer cut short: these runs read on their own
                    points += [
                        (run_id, int(m.step), 0, 0.0) for m in self.client.get_metric_history(run_id, "epoch")
                    ]
                for run_id, step, _, _ in points:
                    logged.setdefault(owners[run_id], set()).add(float(step))
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("could not check the restored trial runs for missing epochs: %s", exc)
            return
        for trial_id in owners.values():
            child, have = self._children[trial_id], logged.get(trial_id, set())
            for row in self._history[trial_id]:
                epoch = numeric(row.get("epoch"))
                if epoch is None or epoch > child.last_epoch or epoch in have:
                    continue
                self._holes.setdefault(trial_id, set()).add(epoch)
                self._queue(trial_id, row, durable=True, hole=True)

    def _final_flush(self, trials: list[Trial]) -> None:
        """Deliver every queued result and close the trial runs, trying again until all is in
        MLflow or ``final_flush_s`` is spent; says that it waits, and for what."""
        was_down = self._backoff > 0 or self._down_until > 0  # MLflow did not answer last time
        self._begin_final_flush()
        said = False

        def say(left: list[str]) -> None:
            nonlocal said
            if said:
                return
            said = True
            what = f"the results of {len(left)} trial(s) ({', '.join(left)})" if left else "the trial runs"
            left_s = max(0.0, (self._final_deadline or 0.0) - time.monotonic())
            print(
                f"[{self.study_name}] MLflow at {redact_uri(self.tracking_uri)} does not answer: waiting up to "
                f"{left_s:.0f} s more (tracking.final_flush_s = {self.retry.final_flush_s:g} s) to deliver {what}",
                file=sys.stderr,
                flush=True,
            )

        if was_down:
            say(self.undelivered_trials())
        while True:
            self.close_trials(trials)
            left = self.undelivered_trials()
            deadline = self._final_deadline
            if (not left and self._parent_id is not None) or deadline is None:
                return
            say(left)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(5.0, remaining))
            self._down_until = 0.0  # the next pass tries again

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        """A file as an artifact of the plan's run (raises when MLflow does not take it)."""
        self.drain()
        if not self._connect() or self._parent_id is None:
            raise MlflowUnavailable(f"MLflow unreachable; {path.name} not logged")
        self._call(
            self.client.log_artifact,
            self._parent_id,
            str(path),
            artifact_path,
            attempts=self.retry.final_attempts,
        )


def write_group_members(trial: Any, name: Callable[[Any], str]) -> None:
    """``<group folder>/members.json`` (:data:`GROUP_MEMBERS_FILE`) of a stacked group trial, on the
    study's storage (a local folder or S3), from the driver: :func:`group_members`. Nothing for a
    trial that is no group; a failure is logged, never raised (the file is for readers only)."""
    import json

    try:
        record = group_members(trial, name)
        if not record:
            return
        storage = trial.storage
        fs, folder = storage.storage_filesystem, storage.trial_fs_path
        fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(f"{folder}/{GROUP_MEMBERS_FILE}") as out:
            out.write((json.dumps(record, indent=1, sort_keys=True, default=str) + "\n").encode())
    except Exception as exc:
        logger.warning("could not list the members of group %s: %s", getattr(trial, "trial_id", trial), exc)


def _trial_outcome(trial: Trial, *, errored: bool) -> str:
    """``completed`` / ``diverged`` from the trial's own last report; ``pruned`` when it never sent a
    final status (a scheduler stopped it)."""
    if errored:
        return "error"
    status = (trial.last_result or {}).get("status")
    return str(status) if status in ("completed", "diverged", "error") else "pruned"
