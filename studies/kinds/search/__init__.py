"""The search kind: one Optuna (or grid) search under Ray Tune, optionally followed by the AutoNorm
claims study (``confirm:``).

``KIND`` is the registered contract object (:class:`studies.kinds.search.kind.SearchKind`); the
run, status and report functions live in :mod:`studies.kinds.search.study` (they import Ray).
"""

from studies.kinds.search.kind import SearchKind

__all__ = ["KIND"]

KIND = SearchKind()
