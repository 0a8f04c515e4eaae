"""The dependency direction studies → workers → autonorm_core, and Ray started/stopped only by workers."""

from __future__ import annotations

import ast
from collections.abc import Collection
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
    # A kind is a plug-in: what two kinds share lives beside the kind folders (studies/kinds/*.py, studies/*.py).
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


# ---- Ray's private internals in one module (issue #51) --------------------------------------------

RAY_ADAPTER = "workers/ray_internals.py"
# (file, private name) pairs that are not Ray's: a name of PRIVATE_NAMES that another library or one
# of our own classes also uses.
NOT_RAYS = {
    ("workers/optuna_state.py", "_storage"): "Optuna's Study._storage (its in-memory storage), not Tune's",
    ("workers/tracking/callback.py", "_trials"): "MlflowTrackingCallback's own table of trials",
}


def _private_ray_path(dotted: str) -> bool:
    """A ``ray`` module path (or logger name) inside Ray's private API: a component that starts with
    ``_`` (``ray._private``, ``ray.train._internal``), or ``ray.tune.execution``."""
    parts = dotted.split(".")
    if parts[0] != "ray" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return False
    private = any(p.startswith("_") and not p.startswith("__") for p in parts[1:])
    return private or parts[1:3] == ["tune", "execution"]


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_ray_uses(source: str, private_names: Collection[str]) -> list[tuple[int, str, str]]:
    """``(line, name, what)`` for every use of Ray's private API in ``source``: an import from a
    private Ray module or of a private name; an attribute or string (a logger name, ``getattr``'s
    argument) that is one of ``private_names`` or a private Ray module path; a private attribute of
    a name bound to Ray; an assignment to (or ``setattr``/``delattr`` of) an attribute of a name
    bound to Ray. Docstrings are text, not uses."""
    tree = ast.parse(source)
    out: list[tuple[int, str, str]] = []
    from_ray: set[str] = set()  # the names this module binds to Ray's modules, classes and objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ray":
                    from_ray.add(alias.asname or "ray")
                    if _private_ray_path(alias.name):
                        out.append((node.lineno, alias.name, "imports a private Ray module"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "ray"
        ):
            module = node.module or ""
            if _private_ray_path(module):
                out.append((node.lineno, module, "imports from a private Ray module"))
            for alias in node.names:
                from_ray.add(alias.asname or alias.name)
                if _private_ray_path(module):
                    continue  # said once, for the module
                if alias.name.startswith("_") or _private_ray_path(f"{module}.{alias.name}"):
                    out.append((node.lineno, f"{module}.{alias.name}", "imports a private Ray name"))
    docstrings = {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in private_names:
                out.append((node.lineno, node.attr, "reads a private Ray attribute"))
            elif node.attr.startswith("_") and not node.attr.startswith("__") and _root(node) in from_ray:
                out.append((node.lineno, node.attr, "reads a private attribute of Ray"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in private_names:
                out.append((node.lineno, node.value, "names a private Ray attribute"))
            elif _private_ray_path(node.value):
                out.append((node.lineno, node.value, "names a private Ray module or logger"))
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _root(node.args[0]) in from_ray
        ):
            out.append((node.lineno, ast.unparse(node), "assigns an attribute of Ray"))
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                if isinstance(t, ast.Attribute) and _root(t) in from_ray:
                    out.append((t.lineno, ast.unparse(t), "assigns an attribute of Ray"))
    return sorted(set(out))


def test_only_the_ray_adapter_touches_rays_private_api() -> None:
    from workers.ray_internals import PRIVATE_NAMES, RAY_PACKAGE_PREFIX, TUNE_STOP_HANDLER

    # Ray's private values held as strings (not attributes) are the adapter's too.
    private = (*PRIVATE_NAMES, RAY_PACKAGE_PREFIX, TUNE_STOP_HANDLER)
    found = []
    for package in ("autonorm_core", "workers", "studies"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name == RAY_ADAPTER:
                continue
            for line, what, why in private_ray_uses(path.read_text(encoding="utf-8"), private):
                if (name, what) not in NOT_RAYS:
                    found.append(f"{name}:{line}: {why}: {what}")
    assert found == [], "\n".join(found)


def test_the_ray_adapter_check_finds_each_kind_of_use() -> None:
    source = '''
"""ray._private.worker in a docstring is text."""
import logging
import ray
from ray.train._internal import storage
from ray.tune.execution.tune_controller import TuneController
from ray.tune.trainable.metadata import _TrainingRunMetadata
from ray.tune.search.optuna import OptunaSearch


def f(searcher, controller):
    logging.getLogger("ray.train._internal.syncer")
    n = len(searcher._ot_trials)
    waiting = getattr(controller, "_pending_trials", None)
    x = ray._private
    OptunaSearch.save = None
    setattr(OptunaSearch, "restore", None)
    return searcher.public, n, waiting, x
'''
    found = {(line, why) for line, _, why in private_ray_uses(source, ("_ot_trials", "_pending_trials"))}
    assert found == {
        (5, "imports from a private Ray module"),
        (6, "imports from a private Ray module"),
        (7, "imports a private Ray name"),
        (12, "names a private Ray module or logger"),
        (13, "reads a private Ray attribute"),
        (14, "names a private Ray attribute"),
        (15, "reads a private attribute of Ray"),
        (16, "assigns an attribute of Ray"),
        (17, "assigns an attribute of Ray"),
    }
    assert private_ray_uses("from ray import tune\nimport logging\nlogging.getLogger('ray.tune')\n", ()) == []
