"""Plan building: a :class:`workers.plan.StudyPlan` from validated sections, with the provenance tags
(spec hash, git commit, package versions) every study run carries."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from studies.schema.execution import ExecutionSpec
from studies.schema.reading import dump_yaml
from studies.schema.sampling import CategoricalParam, SearchSpec
from studies.schema.sections import ResourcesSpec, StorageSpec, TrackingSpec
from workers.plan import (
    ParamDef,
    SamplerConfig,
    SchedulerConfig,
    StorageConfig,
    StudyPlan,
    TrackingConfig,
)

# --------------------------------------------------------------------------------------------------
# Plan building
# --------------------------------------------------------------------------------------------------

_REPO_ROOT = Path(__file__).resolve().parents[2]
_VERSIONED = ("autonorm-studies", "torch", "ray", "optuna", "mlflow", "pydantic", "numpy")


def spec_hash(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a resolved spec (key order does not matter)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_commit(environ: Mapping[str, str]) -> str:
    # A Ray job's uploaded working dir has no .git: `autonorm-study submit` passes the commit along.
    if environ.get("AUTONORM_GIT_COMMIT"):
        return environ["AUTONORM_GIT_COMMIT"]
    from studies.provenance import git_output

    return git_output(_REPO_ROOT, "rev-parse", "HEAD", timeout=10) or "unknown"


def _versions() -> list[tuple[str, str]]:
    tags = []
    for pkg in _VERSIONED:
        try:
            tags.append((f"autonorm.version.{pkg}", metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            continue
    return tags


def _is_uri(path: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path) is not None


def resolve_storage_path(storage_path: str) -> str:
    """URIs unchanged; local paths made absolute against the current directory (Tune needs that)."""
    if _is_uri(storage_path):
        return storage_path
    return str(Path(storage_path).expanduser().resolve())


def compile_search(
    search: SearchSpec, seeds: Sequence[int]
) -> tuple[tuple[ParamDef, ...], tuple[tuple[str, tuple[Any, ...]], ...]]:
    """The search section as plan dimensions: ``(space, grid)``; exactly one of them is non-empty."""
    if search.sampler.type == "grid":
        grid = [(p.name, tuple(p.choices)) for p in search.space if isinstance(p, CategoricalParam)]
        if len(seeds) > 1:
            grid.append(("seed", tuple(seeds)))
        return (), tuple(grid)
    space = []
    for p in search.space:
        when = tuple(p.when.items())
        if isinstance(p, CategoricalParam):
            space.append(ParamDef(name=p.name, type="categorical", choices=tuple(p.choices), when=when))
        else:
            space.append(
                ParamDef(
                    name=p.name,
                    type=p.type,
                    low=p.low,
                    high=p.high,
                    log=p.log,
                    step=p.step,
                    when=when,
                )
            )
    return tuple(space), ()


def plan_settings(spec: Any) -> dict[str, Any]:
    """The :func:`build_plan` arguments every study spec carries under the same names (``resources``,
    ``retries``, ``storage_path``, ``storage``, ``tracking``, ``description``, ``hypothesis``,
    ``execution``) and its resolved ``document``."""
    keys = (
        "resources",
        "retries",
        "storage_path",
        "storage",
        "tracking",
        "description",
        "hypothesis",
    )
    # ``execution`` came later: a kind's spec class without it runs one trial per process
    return {
        **{k: getattr(spec, k) for k in keys},
        "execution": getattr(spec, "execution", None) or ExecutionSpec(stack="off"),
        "document": spec.to_document(),
    }


def build_plan(
    *,
    name: str,
    base_config: Mapping[str, Any],
    search: SearchSpec,
    document: Mapping[str, Any],
    seeds: Sequence[int] = (0,),
    resources: ResourcesSpec | None = None,
    execution: ExecutionSpec | None = None,
    retries: int = 2,
    storage_path: str = "runs",
    storage: StorageSpec | None = None,
    tracking: TrackingSpec | None = None,
    description: str = "",
    hypothesis: str | None = None,
    extra_tags: Sequence[tuple[str, str]] = (),
    extra_params: Sequence[tuple[str, str]] = (),
    extra_artifacts: Sequence[tuple[str, str]] = (),
    environ: Mapping[str, str] | None = None,
) -> StudyPlan:
    """A :class:`StudyPlan` from validated sections (shared by every study spec).

    Args:
        name: study name: Tune experiment directory and default MLflow experiment.
        base_config: the trial config every trial starts from.
        search: metric/mode, space, sampler, scheduler and budget.
        document: the resolved spec as plain data; hashed, and logged as ``spec.yaml``.
        seeds: several seeds become a grid axis (grid sampler only).
        storage_path: local (made absolute here) or ``s3://`` URI.
        tracking: ``uri`` wins; else ``$MLFLOW_TRACKING_URI``; else None (workers' sqlite default).
        environ: environment to read from (``os.environ`` by default).
    """
    env = os.environ if environ is None else environ
    resources = resources or ResourcesSpec()
    storage = storage or StorageSpec()
    tracking = tracking or TrackingSpec()
    space, grid = compile_search(search, seeds)
    sampler = search.sampler
    scheduler = search.scheduler
    tags: list[tuple[str, str]] = [
        ("autonorm.spec_hash", spec_hash(document)),
        # Every run of the study: its name (the spec's, whatever plan this is) and kind.
        *((("autonorm.study_name", str(document["name"])),) if document.get("name") else ()),
        *((("autonorm.kind", str(document["kind"])),) if document.get("kind") else ()),
        ("autonorm.git_commit", git_commit(env)),
        *_versions(),
    ]
    if description:
        tags.append(("mlflow.note.content", description))
    if hypothesis:
        tags.append(("autonorm.hypothesis", hypothesis))
    tags += list(extra_tags)
    params = [
        ("sampler", sampler.type),
        ("scheduler", scheduler.type),
        ("metric", search.metric),
        ("mode", search.mode),
        *extra_params,
    ]
    return StudyPlan(
        name=name,
        base_config=copy.deepcopy(dict(base_config)),
        space=space,
        grid=grid,
        sampler=SamplerConfig(
            type=sampler.type,
            seed=getattr(sampler, "seed", 0),
            n_startup_trials=getattr(sampler, "n_startup_trials", 10),
        ),
        scheduler=SchedulerConfig(
            type=scheduler.type,
            grace_period=getattr(scheduler, "grace_period", 1),
            reduction_factor=getattr(scheduler, "reduction_factor", 3),
        ),
        metric=search.metric,
        mode=search.mode,
        num_samples=search.num_samples,
        max_concurrent=search.max_concurrent,
        resources=resources.as_plan(),
        stack=(execution or ExecutionSpec()).members() if sampler.type == "grid" else 1,
        retries=retries,
        storage=StorageConfig(
            path=resolve_storage_path(storage_path),
            endpoint_override=storage.endpoint_override,
            region=storage.region,
        ),
        tracking=TrackingConfig(
            uri=tracking.uri or env.get("MLFLOW_TRACKING_URI") or None,
            experiment=tracking.experiment or name,
            artifact_location=tracking.artifact_location,
            final_flush_s=tracking.final_flush_s,
        ),
        tags=tuple(tags),
        params=tuple(params),
        artifacts=(("spec.yaml", dump_yaml(dict(document))), *extra_artifacts),
    )
