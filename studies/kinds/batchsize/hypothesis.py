"""What the batch-size study claims and the design it needs to decide: constants only, no statistics.

Kept apart from :mod:`studies.kinds.batchsize.analysis` so that validating or planning a spec
(which quotes the hypothesis and checks the design) does not import NumPy's statistics stack
(SciPy, pandas): ``autonorm-study validate`` stays a fraction of a second.
"""

from __future__ import annotations

HYPOTHESIS = (
    "Performance of layers that correct the affine divergence correlates negatively with batch size "
    "(it gets worse as B grows); BatchNorm and plain affine layers do not show this trend."
)

#: Arms the hypothesis predicts to get worse with B (the divergence-correcting layers); the others
#: (plain affine, BatchNorm, LayerNorm and their conv versions) are predicted to show no such trend.
DIVERGENCE_FIXES = frozenset({"prenorm_l2", "prenorm_rms", "corrected", "patchnorm"})

#: Default minimum number of seeds with data in every cell (docs/science.md §2 asks for >= 5).
MIN_SEEDS = 5

#: Fewer batch sizes than this cannot show a trend: the design is underpowered by rule.
MIN_BATCH_SIZES = 4
