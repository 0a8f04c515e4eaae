"""Re-export of :mod:`studies.spec.urls` at its old path (imports only)."""

from studies.spec.urls import *  # noqa: F403
