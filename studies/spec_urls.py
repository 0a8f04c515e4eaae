"""Re-export of :mod:`studies.spec.urls` at its old path (imports only)."""

from studies.spec.urls import (
    ArtifactLocation,
    EndpointURL,
    StoragePath,
    TrackingURI,
    artifact_location_problem,
    endpoint_problem,
    redact_text,
    redact_url,
    storage_path_problem,
    tracking_uri_problem,
)

__all__ = [
    "ArtifactLocation",
    "EndpointURL",
    "StoragePath",
    "TrackingURI",
    "artifact_location_problem",
    "endpoint_problem",
    "redact_text",
    "redact_url",
    "storage_path_problem",
    "tracking_uri_problem",
]
