"""This machine's measured step times, kept between commands, so ``run`` does not time them again.

``autonorm-study run`` prints an estimate before it starts (trials, CPU/GPU hours, wall time): each
trial config's training steps are timed on this machine first (:func:`studies.calibration.calibrate_trial`),
about 3 s of the command's start on 2 CPU cores, most of it importing torch. What was measured is kept
in ``$AUTONORM_DATA_DIR`` (or ``~/.cache/autonorm-studies``) ``/calibration/<machine>.json``: a later
``run`` on the same machine reuses the step times younger than :data:`MAX_AGE_S` and times only the
configs it has not seen. ``<machine>`` is a digest of what a step time depends on besides the config:
host, CPU model and count, Python, torch and autonorm-studies versions; an entry is keyed by the
config's timing key, its data (a data file's size and modification time included), the CPU threads
and the device. ``autonorm-study plan`` neither reads nor writes it: it always times afresh (that is
what it is asked for). ``AUTONORM_CALIBRATION_CACHE=off`` (or deleting the file) times every run.

Only ever an estimate's input: a cached step time that is off by the machine's load misjudges the
estimate, never the study.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from studies.calibration import data_key, timing_key

__all__ = ["ENV", "MAX_AGE_S", "CalibrationCache"]

#: Set to ``off`` to time every ``run`` (the cache is neither read nor written).
ENV = "AUTONORM_CALIBRATION_CACHE"
#: Entries older than this are timed again (a week: a machine's software changes that way, its speed not).
MAX_AGE_S = 7 * 24 * 3600.0
_FORMAT = 1


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def machine_fingerprint() -> dict[str, Any]:
    """What a step time depends on besides the trial config (no torch import: read from metadata)."""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "autonorm_studies": _version("autonorm-studies"),
        "format": _FORMAT,
    }


def _data_files(data: Mapping[str, Any]) -> list[list[Any]]:
    """Size and modification time of every file the data section names (an own-data ``.npz``, CSV or
    Parquet file): another file under the same name is another entry."""
    out = []
    for key in sorted(data):
        value = data[key]
        if isinstance(value, str) and os.path.isfile(value):
            with contextlib.suppress(OSError):
                st = os.stat(value)
                out.append([key, st.st_size, st.st_mtime_ns])
    return out


class CalibrationCache:
    """The step times measured on this machine (see the module docstring).

    Args:
        path: the JSON file; default :meth:`default_path`.
        now: the clock (tests).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, now: float | None = None) -> None:
        self.path = Path(path) if path is not None else self.default_path()
        self._now = now
        self._entries: dict[str, dict[str, Any]] | None = None

    @staticmethod
    def default_path() -> Path:
        root = Path(os.environ.get("AUTONORM_DATA_DIR") or Path.home() / ".cache" / "autonorm-studies")
        digest = hashlib.sha256(json.dumps(machine_fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
        return root / "calibration" / f"{digest}.json"

    @staticmethod
    def enabled(environ: Mapping[str, str] | None = None) -> bool:
        env = os.environ if environ is None else environ
        return env.get(ENV, "").strip().lower() not in ("off", "0", "false", "no")

    def key(self, config: Mapping[str, Any], *, threads: int, device: str) -> str:
        data = dict(config.get("data") or {})
        return json.dumps(
            [timing_key(config), data_key(config), _data_files(data), int(threads), str(device)],
            separators=(",", ":"),
            default=str,
        )

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = {}
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(self.path.read_text(encoding="utf-8"))
                if isinstance(doc, dict) and isinstance(doc.get("entries"), dict):
                    self._entries = {k: v for k, v in doc["entries"].items() if isinstance(v, dict)}
        return self._entries

    def get(self, config: Mapping[str, Any], *, threads: int, device: str) -> dict[str, Any] | None:
        """``{"step_s", "eval_s", "setup_s", "data"}`` measured for this config, or ``None`` (never
        measured here, older than :data:`MAX_AGE_S`, or unreadable)."""
        entry = self._load().get(self.key(config, threads=threads, device=device))
        if entry is None:
            return None
        now = time.time() if self._now is None else self._now
        try:
            fresh = now - float(entry["measured_at"]) <= MAX_AGE_S
            values = {k: float(entry[k]) for k in ("step_s", "eval_s", "setup_s")}
            data = {str(k): int(v) for k, v in dict(entry["data"]).items()}
        except (KeyError, TypeError, ValueError):
            return None
        return {**values, "data": data} if fresh else None

    def get_stacked(
        self, config: Mapping[str, Any], members: int, *, threads: int, device: str
    ) -> dict[str, Any] | None:
        """``{"step_s", "eval_s", "members", "stacked"}`` measured for ``members`` stacked trials of
        this config (:func:`studies.calibration.calibrate_stacked`), or ``None``."""
        entry = self._load().get(self.key(config, threads=threads, device=device) + f"|K={int(members)}")
        if entry is None:
            return None
        now = time.time() if self._now is None else self._now
        try:
            if now - float(entry["measured_at"]) > MAX_AGE_S:
                return None
            return {
                "step_s": float(entry["step_s"]),
                "eval_s": float(entry["eval_s"]),
                "members": int(entry["members"]),
                "stacked": bool(entry["stacked"]),
                "reason": str(entry.get("reason", "")),
            }
        except (KeyError, TypeError, ValueError):
            return None

    def put_stacked(
        self, config: Mapping[str, Any], measured: Mapping[str, Any], *, threads: int, device: str
    ) -> None:
        """Keep one stacked measurement (what :func:`studies.calibration.calibrate_stacked` returned)."""
        now = time.time() if self._now is None else self._now
        key = self.key(config, threads=threads, device=device) + f"|K={int(measured['members'])}"
        self._load()[key] = {
            **{k: measured[k] for k in ("step_s", "eval_s", "members", "stacked")},
            "reason": str(measured.get("reason", "")),
            "measured_at": now,
        }

    def put(
        self, config: Mapping[str, Any], measured: Mapping[str, Any], *, threads: int, device: str
    ) -> None:
        """Keep one measurement (what :func:`studies.calibration.calibrate_trial` returned)."""
        now = time.time() if self._now is None else self._now
        self._load()[self.key(config, threads=threads, device=device)] = {
            "step_s": float(measured["step_s"]),
            "eval_s": float(measured["eval_s"]),
            "setup_s": float(measured["setup_s"]),
            "data": {str(k): int(v) for k, v in dict(measured["data"]).items()},
            "measured_at": now,
        }

    def save(self) -> None:
        """Write the entries (atomically: a concurrent ``run`` reads the old file or the new one).
        Never raises: a cache that cannot be written only costs the next run a measurement."""
        entries = self._load()
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            doc = {"machine": machine_fingerprint(), "entries": entries}
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
