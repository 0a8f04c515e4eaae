"""Execution layer: Ray Tune trainable, Optuna search, scheduling, restore and MLflow tracking.

``run_study(plan)`` runs a :class:`~workers.plan.StudyPlan` (built by ``studies`` from a validated
spec) on Ray Tune with Optuna, logs it to MLflow, and can be called again after a crash to resume.
Nothing here knows about a particular study.
"""

from workers.plan import (
    ParamDef,
    SamplerConfig,
    SchedulerConfig,
    StorageConfig,
    StudyPlan,
    TrackingConfig,
)
from workers.runner import StudyResult, TrialRecord, expected_trials, run_study
from workers.search import DefineByRunSpace, PruningAwareOptunaSearch, create_sampler
from workers.tracking import MlflowTrackingCallback, default_tracking_uri, study_key
from workers.trainable import TrialFunction, TrialSession, autonorm_trial, resolve_trial_config

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
