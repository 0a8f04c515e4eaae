"""The batch-size correlation study: does a divergence-correcting layer get worse as the batch grows?

    python studies/batchsize_correlation.py                    # default spec; $RAY_ADDRESS or a local Ray
    python studies/batchsize_correlation.py --preset smoke     # 2 CPU cores, a few minutes, every output
    python studies/batchsize_correlation.py --preset local     # the full protocol on digits
    python studies/batchsize_correlation.py --set lr_policy=tuned
    ray job submit --working-dir . -- python studies/batchsize_correlation.py

The same as ``autonorm-study run studies/specs/batchsize_correlation.yaml``: phases, statistics and
outputs are in :mod:`studies.kinds.batchsize`; the science in docs/science.md. Rerun the same
command after a crash to resume.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a Ray job's uploaded copy runs this file
from studies.entrypoints import entry_script

DEFAULT_SPEC, main = entry_script(__file__, "batchsize_correlation.yaml", __doc__)

if __name__ == "__main__":
    sys.exit(main())
