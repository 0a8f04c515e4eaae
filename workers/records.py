"""A study's trials as records: one status vocabulary and one "best" rule for every reader.

What :func:`workers.runner.run_study` returns, what :func:`workers.results.read_trials` reads back from a
study directory, and what :class:`workers.tracking.replay.TrackedTrials` rebuilds from MLflow. Plain data:
this module imports nothing from ``workers``, nor Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "FINAL_STATUSES",
    "StudyResult",
    "TrialRecord",
    "TrialStatus",
    "best_trial",
    "trial_status",
]

TrialStatus = Literal["completed", "diverged", "error", "pruned"]
# Values of the ``status`` metric a trial reports on its last epoch. Any other value (``running``)
# on a trial's last result means the trial did not get to finish: a scheduler stopped it.
FINAL_STATUSES = ("completed", "diverged", "error")


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a finished study.

    Attributes:
        trial_id: Tune's trial id (also the ``ray.trial_id`` tag of its MLflow run).
        params: the sampled parameters (dotted paths), as Tune saw them.
        config: the resolved trial config the trial ran.
        status: ``completed`` / ``diverged`` (the trial's own last report), ``pruned`` (a scheduler
            stopped it, or it never started), ``error`` (failed after all retries).
        metrics: the trial's last reported result (Tune bookkeeping keys included).
        node_id: Ray node of the last report, when any.
        mlflow_run_id: its child run, when one was created.
        history: every reported result in order (filled by :func:`workers.results.read_trials`).
        name: its readable name, the name of its MLflow run (``corrected-B32-s0``), where the reader
            knew its phase's run-name template (:func:`studies.kinds.records.read_phase_trials`); else
            ``None``.
    """

    trial_id: str
    params: dict[str, Any]
    config: dict[str, Any]
    status: TrialStatus
    metrics: dict[str, Any]
    node_id: str | None = None
    mlflow_run_id: str | None = None
    history: tuple[dict[str, Any], ...] = ()
    name: str | None = None


def trial_status(tune_status: str, last_result: Mapping[str, Any] | None) -> TrialStatus:
    """The one decision of a trial's status, from Tune's status and the trial's own last report.

    ``ERROR`` -> ``error``; a last report whose ``status`` is ``completed`` / ``diverged`` -> that;
    anything else (a scheduler stopped it, it never started, the study was cut short) -> ``pruned``.
    """
    if tune_status == "ERROR":
        return "error"
    status = (last_result or {}).get("status")
    if status in FINAL_STATUSES:
        return status  # type: ignore[no-any-return]
    return "pruned"


def best_trial(trials: Sequence[TrialRecord], metric: str, mode: str) -> TrialRecord | None:
    """The one "best" rule: the COMPLETED trial with the best finite ``metric`` (``None`` if none).

    Pruned, diverged and errored trials never win, whatever their last reported value.
    """
    candidates = [
        t
        for t in trials
        if t.status == "completed"
        and isinstance(t.metrics.get(metric), int | float)
        and math.isfinite(t.metrics[metric])
    ]
    if not candidates:
        return None
    pick = max if mode == "max" else min
    return pick(candidates, key=lambda t: t.metrics[metric])


@dataclass(frozen=True)
class StudyResult:
    """What :func:`workers.runner.run_study` returns.

    Attributes:
        experiment_path: Tune's experiment directory (``/abs/dir/name`` or ``s3://bucket/prefix/name``).
        tracking_uri: the MLflow URI the study logged to.
        parent_run_id: the study's MLflow parent run (``None`` only when MLflow never answered).
        trials: one record per trial, in Tune's order.
        restored: the call restored an existing experiment instead of starting it.
        undelivered_trials: trials whose MLflow metrics could not all be delivered (an outage that
            outlasted the study's final flush); their data is still in the Tune experiment.
    """

    experiment_path: str
    tracking_uri: str
    parent_run_id: str | None
    trials: list[TrialRecord] = field(default_factory=list)
    restored: bool = False
    undelivered_trials: list[str] = field(default_factory=list)

    def count(self, status: TrialStatus) -> int:
        return sum(t.status == status for t in self.trials)

    def best(self, metric: str, mode: Literal["min", "max"]) -> TrialRecord | None:
        """:func:`best_trial` over this study's trials."""
        return best_trial(self.trials, metric, mode)
