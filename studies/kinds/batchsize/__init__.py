"""The batch-size kind: does the benefit of divergence-correcting layers shrink as the batch grows?"""

from studies.kinds.batchsize.kind import BatchSizeKind

__all__ = ["KIND"]

KIND = BatchSizeKind()
