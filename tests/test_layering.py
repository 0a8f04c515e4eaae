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


@pytest.mark.parametrize("package", ["studies", "workers", "autonorm_core"])
def test_no_module_longer_than_800_lines(package: str) -> None:
    # A module past 800 lines holds two things; split it where they part (issues #22, #37).
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / package).rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert long == {}


def _module_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included), absolute names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_kind_folder_imports_another() -> None:
    # A kind is a plug-in: what two kinds share lives in the kit (studies/kinds/kit.py, studies/*.py).
    kinds = sorted(p.name for p in (ROOT / "studies" / "kinds").iterdir() if (p / "__init__.py").is_file())
    assert len(kinds) >= 3, kinds
    crossing = {
        str(path.relative_to(ROOT)): sorted(
            n
            for n in _module_imports(path)
            for other in kinds
            if other != kind and n.startswith(f"studies.kinds.{other}")
        )
        for kind in kinds
        for path in sorted((ROOT / "studies" / "kinds" / kind).rglob("*.py"))
    }
    assert {k: v for k, v in crossing.items() if v} == {}


def test_the_kit_is_handed_its_kind() -> None:
    # Only the entry points look a spec's kind up in the registry; everything below them is handed it.
    allowed = {"studies/cli.py", "studies/entrypoints.py", "studies/running.py", "studies/reproduce.py"}
    callers = {
        str(p.relative_to(ROOT))
        for package in ("studies", "workers")
        for p in (ROOT / package).rglob("*.py")
        if "kind_for(" in p.read_text(encoding="utf-8").replace("def kind_for(", "")
    }
    assert callers <= allowed and callers, callers


def test_no_alias_modules() -> None:
    # A module that only re-exports another under an old path: the one kept is the public
    # ``studies.analysis`` (``studies.analysis.batchsize_trend``, named by earlier issues).
    def only_reexports(path: Path) -> bool:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        stars = [n for n in body if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
        rest = [
            n
            for n in body
            if n not in stars and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
        ]
        return bool(stars) and not rest

    aliases = sorted(
        str(p.relative_to(ROOT))
        for package in ("studies", "workers", "autonorm_core")
        for p in (ROOT / package).rglob("*.py")
        if only_reexports(p)
    )
    assert aliases == ["studies/analysis.py"]
    shims = sorted(
        str(p.relative_to(ROOT))
        for package in ("studies", "workers", "autonorm_core")
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py" and "def __getattr__(name" in p.read_text(encoding="utf-8")
    )
    assert shims == []  # (a package's lazy ``__init__`` API, e.g. ``workers``, is not an old path)
