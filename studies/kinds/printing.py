"""What a study run prints: its progress lines and its verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "print_verdict",
    "say",
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
