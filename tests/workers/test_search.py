"""Search-space compilation, samplers, the PRUNED/FAIL completion hook and schedulers fed non-finite
metrics (no Ray cluster needed)."""

from __future__ import annotations

import math
from typing import Any, cast

import optuna
import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

from workers.plan import ParamDef, SamplerConfig, SchedulerConfig, StudyPlan
from workers.search import (
    DefineByRunSpace,
    FiniteASHAScheduler,
    FiniteMedianStoppingRule,
    PruningAwareOptunaSearch,
    classify_completion,
    create_sampler,
    create_scheduler,
    create_searcher,
    grid_param_space,
    optuna_study_name,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = (
    ParamDef("training.lr", "float", low=1e-4, high=1e-1, log=True),
    ParamDef("model.linear.type", "categorical", choices=("none", "prenorm_l2", "corrected")),
    ParamDef("model.linear.beta", "float", low=0.1, high=4.0, when=(("model.linear.type", "corrected"),)),
    ParamDef("training.freeze.t_freeze", "int", low=1, high=5),
    ParamDef(
        "training.freeze.eps_h",
        "float",
        low=0.0,
        high=math.log(2),
        when=(("model.linear.type", ["none", "prenorm_l2"]),),
    ),
)


def _plan(**kwargs: object) -> StudyPlan:
    defaults: dict[str, object] = {"name": "s", "base_config": {"training": {"epochs": 3}}, "space": SPACE}
    defaults.update(kwargs)
    return StudyPlan(**defaults)  # type: ignore[arg-type]


def _ot_study(searcher: PruningAwareOptunaSearch) -> optuna.Study:
    """The searcher's in-memory Optuna study (Ray annotates the attribute as ``None``)."""
    return cast(optuna.Study, searcher._ot_study)


def _sample(space: DefineByRunSpace, *, seed: int, n: int) -> list[dict[str, object]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(trial: optuna.Trial) -> float:
        space(trial)
        return 0.0

    study.optimize(objective, n_trials=n)
    return [t.params for t in study.trials]


def test_conditional_parameter_only_sampled_when_condition_holds() -> None:
    samples = _sample(DefineByRunSpace(SPACE), seed=0, n=40)
    kinds = {s["model.linear.type"] for s in samples}
    assert kinds == {"none", "prenorm_l2", "corrected"}  # every branch exercised
    for s in samples:
        assert ("model.linear.beta" in s) == (s["model.linear.type"] == "corrected")
        # list-valued condition = "any of"
        assert ("training.freeze.eps_h" in s) == (s["model.linear.type"] in ("none", "prenorm_l2"))
        assert 1e-4 <= s["training.lr"] <= 1e-1  # type: ignore[operator]
        assert isinstance(s["training.freeze.t_freeze"], int)


def test_log_scale_is_log_uniform() -> None:
    samples = _sample(DefineByRunSpace(SPACE[:1]), seed=1, n=200)
    below_1e_3 = sum(s["training.lr"] < 1e-3 for s in samples)  # type: ignore[operator]
    # log-uniform over 3 decades puts ~1/3 below 1e-3; uniform would put ~1 %.
    assert 40 < below_1e_3 < 100


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes"])
def test_searcher_is_reproducible_for_a_seed(sampler: str) -> None:
    def suggestions(seed: int) -> list[dict[str, object]]:
        plan = _plan(sampler=SamplerConfig(type=sampler, seed=seed, n_startup_trials=2))  # type: ignore[arg-type]
        searcher = create_searcher(plan, study_key="k" * 16)
        out: list[dict[str, object]] = []
        for i in range(6):
            config = searcher.suggest(f"t{i}")
            assert config is not None
            out.append(config)
            searcher.on_trial_complete(f"t{i}", {"status": "completed", "val_accuracy": 0.1 * i})
        return out

    first, again, other = suggestions(3), suggestions(3), suggestions(4)
    assert first == again
    assert first != other


def test_searcher_uses_plan_metric_mode_and_unique_study_name() -> None:
    plan = _plan(metric="val_loss", mode="min")
    searcher = create_searcher(plan, study_key="abcdef0123456789")
    assert searcher.metric == "val_loss"
    assert searcher.mode == "min"
    assert _ot_study(searcher).direction == optuna.study.StudyDirection.MINIMIZE
    assert _ot_study(searcher).study_name == optuna_study_name("s", "abcdef0123456789")
    assert optuna_study_name("s", "abcdef0123456789") != optuna_study_name("s", "0123456789abcdef")


def test_completion_hook_tells_optuna_pruned_complete_and_fail() -> None:
    """Pins the override of OptunaSearch's private completion bookkeeping."""
    searcher = create_searcher(_plan(), study_key="0" * 16)
    for trial_id in ("stopped", "finished", "errored", "diverged", "nan"):
        searcher.suggest(trial_id)
        searcher.on_trial_result(
            trial_id, {"val_accuracy": 0.5, "training_iteration": 1, "status": "running", "epoch": 1}
        )
    searcher.on_trial_complete("stopped", {"val_accuracy": 0.5, "status": "running", "training_iteration": 1})
    searcher.on_trial_complete(
        "finished", {"val_accuracy": 0.9, "status": "completed", "training_iteration": 3}
    )
    searcher.on_trial_complete("errored", None, error=True)
    searcher.on_trial_complete(
        "diverged", {"val_accuracy": 0.7, "status": "diverged", "training_iteration": 2}
    )
    searcher.on_trial_complete("nan", {"val_accuracy": float("nan"), "status": "completed"})
    # A second completion for the same trial is ignored, not told twice.
    searcher.on_trial_complete("finished", {"val_accuracy": 0.1, "status": "completed"})
    states = {t.number: (t.state, t.value) for t in _ot_study(searcher).trials}
    state = optuna.trial.TrialState
    assert states[0][0] == state.PRUNED
    assert states[1] == (state.COMPLETE, 0.9)
    assert states[2][0] == state.FAIL
    assert states[3][0] == state.FAIL  # diverged: its pre-divergence metric must not count
    assert states[4][0] == state.FAIL


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), float("-inf"), None, "missing"])
def test_non_finite_intermediate_values_do_not_reach_optuna(bad: object) -> None:
    searcher = create_searcher(_plan(), study_key="0" * 16)
    searcher.suggest("t")
    first: dict[str, object] = {"training_iteration": 1}
    if bad != "missing":
        first["val_accuracy"] = bad
    searcher.on_trial_result("t", first)
    searcher.on_trial_result("t", {"val_accuracy": 0.4, "training_iteration": 2})
    assert searcher._ot_trials["t"].storage.get_trial(
        searcher._ot_trials["t"]._trial_id
    ).intermediate_values == {2: 0.4}


def test_a_resumed_trial_reporting_steps_again_is_not_warned_about(recwarn: pytest.WarningsRecorder) -> None:
    """Issue #40: a trial resumed (after a killed driver, or from an older checkpoint when the
    newest was unreadable) reports again steps Optuna already holds, from a searcher restored by
    pickle as Tune does; they are not re-reported (Optuna would warn "The reported value is ignored
    because this step=... is already reported") and Optuna's first values stay."""
    import pickle

    searcher = create_searcher(_plan(), study_key="0" * 16)
    searcher.suggest("t")
    for step in (1, 2, 3, 4):
        searcher.on_trial_result("t", {"val_accuracy": 0.1 * step, "training_iteration": step})
    restored = pickle.loads(pickle.dumps(searcher))
    for step in (3, 4, 5):
        restored.on_trial_result("t", {"val_accuracy": 0.9, "training_iteration": step})
    ot_trial = restored._ot_trials["t"]
    values = ot_trial.storage.get_trial(ot_trial._trial_id).intermediate_values
    assert values == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.9})
    assert not [w for w in recwarn if "already reported" in str(w.message)]


def test_a_trial_diverged_in_its_first_epoch_is_told_fail() -> None:
    """What a diverged-in-epoch-1 trial sends: one result, metric NaN, status diverged."""
    searcher = create_searcher(_plan(), study_key="0" * 16)
    searcher.suggest("t")
    last = {"val_accuracy": float("nan"), "status": "diverged", "epoch": 0, "training_iteration": 1}
    searcher.on_trial_result("t", last)
    searcher.on_trial_complete("t", last)
    [trial] = _ot_study(searcher).trials
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.intermediate_values == {}


@pytest.mark.parametrize(
    ("result", "error", "expected"),
    [
        (None, True, ("fail", None)),
        (None, False, ("pruned", None)),
        ({"status": "running", "m": 1.0}, False, ("pruned", None)),
        ({"m": 1.0}, False, ("pruned", None)),
        ({"status": "completed", "m": 1.0}, False, ("complete", 1.0)),
        ({"status": "completed", "m": float("inf")}, False, ("fail", None)),
        ({"status": "diverged", "m": 0.7}, False, ("fail", None)),
        ({"status": "diverged", "m": float("nan")}, False, ("fail", None)),
        ({"status": "diverged"}, False, ("fail", None)),
        ({"status": "completed", "m": float("nan")}, False, ("fail", None)),
        ({"status": "completed"}, False, ("fail", None)),
        ({"status": "completed", "m": 1.0}, True, ("fail", None)),
    ],
)
def test_classify_completion(
    result: dict[str, object] | None, error: bool, expected: tuple[str, object]
) -> None:
    assert classify_completion(result, error=error, metric="m") == expected


@pytest.mark.parametrize(
    ("space", "match"),
    [
        ((), "at least one"),
        ((ParamDef("a", "int", low=1, high=2), ParamDef("a", "int", low=1, high=2)), "twice"),
        (
            (ParamDef("b", "float", low=0, high=1, when=(("a", 1),)), ParamDef("a", "int", low=1, high=2)),
            "before",
        ),
        ((ParamDef("a", "float", low=0.0, high=1.0, log=True),), "low > 0"),
        ((ParamDef("a", "float", low=2.0, high=1.0),), "low 2.0 > high"),
        ((ParamDef("a", "categorical"),), "choices"),
        ((ParamDef("a", "int"),), "low and high"),
        ((ParamDef("a", "bool"),), "valid: int, float, categorical"),  # type: ignore[arg-type]
    ],
)
def test_invalid_spaces_are_rejected(space: tuple[ParamDef, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DefineByRunSpace(space)


def test_define_by_run_space_pickles() -> None:
    import pickle

    space = pickle.loads(pickle.dumps(DefineByRunSpace(SPACE)))
    assert [p.name for p in space.space] == [p.name for p in SPACE]


def test_samplers_and_their_errors() -> None:
    assert isinstance(create_sampler(SamplerConfig(type="tpe")), optuna.samplers.TPESampler)
    assert isinstance(create_sampler(SamplerConfig(type="random")), optuna.samplers.RandomSampler)
    assert isinstance(create_sampler(SamplerConfig(type="cmaes")), optuna.samplers.CmaEsSampler)
    with pytest.raises(ValueError, match="valid: tpe, random, cmaes"):
        create_sampler(SamplerConfig(type="grid"))
    with pytest.raises(ValueError, match="valid: tpe, random, cmaes"):
        create_sampler(SamplerConfig(type="bayes"))  # type: ignore[arg-type]


def test_schedulers() -> None:
    fifo = create_scheduler(SchedulerConfig(type="fifo"), metric="m", mode="max", max_t=5)
    asha = create_scheduler(SchedulerConfig(type="asha", grace_period=2), metric="m", mode="max", max_t=9)
    median = create_scheduler(SchedulerConfig(type="median"), metric="m", mode="min", max_t=5)
    assert isinstance(fifo, FIFOScheduler)
    assert isinstance(asha, ASHAScheduler) and isinstance(asha, FiniteASHAScheduler)
    assert asha.metric == "m" and asha._time_attr == "training_iteration"
    assert isinstance(median, MedianStoppingRule) and isinstance(median, FiniteMedianStoppingRule)
    assert median._mode == "min"
    with pytest.raises(ValueError, match="valid: fifo, asha, median"):
        create_scheduler(SchedulerConfig(type="hyperband"), metric="m", mode="max", max_t=5)  # type: ignore[arg-type]


def test_grid_param_space() -> None:
    plan = _plan(space=(), grid=(("seed", (0, 1)), ("model.norm.type", ("layernorm", "dyt"))))
    space = grid_param_space(plan)
    assert space == {
        "seed": tune.grid_search([0, 1]),
        "model.norm.type": tune.grid_search(["layernorm", "dyt"]),
    }
    with pytest.raises(ValueError, match="empty"):
        grid_param_space(_plan(space=()))
    with pytest.raises(ValueError, match="no values"):
        grid_param_space(_plan(space=(), grid=(("seed", ()),)))


def test_pruning_aware_searcher_is_an_optuna_search() -> None:
    from ray.tune.search.optuna import OptunaSearch

    assert issubclass(PruningAwareOptunaSearch, OptunaSearch)
    # The override relies on these private attributes of Ray's OptunaSearch existing.
    searcher = create_searcher(_plan(), study_key="0" * 16)
    for name in ("_ot_trials", "_ot_study", "_completed_trials"):
        assert hasattr(searcher, name), name


class _Controller:
    """The one thing the median rule asks Tune's controller (when samples are too few)."""

    def get_live_trials(self) -> list[object]:
        return []


def _stub_trial(trial_id: str) -> object:
    from ray.tune.experiment import Trial

    return Trial("__fake", trial_id=trial_id, stub=True)


@pytest.mark.parametrize("kind", ["asha", "median"])
@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), None])
def test_a_trial_without_a_finite_metric_never_moves_another_trials_cutoff(
    kind: str, mode: str, bad: object
) -> None:
    """Decisions for the other trials equal those made when the bad trial never reported at all.

    Ray's own ASHA raises TypeError on ``None`` and, for an infinite value, interpolates a NaN rung
    cutoff that stops nothing; the median rule raises on ``None``.
    """
    sign = 1.0 if mode == "max" else -1.0
    good = [("a", 0.9), ("c", 0.8), ("d", 0.1), ("e", 0.85), ("f", 0.05)]

    def decisions(with_bad: bool) -> dict[str, list[str]]:
        config = SchedulerConfig(type=kind, grace_period=1, reduction_factor=2)  # type: ignore[arg-type]
        scheduler: Any = create_scheduler(config, metric="m", mode=mode, max_t=4)
        controller = _Controller()
        trials = {name: _stub_trial(name) for name in ["a", "b", "c", "d", "e", "f"]}
        for trial in trials.values():
            scheduler.on_trial_add(controller, trial)
        out: dict[str, list[str]] = {}

        def report(name: str, trial: object, result: dict[str, object]) -> None:
            if "STOP" not in out.get(name, []):  # Tune sends nothing more to a stopped trial
                out.setdefault(name, []).append(scheduler.on_trial_result(controller, trial, result))

        for it in (1, 2):
            if with_bad:
                report("b", trials["b"], {"training_iteration": it, "m": bad, "status": "running"})
            for name, value in good:
                report(name, trials[name], {"training_iteration": it, "m": sign * value * it})
        if with_bad:
            final = {"training_iteration": 3, "m": bad, "status": "diverged"}
            scheduler.on_trial_complete(controller, trials["b"], final)
        late = _stub_trial("g")
        scheduler.on_trial_add(controller, late)
        for it in (1, 2):
            report("g", late, {"training_iteration": it, "m": sign * 0.5})
        return out

    with_bad = decisions(True)
    without = decisions(False)
    assert {k: v for k, v in with_bad.items() if k != "b"} == without
    assert "STOP" in [a for v in without.values() for a in v]  # the comparison is not vacuous


class _Waiting:
    """Tune's controller as the schedulers see it: the trials in order, and its status sets."""

    class Trial:
        def __init__(self, status: str, name: str) -> None:
            self.status, self.name = status, name

    def __init__(self, statuses: list[str], *, sets: bool = True) -> None:
        self.trials = [self.Trial(s, f"t{i}") for i, s in enumerate(statuses)]
        if sets:
            self._pending_trials = {t for t in self.trials if t.status == "PENDING"}
            self._paused_trials = {t for t in self.trials if t.status == "PAUSED"}

    def get_trials(self) -> list[object]:
        return self.trials


@pytest.mark.parametrize(
    "statuses",
    [
        [],
        ["TERMINATED", "RUNNING"],
        ["TERMINATED", "PENDING"],
        ["PAUSED", "TERMINATED", "PENDING", "PENDING"],
        ["RUNNING", "PENDING", "PAUSED", "PENDING"],
        ["PAUSED", "RUNNING", "PAUSED"],
        ["ERROR", "PAUSED"],
    ],
)
def test_the_schedulers_choose_the_trial_rays_fifo_chooses_from_the_waiting_sets(statuses: list[str]) -> None:
    """Issue #40: the next trial comes from Tune's sets of waiting trials, not a pass over the
    study, and it is the one Ray's FIFOScheduler picks (the first PENDING, else the first PAUSED)."""
    want = FIFOScheduler().choose_trial_to_run(_Waiting(statuses))
    schedulers = [
        create_scheduler(SchedulerConfig(type=kind), metric="m", mode="max", max_t=4)  # type: ignore[arg-type]
        for kind in ("fifo", "asha", "median")
    ]
    for scheduler in schedulers:
        controller = _Waiting(statuses)
        got = scheduler.choose_trial_to_run(controller)
        assert (got and got.name) == (want and want.name), type(scheduler).__name__
        # Without the sets (another Tune), Ray's own pass: the same choice.
        assert (lambda t: t and t.name)(scheduler.choose_trial_to_run(_Waiting(statuses, sets=False))) == (
            want and want.name
        )


def test_the_schedulers_read_the_waiting_sets_past_tunes_wrapper_without_its_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tune hands schedulers its controller in a ``TrialRunnerWrapper``, which logs a WARNING at the
    first private attribute read through it (once per process: checked on the log-once key)."""
    from ray.tune.execution.tune_controller import TrialRunnerWrapper
    from ray.util import debug

    controller = _Waiting(["TERMINATED", "PAUSED", "PENDING"])
    wrapped = TrialRunnerWrapper(controller, trial_executor=None)  # type: ignore[arg-type]
    debug._logged.discard("restrict_accessing_tune_controller")
    for kind in ("fifo", "asha", "median"):
        scheduler = create_scheduler(SchedulerConfig(type=kind), metric="m", mode="max", max_t=4)  # type: ignore[arg-type]
        assert scheduler.choose_trial_to_run(wrapped).name == "t2"
    assert "restrict_accessing_tune_controller" not in debug._logged
    assert "restricted" not in caplog.text


def test_rays_fifo_choice_and_tunes_waiting_sets_are_what_the_schedulers_rely_on() -> None:
    import inspect

    from ray.tune.execution.tune_controller import TuneController

    source = inspect.getsource(FIFOScheduler.choose_trial_to_run)
    assert source.index("Trial.PENDING") < source.index("Trial.PAUSED"), source
    status_sets = inspect.getsource(TuneController._set_trial_status)
    assert "Trial.PENDING: self._pending_trials" in status_sets
    assert "Trial.PAUSED: self._paused_trials" in status_sets
