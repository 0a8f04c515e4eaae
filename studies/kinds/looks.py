"""A sequential design's looks, run: the confirmatory seeds in looks, every hypothesis tested
anytime-validly after each, per-arm stopping, and no more seeds once every hypothesis is decided
(docs/science.md, PROTOCOL §5).

One driver for every kind, :func:`run_looks`: it runs look after look, prints each look's
decisions, stops when the next look is not needed and raises the study's trial count by what the
next look adds. What a kind runs at a look, how it analyses the looks so far and which arms the
next look needs are its :class:`LookHooks`: :class:`BudgetLooks` for a tuned design (every budget
per look, :mod:`studies.kinds.pipeline`), :class:`ArmLooks` for a kind that confirms arm by arm,
each arm its own phase per look (the claims kind, :mod:`studies.kinds.search`).

A look already in the study directory (a resumed study) runs whatever the decisions, so a rerun
repeats the study, and every look of an explicit ``sequential.looks`` schedule (``extend``) runs
for the arms still needed, so an extension adds exactly its seeds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from studies.kinds.printing import say

__all__ = ["ArmLooks", "BudgetLooks", "LookHooks", "NextLook", "all_decided", "n_looks", "run_looks"]


def n_looks(spec: Any) -> int:
    """How many confirmatory looks the spec's design has (1 without ``sequential:``)."""
    return len(spec.sequential.schedule()) if getattr(spec, "sequential", None) is not None else 1


def all_decided(verdict: Mapping[str, Any]) -> bool:
    """Every claimed sequential hypothesis of the last look is decided (rejected or futile); a
    reported one (``reported: true``, tested alone) never keeps a study launching seeds."""
    looks = verdict.get("looks") or []
    if not looks:
        return False
    return all(
        h["decision"] in ("reject", "futile")
        for h in looks[-1]["hypotheses"].values()
        if not h.get("reported")
    )


def last_look(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """The hypotheses of the last look in ``verdict`` (``{name: {decision, ...}}``; none yet: ``{}``)."""
    return dict((verdict.get("looks") or [{}])[-1].get("hypotheses", {}))


@dataclass(frozen=True)
class NextLook:
    """What the next look runs, as a kind's :meth:`LookHooks.next_look` chose it.

    Attributes:
        per_seed: its trials per seed (the arms it runs, over every budget).
        stopped: the arms it no longer runs (every hypothesis on them decided), as printed.
        may_stop: nothing is left to decide and none of it is in the study directory: the study
            stops here unless its ``sequential.looks`` schedule is explicit.
        idle: it may stop with a hypothesis still open, because no arm it rests on runs (an
            under-trained cell: its verdict is inconclusive whatever the seeds).
    """

    per_seed: int
    stopped: Sequence[str] = ()
    may_stop: bool = False
    idle: bool = False


class LookHooks(ABC):
    """What :func:`run_looks` asks a kind: run a look, analyse the looks so far, choose the next."""

    #: what the kind's lines call a hypothesis (``every <noun> decided``)
    noun: str = "hypothesis"

    @abstractmethod
    def run(self, look: int) -> None:
        """Run look ``look`` (1-based) of what :meth:`next_look` chose (the first look: everything)."""

    @abstractmethod
    def analyse(self) -> Mapping[str, Any]:
        """The verdict of the looks run so far (its ``looks`` hold each look's decisions)."""

    @abstractmethod
    def next_look(self, look: int, verdict: Mapping[str, Any]) -> NextLook:
        """Choose what look ``look`` runs, given the ``verdict`` of the looks before it."""


def run_looks(hooks: LookHooks, *, sequential: Any, seeds: Sequence[Any], runner: Any, tag: str) -> None:
    """The confirmatory ``seeds`` in the looks of ``sequential`` (a ``sequential:`` section): after
    each look but the last, the decisions printed (``[<tag>] look <j> (<n> seeds): <name> <decision>,
    ...``), then the next look chosen (:meth:`LookHooks.next_look`): the study stops when it may and
    its schedule is not explicit; else the arms it stops are printed and ``runner``'s trial count is
    raised by the trials the next look adds."""
    from studies.sequential import look_seeds

    schedule = sequential.schedule()
    added = dict(look_seeds(seeds, schedule))
    for j in range(1, len(schedule) + 1):
        hooks.run(j)
        if j == len(schedule):
            break
        verdict = hooks.analyse()
        state = {name: h["decision"] for name, h in last_look(verdict).items()}
        say(tag, f"look {j} ({schedule[j - 1]} seeds): " + ", ".join(f"{k} {v}" for k, v in state.items()))
        nxt = hooks.next_look(j + 1, verdict)
        if nxt.may_stop and sequential.looks is None:
            done = f"after {schedule[j - 1]} of {sequential.max_seeds} seeds: stop"
            if nxt.idle:
                say(tag, f"no {hooks.noun} left open can change (each rests on an under-trained cell) {done}")
            else:
                say(tag, f"every {hooks.noun} decided {done}")
            break
        if nxt.stopped:
            say(tag, f"no more seeds for {', '.join(nxt.stopped)}: every {hooks.noun} on them is decided")
        runner.set_expected_trials(runner.expected_trials + len(added[j + 1]) * nxt.per_seed)


def _on_disk(spec: Any, phase: str) -> bool:
    """Whether the phase ``phase`` has trials in the study directory (a look that ran before)."""
    from studies.study_dir import StudyDir
    from workers.results import read_trials

    return bool(read_trials(StudyDir.of(spec).phase_plan(phase), history=False))


class BudgetLooks(LookHooks):
    """A tuned design's looks (:class:`studies.kinds.pipeline.TunedDesignKind`): every budget per
    look, each one confirmatory phase ``confirm[-<budget>][-look<j>]`` of the arms still needed.

    ``confirm(budget, look, arms)``: one budget's look as a trials table (``arms``: only these,
    ``None``: every arm); ``analyse(tables)``: the verdict of the tables so far; ``look_arms(verdict,
    budget)``: the arms the budget's next look runs (:meth:`~studies.kinds.pipeline.TunedDesign.look_arms`;
    ``None``: every arm). A next look already on disk runs every arm; the study may stop when every
    claimed hypothesis is decided (:func:`all_decided`) or no budget's next look runs an arm."""

    def __init__(
        self,
        spec: Any,
        *,
        confirm: Callable[[str, int, list[str] | None], Any],
        analyse: Callable[[Sequence[Any]], Mapping[str, Any]],
        look_arms: Callable[[Mapping[str, Any], str], list[str] | None],
    ) -> None:
        self.spec = spec
        self._confirm, self._analyse, self._look_arms = confirm, analyse, look_arms
        self.budgets = list(spec.budget_names)
        self.arms: dict[str, list[str] | None] = dict.fromkeys(self.budgets)
        self.tables: list[Any] = []

    def run(self, look: int) -> None:
        for budget in self.budgets:
            if self.arms[budget] == []:
                continue  # every hypothesis of this budget decided: no arm needs the seeds
            self.tables.append(self._confirm(budget, look, self.arms[budget]))

    def analyse(self) -> Mapping[str, Any]:
        return self._analyse(self.tables)

    def next_look(self, look: int, verdict: Mapping[str, Any]) -> NextLook:
        from studies.schema.arms import phase_name

        spec, budgets = self.spec, self.budgets
        ran_before = _on_disk(spec, phase_name("confirm", budgets[0], look))
        # A look already on disk runs as it ran (every arm); else per-arm stopping.
        self.arms = {b: None if ran_before else self._look_arms(verdict, b) for b in budgets}
        per_budget = spec.trials_per_seed // len(budgets)
        per_arm = per_budget // len(spec.arm_names)
        per_seed = sum(per_budget if a is None else per_arm * len(a) for a in self.arms.values())
        stopped = sorted(
            {a for run in self.arms.values() if run is not None for a in spec.arm_names if a not in run}
        )
        # No budget runs an arm (every hypothesis decided, or resting on an under-trained cell): more
        # looks would add no trial and change no decision.
        decided, idle = all_decided(verdict), all(a == [] for a in self.arms.values())
        return NextLook(
            per_seed, stopped, may_stop=(decided or idle) and not ran_before, idle=idle and not decided
        )


class ArmLooks(LookHooks):
    """The looks of a kind that confirms arm by arm (the claims kind): each arm's look is its own
    phase (``phase_of(arm, look)``), run by ``run_arm(arm, look)``; ``analyse()`` tests the
    hypotheses on every look so far; ``needed(hypotheses, arms)``: of ``arms``, those a hypothesis
    still undecided at the last look rests on. The next look runs the arms still needed and those
    whose look is already on disk; the study may stop when it runs none."""

    def __init__(
        self,
        spec: Any,
        arms: Sequence[str],
        *,
        run_arm: Callable[[str, int], Any],
        analyse: Callable[[], Mapping[str, Any]],
        needed: Callable[[Mapping[str, Any], list[str]], Sequence[str]],
        phase_of: Callable[[str, int], str],
        noun: str = "hypothesis",
    ) -> None:
        self.spec, self.arms, self.noun = spec, list(arms), noun
        self._run_arm, self._analyse, self._needed, self._phase_of = run_arm, analyse, needed, phase_of
        self.running = list(arms)

    def run(self, look: int) -> None:
        for arm in self.running:
            self._run_arm(arm, look)

    def analyse(self) -> Mapping[str, Any]:
        return self._analyse()

    def next_look(self, look: int, verdict: Mapping[str, Any]) -> NextLook:
        arms = self.arms
        ran_before = [arm for arm in arms if _on_disk(self.spec, self._phase_of(arm, look))]
        needed = self._needed(last_look(verdict), arms) if verdict.get("looks") else list(arms)
        self.running = [arm for arm in arms if arm in needed or arm in ran_before]
        stopped = [arm for arm in arms if arm not in self.running]
        return NextLook(len(self.running), stopped, may_stop=not self.running)
