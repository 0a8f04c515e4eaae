"""Re-export of :mod:`studies.kinds.batchsize.report` at its old path (imports only)."""

from studies.kinds.batchsize.report import *  # noqa: F403
