"""Re-export of :mod:`studies.kinds.search.claims` at its old path (imports only)."""

from studies.kinds.search.claims import *  # noqa: F403
