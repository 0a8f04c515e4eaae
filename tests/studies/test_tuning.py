"""studies.tuning: the one learning-rate tuning step (grid, selection, edge, range extension), no Ray."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from studies.kinds.batchsize.spec import LRTuningSpec
from studies.kinds.search.spec import ConfirmLRSpec
from studies.tuning import LRGrid, extension_trials_max, refine_points, refine_trials, select_lr, tune

SEEDS = (1000, 1001)


@dataclass
class Trial:
    lr: float
    value: float
    status: str = "completed"
    cell: str = "arm"
    config: dict[str, Any] = field(init=False)
    metrics: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.config = {"training": {"lr": self.lr}}
        self.metrics = {"val_accuracy": self.value}


def _objective(optimum: float) -> Any:
    """A validation accuracy peaked at ``optimum`` on the log scale (1 there, falling away from it)."""
    return lambda lr: 1.0 - (math.log10(lr) - math.log10(optimum)) ** 2 / 10


def _trials(points: Any, score: Any, cell: str = "arm") -> list[Trial]:
    return [Trial(lr, score(lr) + 0.001 * s, cell=cell) for lr in points for s in range(len(SEEDS))]


class Runner:
    """Runs an extension round by scoring the new rates with the objective (and records the calls)."""

    def __init__(self, score: Any) -> None:
        self.score = score
        self.calls: list[tuple[int, dict[str, float]]] = []

    def __call__(self, round_: int, lrs: Mapping[str, float]) -> list[Trial]:
        self.calls.append((round_, dict(lrs)))
        return [t for cell, lr in lrs.items() for t in _trials([lr], self.score, cell)]


def test_grids_are_the_specs_grids() -> None:
    spec = LRTuningSpec()
    assert spec.grid() == LRGrid.absolute(spec.low, spec.high, spec.points).points and len(spec.grid()) == 11
    assert spec.grid()[0] == 1e-3 and spec.grid()[-1] == 1e2 and spec.max_extensions == 3
    assert LRGrid.absolute(1e-3, 1e2, 6).points == (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
    rel = ConfirmLRSpec(factor=10.0, points=5)
    assert rel.grid(0.01) == (0.001, 0.00316228, 0.01, 0.0316228, 0.1)
    assert ConfirmLRSpec(points=1).grid(0.02) == (0.02,)
    g = LRGrid.absolute(1e-3, 1e-2, 3)
    assert g.next_point("high") == pytest.approx(0.0316228) and g.next_point("low") == pytest.approx(
        0.000316228
    )
    assert g.extended("high").extended("low").points == (0.000316228, 0.001, 0.00316228, 0.01, 0.0316228)
    assert g.extended("high").extensions == 1 and g.extendable
    assert not LRGrid.absolute(1e-3, 1e-2, 2).extendable and not LRGrid.relative(0.1, 3.0, 1).extendable


def test_selection_scores_failures_worst_and_flags_edges() -> None:
    grid = LRGrid.absolute(1e-3, 1e-1, 3)
    trials = [
        Trial(0.001, 0.5),
        Trial(0.001, 0.5),
        Trial(0.01, 0.9),
        Trial(0.01, 0.7, status="diverged"),  # one failed seed sinks the rate
        Trial(0.1, 0.8),
        Trial(0.1, 0.8),
        Trial(0.05, 1.0),  # off the grid: ignored
    ]
    rec = select_lr(trials, grid, metric="val_accuracy", mode="max")
    assert rec["lr"] == 0.1 and rec["at_range_edge"] and rec["edge"] == "high"
    assert rec["trials"] == 6 and rec["trials_failed"] == 1 and rec["val_accuracy"] == pytest.approx(0.8)
    assert rec["scores"]["0.01"] is None  # -inf mean: reported as not trained
    low = select_lr(trials, grid, metric="val_accuracy", mode="min")
    assert low["lr"] == 0.001 and low["edge"] == "low"
    ties = select_lr([Trial(lr, 0.5) for lr in grid.points], grid, metric="val_accuracy", mode="max")
    assert ties["lr"] == 0.001  # ties go to the lower rate
    two = LRGrid.absolute(1e-3, 1e-2, 2)
    assert select_lr([Trial(0.01, 1.0), Trial(0.001, 0.0)], two, metric="val_accuracy", mode="max")[
        "at_range_edge"
    ]
    one = LRGrid.relative(0.01, 10.0, 1)
    assert not select_lr([Trial(0.01, 1.0)], one, metric="val_accuracy", mode="max")["at_range_edge"]
    dead = select_lr(
        [Trial(lr, math.nan, status="error") for lr in grid.points], grid, metric="val_accuracy", mode="max"
    )
    assert dead["no_learning_rate_trained"] and dead["val_accuracy"] is None


def test_a_low_range_is_extended_until_the_optimum_is_inside() -> None:
    score = _objective(0.3)
    grid = LRGrid.absolute(1e-3, 1e-2, 3)  # the optimum is 1.5 decades above the range
    runner = Runner(score)
    records, trials = tune(
        {"arm": grid},
        _trials(grid.points, score),
        cell_of=lambda t: t.cell,
        metric="val_accuracy",
        mode="max",
        max_extensions=6,
        run_points=runner,
    )
    rec = records["arm"]
    assert not rec["at_range_edge"] and rec["lr"] > 0.01
    assert rec["lr"] == pytest.approx(0.316228)
    # one point of the grid's own ratio (sqrt 10) per round, upwards, until the winner is interior
    assert [c[0] for c in runner.calls] == [1, 2, 3, 4]
    assert [c[1]["arm"] for c in runner.calls] == pytest.approx([0.0316228, 0.1, 0.316228, 1.0])
    assert rec["extensions"] == 4 and rec["grid"][-1] == pytest.approx(1.0)
    assert len(trials) == (3 + 4) * len(SEEDS)
    # replaying from the recorded trials (a report) gives the same record without running anything
    replay = {r: [t for t in trials if t.lr == pytest.approx(lrs["arm"])] for r, lrs in runner.calls}
    again, _ = tune(
        {"arm": grid},
        _trials(grid.points, score),
        cell_of=lambda t: t.cell,
        metric="val_accuracy",
        mode="max",
        max_extensions=6,
        run_points=lambda r, lrs: replay[r],
    )
    assert again == records


def test_extensions_stop_at_the_limit_and_only_for_cells_on_an_edge() -> None:
    grid = LRGrid.absolute(1e-3, 1e-1, 3)
    scores = {"high": _objective(10.0), "inside": _objective(0.01), "low": _objective(1e-6)}
    first = [t for cell, f in scores.items() for t in _trials(grid.points, f, cell)]

    def run(round_: int, lrs: Mapping[str, float]) -> list[Trial]:
        return [t for cell, lr in lrs.items() for t in _trials([lr], scores[cell], cell)]

    calls: list[dict[str, float]] = []
    records, _ = tune(
        {cell: grid for cell in scores},
        first,
        cell_of=lambda t: t.cell,
        metric="val_accuracy",
        mode="max",
        max_extensions=2,
        run_points=lambda r, lrs: calls.append(dict(lrs)) or run(r, lrs),
    )
    assert all(set(c) == {"high", "low"} for c in calls) and len(calls) == 2
    assert records["inside"]["extensions"] == 0 and not records["inside"]["at_range_edge"]
    for cell in ("high", "low"):  # still on the edge after the last extension: flagged
        assert records[cell]["at_range_edge"] and records[cell]["extensions"] == 2
    assert records["low"]["lr"] == pytest.approx(1e-5) and records["high"]["lr"] == pytest.approx(10.0)


def test_no_extension_for_small_grids_zero_rounds_or_a_round_not_run() -> None:
    score = _objective(10.0)
    runner = Runner(score)
    for grid, rounds in ((LRGrid.absolute(1e-3, 1e-2, 2), 5), (LRGrid.absolute(1e-3, 1e-1, 3), 0)):
        records, _ = tune(
            {"arm": grid},
            _trials(grid.points, score),
            cell_of=lambda t: t.cell,
            metric="val_accuracy",
            mode="max",
            max_extensions=rounds,
            run_points=runner,
        )
        assert records["arm"]["at_range_edge"] and records["arm"]["extensions"] == 0
    assert runner.calls == []
    grid = LRGrid.absolute(1e-3, 1e-1, 3)
    records, _ = tune(
        {"arm": grid},
        _trials(grid.points, score),
        cell_of=lambda t: t.cell,
        metric="val_accuracy",
        mode="max",
        max_extensions=3,
        run_points=lambda r, lrs: [],  # an interrupted study: the round has no trials yet
    )
    assert records["arm"]["extensions"] == 0 and records["arm"]["grid"] == list(grid.points)
    with pytest.raises(ValueError):
        tune({}, [], cell_of=lambda t: "", metric="m", mode="max", max_extensions=-1)


def test_extension_trials_max() -> None:
    grids = [LRGrid.absolute(1e-3, 1e-1, 3), LRGrid.absolute(1e-3, 1e-1, 2), LRGrid.relative(1.0, 10.0, 5)]
    assert extension_trials_max(grids, 2, 3) == 2 * 3 * 2  # the 2-point grid never extends
    assert extension_trials_max(grids, 2, 0) == 0


# ---- refinement --------------------------------------------------------------------------------


class Refiner:
    """Runs the refinement by scoring its rates with the objective (and records the calls)."""

    def __init__(self, score: Any) -> None:
        self.score = score
        self.calls: list[dict[str, tuple[float, ...]]] = []

    def __call__(self, lrs: Mapping[str, Sequence[float]]) -> list[Trial]:
        self.calls.append({cell: tuple(v) for cell, v in lrs.items()})
        return [t for cell, v in lrs.items() for t in _trials(v, self.score, cell)]


def _tune(grid: LRGrid, score: Any, run_refine: Any, *, refine: int = 2, max_extensions: int = 3) -> Any:
    return tune(
        {"arm": grid},
        _trials(grid.points, score),
        cell_of=lambda t: t.cell,
        metric="val_accuracy",
        mode="max",
        max_extensions=max_extensions,
        run_points=Runner(score),
        refine=refine,
        run_refine=run_refine,
    )


def test_refine_points_lie_between_an_interior_best_and_its_neighbours() -> None:
    grid = LRGrid.absolute(0.01, 10.0, 4)  # 0.01, 0.1, 1, 10
    # 2: the geometric midpoints to both neighbours
    assert refine_points(grid, 0.1, 2) == pytest.approx(
        (math.sqrt(0.01 * 0.1), math.sqrt(0.1 * 1.0)), rel=1e-5
    )
    # 4: two per side, a third and two thirds of the way (on the log scale) to each neighbour
    assert refine_points(grid, 1.0, 4) == pytest.approx(
        (10 ** (-2 / 3), 10 ** (-1 / 3), 10 ** (1 / 3), 10 ** (2 / 3)), rel=1e-5
    )
    # an edge has one neighbour: none; refine 0: none; a point not in use: none
    assert refine_points(grid, 0.01, 2) == refine_points(grid, 10.0, 2) == ()
    assert refine_points(grid, 0.1, 0) == refine_points(grid, 0.5, 2) == ()
    # an extended grid: its new last point is an edge, its old last point now interior
    wider = grid.extended("high")
    assert refine_points(wider, 100.0, 2) == () and refine_points(wider, 10.0, 2) == pytest.approx(
        (math.sqrt(10.0), math.sqrt(1000.0)), rel=1e-5
    )
    # grids without an interior: 2 points, 1 point
    assert refine_points(LRGrid.absolute(0.01, 0.1, 2), 0.1, 2) == ()
    assert refine_points(LRGrid.relative(0.1, 10.0, 1), 0.1, 2) == ()
    for odd in (1, 3, -2):
        with pytest.raises(ValueError):
            refine_points(grid, 0.1, odd)


def test_a_refinement_point_that_wins_is_selected() -> None:
    # optimum 0.3: the grid's best is 0.1 (0.48 decades off; 1 is 0.52 off), its midpoint to 1 (0.316) is
    # 0.02 decades off
    score = _objective(0.3)
    grid = LRGrid.absolute(0.01, 10.0, 4)
    refiner = Refiner(score)
    records, trials = _tune(grid, score, refiner)
    rec = records["arm"]
    assert refiner.calls == [{"arm": pytest.approx((0.0316228, 0.316228))}]
    assert rec["lr"] == pytest.approx(0.316228) and not rec["at_range_edge"] and rec["extensions"] == 0
    assert rec["refine"] == {
        "points": pytest.approx([0.0316228, 0.316228]),
        "grid_lr": 0.1,
        "moved": True,
        "skipped": None,
    }
    assert rec["grid"] == list(grid.points)  # the grid is the grid; the refinement rates are scored beside it
    assert set(rec["scores"]) == {"0.01", "0.0316228", "0.1", "0.316228", "1", "10"}
    assert len(trials) == rec["trials"] == (4 + 2) * len(SEEDS)
    # replayed from the stored trials (a report): the same record; a refinement not run yet: the grid's
    stored = [t for t in trials if t.lr not in grid.points]
    again, _ = _tune(grid, score, lambda lrs: stored)
    assert again == records
    unrun, _ = _tune(grid, score, lambda lrs: [])
    assert unrun["arm"]["lr"] == 0.1 and unrun["arm"]["refine"]["skipped"] == "not run"
    assert unrun["arm"]["refine"]["points"] == [] and not unrun["arm"]["refine"]["moved"]


def test_a_winner_that_holds_against_its_refinement_stays() -> None:
    score = _objective(0.1)
    grid = LRGrid.absolute(0.01, 10.0, 4)
    refiner = Refiner(score)
    records, _ = _tune(grid, score, refiner)
    rec = records["arm"]
    assert len(refiner.calls) == 1 and rec["lr"] == 0.1
    assert rec["refine"]["grid_lr"] == 0.1 and not rec["refine"]["moved"] and rec["refine"]["skipped"] is None


def test_no_refinement_on_an_edge_after_the_extensions_or_with_refine_0() -> None:
    grid = LRGrid.absolute(0.01, 10.0, 4)
    far = _objective(1e4)  # three decades above the range: still on the edge after 2 extensions
    refiner = Refiner(far)
    records, trials = _tune(grid, far, refiner, max_extensions=2)
    rec = records["arm"]
    assert refiner.calls == [] and rec["at_range_edge"] and rec["extensions"] == 2
    assert (
        rec["refine"]["points"] == []
        and rec["refine"]["skipped"] == "the best rate sits on the high edge of its grid"
    )
    assert len(trials) == (4 + 2) * len(SEEDS)
    score = _objective(0.3)
    refiner = Refiner(score)
    records, trials = _tune(grid, score, refiner, refine=0)
    assert refiner.calls == [] and records["arm"]["lr"] == 0.1 and len(trials) == 4 * len(SEEDS)
    assert records["arm"]["refine"] == {"points": [], "grid_lr": 0.1, "moved": False, "skipped": "refine: 0"}
    with pytest.raises(ValueError):
        _tune(grid, score, refiner, refine=3)


def test_refinement_follows_the_range_extension() -> None:
    # the optimum above the range: extended until interior, then refined around the new winner
    score = _objective(0.5)
    grid = LRGrid.absolute(1e-3, 1e-1, 3)  # a decade apart
    refiner = Refiner(score)
    records, trials = _tune(grid, score, refiner, max_extensions=4)
    rec = records["arm"]
    assert rec["extensions"] == 2 and rec["refine"]["grid_lr"] == 1.0  # 1e-3 .. 10 after 2 rounds
    assert refiner.calls == [{"arm": pytest.approx((0.316228, 3.16228))}]
    assert rec["lr"] == pytest.approx(0.316228) and rec["refine"]["moved"]
    assert len(trials) == (3 + 2 + 2) * len(SEEDS)


def test_refine_trials_count_every_grid_with_an_interior() -> None:
    grids = [LRGrid.absolute(1e-3, 1e-1, 3), LRGrid.absolute(1e-3, 1e-1, 2), LRGrid.relative(1.0, 10.0, 1)]
    assert refine_trials(grids, 2, 2) == 2 * 2  # only the 3-point grid has an interior
    assert refine_trials(grids, 2, 0) == 0
