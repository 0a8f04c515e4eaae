"""Re-export of :mod:`studies.kinds.batchsize.spec` at its old path (imports only)."""

from studies.kinds.batchsize.spec import (
    CNN_ARMS,
    MLP_ARMS,
    AnalysisSpec,
    BatchSizeStudySpec,
    BatchSizeTrainingSpec,
    LRTuningSpec,
    cell_key,
)

__all__ = [
    "CNN_ARMS",
    "MLP_ARMS",
    "AnalysisSpec",
    "BatchSizeStudySpec",
    "BatchSizeTrainingSpec",
    "LRTuningSpec",
    "cell_key",
]
