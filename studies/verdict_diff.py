"""Where two ``verdict.json`` documents disagree: the comparison ``reproduce`` makes, on- and offline.

A leaf module: :mod:`studies.reproduce` (a logged verdict against the re-analysis of its MLflow
runs, or a rerun) and :mod:`studies.offline` (a stored directory's verdict against the re-analysis
of its own tables) both compare through :func:`compare_verdicts`, numbers to :data:`TOLERANCE`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NOT_EVIDENCE", "TOLERANCE", "Difference", "compare_verdicts", "number", "same", "show"]

TOLERANCE = 1e-9


@dataclass(frozen=True)
class Difference:
    """One disagreement: ``what`` is a trial's run name or a hypothesis (``study`` for the rest)."""

    what: str
    field: str
    logged: Any
    recomputed: Any

    def line(self) -> str:
        extra = ""
        if number(self.logged) and number(self.recomputed):
            extra = f" (by {float(self.recomputed) - float(self.logged):+.3g})"
        return (
            f"{self.what}: {self.field}: logged {show(self.logged)}, recomputed {show(self.recomputed)}"
            + extra
        )


def number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def show(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v, default=str) if not isinstance(v, str) else v


def same(a: Any, b: Any) -> bool:
    if number(a) and number(b):
        x, y = float(a), float(b)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return math.isclose(x, y, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    return bool(a == b) and type(a) is type(b)


ADDED_SINCE = frozenset({"adequacy", "adequacy_rule", "arms"})
"""Fields added to ``verdict.json`` after studies were stored (issue #47: the training-adequacy check,
``adequacy`` and ``adequacy_rule``, and the ``arms`` each hypothesis / contrast rests on): where the
logged verdict lacks one altogether it predates the field, which is then no difference; where it has
one, the field is compared like any other."""


def _walk(a: Any, b: Any, path: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], Any, Any]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a and str(key) in ADDED_SINCE:
                continue
            if key not in a or key not in b:
                yield (*path, str(key)), a.get(key), b.get(key)
            else:
                yield from _walk(a[key], b[key], (*path, str(key)))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _walk(x, y, (*path, str(i)))
    elif not same(a, b):
        yield path, a, b


NOT_EVIDENCE = {("resources",)}
"""Fields of ``verdict.json`` that record what the run cost, not what it found: a re-analysis has no
run time to report, and a rerun's differs."""


def compare_verdicts(logged: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[Difference]:
    """Every leaf where two ``verdict.json`` documents differ (numbers to 1e-9), named by the
    hypothesis the path runs through (``study`` when none)."""
    hypotheses = set(logged.get("hypotheses") or {}) | set(recomputed.get("hypotheses") or {})
    out = []
    for path, a, b in _walk(logged, recomputed, ()):
        if path[:1] in NOT_EVIDENCE:
            continue
        if path[:1] == ("hypotheses",) and len(path) > 1:
            what, field = path[1], ".".join(path[2:]) or "(present)"
        else:
            named = [p for p in path if p in hypotheses]
            what, field = (named[0] if named else "study"), ".".join(path) or "(document)"
        out.append(Difference(what, field, a, b))
    return out
