"""What a study run prints: its progress lines, its verdict, and the numbers in them (an estimate
signed, a p-value a probability, an interval with both bounds signed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "interval",
    "print_verdict",
    "probability",
    "say",
    "signed",
]


def say(tag: str, message: str) -> None:
    """One progress line of a study run: ``[<tag>] <message>``, flushed."""
    print(f"[{tag}] {message}", flush=True)


def print_verdict(tag: str, verdict: Mapping[str, Any], lines: Sequence[str], runner: Any) -> None:
    """A finished study's verdict as printed: ``lines[0]`` (the headline), its scope (what it was
    decided on, :func:`studies.scope.scope_line`), the exploratory note when
    the design is exploratory, the rest of ``lines``, then where the outputs and the MLflow run are."""
    from studies.scope import scope_line

    say(tag, lines[0])
    if verdict.get("scope"):
        say(tag, f"scope: {scope_line(verdict['scope'])}")
    if verdict.get("exploratory"):
        say(tag, "exploratory: underpowered by design (see reasons); no claim either way")
    for line in lines[1:]:
        say(tag, line)
    say(tag, f"outputs in {runner.study_uri}; MLflow run {runner.run_id} ({runner.tracking_uri})")


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def signed(v: Any) -> str:
    """An estimate as printed: signed, 4 decimals (``+0.0120``); ``n/a`` when it is not a finite number."""
    return f"{v:+.4f}" if _finite(v) else "n/a"


def probability(v: Any) -> str:
    """A p-value as printed: a probability, never signed (``0.1887``); ``n/a`` when there is none."""
    return f"{v:.4g}" if _finite(v) else "n/a"


def interval(ci: Any) -> str:
    """A confidence interval as printed: ``[-0.0040, +0.0270]``; ``n/a`` without two finite bounds."""
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(_finite(x) for x in ci):
        return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"
    return "n/a"
