"""Where MLflow stores a study: tracking-URI checks, the sqlite schema created safely, HTTP limits."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


def redact_uri(uri: str) -> str:
    """``uri`` without credentials (``user:password@`` and query parameters), for messages and logs."""
    try:
        parts = urlparse(uri)
    except ValueError:
        return "<unparseable URI>"
    if not parts.netloc:
        return uri.split("?", 1)[0]
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host, query="", fragment="").geturl()


def default_tracking_uri(storage_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<absolute storage dir>/mlflow.db``: absolute, because a relative sqlite path is
    resolved against each process's working directory."""
    return f"sqlite:///{Path(storage_dir).resolve() / 'mlflow.db'}"


class MlflowUnavailable(ConnectionError):
    """Raised instead of a request while MLflow is backed off after a failure (no request is sent)."""


def check_tracking_uri(uri: str) -> None:
    """Reject a tracking URI MLflow has no tracking store for: a configuration error, not an outage.

    Raises:
        ValueError: an unknown scheme (``ftp://``), or a file store (a plain path, ``file://``), which
            MLflow 3 refuses at first use -- the study would otherwise retry it as an outage forever.
    """
    if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's profile-less Databricks shorthands
        return
    scheme = urlparse(uri).scheme.lower()
    if scheme in ("", "file"):
        raise ValueError(
            f"tracking URI {uri!r} is an MLflow file store, which MLflow 3 refuses; use "
            "sqlite:////absolute/path/mlflow.db or a tracking server (http://host:5000)"
        )
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        _tracking_store_registry.get_store_builder(uri)  # looks the scheme up; builds nothing
    except (ImportError, AttributeError):  # MLflow moved its registry: fall back to the known schemes
        base = scheme.split("+", 1)[0]
        known = {
            "http",
            "https",
            "sqlite",
            "postgresql",
            "mysql",
            "mssql",
            "databricks",
            "databricks-uc",
            "uc",
        }
        if base not in known and uri not in known:
            raise ValueError(f"tracking URI {uri!r}: MLflow has no tracking store for {scheme!r}") from None
    except Exception as exc:
        raise ValueError(
            f"tracking URI {uri!r}: MLflow has no tracking store for scheme {scheme!r} "
            "(valid: http(s)://, sqlite:////abs/path.db, postgresql://, mysql://, mssql://, databricks)"
        ) from exc


_TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"


@contextlib.contextmanager
def http_limits(timeout_s: int, retries: int, *, override: bool) -> Iterator[None]:
    """MLflow's per-request HTTP timeout and retry count for the calls inside, restored afterwards.

    MLflow reads both from the environment at every request. ``override=False`` keeps values the
    user set explicitly.
    """
    saved = {name: os.environ.get(name) for name in (_TIMEOUT_ENV, _RETRIES_ENV)}
    for name, value in ((_TIMEOUT_ENV, timeout_s), (_RETRIES_ENV, retries)):
        if override or saved[name] is None:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def rejected(error: Exception) -> bool:
    """MLflow answered and refused the request (a 4xx: bad value, run deleted), as opposed to an
    outage (no answer, a timeout, a 5xx), which :class:`MlflowTrackingCallback` backs off from."""
    status = getattr(error, "get_http_status_code", None)
    if not callable(status):
        return False
    try:
        return 400 <= int(status()) < 500
    except (TypeError, ValueError):
        return False


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urlparse(uri).path)


def ensure_sqlite_schema(uri: str, *, artifact_root: str) -> None:
    """Create an sqlite tracking database atomically (no-op for other URIs or an existing file).

    MLflow creates its schema on first use; several processes doing that at once, or a kill in the
    middle of it, left the database unusable. The schema is built in a temporary file and then
    linked into place, so the database either does not exist or is complete.
    """
    path = _sqlite_path(uri)
    if path is None or path.exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mlflow-", suffix=".db")
    os.close(fd)
    os.unlink(tmp)  # sqlite must create the file itself
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", artifact_root)
        store.engine.dispose()
        with contextlib.suppress(FileExistsError):  # someone else won the race: theirs is complete too
            os.link(tmp, path)
    finally:
        for leftover in (tmp, f"{tmp}-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested trial config -> MLflow params (``model.norm.tau -> "0.5"``), values truncated to
    MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=f"{path}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[path] = text[:6000]
    return out
