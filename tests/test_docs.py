"""The docs stay true to the code: generated reference up to date, links valid, no internal references."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Union

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "spec-reference.md"
GENERATOR = ROOT / "scripts" / "gen_spec_reference.py"
REGENERATE = ".venv/bin/python scripts/gen_spec_reference.py"

# Spelled in pieces so that this file does not match its own check.
FORBIDDEN = ("../" + "shared", "PROTOCOL" + ".md", "DESIGN" + ".md")


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_spec_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def test_spec_reference_is_generated_from_the_current_models(reference: str) -> None:
    expected = _generator().render()
    assert reference == expected, f"docs/spec-reference.md is stale: run `{REGENERATE}` and commit it"


# ---- every field path of every spec class is documented -----------------------------------------------


def _models(tp: Any) -> list[type[BaseModel]]:
    """Models reachable from an annotation: through Annotated, Optional, unions and homogeneous tuples."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _models(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _models(a)]
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return [m for a in args[:1] for m in _models(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _is_list(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _is_list(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(tp))
    return origin in (tuple, list)


def _paths(cls: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in cls.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        yield path
        below = f"{path}.<i>" if _is_list(info.annotation) else path
        for model in _models(info.annotation):
            yield from _paths(model, below)


def _spec_classes() -> list[type[BaseModel]]:
    """Every shipped kind's spec class (a new kind is checked by registering it; a kind installed from
    another package, like the test suite's, documents itself)."""
    import importlib

    from studies.kinds import KIND_MODULES

    return sorted(
        (importlib.import_module(m).KIND.spec_class() for m in KIND_MODULES), key=lambda c: c.__name__
    )


@pytest.mark.parametrize("cls", _spec_classes(), ids=lambda c: c.__name__)
def test_every_field_path_is_in_the_reference(cls: type[BaseModel], reference: str) -> None:
    import importlib

    paths = set(_paths(cls))
    assert len(paths) > 20  # the walk reached nested sections and union variants
    # Fields a kind sets itself are refused when given, so they are not listed for that kind.
    paths -= set(getattr(importlib.import_module(cls.__module__), "SET_BY_STUDY", {}))
    missing = sorted(p for p in paths if f"`{p}`" not in reference)
    assert not missing, f"not in docs/spec-reference.md (run `{REGENERATE}`): {missing}"


# ---- the repository does not point at internal notes ---------------------------------------------------


def _tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    ).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p]


def test_no_tracked_file_mentions_internal_notes() -> None:
    offenders = []
    for path in _tracked_files():
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for word in FORBIDDEN:
            if word in text:
                offenders.append(f"{path.relative_to(ROOT)}: {word}")
    assert not offenders, (
        "these files refer to notes outside the repository; point them at docs/ instead:\n  "
        + "\n  ".join(offenders)
    )


# ---- relative links resolve ----------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(path: Path) -> Iterator[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    for target in _LINK.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # absolute URL, mailto:, or an anchor in the same file
        yield target


def test_docs_exist() -> None:
    names = {p.name for p in _markdown_files()}
    assert {"science.md", "architecture.md", "extending.md", "spec-reference.md"} <= names


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(path: Path) -> None:
    broken = []
    for target in _relative_links(path):
        file_part = target.split("#", 1)[0]
        if file_part and not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"


# ---- the quick start works as written -------------------------------------------------------------------

QUICKSTART = ROOT / "docs" / "quickstart.md"
_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_EXPECT = re.compile(r"^# expect exit (\d+)\n")


def quickstart_blocks() -> list[tuple[str, int]]:
    """The quick start's ``bash`` blocks in order, each with the exit status it says it has (default 0)."""
    out = []
    for block in _BASH_BLOCK.findall(QUICKSTART.read_text(encoding="utf-8")):
        m = _EXPECT.match(block)
        out.append((block, int(m.group(1)) if m else 0))
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_quickstart_commands_run_as_written(tmp_path: Path) -> None:
    """Every command of docs/quickstart.md, in order, in a scratch directory that looks like the repo root
    (``studies`` and ``.venv`` linked): one tiny batch-size study on a generated ``.npz``, ending in a
    verdict, plus the refusals it shows (a design that cannot decide, a refused start that leaves nothing
    behind)."""
    import json
    import os

    (tmp_path / "studies").symlink_to(ROOT / "studies")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONPATH=str(ROOT), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    blocks = quickstart_blocks()
    assert len(blocks) >= 8 and any("autonorm-study run" in b for b, _ in blocks)
    outputs = []
    for block, expected in blocks:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == expected, (
            f"{block}\n--- exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        assert "Traceback" not in proc.stderr, block
        outputs.append(proc.stdout + proc.stderr)
    by_command = dict(zip((b for b, _ in blocks), outputs, strict=True))

    def output_of(fragment: str) -> str:
        return next(out for block, out in by_command.items() if fragment in block)

    # validate --print wrote a loadable spec of one's own data (status on stderr, not in the file).
    written = (tmp_path / "my_study" / "spec.yaml").read_text(encoding="utf-8")
    assert "type: arrays" in written and "ok:" not in written
    # The undecidable design was refused naming the fix arm, its attainable p, alpha and the seeds needed.
    refused = output_of("--set exploratory=false\n")
    assert "corrected" in refused and "alpha 0.05" in refused and "smallest attainable p" in refused
    # The refused start named the field and left nothing that blocks the corrected command, which ran.
    assert "resources.cpu" in output_of("resources.cpu=64")
    verdict = json.loads((tmp_path / "runs" / "my_study" / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["study_verdict"] == "inconclusive" and "underpowered" in verdict["study_reasons"]
    assert set(verdict["verdict"]) == {"corrected"} and verdict["exploratory"] is True
    assert "study verdict: inconclusive" in output_of('json.load(open("runs/my_study/verdict.json"))')
    # MLflow holds one run per confirmatory trial: 2 arms x 2 batch sizes x 2 seeds.
    compared = output_of("MlflowClient")
    assert compared.count("test_accuracy=") == 8 and "B= 16" in compared and "B= 64" in compared
