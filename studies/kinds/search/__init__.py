"""The search kind: an Optuna (or grid) search under Ray Tune, then optionally the AutoNorm claims."""

from studies.kinds.search.kind import SearchKind

__all__ = ["KIND"]

KIND = SearchKind()
