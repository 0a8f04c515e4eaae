"""Re-export of :mod:`studies.kinds.batchsize.spec` at its old path (imports only)."""

from studies.kinds.batchsize.spec import *  # noqa: F403
