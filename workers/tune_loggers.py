"""The logger callbacks a study's Tuner runs with: Tune's CSV and JSON loggers, and no TensorBoard.

Tune adds a ``TBXLoggerCallback`` to every run that has none (tensorboardX comes with Ray's extras):
an event file per trial with every numeric key of every result, written through a multiprocessing
queue. Nobody here reads them (the trials' results are in MLflow and in each trial's ``result.json``,
which :mod:`workers.results` reads), and it was the costliest callback of a study's driver: 15 s of a
profiled stacked batch-size `local` study, whose groups report every member's metrics. A
:class:`NoTensorBoard` in the callbacks counts as Tune's TensorBoard logger, so Tune adds none; a
study restored from an older snapshot keeps the callbacks it was started with.
"""

from __future__ import annotations

from typing import Any

from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

__all__ = ["NoTensorBoard", "study_loggers"]


class NoTensorBoard(TBXLoggerCallback):  # type: ignore[misc]
    """Tune's TensorBoard logger slot, writing nothing."""

    def __init__(self) -> None:  # Tune's imports tensorboardX and prepares its writers
        pass

    def log_trial_start(self, trial: Any) -> None:
        pass

    def log_trial_result(self, iteration: int, trial: Any, result: Any) -> None:
        pass

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        pass


def study_loggers() -> list[Any]:
    """Tune's CSV and JSON loggers and :class:`NoTensorBoard`, for ``RunConfig(callbacks=...)``."""
    return [CSVLoggerCallback(), JsonLoggerCallback(), NoTensorBoard()]
