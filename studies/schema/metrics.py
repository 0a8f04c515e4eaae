"""The metrics a trial reports per task, and the check that a spec selects on one of them (the
search metric, an analysis metric) in the right direction; split from :mod:`studies.schema.sections`,
whose data sections it reads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from studies.schema.errors import SpecIssue
from studies.schema.sections import DATA_TASKS, data_task

__all__ = ["metric_issues", "reported_metrics"]

_TASK_METRICS: dict[str, dict[str, str]] = {
    task: {
        "train_loss": "min",
        "val_loss": "min",
        "test_loss": "min",
        f"val_{score}": direction,
        f"test_{score}": direction,
    }
    for task, score, direction in (
        ("classification", "accuracy", "max"),
        ("tagging", "accuracy", "max"),
        ("regression", "rmse", "min"),
    )
}
_GATE_METRICS = {"gate_entropy": "min"}
_GATE_LAYER_METRIC = re.compile(r"^gate_entropy/layer_[0-9]{1,4}$")


def reported_metrics(task: str, *, gated: bool = False) -> dict[str, str]:
    """Metric name -> ``"max"`` | ``"min"`` for what ``autonorm_core.training.fit`` reports on ``task``.

    Mirrors ``autonorm_core.training.reported_metrics`` without importing torch (a contract test keeps
    the two equal). ``gated``: the model has AutoNorm layers, which add ``gate_entropy`` (and the
    per-layer ``gate_entropy/layer_<i>``, matched by pattern, not listed).
    """
    if task not in _TASK_METRICS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(_TASK_METRICS)}")
    return {**_TASK_METRICS[task], **(_GATE_METRICS if gated else {})}


def _searched_choices(space: Sequence[Any], name: str) -> list[Any] | None:
    for p in space:
        if p.name == name:
            return list(p.choices) if p.type == "categorical" else [None]
    return None


def _always_gated(model: Any, space: Sequence[Any]) -> bool:
    """Every trial's model has AutoNorm layers (``norm`` or ``final_norm`` is, and stays, autonorm)."""
    for field in ("norm", "final_norm"):
        if getattr(getattr(model, field, None), "type", None) != "autonorm":
            continue
        searched = _searched_choices(space, f"model.{field}.type")
        if searched is None or all(c == "autonorm" for c in searched):
            return True
    return False


def metric_issues(
    metric: str,
    mode: str | None,
    *,
    model: Any,
    data: Any,
    space: Sequence[Any] = (),
    metric_path: str = "search.metric",
    mode_path: str = "search.mode",
    allow_test: bool = False,
) -> list[SpecIssue]:
    """Check that every trial reports ``metric`` and that ``mode`` optimises it the right way.

    Args:
        metric: the metric to select on (or analyse).
        mode: ``"max"`` / ``"min"``; None skips the direction check.
        model, data: the spec's sections (a searched ``data.type`` or ``model.norm.type`` is honoured
            through ``space``: the metric must be reported under every choice).
        metric_path, mode_path: field paths for the messages.
        allow_test: accept ``test_*`` metrics (final analysis, never selection).
    """
    searched = _searched_choices(space, "data.type")
    data_types = searched or [data.type]
    if searched:
        tasks = sorted({DATA_TASKS[d] for d in data_types if d in DATA_TASKS})
    else:
        task = data_task(data)
        tasks = [] if task is None else [task]
    if not tasks:
        return []
    gated = _always_gated(model, space)
    tables = [reported_metrics(t, gated=gated) for t in tasks]
    valid = {k: v for k, v in tables[0].items() if all(t.get(k) == v for t in tables[1:])}
    if not allow_test:
        valid = {k: v for k, v in valid.items() if not k.startswith("test_")}
    where = f"{' and '.join(sorted(set(map(str, data_types))))} ({', '.join(tasks)})"
    if metric in valid:
        direction = valid[metric]
    elif gated and _GATE_LAYER_METRIC.match(metric):
        direction = "min"
    else:
        hint = ""
        if metric.startswith("gate_entropy") and not gated:
            hint = " (gate metrics need model.norm.type or model.final_norm.type 'autonorm' in every trial)"
        return [
            SpecIssue(
                metric_path,
                f"{metric!r} is not a metric that trials on {where} report{hint}; valid: {', '.join(sorted(valid))}",
            )
        ]
    if mode is not None and mode != direction:
        better = "higher" if direction == "max" else "lower"
        return [
            SpecIssue(
                mode_path, f"{metric} is better when {better}: mode must be {direction!r}, got {mode!r}"
            )
        ]
    return []
