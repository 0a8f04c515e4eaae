"""The dependency direction studies → workers → autonorm_core, and Ray started/stopped only by workers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("autonorm_core", {"workers", "studies", "ray", "mlflow", "optuna"}),
        ("workers", {"studies"}),
    ],
)
def test_no_import_against_the_dependency_direction(package: str, forbidden: set[str]) -> None:
    bad = {file: sorted(names & forbidden) for file, names in _imports(package).items() if names & forbidden}
    assert bad == {}


def test_only_workers_start_or_stop_ray() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "studies").rglob("*.py")
        if "ray.init(" in p.read_text(encoding="utf-8") or "ray.shutdown(" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []
    # ...and the one place in workers that does it is the session module.
    starters = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "workers").rglob("*.py")
        if "ray.init(" in p.read_text(encoding="utf-8")
    )
    assert starters == ["workers/session.py"]


@pytest.mark.parametrize("package", ["studies", "workers"])
def test_no_module_longer_than_900_lines(package: str) -> None:
    # A module past 900 lines holds two things; split it where they part (issue #22).
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / package).rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 900
    }
    assert long == {}
