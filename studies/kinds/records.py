"""A study's trials read back from its study directory: each phase's trials, the tuning rounds
read back instead of run, the ``status`` fields and rows every arm design shows, a trials-table
row, the cost spent and what only the run itself knew. Light on imports: what needs Ray or pandas is
imported inside the function that needs it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from studies.contract import Phase

__all__ = [
    "arm_of",
    "metric_value",
    "original_run",
    "phase_status",
    "read_phase_trials",
    "spent",
    "status_row",
    "stored_refinement",
    "stored_rounds",
    "study_wall_s",
    "trial_row",
]


def read_phase_trials(phases: Sequence[Phase], spec: Any, *, history: bool = False) -> dict[str, list[Any]]:
    """Each of ``phases``' trials (``workers.runner.TrialRecord``) read back from the study directory, by
    phase name in run order, each with its ``name`` (its MLflow run's, from the phase's run-name
    template); an optional phase (an extension round, a later look) that never ran is left out."""
    import dataclasses

    from studies.study_dir import StudyDir
    from workers.results import read_trials
    from workers.tracking.names import record_run_name

    where = StudyDir.of(spec)
    out = {}
    for phase in phases:
        trials = [
            dataclasses.replace(
                t,
                name=record_run_name(
                    phase.plan.run_name, plan_name=phase.name, trial_id=t.trial_id, config=t.config
                ),
            )
            for t in read_trials(where.phase_plan(phase.name), history=history)
        ]
        if trials or not phase.optional:  # an extension round that never ran is not a phase
            out[phase.name] = trials
    return out


def stored_rounds(spec: Any, prefix: str) -> Any:
    """A :data:`studies.tuning.RunPoints` that reads range-extension round ``k`` back from the study
    directory (the phase ``<prefix><k>``, e.g. ``tune-ext2``) instead of running it (report, status)."""
    return _stored(spec, lambda round_, lrs: f"{prefix}{round_}")


def stored_refinement(spec: Any, phase: str) -> Any:
    """A :data:`studies.tuning.RefinePoints` that reads the learning-rate refinement back from the
    study directory (the phase ``phase``, e.g. ``tune-refine``) instead of running it (report)."""
    return _stored(spec, lambda lrs: phase)


def _stored(spec: Any, phase_of: Callable[..., str]) -> Callable[..., list[Any]]:
    """Reads the phase ``phase_of(*args)`` back from the study directory for ``(*args)``."""
    from studies.study_dir import StudyDir
    from workers.results import read_trials

    where = StudyDir.of(spec)

    def read(*args: Any) -> list[Any]:
        return read_trials(where.phase_plan(phase_of(*args)), history=False)

    return read


def phase_status(
    planned: Sequence[Phase], spec: Any, phases: Mapping[str, list[Any]]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``status`` fields a fixed-design kind shares (``study`` ... ``study_verdict``), from
    :func:`read_phase_trials`'s ``phases``, and the study's ``verdict.json`` (None before there is
    one) for the kind's own fields. ``expected_trials`` is ``spec.total_trials`` plus the trials of
    the optional phases that ran (each raised the count)."""
    import json
    from collections import Counter

    from studies.study_dir import StudyDir

    optional = {p.name for p in planned if p.optional}
    every = [t for ts in phases.values() for t in ts]
    text = StudyDir.of(spec).read_text("verdict.json")
    verdict = json.loads(text) if text else None
    fields = {
        "study": spec.name,
        "kind": spec.kind,
        "directory": StudyDir.of(spec).uri,
        "expected_trials": spec.total_trials + sum(len(ts) for n, ts in phases.items() if n in optional),
        "trials": len(every),
        "by_status": dict(Counter(t.status for t in every)),
        "phases": {
            name: {"trials": len(ts), "by_status": dict(Counter(t.status for t in ts))}
            for name, ts in phases.items()
        },
        "study_verdict": verdict.get("study_verdict") if verdict else None,
        "wall_s": study_wall_s(verdict),
    }
    return fields, verdict


def study_wall_s(verdict: Mapping[str, Any] | None) -> float | None:
    """The study's wall time in seconds as its run wrote it into ``verdict.json`` (``resources``'
    ``wall_time_s``, :meth:`workers.study.StudyRunner.cost`); ``None`` before the study finished."""
    value = ((verdict or {}).get("resources") or {}).get("wall_time_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def arm_of(trial: Any) -> str:
    """The arm of an arm design's trial: its ``model.layer.type``."""
    return str(trial.config["model"]["layer"]["type"])


def metric_value(trial: Any, metric: str) -> float:
    """A trial's last reported ``metric`` as a float (NaN when it reported none, or a non-number)."""
    v = trial.metrics.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")


def trial_row(trial: Any, metric: str, cell: Mapping[str, Any], tuned: Mapping[str, Any]) -> dict[str, Any]:
    """One row of an arm design's trials table: the trial's ``cell`` (arm, seed, ...), its ``status``,
    its last ``metric`` and ``train_loss`` (:func:`metric_value`), what it ran with (``tuned``: its η,
    ...), then ``epochs_done``, ``time_total_s``, ``trial_id`` and ``mlflow_run_id``."""
    return {
        **cell,
        "status": trial.status,
        metric: metric_value(trial, metric),
        "train_loss": metric_value(trial, "train_loss"),
        **tuned,
        "epochs_done": trial.metrics.get("epoch"),
        "time_total_s": float(trial.metrics.get("time_total_s") or 0.0),
        "trial_id": trial.trial_id,
        "mlflow_run_id": trial.mlflow_run_id,
    }


def status_row(phase: str, trial: Any, **fields: Any) -> dict[str, Any]:
    """One row of an arm design's ``status`` table: phase, trial (its MLflow run's name, as
    :func:`read_phase_trials` reads it; Tune's id when it has none), status, arm, seed, lr, then
    ``fields``."""
    return {
        "phase": phase,
        "trial": getattr(trial, "name", None) or trial.trial_id,
        "status": trial.status,
        "arm": arm_of(trial),
        "seed": trial.config.get("seed"),
        "lr": trial.config["training"]["lr"],
        **fields,
    }


def spent(spec: Any, phases: Mapping[str, list[Any]], wall_time_s: float) -> tuple[float, float, float]:
    """``(wall s, CPU h, GPU h)`` of a study from its trials' ``time_total_s`` and the per-trial
    resources of ``spec`` (what the report shows; the wall time is the run's own, NaN if unknown)."""
    seconds = sum(float(t.metrics.get("time_total_s") or 0.0) for ts in phases.values() for t in ts)
    res = dict(spec.resources.as_plan())
    return wall_time_s, seconds * res.get("cpu", 0.0) / 3600, seconds * res.get("gpu", 0.0) / 3600


def original_run(spec: Any, table_file: str) -> tuple[dict[str, str], float]:
    """What only the run itself knew, from the outputs it wrote to the study directory: each trial's
    MLflow run id (its ``table_file``, e.g. ``trials.csv``) and the study's wall time (its
    ``verdict.json``); empty / NaN when the run wrote none yet."""
    import io
    import json

    import pandas as pd

    from studies.study_dir import StudyDir

    where = StudyDir.of(spec)
    run_ids: dict[str, str] = {}
    text = where.read_text(table_file)
    if text:
        df = pd.read_csv(io.StringIO(text), dtype={"trial_id": str, "mlflow_run_id": str})
        if {"trial_id", "mlflow_run_id"} <= set(df.columns):
            run_ids = {
                str(t): str(r)
                for t, r in zip(df["trial_id"], df["mlflow_run_id"])
                if isinstance(r, str) and r
            }
    wall = math.nan
    text = where.read_text("verdict.json")
    if text:
        value = (json.loads(text).get("resources") or {}).get("wall_time_s")
        if isinstance(value, int | float) and math.isfinite(value):
            wall = float(value)
    return run_ids, wall
