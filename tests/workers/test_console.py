"""What a study prints and what goes to its driver.log (workers/console.py), without a Ray cluster: Ray's,
Tune's, MLflow's and Optuna's loggers, what Tune prints while a phase runs, and what trial workers print."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from workers import console
from workers.console import (
    CHECKPOINT_LINE,
    DRIVER_LOG,
    StudyConsole,
    route_worker_output,
    terminal,
    tune_output,
)


class _Dispatcher:
    """The two attributes of Ray's worker-output dispatcher that the routing uses."""

    def __init__(self, handler: Any) -> None:
        self._lock = threading.Lock()
        self.handlers = [("ray_print_logs", handler)]

    def emit(self, data: dict[str, Any]) -> None:
        for _, handle in self.handlers:
            handle(data)


def test_foreign_loggers_go_to_the_driver_log_and_come_back_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_logger = logging.getLogger("ray")
    before = (list(ray_logger.handlers), ray_logger.propagate)
    for name in ("ray", "mlflow"):  # as the libraries set them when imported
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)
    log = tmp_path / "s" / DRIVER_LOG
    with StudyConsole(log, name="s", announce=True):
        logging.getLogger("ray._private.worker").info("Started a local Ray instance.")
        logging.getLogger("ray.tune.tune").info("Wrote the latest version of all result files")
        logging.getLogger("ray.tune.execution.tune_controller").error("Trial task failed for trial x")
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        logging.getLogger("ray._private.services").error("the raylet died")
        # A library that gives its logger a terminal handler once the study runs (Optuna does at import).
        late = logging.getLogger("optuna")
        stray = logging.StreamHandler(sys.stderr)
        late.addHandler(stray)
        console.active().adopt_loggers()  # type: ignore[union-attr]
        late.warning("A new study created in memory")
    out, err = capsys.readouterr()
    text = log.read_text()
    for line in (
        "Started a local Ray instance.",
        "Wrote the latest version",
        "Trial task failed",
        "Creating initial MLflow database tables",
        "the raylet died",
        "A new study created in memory",
    ):
        assert line in text
    assert out == f"[s] Ray, Tune and MLflow output -> {log}\n"
    # On the terminal: only an ERROR of Ray's core (not of Tune, whose failures the progress line counts).
    assert err == "the raylet died\n"
    assert (list(ray_logger.handlers), ray_logger.propagate) == before
    assert stray in logging.getLogger("optuna").handlers  # given back too
    logging.getLogger("optuna").removeHandler(stray)
    assert console.active() is None


def test_tune_prints_go_to_the_log_the_service_lines_to_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / DRIVER_LOG
    with tune_output():  # no study: nothing changes
        print("before any study")
    with StudyConsole(log, announce=False):
        with tune_output():
            print("╭──── Configuration for experiment tune-epochs ────╮")
            print("To visualize your results with TensorBoard, run: `tensorboard --logdir x`")
            print("[tune-epochs] 3/8 trials, 2 running, ETA 4 s", file=terminal(), flush=True)
        print("[study] after the phase")
    out = capsys.readouterr().out
    assert out == "before any study\n[tune-epochs] 3/8 trials, 2 running, ETA 4 s\n[study] after the phase\n"
    text = log.read_text()
    assert "Configuration for experiment" in text and "TensorBoard" in text and "[study]" not in text


def test_worker_output_goes_to_the_log_except_the_services_own_lines(tmp_path: Path) -> None:
    printed: list[list[str]] = []
    dispatcher = _Dispatcher(lambda data: printed.append(list(data["lines"])))
    assert not route_worker_output(dispatcher)  # no study: Ray prints as it does
    log = tmp_path / DRIVER_LOG
    with StudyConsole(log, announce=False):
        assert route_worker_output(dispatcher)
        assert route_worker_output(dispatcher)  # wrapped once
        assert len(dispatcher.handlers) == 1
        own = "[confirm-epochs] trial 3f_00001: its newest checkpoint is unreadable; resumed from checkpoint_000001"
        dispatcher.emit(
            {
                "pid": 42,
                "is_err": True,
                "actor_name": "ImplicitFunc",
                "lines": ["UserWarning: x", own, "more"],
            }
        )
        dispatcher.emit({"pid": "autoscaler", "lines": ["Node status", "Resized to 4 CPUs :event_summary:"]})
        ckpt = f"{CHECKPOINT_LINE} at: Checkpoint(filesystem=local, path=/r/t/checkpoint_000003)"
        dispatcher.emit({"pid": 43, "lines": [ckpt]})  # one a trial epoch: not even in the log
    dispatcher.emit({"pid": 7, "lines": ["after the study"]})  # the wrapper follows the active console
    assert printed == [[own], ["after the study"]]
    text = log.read_text()
    assert "(ImplicitFunc pid=42) UserWarning: x\n(ImplicitFunc pid=42) more\n" in text
    assert "Resized to 4 CPUs" in text and "Node status" not in text
    assert "after the study" not in text and own not in text and CHECKPOINT_LINE not in text


def test_optuna_says_its_study_was_created_in_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search phase imports Optuna (which gives its logger a terminal handler then) and creates its
    study at once: the "A new study created" line goes to the log, not to the terminal."""
    import optuna

    log = tmp_path / DRIVER_LOG
    # Another test in this worker may have lowered Optuna's verbosity (a module-wide setting): the
    # line is only written at INFO.
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        with StudyConsole(log, announce=False):
            optuna.create_study(study_name="quiet-console")
    finally:
        optuna.logging.set_verbosity(before)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    assert "A new study created in memory with name: quiet-console" in log.read_text()
