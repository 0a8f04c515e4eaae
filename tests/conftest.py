"""Shared fixtures: real services, started lazily (only by tests that request them), always stopped.

Session-scoped, so one PostgreSQL / SeaweedFS / MLflow server / Ray head serves every test of a run
that asks for it; each test isolates itself by unique names (experiment, bucket prefix, job id).

- ``pg_url``: ``postgresql+psycopg2://`` URL of a database of its own on a private PostgreSQL.
- ``postgres_server``: the :class:`tests.services.PostgresServer` behind it (to create databases).
- ``s3_server``: :class:`tests.services.S3Server` (``endpoint``, ``bucket``, ``access_key``,
  ``secret_key``, ``boto3_client()``, ``list_keys()``) on SeaweedFS with random keys.
- ``mlflow_server``: :class:`tests.services.MlflowServer`, ``tracking_uri`` backed by PostgreSQL,
  artifacts proxied to ``s3://<bucket>/mlflow-artifacts``; clients need no S3 keys.
- ``ray_head``: :class:`tests.services.RayNode` (``address``, ``dashboard_url``, ``env`` with
  ``RAY_AUTH_TOKEN``; ``client_env()`` merges it into ``os.environ`` for subprocesses).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import (
    MlflowServer,
    PostgresServer,
    RayNode,
    S3Server,
    ServiceHandle,
    create_database,
    start_mlflow_server,
    start_postgres,
    start_ray_head,
    start_seaweedfs,
)

# Stopped in fixture teardown; this is only the safety net for an interpreter that exits without
# running finalizers (e.g. a second Ctrl-C), so no service outlives the test run.
_STARTED: list[ServiceHandle] = []


@atexit.register
def _stop_leftovers() -> None:
    for handle in reversed(_STARTED):
        handle.stop()


def short_tmp_dir(prefix: str) -> Path:
    """A fresh directory directly under /tmp.

    Ray's Unix socket paths must stay under 107 bytes, and a PostgreSQL server running as another
    user (tests as root) must be able to enter it: pytest's ``tmp_path`` is neither short nor
    world-searchable.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def services_root() -> Iterator[Path]:
    root = short_tmp_dir("an_svc_")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server(services_root: Path) -> Iterator[PostgresServer]:
    _, server = start_postgres(services_root / "pg")
    _STARTED.append(server.handle)
    try:
        yield server
    finally:
        server.handle.stop()


@pytest.fixture(scope="session")
def pg_url(postgres_server: PostgresServer) -> str:
    return create_database(postgres_server, "autonorm_test")


@pytest.fixture(scope="session")
def s3_server(services_root: Path) -> Iterator[S3Server]:
    server = start_seaweedfs(
        services_root / "s3",
        access_key=f"AK{secrets.token_hex(8).upper()}",
        secret_key=secrets.token_urlsafe(24),
        bucket="autonorm-test",
    )
    _STARTED.append(server.handle)
    try:
        yield server
    finally:
        server.handle.stop()


@pytest.fixture(scope="session")
def mlflow_server(
    services_root: Path, postgres_server: PostgresServer, s3_server: S3Server
) -> Iterator[MlflowServer]:
    server = start_mlflow_server(
        create_database(postgres_server, "mlflow"),
        f"s3://{s3_server.bucket}/mlflow-artifacts",
        s3_server.env(),
        directory=services_root / "mlflow",
    )
    _STARTED.append(server.handle)
    try:
        yield server
    finally:
        server.handle.stop()


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayNode]:
    root = short_tmp_dir("rt_")
    head = start_ray_head(root, num_cpus=2)
    _STARTED.append(head.handle)
    try:
        yield head
    finally:
        head.handle.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop credentials and service addresses the developer's shell may carry into a test."""
    for key in list(os.environ):
        if key.startswith(("AWS_", "RAY_", "MLFLOW_")):
            monkeypatch.delenv(key, raising=False)
