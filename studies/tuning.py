"""The one learning-rate tuning step of every study kind: grid, selection, edge flag, range extension.

A kind tunes a nuisance learning rate per *cell* (an arm, or an (arm, batch size) cell) on held-out
tuning seeds, never on a confirmatory seed, and hands the winner to its confirmatory phase:

1. The grid: ``points`` log-spaced rates, either absolute (``low .. high``: the batch-size kind,
   :meth:`LRGrid.absolute`) or relative to a searched η (``η / factor .. η * factor``: the search
   kind's confirmation, :meth:`LRGrid.relative`). Both are the same object: a start, a ratio, and
   the index range ``first .. last`` of the points in use.
2. Selection (:func:`select_lr`): the rate with the best mean validation metric over the tuning
   seeds wins; a failed trial (not ``completed``, or a non-finite metric) scores the worst value, so
   a rate that diverges on one seed is not picked for its other seed; ties go to the lower rate.
   With ``noise`` (a design that flags tuning noise) each rate also keeps its standard error over
   the tuning seeds, and a pick ahead of the runner-up by less than one standard error (the larger
   of the two rates') is ``noisy``: the kinds give what rests on it the informational reason
   ``lr-tuning-noisy`` (:data:`NOISY`; remedies: refinement, more tuning seeds).
3. The edge: a winner on the first or last point of its grid suggests the optimum lies outside it.
   With 3 or more points the grid is extended by one point of its own ratio in that direction, the
   new point runs on the tuning seeds (ordinary tuning trials, through ``run_points``), and the
   selection is made again — at most ``max_extensions`` times (:func:`tune`). Only a cell still on
   the edge afterwards is flagged ``at_range_edge`` (the kinds' ``lr-at-range-edge`` gate). A grid
   of fewer than 3 points has no interior: it is never extended, and a 2-point grid's winner is
   always on its edge (a 1-point grid's never is).

4. Refinement: once the grid (and any extension) settles on an interior winner, ``refine`` more
   rates run on the tuning seeds — ``refine / 2`` log-evenly spaced between the winner and each of
   its two neighbours (``refine = 2``: the geometric midpoints ``sqrt(lr * neighbour)``; a ×10 grid
   can miss an optimum by √10) — in one more tuning phase (through ``run_refine``), and the
   selection is made again over every rate (:func:`refine_points`). A winner still on its grid's
   edge, or a grid without an interior, is not refined; the record says why.

:func:`tune` is deterministic in the trials it is given, so a report rebuilt from the study
directory replays the same extensions and refinement from their phases' trials (``run_points`` and
``run_refine`` then read them back instead of running them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

__all__ = [
    "NOISY",
    "GridTuning",
    "LRGrid",
    "TrialLike",
    "extension_trials_max",
    "noisy_reasons",
    "refine_points",
    "refine_trials",
    "round_lr",
    "select_lr",
    "tune",
    "tuned_lines",
    "tuned_rates",
    "tuning_noise",
]

Side = Literal["low", "high"]

NOISY = "lr-tuning-noisy"
"""The informational reason on a verdict resting on a cell whose pick leads the runner-up by less
than one standard error over the tuning seeds (:func:`tuning_noise`); it changes no verdict."""


class TrialLike(Protocol):
    """What tuning reads of a trial (:class:`workers.runner.TrialRecord` has it)."""

    @property
    def status(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def metrics(self) -> dict[str, Any]: ...


def round_lr(lr: float) -> float:
    """A learning rate as trials see it: 6 significant digits (readable names, exact matching)."""
    return float(f"{lr:.6g}")


@dataclass(frozen=True)
class LRGrid:
    """Log-spaced learning rates ``10 ** (log_start + i * log_step)`` for ``i = first .. last``.

    Attributes:
        log_start: log10 of point ``i = 0`` (the original grid's lowest point).
        log_step: log10 of the grid's ratio (0 for a one-point grid).
        first / last: the index range in use; the original grid is ``0 .. points - 1``, an
            extension lowers ``first`` or raises ``last`` by one.
        points_planned: the original grid's size (extensions never change it).
    """

    log_start: float
    log_step: float
    first: int
    last: int
    points_planned: int

    @classmethod
    def absolute(cls, low: float, high: float, points: int) -> LRGrid:
        """``points`` rates from ``low`` to ``high``, both included (``points >= 2``)."""
        if not (0 < low < high) or points < 2:
            raise ValueError(f"need 0 < low < high and points >= 2, got {low}, {high}, {points}")
        lo, hi = math.log10(low), math.log10(high)
        return cls(lo, (hi - lo) / (points - 1), 0, points - 1, points)

    @classmethod
    def relative(cls, center: float, factor: float, points: int) -> LRGrid:
        """``points`` rates from ``center / factor`` to ``center * factor`` (``center`` alone for one)."""
        if center <= 0 or factor <= 1 or points < 1:
            raise ValueError(f"need center > 0, factor > 1, points >= 1, got {center}, {factor}, {points}")
        if points == 1:
            return cls(math.log10(center), 0.0, 0, 0, 1)
        lo, hi = math.log10(center / factor), math.log10(center * factor)
        return cls(lo, (hi - lo) / (points - 1), 0, points - 1, points)

    def point(self, i: int) -> float:
        return round_lr(10 ** (self.log_start + i * self.log_step))

    @property
    def points(self) -> tuple[float, ...]:
        """The rates in use, ascending."""
        return tuple(self.point(i) for i in range(self.first, self.last + 1))

    @property
    def extendable(self) -> bool:
        """Only a grid with an interior (>= 3 points) is extended."""
        return self.points_planned >= 3

    @property
    def extensions(self) -> int:
        return (self.last - self.first + 1) - self.points_planned

    def next_point(self, side: Side) -> float:
        """The rate one ratio beyond the grid on ``side``."""
        return self.point(self.first - 1 if side == "low" else self.last + 1)

    def extended(self, side: Side) -> LRGrid:
        return replace(self, first=self.first - 1) if side == "low" else replace(self, last=self.last + 1)


def _value(t: TrialLike, metric: str) -> float:
    v = t.metrics.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _lr_of(t: TrialLike) -> float:
    return round_lr(float(t.config["training"]["lr"]))


def _standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of ``values`` (sample sd / √n); ``None`` below 2 values or
    with a non-finite one (a failed seed scores the worst value)."""
    n = len(values)
    if n < 2 or not all(math.isfinite(v) for v in values):
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def tuning_noise(
    scores: Mapping[float, Sequence[float]], best: float, mode: Literal["min", "max"]
) -> dict[str, Any]:
    """How far the pick ``best`` is ahead of the runner-up, against the noise of the tuning seeds.

    Each rate's mean and standard error over its seeds (``scores``: rate -> per-seed scores); the
    runner-up is the next-best mean. The pick is *noisy* when its lead (in the metric's better
    direction) is less than one standard error: the larger of the two rates' SEs. Unknown (``None``)
    when there is no runner-up, a rate has fewer than 2 finite scores, or a mean is not finite.

    Returns:
        ``score_se`` (rate -> SE or ``None``), ``runner_up`` (rate or ``None``), ``lead`` (the pick's
        mean minus the runner-up's, signed so that ahead is positive), ``lead_se`` (the SE it is
        measured against) and ``noisy`` (``True | False | None``).
    """
    se = {lr: _standard_error(list(v)) for lr, v in scores.items()}
    means = {lr: sum(v) / len(v) for lr, v in scores.items() if v}
    sign = 1.0 if mode == "max" else -1.0
    others = sorted((lr for lr in means if lr != best), key=lambda lr: (-sign * means[lr], lr))
    runner = others[0] if others else None
    record: dict[str, Any] = {
        "score_se": {f"{lr:g}": se[lr] for lr in sorted(se)},
        "runner_up": runner,
        "lead": None,
        "lead_se": None,
        "noisy": None,
    }
    if runner is None:
        return record
    lead = sign * (means[best] - means[runner])
    ses = [se[best], se[runner]]
    if not math.isfinite(lead) or any(x is None for x in ses):
        return record
    worst = max(x for x in ses if x is not None)
    record.update(lead=lead, lead_se=worst, noisy=bool(lead < worst))
    return record


def select_lr(
    trials: Sequence[TrialLike],
    grid: LRGrid,
    *,
    metric: str,
    mode: Literal["min", "max"],
    extra: Sequence[float] = (),
    noise: bool = False,
) -> dict[str, Any]:
    """The winning rate of one cell's tuning trials on ``grid`` and the ``extra`` rates (its
    refinement, :func:`refine_points`); trials at other rates are ignored. The edge is ``grid``'s.

    Returns:
        A JSON-able record: ``lr`` (the winner; with no trained rate, the lowest rate tried),
        ``<metric>`` (its mean score, ``None`` if no rate trained), ``at_range_edge``, ``edge``
        (``"low" | "high" | None``), ``no_learning_rate_trained``, ``scores`` (rate -> mean score),
        ``grid`` (the rates in use), ``extensions``, ``trials``, ``trials_failed``; with ``noise``
        also :func:`tuning_noise`'s fields (each rate's standard error over the tuning seeds, the
        runner-up, the lead, ``noisy``). A study stored before ``noise`` existed has none of them.
    """
    worst = -math.inf if mode == "max" else math.inf
    on_grid = set(grid.points) | {round_lr(lr) for lr in extra}
    scores: dict[float, list[float]] = {}
    failed = 0
    for t in trials:
        lr = _lr_of(t)
        if lr not in on_grid:
            continue
        v = _value(t, metric)
        ok = t.status == "completed" and math.isfinite(v)
        failed += not ok
        scores.setdefault(lr, []).append(v if ok else worst)
    record: dict[str, Any] = {
        "grid": list(grid.points),
        "extensions": grid.extensions,
        "trials": sum(len(v) for v in scores.values()),
        "trials_failed": failed,
    }
    if not scores:
        return {
            **record,
            "lr": None,
            metric: None,
            "at_range_edge": False,
            "edge": None,
            "no_learning_rate_trained": True,
            "scores": {},
        }
    means = {lr: sum(v) / len(v) for lr, v in scores.items()}
    pick = max if mode == "max" else min
    best = pick(sorted(means), key=lambda lr: means[lr])  # ties: the lower rate
    points = grid.points
    edge: Side | None = None
    if len(points) > 1 and best == points[0]:
        edge = "low"
    elif len(points) > 1 and best == points[-1]:
        edge = "high"
    score = means[best]
    out = {
        **record,
        "lr": best,
        metric: score if math.isfinite(score) else None,
        "at_range_edge": edge is not None,
        "edge": edge,
        "no_learning_rate_trained": not math.isfinite(score),
        "scores": {f"{lr:g}": (m if math.isfinite(m) else None) for lr, m in sorted(means.items())},
    }
    if noise:
        out.update(tuning_noise(scores, best, mode))
    return out


RunPoints = Callable[[int, Mapping[str, float]], Sequence[TrialLike]]
"""``run_points(round, {cell: lr})``: run (or read back) extension round ``round`` (1-based): each
cell's new rate on every tuning seed; returns those trials."""

RefinePoints = Callable[[Mapping[str, Sequence[float]]], Sequence[TrialLike]]
"""``run_refine({cell: rates})``: run (or read back) the refinement: each cell's rates on every
tuning seed; returns those trials."""


def refine_points(grid: LRGrid, best: float, n: int) -> tuple[float, ...]:
    """The ``n`` refinement rates around ``best`` (one of ``grid``'s points in use), ascending:
    ``n / 2`` between it and each neighbour, log-evenly spaced (``n = 2``: the two geometric
    midpoints). None when ``n`` is 0 or ``best`` has not two neighbours (an edge of the grid, a grid
    of fewer than 3 points).

    Raises:
        ValueError: ``n`` is negative or odd (the points are shared equally between the two sides).
    """
    if n < 0 or n % 2:
        raise ValueError(f"refine must be an even number >= 0, got {n}")
    points = grid.points
    if n == 0 or best not in points:
        return ()
    i = grid.first + points.index(best)
    if i in (grid.first, grid.last):
        return ()
    k = n // 2
    offsets = [j / (k + 1) for j in range(-k, k + 1) if j]
    return tuple(round_lr(10 ** (grid.log_start + (i + off) * grid.log_step)) for off in offsets)


def _refine_skipped(rec: Mapping[str, Any], grid: LRGrid, refine: int) -> str | None:
    """Why a cell's winner is not refined (``None``: it is)."""
    if refine == 0:
        return "refine: 0"
    if rec["lr"] is None or rec["no_learning_rate_trained"]:
        return "no learning rate trained"
    if not grid.extendable:
        return "a grid of fewer than 3 points has no interior"
    if rec["at_range_edge"]:
        return f"the best rate sits on the {rec['edge']} edge of its grid"
    return None


def tune(
    grids: Mapping[str, LRGrid],
    trials: Sequence[TrialLike],
    *,
    cell_of: Callable[[TrialLike], str],
    metric: str,
    mode: Literal["min", "max"],
    max_extensions: int,
    run_points: RunPoints | None = None,
    refine: int = 0,
    run_refine: RefinePoints | None = None,
    noise: bool = False,
) -> tuple[dict[str, dict[str, Any]], list[TrialLike]]:
    """Select every cell's rate, extending the grids whose winner sits on an edge, then refining
    the interior winners; with ``noise`` each record also has :func:`tuning_noise`'s fields (over
    every rate tried).

    Args:
        grids: cell -> its grid (the points the first tuning phase ran).
        trials: the first tuning phase's trials (every cell).
        cell_of: the cell a trial belongs to.
        metric / mode: the validation metric and its direction.
        max_extensions: extension rounds at most (0: never extend).
        run_points: runs one extension round (see :data:`RunPoints`); ``None`` never extends.
        refine: refinement rates per interior winner (:func:`refine_points`; 0: no refinement).
        run_refine: runs the refinement (see :data:`RefinePoints`); ``None`` never refines.

    Returns:
        ``(records, trials)``: cell -> :func:`select_lr`'s record on its final grid and refinement,
        with ``refine``: ``{"points"`` (the rates refinement ran, ``[]`` for none), ``"grid_lr"``
        (the winner before it), ``"moved"`` (a refinement rate won), ``"skipped"`` (why there was
        no refinement, else ``None``)``}``; and every tuning trial (the first phase's, the
        extensions' and the refinement's).
    """
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
    if refine < 0 or refine % 2:
        raise ValueError(f"refine must be an even number >= 0, got {refine}")
    current = dict(grids)
    every = list(trials)

    def records(extra: Mapping[str, Sequence[float]] | None = None) -> dict[str, dict[str, Any]]:
        by_cell: dict[str, list[TrialLike]] = {}
        for t in every:
            by_cell.setdefault(cell_of(t), []).append(t)
        return {
            cell: select_lr(
                by_cell.get(cell, []),
                grid,
                metric=metric,
                mode=mode,
                extra=(extra or {}).get(cell, ()),
                noise=noise,
            )
            for cell, grid in sorted(current.items())
        }

    out = records()
    for round_ in range(1, max_extensions + 1):
        need = {
            cell: rec["edge"]
            for cell, rec in out.items()
            if rec["edge"] is not None and current[cell].extendable
        }
        if not need or run_points is None:
            break
        points = {cell: current[cell].next_point(side) for cell, side in need.items()}
        added = list(run_points(round_, points))
        if not added:  # a round not run (yet): its cells stay as they are
            break
        every += added
        for cell, side in need.items():
            current[cell] = current[cell].extended(side)
        out = records()
    skipped = {cell: _refine_skipped(rec, current[cell], refine) for cell, rec in out.items()}
    around = {
        cell: refine_points(current[cell], rec["lr"], refine)
        for cell, rec in out.items()
        if skipped[cell] is None
    }
    ran = False
    if around and run_refine is not None:
        added = list(run_refine(around))
        ran = bool(added)  # no trials: the refinement has not run (yet)
        every += added
    final = records(around) if ran else out
    for cell, rec in final.items():
        rec["refine"] = {
            "points": list(around.get(cell, ())) if ran else [],
            "grid_lr": out[cell]["lr"],
            "moved": rec["lr"] != out[cell]["lr"],
            "skipped": skipped[cell] or (None if ran else "not run"),
        }
    return final, every


class GridTuning(Protocol):
    """A kind's ``lr_tuning`` section as :func:`tuned_rates` reads it (one absolute grid for every cell)."""

    @property
    def metric(self) -> str: ...
    @property
    def mode(self) -> Literal["min", "max"]: ...
    @property
    def max_extensions(self) -> int: ...
    @property
    def refine(self) -> int: ...
    def lr_grid(self) -> LRGrid: ...


def tuned_rates(
    cells: Sequence[str],
    trials: Sequence[TrialLike],
    *,
    cell_of: Callable[[TrialLike], str],
    tuning: GridTuning,
    run_points: RunPoints | None = None,
    run_refine: RefinePoints | None = None,
    grids: Mapping[str, LRGrid] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """:func:`tune` with ``tuning``'s grid, metric, mode, extension limit and refinement for every
    one of ``cells``: the tuned rate per cell and the record per cell, a cell with no winner (no
    trial completed) left out of both. ``grids``: each cell's own grid instead of ``tuning``'s (a
    second tuning stage around the first stage's rates)."""
    grid = tuning.lr_grid()
    record, _ = tune(
        dict(grids) if grids is not None else {cell: grid for cell in cells},
        trials,
        cell_of=cell_of,
        metric=tuning.metric,
        mode=tuning.mode,
        max_extensions=tuning.max_extensions,
        run_points=run_points,
        refine=tuning.refine,
        run_refine=run_refine,
        noise=bool(getattr(tuning, "flag_noisy", False)),
    )
    record = {cell: rec for cell, rec in record.items() if rec["lr"] is not None}
    return {cell: float(rec["lr"]) for cell, rec in record.items()}, record


def noisy_reasons(arms: Sequence[str], noisy: Collection[str]) -> list[str]:
    """``lr-tuning-noisy (<arm>)`` for each of ``arms`` (those a verdict rests on) in ``noisy`` (the
    cells whose tuned pick was :func:`tuning_noise`'s ``noisy``): informational reasons, no gate."""
    return [f"{NOISY} ({arm})" for arm in dict.fromkeys(arms) if arm in noisy]


def tuned_lines(record: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per cell of :func:`tune`'s record: its rate, the extension rounds it took, whether
    refinement moved it and whether it still sits on the edge of its grid."""
    lines = []
    for cell, rec in record.items():
        edge = " (on the edge of the range!)" if rec["at_range_edge"] else ""
        grown = f" after {rec['extensions']} range extension(s)" if rec["extensions"] else ""
        refined = rec.get("refine") or {}
        if refined.get("points"):
            grown += (
                f", refined from {refined['grid_lr']:.4g}" if refined["moved"] else ", kept after refinement"
            )
        if rec.get("noisy"):
            grown += f", {NOISY}: ahead of the runner-up by {rec['lead']:.3g} < 1 SE ({rec['lead_se']:.3g})"
        lines.append(f"  {cell}: lr={rec['lr']:.4g}{grown}{edge}")
    return lines


def extension_trials_max(grids: Sequence[LRGrid], seeds: int, max_extensions: int) -> int:
    """The most trials the extensions of ``grids`` can add (every extendable cell, every round)."""
    return sum(max_extensions * seeds for g in grids if g.extendable)


def refine_trials(grids: Sequence[LRGrid], seeds: int, refine: int) -> int:
    """The trials the refinement of ``grids`` adds when every winner is interior (a grid of fewer
    than 3 points has no interior: never refined)."""
    return sum(refine * seeds for g in grids if g.extendable)
