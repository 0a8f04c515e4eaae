"""Run a :class:`StudyPlan` on Ray Tune: start, or restore after a crash, and report the trials.

``run_study`` is idempotent: the same call after a killed driver finds Tune's experiment state
(``Tuner.can_restore``) and restores it, resuming errored and unfinished trials from their last
checkpoints; finished trials are not run again and MLflow runs are re-attached, not duplicated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workers import interrupts
from workers.errors import ResourceError, TrackingIncomplete
from workers.plan import StudyPlan, expected_trials
from workers.progress import ProgressCallback, SyncFailureOneLine, quiet_checkpoint_logs
from workers.search import FINAL_STATUSES, create_scheduler, create_searcher, grid_param_space
from workers.session import ray_session
from workers.storage import ResolvedStorage, resolve_storage
from workers.tracking import (
    ROLE_PHASE,
    ROLE_STUDY,
    MlflowTrackingCallback,
    RetryPolicy,
    TrialDirnamer,
    TrialNamer,
    default_tracking_uri,
    redact_uri,
    study_key,
    trial_tag_templates,
)
from workers.trainable import TrialFunction, autonorm_trial, tune_entry

__all__ = [
    "StudyResult",
    "TrialRecord",
    "TrialStatus",
    "best_trial",
    "expected_trials",
    "export_optuna_study",
    "read_trials",
    "run_study",
    "trial_status",
]

logger = logging.getLogger(__name__)

TrialStatus = Literal["completed", "diverged", "error", "pruned"]


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a finished study.

    Attributes:
        trial_id: Tune's trial id (also the ``ray.trial_id`` tag of its MLflow run).
        params: the sampled parameters (dotted paths), as Tune saw them.
        config: the resolved trial config the trial ran.
        status: ``completed`` / ``diverged`` (the trial's own last report), ``pruned`` (a scheduler
            stopped it, or it never started), ``error`` (failed after all retries).
        metrics: the trial's last reported result (Tune bookkeeping keys included).
        node_id: Ray node of the last report, when any.
        mlflow_run_id: its child run, when one was created.
        history: every reported result in order (filled by :func:`read_trials`).
    """

    trial_id: str
    params: dict[str, Any]
    config: dict[str, Any]
    status: TrialStatus
    metrics: dict[str, Any]
    node_id: str | None = None
    mlflow_run_id: str | None = None
    history: tuple[dict[str, Any], ...] = ()


def trial_status(tune_status: str, last_result: Mapping[str, Any] | None) -> TrialStatus:
    """The one decision of a trial's status, from Tune's status and the trial's own last report.

    ``ERROR`` -> ``error``; a last report whose ``status`` is ``completed`` / ``diverged`` -> that;
    anything else (a scheduler stopped it, it never started, the study was cut short) -> ``pruned``.
    """
    if tune_status == "ERROR":
        return "error"
    status = (last_result or {}).get("status")
    if status in FINAL_STATUSES:
        return status  # type: ignore[no-any-return]
    return "pruned"


def best_trial(trials: Sequence[TrialRecord], metric: str, mode: str) -> TrialRecord | None:
    """The one "best" rule: the COMPLETED trial with the best finite ``metric`` (``None`` if none).

    Pruned, diverged and errored trials never win, whatever their last reported value.
    """
    candidates = [
        t
        for t in trials
        if t.status == "completed"
        and isinstance(t.metrics.get(metric), int | float)
        and math.isfinite(t.metrics[metric])
    ]
    if not candidates:
        return None
    pick = max if mode == "max" else min
    return pick(candidates, key=lambda t: t.metrics[metric])


@dataclass(frozen=True)
class StudyResult:
    """What :func:`run_study` returns.

    Attributes:
        experiment_path: Tune's experiment directory (``/abs/dir/name`` or ``s3://bucket/prefix/name``).
        tracking_uri: the MLflow URI the study logged to.
        parent_run_id: the study's MLflow parent run (``None`` only when MLflow never answered).
        trials: one record per trial, in Tune's order.
        restored: the call restored an existing experiment instead of starting it.
        undelivered_trials: trials whose MLflow metrics could not all be delivered (an outage that
            outlasted the study's final flush); their data is still in the Tune experiment.
    """

    experiment_path: str
    tracking_uri: str
    parent_run_id: str | None
    trials: list[TrialRecord] = field(default_factory=list)
    restored: bool = False
    undelivered_trials: list[str] = field(default_factory=list)

    def count(self, status: TrialStatus) -> int:
        return sum(t.status == status for t in self.trials)

    def best(self, metric: str, mode: Literal["min", "max"]) -> TrialRecord | None:
        """:func:`best_trial` over this study's trials."""
        return best_trial(self.trials, metric, mode)


def _max_epochs(plan: StudyPlan) -> int:
    """Upper bound on reports per trial, for ASHA's ``max_t``."""
    training = plan.base_config.get("training", {})
    if training.get("budget") == "updates":
        return 10**6  # epoch count depends on the data; rungs past the end are never reached
    epochs = [int(training.get("epochs", 10))]
    for param in plan.space:
        if param.name == "training.epochs" and param.high is not None:
            epochs.append(int(param.high))
        if param.name == "training.epochs" and param.choices:
            epochs.extend(int(c) for c in param.choices)
    for name, values in plan.grid:
        if name == "training.epochs":
            epochs.extend(int(v) for v in values)
    return max(epochs)


def check_resources(
    plan: StudyPlan, have: Mapping[str, float] | None = None, *, partial: bool = False
) -> None:
    """Refuse a plan whose trial asks for more than the whole cluster has (Tune would wait forever).

    ``have``: the cluster's resources (Ray's names, ``CPU``/``GPU``); ``None`` asks the connected
    cluster. ``partial``: ``have`` lists only what is known, resources missing from it are not checked. A study that starts its own local cluster checks the predicted resources
    (:func:`workers.session.local_cluster_resources`) before starting it, so a bad request fails in
    a second; resources it cannot predict (GPUs Ray would detect, custom ones) are checked again once
    the cluster is up. Set ``AUTONORM_ALLOW_PENDING_RESOURCES=1`` on an autoscaling cluster whose
    nodes appear on demand.

    Raises:
        ResourceError: naming the resource, what a trial asks and what the cluster has.
    """
    if os.environ.get("AUTONORM_ALLOW_PENDING_RESOURCES") == "1":
        return
    if have is None:
        import ray

        have = ray.cluster_resources()
    names = {"cpu": "CPU", "gpu": "GPU"}
    for key, amount in plan.resources:
        name = names.get(key, key)
        if partial and name not in have:
            continue  # not predicted: checked once the cluster is up
        total = float(have.get(name, 0.0))
        if amount > 0 and amount > total:
            raise ResourceError(
                f"resources.{key}: a trial of {plan.name!r} asks for {amount:g} {name}, but the "
                f"Ray cluster has {total:g} in all, so no trial could ever start. Lower resources.{key}, or join a "
                "larger cluster (RAY_ADDRESS); on an autoscaling cluster set AUTONORM_ALLOW_PENDING_RESOURCES=1."
            )


def precheck_local_resources(
    plans: Sequence[StudyPlan], address: str | None, init_kwargs: Mapping[str, Any] | None
) -> None:
    """Before starting a local cluster, refuse plans it could never run (see :func:`check_resources`)."""
    from workers.session import local_cluster_resources

    predicted = local_cluster_resources(address, init_kwargs)
    if predicted is None:
        return
    for plan in plans:
        check_resources(plan, predicted, partial=True)


def _tracking_uri(plan: StudyPlan, storage: ResolvedStorage) -> str:
    """Spec URI, else ``MLFLOW_TRACKING_URI`` (MLflow's convention), else sqlite beside the runs."""
    if plan.tracking.uri:
        uri = plan.tracking.uri
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    elif storage.is_local:
        return default_tracking_uri(storage.storage_path)
    else:
        raise ValueError(
            f"storage {storage.uri} is remote, so there is no local default for MLflow: set tracking.uri "
            "or MLFLOW_TRACKING_URI (e.g. http://mlflow:5000)"
        )
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        raise ValueError(
            f"tracking URI {uri!r} is a relative sqlite path, which every Ray worker would resolve "
            "against its own working directory; use sqlite:////absolute/path/mlflow.db"
        )
    return uri


def _artifact_location(plan: StudyPlan, storage: ResolvedStorage, tracking_uri: str) -> str | None:
    if plan.tracking.artifact_location:
        return plan.tracking.artifact_location
    if tracking_uri.startswith("sqlite:") and storage.is_local:
        # MLflow's sqlite default would be ./mlruns in whatever directory the driver runs from.
        return f"file://{storage.storage_path}/mlartifacts"
    return None  # a tracking server decides (proxied artifacts)


# Ray Tune copies these from the driver's environment into every trainable actor's runtime_env,
# and Ray's runtime-env agent writes that runtime_env verbatim into its log files: the S3 secret
# would end up in session logs (and in what the dashboard shows). Trial processes get credentials
# the way every other Ray process does: inherited by a local cluster, from the node's own
# environment (Kubernetes Secrets, instance profiles) on a real one.
_CREDENTIAL_ENV_VARS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


def _stop_credential_propagation() -> None:
    """Remove credential names from Tune's env propagation list (private Ray API, pinned by tests)."""
    from ray.tune.execution import class_cache

    propagated = set(class_cache.ENV_VARS_TO_PROPAGATE)
    class_cache.ENV_VARS_TO_PROPAGATE = propagated - _CREDENTIAL_ENV_VARS


def _trials_state(controller: Any) -> tuple[Any, ...]:
    """What Tune's experiment snapshot records of each trial, in a form that changes with it: status,
    the time of the last result (a result, a checkpoint, a searcher or scheduler update all come
    with one), failures and the error file. Equal between two loop steps: nothing to save again."""
    return tuple(
        (
            t.trial_id,
            t.status,
            t.run_metadata.last_result_time,
            t.run_metadata.num_failures,
            t.run_metadata.error_filename,
        )
        for t in controller._trials
    )


def _skip_idle_snapshots() -> None:
    """Tune saves its experiment state at every step of its loop here (``TUNE_GLOBAL_CHECKPOINT_S=0``,
    so that a driver killed right after a trial finished does not run it again), and the loop steps
    every 0.1 s while it waits for a trial actor or a result: about ten identical snapshots a second,
    each a JSON dump of every trial, the searcher's and callbacks' state and a background copy to the
    study's storage (measured: ~156 snapshots and ~0.9 of 3.1 driver CPU s for a two-phase tiny
    study). A snapshot is skipped when no trial changed since the last one saved; forced and final
    snapshots (``force``/``wait``, or Tune's own forced sync after trial checkpoints) always run.
    Wraps ``TuneController.checkpoint`` once per process (private Ray API, pinned by a test)."""
    from ray.tune.execution.tune_controller import TuneController

    if getattr(TuneController.checkpoint, "_autonorm_skips_idle", False):
        return
    original = TuneController.checkpoint

    @functools.wraps(original)  # keeps Tune's signature visible (the test that pins the API reads it)
    def checkpoint(self: Any, force: bool = False, wait: bool = False) -> None:
        manager = self._checkpoint_manager
        state = _trials_state(self)
        if not (force or wait or manager._should_force_sync_up) and state == getattr(
            self, "_autonorm_saved_state", None
        ):
            return
        saved_at = manager._last_save_time
        original(self, force=force, wait=wait)
        if manager._last_save_time != saved_at:
            self._autonorm_saved_state = state

    checkpoint._autonorm_skips_idle = True  # type: ignore[attr-defined]
    TuneController.checkpoint = checkpoint  # type: ignore[method-assign]


def _record(trial: Any, run_ids: Mapping[str, str], base_config: Mapping[str, Any]) -> TrialRecord:
    from workers.trainable import config_from_result

    last = dict(trial.last_result or {})
    params = dict(trial.config or {})
    return TrialRecord(
        trial_id=trial.trial_id,
        params=params,
        config=config_from_result(last, base_config, params),
        status=trial_status(trial.status, last),
        metrics=last,
        node_id=last.get("node_id"),
        mlflow_run_id=run_ids.get(trial.trial_id),
    )


def run_study(
    plan: StudyPlan,
    *,
    trainable: TrialFunction | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    ray_init_kwargs: Mapping[str, Any] | None = None,
    nest_under: str | None = None,
) -> StudyResult:
    """Run (or resume) a study and return its trials.

    Args:
        plan: the study (from ``studies``).
        trainable: trial function ``fn(config, session)``; :func:`workers.trainable.autonorm_trial`
            when ``None``.
        ray_address: cluster to join; ``RAY_ADDRESS`` when ``None``; a local loopback cluster when
            neither is set (and Ray is not already initialised in this process).
        progress: print progress lines.
        ray_init_kwargs: extra ``ray.init`` keywords (``num_cpus``, ``_temp_dir``) for the local case.
        nest_under: the MLflow run of the study this plan is one phase of (see
            :class:`workers.study.StudyRunner`): the plan's run is then a ``phase`` run nested under
            it, with the trial runs as its children. ``None``: the plan's run is the study's run.

    A rerun restores what Tune pickled at the first start (searcher, scheduler, callbacks, trial
    count): changes to the plan other than the trial function do not apply to an existing
    experiment. Change ``name`` or ``storage.path`` to start a new study.

    Returns:
        The study's experiment path, tracking URI, parent run and one record per trial.

    Raises:
        ValueError: an inconsistent plan (bad space, unknown sampler/scheduler, relative sqlite URI).
        ray.tune.TuneError: Tune itself failed (not a trial: errored trials are records).
    """

    if "TUNE_RESULT_DIR" in os.environ:
        # Ray 2.60 raises in Tuner.fit() when it is set; storage_path is the supported setting.
        logger.warning(
            "ignoring TUNE_RESULT_DIR=%s; the plan's storage.path is used", os.environ["TUNE_RESULT_DIR"]
        )
        del os.environ["TUNE_RESULT_DIR"]
    # Snapshot the experiment state on every loop step: with the default (~10 s) a driver killed in
    # between re-runs trials that had already finished.
    os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = "0"

    storage = resolve_storage(plan.storage)
    experiment_path = storage.experiment_path(plan.name)
    experiment_uri = storage.experiment_uri(plan.name)
    key = study_key(experiment_uri)
    tracking_uri = _tracking_uri(plan, storage)
    trial_fn = trainable or autonorm_trial
    total = expected_trials(plan)
    namer = TrialNamer(plan.run_name, plan_name=plan.name, base_config=plan.base_config)
    parent_tags, trial_tags = trial_tag_templates(dict(plan.tags))

    tracker = MlflowTrackingCallback(
        tracking_uri=tracking_uri,
        experiment_name=plan.tracking.experiment,
        key=key,
        base_config=plan.base_config,
        metric_whitelist=plan.metric_whitelist,
        artifact_location=_artifact_location(plan, storage, tracking_uri),
        parent_tags=parent_tags,
        parent_params=dict(plan.params),
        artifacts=dict(plan.artifacts),
        expected_trials=total,
        retry=RetryPolicy(final_flush_s=plan.tracking.final_flush_s),
        study_name=plan.name,
        role=ROLE_PHASE if nest_under else ROLE_STUDY,
        nest_under=nest_under,
        run_namer=namer,
        trial_tags=trial_tags,
    )
    # Build the search pieces before starting anything: a bad plan fails fast, with nothing to clean up.
    if plan.sampler.type == "grid":
        searcher = None
        param_space = grid_param_space(plan)
    else:
        searcher = create_searcher(plan, study_key=key)
        param_space = {}
    scheduler = create_scheduler(plan.scheduler, metric=plan.metric, mode=plan.mode, max_t=_max_epochs(plan))
    precheck_local_resources([plan], ray_address, ray_init_kwargs)

    with ray_session(ray_address, ray_init_kwargs, env_vars={"MLFLOW_TRACKING_URI": tracking_uri}):
        check_resources(plan)
        _stop_credential_propagation()
        _skip_idle_snapshots()
        quiet_checkpoint_logs()
        SyncFailureOneLine.install()
        trials, restored = _fit(
            plan,
            trial_fn,
            tracker,
            storage,
            experiment_path,
            experiment_uri,
            param_space,
            searcher,
            scheduler,
            ProgressCallback(name=plan.name, total=total) if progress else None,
            namer,
        )
    # Stopped by a signal: Tune saved its state and the runs are closed as KILLED; the study stops
    # here (no further phase, no analysis), after Ray was shut down above.
    interrupts.raise_if_interrupted()
    undelivered = list(tracker.undelivered_trials())
    if undelivered:
        raise TrackingIncomplete(
            f"MLflow at {redact_uri(tracking_uri)} did not take the results of {len(undelivered)} trial(s) of "
            f"{plan.name!r} within tracking.final_flush_s ({plan.tracking.final_flush_s:g} s): "
            f"{', '.join(undelivered)}. They are kept in {experiment_uri} (each trial's result.json); "
            "run the same command again once MLflow answers: it delivers them without training anything.",
            undelivered,
        )
    run_ids = tracker.child_run_ids()
    return StudyResult(
        experiment_path=experiment_uri,
        tracking_uri=tracking_uri,
        parent_run_id=tracker.parent_run_id,
        trials=[_record(t, run_ids, plan.base_config) for t in trials or []],
        restored=restored,
        undelivered_trials=list(tracker.undelivered_trials()),
    )


def _fit(
    plan: StudyPlan,
    trial_fn: TrialFunction,
    tracker: MlflowTrackingCallback,
    storage: ResolvedStorage,
    experiment_path: str,
    experiment_uri: str,
    param_space: dict[str, Any],
    searcher: Any,
    scheduler: Any,
    progress: ProgressCallback | None,
    namer: TrialNamer,
) -> tuple[list[Any] | None, bool]:
    """Start or restore the Tuner and run it; the tracker's runs are closed whatever happens.

    An Optuna-sampled plan's study is saved as ``<experiment dir>/optuna.db`` once Tune returns.
    """
    from ray import tune

    total = expected_trials(plan)
    parent_status = "FAILED"
    trials: list[Any] | None = None
    restored = False
    try:
        restored = tune.Tuner.can_restore(experiment_path, storage_filesystem=storage.filesystem)
        # Before any trial starts: creates the sqlite schema, the experiment and the parent run.
        try:
            tracker.prepare(fresh=not restored)
        except Exception as exc:
            # An MLflow outage must not stop the study: the callback attaches once MLflow answers.
            logger.error("MLflow not reachable at study start (%s); tracking will catch up later", exc)
        resources = {k: float(v) for k, v in plan.resources}
        entry = tune.with_resources(
            tune.with_parameters(
                tune_entry,
                trial_fn=trial_fn,
                base_config=plan.base_config,
                tracking_uri=tracker.tracking_uri,
                metric=plan.metric,
                retries=plan.retries,
            ),
            resources,
        )
        if restored:
            logger.info("restoring study %s from %s", plan.name, experiment_uri)
            # Tune brings back the searcher, scheduler and callbacks it pickled at the first start.
            tuner = tune.Tuner.restore(
                experiment_path,
                trainable=entry,
                resume_unfinished=True,
                resume_errored=True,
                param_space=param_space or None,
                storage_filesystem=storage.filesystem,
            )
        else:
            callbacks: list[Any] = [tracker]
            if progress is not None:
                callbacks.append(progress)
            tuner = tune.Tuner(
                entry,
                param_space=param_space,
                tune_config=tune.TuneConfig(
                    # metric/mode live on the searcher and scheduler: OptunaSearch ignores them here.
                    search_alg=searcher,
                    scheduler=scheduler,
                    num_samples=plan.num_samples,
                    max_concurrent_trials=max(1, plan.max_concurrent),
                    reuse_actors=True,
                    # The folder is named after the trial's readable name, as its MLflow run is.
                    trial_dirname_creator=TrialDirnamer(namer),
                    trial_name_creator=namer,
                ),
                run_config=tune.RunConfig(
                    name=plan.name,
                    storage_path=storage.storage_path,
                    storage_filesystem=storage.filesystem,
                    failure_config=tune.FailureConfig(max_failures=plan.node_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    callbacks=callbacks,
                    verbose=0,
                ),
            )
        with interrupts.fitting():
            tuner.fit()
        used_searcher = _searcher_of(tuner) if searcher is not None else None
        if used_searcher is not None:
            _save_optuna_study(plan, storage, experiment_path, used_searcher, tracker)
        # The public way to the Trial objects (status, config, last result) of the whole experiment.
        analysis = tune.ExperimentAnalysis(experiment_path, storage_filesystem=storage.filesystem)
        trials = list(analysis.trials)
        tracker.requeue(_tune_results(trials))
        # Tune returns normally after a Ctrl-C too, with unfinished trials: the study was cut short.
        finished = all(t.status in ("TERMINATED", "ERROR") for t in trials)
        parent_status = "FINISHED" if finished and interrupts.received() is None else "KILLED"
    except (KeyboardInterrupt, interrupts.StudyInterrupted):
        parent_status = "KILLED"
        raise
    finally:
        tracker.close(status=parent_status, trials=trials, summary=_summary(trials, total))
    return trials, restored


def _tune_results(trials: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
    """Every result each trial reported, as Tune keeps it in the study directory (its
    ``result.json``, one JSON object per line; local or S3). A file that cannot be read is skipped:
    its trial's results then come from this run's memory only."""
    import json

    out: dict[str, list[dict[str, Any]]] = {}
    for trial in trials:
        try:
            fs = trial.storage.storage_filesystem
            with fs.open_input_stream(f"{trial.path}/result.json") as stream:
                text = stream.read().decode("utf-8", errors="replace")
        except Exception:
            continue
        rows = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
        out[trial.trial_id] = rows
    return out


def _searcher_of(tuner: Any) -> Any:
    """The Optuna searcher a Tuner ran with: Tune restores the pickled one in place after a restore,
    and wraps it (``ConcurrencyLimiter``) without copying it. Private Ray API; ``None`` if it moved."""
    config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    search = getattr(config, "search_alg", None)
    while search is not None and not hasattr(search, "_ot_study") and hasattr(search, "searcher"):
        search = search.searcher
    return search if hasattr(search, "_ot_study") else None


OPTUNA_DB = "optuna.db"


def export_optuna_study(source: Any, path: str | os.PathLike[str], study_name: str) -> int:
    """Copy every finished trial of the Optuna study ``source`` into the SQLite study ``study_name``
    at ``path`` (created when missing); trials copied before are skipped. Returns how many were added.

    A trial is known by the ``autonorm.source_number`` user attribute it gets here, so running this
    again after a resumed study adds only the trials that finished since.
    """
    import optuna

    url = f"sqlite:///{Path(path).resolve()}"
    target = optuna.create_study(
        storage=url, study_name=study_name, directions=source.directions, load_if_exists=True
    )
    done = {t.user_attrs.get("autonorm.source_number") for t in target.get_trials(deepcopy=False)}
    new = []
    for trial in source.get_trials(deepcopy=True):
        if not trial.state.is_finished() or trial.number in done:
            continue
        trial.set_user_attr("autonorm.source_number", trial.number)
        new.append(trial)
    target.add_trials(new)
    return len(new)


def _save_optuna_study(
    plan: StudyPlan,
    storage: ResolvedStorage,
    experiment_path: str,
    searcher: Any,
    tracker: MlflowTrackingCallback,
) -> None:
    """``<experiment dir>/optuna.db`` (for ``optuna-dashboard``), also an artifact of the plan's run.

    The searcher keeps its study in memory (what Tune pickles and restores); this is a copy made at
    the end of every run. Never fails the study: a problem is logged.
    """
    import shutil
    import tempfile

    scratch: Path | None = None  # S3 storage: the copy is made here, then removed
    try:
        if storage.is_local:
            local = Path(experiment_path) / OPTUNA_DB
            added = export_optuna_study(searcher._ot_study, local, plan.name)
        else:
            scratch = Path(tempfile.mkdtemp(prefix="optuna-"))
            local = scratch / OPTUNA_DB
            fs = storage.filesystem
            assert fs is not None
            with (
                contextlib.suppress(FileNotFoundError, OSError),
                fs.open_input_stream(f"{experiment_path}/{OPTUNA_DB}") as src,
            ):
                local.write_bytes(src.read())
            added = export_optuna_study(searcher._ot_study, local, plan.name)
            with fs.open_output_stream(f"{experiment_path}/{OPTUNA_DB}") as out:
                out.write(local.read_bytes())
        where = f"{storage.experiment_uri(plan.name)}/{OPTUNA_DB}"
        logger.info("optuna study %s: %d trial(s) added to %s", plan.name, added, where)
        if storage.is_local:
            print(f"[{plan.name}] optuna study -> optuna-dashboard sqlite:///{local.resolve()}", flush=True)
        else:
            print(
                f"[{plan.name}] optuna study -> {where} (download it, then optuna-dashboard sqlite:///optuna.db)"
            )
        tracker.log_file(local)
    except Exception as exc:
        logger.error("could not save the Optuna study of %s to %s: %s", plan.name, OPTUNA_DB, exc)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _summary(trials: list[Any] | None, total: int) -> dict[str, float] | None:
    if trials is None:
        return None
    counts = {"completed": 0, "diverged": 0, "pruned": 0, "error": 0}
    for trial in trials:
        counts[trial_status(trial.status, trial.last_result)] += 1
    summary = {f"trials_{k}": float(v) for k, v in counts.items()}
    summary["trials_expected"] = float(total)
    return summary


def read_trials(plan: StudyPlan, *, history: bool = True) -> list[TrialRecord]:
    """A study's trials read back from its Tune experiment directory (no Ray cluster needed).

    Same records as :func:`run_study` returns (``mlflow_run_id`` excepted), so status and reports
    use one vocabulary. Empty when the study has not written its state yet. Inside
    :func:`workers.tracking.replay.replaying`: the phase's trial runs in MLflow instead.
    """
    from workers.tracking.replay import replayed

    replay = replayed(plan.name, history=history)
    if replay is not None:
        return replay
    from ray.tune import ExperimentAnalysis

    storage = resolve_storage(plan.storage)
    path = storage.experiment_path(plan.name)
    # Trials that never reported have no result file yet; Tune warns about each.
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        analysis = ExperimentAnalysis(path, storage_filesystem=storage.filesystem)
    except (ValueError, FileNotFoundError):
        return []
    finally:
        quiet.setLevel(level)
    frames = analysis.trial_dataframes if history else {}
    records = []
    for trial in analysis.trials:
        record = _record(trial, {}, plan.base_config)
        df = frames.get(trial.trial_id)
        if df is not None and not df.empty:
            record = dataclasses.replace(record, history=tuple(df.to_dict(orient="records")))
        records.append(record)
    return records
