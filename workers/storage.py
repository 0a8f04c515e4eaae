"""Where a study keeps its Tune state: a local directory or an S3(-compatible) bucket.

Ray Tune takes a path plus an optional ``pyarrow`` filesystem. For S3 we build the filesystem
ourselves so that an ``endpoint_override`` (SeaweedFS, MinIO, ...) and path-style addressing work;
credentials come only from the environment, never from a spec that ends up in MLflow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from workers.plan import StorageConfig

if TYPE_CHECKING:
    import pyarrow.fs

__all__ = ["ResolvedStorage", "resolve_storage"]


@dataclass(frozen=True)
class ResolvedStorage:
    """A storage location in the form Tune wants it.

    Attributes:
        storage_path: what ``RunConfig(storage_path=...)`` gets: an absolute local directory, or
            ``bucket/prefix`` (no scheme) when ``filesystem`` is set.
        filesystem: ``pyarrow`` filesystem for remote storage, ``None`` for local directories.
        uri: the user-facing location (``/abs/dir`` or ``s3://bucket/prefix``), for messages.
    """

    storage_path: str
    filesystem: pyarrow.fs.FileSystem | None
    uri: str

    @property
    def is_local(self) -> bool:
        return self.filesystem is None

    def experiment_path(self, name: str) -> str:
        """The experiment directory Tune writes for study ``name`` (what ``can_restore`` checks)."""
        return f"{self.storage_path.rstrip('/')}/{name}"

    def experiment_uri(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"


def resolve_storage(
    config: StorageConfig, *, base_dir: str | os.PathLike[str] | None = None
) -> ResolvedStorage:
    """Turn a :class:`StorageConfig` into a Tune storage path (+ filesystem for S3).

    Args:
        config: the plan's storage section.
        base_dir: directory a relative local path is resolved against (the current directory when
            ``None``). Resolved once, in the driver, because Tune workers run elsewhere.

    Raises:
        ValueError: for a scheme other than a local path or ``s3://``.
    """
    parsed = urlparse(config.path)
    if parsed.scheme in ("", "file"):
        raw = parsed.path if parsed.scheme == "file" else config.path
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = Path(base_dir or os.getcwd()) / path
        path = path.resolve()
        return ResolvedStorage(storage_path=str(path), filesystem=None, uri=str(path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage path {config.path!r} names no bucket (expected s3://bucket/prefix)")
        bucket_path = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return ResolvedStorage(
            storage_path=bucket_path,
            filesystem=_s3_filesystem(config),
            uri=f"s3://{bucket_path}",
        )
    raise ValueError(
        f"unsupported storage path scheme {parsed.scheme!r} in {config.path!r}; valid: a local path, file://, s3://"
    )


def _s3_filesystem(config: StorageConfig) -> pyarrow.fs.FileSystem:
    import pyarrow.fs

    endpoint = config.endpoint_override
    scheme = "https"
    if endpoint is not None:
        parsed = urlparse(endpoint)
        if parsed.scheme:
            scheme = parsed.scheme
            endpoint = parsed.netloc
    # No explicit keys: pyarrow resolves them in every process that unpickles this filesystem (AWS
    # default chain, environment first). Explicit keys would be pickled along with it, and Tune
    # pickles the run config into tuner.pkl and the searcher state in the study's own S3 prefix:
    # anyone able to read the runs would get the write keys.
    return pyarrow.fs.S3FileSystem(
        region=config.region,
        endpoint_override=endpoint,
        scheme=scheme,
        # S3-compatible servers on a bare host:port need path-style requests.
        force_virtual_addressing=False,
    )
