"""What ``autonorm-study submit`` needs to hand a study to a Ray cluster: which files and settings
travel with the job (never credentials), how the client authenticates, and the job's entry point.
The command itself is :func:`studies.cli.main`'s ``submit``."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from studies.schema import git_commit

__all__ = [
    "CARRIED_NAMES",
    "DEFAULT_EXCLUDES",
    "carried_env",
    "drop_loopback_tracking_uri",
    "durable_storage_issue",
    "is_loopback",
    "job_entrypoint",
    "ray_auth_headers",
]

DEFAULT_EXCLUDES = (
    ".venv",
    "venv",
    ".git",
    "runs",
    "mlruns",
    "mlartifacts",
    "*.db",
    "*.db-journal",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.egg-info",
    "bench/results",
    "data",
)
CARRIED_NAMES = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AUTONORM_GIT_COMMIT",
)
"""Variables ``submit`` carries into the job by itself: settings, never credentials."""


def ray_auth_headers(environ: Mapping[str, str]) -> dict[str, str]:
    """``Authorization`` header from ``RAY_AUTH_TOKEN`` or the file ``RAY_AUTH_TOKEN_PATH`` names.

    Empty when neither is set (Ray then falls back to its own lookup, which only happens when
    ``RAY_AUTH_MODE=token``).
    """
    token = environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token and environ.get("RAY_AUTH_TOKEN_PATH"):
        try:
            token = Path(environ["RAY_AUTH_TOKEN_PATH"]).expanduser().read_text().strip()
        except OSError as e:
            raise SystemExit(f"cannot read RAY_AUTH_TOKEN_PATH: {e.strerror}") from None
    return {"Authorization": f"Bearer {token}"} if token else {}


def _has_userinfo(value: str) -> bool:
    """Whether a URL-like value embeds ``user[:password]@`` before its host."""
    try:
        return "@" in urlsplit(value).netloc
    except ValueError:
        return False


def carried_env(
    environ: Mapping[str, str], extra: Sequence[str] = (), *, warn: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The environment a submitted study needs: the settings in :data:`CARRIED_NAMES` and ``--env``.

    Ray stores a job's ``runtime_env`` in its job table (``ray job list``, the dashboard, the job
    API) and writes it to its logs verbatim, so credentials are never carried by themselves:
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN``, ``AWS_ACCESS_KEY_ID``/``SECRET_ACCESS_KEY``/
    ``SESSION_TOKEN`` and anything else outside :data:`CARRIED_NAMES` reach the job only when named
    with ``--env NAME`` (or ``NAME=VALUE``), and then ``warn`` is told (with the name, never the
    value). The cluster's own environment or secret store is the place for them. ``RAY_AUTH_TOKEN``
    is never carried, even when named: it authenticates this client and the cluster already has it.

    A carried setting that embeds credentials as URL userinfo (``http://user:pw@host``) is refused
    rather than carried or silently dropped (dropping it would send the study's results to a local
    ``mlruns`` in the job's temporary directory): the caller gets a ``SystemExit`` telling them to
    give the credentials to the cluster, or to name the variable with ``--env`` to carry it anyway.

    Args:
        environ: the client's environment.
        extra: ``--env`` items, ``NAME`` (value from ``environ``) or ``NAME=VALUE``.
        warn: receives one message per explicitly named variable that is not a plain setting.

    Raises:
        SystemExit: a named variable is unset, or a setting embeds credentials.
    """
    named: dict[str, str] = {}
    for item in extra:
        name, sep, value = item.partition("=")
        if name == "RAY_AUTH_TOKEN":
            raise SystemExit("--env RAY_AUTH_TOKEN: the token authenticates this client and is never carried")
        if sep:
            named[name] = value
        elif name in environ:
            named[name] = environ[name]
        else:
            raise SystemExit(f"--env {name}: not set in this environment")
    env = {k: environ[k] for k in CARRIED_NAMES if k in environ and k not in named}
    for name, value in env.items():
        if _has_userinfo(value):
            raise SystemExit(
                f"{name} embeds credentials (user:password@host); a job's env_vars are readable through "
                f"the Ray job API and logs. Give the credentials to the cluster (e.g. MLFLOW_TRACKING_USERNAME/"
                f"PASSWORD in its environment or secret store) and submit a URI without them, or carry it "
                f"anyway with --env {name}"
            )
    for name in named:
        if warn is not None and (name not in CARRIED_NAMES or _has_userinfo(named[name])):
            warn(
                f"warning: --env {name}: its value is stored in the Ray job's runtime_env and is readable "
                "by anyone with access to the job API, the dashboard and Ray's logs; prefer a secret "
                "configured on the cluster"
            )
    env.update(named)
    env.setdefault("AUTONORM_GIT_COMMIT", git_commit(environ))
    return env


def _host_of(address: str) -> str | None:
    try:
        return urlsplit(address if "://" in address else f"http://{address}").hostname
    except ValueError:
        return None


def is_loopback(address: str | None) -> bool:
    """Whether a cluster or service address names this machine only (``localhost``, ``127.x``,
    ``::1``). No address (Ray's default, a local cluster) and ``auto`` count as loopback."""
    if not address or address == "auto":
        return True
    host = _host_of(address)
    if host is None:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def drop_loopback_tracking_uri(
    env: dict[str, str], cluster: str | None, *, warn: Callable[[str], None] | None = None
) -> None:
    """Remove a loopback ``MLFLOW_TRACKING_URI`` from ``env`` when the job runs on another machine:
    there ``127.0.0.1`` is the cluster's own host, not this one."""
    uri = env.get("MLFLOW_TRACKING_URI")
    if not uri or is_loopback(cluster) or "://" not in uri or uri.startswith("sqlite:"):
        return
    if not is_loopback(uri):
        return
    del env["MLFLOW_TRACKING_URI"]
    if warn is not None:
        warn(
            f"warning: not carrying MLFLOW_TRACKING_URI ({_host_of(uri)} is this machine) to the cluster at "
            f"{cluster}: the cluster needs its own tracking server. Set MLFLOW_TRACKING_URI in the cluster's "
            "environment, or pass --tracking-uri with an address the cluster can reach; otherwise the study "
            "logs to sqlite in its storage directory"
        )


def durable_storage_issue(storage_path: str, cluster: str | None) -> str | None:
    """Why ``storage_path`` cannot hold results of a study on a remote cluster (``None``: it can)."""
    if is_loopback(cluster) or "://" in storage_path or Path(storage_path).expanduser().is_absolute():
        return None
    return (
        f"storage_path {storage_path!r} is relative, and the cluster at {cluster} is another machine: a relative "
        "path would be resolved in the job's temporary working directory, which Ray deletes. Give durable "
        "storage the cluster can write: --storage-path s3://bucket/prefix, or an absolute path on the cluster "
        "(a shared filesystem)"
    )


def job_entrypoint(
    spec_rel: str,
    *,
    preset: str | None,
    overrides: Sequence[str],
    script: str | None = None,
    python: str = "python",
) -> str:
    """The shell command the Ray job runs inside the uploaded working directory."""
    parts = [python, script, "--spec", spec_rel] if script else [python, "-m", "studies.cli", "run", spec_rel]
    if preset:
        parts += ["--preset", preset]
    for ov in overrides:
        parts += ["--set", ov]
    return shlex.join(parts)
