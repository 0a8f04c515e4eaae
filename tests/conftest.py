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
- ``local_ray``: the ONE embedded Ray cluster (``ray.init`` on loopback) of this pytest process, shared
  by every in-process study test: ``workers.session.ray_session`` joins a cluster that is already
  initialised, so a study run by a test costs no Ray start. A test that needs a cluster of its own
  (shutdown, its own resources, environment its workers inherit) is marked ``own_ray``: the shared
  cluster is stopped before it, and such tests run last so that happens once.

At the end pytest prints the time per test directory and how many Ray clusters the run started
(``gcs_server`` processes seen that carry this run's marker in their environment: in-process,
subprocess drivers and ``ray start`` nodes alike), next to ``--durations``.

Order: the longest test files first, by the per-file times in ``tests/durations.json`` (pytest-xdist's
``--dist loadfile`` gives whole files to whichever worker is free, so the two workers end together);
refresh it after a change that moves times a lot with ``AUTONORM_TEST_DURATIONS=write bash
scripts/test.sh`` (written only by a run that passed). A file it does not know yet counts as 5 s.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Every study this suite runs (in-process, subprocess drivers, jobs) writes its finished trials to
# files of two (workers.tune_state; 25 by default): the restores, the fault paths and the readers
# all go through the merge of those files with Tune's snapshot.
os.environ.setdefault("AUTONORM_TUNE_TRIALS_PER_FILE", "2")


def _install_test_kind() -> None:
    """Install ``tests/kinds_plugin`` (a fourth study kind in a package of its own, found through the
    ``autonorm_studies.kinds`` entry point) into this environment, before anything imports the kind
    registry: the contract suite then runs over it like over the shipped kinds. Once per environment
    (a later run finds the entry point); a lock keeps the two xdist workers from installing at once."""
    import fcntl
    import importlib.metadata
    import site
    import subprocess
    import sys
    import sysconfig

    package = Path(__file__).resolve().parent / "kinds_plugin"

    def installed() -> bool:
        # Installed from this checkout: an editable install made by another checkout's run (a git
        # worktree sharing this environment) points at that checkout's copy, which may be gone.
        try:
            dist = importlib.metadata.distribution("autonorm_seedspread")
        except importlib.metadata.PackageNotFoundError:
            return False
        source = json.loads(dist.read_text("direct_url.json") or "{}").get("url")
        return source == package.as_uri() and any(
            ep.name == "seedspread" and ep.group == "autonorm_studies.kinds" for ep in dist.entry_points
        )

    if installed():
        return
    with open(Path(sys.prefix) / ".autonorm-test-kind.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        importlib.invalidate_caches()
        if not installed():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--no-build-isolation",
                    "-e",
                    str(package),
                ],
                check=True,
                timeout=300,
            )
            importlib.invalidate_caches()
    # This process started before the install: read the new .pth (the editable path) now, and put
    # the package first on the path (an editable finder this process loaded earlier may map the
    # name to another checkout's copy).
    site.addsitedir(sysconfig.get_paths()["purelib"])
    sys.path.insert(0, str(package))
    if not installed():
        raise RuntimeError(f"installing {package} registered no 'autonorm_studies.kinds' entry point")


_install_test_kind()

from tests.services import (  # noqa: E402
    MlflowServer,
    PostgresServer,
    RayNode,
    S3Server,
    ServiceHandle,
    create_database,
    embedded_ray,
    ray_env,
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


# ---- one shared embedded Ray cluster -------------------------------------------------------------------


class SharedRay:
    """The embedded Ray cluster every in-process study test of this process shares.

    Started on first use, stopped before an ``own_ray`` test and at the end of the run (by PID, through
    :func:`tests.services.embedded_ray`). ``starts`` counts how often it had to start.
    """

    def __init__(self) -> None:
        self._cluster: contextlib.AbstractContextManager[None] | None = None
        self.starts = 0

    def ensure(self) -> None:
        import ray

        if ray.is_initialized():
            return
        cluster = embedded_ray("rt_shared_", ray_env())
        cluster.__enter__()
        self._cluster = cluster
        self.starts += 1

    def stop(self) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.__exit__(None, None, None)


_SHARED_RAY = SharedRay()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """The shared local Ray cluster (see :class:`SharedRay`); studies run in the test join it."""
    _SHARED_RAY.ensure()
    yield


@pytest.fixture(autouse=True)
def _own_ray_isolation(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("own_ray") is not None:
        _SHARED_RAY.stop()
        import ray

        assert not ray.is_initialized(), "an own_ray test found a Ray cluster it did not start"


DURATIONS = Path(__file__).with_name("durations.json")
#: A test file missing from ``tests/durations.json`` (new since it was written) counts as this many seconds.
_UNKNOWN_FILE_S = 5.0


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest file first (xdist's loadfile hands whole files to whichever worker is free: starting
    # with the longest ones keeps the two workers' loads even, so the run ends when the work does),
    # from the per-file times a full run measured (tests/durations.json). Within a file, and for
    # files of equal weight, the collection order stays (stable sort). Tests that need their own
    # cluster last: the shared cluster then stops once instead of once per such test.
    seconds: dict[str, float] = {}
    if DURATIONS.exists():
        seconds = json.loads(DURATIONS.read_text())
    items.sort(
        key=lambda item: (
            item.get_closest_marker("own_ray") is not None,
            -seconds.get(_file_of(item), _UNKNOWN_FILE_S),
        )
    )


# ---- what the run cost: time per test directory, Ray clusters started -------------------------------

_RUN_MARK = "AUTONORM_TEST_RUN"
_DIR_SECONDS: dict[str, float] = defaultdict(float)
_DIR_TESTS: dict[str, set[str]] = defaultdict(set)
_FILE_SECONDS: dict[str, float] = defaultdict(float)


class _RayStartCounter:
    """Counts Ray clusters this run starts: each has one ``gcs_server``, and every process the run
    spawns (in-process Ray, subprocess drivers, ``ray start`` nodes that outlive their parent) inherits
    ``AUTONORM_TEST_RUN`` in its environment. A sample a second; a cluster lives far longer.

    A sample lists ``/proc`` and reads the name of the processes it has not seen before only (a run
    starts hundreds of processes, most of them short-lived Ray workers): asking psutil for every
    process's name every second cost the pytest controller about 10 CPU s per run (11.6 ms a sample
    with 264 processes, against 0.19 ms)."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.seen: set[int] = set()
        self._looked: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ray-start-counter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> None:
        """One look at the processes that appeared since the last one."""
        import psutil

        try:
            pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        except OSError:  # no procfs: ask psutil (slower, same answer)
            pids = set(psutil.pids())
        self._looked &= pids  # forget the ones that exited (a pid can be reused)
        now = time.time()
        for pid in pids - self._looked:
            with contextlib.suppress(psutil.Error, OSError):
                proc = psutil.Process(pid)
                if proc.name() == "gcs_server":
                    if proc.environ().get(_RUN_MARK) == self.mark:
                        self.seen.add(pid)
                elif now - proc.create_time() < 2.0:
                    continue  # may be a fork that has not exec'd its program yet: look again next time
                self._looked.add(pid)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()


_COUNTER: _RayStartCounter | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _COUNTER
    if hasattr(config, "workerinput"):  # an xdist worker: the controller counts for everyone
        return
    mark = os.environ.setdefault(_RUN_MARK, f"{os.getpid()}-{time.time_ns()}")
    _COUNTER = _RayStartCounter(mark)
    _COUNTER.start()


_WORKER_RAY_STARTS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _SHARED_RAY.stop()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: tell the controller how often it started the cluster
        workeroutput["shared_ray_starts"] = _SHARED_RAY.starts
    elif os.environ.get("AUTONORM_TEST_DURATIONS") == "write" and exitstatus == 0:
        # `AUTONORM_TEST_DURATIONS=write bash scripts/test.sh`: the per-file times the next runs order by
        # (merged into what is there: a run of some files keeps the others' times)
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({f: round(s, 1) for f, s in _FILE_SECONDS.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:  # xdist: a worker finished
    _WORKER_RAY_STARTS.append(int(getattr(node, "workeroutput", {}).get("shared_ray_starts", 0)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # tests/<dir>/...::name -> tests/<dir>; tests/test_x.py -> tests/ (top level)
    parts = report.nodeid.split("::", 1)[0].split("/")
    directory = "/".join(parts[:2]) if len(parts) > 2 else parts[0] + "/"
    _DIR_SECONDS[directory] += report.duration
    _FILE_SECONDS["/".join(parts)] += report.duration
    _DIR_TESTS[directory].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _DIR_SECONDS:
        return
    tr = terminalreporter
    tr.write_sep("=", "time per test directory (setup + call + teardown, summed over tests)")
    total = sum(_DIR_SECONDS.values())
    for directory, seconds in sorted(_DIR_SECONDS.items(), key=lambda kv: -kv[1]):
        tr.write_line(
            f"{seconds:9.1f} s  {seconds / max(total, 1e-9):6.1%}  {len(_DIR_TESTS[directory]):5d} tests  {directory}"
        )
    tr.write_line(f"{total:9.1f} s  in all")
    if _COUNTER is not None:
        _COUNTER.stop()
        tr.write_line(
            f"Ray clusters started by this run: {len(_COUNTER.seen)} "
            f"(the shared in-process one {_SHARED_RAY.starts + sum(_WORKER_RAY_STARTS)} of them)"
        )
