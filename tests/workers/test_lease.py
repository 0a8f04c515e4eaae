"""The study lease: one driver per study, stale leases broken, nothing written by the loser."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from workers.errors import LeaseError
from workers.lease import study_lease
from workers.plan import StorageConfig
from workers.storage import resolve_storage


def _storage(tmp_path: Path):  # type: ignore[no-untyped-def]
    return resolve_storage(StorageConfig(path=str(tmp_path)))


def test_second_holder_is_refused_with_host_and_pid(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    with study_lease(storage, "s1") as held:
        assert Path(held["uri"]) == tmp_path / "s1.lease"
        assert not (tmp_path / "s1").exists()  # the lease writes nothing into the study directory
        with pytest.raises(LeaseError) as err, study_lease(storage, "s1"):
            pass
        message = str(err.value)
        assert socket.gethostname() in message and str(os.getpid()) in message
        with study_lease(storage, "other"):  # another study is independent
            pass
    with study_lease(storage, "s1"):  # released at exit
        pass
    assert not (tmp_path / "s1.lease").exists()


def test_lease_of_a_dead_driver_on_this_host_is_broken(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    (tmp_path / "s2.lease").write_text(
        json.dumps({"host": socket.gethostname(), "pid": pid, "token": "x", "heartbeat": time.time()})
    )
    with study_lease(_storage(tmp_path), "s2") as held:
        assert held["pid"] == os.getpid()


def test_lease_with_an_old_heartbeat_is_broken_a_fresh_one_is_not(tmp_path: Path) -> None:
    lease = tmp_path / "s3.lease"
    lease.write_text(
        json.dumps({"host": "elsewhere", "pid": 1, "token": "x", "heartbeat": time.time() - 3600})
    )
    with study_lease(_storage(tmp_path), "s3", expire_s=60):
        pass
    lease.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "x", "heartbeat": time.time()}))
    with pytest.raises(LeaseError, match="host elsewhere, pid 1"), study_lease(_storage(tmp_path), "s3"):
        pass


def test_heartbeat_refreshes_the_lease(tmp_path: Path) -> None:
    with study_lease(_storage(tmp_path), "s4", heartbeat_s=0.05):
        first = json.loads((tmp_path / "s4.lease").read_text())["heartbeat"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if json.loads((tmp_path / "s4.lease").read_text())["heartbeat"] > first:
                break
            time.sleep(0.05)
        assert json.loads((tmp_path / "s4.lease").read_text())["heartbeat"] > first


@pytest.mark.services
def test_lease_on_s3_is_exclusive_and_released(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real S3-compatible store (SeaweedFS): the conditional put refuses a second holder."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    config = StorageConfig(path=f"s3://{s3_server.bucket}/lease-test", endpoint_override=s3_server.endpoint)
    storage = resolve_storage(config)
    kw = {"endpoint_override": s3_server.endpoint, "region": s3_server.region}
    with study_lease(storage, "s5", **kw):
        assert "lease-test/s5.lease" in s3_server.list_keys("lease-test/")
        with pytest.raises(LeaseError, match=str(os.getpid())), study_lease(storage, "s5", **kw):
            pass
    assert "lease-test/s5.lease" not in s3_server.list_keys("lease-test/")
    with study_lease(storage, "s5", **kw):  # free again
        pass


def test_a_lease_being_written_is_not_taken_for_a_stale_one(tmp_path: Path) -> None:
    """A lease without a parseable body is as old as its file, not as old as the epoch.

    The race CI hit: one driver had created the lease but not yet written it; the second read an
    empty file, took its missing heartbeat for an ancient one, broke the lease, and both ran.
    """
    lease = tmp_path / "s6.lease"
    lease.write_text("")
    with pytest.raises(LeaseError, match="held by another driver"), study_lease(_storage(tmp_path), "s6"):
        pass
    assert lease.read_text() == ""  # left to its writer
    old = time.time() - 3600
    os.utime(lease, (old, old))  # a driver that died mid-write an hour ago: stale, broken
    with study_lease(_storage(tmp_path), "s6", expire_s=60) as held:
        assert json.loads(lease.read_text())["token"] == held["token"]


def _race(storage: Any, name: str, drivers: int) -> tuple[int, int]:
    """``drivers`` threads take the lease at one instant and hold it a while: (held, refused)."""
    barrier = threading.Barrier(drivers)
    outcomes: list[str] = []

    def driver() -> None:
        barrier.wait()
        try:
            with study_lease(storage, name, heartbeat_s=60):
                outcomes.append("held")
                time.sleep(0.2)  # hold it while the others try
        except LeaseError:
            outcomes.append("refused")

    threads = [threading.Thread(target=driver) for _ in range(drivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes.count("held"), outcomes.count("refused")


def test_drivers_racing_for_one_lease_never_both_hold_it(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    for round_ in range(20):
        assert _race(storage, f"r{round_}", 4) == (1, 3), round_


def test_a_garbled_lease_is_mended_by_the_holders_next_heartbeat(tmp_path: Path) -> None:
    lease = tmp_path / "s7.lease"
    with study_lease(_storage(tmp_path), "s7", heartbeat_s=0.05) as held:
        lease.write_text("{not json")  # no token: not a takeover, so the holder keeps beating
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and lease.read_text() == "{not json":
            time.sleep(0.05)
        assert json.loads(lease.read_text())["token"] == held["token"]
    assert not lease.exists()  # and released as its own
