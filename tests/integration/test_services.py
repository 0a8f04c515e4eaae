"""The service fixtures are the real thing: data goes where a deployment would put it.

Each test checks the far end directly (PostgreSQL tables with psycopg2, the bucket with boto3,
listening sockets with psutil) instead of trusting the client that wrote it.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import psycopg2
import pytest
from botocore.exceptions import ClientError

from tests.services import (
    MlflowServer,
    PostgresServer,
    RayNode,
    S3Server,
    listening_addresses,
    start_seaweedfs,
)

pytestmark = pytest.mark.services


def _pg_query(
    server: PostgresServer, database: str, sql: str, args: tuple[object, ...]
) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(host=server.host, port=server.port, user=server.user, dbname=database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_mlflow_run_is_stored_in_postgres(
    mlflow_server: MlflowServer, postgres_server: PostgresServer, clean_env: None
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    experiment_id = client.create_experiment(f"svc-{uuid.uuid4().hex[:8]}")
    run = client.create_run(experiment_id, tags={"autonorm.role": "probe"})
    client.log_param(run.info.run_id, "lr", "0.003")
    client.log_metric(run.info.run_id, "val_loss", 0.25, step=3)
    client.set_terminated(run.info.run_id, status="FINISHED")

    rows = _pg_query(
        postgres_server,
        "mlflow",
        "SELECT status, experiment_id FROM runs WHERE run_uuid = %s",
        (run.info.run_id,),
    )
    assert rows == [("FINISHED", int(experiment_id))]
    params = _pg_query(
        postgres_server, "mlflow", "SELECT key, value FROM params WHERE run_uuid = %s", (run.info.run_id,)
    )
    assert params == [("lr", "0.003")]
    metrics = _pg_query(
        postgres_server,
        "mlflow",
        "SELECT key, value, step FROM metrics WHERE run_uuid = %s",
        (run.info.run_id,),
    )
    assert metrics == [("val_loss", 0.25, 3)]
    tags = {
        row[0]: row[1]
        for row in _pg_query(
            postgres_server, "mlflow", "SELECT key, value FROM tags WHERE run_uuid = %s", (run.info.run_id,)
        )
    }
    assert tags["autonorm.role"] == "probe"


def test_mlflow_artifact_is_an_object_in_the_bucket(
    mlflow_server: MlflowServer, s3_server: S3Server, clean_env: None
) -> None:
    from mlflow import MlflowClient

    # The client holds no S3 credentials (clean_env): the server proxies the upload.
    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    experiment_id = client.create_experiment(f"svc-art-{uuid.uuid4().hex[:8]}")
    run = client.create_run(experiment_id)
    payload = f"artifact for {run.info.run_id}"
    client.log_text(run.info.run_id, payload, "notes/hello.txt")
    client.set_terminated(run.info.run_id)

    assert client.get_run(run.info.run_id).info.artifact_uri.startswith("mlflow-artifacts:")
    keys = [
        k
        for k in s3_server.list_keys("mlflow-artifacts/")
        if k.endswith(f"{run.info.run_id}/artifacts/notes/hello.txt")
    ]
    assert len(keys) == 1
    body = s3_server.boto3_client().get_object(Bucket=s3_server.bucket, Key=keys[0])["Body"].read()
    assert body.decode() == payload
    # And it reads back through the server.
    assert (
        client.download_artifacts(run.info.run_id, "notes/hello.txt")
        and Path(client.download_artifacts(run.info.run_id, "notes/hello.txt")).read_text() == payload
    )


def test_s3_server_rejects_wrong_and_missing_credentials(s3_server: S3Server) -> None:
    from botocore import UNSIGNED
    from botocore.config import Config

    good = s3_server.boto3_client()
    key = f"auth-probe/{uuid.uuid4().hex}"
    good.put_object(Bucket=s3_server.bucket, Key=key, Body=b"secret")

    codes = []
    for access_key, secret_key in (
        (s3_server.access_key, s3_server.secret_key + "x"),
        ("AKNOTAKEY000000", s3_server.secret_key),
    ):
        with pytest.raises(ClientError) as info:
            s3_server.boto3_client(access_key=access_key, secret_key=secret_key).get_object(
                Bucket=s3_server.bucket, Key=key
            )
        codes.append(info.value.response["Error"]["Code"])
    assert codes[0] in ("SignatureDoesNotMatch", "AccessDenied")
    assert codes[1] in ("InvalidAccessKeyId", "AccessDenied", "SignatureDoesNotMatch")

    import boto3

    anonymous = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name=s3_server.region,
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
    )
    with pytest.raises(ClientError):
        anonymous.get_object(Bucket=s3_server.bucket, Key=key)
    with pytest.raises(ClientError):
        anonymous.put_object(Bucket=s3_server.bucket, Key=key + "-anon", Body=b"x")
    assert good.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"secret"


def test_ray_head_runs_a_submitted_job(ray_head: RayNode, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    script = tmp_path / "job.py"
    script.write_text(
        "import ray\n"
        "ray.init()\n"
        "@ray.remote\n"
        "def square(x):\n"
        "    return x * x\n"
        f"print('RESULT', sum(ray.get([square.remote(i) for i in range(5)])), '{marker}')\n"
    )
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "job",
            "submit",
            "--address",
            ray_head.dashboard_url,
            "--working-dir",
            str(tmp_path),
            "--",
            "python",
            "job.py",
        ],
        env=ray_head.client_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"RESULT 30 {marker}" in result.stdout


def test_ray_head_requires_the_auth_token(ray_head: RayNode) -> None:
    env = ray_head.client_env()
    env["RAY_AUTH_TOKEN"] = "0" * 64  # a well-formed but wrong token
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "job", "list", "--address", ray_head.dashboard_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    ok = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "job", "list", "--address", ray_head.dashboard_url],
        env=ray_head.client_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_ray_head_listens_on_loopback_only(ray_head: RayNode) -> None:
    listeners = listening_addresses(ray_head.handle.pids())
    ports = {port for _, _, port in listeners}
    assert int(ray_head.address.rsplit(":", 1)[1]) in ports
    assert int(ray_head.dashboard_url.rsplit(":", 1)[1]) in ports
    assert {ip for _, ip, _ in listeners} == {"127.0.0.1"}


def test_services_listen_on_loopback_only(
    postgres_server: PostgresServer, s3_server: S3Server, mlflow_server: MlflowServer
) -> None:
    for handle in (postgres_server.handle, s3_server.handle, mlflow_server.handle):
        listeners = listening_addresses(handle.pids())
        assert listeners, handle.name
        assert {ip for _, ip, _ in listeners} == {"127.0.0.1"}, (handle.name, listeners)


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    # A second, private SeaweedFS: the session one must survive this test.
    with start_seaweedfs(
        tmp_path / "s3", access_key="AKSTOPTEST", secret_key="stop-test-secret"
    ).handle as handle:
        pids = handle.pids()
        assert len(pids) >= 1
    assert not [
        pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    handle.stop()  # idempotent


def test_services_are_not_children_of_the_test_process(
    postgres_server: PostgresServer, s3_server: S3Server, mlflow_server: MlflowServer
) -> None:
    # Code that stops "all my children" (a local Ray shutdown in this process) must not hit them.
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    for handle in (postgres_server.handle, s3_server.handle, mlflow_server.handle):
        assert handle.alive()
        assert not set(handle.pids()) & children, handle.name


def test_seaweedfs_taking_a_port_someone_took_meanwhile_starts_again_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ports are free when chosen and bound by weed a moment later; another process can take one in
    # between (seen in CI: "Filer listener error: ... bind: address already in use"). Here the filer's
    # port is taken on purpose for the first start only.
    import secrets
    import socket

    from tests import services

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    chosen: list[list[int]] = []
    real = services._free_ports

    def first_one_taken(count: int) -> list[int]:
        ports = real(count)
        if not chosen:
            ports[4] = taken.getsockname()[1]  # filer.port
        chosen.append(ports)
        return ports

    monkeypatch.setattr(services, "_free_ports", first_one_taken)
    server = services.start_seaweedfs(
        tmp_path / "s3", access_key=f"AK{secrets.token_hex(8).upper()}", secret_key=secrets.token_urlsafe(24)
    )
    try:
        assert len(chosen) == 2  # refused once, started again on other ports
        client = server.boto3_client()
        client.put_object(Bucket=server.bucket, Key="k", Body=b"v")
        assert client.get_object(Bucket=server.bucket, Key="k")["Body"].read() == b"v"
    finally:
        server.handle.stop()
        taken.close()
