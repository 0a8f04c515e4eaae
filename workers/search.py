"""Search: a plan's space compiled to an Optuna define-by-run function, samplers, schedulers.

Four Ray/Optuna behaviours shape this module (see docs/architecture.md):

* ``OptunaSearch`` with a define-by-run space ignores ``TuneConfig(metric, mode)``, so metric and
  mode go on the searcher (and on the scheduler), never on ``TuneConfig``.
* A trial stopped by ASHA/median reaches ``OptunaSearch.on_trial_complete`` exactly like a finished
  one, and Ray tells Optuna COMPLETE with a truncated metric. :class:`PruningAwareOptunaSearch`
  reads the trial's own ``status`` from its last result instead: only a trial whose last report says
  ``completed`` (or ``diverged``) finished; anything else was stopped early and is told as PRUNED.
* ``OptunaSearch``'s default ``study_name="optuna"`` with ``load_if_exists`` merges studies that
  share a storage; every study gets its own name here. The Optuna study lives in memory and is
  pickled with Tune's searcher state, so ``Tuner.restore`` brings back exactly the trials Tune's
  snapshot knows (an external database would run ahead of that snapshot after a crash).
* A diverged trial reports its search metric as NaN (Tune ends the study at a result without it).
  Optuna rejects NaN as an intermediate value, so :class:`PruningAwareOptunaSearch` never forwards a
  non-finite one and tells the trial FAIL. Ray's ASHA and median rule survive NaN (ASHA takes
  ``nanpercentile`` over a rung, the median rule drops non-finite running means) but raise
  ``TypeError`` on ``None``, and an infinite value makes ASHA's rung cutoff NaN (``-inf`` + ``inf``
  in the percentile interpolation), so that rung stops nothing. :class:`FiniteASHAScheduler` and
  :class:`FiniteMedianStoppingRule` hand them NaN for every non-finite or missing value: a trial
  without a finite metric never moves another trial's cutoff.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler
from ray.tune.search.optuna import OptunaSearch

from workers import ray_internals
from workers.members import MEMBERS_KEY, bundle_points, grid_points
from workers.plan import ParamDef, SamplerConfig, SchedulerConfig, StudyPlan
from workers.records import FINAL_STATUSES

if TYPE_CHECKING:
    import optuna

__all__ = [
    "SAMPLERS",
    "SCHEDULERS",
    "DefineByRunSpace",
    "FiniteASHAScheduler",
    "FiniteMedianStoppingRule",
    "PruningAwareOptunaSearch",
    "WaitingFIFOScheduler",
    "create_sampler",
    "create_scheduler",
    "create_searcher",
    "grid_param_space",
    "optuna_study_name",
]

logger = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "cmaes", "grid")
SCHEDULERS = ("fifo", "asha", "median")


def _condition_holds(when: Sequence[tuple[str, Any]], values: Mapping[str, Any]) -> bool:
    """True when every ``path -> expected`` holds among the values sampled so far.

    ``expected`` may be a list/tuple meaning "any of these"; Optuna's categorical choices are
    scalars, so a sequence can never be a literal expected value.
    """
    for path, expected in when:
        if path not in values:
            return False
        actual = values[path]
        if isinstance(expected, list | tuple):
            if actual not in expected:
                return False
        elif actual != expected:
            return False
    return True


class DefineByRunSpace:
    """A plan's search space as an Optuna define-by-run function.

    A picklable object rather than a closure, because Tune pickles the searcher (and this function
    with it) into its experiment state for ``Tuner.restore``. Parameters are suggested in the order
    given; a parameter with ``when`` is only suggested when its condition holds for the parameters
    suggested before it, so an inactive parameter never reaches the sampler or the trial config.

    Args:
        space: the plan's parameters.

    Raises:
        ValueError: for an empty space, duplicate names, a bad range or a condition that names a
            parameter that is not defined earlier.
    """

    def __init__(self, space: Sequence[ParamDef]) -> None:
        if not space:
            raise ValueError("an Optuna sampler needs at least one search parameter (plan.space is empty)")
        seen: set[str] = set()
        for param in space:
            if param.name in seen:
                raise ValueError(f"search parameter {param.name!r} is defined twice")
            _validate_param(param)
            for path, _ in param.when:
                if path not in seen:
                    raise ValueError(
                        f"search parameter {param.name!r}: condition on {path!r}, which is not a parameter "
                        f"defined before it (defined so far: {sorted(seen)})"
                    )
            seen.add(param.name)
        self.space: tuple[ParamDef, ...] = tuple(space)

    def __call__(self, trial: optuna.Trial) -> None:
        values: dict[str, Any] = {}
        for param in self.space:
            if _condition_holds(param.when, values):
                values[param.name] = _suggest(trial, param)
        # Returning None: OptunaSearch uses exactly the suggested values as the trial config.

    def __repr__(self) -> str:
        return f"DefineByRunSpace({[p.name for p in self.space]})"


def _validate_param(param: ParamDef) -> None:
    if param.type in ("int", "float"):
        if param.low is None or param.high is None:
            raise ValueError(f"search parameter {param.name!r} ({param.type}) needs low and high")
        if param.low > param.high:
            raise ValueError(f"search parameter {param.name!r}: low {param.low} > high {param.high}")
        if param.log and param.low <= 0:
            raise ValueError(f"search parameter {param.name!r}: log scale needs low > 0, got {param.low}")
        if param.log and param.step is not None:
            raise ValueError(f"search parameter {param.name!r}: step and log cannot be combined")
    elif param.type == "categorical":
        if not param.choices:
            raise ValueError(f"search parameter {param.name!r} (categorical) needs choices")
    else:
        raise ValueError(
            f"search parameter {param.name!r}: unknown type {param.type!r}; valid: int, float, categorical"
        )


def _suggest(trial: optuna.Trial, param: ParamDef) -> Any:
    if param.type == "int":
        assert param.low is not None and param.high is not None  # checked in _validate_param
        step = int(param.step) if param.step is not None else 1
        return trial.suggest_int(param.name, int(param.low), int(param.high), step=step, log=param.log)
    if param.type == "float":
        assert param.low is not None and param.high is not None
        return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)
    assert param.choices is not None
    return trial.suggest_categorical(param.name, list(param.choices))


def create_sampler(config: SamplerConfig) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler for ``tpe | random | cmaes``.

    Raises:
        ValueError: for ``grid`` (a Tune grid, not an Optuna sampler) or an unknown name.
    """
    import optuna

    if config.type == "tpe":
        return optuna.samplers.TPESampler(seed=config.seed, n_startup_trials=config.n_startup_trials)
    if config.type == "random":
        return optuna.samplers.RandomSampler(seed=config.seed)
    if config.type == "cmaes":
        try:
            import cmaes  # noqa: F401 - Optuna imports it lazily, at the first sample, deep in Tune
        except ImportError as exc:
            raise ImportError("sampler 'cmaes' needs the 'cmaes' package: pip install cmaes") from exc
        # Categorical / conditional dimensions fall back to the independent sampler; seed it too so
        # the whole study is reproducible.
        return optuna.samplers.CmaEsSampler(
            seed=config.seed,
            n_startup_trials=config.n_startup_trials,
            independent_sampler=optuna.samplers.RandomSampler(seed=config.seed + 1),
            warn_independent_sampling=False,
        )
    valid = ", ".join(s for s in SAMPLERS if s != "grid")
    raise ValueError(
        f"sampler {config.type!r} is not an Optuna sampler; valid: {valid} (grid runs as a Tune grid)"
    )


def optuna_study_name(plan_name: str, study_key: str) -> str:
    """A name unique to one study: two studies never share an Optuna study, even in shared storage."""
    return f"autonorm-{plan_name}-{study_key[:12]}"


class PruningAwareOptunaSearch(OptunaSearch):  # type: ignore[misc]
    """``OptunaSearch`` that tells Optuna PRUNED for trials a scheduler stopped early.

    When each method is called (by Tune's ``SearchGenerator`` in the driver):

    * ``on_trial_result``: after every reported epoch; forwarded to Optuna as an intermediate value
      (non-finite values are skipped: Optuna rejects them and a diverged trial would otherwise
      raise inside Tune's loop).
    * ``on_trial_complete``: once per trial, when it ends for any reason: it finished, a scheduler
      stopped it, it errored, or it was removed while pending. The base class cannot tell the first
      two apart. We read the ``status`` the trial itself put in its last result.

    This overrides Ray's completion hook and therefore touches ``OptunaSearch``'s private
    ``_ot_trials`` / ``_ot_study`` / ``_completed_trials``, read through :mod:`workers.ray_internals`
    (:func:`~workers.ray_internals.optuna_trials`, :func:`~workers.ray_internals.optuna_study`,
    :func:`~workers.ray_internals.optuna_completed`); ``tests/workers/test_search.py`` pins them.
    """

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        value = result.get(self.metric) if isinstance(self.metric, str) else None
        if not _is_finite_number(value) or trial_id in ray_internals.optuna_completed(self):
            return  # (Optuna refuses a value for a finished trial, and it no longer has a handle)
        if _already_reported(
            ray_internals.optuna_trials(self).get(trial_id), result.get("training_iteration")
        ):
            # A resumed trial reports again the steps after the checkpoint it resumed from (after a
            # killed driver, or from an older checkpoint when the newest was unreadable) and Optuna
            # already holds them: its first value stays, and nothing is said (Optuna would warn
            # "The reported value is ignored because this step=... is already reported").
            return
        super().on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        import optuna

        completed = ray_internals.optuna_completed(self)
        if trial_id in completed:
            return
        open_trials = ray_internals.optuna_trials(self)
        ot_trial = open_trials.get(trial_id)
        if ot_trial is None:
            logger.warning("Optuna knows no trial for Tune trial %s; not told", trial_id)
            completed.add(trial_id)
            return
        state, value = classify_completion(result, error=error, metric=self.metric)
        tell_state = {
            "complete": optuna.trial.TrialState.COMPLETE,
            "pruned": optuna.trial.TrialState.PRUNED,
            "fail": optuna.trial.TrialState.FAIL,
        }[state]
        study: Any = ray_internals.optuna_study(self)
        try:
            study.tell(ot_trial, value if state == "complete" else None, state=tell_state)
        except Exception as exc:
            logger.warning("could not tell Optuna about trial %s: %s", trial_id, exc)
        completed.add(trial_id)
        # The study holds the finished trial; the handle would only grow the saved state.
        open_trials.pop(trial_id, None)

    # Saved with Tune's snapshot, finished trials written once (workers/optuna_state.py).

    def save(self, checkpoint_path: str) -> None:
        from workers.optuna_state import dump_searcher

        archived: set[int] = self.__dict__.setdefault("_archived", set())
        if not dump_searcher(
            self.__dict__.copy(), ray_internals.optuna_study(self), archived, checkpoint_path
        ):
            super().save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        from workers.optuna_state import load_searcher

        state = load_searcher(checkpoint_path)
        if not isinstance(state, dict):  # Ray's older tuple form
            super().restore(checkpoint_path)
            return
        self.__dict__.update(state)


def _already_reported(ot_trial: Any, step: Any) -> bool:
    """Whether Optuna already holds an intermediate value of ``ot_trial`` at ``step`` (what
    ``optuna.Trial.report`` checks before it warns and ignores the value), read from the study's
    storage: the trial's own cached copy is the one pickled with the searcher."""
    if ot_trial is None or not isinstance(step, int) or isinstance(step, bool):
        return False
    try:
        frozen = ot_trial.storage.get_trial(ot_trial._trial_id)
    except Exception:
        return False
    return step in frozen.intermediate_values


def _is_finite_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def classify_completion(
    result: Mapping[str, Any] | None, *, error: bool, metric: str
) -> tuple[str, float | None]:
    """How a finished Tune trial is told to Optuna: ``(complete|pruned|fail, value)``.

    * errored -> ``fail``;
    * no result (removed while pending) -> ``pruned``, as Ray does;
    * last result's ``status`` not final (``running``): a scheduler stopped it -> ``pruned``;
    * ``diverged`` -> ``fail``: its metric is from the last epoch before the loss blew up, and a
      diverged configuration must not look good to the sampler;
    * ``completed`` with a finite metric -> ``complete``; non-finite -> ``fail`` (Optuna cannot rank
      a NaN).
    """
    if error:
        return "fail", None
    if not result:
        return "pruned", None
    status = result.get("status")
    if status not in FINAL_STATUSES:
        return "pruned", None
    if status in ("diverged", "error"):
        return "fail", None
    value = result.get(metric)
    if _is_finite_number(value):
        return "complete", float(value)
    return "fail", None


def create_searcher(plan: StudyPlan, *, study_key: str) -> PruningAwareOptunaSearch:
    """The Optuna searcher for a plan whose sampler is ``tpe | random | cmaes``.

    ``max_concurrent_trials`` (set by the runner on ``TuneConfig``) wraps this in a
    ``ConcurrencyLimiter``; without it Tune keeps only one trial pending at a time.
    """
    return PruningAwareOptunaSearch(
        space=DefineByRunSpace(plan.space),
        metric=plan.metric,
        mode=plan.mode,
        sampler=create_sampler(plan.sampler),
        study_name=optuna_study_name(plan.name, study_key),
    )


def grid_param_space(plan: StudyPlan, *, stack: int = 1) -> dict[str, Any]:
    """Tune ``param_space`` for the ``grid`` sampler: every combination of ``plan.grid``.

    Keys stay dotted paths, like Optuna's parameter names, so the trainable applies both the same way.
    With ``stack`` above 1 the combinations are cut into stacks of at most ``stack`` members of one
    cell, and the stacks dealt into groups, one Tune trial per group (about one per trial slot:
    :func:`workers.members.bundle_points`), on one axis (:data:`workers.members.MEMBERS_KEY`).

    Raises:
        ValueError: for an empty grid or an axis without values.
    """
    if not plan.grid:
        raise ValueError("the grid sampler needs plan.grid (dotted path -> values); it is empty")
    space: dict[str, Any] = {}
    for name, values in plan.grid:
        if not values:
            raise ValueError(f"grid axis {name!r} has no values")
        if name in space:
            raise ValueError(f"grid axis {name!r} is defined twice")
        space[name] = tune.grid_search(list(values))
    if stack > 1:
        groups = bundle_points(plan.base_config, grid_points(plan.grid), stack, plan.max_concurrent)
        return {MEMBERS_KEY: tune.grid_search(groups)}
    return space


def _finite_metric(result: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """``result`` with a non-finite or ``None`` ``metric`` replaced by NaN (a copy only when changed).

    A result without the metric is returned unchanged: Ray's schedulers ignore such results.
    """
    if metric is None or metric not in result or _is_finite_number(result[metric]):
        return result
    return {**result, metric: math.nan}


class _WaitingTrialsFirst:
    """``choose_trial_to_run`` as Ray's ``FIFOScheduler`` has it (the first PENDING trial in the
    study's order, else the first PAUSED one), read from Tune's own sets of PENDING and PAUSED
    trials instead of a pass over every trial of the study: Tune asks at each step of its loop with
    a free slot, and at 1,000 trials that pass was 5 ms of driver CPU per trial, growing with the
    study (py-spy, ``bench/study_scale.py``, issue #40). With several trials waiting, the study's
    order decides, as before. A controller without those sets gets Ray's own pass. Tune hands
    schedulers its controller inside a ``TrialRunnerWrapper`` that warns at the first private
    attribute read through it; the sets are read from the controller it wraps (private Ray API,
    read through :mod:`workers.ray_internals`, pinned by ``tests/workers/test_search.py``)."""

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        from ray.tune.experiment import Trial

        controller = ray_internals.unwrapped_controller(tune_controller)
        for waiting, status in (
            (ray_internals.pending_trials(controller), Trial.PENDING),
            (ray_internals.paused_trials(controller), Trial.PAUSED),
        ):
            if not isinstance(waiting, set) or any(t.status != status for t in waiting):
                return super().choose_trial_to_run(tune_controller)  # type: ignore[misc]
            if len(waiting) == 1:
                return next(iter(waiting))
            if waiting:
                return next(t for t in controller.get_trials() if t in waiting)
        return None


class WaitingFIFOScheduler(_WaitingTrialsFirst, FIFOScheduler):  # type: ignore[misc]
    """Ray's ``FIFOScheduler``, its next trial found in Tune's sets of waiting trials."""


class FiniteASHAScheduler(_WaitingTrialsFirst, ASHAScheduler):  # type: ignore[misc]
    """Ray's ASHA, fed NaN for every non-finite search metric (see the module docstring).

    NaN is recorded at the rung (so the trial is not re-judged there) and ignored by the rung's
    ``nanpercentile`` cutoff; ``None`` would raise ``TypeError`` and ``inf`` would make the cutoff NaN.
    """

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        return str(super().on_trial_result(tune_controller, trial, _finite_metric(result, self._metric)))

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        super().on_trial_complete(tune_controller, trial, _finite_metric(result, self._metric))


class FiniteMedianStoppingRule(_WaitingTrialsFirst, MedianStoppingRule):  # type: ignore[misc]
    """Ray's median stopping rule, fed NaN for every non-finite search metric.

    A trial with a NaN epoch has a NaN running mean, which the rule leaves out of the median; ``None``
    would raise ``TypeError`` when the rule compares values.
    """

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        return str(super().on_trial_result(tune_controller, trial, _finite_metric(result, self._metric)))

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        super().on_trial_complete(tune_controller, trial, _finite_metric(result, self._metric))


def create_scheduler(config: SchedulerConfig, *, metric: str, mode: str, max_t: int) -> TrialScheduler:
    """The trial scheduler; ``max_t`` is the number of epochs (one report per epoch).

    Raises:
        ValueError: for an unknown scheduler name.
    """
    if config.type == "fifo":
        return WaitingFIFOScheduler()
    if config.type == "asha":
        return FiniteASHAScheduler(
            time_attr="training_iteration",
            metric=metric,
            mode=mode,
            max_t=max(max_t, config.grace_period),
            grace_period=config.grace_period,
            reduction_factor=config.reduction_factor,
        )
    if config.type == "median":
        return FiniteMedianStoppingRule(
            time_attr="training_iteration",
            metric=metric,
            mode=mode,
            grace_period=config.grace_period,
        )
    raise ValueError(f"unknown scheduler {config.type!r}; valid: {', '.join(SCHEDULERS)}")
