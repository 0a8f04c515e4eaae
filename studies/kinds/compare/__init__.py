"""The compare kind: arms x seeds, paired contrasts against reference arms (the Affine Divergence table)."""

from studies.kinds.compare.kind import CompareKind

__all__ = ["KIND"]

KIND = CompareKind()
