"""The batch-size kind: does the benefit of divergence-correcting layers shrink as the batch grows?

``KIND`` is the registered kind (:class:`studies.kinds.batchsize.kind.BatchSizeKind`): its methods are the kind; the
heavy work (Ray, pandas) is in :mod:`studies.kinds.batchsize.workflow`, imported on use.
"""

from studies.kinds.batchsize.kind import BatchSizeKind

__all__ = ["KIND"]

KIND = BatchSizeKind()
