"""Errors a study driver reports to the user as a message (the CLI exits 1), never as a traceback."""

from __future__ import annotations

__all__ = ["LeaseError", "ResourceError", "StudyError"]


class StudyError(RuntimeError):
    """A study cannot run as asked: held by another driver, impossible resources, ..."""


class LeaseError(StudyError):
    """Another driver holds the study."""


class ResourceError(StudyError):
    """A trial asks for more than the cluster has."""
