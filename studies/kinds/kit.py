"""The helpers a kind's methods share (the contract itself is :mod:`studies.kinds.contract`).

Building the study runner, reading each phase's trials back from the study directory, the ``status``
fields and rows every arm design shows, the cost spent, logging a finished study's outputs and its
:class:`~studies.kinds.contract.StudyOutcome`. Light on imports: what needs Ray or MLflow is imported
inside the function that needs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.contract import Phase, StudyOutcome
from workers.plan import StudyPlan

__all__ = [
    "RUNNER_OPTIONS",
    "arm_of",
    "hypothesis_entry",
    "log_study_outputs",
    "metric_value",
    "phase_status",
    "read_phase_trials",
    "spent",
    "status_row",
    "stored_rounds",
    "study_outcome",
    "study_runner",
]


def hypothesis_entry(
    result: Mapping[str, Any], *, estimate: str = "estimate", ci: str = "ci"
) -> dict[str, Any]:
    """One hypothesis in the uniform view: ``verdict``, ``reasons``, ``estimate``, ``ci``, ``p_value``,
    ``p_value_holm``, read from a kind's own result (``estimate`` / ``ci`` name its keys)."""
    return {
        "verdict": result.get("verdict"),
        "reasons": list(result.get("reasons") or []),
        "estimate": result.get(estimate),
        "ci": result.get(ci),
        "p_value": result.get("p_value"),
        "p_value_holm": result.get("p_value_holm"),
    }


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


def read_phase_trials(phases: Sequence[Phase], spec: Any, *, history: bool = False) -> dict[str, list[Any]]:
    """Each of ``phases``' trials (``workers.runner.TrialRecord``) read back from the study directory, by
    phase name in run order; an optional phase (an extension round, a later look) that never ran is
    left out."""
    from studies.study_dir import StudyDir
    from workers.results import read_trials

    where = StudyDir.of(spec)
    out = {}
    for phase in phases:
        trials = read_trials(where.phase_plan(phase.name), history=history)
        if trials or not phase.optional:  # an extension round that never ran is not a phase
            out[phase.name] = trials
    return out


def stored_rounds(spec: Any, prefix: str) -> Any:
    """A :data:`studies.tuning.RunPoints` that reads range-extension round ``k`` back from the study
    directory (the phase ``<prefix><k>``, e.g. ``tune-ext2``) instead of running it (report, status)."""
    from studies.study_dir import StudyDir
    from workers.results import read_trials

    where = StudyDir.of(spec)

    def read_points(round_: int, lrs: Mapping[str, float]) -> Any:
        return read_trials(where.phase_plan(f"{prefix}{round_}"), history=False)

    return read_points


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
    }
    return fields, verdict


def arm_of(trial: Any) -> str:
    """The arm of an arm design's trial: its ``model.layer.type``."""
    return str(trial.config["model"]["layer"]["type"])


def metric_value(trial: Any, metric: str) -> float:
    """A trial's last reported ``metric`` as a float (NaN when it reported none, or a non-number)."""
    v = trial.metrics.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")


def status_row(phase: str, trial: Any, **fields: Any) -> dict[str, Any]:
    """One row of an arm design's ``status`` table: phase, trial, status, arm, seed, lr, then ``fields``."""
    return {
        "phase": phase,
        "trial": trial.trial_id,
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


def log_study_outputs(
    runner: Any,
    spec: Any,
    files: Mapping[str, Path],
    *,
    tags: Mapping[str, str],
    metrics: Mapping[str, float],
) -> None:
    """A finished study's output files into its directory (when remote) and onto its MLflow run, with
    the verdict ``tags`` and ``metrics`` and the analysed metric as a param (the wall time and the
    resource hours are the runner's own ``actual_*`` metrics)."""
    runner.publish(files.values())
    runner.log_outputs(
        files=files.values(), tags=tags, metrics=metrics, params={"analysis_metric": spec.analysis.metric}
    )


def study_outcome(
    spec: Any,
    runner: Any,
    verdict: dict[str, Any],
    table: Any,
    files: dict[str, Path],
    *,
    verdicts: Mapping[str, Any],
    tuned_lr: Any,
) -> StudyOutcome:
    """The :class:`StudyOutcome` of a fixed-design kind's finished ``run``: its summary is the study,
    its ``study_verdict``, the kind's ``verdicts`` (e.g. per arm or per contrast), the trials by
    status (``table``'s ``status`` column), ``tuned_lr`` and where the run lives."""
    from collections import Counter

    counts = Counter(str(s) for s in table["status"]) if not table.empty else Counter()
    return StudyOutcome(
        kind=spec.kind,
        name=spec.name,
        study_dir=runner.study_uri,
        tracking_uri=runner.tracking_uri,
        parent_run_id=runner.run_id,
        summary={
            "study": spec.name,
            "study_verdict": verdict.get("study_verdict"),
            **verdicts,
            "trials": dict(counts),
            "tuned_lr": tuned_lr,
            "parent_run_id": runner.run_id,
            "tracking_uri": runner.tracking_uri,
            "study_dir": runner.study_uri,
        },
        verdict=verdict,
        files=files,
    )
