"""The search kind: one Optuna (or grid) search under Ray Tune, optionally followed by the AutoNorm
claims study (``confirm:``).

``KIND`` is the registered kind (:class:`studies.kinds.search.kind.SearchKind`): its methods are the kind; the
heavy work (Ray, pandas) is in :mod:`studies.kinds.search.workflow`, imported on use.
"""

from studies.kinds.search.kind import SearchKind

__all__ = ["KIND"]

KIND = SearchKind()
