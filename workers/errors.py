"""Errors a study driver reports to the user as a message (the CLI exits 1), never as a traceback."""

from __future__ import annotations

__all__ = ["LeaseError", "ResourceError", "StudyError", "TrackingIncomplete"]


class StudyError(RuntimeError):
    """A study cannot run as asked: held by another driver, impossible resources, ..."""


class LeaseError(StudyError):
    """Another driver holds the study."""


class ResourceError(StudyError):
    """A trial asks for more than the cluster has."""


class TrackingIncomplete(StudyError):
    """The trials ran, but MLflow did not take all their results before ``tracking.final_flush_s``
    ran out; the results are kept in the study directory and the same command delivers them.

    Attributes:
        trials: the trial ids whose results are not all in MLflow.
    """

    def __init__(self, message: str, trials: list[str]) -> None:
        super().__init__(message)
        self.trials = list(trials)
