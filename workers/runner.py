"""Run a :class:`StudyPlan` on Ray Tune: start, or restore after a crash, and report the trials.

``run_study`` is idempotent: the same call after a killed driver finds Tune's experiment state
(``Tuner.can_restore``) and restores it, resuming errored and unfinished trials from their last
checkpoints; finished trials are not run again and MLflow runs are re-attached, not duplicated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from workers import interrupts, tune_state, uploads
from workers.console import route_worker_output, tune_output
from workers.errors import TrackingIncomplete
from workers.group_trial import group_entry
from workers.members import MEMBERS_KEY, views
from workers.optuna_export import OptunaExport, _searcher_of
from workers.plan import StudyPlan, expected_trials
from workers.preflight import (
    _artifact_location,
    _max_epochs,
    _tracking_uri,
    check_resources,
    precheck_local_resources,
)
from workers.progress import ProgressCallback, SyncFailureOneLine, close_progress_lines, quiet_checkpoint_logs
from workers.ray_internals import (
    TUNER_STATE_FILE,
    cheaper_results,
    skip_idle_snapshots,
    stop_credential_propagation,
    tolerate_gone_checkpoints,
    unique_staging_dirs,
    whole_file_uploads,
)
from workers.records import StudyResult
from workers.results import _record, _summary, _tune_results
from workers.search import create_scheduler, create_searcher, grid_param_space
from workers.session import ray_session
from workers.storage import ResolvedStorage, resolve_storage
from workers.tracking import (
    ROLE_PHASE,
    ROLE_STUDY,
    TAG_ARM,
    MlflowTrackingCallback,
    RetryPolicy,
    TrialDirnamer,
    TrialNamer,
    redact_uri,
    study_key,
    trial_tag_templates,
)
from workers.trainable import TrialFunction, autonorm_trial, tune_entry
from workers.uploads import is_local, write_whole

__all__ = ["run_study"]

logger = logging.getLogger(__name__)

SNAPSHOT_PERIOD_ENV = "AUTONORM_TUNE_SNAPSHOT_S"


def snapshot_period(environ: Mapping[str, str]) -> str:
    """The ``TUNE_GLOBAL_CHECKPOINT_S`` a study runs with: ``"0"`` (a snapshot at every step of
    Tune's loop), unless :data:`SNAPSHOT_PERIOD_ENV` names another: ``auto`` (Tune's default, ~10 s
    and more) or seconds. For measurements (docs/reliability.md), not for studies.

    Raises:
        ValueError: a value Tune would not accept.
    """
    value = environ.get(SNAPSHOT_PERIOD_ENV, "").strip() or "0"
    if value != "auto":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            raise ValueError(f"{SNAPSHOT_PERIOD_ENV}={value!r}: 'auto' or seconds >= 0")
    return value


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
    # between re-runs trials that had already finished. AUTONORM_TUNE_SNAPSHOT_S overrides it (to
    # measure Tune's own period, docs/reliability.md).
    os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = snapshot_period(os.environ)
    # ...and Tune's warning that snapshots forced by trial checkpoints (two kept per trial) come more
    # often than every 5 s "may become a bottleneck" is about exactly that choice: a study of small
    # trials printed it every few seconds. Its cost is measured instead (bench/study_scale.py).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")

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
        background=True,  # Tune's loop does not wait for MLflow's answers
    )
    # Build the search pieces before starting anything: a bad plan fails fast, with nothing to clean up.
    if plan.sampler.type == "grid":
        searcher = None
        stack = _stack_for(plan, trainable, storage, experiment_path)
        param_space = grid_param_space(plan, stack=stack)
    else:
        searcher = create_searcher(plan, study_key=key)
        param_space = {}
    scheduler = create_scheduler(plan.scheduler, metric=plan.metric, mode=plan.mode, max_t=_max_epochs(plan))
    precheck_local_resources([plan], ray_address, ray_init_kwargs)

    with ray_session(ray_address, ray_init_kwargs, env_vars={"MLFLOW_TRACKING_URI": tracking_uri}):
        check_resources(plan)
        stop_credential_propagation()
        skip_idle_snapshots(tune_state.book)
        tolerate_gone_checkpoints()
        unique_staging_dirs()
        whole_file_uploads(uploads.is_local, uploads.upload_tree)
        cheaper_results()
        tune_state.install()
        quiet_checkpoint_logs()
        route_worker_output()  # what trials print goes to the study's driver.log, their own lines excepted
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
            _progress(plan, total, trial_tags) if progress else None,
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
        trials=[_record(v, run_ids, plan.base_config) for t in trials or [] for v in views(t)],
        restored=restored,
        undelivered_trials=list(tracker.undelivered_trials()),
    )


STACK_FILE = "stacking.json"
TUNER_STATE = TUNER_STATE_FILE  # Tune's own name (workers.ray_internals)


def _unreadable_tuner_state(experiment_path: str, storage: ResolvedStorage) -> str | None:
    """Why the experiment's ``tuner.pkl`` cannot be unpickled (empty, cut short), or None when it
    can. Tune writes it once, at the study's first start, and copies it again at every snapshot of
    a restored driver; a driver killed mid-copy (before workers/uploads.py) left it empty."""
    import pickletools

    import pyarrow.fs

    fs = storage.filesystem or pyarrow.fs.LocalFileSystem()
    try:
        with fs.open_input_stream(f"{experiment_path}/{TUNER_STATE}") as f:
            data = f.read()
    except Exception:  # missing or unreachable: Tune's own restore says so
        return None
    if not data:
        return "empty"
    try:  # reads the opcodes to the final STOP without running any of them
        for _ in pickletools.genops(data):
            pass
    except Exception as exc:
        return f"cut short: {exc}"
    return None


def _stack_for(plan: StudyPlan, trainable: Any, storage: ResolvedStorage, experiment_path: str) -> int:
    """Members per Tune trial of a grid plan: what the experiment recorded when it started (a study
    stored before stacking existed has no record: it resumes unstacked, as it ran), else the plan's
    ``stack`` (1 with an injected trial function, which trains one config at a time). Recorded here
    for a new experiment, before its first trial."""
    import json

    import pyarrow.fs
    from ray import tune

    fs = storage.filesystem or pyarrow.fs.LocalFileSystem()
    record = f"{experiment_path}/{STACK_FILE}"
    try:
        with fs.open_input_stream(record) as f:
            return max(1, int(json.loads(f.read().decode())["stack"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if tune.Tuner.can_restore(experiment_path, storage_filesystem=storage.filesystem):
        return 1
    stack = max(1, int(plan.stack)) if trainable is None else 1
    fs.create_dir(experiment_path, recursive=True)
    body = json.dumps({"stack": stack}).encode()
    if is_local(fs):  # a part of it would resume the study unstacked
        write_whole(record, body)
    else:
        with fs.open_output_stream(record) as out:
            out.write(body)
    return stack


def _progress(plan: StudyPlan, total: int, trial_tags: Mapping[str, str]) -> ProgressCallback:
    """The phase's progress line, counted in trials (a stacked group's members each count), its
    best trial named by its arm (the trial runs' ``autonorm.arm`` tag) or its readable name."""
    label = TrialNamer(
        trial_tags.get(TAG_ARM) or plan.run_name, plan_name=plan.name, base_config=plan.base_config
    )
    return ProgressCallback(name=plan.name, total=total, metric=plan.metric, mode=plan.mode, label=label)


def _resume_line(name: str, experiment_path: str, storage: ResolvedStorage, total: int) -> str:
    """What a restore keeps, in one line: the finished trials, and the epoch each unfinished trial
    resumes after (its last checkpoint Tune recorded)."""
    from ray import tune

    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")  # trials without results yet
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        trials = list(tune.ExperimentAnalysis(experiment_path, storage_filesystem=storage.filesystem).trials)
    except Exception:
        return f"[{name}] resuming from its saved state"
    finally:
        quiet.setLevel(level)
    done = sum(len(views(t)) for t in trials if t.status in ("TERMINATED", "ERROR"))
    parts = []
    for t in trials:
        if t.status in ("TERMINATED", "ERROR"):
            continue
        manager = getattr(t.run_metadata, "checkpoint_manager", None)
        latest = getattr(manager, "latest_checkpoint_result", None)
        epoch = (getattr(latest, "metrics", None) or {}).get("epoch")
        parts.append(
            f"{t.trial_id} after epoch {int(epoch)} (epochs 1-{int(epoch)} kept)"
            if isinstance(epoch, int | float)
            else f"{t.trial_id} from scratch (no checkpoint)"
        )
    unfinished = f"; unfinished trials resume: {', '.join(parts)}" if parts else ""
    return (
        f"[{name}] resuming from its saved state: {done} of {max(total, len(trials))} trial(s) "
        f"finished and kept{unfinished}"
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
    export: OptunaExport | None = None
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
                group_entry if MEMBERS_KEY in param_space else tune_entry,
                trial_fn=trial_fn,
                base_config=plan.base_config,
                tracking_uri=tracker.tracking_uri,
                metric=plan.metric,
                retries=plan.retries,
            ),
            resources,
        )

        def fresh_tuner() -> Any:
            from workers.tune_loggers import study_loggers

            callbacks: list[Any] = [tracker]
            if progress is not None:
                callbacks.append(progress)
            callbacks += study_loggers()
            return tune.Tuner(
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

        if restored:
            logger.info("restoring study %s from %s", plan.name, experiment_uri)
            if progress is not None:
                print(_resume_line(plan.name, experiment_path, storage, total), flush=True)
            broken = _unreadable_tuner_state(experiment_path, storage)
            if broken:
                # What tuner.pkl holds is what this same spec builds (the searcher's and trials'
                # progress live in the experiment state and the searcher's files): written again.
                print(
                    f"[{plan.name}] {TUNER_STATE} in {experiment_uri} is unreadable ({broken}); written again from the spec",
                    flush=True,
                )
                fresh_tuner()
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
            tuner = fresh_tuner()
        # What Tune prints (its experiment box, where the results are) goes to the driver log.
        try:
            with interrupts.fitting(), tune_output():
                tuner.fit()
        finally:
            close_progress_lines()
        used_searcher = _searcher_of(tuner) if searcher is not None else None
        if used_searcher is not None:
            # optuna.db is written by a child process meanwhile, and logged once the runs are closed
            export = OptunaExport.start(plan, storage, experiment_path, used_searcher)
        # The public way to the Trial objects (status, config, last result) of the whole experiment.
        analysis = tune.ExperimentAnalysis(experiment_path, storage_filesystem=storage.filesystem)
        trials = list(analysis.trials)
        tracker.requeue(_tune_results(trials), restored=restored)
        # Tune returns normally after a Ctrl-C too, with unfinished trials: the study was cut short.
        finished = all(t.status in ("TERMINATED", "ERROR") for t in trials)
        parent_status = "FINISHED" if finished and interrupts.received() is None else "KILLED"
    except (KeyboardInterrupt, interrupts.StudyInterrupted):
        parent_status = "KILLED"
        raise
    finally:
        try:
            tracker.close(status=parent_status, trials=trials, summary=_summary(trials, total))
        finally:
            if export is not None:
                export.finish(tracker)
    return trials, restored
