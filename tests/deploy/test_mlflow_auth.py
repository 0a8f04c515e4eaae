"""The MLflow server as deploy/compose.yaml configures it really refuses strangers.

Runs ``mlflow server`` with the flags from compose.yaml and the shipped basic_auth.ini against the
test PostgreSQL and SeaweedFS, and checks the answers over HTTP.
"""

from __future__ import annotations

import base64
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.exposure import interpolate
from tests.services import (
    MlflowServer,
    PostgresServer,
    S3Server,
    create_database,
    free_port,
    start_mlflow_server,
)

pytestmark = pytest.mark.services

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ADMIN_PASSWORD = secrets.token_urlsafe(16)


PORT = free_port()


def _compose_server_flags() -> list[str]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    command = [interpolate(str(c)) for c in compose["services"]["mlflow"]["command"]]
    # Host and port are where this test listens; compose publishes container port 5000 on
    # 127.0.0.1:5000, here the server listens on 127.0.0.1:PORT directly, so the allowed Host
    # names get PORT. Everything else is exactly what compose runs.
    return [c.replace(":5000", f":{PORT}") for c in command[1:] if not c.startswith(("--host", "--port"))]


@pytest.fixture(scope="module")
def auth_server(
    services_root: Path, postgres_server: PostgresServer, s3_server: S3Server
) -> Iterator[MlflowServer]:
    directory = services_root / "mlflow-auth"
    directory.mkdir()
    server = start_mlflow_server(
        create_database(postgres_server, "mlflow_auth"),
        f"s3://{s3_server.bucket}/auth-artifacts",
        {
            **s3_server.env(),
            "MLFLOW_AUTH_CONFIG_PATH": str(DEPLOY / "mlflow" / "basic_auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        },
        directory=directory,
        extra_args=_compose_server_flags(),
        port=PORT,
    )
    try:
        yield server
    finally:
        server.handle.stop()


def _status(server: MlflowServer, *, user: str | None = None, password: str = "", host: str = "") -> int:
    headers = {"Host": host or f"localhost:{PORT}"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(
        f"{server.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=1", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_compose_mlflow_flags_enable_auth_and_host_checks() -> None:
    flags = _compose_server_flags()
    assert "--app-name=basic-auth" in flags
    assert any(f.startswith("--allowed-hosts=") and "*" not in f for f in flags)


def test_anonymous_and_wrong_password_are_refused(auth_server: MlflowServer) -> None:
    assert _status(auth_server) == 401
    assert _status(auth_server, user="admin", password=ADMIN_PASSWORD + "x") == 401
    assert _status(auth_server, user="nobody", password=ADMIN_PASSWORD) == 401
    assert _status(auth_server, user="admin", password=ADMIN_PASSWORD) == 200


def test_unlisted_host_header_is_refused(auth_server: MlflowServer) -> None:
    assert _status(auth_server, user="admin", password=ADMIN_PASSWORD, host=f"127.0.0.1:{PORT}") == 200
    assert _status(auth_server, user="admin", password=ADMIN_PASSWORD, host=f"attacker.example:{PORT}") == 403


def test_authenticated_client_logs_artifacts_to_s3(
    auth_server: MlflowServer, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    for key in [k for k in os.environ if k.startswith(("AWS_", "MLFLOW_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    client = MlflowClient(tracking_uri=auth_server.tracking_uri)
    run = client.create_run(client.create_experiment(f"auth-{secrets.token_hex(4)}"))
    client.log_text(run.info.run_id, "ok", "probe.txt")
    client.set_terminated(run.info.run_id)
    keys = s3_server.list_keys("auth-artifacts/")
    assert any(k.endswith(f"{run.info.run_id}/artifacts/probe.txt") for k in keys)
