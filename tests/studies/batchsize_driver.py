"""A batch-size study driver that the kill test runs as a subprocess, SIGKILLs mid-way, and runs again.

Usage: python -m tests.studies.batchsize_driver STORAGE RAY_TEMP_DIR [stacked]. Prints ``RESULT <json>``
at the end. The trial function is the planted one of test_batchsize_study, slowed down so that a kill
lands inside a phase; with ``stacked``, the real one (tiny MLP on digits), each cell's trials trained
as stacked groups (``execution.stack: auto``), so that a kill lands inside a group.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from studies.kinds import load_study
from studies.running import run_study_spec
from workers.trainable import TrialSession

SPEC = Path(__file__).resolve().parents[2] / "studies" / "specs" / "batchsize_correlation.yaml"
# 2 arms x 2 batch sizes (the fewest the spec accepts; the reference B = 32 among them), not the smoke's 3 x 3
OVERRIDES = [
    "arms=[linear,corrected]",
    "batch_sizes=[32,128]",
    "lr_tuning.points=3",
    "lr_tuning.max_extensions=0",
    "analysis.n_boot=200",
    "analysis.n_perm=999",
]


def slow_planted_trial(config: dict[str, Any], session: TrialSession) -> None:
    from tests.studies.test_batchsize_study import planted_trial

    time.sleep(0.5)
    planted_trial(config, session)


def spec_for(storage: Path) -> Any:
    return load_study(SPEC, [f"storage_path={storage}", *OVERRIDES], preset="smoke")


def main() -> None:
    storage, temp_dir = Path(sys.argv[1]), sys.argv[2]
    stacked = sys.argv[3:] == ["stacked"]
    repo = str(Path(__file__).resolve().parents[2])
    out = run_study_spec(
        spec_for(storage),
        trainable=None if stacked else slow_planted_trial,
        ray_init_kwargs={
            "num_cpus": 2,
            "_temp_dir": temp_dir,
            "log_to_driver": False,
            "runtime_env": {
                "env_vars": {"PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
            },
        },
    )
    print("RESULT " + json.dumps({"parent": out.parent_run_id, "tracking_uri": out.tracking_uri}), flush=True)


if __name__ == "__main__":
    main()
