"""Whole-file uploads to local storage (workers/uploads.py) and Tune's syncer routed through them."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pyarrow.fs
import pytest

from workers.uploads import PARTIAL_SUFFIX, upload, upload_tree


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_a_changed_file_is_renamed_over_its_destination_and_an_unchanged_one_is_not_written(
    tmp_path: Path,
) -> None:
    src, dst = tmp_path / "staging", tmp_path / "storage"
    _tree(src, {"tuner.pkl": b"same", "experiment_state-1.json": b'{"n": 2}', "t/result.json": b"1\n2\n"})
    _tree(dst, {"tuner.pkl": b"same", "experiment_state-1.json": b'{"n": 1}'})
    # A second name for each destination file: a write in place (truncate, then write) changes what
    # it reads; a new file renamed over the destination leaves it with the old bytes.
    (tmp_path / "old_state").hardlink_to(dst / "experiment_state-1.json")
    (tmp_path / "old_tuner").hardlink_to(dst / "tuner.pkl")
    tuner_inode = (dst / "tuner.pkl").stat().st_ino

    assert upload_tree(str(src), str(dst)) == 2  # the changed state and the new result

    assert (dst / "experiment_state-1.json").read_bytes() == b'{"n": 2}'
    assert (tmp_path / "old_state").read_bytes() == b'{"n": 1}'
    assert (dst / "t" / "result.json").read_bytes() == b"1\n2\n"
    assert (dst / "tuner.pkl").stat().st_ino == tuner_inode  # the same bytes: not written again
    assert not [p for p in dst.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]
    assert upload_tree(str(src), str(dst)) == 0


def test_a_copy_cut_short_leaves_the_old_file_whole_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "staging", tmp_path / "storage"
    _tree(src, {"tuner.pkl": pickle.dumps({"new": list(range(100))})})
    _tree(dst, {"tuner.pkl": pickle.dumps({"old": 1})})
    real_copy = shutil.copyfile

    def cut_short(a: str, b: str, **kwargs: Any) -> str:
        Path(b).write_bytes(Path(a).read_bytes()[:10])  # half a file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", cut_short)
    with pytest.raises(KeyboardInterrupt):
        upload_tree(str(src), str(dst))
    assert pickle.loads((dst / "tuner.pkl").read_bytes()) == {"old": 1}
    assert [p.name for p in dst.iterdir()] == ["tuner.pkl"]
    monkeypatch.setattr(shutil, "copyfile", real_copy)
    upload_tree(str(src), str(dst))
    assert pickle.loads((dst / "tuner.pkl").read_bytes()) == {"new": list(range(100))}


def test_a_killed_uploads_leftovers_are_never_uploaded(tmp_path: Path) -> None:
    src, dst = tmp_path / "staging", tmp_path / "storage"
    _tree(src, {"a.json": b"1", f".a.json.0123{PARTIAL_SUFFIX}": b"half"})
    upload(str(src / "a.json"), pyarrow.fs.LocalFileSystem(), str(dst / "sub" / "a.json"))  # one file
    upload(str(src), pyarrow.fs.LocalFileSystem(), str(dst / "all"))
    assert (dst / "sub" / "a.json").read_bytes() == b"1"
    assert sorted(p.name for p in (dst / "all").iterdir()) == ["a.json"]


def test_tunes_syncer_uploads_whole_files_to_local_storage_only(tmp_path: Path) -> None:
    import inspect

    from ray.train._internal.storage import _FilesystemSyncer, _upload_to_fs_path

    from workers.ray_internals import whole_file_uploads

    # Pinned: the private API the patch wraps, and that Ray's own copy is the truncating one.
    assert list(inspect.signature(_FilesystemSyncer._sync_up_command).parameters) == [
        "self",
        "local_path",
        "uri",
        "exclude",
    ]
    assert "_pyarrow_fs_copy_files" in inspect.getsource(_upload_to_fs_path)
    from workers.uploads import is_local, upload_tree

    whole_file_uploads(is_local, upload_tree)
    whole_file_uploads(is_local, upload_tree)  # once per process
    local = _FilesystemSyncer(storage_filesystem=pyarrow.fs.LocalFileSystem())
    fn, kwargs = local._sync_up_command(str(tmp_path / "a"), str(tmp_path / "b"))
    assert fn is upload_tree and kwargs == {"local_path": str(tmp_path / "a"), "fs_path": str(tmp_path / "b")}
    # With exclusions (Tune's artifact sync) and on any other file system: Ray's upload as before.
    fn, _ = local._sync_up_command(str(tmp_path / "a"), str(tmp_path / "b"), exclude=["*/checkpoint_*"])
    assert fn is _upload_to_fs_path
    other = _FilesystemSyncer(
        storage_filesystem=pyarrow.fs.SubTreeFileSystem(str(tmp_path), pyarrow.fs.LocalFileSystem())
    )
    fn, _ = other._sync_up_command(str(tmp_path / "a"), "b")
    assert fn is _upload_to_fs_path


def test_an_unreadable_tuner_state_is_told_apart_from_a_readable_or_missing_one(tmp_path: Path) -> None:
    from workers.plan import StorageConfig
    from workers.runner import TUNER_STATE, _unreadable_tuner_state
    from workers.storage import resolve_storage

    storage = resolve_storage(StorageConfig(path=str(tmp_path)))
    exp = tmp_path / "study"
    exp.mkdir()
    assert _unreadable_tuner_state(str(exp), storage) is None  # missing: Tune's restore says so
    whole = pickle.dumps({"tune_config": list(range(1000))})
    (exp / TUNER_STATE).write_bytes(whole)
    assert _unreadable_tuner_state(str(exp), storage) is None
    (exp / TUNER_STATE).write_bytes(b"")
    assert _unreadable_tuner_state(str(exp), storage) == "empty"
    (exp / TUNER_STATE).write_bytes(whole[: len(whole) // 2])
    assert (_unreadable_tuner_state(str(exp), storage) or "").startswith("cut short")
    assert os.path.getsize(exp / TUNER_STATE) == len(whole) // 2  # only read


def test_a_file_of_the_same_size_and_time_but_other_bytes_is_written(tmp_path: Path) -> None:
    # Tune may rewrite a state within one tick of the file system's clock at the same size.
    src, dst = tmp_path / "staging", tmp_path / "storage"
    _tree(src, {"experiment_state-1.json": b'{"n": 2}'})
    _tree(dst, {"experiment_state-1.json": b'{"n": 1}'})
    stamp = (src / "experiment_state-1.json").stat().st_mtime_ns
    os.utime(dst / "experiment_state-1.json", ns=(stamp, stamp))
    assert upload_tree(str(src), str(dst)) == 1
    assert (dst / "experiment_state-1.json").read_bytes() == b'{"n": 2}'


def test_a_study_file_is_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # study_spec.yaml is written again by every run and compared with the next one's: a SIGKILL
    # mid-write must leave the old spec, not a part that reads as a changed spec.
    from studies.reporting import write_json
    from studies.study_dir import StudyDir
    from workers.plan import StorageConfig
    from workers.storage import resolve_storage

    config = StorageConfig(path=str(tmp_path))
    study = StudyDir(resolve_storage(config), config, "s")
    study.write_text("study_spec.yaml", "name: s\nseeds: [1, 2]\n")
    spec = tmp_path / "s" / "study_spec.yaml"
    (tmp_path / "old").hardlink_to(spec)
    study.write_text("study_spec.yaml", "name: s\nseeds: [1, 2, 3]\n")
    assert study.read_text("study_spec.yaml") == "name: s\nseeds: [1, 2, 3]\n"
    assert (tmp_path / "old").read_text() == "name: s\nseeds: [1, 2]\n"  # renamed over, not rewritten

    def killed(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        study.write_text("study_spec.yaml", "name: s\nseeds: [1, 2, 3, 4, 5, 6, 7, 8]\n")
    with pytest.raises(KeyboardInterrupt):
        write_json(tmp_path / "s" / "verdict.json", {"verdict": "supported"})
    assert study.read_text("study_spec.yaml") == "name: s\nseeds: [1, 2, 3]\n"
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["study_spec.yaml"]
