"""What a phase needs decided and checked before Tune starts: resources, the MLflow URI and artifact
location, and ASHA's ``max_t``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from workers.errors import ResourceError
from workers.plan import StudyPlan
from workers.storage import ResolvedStorage
from workers.tracking.store import default_tracking_uri

__all__ = ["check_resources", "precheck_local_resources"]


def _max_epochs(plan: StudyPlan) -> int:
    """Upper bound on reports per trial, for ASHA's ``max_t``."""
    training = plan.base_config.get("training", {})
    if training.get("budget") == "updates":
        return 10**6  # epoch count depends on the data; rungs past the end are never reached
    epochs = [int(training.get("epochs", 10))]
    for param in plan.space:
        if param.name == "training.epochs" and param.high is not None:
            epochs.append(int(param.high))
        if param.name == "training.epochs" and param.choices:
            epochs.extend(int(c) for c in param.choices)
    for name, values in plan.grid:
        if name == "training.epochs":
            epochs.extend(int(v) for v in values)
    return max(epochs)


def check_resources(
    plan: StudyPlan, have: Mapping[str, float] | None = None, *, partial: bool = False
) -> None:
    """Refuse a plan whose trial asks for more than the whole cluster has (Tune would wait forever).

    ``have``: the cluster's resources (Ray's names, ``CPU``/``GPU``); ``None`` asks the connected
    cluster. ``partial``: ``have`` lists only what is known, resources missing from it are not checked. A study that starts its own local cluster checks the predicted resources
    (:func:`workers.session.local_cluster_resources`) before starting it, so a bad request fails in
    a second; resources it cannot predict (GPUs Ray would detect, custom ones) are checked again once
    the cluster is up. Set ``AUTONORM_ALLOW_PENDING_RESOURCES=1`` on an autoscaling cluster whose
    nodes appear on demand.

    Raises:
        ResourceError: naming the resource, what a trial asks and what the cluster has.
    """
    if os.environ.get("AUTONORM_ALLOW_PENDING_RESOURCES") == "1":
        return
    if have is None:
        import ray

        have = ray.cluster_resources()
    names = {"cpu": "CPU", "gpu": "GPU"}
    for key, amount in plan.resources:
        name = names.get(key, key)
        if partial and name not in have:
            continue  # not predicted: checked once the cluster is up
        total = float(have.get(name, 0.0))
        if amount > 0 and amount > total:
            raise ResourceError(
                f"resources.{key}: a trial of {plan.name!r} asks for {amount:g} {name}, but the "
                f"Ray cluster has {total:g} in all, so no trial could ever start. Lower resources.{key}, or join a "
                "larger cluster (RAY_ADDRESS); on an autoscaling cluster set AUTONORM_ALLOW_PENDING_RESOURCES=1."
            )


def precheck_local_resources(
    plans: Sequence[StudyPlan], address: str | None, init_kwargs: Mapping[str, Any] | None
) -> None:
    """Before starting a local cluster, refuse plans it could never run (see :func:`check_resources`)."""
    from workers.session import local_cluster_resources

    predicted = local_cluster_resources(address, init_kwargs)
    if predicted is None:
        return
    for plan in plans:
        check_resources(plan, predicted, partial=True)


def _tracking_uri(plan: StudyPlan, storage: ResolvedStorage) -> str:
    """Spec URI, else ``MLFLOW_TRACKING_URI`` (MLflow's convention), else sqlite beside the runs."""
    if plan.tracking.uri:
        uri = plan.tracking.uri
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    elif storage.is_local:
        return default_tracking_uri(storage.storage_path)
    else:
        raise ValueError(
            f"storage {storage.uri} is remote, so there is no local default for MLflow: set tracking.uri "
            "or MLFLOW_TRACKING_URI (e.g. http://mlflow:5000)"
        )
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        raise ValueError(
            f"tracking URI {uri!r} is a relative sqlite path, which every Ray worker would resolve "
            "against its own working directory; use sqlite:////absolute/path/mlflow.db"
        )
    return uri


def _artifact_location(plan: StudyPlan, storage: ResolvedStorage, tracking_uri: str) -> str | None:
    if plan.tracking.artifact_location:
        return plan.tracking.artifact_location
    if tracking_uri.startswith("sqlite:") and storage.is_local:
        # MLflow's sqlite default would be ./mlruns in whatever directory the driver runs from.
        return f"file://{storage.storage_path}/mlartifacts"
    return None  # a tracking server decides (proxied artifacts)
