"""Study kinds: one registry, one way to load, run, inspect and report every study.

Every spec names its kind in ``kind:`` (absent: :data:`DEFAULT_KIND`). A kind is a folder
``studies/kinds/<kind>/`` whose ``__init__.py`` defines ``KIND``, an object implementing the contract
:class:`studies.kinds.base.StudyKind` (documented there: spec class, phases, run, analyse, status,
report, power). :data:`KINDS` maps each ``kind:`` value to that object; adding a kind is one line of
:data:`KIND_MODULES` (docs/extending.md).

This module is the registry and loading only; running a spec is :mod:`studies.running`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.base import SHARED_VERDICT_FIELDS, Phase, StudyKind, StudyOutcome
from studies.schema import SpecError, SpecIssue, load_spec, parse_yaml, read_spec_text

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "KIND_MODULES",
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
"""The registered kinds: each module defines ``KIND`` (a :class:`StudyKind`). One line per kind."""

DEFAULT_KIND = "search"
"""The kind of a spec that names none in ``kind:``."""


def _registry() -> dict[str, StudyKind]:
    kinds: dict[str, StudyKind] = {}
    for module in KIND_MODULES:
        kind = importlib.import_module(module).KIND
        if not isinstance(kind, StudyKind) or kind.name in kinds:
            raise TypeError(f"{module}.KIND must be a StudyKind with a name of its own")
        kinds[kind.name] = kind
    return kinds


KINDS: dict[str, StudyKind] = _registry()
"""``kind:`` value -> the kind (:class:`studies.kinds.base.StudyKind`)."""


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
) -> Any:
    """Load and validate a spec file of any kind (preset, then ``--set`` overrides).

    Raises:
        SpecError: every problem found, with field paths and lines.
    """
    path = Path(path)
    if kind is None:
        document, lines = parse_yaml(read_spec_text(path), source=str(path))
        study_kind = kind_of(document, source=str(path), line=lines.get(("kind",)))
    else:
        study_kind = KINDS[kind]
    return load_spec(path, list(overrides), preset=preset, model=study_kind.spec_class())


def presets_of(path: str | Path) -> list[str]:
    """The preset names a spec file defines."""
    document, _ = parse_yaml(read_spec_text(path), source=str(path))
    presets = document.get("presets") if isinstance(document, Mapping) else None
    return sorted(presets) if isinstance(presets, Mapping) else []


def kind_for(spec: Any) -> StudyKind:
    """The kind of a validated spec."""
    return KINDS[str(getattr(spec, "kind", DEFAULT_KIND))]
