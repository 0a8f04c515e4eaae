"""Re-export of :mod:`studies.kinds.search.report` at its old path (imports only)."""

from studies.kinds.search.report import *  # noqa: F403
