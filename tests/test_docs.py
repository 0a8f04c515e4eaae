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
    from studies.batchsize_spec import BatchSizeStudySpec
    from studies.spec import StudySpec

    return [StudySpec, BatchSizeStudySpec]


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
