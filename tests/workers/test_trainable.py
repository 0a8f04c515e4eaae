"""Trial config resolution, the trial session (report + checkpoint + resume), epoch pairing, the
reports of a diverged trial."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import tune

from workers.dotted import PathError
from workers.trainable import (
    CHECKPOINT_FILE,
    CONFIG_RESULT_KEY,
    TrialSession,
    _EpochReporter,
    config_from_result,
    resolve_trial_config,
    tune_entry,
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


def test_resolve_goes_through_workers_dotted_list_indices_included() -> None:
    base = {"model": {"hidden": [64, 64, 32]}, "seed": 0}
    config = resolve_trial_config(base, {"model.hidden.1": 128, "model.hidden.-1": 16})
    assert config["model"]["hidden"] == [64, 128, 16]
    assert base["model"]["hidden"] == [64, 64, 32]  # type: ignore[index]
    with pytest.raises(PathError, match="index 3 out of range"):
        resolve_trial_config(base, {"model.hidden.3": 1})
    with pytest.raises(PathError, match="seed is a single value"):
        resolve_trial_config(base, {"seed.x": 1})


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


def test_session_reports_status_node_and_a_resumable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # outside Ray (the suite may share a cluster)
    recorder = _Recorder(tmp_path)
    session = TrialSession(report_fn=recorder)
    assert session.resume_state is None
    state: dict[str, Any] = {"epoch": 1, "weights": torch.arange(4.0)}
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
    from workers.trainable import WALL_KEYS

    return {k: v for k, v in metrics.items() if k not in TIMING_KEYS + WALL_KEYS}


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


# ------------------------------------------------------------------ search metric, resolved config


def test_every_report_carries_the_search_metric_nan_when_missing() -> None:
    calls: list[dict[str, Any]] = []
    session = TrialSession(report_fn=lambda m, checkpoint=None: calls.append(m), metric="val_rmse")
    session.report({"epoch": 1, "val_rmse": 0.25})
    session.report({"epoch": 2})
    session.report({"epoch": 3, "val_rmse": None}, status="diverged")
    assert calls[0]["val_rmse"] == 0.25
    assert math.isnan(calls[1]["val_rmse"]) and math.isnan(calls[2]["val_rmse"])
    # Without a metric nothing is added (the trial function's keys only).
    bare: list[dict[str, Any]] = []
    TrialSession(report_fn=lambda m, checkpoint=None: bare.append(m)).report({"epoch": 1})
    assert set(bare[0]) == {"epoch", "status", "node_id", "wall_started", "wall_reported"}
    assert bare[0]["wall_started"] <= bare[0]["wall_reported"]


def test_resolved_config_travels_in_every_report_and_is_read_back() -> None:
    config = resolve_trial_config(BASE, {"model.norm.tau": 0.1, "seed": 4})
    calls: list[dict[str, Any]] = []
    session = TrialSession(report_fn=lambda m, checkpoint=None: calls.append(m), config=config)
    session.report({"epoch": 1})
    session.report({"epoch": 2}, status="completed")
    assert all(isinstance(c[CONFIG_RESULT_KEY], str) for c in calls)  # text: no metric logger takes it
    assert json.loads(calls[-1][CONFIG_RESULT_KEY]) == config
    # The driver reads it back without resolving; a trial that never reported falls back to resolving.
    sentinel_base = {"never": "used"}
    assert config_from_result(calls[-1], sentinel_base, {}) == config
    assert config_from_result(None, BASE, {"seed": 4}) == resolve_trial_config(BASE, {"seed": 4})
    assert config_from_result({CONFIG_RESULT_KEY: "{not json"}, BASE, {}) == resolve_trial_config(BASE, {})


def test_tune_entry_resolves_once_and_gives_the_session_metric_and_config() -> None:
    seen: list[tuple[dict[str, Any], TrialSession]] = []
    tune_entry(
        {"model.norm.tau": 0.2, "training": {"epochs": 5}},
        trial_fn=lambda config, session: seen.append((config, session)),
        base_config=BASE,
        tracking_uri="sqlite:////tmp/x.db",
        metric="val_accuracy",
    )
    [(config, session)] = seen
    assert config == resolve_trial_config(BASE, {"model.norm.tau": 0.2, "training.epochs": 5})
    assert session.metric == "val_accuracy" and session.tracking_uri == "sqlite:////tmp/x.db"
    assert session.resume_state is None


DIABETES_SGD: dict[str, Any] = {
    "data": {"type": "diabetes"},
    "model": {"type": "mlp", "preset": "tiny"},
    "training": {"epochs": 2, "batch_size": 32, "lr": 5.0, "optimizer": "sgd", "grad_clip": None},
    "seed": 0,
}


def test_real_divergence_in_epoch_one_reports_epoch_zero_nan_metric_and_the_loss() -> None:
    """The reproduction of the study crash: diabetes, plain SGD at lr 5, no clipping."""
    from workers.trainable import autonorm_trial

    calls: list[dict[str, Any]] = []
    session = TrialSession(
        report_fn=lambda m, checkpoint=None: calls.append(m), metric="val_rmse", config=DIABETES_SGD
    )
    autonorm_trial(resolve_trial_config(DIABETES_SGD, {}), session)
    [final] = calls
    assert final["status"] == "diverged"
    assert final["epoch"] == 0
    assert math.isnan(final["val_rmse"])
    assert not math.isfinite(final["train_loss"])
    assert json.loads(final[CONFIG_RESULT_KEY]) == DIABETES_SGD


_INF, _NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("history", "divergence", "expected"),
    [
        # no whole epoch: epoch 0, the training loss as observed, the metric NaN
        ([], ("training", _INF, 1, 3), {"epoch": 0, "train_loss": math.inf}),
        ([], ("training", _NAN, 1, 0), {"epoch": 0, "train_loss": math.nan}),
        # epoch 1 finished: its metrics (the search metric included), the blown-up loss on top
        (
            [{"epoch": 1.0, "val_accuracy": 0.3, "train_loss": 0.9}],
            ("training", -_INF, 2, 40),
            {"epoch": 1.0, "val_accuracy": 0.3, "train_loss": -math.inf},
        ),
        # the validation loss blew up after epoch 2: no whole-epoch training loss for epoch 2
        (
            [{"epoch": 1.0, "val_accuracy": 0.3, "train_loss": 0.9}],
            ("validation", _INF, 2, None),
            {"epoch": 1.0, "val_accuracy": 0.3, "train_loss": math.nan, "val_loss": math.inf},
        ),
        # no record (a fit from before the typed record): NaN, never the last finite epoch's loss
        (
            [{"epoch": 1.0, "val_accuracy": 0.3, "train_loss": 0.9}],
            None,
            {"epoch": 1.0, "train_loss": math.nan},
        ),
    ],
)
def test_diverged_final_report(
    monkeypatch: pytest.MonkeyPatch,
    history: list[dict[str, float]],
    divergence: tuple[Any, ...] | None,
    expected: dict[str, float],
) -> None:
    """The trial reads the fit's typed Divergence, not its message: a message in another wording
    changes nothing."""
    import autonorm_core.training as training
    from workers.trainable import autonorm_trial

    record = None if divergence is None else training.Divergence(*divergence)

    def fake_fit(model: Any, splits: Any, cfg: Any, *, callbacks: Any, checkpoint_fn: Any, **kw: Any) -> Any:
        for row in history:
            checkpoint_fn(int(row["epoch"]), {"epoch": row["epoch"]})
            for cb in callbacks:
                cb.on_epoch_end(int(row["epoch"]), model, dict(row))
        return training.FitResult(
            status="diverged", history=list(history), message="the loss went away", divergence=record
        )

    monkeypatch.setattr(training, "fit", fake_fit)
    calls: list[dict[str, Any]] = []
    session = TrialSession(report_fn=lambda m, checkpoint=None: calls.append(m), metric="val_accuracy")
    autonorm_trial(resolve_trial_config(AUTONORM_CONFIG, {}), session)
    final = calls[-1]
    assert final["status"] == "diverged"
    assert len(calls) == len(history) + 1
    for key, value in expected.items():
        assert (math.isnan(final[key]) and math.isnan(value)) or final[key] == value, (key, final[key])
    if not history:
        assert math.isnan(final["val_accuracy"])


# ---- application errors are retried in-process; only process/node deaths reach Tune -------------


def _recording_session() -> tuple[TrialSession, list[dict[str, Any]]]:
    reports: list[dict[str, Any]] = []
    session = TrialSession(
        report_fn=lambda payload, **_: reports.append(dict(payload)), metric="val_accuracy"
    )
    return session, reports


def test_an_application_error_is_retried_from_the_last_state_then_succeeds() -> None:
    from workers.trainable import run_with_retries

    session, reports = _recording_session()
    calls: list[Any] = []

    def flaky(config: dict[str, Any], s: TrialSession) -> None:
        calls.append(s.resume_state)
        start = (s.resume_state or {}).get("epoch", 0)
        for epoch in range(start + 1, 4):
            s.report(
                {"epoch": epoch, "val_accuracy": 0.5},
                state={"epoch": epoch},
                status="completed" if epoch == 3 else "running",
            )
            if epoch == 2 and len(calls) == 1:
                raise RuntimeError("a flaky data loader")

    session._report_fn = lambda payload, **_: reports.append(dict(payload))  # no Tune checkpoint objects
    run_with_retries(flaky, {}, session, retries=1)
    assert calls == [None, {"epoch": 2}]  # the retry resumed from the last reported state
    assert [r["epoch"] for r in reports] == [1, 2, 3] and reports[-1]["status"] == "completed"


def test_an_application_error_beyond_retries_ends_the_trial_with_status_error() -> None:
    from workers.search import classify_completion
    from workers.trainable import run_with_retries

    session, reports = _recording_session()
    attempts: list[int] = []

    def broken(config: dict[str, Any], s: TrialSession) -> None:
        attempts.append(1)
        raise ValueError("bad config")

    run_with_retries(broken, {}, session, retries=2)  # returns: the error is a result, not a crash
    assert len(attempts) == 3
    assert reports[-1]["status"] == "error" and reports[-1]["attempts"] == 3.0
    assert math.isnan(reports[-1]["val_accuracy"])  # the search metric is always there
    assert classify_completion(reports[-1], error=False, metric="val_accuracy") == ("fail", None)


def test_ray_control_flow_exceptions_are_not_swallowed() -> None:
    from ray.exceptions import RayTaskError

    from workers.trainable import run_with_retries

    session, _ = _recording_session()

    def stopped(config: dict[str, Any], s: TrialSession) -> None:
        raise RayTaskError("fn", "tb", ValueError("x"))

    with pytest.raises(RayTaskError):
        run_with_retries(stopped, {}, session, retries=5)
