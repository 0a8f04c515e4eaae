"""The progress line of a study phase: counted in trials (a stacked group's members each count), its
best trial so far, the ETA, and how often it is printed off a terminal (an injected clock, no Ray)."""

from __future__ import annotations

import io
import pickle
from types import SimpleNamespace
from typing import Any

from workers.members import MEMBERS_KEY
from workers.progress import ProgressCallback, format_eta
from workers.tracking import TrialNamer


def _trial(trial_id: str, tune_status: str, **result: Any) -> Any:
    """A Tune trial in state ``tune_status``; ``result`` is its last result (its own ``status`` too)."""
    return SimpleNamespace(
        trial_id=trial_id, status=tune_status, config={"seed": 0}, last_result=dict(result)
    )


def _group(trial_id: str, status: str, members: list[dict[str, Any]], **result: Any) -> Any:
    """A stacked group: one Tune trial whose members report ``<key>@m<k>``."""
    return SimpleNamespace(
        trial_id=trial_id, status=status, config={MEMBERS_KEY: [members]}, last_result=result
    )


class _Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _callback(clock: _Clock, *, tty: bool = False, **kwargs: Any) -> tuple[ProgressCallback, io.StringIO]:
    out = io.StringIO()
    options: dict[str, Any] = {
        "name": "confirm-epochs",
        "total": 4,
        "stream": out,
        "clock": clock,
        "tty": tty,
    }
    options.update(kwargs)
    return ProgressCallback(**options), out


def test_format_eta() -> None:
    assert [format_eta(s) for s in (None, float("nan"), -1, 3.2, 65, 3725)] == [
        "?",
        "?",
        "?",
        "3 s",
        "1 min 05 s",
        "1 h 02 min",
    ]


def test_the_line_counts_trials_running_failed_and_names_the_best() -> None:
    clock = _Clock()
    label = TrialNamer("{model.layer.type}", plan_name="p", base_config={"model": {"layer": {"type": "?"}}})
    cb, _ = _callback(clock, total=6, metric="val_accuracy", mode="max", label=label)
    cb.setup()
    trials = [
        SimpleNamespace(
            trial_id="a",
            status="TERMINATED",
            config={"model.layer.type": "linear"},
            last_result={"status": "completed", "val_accuracy": 0.94},
        ),
        SimpleNamespace(
            trial_id="b",
            status="TERMINATED",
            config={"model.layer.type": "corrected"},
            last_result={"status": "completed", "val_accuracy": 0.91},
        ),
        _trial("c", "TERMINATED", status="diverged", val_accuracy=float("nan")),
        _trial("d", "ERROR"),
        _trial("e", "RUNNING", status="running", val_accuracy=0.99),  # not finished: not "best so far"
        _trial("f", "PENDING"),
    ]
    clock.now = 40.0  # 4 trials finished in 40 s, 2 left at 10 s each
    assert (
        cb.line(trials)
        == "[confirm-epochs] 4/6 trials (2 failed), 1 running, ETA ?, best so far: linear 0.94"
    )
    cb._done_before = frozenset()  # as a driver that saw none of them finished at its start
    assert (
        cb.line(trials)
        == "[confirm-epochs] 4/6 trials (2 failed), 1 running, ETA 20 s, best so far: linear 0.94"
    )
    # Lower is better: the other one.
    low, _ = _callback(clock, total=6, metric="val_accuracy", mode="min", label=label)
    assert low.line(trials).endswith("best so far: corrected 0.91")


def test_a_stacked_group_counts_its_members_as_trials() -> None:
    clock = _Clock()
    label = TrialNamer(
        "{model.layer.type}", plan_name="p", base_config={"model": {"layer": {"type": "linear"}}}
    )
    cb, _ = _callback(clock, total=5, metric="val_accuracy", label=label)
    cb.setup()
    members = [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    running = _group(
        "g1",
        "RUNNING",
        members,
        **{"status@m0": "completed", "val_accuracy@m0": 0.9, "status@m1": "diverged", "status@m2": "running"},
    )
    finished = _group("g2", "TERMINATED", members[:2], **{"status@m0": "completed", "val_accuracy@m0": 0.93})
    line = cb.line([running, finished])
    # g1: 2 of its 3 members ended (one diverged), one still trains; g2: both members ended.
    assert line.startswith("[confirm-epochs] 4/5 trials (1 failed), 1 running, ETA ")
    assert line.endswith("best so far: linear 0.93")
    assert "group" not in line


def test_off_a_terminal_a_phase_prints_its_start_its_end_and_at_most_a_line_per_30_s() -> None:
    clock = _Clock(100.0)
    cb, out = _callback(clock, total=4)
    cb.setup()
    trials = [_trial(f"t{i}", "RUNNING") for i in range(2)] + [_trial(f"t{i}", "PENDING") for i in (2, 3)]
    for step in range(1, 300):  # Tune's loop steps ~10 times a second: 29.9 s of them
        clock.now = 100.0 + step * 0.1
        if step == 150:
            trials[0].status = "TERMINATED"  # a trial ending prints nothing by itself
        cb.on_step_end(iteration=step, trials=trials)
    assert cb.lines == ["[confirm-epochs] started: 4 trials"]
    one, _ = _callback(clock, total=1)
    one.setup()
    assert one.lines == ["[confirm-epochs] started: 1 trial"]  # plurals right (issue 48)
    clock.now = 130.0
    cb.on_step_end(iteration=300, trials=trials)
    assert cb.lines[-1] == "[confirm-epochs] 1/4 trials, 1 running, ETA 1 min 30 s"
    for step in range(1, 50):
        clock.now = 130.0 + step * 0.5
        cb.on_step_end(iteration=300 + step, trials=trials)
    assert len(cb.lines) == 2
    for t in trials:
        t.status = "TERMINATED"
    clock.now = 145.0
    cb.on_experiment_end(trials=trials)
    cb.on_experiment_end(trials=trials)  # once
    assert cb.lines[-1] == "[confirm-epochs] done: 4/4 trials in 45 s"
    assert out.getvalue().splitlines() == cb.lines
    assert len(cb.lines) == 3


def test_on_a_terminal_the_line_is_refreshed_in_place() -> None:
    clock = _Clock()
    cb, out = _callback(clock, tty=True, total=2)
    cb.setup()
    trials = [_trial("a", "RUNNING"), _trial("b", "PENDING")]
    for step in range(1, 11):
        clock.now = step * 0.1
        cb.on_step_end(iteration=step, trials=trials)
    assert cb.lines and "started" not in "".join(cb.lines)  # the line itself shows the start
    shown = len(cb.lines)
    assert shown == 2  # refreshed at most every 0.5 s, not at every loop step
    trials[0].status = trials[1].status = "TERMINATED"
    clock.now = 3.0
    cb.on_experiment_end(trials=trials)
    text = out.getvalue()
    assert "\r" in text  # tqdm rewrote the line in place
    assert text.count("\n") == 1  # one line on the terminal, ended once
    assert text.rstrip("\n").endswith("[confirm-epochs] done: 2/2 trials in 3 s")


def test_what_tune_pickles_restarts_its_clock_and_prints_to_the_terminal() -> None:
    clock = _Clock(5.0)
    cb, _ = _callback(_Clock(5.0), tty=True, metric="val_accuracy")
    cb.setup()
    cb.on_step_end(iteration=1, trials=[_trial("a", "RUNNING")])
    copy = pickle.loads(pickle.dumps(cb))
    assert copy._stream is None and copy._bar is None and copy._tty is None
    assert copy._start is None and copy._done_before is None and copy.lines == []
    assert copy.metric == "val_accuracy" and copy.total == 4
    cb.close()
    # A callback pickled by a study started before this version (a ``unit``, a 10 s interval).
    old = ProgressCallback.__new__(ProgressCallback)
    old.__setstate__({"name": "s", "total": 3, "unit": "groups", "interval_s": 10.0, "_clock": clock})
    assert old.interval_s == 30.0 and old.metric is None and not hasattr(old, "unit")
    old._stream, old._tty = io.StringIO(), False
    old.on_experiment_end(trials=[_trial("a", "TERMINATED")])
    assert old.lines[-1].startswith("[s] done: 1/3 trials")


def test_eta_after_a_resume_counts_only_trials_finished_by_this_driver() -> None:
    # A resumed study: 6 of 8 trials were finished by the previous driver. If they counted against
    # this driver's clock, the first line would promise 2 more trials in ~0 s.
    clock = _Clock(100.0)
    cb, _ = _callback(clock, total=8, interval_s=0.0)
    cb.setup()
    trials = [_trial(f"t{i}", "TERMINATED") for i in range(6)] + [_trial(f"t{i}", "RUNNING") for i in (6, 7)]
    clock.now = 130.0
    cb.on_step_end(iteration=1, trials=trials)
    assert cb.lines[-1] == "[confirm-epochs] 6/8 trials, 2 running, ETA ?"
    clock.now = 160.0  # the first trial this driver finished took 60 s since it started
    trials[6].status = "TERMINATED"
    cb.on_step_end(iteration=2, trials=trials)
    assert cb.lines[-1] == "[confirm-epochs] 7/8 trials, 1 running, ETA 1 min 00 s"


def test_a_phase_names_its_best_trial_by_its_arm() -> None:
    """The runner's progress line: the plan's metric and direction, the best trial named by the trial
    runs' ``autonorm.arm`` tag template (else by the trial's readable name)."""
    from workers.plan import StudyPlan
    from workers.runner import _progress

    plan = StudyPlan(
        name="confirm-epochs",
        base_config={"model": {"layer": {"type": "linear"}}},
        metric="val_loss",
        mode="min",
        run_name="{model.layer.type}-s{seed}",
    )
    trial = SimpleNamespace(
        trial_id="a",
        status="TERMINATED",
        config={"model.layer.type": "corrected", "seed": 3},
        last_result={"status": "completed", "val_loss": 0.25},
    )
    by_arm = _progress(plan, 1, {"autonorm.arm": "{model.layer.type}"})
    assert (by_arm.metric, by_arm.mode, by_arm.total) == ("val_loss", "min", 1)
    assert by_arm.line([trial]).endswith("best so far: corrected 0.25")
    by_name = _progress(plan, 1, {})
    assert by_name.line([trial]).endswith("best so far: corrected-s3 0.25")
