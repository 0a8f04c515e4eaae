"""Execution layer: Ray Tune trainable, Optuna search, scheduling, restore and MLflow tracking.

``run_study(plan)`` runs a :class:`~workers.plan.StudyPlan` (built by ``studies`` from a validated
spec) on Ray Tune with Optuna, logs it to MLflow, and can be called again after a crash to resume.
Nothing here knows about a particular study.

Exports are resolved lazily: ``from workers.plan import StudyPlan`` (what spec validation needs) must
not pay for importing Ray Tune, Optuna and MLflow (~4-5 s here), so ``autonorm-study validate`` stays fast.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

TRIAL_NOTICE = r"^trial \S+: "
"""What starts a line a trial prints for the user (``workers.trainable._say``)."""

# Ray folds log lines from different workers that are equal once every token holding a digit is
# dropped: "trial 2a0acc3f: checkpoint .../checkpoint_000003 is unreadable ..." of two trials is one
# line to it, and the second trial's notice never reaches the driver. Ray reads the exemption when
# it is first imported, which in every entry point (CLI, job scripts, trial workers) is after this.
os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", TRIAL_NOTICE)

if TYPE_CHECKING:
    from workers.plan import (
        ParamDef,
        SamplerConfig,
        SchedulerConfig,
        StorageConfig,
        StudyPlan,
        TrackingConfig,
        expected_trials,
    )
    from workers.records import StudyResult, TrialRecord
    from workers.runner import run_study
    from workers.search import DefineByRunSpace, PruningAwareOptunaSearch, create_sampler
    from workers.tracking import MlflowTrackingCallback, default_tracking_uri, study_key
    from workers.trainable import TrialFunction, TrialSession, autonorm_trial, resolve_trial_config

_EXPORTS: dict[str, str] = {
    "ParamDef": "workers.plan",
    "SamplerConfig": "workers.plan",
    "SchedulerConfig": "workers.plan",
    "StorageConfig": "workers.plan",
    "StudyPlan": "workers.plan",
    "TrackingConfig": "workers.plan",
    "StudyResult": "workers.records",
    "TrialRecord": "workers.records",
    "expected_trials": "workers.plan",
    "run_study": "workers.runner",
    "DefineByRunSpace": "workers.search",
    "PruningAwareOptunaSearch": "workers.search",
    "create_sampler": "workers.search",
    "MlflowTrackingCallback": "workers.tracking",
    "default_tracking_uri": "workers.tracking",
    "study_key": "workers.tracking",
    "TrialFunction": "workers.trainable",
    "TrialSession": "workers.trainable",
    "autonorm_trial": "workers.trainable",
    "resolve_trial_config": "workers.trainable",
}

__all__ = [
    "DefineByRunSpace",
    "MlflowTrackingCallback",
    "ParamDef",
    "PruningAwareOptunaSearch",
    "SamplerConfig",
    "SchedulerConfig",
    "StorageConfig",
    "StudyPlan",
    "StudyResult",
    "TrackingConfig",
    "TrialFunction",
    "TrialRecord",
    "TrialSession",
    "autonorm_trial",
    "create_sampler",
    "default_tracking_uri",
    "expected_trials",
    "resolve_trial_config",
    "run_study",
    "study_key",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
