"""What a study run records so that its verdict can be checked later (``autonorm-study reproduce``).

Every study run already carries the resolved spec (``spec.yaml``), the git commit
(``mlflow.source.git.commit``) and the library versions (``autonorm.version.<package>``, from
:func:`studies.schema.plan.build_plan`). :func:`study_provenance` adds:

* ``autonorm.git_dirty``: ``true`` when a tracked file differs from the commit (``git status
  --untracked-files=no``), ``false``, or ``unknown`` (no git: a Ray job's uploaded working directory,
  which gets ``AUTONORM_GIT_DIRTY`` from ``submit`` like ``AUTONORM_GIT_COMMIT``);
* ``autonorm.data_fingerprint``: one SHA-256 over every data file the trials read, and the per-file
  digests in the artifact ``provenance.json``;
* the machine: ``autonorm.machine.cpu_model``, ``.cpu_count``, ``.gpu_model``, ``.gpu_count``;
* the seeds of every phase: ``autonorm.seeds.<phase>`` (comma-separated, in trial order).

The data files are found by loading each data set the trials use once, in this process, and
recording every regular file the loader opens (a Python audit hook on ``open``), plus the file a
spec names itself (``path``, ``test_path``). That covers the shipped sets (Fashion-MNIST's IDX
files, scikit-learn's bundled CSVs, the pattern corpora) and files of one's own alike, without a list
of file names per data set to keep in step with the loaders.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.contract import StudyKind

__all__ = [
    "TAG_DATA_FINGERPRINT",
    "TAG_GIT_DIRTY",
    "data_files",
    "data_fingerprint",
    "data_sets",
    "git_dirty",
    "git_output",
    "machine",
    "phase_seeds",
    "study_provenance",
]

TAG_GIT_DIRTY = "autonorm.git_dirty"
TAG_DATA_FINGERPRINT = "autonorm.data_fingerprint"
PROVENANCE_ARTIFACT = "provenance.json"
_REPO_ROOT = Path(__file__).resolve().parents[1]
_FILE_KEYS = ("path", "test_path")


# ---- git -------------------------------------------------------------------------------------------


def git_output(root: Path | str, *args: str, timeout: float) -> str | None:
    """``git -C root <args>``'s stripped standard output; ``None`` when git is missing, times out or
    fails (non-zero exit)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_dirty(environ: Mapping[str, str] | None = None, root: Path | str = _REPO_ROOT) -> str:
    """``true`` when a tracked file of the checkout at ``root`` is modified (staged or not),
    ``false`` when none is, ``unknown`` without git. ``AUTONORM_GIT_DIRTY`` wins (a Ray job's
    working directory has no ``.git``)."""
    env = os.environ if environ is None else environ
    given = env.get("AUTONORM_GIT_DIRTY")
    if given in ("true", "false"):
        return given
    out = git_output(root, "status", "--porcelain", "--untracked-files=no", timeout=20)
    if out is None:
        return "unknown"
    return "true" if out else "false"


# ---- machine ---------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, str]:
    """CPU model and cores, GPU model and count of this machine (the driver's; trials on other
    nodes are named by their ``autonorm.node_id``)."""
    gpu_count, gpu_model = 0, ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu_count = torch.cuda.device_count()
            gpu_model = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(gpu_count)}))
    except Exception:  # no torch, a broken driver: no GPU to speak of
        gpu_count, gpu_model = 0, ""
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": str(os.cpu_count() or 0),
        "gpu_model": gpu_model or "none",
        "gpu_count": str(gpu_count),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


# ---- data ------------------------------------------------------------------------------------------

_RECORDING = threading.local()
_HOOKED = False
_HOOK_LOCK = threading.Lock()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open":
        return
    files = getattr(_RECORDING, "files", None)
    if files is None or not args:
        return
    path = args[0]
    if isinstance(path, int):
        return
    mode = args[1] if len(args) > 1 else "r"
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return
    try:
        text = os.fsdecode(path)
    except TypeError:
        return
    if text.startswith(("/proc/", "/sys/", "/dev/")) or _importing():
        return
    files.append(text)


def _importing() -> bool:
    """Called from a module being imported (a package reading its own resources at import time):
    not data."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@contextmanager
def _recording_opens() -> Iterator[list[str]]:
    """Every path ``open``-ed for reading by this thread inside the block."""
    global _HOOKED
    with _HOOK_LOCK:
        if not _HOOKED:
            sys.addaudithook(_audit)  # cannot be removed; does nothing outside this block
            _HOOKED = True
    files: list[str] = []
    _RECORDING.files = files
    try:
        yield files
    finally:
        _RECORDING.files = None


def data_sets(kind: Any, spec: Any) -> list[dict[str, Any]]:
    """Every distinct ``data`` section of every trial config of every phase (optional ones too)."""
    seen: dict[str, dict[str, Any]] = {}
    for phase in kind.phases(spec):
        for config in phase.configs:
            data = config.get("data")
            if isinstance(data, Mapping):
                seen.setdefault(json.dumps(data, sort_keys=True, default=str), dict(data))
    return [seen[k] for k in sorted(seen)]


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def data_files(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The files one data section reads: ``[{"data", "file", "name", "bytes", "sha256"}]``, sorted.

    The data set's loader runs once here (the raw parse, no split) with every ``open`` recorded;
    Python modules the loader imports on the way are not data and are left out. A loader that fails
    still leaves the files it opened, and the spec's own ``path`` / ``test_path`` are always there.
    """
    from autonorm_core import data as data_module
    from autonorm_core.datasources import forget_parsed_files

    options = dict(data)
    name = str(options.pop("type", ""))
    data_root = options.pop("data_root", None)
    loader_options = {k: options[k] for k in _FILE_KEYS if options.get(k) is not None}
    if name == "table" and options.get("target") is not None:
        loader_options["target"] = options["target"]
    if name == "oanc_pos" and options.get("ood_test") is not None:  # the WSJ sample is read too
        loader_options["ood_test"] = options["ood_test"]
    entry = getattr(data_module, "_REGISTRY", {}).get(name)
    opened: list[str] = []
    if entry is not None:
        forget_parsed_files()  # a file parsed earlier in this process would not be opened again
        # A loader that fails: the trials will say why; the files opened so far still count.
        with _recording_opens() as opened, contextlib.suppress(Exception):
            entry.loader(data_root, **loader_options)
    paths = {str(Path(p).resolve()) for p in opened}
    paths |= {str(Path(str(v)).resolve()) for k, v in loader_options.items() if k in _FILE_KEYS}
    out = []
    for text in sorted(paths):
        path = Path(text)
        if not path.is_file() or path.suffix in (".py", ".pyc", ".so", ".pth") or "__pycache__" in path.parts:
            continue
        out.append(
            {
                "data": name,
                "file": text,
                "name": path.name,
                "bytes": path.stat().st_size,
                "sha256": _sha256(path),
            }
        )
    return out


def data_fingerprint(files: Sequence[Mapping[str, Any]]) -> str:
    """One SHA-256 over the files' contents, named by data set and base name (not where they lie:
    the same files in another directory or on another machine give the same fingerprint)."""
    lines = sorted(f"{f['data']}/{f['name']}:{f['sha256']}" for f in files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ---- seeds -----------------------------------------------------------------------------------------


def phase_seeds(kind: Any, spec: Any) -> dict[str, list[int]]:
    """Every phase's trial seeds, in trial order, each once (optional phases included)."""
    out: dict[str, list[int]] = {}
    for phase in kind.phases(spec):
        seeds: list[int] = []
        for config in phase.configs:
            seed = config.get("seed")
            if isinstance(seed, int) and seed not in seeds:
                seeds.append(seed)
        out[phase.name] = seeds
    return out


# ---- everything ------------------------------------------------------------------------------------


def study_provenance(spec: Any, kind: StudyKind, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"tags": {...}, "artifacts": {"provenance.json": text}}`` for a study's own run of ``kind``."""
    files = [f for data in data_sets(kind, spec) for f in data_files(data)]
    seeds = phase_seeds(kind, spec)
    host = machine()
    record = {
        "git_dirty": git_dirty(environ),
        "data_fingerprint": data_fingerprint(files),
        "data_files": files,
        "machine": host,
        "seeds": seeds,
    }
    tags = {
        TAG_GIT_DIRTY: record["git_dirty"],
        TAG_DATA_FINGERPRINT: record["data_fingerprint"],
        **{
            f"autonorm.machine.{k}": v
            for k, v in host.items()
            if k in ("cpu_model", "cpu_count", "gpu_model", "gpu_count")
        },
        **{f"autonorm.seeds.{phase}": ",".join(str(s) for s in s_)[:5000] for phase, s_ in seeds.items()},
    }
    return {"tags": tags, "artifacts": {PROVENANCE_ARTIFACT: json.dumps(record, indent=2) + "\n"}}
