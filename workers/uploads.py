"""Whole-file uploads to a study's local storage: a killed driver never leaves a file half written.

Tune keeps its driver's experiment files (``tuner.pkl``, the searcher's state, every driver session's
``experiment_state-*.json``, the running trials' ``result.json``) in a staging folder and copies the
whole folder to the study's storage at every snapshot (``_FilesystemSyncer`` → ``_upload_to_fs_path``
→ ``pyarrow.fs.copy_files``). A restored driver first copies every ``.json`` and ``.pkl`` of the
experiment back into its staging folder (``sync_down_experiment_state``), so ``tuner.pkl`` (written
once, when the study started) is written again at every snapshot of every later driver. On a local
file system ``copy_files`` truncates the destination and then writes it: a SIGKILL in between left
an empty ``tuner.pkl``, and the next ``Tuner.restore`` failed with ``EOFError: Ran out of input``
(seen once in CI, in the fault chain of tests/integration/test_faults.py).

Here each file goes to a hidden temporary file next to its destination and is renamed over it
(``os.replace``, atomic on POSIX): a reader sees the old bytes or the new ones. A file whose
destination already holds the same bytes is not written again (``tuner.pkl``, the states of earlier
drivers, the parameters of a trial). Object stores need none of this (an S3 PUT appears whole), so
only a local destination takes this path; every other file system keeps Ray's copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import Any

__all__ = ["PARTIAL_SUFFIX", "is_local", "upload", "upload_tree", "write_whole"]

# A temporary copy a killed upload leaves behind ends so: Tune's ``sync_down_experiment_state`` (which
# takes ``.json`` and ``.pkl`` files only) and the study's readers (``experiment_state-*.json``,
# ``result.json``) never pick it up.
PARTIAL_SUFFIX = ".partial"


def is_local(fs: Any) -> bool:
    """Whether a pyarrow file system is the local one (where a write is not atomic)."""
    return getattr(fs, "type_name", None) == "local"


def _same_bytes(src: str, dst: str) -> bool:
    """Whether two files hold the same bytes, read in full (never by size and time alone: Tune can
    rewrite a state file within one tick of the file system's clock, at the same size)."""
    try:
        if os.stat(src).st_size != os.stat(dst).st_size:
            return False
        with open(src, "rb") as a, open(dst, "rb") as b:
            while True:
                chunk = a.read(1 << 20)
                if chunk != b.read(1 << 20):
                    return False
                if not chunk:
                    return True
    except OSError:
        return False


def _temporary(dst: str) -> str:
    directory, name = os.path.split(dst)
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}")


def write_whole(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a local file whole: a temporary file next to it, renamed over it. A reader (or the next
    driver after a SIGKILL) sees the old bytes or the new ones, never a part."""
    dst = os.fspath(path)
    tmp = _temporary(dst)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _replace(src: str, dst: str) -> bool:
    """Copy ``src`` to ``dst`` through a temporary file renamed over it; False when ``dst`` already
    held the same bytes (nothing written)."""
    if _same_bytes(src, dst):
        return False
    tmp = _temporary(dst)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def upload_tree(local_path: str, fs_path: str) -> int:
    """Upload a local file or folder to a local path, file by file as :func:`_replace` does; returns
    how many files were written."""
    if os.path.isfile(local_path):
        os.makedirs(os.path.dirname(fs_path) or ".", exist_ok=True)
        return int(_replace(local_path, fs_path))
    written = 0
    for dirpath, _, files in os.walk(local_path):
        rel = os.path.relpath(dirpath, local_path)
        target = fs_path if rel == "." else os.path.join(fs_path, rel)
        os.makedirs(target, exist_ok=True)
        for name in files:
            if name.endswith(PARTIAL_SUFFIX):
                continue
            written += _replace(os.path.join(dirpath, name), os.path.join(target, name))
    return written


def upload(local_path: str, fs: Any, fs_path: str) -> None:
    """Ray's upload (:func:`workers.ray_internals.upload_to_fs_path`, no exclusions), whole files on a
    local destination."""
    if is_local(fs):
        upload_tree(local_path, fs_path)
        return
    from workers.ray_internals import upload_to_fs_path

    upload_to_fs_path(local_path, fs, fs_path)
