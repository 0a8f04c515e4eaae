"""A study of one or more plans under one MLflow run: what every study kind runs through.

A study kind (``studies.kinds``) turns a spec into phases, each one or more :class:`StudyPlan`. This
module runs them: one Ray session for the whole study, one MLflow *study run* (found again by a
stable key of the study directory, so a rerun re-opens it), each plan either as the study run itself
(``nested=False``: a one-plan search, whose trial runs are the study run's children) or as a *phase
run* nested under it (``nested=True``), the plan's Tune experiment in a subdirectory of the study
directory. Study outputs (spec, verdict, reports, plots, tags) go on the study run through
:class:`workers.tracking.StudyTracker`, with the same retry policy as every other MLflow write.

Nothing here knows what a phase means; it knows only where things go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from workers.console import format_wall
from workers.plan import StorageConfig, StudyPlan, TrackingConfig
from workers.records import StudyResult
from workers.runner import run_study
from workers.session import ray_session
from workers.storage import ResolvedStorage, resolve_storage
from workers.trainable import TrialFunction

__all__ = ["StudyRunner", "study_dir_uri"]

logger = logging.getLogger(__name__)


def _process_age_s() -> float:
    """Seconds since this process started: the `run` command's wall time so far (imports, the plan's
    own measurement and Ray's start included), what ``plan``'s ``wall_s`` predicts."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:
        return float("nan")


def study_dir_uri(storage: StorageConfig, name: str) -> str:
    """``<storage>/<name>`` as a user-facing location (absolute path or ``s3://...``)."""
    return resolve_storage(storage).experiment_uri(name)


class StudyRunner:
    """Context manager holding the Ray session and the study's MLflow run for every phase.

    Args:
        name: the study name (directory ``<storage>/<name>``, MLflow run name).
        storage / tracking: the study's storage and tracking sections (from any of its plans).
        expected_trials: every trial of every phase (the study run's ``expected_trials`` param).
        tags / params / artifacts: written on the study run when it is opened.
        trainable: trial function for every plan (tests inject one).
        progress: print progress lines.
        ray_address / ray_init_kwargs: see :func:`workers.session.ray_session`.
        resources: a trial's resources in every phase (``(("cpu", 1.0),)``); when this runner starts a
            local cluster, a request it could never satisfy is refused before starting it.
        planned: the study's estimate before launch (``wall_s``, ``trials``, ``cpu_hours``, ...):
            logged as ``planned_<key>`` params, and compared with the actual values at the end
            (``actual_<key>`` metrics; ``actual_command_wall_s``: since the process started, which is
            what ``plan``'s ``wall_s`` predicts for the ``run`` command), so estimates can be judged
            over time (``autonorm-study plan --history``).
    """

    def __init__(
        self,
        *,
        name: str,
        storage: StorageConfig,
        tracking: TrackingConfig,
        expected_trials: int,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        artifacts: Mapping[str, str] | None = None,
        trainable: TrialFunction | None = None,
        progress: bool = True,
        ray_address: str | None = None,
        ray_init_kwargs: Mapping[str, Any] | None = None,
        planned: Mapping[str, float] | None = None,
        resources: Sequence[tuple[str, float]] = (),
    ) -> None:
        from workers.preflight import _artifact_location, _tracking_uri
        from workers.tracking import RetryPolicy, StudyTracker, study_key

        self.name = name
        self.storage: ResolvedStorage = resolve_storage(storage)
        self._storage_config = storage
        self.study_uri = self.storage.experiment_uri(name)
        self.expected_trials = expected_trials
        probe = StudyPlan(name=name, base_config={}, storage=storage, tracking=tracking)
        self.tracking_uri = _tracking_uri(probe, self.storage)
        self.artifact_location = _artifact_location(probe, self.storage, self.tracking_uri)
        self.experiment = tracking.experiment
        self.tracker = StudyTracker(
            tracking_uri=self.tracking_uri,
            experiment_name=self.experiment,
            key=study_key(self.study_uri),
            artifact_location=self.artifact_location,
            retry=RetryPolicy(final_flush_s=tracking.final_flush_s),
            run_name=name,
        )
        self._tags = {**dict(tags or {}), "expected_trials": str(expected_trials)}
        self.planned = {k: float(v) for k, v in (planned or {}).items()}
        self._params = {
            **dict(params or {}),
            "expected_trials": str(expected_trials),
            **{f"planned_{k}": f"{v:.6g}" for k, v in self.planned.items()},
        }
        self._artifacts = dict(artifacts or {})
        self._trainable = trainable
        self._progress = progress
        self._ray_address = ray_address
        self._ray_init_kwargs = ray_init_kwargs
        self._resources = tuple(resources)
        self._session: Any = None
        self._console: Any = None
        self.results: list[tuple[str, StudyPlan, StudyResult]] = []
        self.started = time.monotonic()
        self._stopped: float | None = None  # this session's wall time, once the clock stopped (:meth:`cost`)
        self._sessions: Any = None  # the study's sessions (workers.cost.Sessions), from __enter__
        self._registered: contextlib.ExitStack | None = None

    # ------------------------------------------------------------------------------ lifecycle

    @property
    def run_id(self) -> str | None:
        return self.tracker.run_id

    def __enter__(self) -> StudyRunner:
        from workers.preflight import precheck_local_resources

        if self._resources:  # a trial the local cluster could never run: refused before it is started
            probe = StudyPlan(
                name=self.name, base_config={}, storage=self._storage_config, resources=self._resources
            )
            precheck_local_resources([probe], self._ray_address, self._ray_init_kwargs)
        self._open_console()
        try:
            self._open_or_refuse()
            self._session = ray_session(
                self._ray_address, self._ray_init_kwargs, env_vars={"MLFLOW_TRACKING_URI": self.tracking_uri}
            )
            self._session.__enter__()
        except BaseException:
            self._close_console()
            raise
        from workers.cost import Sessions, registered

        # The earlier sessions of a resumed study (their wall time is the study's too), and this one.
        self._sessions = Sessions(self.storage.filesystem, self.storage.experiment_path(self.name))
        self._save_session("running")
        self._registered = contextlib.ExitStack()
        self._registered.enter_context(registered(self.cost))  # the report writers' numbers
        return self

    def _open_console(self) -> None:
        """What Ray, Tune, MLflow and Optuna print goes to the study's ``driver.log`` from here on
        (:mod:`workers.console`); the terminal keeps the study's own lines."""
        from workers.console import DRIVER_LOG, StudyConsole

        # (the study's first line names the log: studies.running)
        self._console = StudyConsole(self.local_dir() / DRIVER_LOG, name=self.name, announce=False)
        self._console.__enter__()

    def _close_console(self) -> None:
        console, self._console = self._console, None
        if console is None:
            return
        console.__exit__(None, None, None)
        if not self.storage.is_local:  # the log was written in a scratch directory
            try:
                self.publish([console.log_path])
            except Exception as exc:
                logger.warning("could not copy the driver log to %s: %s", self.study_uri, exc)

    def _open_or_refuse(self) -> None:
        """Open the study run before anything starts; refuse the study when MLflow does not answer.

        A study started while its tracking server is away would train for hours and hand every
        result to an in-memory queue that a driver restart loses (docs/reliability.md: why refusing
        beats queueing here). An outage *during* the study is ridden out (the phases' callbacks
        queue and catch up, then the final flush).
        """
        from workers.errors import StudyError
        from workers.tracking import http_limits, redact_uri

        try:
            with http_limits(10, 1, override=False):  # a few quick tries, not MLflow's minutes of retries
                self.tracker.open(tags=self._tags, params=self._params, artifacts=self._artifacts)
        except Exception as exc:
            raise StudyError(
                f"MLflow at {redact_uri(self.tracking_uri)} does not answer ({type(exc).__name__}); nothing "
                "was started or trained. Start the tracking server (or fix tracking.uri / MLFLOW_TRACKING_URI) "
                "and run the same command again."
            ) from None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from workers.interrupts import StudyInterrupted

        if self._registered is not None:
            self._registered.close()
            self._registered = None
        stopped = exc_type is not None and issubclass(exc_type, KeyboardInterrupt | StudyInterrupted)
        status = "FINISHED" if exc_type is None else "KILLED" if stopped else "FAILED"
        self._save_session("finished" if exc_type is None else "interrupted" if stopped else "failed")
        if exc_type is None:
            self._log_actual()
        try:
            if self.tracker.run_id is None and exc_type is None:
                self.tracker.open(tags=self._tags, params=self._params, artifacts=self._artifacts)
            self.tracker.close(status)
        except Exception as close_exc:
            logger.error("could not close the study's MLflow run: %s", close_exc)
        finally:
            session, self._session = self._session, None
            try:
                if session is not None:
                    session.__exit__(exc_type, exc, tb)
            finally:
                self._close_console()

    def set_expected_trials(self, total: int) -> None:
        """The study's trial count changed (a range extension, a sequential look, ``extend``).

        MLflow params are immutable, so the ``expected_trials`` param keeps the count the study
        started with; the current count is the study run's ``expected_trials`` tag (and metric, one
        step per change), which a finished study leaves equal to its trial runs."""
        self.expected_trials = int(total)
        self._tags["expected_trials"] = str(self.expected_trials)
        self.log_outputs(
            tags={"expected_trials": str(self.expected_trials)},
            metrics={"expected_trials": float(self.expected_trials)},
        )

    @property
    def trials_run(self) -> int:
        """Every trial of every phase this runner ran or restored (a stacked group's members each
        count): what ``status`` counts in the study directory once the study has finished."""
        return sum(len(result.trials) for _, _, result in self.results)

    def cost(self) -> dict[str, float]:
        """The study's one trial count and one wall time (with its CPU and GPU hours):
        ``{"trials", "wall_time_s", "cpu_hours", "gpu_hours"}``, the source of every output that
        shows them (the closing lines, ``verdict.json``'s ``resources``, the report, the study run's
        ``actual_trials`` / ``actual_wall_s`` that ``ls`` reads). Its first call stops the study's
        clock (:attr:`wall_time_s`): a kind calls it once its last phase has run, for the verdict."""
        cpu_h, gpu_h = self.resource_hours()
        return {
            "trials": self.trials_run,
            "wall_time_s": self.wall_time_s,
            "cpu_hours": cpu_h,
            "gpu_hours": gpu_h,
        }

    def actual(self) -> dict[str, float]:
        """What the study cost (:meth:`cost`), in the keys of ``planned``; ``command_wall_s``: the
        command's own wall time since its process started (what ``plan``'s ``wall_s`` predicts)."""
        cost = self.cost()
        return {
            "wall_s": cost["wall_time_s"],
            "command_wall_s": _process_age_s(),
            "trials": float(cost["trials"]),
            "cpu_hours": cost["cpu_hours"],
            "gpu_hours": cost["gpu_hours"],
        }

    def _log_actual(self) -> None:
        actual = self.actual()
        print(f"[{self.name}] {self.closing_line(actual)}", flush=True)
        self.log_outputs(metrics={f"actual_{k}": v for k, v in actual.items()})

    def closing_line(self, actual: Mapping[str, float] | None = None) -> str:
        """``trials run: 60 (60 planned), wall time: 0.6 min (0.4 planned), CPU hours: 0.0061 (0.0018
        planned)``: the study's cost (:meth:`cost`, named as the report and ``status`` name it)
        beside the estimate made before launch."""
        actual = self.actual() if actual is None else actual
        planned = self.planned

        def was(key: str, text: str) -> str:
            return f" ({text} planned)" if key in planned else ""

        return ", ".join(
            [
                f"trials run: {int(actual['trials'])}" + was("trials", f"{planned.get('trials', 0):.0f}"),
                f"wall time: {format_wall(actual['wall_s'])}"
                + was("wall_s", format_wall(planned.get("wall_s")).removesuffix(" min")),
                f"CPU hours: {actual['cpu_hours']:.2g}"
                + was("cpu_hours", f"{planned.get('cpu_hours', 0):.2g}"),
            ]
        )

    # -------------------------------------------------------------------------------- phases

    def phase_plan(self, plan: StudyPlan) -> StudyPlan:
        """``plan`` placed inside the study: its Tune experiment in ``<study dir>/<plan.name>`` and
        its MLflow runs in the study's tracking store."""
        storage = dataclasses.replace(self._storage_config, path=self.study_uri)
        tracking = dataclasses.replace(
            plan.tracking,
            uri=self.tracking_uri,
            experiment=self.experiment,
            artifact_location=self.artifact_location,
        )
        return dataclasses.replace(plan, storage=storage, tracking=tracking)

    def run(self, plan: StudyPlan, *, phase: str | None = None, nested: bool = True) -> StudyResult:
        """Run (or resume) one plan of the study.

        Args:
            plan: the plan; with ``nested`` its storage/tracking are replaced (:meth:`phase_plan`).
            phase: the phase name (``autonorm.phase`` tag on the plan's run and its trial runs);
                default the plan's name, which is also the phase's folder and run name: one name
                per phase everywhere.
            nested: the plan is a phase (its run nested under the study run). ``False``: the plan
                *is* the study (its experiment directory is the study directory, its run the study
                run); only for a study whose only plan is this one.
        """
        from workers.interrupts import raise_if_interrupted

        raise_if_interrupted()  # a signal between phases: no new phase
        from workers.tracking import TAG_PHASE, TAG_STUDY_KEY, TAG_STUDY_NAME

        phase = plan.name if phase is None else phase
        tags = dict(plan.tags)
        tags[TAG_PHASE] = phase
        # One study, one key and name on every run: the phase run and its trial runs carry the study
        # run's (the phase run is found again by its own ``autonorm.run_key``).
        tags[TAG_STUDY_KEY] = self.tracker.key
        tags.setdefault(TAG_STUDY_NAME, self.name)
        if nested:
            plan = self.phase_plan(plan)
        else:
            tracking = dataclasses.replace(
                plan.tracking,
                uri=self.tracking_uri,
                experiment=self.experiment,
                artifact_location=self.artifact_location,
            )
            plan = dataclasses.replace(plan, tracking=tracking)
        plan = dataclasses.replace(plan, tags=tuple(tags.items()))
        result = run_study(
            plan,
            trainable=self._trainable,
            progress=self._progress,
            nest_under=self.run_id if nested else None,
        )
        if not nested and result.parent_run_id:
            self.tracker.run_id = result.parent_run_id
        self.results.append((phase, plan, result))
        self._save_session("running")  # a killed driver's session counts up to its last phase
        return result

    def log_summaries(self, phase: str, summaries: Iterable[Any]) -> list[str]:
        """One summary run per arm under the run of ``phase`` (which this runner ran): each item has
        ``arm`` and ``metrics`` (``key -> [(step, value), ...]``), e.g.
        :func:`studies.summaries.arm_summaries`. The runs carry the phase run's study-wide tags, its
        phase and budget. An MLflow failure is logged (the study's files do not depend on them).
        Returns the summary runs' ids."""
        from workers.tracking import STUDY_WIDE_TAGS, TAG_PHASE

        ran = [(plan, result) for name, plan, result in self.results if name == phase]
        if not ran or not ran[-1][1].parent_run_id:
            logger.error("no MLflow run of phase %r to put its summary runs under", phase)
            return []
        plan, result = ran[-1]
        assert result.parent_run_id is not None
        keep = (*STUDY_WIDE_TAGS, TAG_PHASE, "autonorm.budget")
        tags = {k: v for k, v in plan.tags if k in keep}
        ids = []
        try:
            for summary in summaries:
                ids.append(
                    self.tracker.log_summary(
                        result.parent_run_id, arm=str(summary.arm), metrics=summary.metrics, tags=tags
                    )
                )
        except Exception as exc:
            logger.error("could not log the summary runs of %s to MLflow: %s", phase, exc)
        return ids

    def log_outputs(
        self,
        *,
        files: Iterable[Path] = (),
        tags: Mapping[str, str] | None = None,
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        artifact_path: str | None = None,
    ) -> None:
        """Study outputs on the study run; an MLflow failure is logged, the files stay on disk."""
        try:
            if self.tracker.run_id is None:
                self.tracker.open(tags=self._tags, params=self._params, artifacts=self._artifacts)
            self.tracker.log_outputs(
                files=files, tags=tags, metrics=metrics, params=params, artifact_path=artifact_path
            )
        except Exception as exc:
            logger.error(
                "could not log the study outputs to MLflow (%s); they are in %s", exc, self.study_uri
            )

    # ------------------------------------------------------------------------------- outputs

    def local_dir(self) -> Path:
        """Where to write output files: the study directory, or a scratch directory for S3 storage
        (then :meth:`publish` copies them into the study directory)."""
        if self.storage.is_local:
            path = Path(self.storage.experiment_path(self.name))
        else:
            import tempfile

            path = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        path.mkdir(parents=True, exist_ok=True)
        return path

    def publish(self, files: Iterable[Path]) -> None:
        """Copy output files into the study directory when it is remote (no-op for local storage)."""
        if self.storage.is_local:
            return
        fs = self.storage.filesystem
        target = self.storage.experiment_path(self.name)
        assert fs is not None
        fs.create_dir(target, recursive=True)
        for path in files:
            with fs.open_output_stream(f"{target}/{path.name}") as out:
                out.write(path.read_bytes())

    def resource_hours(self) -> tuple[float, float]:
        """CPU and GPU hours spent by every trial so far (trial time × per-trial resources)."""
        cpu_h = gpu_h = 0.0
        for _, plan, result in self.results:
            res = dict(plan.resources)
            seconds = sum(float(t.metrics.get("time_total_s") or 0.0) for t in result.trials)
            cpu_h += seconds * res.get("cpu", 0.0) / 3600.0
            gpu_h += seconds * res.get("gpu", 0.0) / 3600.0
        return cpu_h, gpu_h

    @property
    def wall_time_s(self) -> float:
        """The study's wall time: the earlier sessions' of a resumed study (:class:`workers.cost.Sessions`)
        plus this one's, from this runner's start until the clock stops, at the first read (of this
        or :meth:`cost`), which every kind makes once its last phase has run, to put the cost in its
        verdict. Every later reader (the closing lines, the ``actual_wall_s`` metric) gets that same
        number."""
        if self._stopped is None:
            self._stopped = time.monotonic() - self.started
        earlier = self._sessions.earlier_wall_s if self._sessions is not None else 0.0
        return float(earlier + self._stopped)

    def _save_session(self, ended: str) -> None:
        """This session in the study directory's sessions file: its wall time so far (the stopped
        clock's, once stopped) and how it ended."""
        if self._sessions is not None:
            session = self._stopped if self._stopped is not None else time.monotonic() - self.started
            self._sessions.save(session, ended)
