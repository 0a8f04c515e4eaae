"""An exclusive lease per study, taken before a driver writes anything.

Nothing in Tune or MLflow stops two drivers of one study: both would restore the same experiment,
run every trial twice and fight over the MLflow runs. The lease is a small object beside the study
(``<storage>/<name>.lease``, outside the study directory so that taking it writes nothing into it):

* local storage: written to a private file, then hard-linked to the lease's name (``link`` is atomic
  and refuses an existing name on POSIX file systems, NFS included), so it never exists half-written;
* S3: a conditional put (``If-None-Match: *``), which S3 and compatible stores answer with 412 when
  the object exists.

It holds host, pid and a heartbeat time that a background thread refreshes every ``heartbeat_s``.
A lease whose heartbeat is older than ``expire_s`` (a driver killed with SIGKILL, a lost node) is
stale and may be broken; on the same host a lease whose pid is dead is broken at once, so a rerun
after a crash never waits. The second driver gets :class:`LeaseError` naming the holder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from workers.errors import LeaseError, StudyError
from workers.storage import ResolvedStorage

__all__ = ["LeaseError", "StudyError", "lease_holder", "study_lease"]

logger = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Backend:
    """Create-if-absent, read, overwrite (own lease only), delete of one small object."""

    def __init__(
        self, storage: ResolvedStorage, name: str, *, endpoint_override: str | None, region: str
    ) -> None:
        self.storage = storage
        self.endpoint_override = endpoint_override
        self.region = region
        self.key = f"{storage.storage_path.rstrip('/')}/{name}.lease"
        self.uri = f"{storage.uri.rstrip('/')}/{name}.lease"

    # local ---------------------------------------------------------------------------------------
    def create(self, body: bytes) -> bool:
        """Create the lease with its whole body, or return False when it exists.

        Locally the body is written to a private file first and then hard-linked to the lease's
        name: ``link`` is atomic and refuses an existing name, so no other driver ever reads a
        lease without its holder and heartbeat (with ``O_EXCL`` and a write after it, a second
        driver could read the empty file in between, take it for a stale lease and break it).
        """
        if not self.storage.is_local:
            return self._s3_put(body, if_none_match=True)
        os.makedirs(os.path.dirname(self.key), exist_ok=True)
        tmp = f"{self.key}.{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(body)
        try:
            os.link(tmp, self.key)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive create, then write
            try:
                fd = os.open(self.key, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as out:
                out.write(body)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return True

    def read(self) -> dict[str, Any] | None:
        """The lease's fields, ``None`` when there is none.

        A lease that does not parse (written by a driver that died mid-write, or being written by
        one on a store without atomic creation) gets its object's modification time as its
        heartbeat: it is stale once that is older than the expiry, never at once.
        """
        try:
            got = self._local_get() if self.storage.is_local else self._s3_get()
        except FileNotFoundError:
            return None
        if got is None:
            return None
        data, modified = got
        try:
            parsed: dict[str, Any] = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return {"heartbeat": modified}
        return parsed if isinstance(parsed, dict) else {"heartbeat": modified}

    def _local_get(self) -> tuple[bytes, float]:
        with open(self.key, "rb") as f:
            return f.read(), os.fstat(f.fileno()).st_mtime

    def overwrite(self, body: bytes) -> None:
        if self.storage.is_local:
            tmp = f"{self.key}.{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, self.key)
        else:
            self._s3_put(body, if_none_match=False)

    def delete(self) -> None:
        if self.storage.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.key)
        else:
            fs = self.storage.filesystem
            assert fs is not None
            with contextlib.suppress(FileNotFoundError, OSError):
                fs.delete_file(self.key)

    # S3 ------------------------------------------------------------------------------------------
    def _client(self) -> Any:
        import boto3
        from botocore.config import Config

        # The same endpoint and region Tune's filesystem uses; keys from the environment only.
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_override,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}),
        )

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.key.partition("/")
        return bucket, key

    def _s3_put(self, body: bytes, *, if_none_match: bool) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = self._bucket_key()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": body}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._client().put_object(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if if_none_match and (
                status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")
            ):
                return False
            if if_none_match and (status == 501 or code == "NotImplemented"):
                # A store without conditional writes: check, then put (a race of milliseconds remains).
                logger.warning(
                    "%s does not support conditional puts; the lease is not atomic there", self.uri
                )
                if self._s3_get() is not None:
                    return False
                return self._s3_put(body, if_none_match=False)
            raise
        return True

    def _s3_get(self) -> tuple[bytes, float] | None:
        from botocore.exceptions import ClientError

        bucket, key = self._bucket_key()
        try:
            response = self._client().get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        modified = response.get("LastModified")
        return response["Body"].read(), modified.timestamp() if modified is not None else time.time()


def lease_holder(
    storage: ResolvedStorage,
    name: str,
    *,
    endpoint_override: str | None = None,
    region: str = "us-east-1",
    expire_s: float = 60.0,
) -> dict[str, Any] | None:
    """The live driver holding the study's lease (host, pid, heartbeat), ``None`` when none does.

    Read-only: what ``status`` and ``report`` use to tell a running study from a stopped one, without
    taking or touching the lease. A stale lease (dead pid on this host, old heartbeat) is no holder.
    """
    held = _Backend(storage, name, endpoint_override=endpoint_override, region=region).read()
    if not held:
        return None
    age = time.time() - float(held.get("heartbeat") or 0.0)
    if held.get("host") == socket.gethostname() and not _pid_alive(int(held.get("pid") or 0)):
        return None
    return held if age <= expire_s else None


@contextlib.contextmanager
def study_lease(
    storage: ResolvedStorage,
    name: str,
    *,
    endpoint_override: str | None = None,
    region: str = "us-east-1",
    heartbeat_s: float = 10.0,
    expire_s: float = 60.0,
) -> Iterator[dict[str, Any]]:
    """Hold the study's lease for the block.

    Args:
        storage: the resolved storage (local directory or S3).
        name: the study name (the lease is ``<storage>/<name>.lease``).
        endpoint_override / region: the S3 endpoint and region (the storage section's).

    Raises:
        LeaseError: another live driver holds it (host, pid and heartbeat age in the message).
    """
    backend = _Backend(storage, name, endpoint_override=endpoint_override, region=region)
    token = uuid.uuid4().hex
    me = {"host": socket.gethostname(), "pid": os.getpid(), "token": token}

    def body() -> bytes:
        return json.dumps({**me, "heartbeat": time.time()}).encode("utf-8")

    for _ in range(3):
        if backend.create(body()):
            break
        held = backend.read()
        if held is None:
            continue  # released in between: try again
        age = time.time() - float(held.get("heartbeat") or 0.0)
        same_host_dead = held.get("host") == me["host"] and not _pid_alive(int(held.get("pid") or 0))
        if same_host_dead or age > expire_s:
            why = "is gone" if same_host_dead else f"sent no heartbeat for {age:.0f} s"
            logger.warning(
                "[%s] the driver that held this study (host %s, pid %s) %s: its lease %s is broken; "
                "what it saved is kept (finished trials, the last checkpoint of each unfinished one)",
                name,
                held.get("host"),
                held.get("pid"),
                why,
                backend.uri,
            )
            backend.delete()
            continue
        raise LeaseError(
            f"study {name!r} is held by another driver: host {held.get('host')}, pid {held.get('pid')}, "
            f"heartbeat {age:.0f} s ago ({backend.uri}); wait for it to finish, or stop it. A lease whose "
            f"heartbeat is older than {expire_s:.0f} s is broken automatically."
        )
    else:
        raise LeaseError(f"could not take the lease {backend.uri} (it keeps changing hands)")

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            try:
                held = backend.read()
                # (a lease that does not parse has no token: not a takeover; the overwrite mends it)
                if held and "token" in held and held["token"] != token:
                    logger.error(
                        "lease %s was taken over by host %s pid %s",
                        backend.uri,
                        held.get("host"),
                        held.get("pid"),
                    )
                    return
                backend.overwrite(body())
            except Exception as exc:  # storage outage (read or write): the next beat tries again
                logger.warning("lease heartbeat failed: %s", exc)

    thread = threading.Thread(target=beat, name=f"lease-{name}", daemon=True)
    thread.start()
    try:
        yield {**me, "uri": backend.uri}
    finally:
        stop.set()
        thread.join(timeout=5)
        held = backend.read()
        if held is not None and held.get("token") == token:
            backend.delete()
