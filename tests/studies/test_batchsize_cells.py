"""The batch-size study's η per (arm, B) cell in two stages (``lr_policy: tuned`` with
``lr_tuning.cells``), its per-budget reading in ``verdict.json`` and the report's η plot, and the
``fashion`` preset's plan (issue #49). Everything here runs without Ray."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from studies import cli
from studies.batchsize_correlation import DEFAULT_SPEC
from studies.kinds import kind_for
from studies.kinds.batchsize.report import plot_lr_vs_batch_size
from studies.kinds.batchsize.spec import BatchSizeStudySpec, cell_key
from studies.kinds.batchsize.workflow import budget_readings
from studies.kinds.pipeline import select_cell_rates
from studies.results import _estimate
from studies.schema import load_spec
from workers.records import TrialRecord

TWO_STAGE = ("lr_policy=tuned", "lr_tuning.cells={points: 4, ratio: 2.0}")


def _spec(*overrides: str, preset: str = "smoke") -> BatchSizeStudySpec:
    spec: BatchSizeStudySpec = load_spec(
        DEFAULT_SPEC, list(overrides), preset=preset, model=BatchSizeStudySpec
    )
    return spec


def _trial(arm: str, b: int, lr: float, seed: int, value: float) -> TrialRecord:
    config = {"model": {"layer": {"type": arm}}, "training": {"batch_size": b, "lr": lr}, "seed": seed}
    return TrialRecord(f"{arm}-{b}-{lr}-{seed}", {}, config, "completed", {"val_accuracy": value})


def test_each_cell_grid_has_ratio_2_around_the_square_root_scaled_reference_rate() -> None:
    spec = _spec(*TWO_STAGE)
    ref = spec.lr_tuning.reference_batch_size
    grids = spec.cell_grids({"linear": 0.5, "corrected": 4.0})
    # an arm without a reference rate gets no cells; every batch size of the others does
    assert set(grids) == {cell_key(a, b) for a in ("linear", "corrected") for b in spec.batch_sizes}
    for b in spec.batch_sizes:
        points = grids[cell_key("corrected", b)].points
        assert len(points) == 4
        ratios = [hi / lo for lo, hi in itertools.pairwise(points)]
        assert ratios == pytest.approx([2.0] * 3, rel=1e-4)
        centre = math.exp(sum(math.log(p) for p in points) / len(points))
        assert centre == pytest.approx(4.0 * math.sqrt(b / ref), rel=1e-4)


def test_the_first_stage_tunes_each_arm_at_the_reference_batch_size_and_counts_both_stages() -> None:
    spec = _spec(*TWO_STAGE)
    assert spec.tuning_cells == spec.arms  # stage 1: one cell per arm
    assert set(spec.tuned_cells) == {cell_key(a, b) for a in spec.arms for b in spec.batch_sizes}
    first = {c["training"]["batch_size"] for c in dict(spec.tuning_plan("epochs").grid)["@"]}
    assert first == {spec.lr_tuning.reference_batch_size}
    seeds = len(spec.lr_tuning.seeds)
    expected = (len(spec.arms) * spec.lr_tuning.points + len(spec.tuned_cells) * 4) * seeds
    assert spec.tuning_trials == expected
    whole_grid = _spec("lr_policy=tuned")  # without cells: every (arm, B) cell on the whole grid
    assert whole_grid.tuning_cells == whole_grid.tuned_cells
    phases = [p.name for p in kind_for(spec).phases(spec)]
    assert phases.index("tune-epochs") < phases.index("tune-epochs-cells") < phases.index("confirm-epochs")


def test_cells_without_lr_policy_tuned_is_refused_naming_the_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = cli.main(["validate", str(DEFAULT_SPEC), "--preset", "smoke", "--set", "lr_tuning.cells={}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "lr_tuning.cells" in err and "lr_policy: tuned" in err and "Traceback" not in err


def test_the_second_stage_picks_each_cell_on_its_own_grid_and_keeps_the_reference_record() -> None:
    spec = _spec(*TWO_STAGE, "lr_tuning.max_extensions=0", "lr_tuning.refine=0")
    grids = {k: g for k, g in spec.cell_grids({"linear": 1.0}).items()}
    trials = []
    for cell, grid in grids.items():
        arm, _, b = cell.partition("@")
        best = grid.points[1 if int(b) < 32 else 2]  # small B prefers the lower rate
        for lr in grid.points:
            for seed in spec.lr_tuning.seeds:
                trials.append(_trial(arm, int(b), lr, seed, 0.9 if lr == best else 0.5))
    reference = {"linear": {"lr": 1.0, "grid": [0.1, 1.0, 10.0]}}
    lr, record = select_cell_rates(spec, grids, reference, trials)
    assert set(lr) == set(grids)
    for cell, grid in grids.items():
        assert lr[cell] == grid.points[1 if int(cell.split("@")[1]) < 32 else 2]
        assert record[cell]["stage"] == "cell" and record[cell]["grid"] == list(grid.points)
    assert record["linear"]["stage"] == "reference" and record["linear"]["lr"] == 1.0


def _verdict(*budgets: str) -> dict[str, Any]:
    def result(slope: float) -> dict[str, Any]:
        return {
            "study_verdict": "inconclusive",
            "study_reasons": ["underpowered"],
            "verdict": {"corrected": "inconclusive"},
            "controls": {"linear": "stable"},
            "arms": {
                "linear": {"slope": 0.001, "slope_ci": [-0.002, 0.004], "n_seeds": 6},
                "corrected": {
                    "slope": slope,
                    "slope_ci": [slope - 0.01, slope + 0.01],
                    "interaction": slope - 0.001,
                    "interaction_ci": [slope - 0.011, slope + 0.009],
                    "n_seeds": 6,
                },
            },
        }

    if len(budgets) == 1:
        return result(-0.02)
    return {"budgets": {b: result(-0.02 * (i + 1)) for i, b in enumerate(budgets)}}


def test_per_budget_reading_has_slope_interaction_intervals_and_eta_per_cell() -> None:
    spec = _spec(*TWO_STAGE, "arms=[linear, corrected]", "controls=[linear]")
    records = {"epochs": {cell_key(a, b): {"lr": 0.1 * b} for a in spec.arms for b in spec.batch_sizes}}
    out = budget_readings(spec, _verdict("epochs"), records)
    corrected = out["epochs"]["arms"]["corrected"]
    assert corrected["interaction"] == pytest.approx(-0.021)
    assert corrected["interaction_ci"] == pytest.approx([-0.031, -0.011])
    assert corrected["slope_ci"] == pytest.approx([-0.03, -0.01])
    assert corrected["tuned_lr"] == {str(b): pytest.approx(0.1 * b) for b in spec.batch_sizes}
    assert out["epochs"]["arms"]["linear"]["role"] == "control"
    assert "-0.0210 [-0.0310, -0.0110]" in out["epochs"]["reading"]
    # one eta per arm scaled with B: the eta each cell trained with
    sqrt = _spec("lr_policy=sqrt", "arms=[linear, corrected]", "controls=[linear]")
    scaled = budget_readings(
        sqrt, _verdict("epochs"), {"epochs": {"linear": {"lr": 0.4}, "corrected": {"lr": 1}}}
    )
    ref = sqrt.lr_tuning.reference_batch_size
    b = sqrt.batch_sizes[-1]
    assert scaled["epochs"]["arms"]["linear"]["tuned_lr"][str(b)] == pytest.approx(0.4 * math.sqrt(b / ref))


def test_several_budgets_give_each_hypothesis_an_estimate_per_budget_never_a_dash() -> None:
    spec = _spec("arms=[linear, corrected]", "controls=[linear]", "budgets=[epochs, updates]")
    per_budget = budget_readings(spec, _verdict("epochs", "updates"), {})
    from studies.kinds.batchsize.workflow import _by_budget

    entry = {"estimate": None, "ci": None, **_by_budget("corrected", per_budget)}
    text = _estimate(entry, "interaction")
    assert text.startswith("epochs: interaction -0.021") and "updates: interaction -0.041" in text
    assert "—" not in text


def test_the_eta_plot_draws_one_line_per_arm_and_skips_a_verdict_without_cells(tmp_path: Path) -> None:
    assert plot_lr_vs_batch_size({"arms": {}}, tmp_path / "none.png") is None
    spec = _spec(*TWO_STAGE, "arms=[linear, corrected]", "controls=[linear]")
    records = {"epochs": {cell_key(a, b): {"lr": 0.1 * b} for a in spec.arms for b in spec.batch_sizes}}
    verdict = {"control": "linear", "per_budget": budget_readings(spec, _verdict("epochs"), records)}
    path = plot_lr_vs_batch_size(verdict, tmp_path / "lr.png")
    assert path is not None and path.stat().st_size > 1000


def test_fashion_preset_plans_every_batch_size_in_its_tuning_and_counts_the_adequacy_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = _spec(preset="fashion")
    assert spec.name == "batchsize_correlation_fashion" and spec.lr_tuning.cells is not None
    assert spec.batch_sizes[-1] / spec.batch_sizes[0] >= 32 and len(spec.batch_sizes) >= 4
    assert spec.sequential is not None and (spec.sequential.min_seeds, spec.sequential.max_seeds) == (6, 12)
    # structure, not speed: a stand-in calibration (the CPU-hours are measured on the machine by `plan`)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"step_s": {"*": 0.001}, "eval_s": 0.1, "setup_s": 0.5}), encoding="utf-8")
    args = [
        "plan",
        str(DEFAULT_SPEC),
        "--preset",
        "fashion",
        "--json",
        "--calibration",
        str(cal),
        "--no-calibrate",
    ]
    assert cli.main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    phases = {p["name"]: p for p in plan["phases"]}
    cells = phases["tune-epochs-cells"]
    assert set(cells["epochs_by_batch_size"]) == {str(b) for b in spec.batch_sizes}
    assert phases["tune-epochs-adequacy"]["trials"] == len(spec.arms) * len(spec.batch_sizes)
    # the price: every look to its maximum (12 seeds), no range extension
    counted = [p for p in plan["phases"] if not p["optional"] or p["look"]]
    assert {p["name"] for p in counted} >= {
        "tune-epochs-cells",
        "tune-epochs-adequacy",
        "confirm-epochs-look3",
    }
    assert plan["trials"] == sum(p["trials"] for p in counted)
    assert plan["cpu_hours"] == pytest.approx(sum(p["cpu_hours"] for p in counted))
