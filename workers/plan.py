"""The plain-Python contract between ``studies`` (which validates specs) and ``workers`` (which runs them).

``studies`` turns a validated pydantic ``StudySpec`` into a :class:`StudyPlan`; ``workers`` runs a plan on
Ray Tune + Optuna + MLflow without knowing which study it belongs to. Everything here is a frozen
dataclass of JSON-like values so that a plan pickles to Ray workers and hashes stably.

Trial configuration (what a trial function receives, and what search parameters address by dotted
path) is a plain dict shaped like the spec's ``model``/``data``/``training`` sections::

    {
      "model":    {"type": "vit_lite", "preset": "tiny", "norm": {"type": "autonorm", "tau": 0.5},
                   "linear": {"type": "corrected", "beta": 1.0}, ...model-specific fields},
      "data":     {"type": "digits", "subset": None, "val_fraction": 0.1, "data_root": None},
      "training": {"epochs": 3, "batch_size": 64, "lr": 1e-3, ..., "freeze": {"t_freeze": 1, ...}},
      "seed": 0,
    }

A :class:`ParamDef` named ``"training.freeze.t_freeze"`` sets ``config["training"]["freeze"]["t_freeze"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ParamType = Literal["int", "float", "categorical"]


@dataclass(frozen=True)
class ParamDef:
    """One search dimension.

    Attributes:
        name: dotted path into the trial config (``"model.norm.tau"``) or ``"seed"``.
        type: ``int`` / ``float`` use ``low``/``high`` (``log`` for log-uniform); ``categorical`` uses
            ``choices``.
        when: the parameter is only sampled when every ``path -> value`` here holds for the parameters
            sampled before it (conditional spaces, e.g. ``{"model.linear.type": "corrected"}``).
            Parameters are sampled in the order given, so a condition must name an earlier parameter.
    """

    name: str
    type: ParamType
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None
    when: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class SamplerConfig:
    """``tpe | random | cmaes`` go through Optuna; ``grid`` is Tune's exhaustive grid over ``StudyPlan.grid``."""

    type: Literal["tpe", "random", "cmaes", "grid"] = "tpe"
    seed: int = 0
    n_startup_trials: int = 10


@dataclass(frozen=True)
class SchedulerConfig:
    """``asha`` / ``median`` stop trials early (exploration only); ``fifo`` runs every trial to the end."""

    type: Literal["fifo", "asha", "median"] = "fifo"
    grace_period: int = 1
    reduction_factor: int = 3


@dataclass(frozen=True)
class TrackingConfig:
    """Where MLflow runs go.

    Attributes:
        uri: tracking URI. ``None`` means the embedded default ``sqlite:///<storage_path>/mlflow.db``
            (absolute), resolved by the driver and passed to every worker explicitly.
        experiment: MLflow experiment name (the spec's ``name`` by default).
        artifact_location: artifact root for a newly created experiment (``s3://...`` or a path).
        final_flush_s: at the end of a phase, how long the driver keeps delivering results MLflow
            has not taken yet (an outage) before it gives up, keeps them in the study directory and
            ends the study with a non-zero status (the same command then delivers them).
    """

    uri: str | None = None
    experiment: str = "default"
    artifact_location: str | None = None
    final_flush_s: float = 120.0


@dataclass(frozen=True)
class StorageConfig:
    """Where Tune keeps experiment state and checkpoints.

    ``path`` is a local directory or ``s3://bucket/prefix``. For an S3-compatible server give
    ``endpoint_override`` (``http://127.0.0.1:8333``); keys always come from the environment
    (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), never from a spec.
    """

    path: str = "runs"
    endpoint_override: str | None = None
    region: str = "us-east-1"


@dataclass(frozen=True)
class StudyPlan:
    """Everything ``workers.run_study`` needs; built by ``studies`` from a validated spec.

    Attributes:
        name: study name; also the Tune experiment directory name below ``storage.path``.
        base_config: the trial config every trial starts from (see module docstring).
        space: sampled dimensions (Optuna samplers). Empty for ``grid``.
        grid: ``dotted path -> values`` for the ``grid`` sampler; the trial set is the product.
        metric / mode: what the searcher and scheduler optimise (e.g. ``val_accuracy`` / ``max``).
        num_samples: trials for Optuna samplers; for ``grid`` the number of repeats of the grid.
        max_concurrent: always passed to Tune as ``max_concurrent_trials``.
        resources: per trial, ``{"cpu": 1, "gpu": 0.25}``; fractional GPUs allowed.
        retries: in-process retries of a trial's own errors (from its last checkpoint); after them the
            trial ends with status ``error``.
        node_failures: Tune's ``FailureConfig(max_failures=...)``: restarts of a trial whose process
            or node died (preemption, OOM kill). Kept apart from ``retries`` so that a reclaimed spot
            node never uses up the study's retries.
        tags: extra tags for the MLflow parent run (spec hash, git commit, ...).
        params: params for the parent run (``expected_trials`` is added by workers).
        artifacts: ``file name -> text`` logged on the parent run at start (e.g. the resolved spec).
        metric_whitelist: prefixes of reported metrics that go to MLflow (our own metrics only).
        run_name: how each trial's Tune trial and MLflow run are named: a template whose
            ``{dotted.path}`` fields are read from the trial's resolved config and ``{index}`` is the
            trial's 1-based number in the plan; a format spec may follow a colon. Examples:
            ``"{model.layer.type}-B{training.batch_size}-s{seed}"``, ``"search-{index:03d}"``,
            ``"autonorm_s-s{seed}"``. Empty: ``<name>-{index:03d}``.
        stack: for a ``grid`` plan, at most this many trials of one cell (the grid points that differ
            only in ``seed`` and ``training.lr``) train in one Tune trial as one stacked model
            (:mod:`workers.members`); each is still a trial of its own everywhere else. 1: one Tune
            trial per trial.
    """

    name: str
    base_config: dict[str, Any]
    space: tuple[ParamDef, ...] = ()
    grid: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    metric: str = "val_accuracy"
    mode: Literal["min", "max"] = "max"
    num_samples: int = 8
    max_concurrent: int = 2
    resources: tuple[tuple[str, float], ...] = (("cpu", 1.0),)
    retries: int = 2
    node_failures: int = 20
    storage: StorageConfig = field(default_factory=StorageConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    tags: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    artifacts: tuple[tuple[str, str], ...] = ()
    metric_whitelist: tuple[str, ...] = (
        "epoch",
        "train_loss",
        "val_",
        "test_",
        "gate_entropy",
        "dyt_weight",
        "selector_frozen",
        "examples_per_s",
        "lr",
    )
    run_name: str = ""
    stack: int = 1


def expected_trials(plan: StudyPlan) -> int:
    """Planned trial count: ``num_samples`` for Optuna samplers, grid size x repeats for ``grid``."""
    if plan.sampler.type == "grid":
        size = 1
        for _, values in plan.grid:
            size *= len(values)
        return size * plan.num_samples
    return plan.num_samples
