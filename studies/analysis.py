"""Re-export of :mod:`studies.kinds.batchsize.analysis` at its old path (imports only)."""

from studies.kinds.batchsize.analysis import *  # noqa: F403
