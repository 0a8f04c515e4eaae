"""Presets priced but not stored yet: the results page's rows for claims whose adequate study is only planned.

``results/planned.yaml`` (:data:`PLANNED_FILE` in a folder of stored studies) lists presets at the size
at which their models learn the task, each with the price ``autonorm-study plan SPEC --preset P --json``
gave on the machine named (``cpu_hours``: every look to the maximum, no range extension)::

    budget_cpu_hours: 4            # what one study may cost on this machine
    machine: x86_64 x2 CPUs
    planned:
      - study: autonorm_claims_text_oanc
        spec: studies/specs/autonorm_search.yaml
        preset: text_oanc
        claims: ["(b)", "(c)"]
        cpu_hours: 24.8
        wall_h: 12.3
        gpu_hours: null            # from `plan --calibration FILE` when a GPU's step times exist
        calibration: null          # that FILE

A planned study already stored under ``results/`` has no row (the stored study has its own); the
others read ``not testable on this machine`` when the price exceeds the budget, else ``not run yet``,
with the price and no verdict: nothing here decides anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "NOT_RUN",
    "NOT_TESTABLE",
    "PLANNED_FILE",
    "PlannedStudy",
    "planned_lines",
    "read_planned",
    "status",
]

PLANNED_FILE = "planned.yaml"
NOT_TESTABLE = "not testable on this machine"
NOT_RUN = "not run yet"
PLANNED_COLUMNS = ("claim", "study (preset)", "status", "verdict")


class PlannedError(ValueError):
    """A ``planned.yaml`` that cannot be read as documented."""


@dataclass(frozen=True)
class PlannedStudy:
    """One priced preset of ``planned.yaml``, with the file's budget and machine."""

    study: str
    spec: str
    preset: str
    claims: tuple[str, ...]
    cpu_hours: float
    wall_h: float
    budget_cpu_hours: float
    machine: str
    gpu_hours: float | None = None
    calibration: str | None = None


def _number(entry: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise PlannedError(f"{where}: {key} must be a non-negative number, got {value!r}")
    return float(value)


def _parse(doc: Any, where: str) -> list[PlannedStudy]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("planned"), list):
        raise PlannedError(f"{where}: expected a mapping with a `planned:` list")
    budget = _number(doc, "budget_cpu_hours", where)
    assert budget is not None
    machine = str(doc.get("machine") or "this machine")
    out = []
    for i, entry in enumerate(doc["planned"]):
        at = f"{where}: planned[{i}]"
        if not isinstance(entry, Mapping):
            raise PlannedError(f"{at}: expected a mapping")
        missing = [k for k in ("study", "spec", "preset", "claims") if not entry.get(k)]
        if missing:
            raise PlannedError(f"{at}: missing {', '.join(missing)}")
        claims = entry["claims"]
        if not isinstance(claims, list) or not all(isinstance(c, str) for c in claims):
            raise PlannedError(f"{at}: claims must be a list of claim labels")
        cpu, wall = _number(entry, "cpu_hours", at), _number(entry, "wall_h", at)
        assert cpu is not None and wall is not None
        calibration = entry.get("calibration")
        out.append(
            PlannedStudy(
                study=str(entry["study"]),
                spec=str(entry["spec"]),
                preset=str(entry["preset"]),
                claims=tuple(claims),
                cpu_hours=cpu,
                wall_h=wall,
                budget_cpu_hours=budget,
                machine=machine,
                gpu_hours=_number(entry, "gpu_hours", at, optional=True),
                calibration=None if calibration is None else str(calibration),
            )
        )
    return out


def read_planned(paths: Iterable[Path]) -> list[PlannedStudy]:
    """The planned studies of every folder in ``paths`` holding a :data:`PLANNED_FILE`, in file order.

    Raises:
        PlannedError: a file that is not as documented (the message names it and the entry).
    """
    import yaml

    out: list[PlannedStudy] = []
    for path in map(Path, paths):
        file = path / PLANNED_FILE
        if path.is_dir() and file.is_file():
            out += _parse(yaml.safe_load(file.read_text(encoding="utf-8")), str(file))
    return out


def status(plan: PlannedStudy) -> str:
    """``not testable on this machine: ...`` (price over the budget) or ``not run yet: ...``, with the price."""
    price = f"plan {plan.cpu_hours:.1f} CPU-h, {plan.wall_h:.1f} h wall on {plan.machine}"
    if plan.gpu_hours is not None:
        price += f"; {plan.gpu_hours:.2f} GPU-h" + (
            f" with --calibration {plan.calibration}" if plan.calibration else ""
        )
    if plan.cpu_hours > plan.budget_cpu_hours:
        return f"{NOT_TESTABLE}: {price} (budget {plan.budget_cpu_hours:g} CPU-h)"
    return f"{NOT_RUN}: {price}"


def planned_lines(planned: Sequence[PlannedStudy], stored: Iterable[str]) -> list[str]:
    """The Markdown table of the planned studies not in ``stored`` (study names), one row per claim
    each tests; empty when every planned study is stored (or none is planned)."""
    have = set(stored)
    rows = []
    for plan in planned:
        if plan.study in have:
            continue
        for claim in plan.claims:
            cells = (claim, f"`{plan.study}` (`{plan.spec}` --preset {plan.preset})", status(plan), "—")
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if not rows:
        return []
    return ["| " + " | ".join(PLANNED_COLUMNS) + " |", "|" + "---|" * len(PLANNED_COLUMNS), *rows]
