"""Study kinds: the registry, and loading a spec of any kind.

Every spec names its kind in ``kind:`` (absent: :data:`DEFAULT_KIND`). A kind is an instance of a
:class:`studies.contract.StudyKind` subclass, whose methods are the kind (spec class, phases,
run, analyse, status, report, power; documented there). :data:`KINDS` maps each ``kind:`` value to
it, from two sources:

* the shipped kinds, one line each of :data:`KIND_MODULES` (a package ``studies/kinds/<kind>/``
  whose ``__init__.py`` defines ``KIND``);
* kinds installed from other packages: entry points in the group :data:`ENTRY_POINT_GROUP`, each
  naming a :class:`StudyKind` subclass or instance (``pyproject.toml``: ``[project.entry-points.
  "autonorm_studies.kinds"] mykind = "my_package.kind:MyKind"``; docs/extending.md).

Two kinds of one name are refused at load, both sources named. This module is the registry only;
running a spec is :mod:`studies.running`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.contract import SHARED_VERDICT_FIELDS, Phase, StudyKind, StudyOutcome
from studies.schema import SpecError, SpecIssue, load_spec, parse_yaml, read_spec_text

__all__ = [
    "DEFAULT_KIND",
    "ENTRY_POINT_GROUP",
    "KINDS",
    "KIND_MODULES",
    "KIND_SOURCES",
    "SHARED_VERDICT_FIELDS",
    "Phase",
    "StudyKind",
    "StudyOutcome",
    "kind_for",
    "kind_of",
    "load_study",
    "presets_of",
]

KIND_MODULES: tuple[str, ...] = (
    "studies.kinds.search",
    "studies.kinds.batchsize",
    "studies.kinds.compare",
)
"""The shipped kinds: each module defines ``KIND`` (a :class:`StudyKind`). One line per kind."""

ENTRY_POINT_GROUP = "autonorm_studies.kinds"
"""The entry-point group through which other installed packages add kinds."""

DEFAULT_KIND = "search"
"""The kind of a spec that names none in ``kind:``."""


def _as_kind(loaded: Any, source: str) -> StudyKind:
    kind = loaded() if isinstance(loaded, type) and issubclass(loaded, StudyKind) else loaded
    if not isinstance(kind, StudyKind) or not isinstance(getattr(kind, "name", None), str):
        raise TypeError(f"{source} must be a StudyKind subclass or instance with a `name`, got {loaded!r}")
    return kind


def _registry() -> tuple[dict[str, StudyKind], dict[str, str]]:
    kinds: dict[str, StudyKind] = {}
    sources: dict[str, str] = {}
    found: list[tuple[str, Callable[[], Any]]] = [
        (f"{module}.KIND", functools.partial(lambda m: importlib.import_module(m).KIND, module))
        for module in KIND_MODULES
    ]
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        where = f" (package {ep.dist.name})" if ep.dist is not None else ""
        found.append((f"entry point {ep.name} = {ep.value}{where}", ep.load))
    for source, load in found:
        kind = _as_kind(load(), source)
        if kind.name in kinds:
            raise TypeError(f"two study kinds are named {kind.name!r}: {sources[kind.name]} and {source}")
        kinds[kind.name], sources[kind.name] = kind, source
    return kinds, sources


KINDS: dict[str, StudyKind]
"""``kind:`` value -> the kind (:class:`studies.contract.StudyKind`)."""
KIND_SOURCES: dict[str, str]
"""``kind:`` value -> where it came from (``studies.kinds.batchsize.KIND``, ``entry point ...``)."""
KINDS, KIND_SOURCES = _registry()


def kind_of(document: Mapping[str, Any], *, source: str | None = None, line: int | None = None) -> StudyKind:
    """The kind a loaded YAML document declares (:data:`DEFAULT_KIND` when it declares none).

    Raises:
        SpecError: ``kind`` is not one of :data:`KINDS` (a mapping, a list, an unknown name), with the
            field, the line where known and the known kinds.
    """
    name = document.get("kind", DEFAULT_KIND) if isinstance(document, Mapping) else DEFAULT_KIND
    if not isinstance(name, str) or name not in KINDS:
        shown = (
            repr(name) if isinstance(name, str | int | float | bool) or name is None else type(name).__name__
        )
        what = f"unknown study kind {shown}" if isinstance(name, str) else f"must be a kind name, got {shown}"
        raise SpecError([SpecIssue("kind", f"{what}; valid: {', '.join(sorted(KINDS))}", line, source)])
    return KINDS[name]


def load_study(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    preset: str | None = None,
    kind: str | None = None,
    stored: bool = False,
) -> Any:
    """Load and validate a spec file of any kind (preset, then ``--set`` overrides); ``stored``: the
    file is a study's ``study_spec.yaml``, whose fields added since it was written take the value
    the study ran with (:func:`studies.schema.stored_defaults_missing`).

    Raises:
        SpecError: every problem found, with field paths and lines.
    """
    path = Path(path)
    if kind is None:
        document, lines = parse_yaml(read_spec_text(path), source=str(path))
        study_kind = kind_of(document, source=str(path), line=lines.get(("kind",)))
    else:
        study_kind = KINDS[kind]
    return load_spec(path, list(overrides), preset=preset, model=study_kind.spec_class(), stored=stored)


def presets_of(path: str | Path) -> list[str]:
    """The preset names a spec file defines."""
    document, _ = parse_yaml(read_spec_text(path), source=str(path))
    presets = document.get("presets") if isinstance(document, Mapping) else None
    return sorted(presets) if isinstance(presets, Mapping) else []


def kind_for(spec: Any) -> StudyKind:
    """The kind of a validated spec."""
    return KINDS[str(getattr(spec, "kind", DEFAULT_KIND))]
