"""The one looks driver (studies.kinds.looks) with the claims kind's arm-by-arm hooks and a tuned
design's budget hooks: what each look runs, when the study stops, the trial count it raises and the
lines it prints (no Ray: the phases and the analysis are stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from studies.kinds import looks
from studies.kinds.looks import ArmLooks, BudgetLooks, all_decided, n_looks, run_looks


class _Sequential:
    def __init__(self, schedule: list[int], *, explicit: bool = False) -> None:
        self._schedule = schedule
        self.looks = schedule if explicit else None
        self.max_seeds = schedule[-1]

    def schedule(self) -> list[int]:
        return list(self._schedule)


class _Runner:
    expected_trials = 10

    def set_expected_trials(self, n: int) -> None:
        self.expected_trials = n


def _verdict(**decisions: str) -> dict[str, Any]:
    return {"looks": [{"hypotheses": {k: {"decision": v} for k, v in decisions.items()}}]}


def _arm_looks(verdicts: list[dict[str, Any]], ran: list[tuple[str, int]]) -> ArmLooks:
    needs = {"a": ["x", "y"], "b": ["y", "z"]}

    def needed(hypotheses: Any, arms: list[str]) -> list[str]:
        live = {arm for h, d in hypotheses.items() if d["decision"] == "continue" for arm in needs[h]}
        return [arm for arm in arms if arm in live]

    return ArmLooks(
        SimpleNamespace(),
        ["x", "y", "z"],
        run_arm=lambda arm, j: ran.append((arm, j)),
        analyse=lambda: verdicts.pop(0),
        needed=needed,
        phase_of=lambda arm, j: f"confirm-{arm}-look{j}",
        noun="claim",
    )


def test_arm_looks_stop_arms_whose_claims_are_decided_then_the_study(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(looks, "_on_disk", lambda spec, phase: False)
    ran: list[tuple[str, int]] = []
    hooks = _arm_looks([_verdict(a="reject", b="continue"), _verdict(a="reject", b="futile")], ran)
    runner = _Runner()
    run_looks(hooks, sequential=_Sequential([2, 4, 6]), seeds=range(6), runner=runner, tag="t")
    assert ran == [("x", 1), ("y", 1), ("z", 1), ("y", 2), ("z", 2)]
    assert runner.expected_trials == 10 + 2 * 2  # look 2: 2 seeds x the 2 arms still needed
    assert capsys.readouterr().out.splitlines() == [
        "[t] look 1 (2 seeds): a reject, b continue",
        "[t] no more seeds for x: every claim on them is decided",
        "[t] look 2 (4 seeds): a reject, b futile",
        "[t] every claim decided after 4 of 6 seeds: stop",
    ]


def test_a_look_on_disk_or_an_explicit_schedule_runs_whatever_the_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(looks, "_on_disk", lambda spec, phase: phase == "confirm-x-look2")
    ran: list[tuple[str, int]] = []
    hooks = _arm_looks([_verdict(a="reject", b="reject"), _verdict(a="reject", b="reject")], ran)
    run_looks(hooks, sequential=_Sequential([2, 4, 6]), seeds=range(6), runner=_Runner(), tag="t")
    assert ran == [("x", 1), ("y", 1), ("z", 1), ("x", 2)]  # x's look 2 ran before: it runs again
    monkeypatch.setattr(looks, "_on_disk", lambda spec, phase: False)
    ran.clear()
    hooks = _arm_looks([_verdict(a="reject", b="reject"), _verdict(a="reject", b="reject")], ran)
    run_looks(
        hooks, sequential=_Sequential([2, 4, 6], explicit=True), seeds=range(6), runner=_Runner(), tag="t"
    )
    assert ran == [("x", 1), ("y", 1), ("z", 1)]  # every look of the schedule, but no arm is needed


def test_budget_looks_run_every_budget_per_look_and_stop_when_all_is_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(looks, "_on_disk", lambda spec, phase: False)
    spec = SimpleNamespace(budget_names=["epochs", "updates"], trials_per_seed=8, arm_names=["c", "f1"])
    ran: list[tuple[str, int, Any]] = []
    verdicts = [_verdict(f1="continue"), _verdict(f1="reject")]

    def confirm(budget: str, look: int, arms: list[str] | None) -> tuple[str, int]:
        ran.append((budget, look, arms))
        return budget, look

    hooks = BudgetLooks(
        spec,
        confirm=confirm,
        analyse=lambda tables: verdicts.pop(0),
        look_arms=lambda verdict, b: ["c", "f1"] if b == "epochs" else [],
    )
    runner = _Runner()
    run_looks(hooks, sequential=_Sequential([2, 3, 4]), seeds=range(4), runner=runner, tag="bs")
    assert ran == [("epochs", 1, None), ("updates", 1, None), ("epochs", 2, ["c", "f1"])]
    assert hooks.tables == [("epochs", 1), ("updates", 1), ("epochs", 2)]
    assert runner.expected_trials == 10 + 1 * 4  # look 2: 1 seed x (2 arms x 2 per arm) of one budget


def test_budget_looks_stop_when_no_budget_runs_an_arm_though_a_hypothesis_is_open(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fix arm on an under-trained cell (batch-size kind's look_arms) keeps its test "continue" but
    # gets no seeds: once no budget runs an arm, further looks could change nothing.
    monkeypatch.setattr(looks, "_on_disk", lambda spec, phase: False)
    spec = SimpleNamespace(budget_names=["epochs"], trials_per_seed=2, arm_names=["c", "f1"])
    ran: list[tuple[str, int, Any]] = []
    hooks = BudgetLooks(
        spec,
        confirm=lambda budget, look, arms: ran.append((budget, look, arms)),
        analyse=lambda tables: _verdict(f1="continue"),
        look_arms=lambda verdict, b: [],
    )
    runner = _Runner()
    run_looks(hooks, sequential=_Sequential([2, 3, 4]), seeds=range(4), runner=runner, tag="bs")
    assert ran == [("epochs", 1, None)] and runner.expected_trials == 10
    assert capsys.readouterr().out.splitlines()[-1] == (
        "[bs] no hypothesis left open can change (each rests on an under-trained cell) after 2 of 4 seeds: stop"
    )


def test_counts_and_decisions() -> None:
    assert n_looks(SimpleNamespace(sequential=None)) == 1
    assert n_looks(SimpleNamespace(sequential=_Sequential([6, 8, 10]))) == 3
    assert not all_decided({"looks": []})
    assert all_decided(
        {
            "looks": [
                {"hypotheses": {"a": {"decision": "reject"}, "e": {"decision": "continue", "reported": True}}}
            ]
        }
    )
