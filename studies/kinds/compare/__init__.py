"""The compare kind: arms x seeds, paired contrasts against reference arms (the Affine Divergence table).

``KIND`` is the registered kind (:class:`studies.kinds.compare.kind.CompareKind`): its methods are the kind; the
heavy work (Ray, pandas) is in :mod:`studies.kinds.compare.workflow`, imported on use.
"""

from studies.kinds.compare.kind import CompareKind

__all__ = ["KIND"]

KIND = CompareKind()
