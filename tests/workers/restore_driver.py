"""A study driver the restore test runs as a subprocess, SIGKILLs, and runs again.

Usage: python restore_driver.py ROOT RAY_TEMP_DIR [EPOCHS SLEEP_S] (each trial trains EPOCHS epochs of
SLEEP_S seconds; default 3 of 0.7 s). Prints ``RESULT <json>`` when the study ends.
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
SLEEP_S = 0.7


def plan_for(root: Path, epochs: int = EPOCHS, sleep_s: float = SLEEP_S) -> StudyPlan:
    return StudyPlan(
        name="restore",
        base_config={
            "training": {"epochs": epochs},
            "seed": 0,
            "sleep_s": sleep_s,
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
    epochs, sleep_s = (int(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 3 else (EPOCHS, SLEEP_S)
    repo = str(Path(__file__).resolve().parents[2])
    result = run_study(
        plan_for(root, epochs, sleep_s),
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
