"""A study's directory, ``<storage_path>/<name>/``, local or on S3: the small files every kind keeps there.

Tune's experiment state (the one-plan search) or each phase's Tune experiment (``<name>/<phase>/``)
live in it too; this module only reads and writes the study-level files (``study_spec.yaml``,
``verdict.json``, reports) through the same storage resolution that Tune uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.plan import StorageConfig
from workers.storage import ResolvedStorage, resolve_storage

__all__ = ["SPEC_FILE", "StudyDir"]

SPEC_FILE = "study_spec.yaml"
"""The resolved spec inside every study directory (``<storage_path>/<name>/``)."""


@dataclass(frozen=True)
class StudyDir:
    """``<storage>/<name>`` with read/write of small text files."""

    storage: ResolvedStorage
    config: StorageConfig
    name: str

    @classmethod
    def of(cls, spec: Any) -> StudyDir:
        """The directory of a validated spec (any kind: ``name``, ``storage_path``, ``storage``)."""
        from studies.schema import resolve_storage_path

        config = StorageConfig(
            path=resolve_storage_path(spec.storage_path),
            endpoint_override=spec.storage.endpoint_override,
            region=spec.storage.region,
        )
        return cls(resolve_storage(config), config, spec.name)

    @property
    def uri(self) -> str:
        return self.storage.experiment_uri(self.name)

    @property
    def path(self) -> str:
        """The path for :attr:`filesystem` (a local absolute path when that is ``None``)."""
        return self.storage.experiment_path(self.name)

    def phase_plan(self, name: str) -> Any:
        """A plan naming the Tune experiment of phase ``name`` (``<study dir>/<name>``), for reading it
        back (``workers.results.read_trials``)."""
        from workers.plan import StudyPlan

        storage = StorageConfig(
            path=self.uri, endpoint_override=self.config.endpoint_override, region=self.config.region
        )
        return StudyPlan(name=name, base_config={}, storage=storage)

    def read_text(self, file: str) -> str | None:
        """A file's text, ``None`` when it does not exist."""
        fs = self.storage.filesystem
        if fs is None:
            from pathlib import Path

            p = Path(self.path) / file
            return p.read_text(encoding="utf-8") if p.is_file() else None
        import pyarrow.fs

        info = fs.get_file_info(f"{self.path}/{file}")
        if info.type != pyarrow.fs.FileType.File:
            return None
        with fs.open_input_stream(f"{self.path}/{file}") as f:
            data: bytes = f.read()
        return data.decode("utf-8")

    def write_text(self, file: str, text: str) -> str:
        """Write ``file`` (creating the directory); returns its URI."""
        fs = self.storage.filesystem
        if fs is None:
            from pathlib import Path

            from workers.uploads import write_whole

            target = Path(self.path)
            target.mkdir(parents=True, exist_ok=True)
            # whole or not at all: the spec saved here is compared with the next run's (a SIGKILL
            # mid-write must not read as a changed spec)
            write_whole(target / file, text.encode("utf-8"))
        else:
            fs.create_dir(self.path, recursive=True)
            with fs.open_output_stream(f"{self.path}/{file}") as f:
                f.write(text.encode("utf-8"))
        return f"{self.uri}/{file}"

    def list_files(self) -> list[str]:
        """Names of every file below the directory (relative, sorted); empty when it does not exist."""
        fs = self.storage.filesystem
        if fs is None:
            from pathlib import Path

            root = Path(self.path)
            if not root.is_dir():
                return []
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        import pyarrow.fs

        if fs.get_file_info(self.path).type != pyarrow.fs.FileType.Directory:
            return []
        infos = fs.get_file_info(pyarrow.fs.FileSelector(self.path, recursive=True))
        prefix = self.path.rstrip("/") + "/"
        return sorted(i.path.removeprefix(prefix) for i in infos if i.type == pyarrow.fs.FileType.File)

    def delete(self, file: str) -> None:
        """Remove ``file`` (missing: nothing to do)."""
        fs = self.storage.filesystem
        if fs is None:
            from pathlib import Path

            (Path(self.path) / file).unlink(missing_ok=True)
            return
        import contextlib

        with contextlib.suppress(FileNotFoundError, OSError):
            fs.delete_file(f"{self.path}/{file}")
