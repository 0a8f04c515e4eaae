"""The repository's .rayignore keeps state, environments and secrets out of Ray working_dir uploads.

Ray (2.60: ray/_private/runtime_env/packaging.py) reads ``.rayignore`` from the root of a
working_dir with gitwildmatch syntax, next to ``.gitignore``. The tests zip a stand-in checkout with
Ray's own packaging code, reading .rayignore alone (``include_gitignore=False``, as with
RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1), so they show what .rayignore by itself excludes.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pathspec
import pytest
from ray._private.runtime_env import packaging

from studies.cli import DEFAULT_EXCLUDES

ROOT = Path(__file__).resolve().parents[2]
RAYIGNORE = ROOT / ".rayignore"

EXCLUDED = [
    ".git/HEAD",
    ".git/objects/ab/cdef",
    ".venv/bin/python",
    "venv/lib/x.py",
    "runs/batchsize_correlation/verdict.json",
    "mlruns/0/meta.yaml",
    "mlartifacts/1/a.png",
    "mlflow.db",
    "runs.db-journal",
    "bench/results/norms.json",
    "studies/__pycache__/spec.cpython-311.pyc",
    "workers/stale.pyc",
    ".mypy_cache/3.11/x.json",
    ".ruff_cache/a",
    ".pytest_cache/v/cache",
    "autonorm_studies.egg-info/PKG-INFO",
    "build/lib/x.py",
    "data/cifar10/batch_1",
    ".data/x",
    "deploy/.env",
]
KEPT = [
    "pyproject.toml",
    "studies/specs/batchsize_correlation.yaml",
    "autonorm_core/data.py",  # a module named like the `data` directory pattern
    "bench/norms.py",
    "deploy/.env.example",
]


def _patterns() -> list[str]:
    return [
        line.strip()
        for line in RAYIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _tracked_sources() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--", "autonorm_core", "workers", "studies", "bench/*.py", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [p for p in out if not p.startswith("bench/results/")]


def _uploaded(tmp_path: Path, files: list[str]) -> set[str]:
    """What Ray's working_dir packaging puts into the zip for a tree of ``files`` plus .rayignore."""
    tree = tmp_path / "checkout"
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("x")
    (tree / ".rayignore").write_text(RAYIGNORE.read_text())
    out = tmp_path / "package.zip"
    packaging._zip_files(str(tree), [], str(out), include_gitignore=False)
    with zipfile.ZipFile(out) as z:
        return {n.rstrip("/") for n in z.namelist()}


def test_rayignore_parses_and_lists_git() -> None:
    patterns = _patterns()
    spec = pathspec.PathSpec.from_lines("gitwildmatch", patterns)
    assert len(spec.patterns) == len(patterns)
    assert ".git" in patterns
    assert spec.match_file(".git/config")
    # Ray finds and loads it the way it does for every upload.
    matcher = packaging._get_ignore_file(ROOT, ".rayignore")
    assert matcher is not None and matcher(ROOT / ".git" / "HEAD")


def test_rayignore_covers_what_autonorm_study_submit_excludes() -> None:
    """A plain `ray job submit --working-dir .` leaves out what `autonorm-study submit` does."""
    assert set(DEFAULT_EXCLUDES) <= set(_patterns())


def test_ray_uploads_sources_but_not_state_caches_or_secrets(tmp_path: Path) -> None:
    sources = _tracked_sources()
    assert "studies/batchsize_correlation.py" in sources and "workers/__init__.py" in sources
    uploaded = _uploaded(tmp_path, [*EXCLUDED, *KEPT, *sources])
    assert set(sources) | set(KEPT) <= uploaded
    assert not [p for p in EXCLUDED if p in uploaded]


@pytest.mark.parametrize("path", EXCLUDED)
def test_without_rayignore_these_would_be_uploaded(tmp_path: Path, path: str) -> None:
    """The zip test above is not vacuous: with an empty .rayignore, Ray would upload each of them."""
    tree = tmp_path / "checkout"
    (tree / path).parent.mkdir(parents=True, exist_ok=True)
    (tree / path).write_text("x")
    (tree / ".rayignore").write_text("")
    out = tmp_path / "package.zip"
    packaging._zip_files(str(tree), [], str(out), include_gitignore=False)
    with zipfile.ZipFile(out) as z:
        assert path in z.namelist()
