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

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # a Ray job's uploaded copy of the repository runs this file directly

from studies._entry import study_main  # noqa: E402

DEFAULT_SPEC = _ROOT / "studies" / "specs" / "batchsize_correlation.yaml"


def main(argv: list[str] | None = None) -> int:
    return study_main(
        argv, prog="batchsize_correlation.py", description=__doc__.splitlines()[0], default_spec=DEFAULT_SPEC
    )


if __name__ == "__main__":
    sys.exit(main())
