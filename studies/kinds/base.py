"""The base classes of a shipped kind's folder: :class:`FolderKind` and the :class:`KindParts` its
:meth:`FolderKind.parts` hands over (the contract itself is :mod:`studies.contract`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.contract import Phase, StudyKind

__all__ = [
    "FolderKind",
    "KindParts",
]


@dataclass(frozen=True)
class KindParts:
    """What a kind's folder provides, handed over by the kind's own :meth:`FolderKind.parts`, which
    imports its modules by name (so the imports are plain imports that tools and readers follow).

    Attributes:
        spec_class: the kind's pydantic spec class (``spec.py``).
        undecidable: ``undecidable(spec)`` of ``decidability.py``: what the design can never decide.
        pilot: ``pilot(spec, study_dir, *, power, min_effect, alpha)`` of ``power.py`` (``plan --pilot``).
        phases: ``phases(spec)`` of ``plans.py``; ``None`` where the class builds its phases itself.
        design: the kind's :class:`~studies.kinds.pipeline.TunedDesign` (``workflow.DESIGN``) for a
            tuned-design kind, else ``None``.
    """

    spec_class: type[BaseModel]
    undecidable: Callable[[Any], Iterable[Any]]
    pilot: Callable[..., dict[str, Any]]
    phases: Callable[[Any], Iterable[Phase]] | None = None
    design: Any = None


class FolderKind(StudyKind):
    """A kind laid out as a package of its own (``studies/kinds/<kind>/``, docs/architecture.md):
    the class in ``kind.py`` names its folder's pieces in :meth:`parts` (spec class, phases,
    decidability, ``plan --pilot``), imported when a method needs them, so the registry stays light."""

    @abstractmethod
    def parts(self) -> KindParts:
        """The folder's pieces: import the modules inside this method and name what they provide."""

    def spec_class(self) -> type[BaseModel]:
        return self.parts().spec_class

    def phases(self, spec: Any) -> list[Phase]:
        phases = self.parts().phases
        if phases is None:
            raise NotImplementedError(f"{type(self).__name__} names no phases in parts() and builds none")
        return list(phases(spec))

    def undecidable(self, spec: Any) -> list[Any]:
        return list(self.parts().undecidable(spec))

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        return self.parts().pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)
