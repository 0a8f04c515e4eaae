"""Trial functions injected into ``run_study`` by the tests (cheap, deterministic, file-counted).

Each call appends a line to ``config["log_file"]`` so a test can count how often Tune invoked the
trainable and from which epoch it resumed.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from workers.trainable import TrialSession


def quadratic_trial(config: dict[str, Any], session: TrialSession) -> None:
    """Reports ``val_accuracy = 1 - (x - 0.3)^2`` rising over epochs; checkpoints ``{"epoch": e}``."""
    epochs = int(config["training"]["epochs"])
    x = float(config.get("x", 0.5))
    sleep_s = float(config.get("sleep_s", 0.0))
    state = session.resume_state
    start = int(state["epoch"]) + 1 if state else 1
    log_file = config.get("log_file")
    if log_file:
        with open(log_file, "a") as fh:
            fh.write(json.dumps({"event": "start", "trial": session.trial_id, "x": x, "start": start}) + "\n")
    for epoch in range(start, epochs + 1):
        time.sleep(sleep_s)
        quality = 1.0 - (x - 0.3) ** 2
        metrics = {
            "epoch": epoch,
            "val_accuracy": quality * epoch / epochs,
            "train_loss": 1.0 / epoch,
            "gate_entropy": math.log(2) / epoch,
            "ray_internal_looking": 123.0,
        }
        session.report(metrics, state={"epoch": epoch}, status="completed" if epoch == epochs else "running")
    if log_file:
        with open(log_file, "a") as fh:
            fh.write(json.dumps({"event": "end", "trial": session.trial_id, "t": time.time()}) + "\n")
