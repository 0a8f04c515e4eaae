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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a Ray job's uploaded copy runs this file
from studies.entrypoints import entry_script

DEFAULT_SPEC, main = entry_script(__file__, "autonorm_search.yaml", __doc__)

if __name__ == "__main__":
    sys.exit(main())
