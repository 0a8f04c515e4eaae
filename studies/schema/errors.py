"""Spec errors: every problem is a :class:`SpecIssue` (dotted field path, message, YAML line, source),
collected into one :class:`SpecError` so the CLI prints all of them and exits 2 without a traceback."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from studies.schema.urls import (
    redact_text,
)

_Path = tuple[str | int, ...]
"""A field path: mapping keys and list indices."""

_SCALAR = (str, int, float, bool, type(None))


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec.

    Attributes:
        path: dotted field path (``model.norm.tau``); ``""`` for the document itself.
        message: what is wrong, in words a researcher can act on.
        line: 1-based YAML line where the offending value was written, when known.
        source: the file (or ``--set ...`` override, or ``--preset``) the value came from.
    """

    path: str
    message: str
    line: int | None = None
    source: str | None = None

    def format(self) -> str:
        where = self.source or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        head = f"{where}: " if where else ""
        field = self.path or "<document>"
        return f"{head}{field}: {self.message}"


class SpecError(Exception):
    """A spec failed to load or validate; ``issues`` lists every problem found.

    Deliberately not a ``ValueError``: raised from inside a pydantic validator it propagates unchanged
    (pydantic would flatten a ``ValueError`` into one message without paths).
    """

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        # Credentials never leave through an error: user info and queries of every URL are hidden.
        self.issues: tuple[SpecIssue, ...] = tuple(
            SpecIssue(
                redact_text(i.path),
                redact_text(i.message),
                i.line,
                None if i.source is None else redact_text(i.source),
            )
            for i in issues
        )
        super().__init__(self.format())

    def format(self) -> str:
        n = len(self.issues)
        lines = [f"invalid study spec ({n} error{'s' if n != 1 else ''}):"]
        lines += [f"  {issue.format()}" for issue in self.issues[:MAX_SHOWN_ISSUES]]
        if n > MAX_SHOWN_ISSUES:
            lines.append(f"  ... and {n - MAX_SHOWN_ISSUES} more")
        return "\n".join(lines)


MAX_SHOWN_ISSUES = 200
"""Issues :meth:`SpecError.format` prints (all of them stay in ``issues``)."""


def _path_str(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)
