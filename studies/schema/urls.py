"""URL-like spec fields: one validator for storage paths, tracking URIs, artifact roots and S3 endpoints.

Every check here refuses what a study could not run (a scheme the workers have no filesystem or
MLflow store for, a bucket-less ``s3:///prefix``, a relative sqlite file) and anything carrying
credentials (``s3://KEY:SECRET@bucket``, ``http://user:pass@host``, a query string). Keys come from
the environment only (see ``docs/architecture.md``). A refused value is never echoed: messages show
it through :func:`redact_url`, and :func:`redact_text` scrubs free text (``--set`` sources, pydantic
messages) the same way. Pure Python, no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator

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

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*|\[[0-9A-Fa-f:.]+\])$"
)
_MAX_LEN = 4096

TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "databricks")
"""MLflow tracking stores a study can use (``postgresql+psycopg2`` etc. count as ``postgresql``)."""


def redact_url(value: str) -> str:
    """``value`` with user info (and any query or fragment) replaced by ``***``; safe to print."""
    out = _CONTROL.sub("?", redact_text(value))
    return out if len(out) <= 200 else out[:200] + "..."


def redact_text(text: str) -> str:
    """Free text (a ``--set`` source, an error message) with every URL's user info and query hidden.

    For each ``scheme://`` the rest of its whitespace-free run is scrubbed: everything up to the last
    ``@`` becomes ``***`` (a secret may hold ``/``), and a ``?`` or ``#`` hides what follows. Linear in
    the text (no backtracking regex: error messages can quote long values).
    """
    if "://" not in text:
        return text
    out: list[str] = []
    pos = 0
    n = len(text)
    i = text.find("://")
    while i >= 0:
        end = i + 3
        while end < n and not text[end].isspace():
            end += 1
        run = text[i + 3 : end]
        at = run.rfind("@")
        if at >= 0:
            run = "***" + run[at:]
        cut = min((k for k in (run.find("?"), run.find("#")) if k >= 0), default=-1)
        if cut >= 0:
            run = run[:cut] + "?***"
        out.append(text[pos:i] + "://" + run)
        pos = end
        i = text.find("://", end)
    out.append(text[pos:])
    return "".join(out)


def _split(value: str) -> tuple[str, str, str] | None:
    """``(scheme, authority, rest)`` of ``scheme://authority/rest``; None for anything without ``//``."""
    m = _SCHEME.match(value)
    if m is None or not value[m.end() :].startswith("//"):
        return None
    after = value[m.end() + 2 :]
    # The authority ends at the first '/', '?' or '#' that comes after the last '@'.
    at = after.rfind("@")
    start = at + 1 if at >= 0 else 0
    ends = [i for i in (after.find(c, start) for c in "/?#") if i >= 0]
    end = min(ends) if ends else len(after)
    return m.group(1).lower(), after[:end], after[end:]


def _common(value: str) -> str | None:
    if not value.strip():
        return "must not be empty"
    if len(value) > _MAX_LEN:
        return f"is {len(value)} characters long (at most {_MAX_LEN})"
    if _CONTROL.search(value):
        return "contains control characters (a newline, a tab, a NUL byte, ...)"
    parts = _split(value)
    if parts is not None and "@" in value[len(parts[0]) + 3 :]:
        return (
            f"{redact_url(value)} carries user info (credentials); give keys through the environment "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_USERNAME/PASSWORD, PGPASSWORD, ...), "
            "never in the spec"
        )
    if parts is not None and ("?" in parts[2] or "#" in parts[2]):
        return f"{redact_url(value)} has a query or fragment; settings and keys come from the environment"
    return None


def _after_common(check: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``check`` after the checks every URL field shares (:func:`_common`): the first problem found."""

    @functools.wraps(check)
    def problem(value: str) -> str | None:
        return _common(value) or check(value)

    return problem


def _s3(value: str, parts: tuple[str, str, str]) -> str | None:
    _, bucket, _ = parts
    if not bucket:
        return f"{redact_url(value)} names no bucket (expected s3://bucket/prefix)"
    if not _BUCKET.match(bucket):
        return f"{redact_url(value)}: {bucket!r} is not a bucket name (expected s3://bucket/prefix)"
    return None


@_after_common
def storage_path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``storage_path`` (a local directory, ``file:///abs`` or ``s3://bucket/prefix``)."""
    parts = _split(value)
    if parts is None:
        m = _SCHEME.match(value)
        if (
            m is not None
            and len(m.group(1)) > 1
            and m.group(1).lower() in {"s3", "gs", "gcs", "http", "https"}
        ):
            return f"{redact_url(value)} looks like a URI without '//' (expected s3://bucket/prefix)"
        return None  # a local path
    scheme = parts[0]
    if scheme == "s3":
        return _s3(value, parts)
    if scheme == "file":
        if parts[1] or not parts[2].startswith("/"):
            return f"{redact_url(value)}: a file URI needs an absolute path (file:///abs/dir)"
        return None
    return (
        f"scheme {scheme!r} of {redact_url(value)} is not supported: use a local path or s3://bucket/prefix"
    )


@_after_common
def tracking_uri_problem(value: str) -> str | None:
    """Why ``value`` cannot be an MLflow tracking URI (see :data:`TRACKING_SCHEMES`)."""
    if value == "databricks":
        return None  # the default profile
    m = _SCHEME.match(value)
    scheme = m.group(1).lower() if m else ""
    base = scheme.split("+", 1)[0]
    if base not in TRACKING_SCHEMES or ("+" in scheme and base not in ("postgresql", "mysql")):
        what = f"scheme {scheme!r}" if scheme else "a path without a scheme"
        return (
            f"{what} ({redact_url(value)}) is not a tracking store MLflow 3 runs "
            f"(file stores are refused); valid schemes: {', '.join(TRACKING_SCHEMES)}"
        )
    if base == "databricks":
        return None  # `databricks` or `databricks://profile`
    parts = _split(value)
    if parts is None:
        return f"{redact_url(value)} is not a URI (expected {scheme}://...)"
    if base == "sqlite":
        if parts[1] or not parts[2].startswith("//"):
            return (
                f"{redact_url(value)}: sqlite needs an absolute database path, sqlite:////abs/path/mlflow.db "
                "(a relative one would depend on each worker's current directory)"
            )
        return None
    if not parts[1] or not _HOST.match(parts[1].rsplit(":", 1)[0] if parts[1].count(":") == 1 else parts[1]):
        return f"{redact_url(value)} names no valid host"
    return None


@_after_common
def artifact_location_problem(value: str) -> str | None:
    """Why ``value`` cannot be an artifact root (``s3://bucket/prefix``, a path, ``file:///abs``, ``mlflow-artifacts:``)."""
    m = _SCHEME.match(value)
    if m is not None and m.group(1).lower() == "mlflow-artifacts":
        return None
    return storage_path_problem(value)


@_after_common
def endpoint_problem(value: str) -> str | None:
    """Why ``value`` cannot be an S3 ``endpoint_override`` (``http(s)://host[:port]``)."""
    parts = _split(value)
    if parts is None or parts[0] not in ("http", "https"):
        return f"{redact_url(value)} must be http://host[:port] or https://host[:port]"
    host, _, port = parts[1].rpartition(":") if parts[1].count(":") == 1 else (parts[1], "", "")
    if not host or not _HOST.match(host) or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        return f"{redact_url(value)} names no valid host[:port]"
    if parts[2] not in ("", "/"):
        return f"{redact_url(value)}: an endpoint has no path"
    return None


def _validator(check: Callable[[str], str | None]) -> Callable[[str], str]:
    def validate(value: str) -> str:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return validate


StoragePath = Annotated[str, AfterValidator(_validator(storage_path_problem))]
"""A ``storage_path``: local directory (relative: to the cwd), ``file:///abs`` or ``s3://bucket/prefix``."""
TrackingURI = Annotated[str, AfterValidator(_validator(tracking_uri_problem))]
ArtifactLocation = Annotated[str, AfterValidator(_validator(artifact_location_problem))]
EndpointURL = Annotated[str, AfterValidator(_validator(endpoint_problem))]
