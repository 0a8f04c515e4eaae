"""The batch-size kind: does the benefit of divergence-correcting layers shrink as the batch grows?

``KIND`` is the registered contract object (:class:`studies.kinds.batchsize.kind.BatchSizeKind`);
the run, status and report functions live in :mod:`studies.kinds.batchsize.study` (they import Ray).
"""

from studies.kinds.batchsize.kind import BatchSizeKind

__all__ = ["KIND"]

KIND = BatchSizeKind()
