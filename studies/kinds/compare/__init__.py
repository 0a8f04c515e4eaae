"""The compare kind: arms x seeds, paired contrasts against reference arms (the Affine Divergence table).

``KIND`` is the registered contract object (:class:`studies.kinds.compare.kind.CompareKind`); the
run, status and report functions live in :mod:`studies.kinds.compare.study` (they import Ray).
"""

from studies.kinds.compare.kind import CompareKind

__all__ = ["KIND"]

KIND = CompareKind()
