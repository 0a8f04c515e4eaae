"""Trial config resolution, the trial session (report + checkpoint + resume), epoch pairing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import tune

from workers.trainable import (
    CHECKPOINT_FILE,
    TrialSession,
    _EpochReporter,
    resolve_trial_config,
    set_dotted,
)

BASE = {
    "model": {"type": "vit_lite", "norm": {"type": "autonorm", "tau": 0.5}},
    "training": {"epochs": 3, "freeze": {"t_freeze": 2}},
    "seed": 0,
}


def test_resolve_applies_dotted_params_without_touching_the_base() -> None:
    config = resolve_trial_config(
        BASE,
        {"model.norm.tau": 0.1, "training.freeze.rule": "always", "seed": 7, "model.linear.beta": 2.0},
    )
    assert config["model"]["norm"] == {"type": "autonorm", "tau": 0.1}
    assert config["training"]["freeze"] == {"t_freeze": 2, "rule": "always"}
    assert config["seed"] == 7
    assert config["model"]["linear"] == {"beta": 2.0}  # missing mappings are created
    assert BASE["model"]["norm"]["tau"] == 0.5  # type: ignore[index]
    assert "linear" not in BASE["model"]  # type: ignore[operator]


def test_resolve_accepts_nested_params() -> None:
    config = resolve_trial_config(BASE, {"model": {"norm": {"tau": 2.0}}})
    assert config["model"]["norm"]["tau"] == 2.0
    assert config["model"]["norm"]["type"] == "autonorm"


def test_set_dotted_refuses_to_descend_into_a_scalar() -> None:
    config: dict[str, Any] = {"seed": 0}
    with pytest.raises(ValueError, match="'seed' is a int"):
        set_dotted(config, "seed.x", 1)


class _Recorder:
    """Stands in for ``ray.tune.report``; keeps a copy of each checkpoint directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[dict[str, Any], Path | None]] = []
        self.sources: list[str] = []

    def __call__(self, metrics: dict[str, Any], checkpoint: tune.Checkpoint | None = None) -> None:
        kept = None
        if checkpoint is not None:
            kept = self.root / f"ckpt{len(self.calls)}"
            self.sources.append(checkpoint.path)
            shutil.copytree(checkpoint.path, kept)
        self.calls.append((metrics, kept))


def test_session_reports_status_node_and_a_resumable_checkpoint(tmp_path: Path) -> None:
    recorder = _Recorder(tmp_path)
    session = TrialSession(report_fn=recorder)
    assert session.resume_state is None
    state = {"epoch": 1, "weights": torch.arange(4.0)}
    session.report({"epoch": 1, "val_accuracy": 0.5}, state=state)
    session.report({"epoch": 2, "val_accuracy": 0.6}, status="completed")
    (first, ckpt), (second, no_ckpt) = recorder.calls
    assert first["status"] == "running" and second["status"] == "completed"
    assert first["node_id"] == "local"  # outside Ray
    assert no_ckpt is None
    assert ckpt is not None and (ckpt / CHECKPOINT_FILE).exists()
    # The temporary directory handed to Tune is gone after the report (Tune copied it).
    assert recorder.sources and not any(os.path.exists(src) for src in recorder.sources)

    resumed = TrialSession(report_fn=recorder, checkpoint=tune.Checkpoint.from_directory(str(ckpt)))
    loaded = resumed.resume_state
    assert loaded is not None
    assert loaded["epoch"] == 1
    assert torch.equal(loaded["weights"], state["weights"])
    assert session.device == "cpu"


@pytest.mark.parametrize("state_first", [True, False])
def test_epoch_reporter_pairs_metrics_with_state_in_either_order(state_first: bool) -> None:
    reports: list[tuple[dict[str, Any], Any, str]] = []

    class FakeSession:
        def report(self, metrics: dict[str, Any], *, state: Any = None, status: str = "running") -> None:
            reports.append((metrics, state, status))

    reporter = _EpochReporter(FakeSession(), num_epochs=2)  # type: ignore[arg-type]
    for epoch in (1, 2):
        if state_first:
            reporter.checkpoint_fn(epoch, {"e": epoch})
            reporter.on_epoch_end(epoch, None, {"val_accuracy": 0.1 * epoch})
        else:
            reporter.on_epoch_end(epoch, None, {"val_accuracy": 0.1 * epoch})
            reporter.checkpoint_fn(epoch, {"e": epoch})
    reporter.finish()
    assert [(m["epoch"], s, st) for m, s, st in reports] == [
        (1, {"e": 1}, "running"),
        (2, {"e": 2}, "completed"),
    ]


def test_epoch_reporter_flushes_metrics_without_state() -> None:
    reports: list[tuple[int, Any]] = []

    class FakeSession:
        def report(self, metrics: dict[str, Any], *, state: Any = None, status: str = "running") -> None:
            reports.append((metrics["epoch"], state))

    reporter = _EpochReporter(FakeSession(), num_epochs=3)  # type: ignore[arg-type]
    reporter.on_epoch_end(1, None, {"epoch": 1})
    assert reports == []  # waiting for the state
    reporter.finish()
    assert reports == [(1, None)]


AUTONORM_CONFIG: dict[str, Any] = {
    "data": {"type": "digits", "subset": 300, "val_fraction": 0.2},
    "model": {
        "type": "vit_lite",
        "preset": "tiny",
        "patch_size": 4,
        "norm": {"type": "autonorm", "tau": 0.5},
        "linear": {"type": "corrected", "beta": 1.0},
    },
    "training": {"epochs": 2, "batch_size": 32, "freeze": {"t_freeze": 1, "eps_h": 0.1, "rule": "always"}},
    "seed": 3,
}


def _without_timing(metrics: dict[str, Any]) -> dict[str, Any]:
    from autonorm_core.training import TIMING_KEYS

    return {k: v for k, v in metrics.items() if k not in TIMING_KEYS}


def test_autonorm_trial_reports_every_epoch_and_resumes_exactly(tmp_path: Path) -> None:
    from workers.trainable import autonorm_trial

    full = _Recorder(tmp_path / "full")
    (tmp_path / "full").mkdir()
    autonorm_trial(resolve_trial_config(AUTONORM_CONFIG, {}), TrialSession(report_fn=full))
    assert [m["epoch"] for m, _ in full.calls] == [1, 2]
    assert [m["status"] for m, _ in full.calls] == ["running", "completed"]
    assert all(ckpt is not None for _, ckpt in full.calls)
    first, last = full.calls[0][0], full.calls[1][0]
    assert {"val_accuracy", "train_loss", "gate_entropy", "selector_frozen"} <= set(first)
    assert last["selector_frozen"] == 1.0  # the "always" freeze rule fired at t_freeze = 1

    # Resume from epoch 1's checkpoint: only epoch 2 runs, with the same metrics as uninterrupted.
    resumed = _Recorder(tmp_path / "resumed")
    (tmp_path / "resumed").mkdir()
    ckpt = full.calls[0][1]
    assert ckpt is not None
    autonorm_trial(
        resolve_trial_config(AUTONORM_CONFIG, {}),
        TrialSession(report_fn=resumed, checkpoint=tune.Checkpoint.from_directory(str(ckpt))),
    )
    assert [m["epoch"] for m, _ in resumed.calls] == [2]
    assert _without_timing(resumed.calls[0][0]) == _without_timing(last)

    # Same seed, same history: the model init is seeded, not taken from the global RNG.
    again = _Recorder(tmp_path / "again")
    (tmp_path / "again").mkdir()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)  # a different global state must not matter
        autonorm_trial(resolve_trial_config(AUTONORM_CONFIG, {}), TrialSession(report_fn=again))
    assert [_without_timing(m) for m, _ in again.calls] == [_without_timing(m) for m, _ in full.calls]


def test_autonorm_trial_rejects_unknown_data_keys(tmp_path: Path) -> None:
    from workers.trainable import autonorm_trial

    config = resolve_trial_config(AUTONORM_CONFIG, {"data.shuffle": True})
    with pytest.raises(ValueError, match="unknown data keys \\['shuffle'\\]"):
        autonorm_trial(config, TrialSession(report_fn=_Recorder(tmp_path)))


@pytest.mark.parametrize(
    ("status", "history", "expected"),
    [
        # diverged mid-epoch 2: epoch 1 was reported as running; one more report says diverged
        ("diverged", [{"epoch": 1.0, "val_accuracy": 0.3}], ["running", "diverged"]),
        # an early stop after epoch 1 of 2: the final report says completed
        ("stopped", [{"epoch": 1.0, "val_accuracy": 0.3}], ["running", "completed"]),
        # diverged in epoch 1: no epoch finished, still one final report
        ("diverged", [], ["diverged"]),
    ],
)
def test_trial_ending_early_reports_its_final_status(
    monkeypatch: pytest.MonkeyPatch, status: str, history: list[dict[str, float]], expected: list[str]
) -> None:
    import autonorm_core.training as training
    from workers.trainable import autonorm_trial

    def fake_fit(model: Any, splits: Any, cfg: Any, *, callbacks: Any, checkpoint_fn: Any, **kw: Any) -> Any:
        for row in history:
            checkpoint_fn(int(row["epoch"]), {"epoch": row["epoch"]})
            for cb in callbacks:
                cb.on_epoch_end(int(row["epoch"]), model, dict(row))
        return training.FitResult(status=status, history=list(history))  # type: ignore[arg-type]

    monkeypatch.setattr(training, "fit", fake_fit)
    calls: list[dict[str, Any]] = []
    session = TrialSession(report_fn=lambda metrics, checkpoint=None: calls.append(metrics))
    autonorm_trial(resolve_trial_config(AUTONORM_CONFIG, {}), session)
    assert [c["status"] for c in calls] == expected
    if history:
        assert calls[-1]["val_accuracy"] == history[-1]["val_accuracy"]
