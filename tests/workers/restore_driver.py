"""A study driver the restore test runs as a subprocess, SIGKILLs, and runs again.

Usage: python restore_driver.py ROOT RAY_TEMP_DIR. Prints ``RESULT <json>`` when the study ends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.workers.trials import quadratic_trial
from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig
from workers.runner import run_study

NUM_SAMPLES = 6
EPOCHS = 3


def plan_for(root: Path) -> StudyPlan:
    return StudyPlan(
        name="restore",
        base_config={
            "training": {"epochs": EPOCHS},
            "seed": 0,
            "sleep_s": 0.7,
            "log_file": str(root / "invocations.jsonl"),
        },
        space=(ParamDef("x", "float", low=0.0, high=1.0),),
        sampler=SamplerConfig(type="tpe", seed=1, n_startup_trials=3),
        num_samples=NUM_SAMPLES,
        max_concurrent=2,
        storage=StorageConfig(path=str(root / "runs")),
        tracking=TrackingConfig(experiment="restore"),
    )


def main() -> None:
    root, temp_dir = Path(sys.argv[1]), sys.argv[2]
    repo = str(Path(__file__).resolve().parents[2])
    result = run_study(
        plan_for(root),
        trainable=quadratic_trial,
        progress=True,
        ray_init_kwargs={
            "num_cpus": 2,
            "_temp_dir": temp_dir,
            "log_to_driver": False,
            "runtime_env": {
                "env_vars": {"PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
            },
        },
    )
    summary = {
        "restored": result.restored,
        "parent": result.parent_run_id,
        "tracking_uri": result.tracking_uri,
        "trials": {t.trial_id: {"status": t.status, "run": t.mlflow_run_id} for t in result.trials},
    }
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
