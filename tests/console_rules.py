"""What a study may print on its console (issue #48 item 1: a quiet console), as one check that the
tests running a real study apply to its output: at most 40 lines, all of them the service's — no
Tune box, no TensorBoard hint, no Ray/Tune log line (``INFO``, ``tune.py:``), no apt/dpkg output."""

from __future__ import annotations

import re

MAX_LINES = 40
BANNED = (
    "TensorBoard",
    "tune.py:",
    "INFO",
    "WARNING: Location",
    "Reading database",
    "Unpacking",
    "Number of trials",
)
BOX_DRAWING = re.compile("[\u2500-\u257f]")


def console_problems(output: str, *, max_lines: int = MAX_LINES) -> list[str]:
    """What breaks the rules in ``output`` (a study's stdout and stderr together); empty when nothing."""
    lines = output.splitlines()
    problems = [f"{len(lines)} lines (at most {max_lines})"] if len(lines) > max_lines else []
    for line in lines:
        found = [b for b in BANNED if b in line] + (
            ["a box-drawing character"] if BOX_DRAWING.search(line) else []
        )
        if found:
            problems.append(f"{', '.join(found)}: {line[:200]}")
    return problems
