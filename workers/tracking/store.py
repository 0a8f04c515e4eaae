"""Where MLflow stores a study: tracking-URI checks, the sqlite schema created safely, HTTP limits."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def schema_template() -> Path:
    """Where an empty sqlite tracking store of the installed MLflow is kept, to be copied:
    ``$AUTONORM_DATA_DIR`` (or ``~/.cache/autonorm-studies``) ``/mlflow-schema/mlflow-<version>.db``.

    MLflow builds a new store by running every schema migration, about 2 s of CPU; every study
    with an sqlite ``tracking.uri`` starts one, and so does every test study."""
    from importlib.metadata import version

    root = os.environ.get("AUTONORM_DATA_DIR") or Path.home() / ".cache" / "autonorm-studies"
    return Path(root).expanduser() / "mlflow-schema" / f"mlflow-{version('mlflow')}.db"


def _copy_template(template: Path, target: str, artifact_root: str) -> bool:
    """``target``: a copy of ``template`` whose default experiment (id 0, the one row MLflow writes
    into a new store besides the schema version and its default workspace) points at
    ``artifact_root`` as MLflow would set it. ``False`` when there is no usable template."""
    if not template.is_file():
        return False
    import sqlite3
    import time

    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local(artifact_root), "0")
    now = int(time.time() * 1000)
    try:
        shutil.copyfile(template, target)
        with contextlib.closing(sqlite3.connect(target)) as db:
            changed = db.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                "WHERE experiment_id = 0",
                (location, now, now),
            ).rowcount
            db.commit()
    except (OSError, sqlite3.Error):
        changed = 0
    if changed != 1:  # not an MLflow store after all: build it
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        return False
    return True


def _keep_template(built: str, template: Path) -> None:
    """Keep a store MLflow just built as the template (best effort: a cache, never required)."""
    with contextlib.suppress(OSError):
        template.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=template.parent, prefix=".template-", suffix=".db")
        os.close(fd)
        try:
            shutil.copyfile(built, tmp)
            os.replace(tmp, template)  # readers see the old template or the complete new one
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def ensure_sqlite_schema(uri: str, *, artifact_root: str) -> None:
    """Create an sqlite tracking database atomically (no-op for other URIs or an existing file).

    MLflow creates its schema on first use; several processes doing that at once, or a kill in the
    middle of it, left the database unusable. The schema is built in a temporary file and then
    linked into place, so the database either does not exist or is complete. The first build of an
    MLflow version is kept (:func:`schema_template`); later stores are copies of it with their own
    default experiment, a few milliseconds instead of a run of every migration.
    """
    path = _sqlite_path(uri)
    if path is None or path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mlflow-", suffix=".db")
    os.close(fd)
    os.unlink(tmp)  # sqlite must create the file itself
    template = schema_template()
    try:
        if not _copy_template(template, tmp, artifact_root):
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            store = SqlAlchemyStore(f"sqlite:///{tmp}", artifact_root)
            store.engine.dispose()
            _keep_template(tmp, template)
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
