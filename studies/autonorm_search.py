"""AutoNorm search: T_freeze, ε_H, freeze rule, Gumbel τ and divergence-fix variant (+ lr) with Optuna.

    python studies/autonorm_search.py --preset smoke            # 2 CPU cores, a few minutes
    python studies/autonorm_search.py --set storage_path=/data/runs --set search.num_samples=96
    ray job submit --working-dir . -- python studies/autonorm_search.py --preset smoke

The same as ``autonorm-study run studies/specs/autonorm_search.yaml`` (:mod:`studies.kinds.search`).
Prints the best completed configuration, its metric and the MLflow study run, and logs the gate
entropy per layer of the trials as a plot on that run.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # a Ray job's uploaded copy of the repository runs this file directly

from studies._entry import study_main  # noqa: E402

DEFAULT_SPEC = _ROOT / "studies" / "specs" / "autonorm_search.yaml"


def main(argv: list[str] | None = None) -> int:
    return study_main(
        argv, prog="autonorm_search.py", description=__doc__.splitlines()[0], default_spec=DEFAULT_SPEC
    )


if __name__ == "__main__":
    sys.exit(main())
