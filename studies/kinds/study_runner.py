"""Running a kind's study: the study runner built from its study-level plan, and the extra tuning
phases (range-extension rounds, the learning-rate refinement) run as phases of their own. What
needs Ray is imported inside the function that needs it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from studies.kinds.printing import say
from workers.plan import StudyPlan

__all__ = [
    "RUNNER_OPTIONS",
    "extension_runner",
    "refine_runner",
    "study_runner",
]


RUNNER_OPTIONS = ("ray_address", "ray_init_kwargs", "trainable", "progress", "planned", "provenance")
"""What :meth:`StudyKind.run` passes on to :class:`workers.study.StudyRunner` (``provenance``:
``{"tags", "artifacts"}`` added to the study run's own, :func:`studies.provenance.study_provenance`)."""


def study_runner(study: StudyPlan, *, expected_trials: int, **options: Any) -> Any:
    """The :class:`workers.study.StudyRunner` of a study: name, storage, tracking, tags, params,
    artifacts and resources from ``study`` (the study-level plan), ``expected_trials`` every trial
    the phases plan; ``options``: :data:`RUNNER_OPTIONS`."""
    from workers.study import StudyRunner

    provenance = options.get("provenance") or {}
    return StudyRunner(
        name=study.name,
        storage=study.storage,
        tracking=study.tracking,
        expected_trials=expected_trials,
        tags={**dict(study.tags), **dict(provenance.get("tags") or {})},
        params=dict(study.params),
        artifacts={**dict(study.artifacts), **dict(provenance.get("artifacts") or {})},
        resources=study.resources,
        **{k: v for k, v in options.items() if k in RUNNER_OPTIONS and k != "provenance"},
    )


def extension_runner(
    runner: Any,
    plan_of: Callable[[int, Mapping[str, float]], StudyPlan],
    *,
    seeds: int,
    line: Callable[[int, Mapping[str, float]], str],
    tag: str,
) -> Any:
    """A :data:`studies.tuning.RunPoints` that runs range-extension round ``k`` as its own tuning
    phase (``plan_of(k, lrs)``: ordinary tuning trials, MLflow runs under the study run, resumable,
    listed by ``status``), raising the study's trial count by ``seeds`` per rate and printing ``line``."""

    def run_points(round_: int, lrs: Mapping[str, float]) -> list[Any]:
        return _run_tuning(runner, plan_of(round_, lrs), tag, line(round_, lrs), added=len(lrs) * seeds)

    return run_points


def _run_tuning(runner: Any, plan: StudyPlan, tag: str, line: str, *, added: int) -> list[Any]:
    """An extra tuning phase, run: ``line`` printed, the study's trial count raised by ``added``."""
    say(tag, line)
    runner.set_expected_trials(runner.expected_trials + added)
    return list(runner.run(plan).trials)


def refine_runner(
    runner: Any,
    plan_of: Callable[[Mapping[str, Sequence[float]]], StudyPlan],
    *,
    seeds: int,
    tag: str,
    label: str = "",
) -> Any:
    """A :data:`studies.tuning.RefinePoints` that runs the learning-rate refinement as its own
    tuning phase (``plan_of(lrs)``: ordinary tuning trials, resumable, listed by ``status``),
    raising the study's trial count by ``seeds`` per rate and printing one line (``label``: e.g.
    the budget)."""

    def run_refine(lrs: Mapping[str, Sequence[float]]) -> list[Any]:
        rates = ", ".join(f"{cell} lr={'/'.join(f'{lr:g}' for lr in v)}" for cell, v in lrs.items())
        added = sum(len(v) for v in lrs.values()) * seeds
        return _run_tuning(runner, plan_of(lrs), tag, f"  lr refinement{label}: {rates}", added=added)

    return run_refine
