"""Stacked trials (issue #38): one Tune trial trains a *group* of members, each still a trial of its own.

The members of one cell of a grid plan (its seeds, its learning-rate points) share the architecture,
the batch size and the number of steps, so one process can train them as one stacked model
(:func:`autonorm_core.stacking.fit_stacked`). Tune then sees one trial per group; everything after
Tune (the MLflow trial runs, trials.csv, status, reports, verdicts) sees one trial per member, as if
each had run alone. This module is that translation, in both directions:

* :func:`group_points` cuts a plan's grid into stacks: points whose resolved configs differ only in
  :data:`MEMBER_PATHS` (``seed``, ``training.lr``) form a cell, a cell is cut into stacks of at most
  ``stack`` members of near-equal size (one stacked model each).
* :func:`bundle_points` deals the stacks of a phase into groups, one Tune trial each: as many as the
  phase's trial slots (or a multiple, at most :func:`group_members_cap` members a group), of near-equal
  work. A group is Tune's trial config ``{MEMBERS_KEY: [[params of member 0, ...], [...]]}``, one list
  per stack; its members are numbered in that order (``k`` below). A group trains its stacks side by
  side, one epoch of each per round and one report per round (workers/group_trial.py): what a Tune
  trial costs besides training (its start, and each report's round trip through the driver, which
  the trial waits for) is paid per group and per round, not per cell and per epoch. A group of an
  older study is one flat list: one stack.
* A group's report (:func:`pack`) carries its shared keys once and every member's latest metrics as
  ``<key>@m<k>``; :func:`unpack` gives member ``k``'s result back, shaped like an ordinary trial's.
* :func:`views` turns a Tune ``Trial`` into the trials the rest of the service reads: the trial itself,
  or one :class:`MemberTrial` per member (id ``<trial id>-m<k>``, its own params, status and result).

Plain Python: no Ray, no torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from workers.dotted import with_values

__all__ = [
    "MEMBERS_KEY",
    "MEMBER_PATHS",
    "MemberTrial",
    "bundle_indices",
    "bundle_points",
    "grid_points",
    "group_indices",
    "group_members_cap",
    "group_points",
    "member_history",
    "member_id",
    "member_params",
    "member_stacks",
    "pack",
    "unpack",
    "views",
]

#: Key of a group trial's config: the members' own parameters (dotted paths, as an ordinary trial's).
MEMBERS_KEY = "__members__"
#: Trial-config paths members of one group may differ in (everything else is their cell).
MEMBER_PATHS: tuple[tuple[str, ...], ...] = (("seed",), ("training", "lr"))
_SUFFIX = re.compile(r"^(?P<key>.+)@m(?P<k>\d+)$")


def member_id(trial_id: str, k: int) -> str:
    """Member ``k``'s trial id: its MLflow run's ``ray.trial_id`` tag and its row's id."""
    return f"{trial_id}-m{k}"


def _stacked_lists(config: Mapping[str, Any] | None) -> list[list[Any]] | None:
    members = (config or {}).get(MEMBERS_KEY)
    if not isinstance(members, list | tuple):
        return None
    if members and all(isinstance(m, list | tuple) for m in members):
        return [list(stack) for stack in members]
    return [list(members)]  # a group of one stack, as studies before groups of several stacks stored it


def member_params(config: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """A group trial's members' params, in member order (``None`` for an ordinary trial's config)."""
    stacks = _stacked_lists(config)
    if stacks is None:
        return None
    return [dict(m) for stack in stacks for m in stack]


def member_stacks(config: Mapping[str, Any] | None) -> list[list[int]] | None:
    """A group trial's stacks, as member indices (``None`` for an ordinary trial's config)."""
    stacks = _stacked_lists(config)
    if stacks is None:
        return None
    out: list[list[int]] = []
    start = 0
    for stack in stacks:
        out.append(list(range(start, start + len(stack))))
        start += len(stack)
    return out


def grid_points(grid: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """Every point of a plan's grid (its axes' product), the first axis varying slowest."""
    points: list[dict[str, Any]] = [{}]
    for name, values in grid:
        points = [{**p, name: v} for p in points for v in values]
    return points


def _cell_key(base_config: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    config = with_values(base_config, params)
    for path in MEMBER_PATHS:
        node: Any = config
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return json.dumps(config, sort_keys=True, default=str)


def group_indices(
    base_config: Mapping[str, Any], points: Sequence[Mapping[str, Any]], stack: int
) -> list[list[int]]:
    """The indices of ``points`` per group of at most ``stack`` members of one cell, in the order of
    each cell's first point; a cell of ``n`` points becomes ``ceil(n / stack)`` groups of near-equal
    size (10 seeds at a cap of 8: 5 + 5, not 8 + 2: the groups end together)."""
    if stack < 1:
        raise ValueError(f"stack must be at least 1, got {stack}")
    cells: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        cells.setdefault(_cell_key(base_config, p), []).append(i)
    groups: list[list[int]] = []
    for members in cells.values():
        count = math.ceil(len(members) / stack)
        size, extra = divmod(len(members), count)
        start = 0
        for i in range(count):
            end = start + size + (1 if i < extra else 0)
            groups.append(members[start:end])
            start = end
    return groups


def group_points(
    base_config: Mapping[str, Any], points: Sequence[Mapping[str, Any]], stack: int
) -> list[list[dict[str, Any]]]:
    """``points`` cut into groups (:func:`group_indices`): Tune's grid values of a stacked plan."""
    return [[dict(points[i]) for i in g] for g in group_indices(base_config, points, stack)]


def group_members_cap(stack: int) -> int:
    """Members one group (Tune trial) trains at most: eight stacks' worth, at most 128. A group holds
    all its stacks' models and optimizer states at once (and one data split per distinct seed), but
    computes one stack at a time, so its peak is one stack's activations plus every member's
    parameters; ``execution.stack`` bounds a stack and, through this, a group."""
    return max(stack, min(128, 8 * stack))


def _stack_work(config: Mapping[str, Any], size: int) -> float:
    """A stack's training work in arbitrary units, to deal stacks into groups of near-equal work:
    members x updates x the cost of an update, which grows with the batch (measured for the MLP
    ``tiny``: 0.5 ms a stacked update at B = 8, 1.7 ms at B = 128). The data set's size is not known
    here: it cancels between the stacks of one phase, which share it and the budget."""
    training = config.get("training") or {}
    batch = float(training.get("batch_size") or 32)
    epochs = float(training.get("epochs") or 1)
    if training.get("budget") == "updates":
        updates = float(
            training.get("max_updates") or epochs / float(training.get("reference_batch_size") or batch)
        )
    else:
        updates = epochs / batch
    return size * updates * (1.0 + batch / 32.0)


def bundle_indices(
    base_config: Mapping[str, Any], points: Sequence[Mapping[str, Any]], stack: int, slots: int
) -> list[list[list[int]]]:
    """The stacks of ``points`` (:func:`group_indices`) dealt into groups: per group, its stacks' point
    indices. ``slots`` groups (the phase's trials at once), or the smallest multiple of it that keeps
    every group within :func:`group_members_cap`, never more groups than stacks; stacks go
    largest-work first to the group with the least work so far that has room for them (a new group
    when none has), and each group keeps its stacks in grid order."""
    stacks = group_indices(base_config, points, stack)
    if not stacks:
        return []
    slots = max(1, int(slots))
    members = sum(len(s) for s in stacks)
    waves = math.ceil(math.ceil(members / group_members_cap(stack)) / slots)
    count = min(len(stacks), slots * max(1, waves))
    work = [_stack_work(with_values(base_config, points[s[0]]), len(s)) for s in stacks]
    cap = group_members_cap(stack)
    loads = [0.0] * count
    sizes = [0] * count
    dealt: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(stacks)), key=lambda i: (-work[i], i)):
        room = [g for g in range(len(dealt)) if sizes[g] + len(stacks[i]) <= cap]
        if not room:  # every group full (stacks of unequal sizes): one more group
            loads.append(0.0)
            sizes.append(0)
            dealt.append([])
            room = [len(dealt) - 1]
        g = min(room, key=lambda g: (loads[g], g))
        loads[g] += work[i]
        sizes[g] += len(stacks[i])
        dealt[g].append(i)
    return [[stacks[i] for i in sorted(d)] for d in dealt if d]


def bundle_points(
    base_config: Mapping[str, Any], points: Sequence[Mapping[str, Any]], stack: int, slots: int
) -> list[list[list[dict[str, Any]]]]:
    """``points`` dealt into groups of stacks (:func:`bundle_indices`): Tune's grid values of a stacked
    plan."""
    return [
        [[dict(points[i]) for i in s] for s in group]
        for group in bundle_indices(base_config, points, stack, slots)
    ]


def pack(shared: Mapping[str, Any], members: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """A group's report: ``shared`` keys once, member ``k``'s as ``<key>@m<k>``."""
    out = dict(shared)
    for k, metrics in members.items():
        for key, value in metrics.items():
            out[f"{key}@m{k}"] = value
    return out


def unpack(result: Mapping[str, Any] | None, k: int) -> dict[str, Any]:
    """Member ``k``'s result from a group's report: the shared keys, overridden by its own; other
    members' keys left out. Its ``time_total_s`` is its share of the group's (the group's divided by
    its ``members``): the CPU-hours a study reports add up to what the group used."""
    shared: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in (result or {}).items():
        match = _SUFFIX.match(key)
        if match is None:
            shared[key] = value
        elif int(match.group("k")) == k:
            own[match.group("key")] = value
    if not own:
        # Nothing of its own in this report (a group reports the members whose epoch it trained;
        # a stack that has not started has nothing yet): the group's epoch is not this member's.
        shared.pop("epoch", None)
    shared.update(own)
    size, total = shared.get("members"), shared.get("time_total_s")
    if isinstance(size, int | float) and size >= 1 and isinstance(total, int | float):
        shared["time_total_s"] = total / size
    return shared


def member_history(rows: Sequence[Mapping[str, Any]], k: int) -> list[dict[str, Any]]:
    """Member ``k``'s own results from a group's result rows: one per epoch of its own (a group row
    repeats a finished member's last metrics; those repeats are left out)."""
    out: list[dict[str, Any]] = []
    marker = f"epoch@m{k}"
    for row in rows:
        mine = unpack(row, k)
        if _missing(row.get(marker)):  # (a DataFrame row holds NaN where this group row had nothing)
            if mine.get("status") == "error":  # the group failed: so did every member
                out.append(mine)
            continue
        if out and mine.get("epoch") == out[-1].get("epoch"):
            if mine.get("status") != out[-1].get("status"):
                out[-1] = mine  # its final status, on the epoch it ended
            continue
        out.append(mine)
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


class MemberTrial:
    """Member ``k`` of a group trial, as the rest of the service reads a trial: its own ``trial_id``,
    ``config`` (its params), ``last_result`` and the group's Tune ``status``; everything else (paths,
    storage, checkpoints) is the group's."""

    def __init__(self, group: Any, k: int, params: Mapping[str, Any]) -> None:
        self.group = group
        self.k = k
        self.trial_id = member_id(group.trial_id, k)
        self.config = dict(params)

    @property
    def last_result(self) -> dict[str, Any]:
        return unpack(getattr(self.group, "last_result", None), self.k)

    @property
    def status(self) -> str:
        return str(self.group.status)

    def __getattr__(self, name: str) -> Any:
        if name == "group":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.group, name)

    def __str__(self) -> str:
        return f"{self.group}-m{self.k}"

    def __repr__(self) -> str:
        return f"MemberTrial({self.trial_id})"


def views(trial: Any) -> list[Any]:
    """The trials the service reads for one Tune trial: itself, or its members."""
    members = member_params(getattr(trial, "config", None))
    if members is None:
        return [trial]
    return [MemberTrial(trial, k, p) for k, p in enumerate(members)]
