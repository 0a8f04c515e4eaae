"""studies.planning: trial counts, cost and wall time before launch; seeds needed from a pilot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.calibration import timing_key
from studies.kinds import KINDS, kind_for, load_study
from studies.kinds.batchsize.analysis import ols_slope
from studies.pilot import pilot_power
from studies.planning import phases_of, plan_study
from studies.stats import seeds_needed

SPECS = Path(__file__).resolve().parents[2] / "studies" / "specs"
BATCHSIZE = SPECS / "batchsize_correlation.yaml"
SEARCH = SPECS / "autonorm_search.yaml"
# Given calibration: no training, every key covered by "*".
CAL: dict[str, Any] = {"step_s": {"*": 0.01}, "eval_s": 0.1, "setup_s": 0.5}


@pytest.mark.parametrize(
    ("kind", "preset"),
    [(name, preset) for name in sorted(KINDS) for preset in (None, KINDS[name].example[1])],
)
def test_trials_equal_the_kinds_total_trials(kind: str, preset: str | None) -> None:
    spec = load_study(Path(__file__).resolve().parents[2] / KINDS[kind].example[0], preset=preset)
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=8)
    # no extension firing; every look of a sequential spec (the kind's count is its first look's) and
    # every tuned rate refined (the kind's count: none)
    counted = sum(p["trials"] for p in plan["phases"] if p["look"] or p["refine"])
    assert plan["trials"] == KINDS[kind].total_trials(spec) + counted
    assert (
        sum(p["trials"] for p in plan["phases"] if not p["optional"] or p["look"] or p["refine"])
        == plan["trials"]
    )
    # trials_max: every learning-rate range extension firing (optional phases, one per round)
    assert sum(p["trials"] for p in plan["phases"]) == plan["trials_max"] >= plan["trials"]
    assert plan["wall_s_max"] >= plan["wall_s"] and plan["cpu_hours_max"] >= plan["cpu_hours"]
    assert plan["wall_s"] > 0 and plan["cpu_hours"] > 0 and plan["gpu_hours"] == 0
    assert plan["calibration"]["measured"] == []


def test_batchsize_phases_are_tuning_then_confirmatory_per_budget() -> None:
    spec = load_study(BATCHSIZE)
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=8)
    names = [p["name"] for p in plan["phases"] if not p["optional"]]
    assert names == [
        "tune-epochs",
        "tune-epochs-adequacy",  # the training-adequacy check, counted (issue #47)
        "confirm-epochs",
        "tune-updates",
        "tune-updates-adequacy",
        "confirm-updates",
    ]
    by = {p["name"]: p for p in plan["phases"]}
    # each (arm, B) cell on one tuning seed, at the budget and at twice it (lr_policy constant: the
    # tuning ran only the reference batch size), priced at its own epochs
    cells = len(spec.arms) * len(spec.batch_sizes)
    assert by["tune-epochs-adequacy"]["trials"] == 2 * cells
    assert spec.adequacy_trials == 2 * by["tune-epochs-adequacy"]["trials"]
    assert by["tune-epochs-adequacy"]["epochs"] == 2 * spec.training.epochs
    rounds = spec.lr_tuning.max_extensions
    extensions = [p for p in plan["phases"] if p["optional"] and not p["refine"]]
    assert [p["name"] for p in extensions] == [
        f"tune-{b}-ext{k}" for b in spec.budgets for k in range(1, rounds + 1)
    ]
    # one new rate per arm and round, on every tuning seed
    assert {p["trials"] for p in extensions} == {len(spec.arms) * len(spec.lr_tuning.seeds)}
    # the refinement after the extensions: 2 rates per arm (the default refine), on every tuning seed
    refined = [p for p in plan["phases"] if p["refine"]]
    assert [p["name"] for p in refined] == [f"tune-{b}-refine" for b in spec.budgets]
    assert {p["trials"] for p in refined} == {2 * len(spec.arms) * len(spec.lr_tuning.seeds)}
    assert spec.refine_trials == sum(p["trials"] for p in refined)
    assert plan["trials"] == spec.total_trials + spec.refine_trials
    assert plan["trials_max"] == spec.total_trials + spec.refine_trials + spec.extension_trials_max
    assert by["confirm-epochs"]["trials"] == spec.expected_trials // 2
    assert by["tune-epochs"]["trials"] == spec.tuning_trials // 2
    assert by["confirm-epochs"]["epochs"] == spec.training.epochs
    # No max_updates in the shipped spec: `epochs` epochs at the reference batch size, for every B.
    updates = spec.training.epochs * (54_000 // spec.lr_tuning.reference_batch_size)
    assert spec.training.max_updates is None and by["confirm-updates"]["updates"] == updates
    # Under the epochs budget the updates fall as 1/B (54,000 training rows of Fashion-MNIST).
    ups = by["confirm-epochs"]["updates_by_batch_size"]
    assert ups["8"] == spec.training.epochs * (54_000 // 8) and ups["512"] == spec.training.epochs * (
        54_000 // 512
    )
    assert set(by["confirm-updates"]["updates_by_batch_size"].values()) == {updates}


def _equal_trials_cal() -> dict[str, Any]:
    # Every trial lasts trial_start_s + setup_s = 6 s; no fixed phase or worker cost.
    return {
        "step_s": {"*": 0.0},
        "eval_s": 0.0,
        "setup_s": 5.0,
        "trial_start_s": 1.0,
        "report_s": 0.0,
        "worker_start_s": 0.0,
        "phase_start_s": 0.0,
        "study_start_s": 0.0,
    }


def test_halving_the_slots_doubles_the_wall_of_equal_trials() -> None:
    # one trial per process (a stacked phase packs groups: test_a_stacked_phase_is_priced_per_group...)
    spec = load_study(BATCHSIZE, ["max_concurrent=8", "execution.stack=off"], preset="smoke")
    wide = plan_study(spec, kind_for(spec), calibration=_equal_trials_cal(), calibrate=False, cpus=8)
    narrow = plan_study(spec, kind_for(spec), calibration=_equal_trials_cal(), calibrate=False, cpus=4)
    tuning_wide, tuning_narrow = wide["phases"][0], narrow["phases"][0]
    assert (tuning_wide["slots"], tuning_narrow["slots"]) == (8, 4)
    assert tuning_wide["trials"] == 24
    assert tuning_wide["wall_s"] == pytest.approx(24 / 8 * 6.0)
    assert tuning_narrow["wall_s"] == pytest.approx(2 * tuning_wide["wall_s"])
    # Resources do not depend on the cluster.
    assert narrow["cpu_hours"] == pytest.approx(wide["cpu_hours"])


def test_many_unequal_trials_scale_roughly_with_the_slots() -> None:
    spec = load_study(BATCHSIZE, ["max_concurrent=16", "execution.stack=off"])  # trials, not groups
    wide = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=16)
    narrow = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=8)
    for w, n in zip(wide["phases"], narrow["phases"]):
        if w["refine"]:  # 24 trials: 2 waves of 16 against 3 of 8, not "many"
            continue
        ratio = (n["wall_s"] - 5.0) / (w["wall_s"] - 5.0)  # phase_start_s is paid once either way
        assert 1.7 < ratio < 2.1, (w["name"], ratio)


def test_gpu_trials_are_limited_by_the_gpus() -> None:
    spec = load_study(BATCHSIZE, ["resources.gpu=0.5", "max_concurrent=8"], preset="smoke")
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=16, gpus=1)
    assert {p["slots"] for p in plan["phases"]} == {2}
    assert plan["gpu_hours"] == pytest.approx(plan["cpu_hours"] / 2)
    with pytest.raises(ValueError, match="no trial can start"):
        plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=16, gpus=0)


def test_missing_step_time_without_calibrating_is_an_error() -> None:
    spec = load_study(BATCHSIZE, preset="smoke")
    with pytest.raises(ValueError, match="no step_s"):
        plan_study(spec, kind_for(spec), calibration={"step_s": {"nothing": 1.0}}, calibrate=False)


def test_real_calibration_measures_every_distinct_key() -> None:
    spec = load_study(BATCHSIZE, preset="smoke")
    keys = {timing_key(c) for ph in phases_of(spec, kind_for(spec)) for c in ph.configs}
    assert len(keys) == 3 * 3  # arms x (reference B of the tuning, the confirmatory Bs 8/32/128)
    plan = plan_study(spec, kind_for(spec), cpus=2, steps=5, warmup=2)
    cal = plan["calibration"]
    assert set(cal["measured"]) == keys
    for key in keys:
        for field in ("step_s", "eval_s", "setup_s"):
            assert math.isfinite(cal[field][key]) and cal[field][key] > 0, (field, key)
    assert cal["data"]["digits" + '{"val_fraction":0.2}']["train"] > 0
    # The measured calibration reproduces the plan without measuring again.
    again = plan_study(spec, kind_for(spec), cpus=2, calibration=cal, calibrate=False)
    assert again["calibration"]["measured"] == []
    assert again["wall_s"] == pytest.approx(plan["wall_s"])


# --------------------------------------------------------------------------------------------------
# pilot_power


def _planted_batchsize_pilot(
    spec: Any,
    out: Path,
    slopes: dict[tuple[str, str], np.ndarray],
    *,
    fail: tuple[str, int, int] | None = None,
) -> None:
    """trials.csv where each fix arm's per-seed interaction slope (per budget) is exactly planted."""
    rng = np.random.default_rng(7)
    rows = []
    budgets = sorted({b for b, _ in slopes})
    n_seeds = len(next(iter(slopes.values())))
    for budget in budgets:
        for seed in range(n_seeds):
            control = {b: 0.8 + 0.02 * rng.standard_normal() for b in spec.batch_sizes}
            for arm in spec.arms:
                for b in spec.batch_sizes:
                    if arm == spec.control:
                        value = control[b]
                    elif arm in spec.fix_arms:
                        value = control[b] + 0.01 * seed + slopes[(budget, arm)][seed] * math.log2(b)
                    else:
                        value = 0.8 + 0.02 * rng.standard_normal()
                    status = "diverged" if fail == (arm, seed, b) else "completed"
                    rows.append(
                        {
                            "arm": arm,
                            "batch_size": b,
                            "seed": seed,
                            "budget": budget,
                            "status": status,
                            "test_accuracy": math.nan if status != "completed" else value,
                            "train_loss": 0.3,
                        }
                    )
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "trials.csv", index=False)


def test_pilot_power_batchsize_matches_seeds_needed_on_the_planted_slopes(tmp_path: Path) -> None:
    spec = load_study(BATCHSIZE)  # 3 fix arms, 2 budgets
    assert len(spec.fix_arms) == 3
    rng = np.random.default_rng(0)
    slopes = {}
    for budget, sd in (("epochs", 0.004), ("updates", 0.008)):  # the updates budget is noisier
        for arm in spec.fix_arms:
            slopes[(budget, arm)] = -0.01 + sd * rng.standard_normal(4)
    _planted_batchsize_pilot(spec, tmp_path, slopes)
    result = pilot_power(spec, kind_for(spec), tmp_path, calibration=CAL, calibrate=False, cpus=8)
    assert result["family_size"] == 3 and result["alpha"] == spec.analysis.alpha
    for arm in spec.fix_arms:
        expected = {
            b: seeds_needed(list(slopes[(b, arm)]), alpha=0.05, family_size=3, power=0.8, alternative="less")
            for b in ("epochs", "updates")
        }
        for b in expected:
            assert result["by_budget"][b]["per_seed"][arm] == pytest.approx(list(slopes[(b, arm)]))
            assert result["by_budget"][b]["seeds_needed"][arm] == expected[b]
        assert result["seeds_needed"][arm] == max(expected.values())
        binding = result["binding_budget"][arm]
        assert result["sd"][arm] == pytest.approx(float(np.std(slopes[(binding, arm)], ddof=1)))
    k = max(result["seeds_needed"].values())
    assert result["k"] == k and result["seeds_planned"] == max(k, spec.analysis.min_seeds)
    study = load_study(BATCHSIZE, [f"seeds=[{','.join(str(s) for s in range(result['seeds_planned']))}]"])
    assert result["cost"]["trials"] == study.total_trials + study.refine_trials
    assert str(k) in result["statement"]


def test_pilot_power_scores_a_failed_trial_at_chance(tmp_path: Path) -> None:
    spec = load_study(BATCHSIZE, preset="smoke")  # digits: chance 0.1; one fix arm (corrected)
    assert spec.fix_arms == ("corrected",)
    slopes = {("epochs", "corrected"): np.array([-0.02, -0.01, -0.03])}
    _planted_batchsize_pilot(spec, tmp_path, slopes, fail=("corrected", 1, 32))
    result = pilot_power(spec, kind_for(spec), tmp_path, calibration=CAL, calibrate=False)
    table = pd.read_csv(tmp_path / "trials.csv")
    seed1 = table[table["seed"] == 1].set_index(["arm", "batch_size"])["test_accuracy"]
    x = np.log2(np.array(spec.batch_sizes, dtype=float))
    fix = np.array([0.1 if b == 32 else seed1[("corrected", b)] for b in spec.batch_sizes])
    d = fix - np.array([seed1[("linear", b)] for b in spec.batch_sizes])
    per_seed = result["per_seed"]["corrected"]
    assert per_seed[1] == pytest.approx(ols_slope(x, d))
    assert per_seed[0] == pytest.approx(-0.02) and per_seed[2] == pytest.approx(-0.03)
    assert result["seeds_needed"]["corrected"] == seeds_needed(
        per_seed, alpha=0.05, family_size=1, power=0.8, alternative="less"
    )


def test_pilot_power_search_contrasts(tmp_path: Path) -> None:
    spec = load_study(SEARCH, preset="smoke")  # digits: vision, contrasts a, b, e
    rng = np.random.default_rng(3)
    seeds = [100, 101, 102, 103]
    planted = {
        "a": 0.01 + 0.01 * rng.standard_normal(4),
        "b": 0.02 + 0.015 * rng.standard_normal(4),
        "e": -0.005 + 0.01 * rng.standard_normal(4),
    }
    autonorm = 0.9 + 0.01 * rng.standard_normal(4)
    arms = {
        "autonorm": autonorm,
        "random_selector": autonorm + planted["a"],
        "autonorm_s": autonorm + planted["b"],
    }
    arms["frozen_ln"] = arms["autonorm_s"] - planted["e"]
    arms["frozen_dyt"] = 0.88 + 0.01 * rng.standard_normal(4)
    rows = [
        {"arm": arm, "seed": s, "status": "completed", "test_accuracy": float(v[i]), "val_accuracy": 0.9}
        for arm, v in arms.items()
        for i, s in enumerate(seeds)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "confirm_trials.csv", index=False)
    result = pilot_power(spec, kind_for(spec), tmp_path, calibration=CAL, calibrate=False)
    assert result["family_size"] == 3
    for name, alternative in (("a", "greater"), ("b", "greater"), ("e", "two-sided")):
        assert result["per_seed"][name] == pytest.approx(list(planted[name]))
        assert result["seeds_needed"][name] == seeds_needed(
            list(planted[name]), alpha=0.05, family_size=3, power=0.8, alternative=alternative
        )
    assert result["statement"]


def test_pilot_power_search_without_confirmatory_phase_says_so(tmp_path: Path) -> None:
    spec = load_study(SEARCH, preset="smoke")
    with pytest.raises(ValueError, match="no confirmatory phase"):
        pilot_power(spec, kind_for(spec), tmp_path, calibration=CAL, calibrate=False)


def test_a_sequential_spec_plans_its_looks_and_expected_cost() -> None:
    spec = load_study(BATCHSIZE, preset="local")
    assert spec.sequential is not None
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=8)
    looks = spec.sequential.schedule()
    names = [p["name"] for p in plan["phases"] if p["optional"] and "-look" in p["name"]]
    assert names == [f"confirm-{b}-look{j}" for b in spec.budgets for j in range(2, len(looks) + 1)]
    # no extension, every rate refined, every look, the training-adequacy check
    assert plan["trials"] == (
        spec.tuning_trials + spec.refine_trials + spec.confirmatory_trials_max + spec.adequacy_trials
    )
    assert plan["trials_max"] == plan["trials"] + spec.extension_trials_max
    assert spec.total_trials <= plan["trials_expected"] <= plan["trials"] <= plan["trials_max"]
    first_look = [p for p in plan["phases"] if not p["optional"]]
    assert plan["wall_s_expected"] >= sum(p["wall_s"] for p in first_look)
    assert plan["wall_s_expected"] <= plan["wall_s"] <= plan["wall_s_max"]
    for scenario in ("no_effect", "min_effect"):
        assert looks[0] <= plan["expected"][scenario]["seeds"] <= looks[-1]
    fixed = plan_study(
        load_study(BATCHSIZE, preset="local", overrides=["sequential=null"]),
        KINDS["batchsize"],
        calibration=CAL,
        calibrate=False,
        cpus=8,
    )
    assert "trials_expected" not in fixed
    assert fixed["trials"] == fixed["trials_max"] - spec.extension_trials_max


def test_a_stacked_phase_is_priced_per_group_from_its_stacked_step() -> None:
    # without the adequacy check, whose stacks run 3 and 6 epochs: every stack below runs 3
    spec = load_study(BATCHSIZE, ["analysis.adequacy.check=false"], preset="smoke")
    off = load_study(BATCHSIZE, ["execution.stack=off", "analysis.adequacy.check=false"], preset="smoke")
    # one stacked update of 8 members costs what 2 separate updates do: a 4x cheaper update
    cal = {**CAL, "stacked": {"*": {"step_s": 0.02, "eval_s": 0.2, "members": 8}}}
    stacked = plan_study(spec, kind_for(spec), calibration=cal, calibrate=False, cpus=2)
    separate = plan_study(off, kind_for(off), calibration=cal, calibrate=False, cpus=2)
    assert stacked["trials"] == separate["trials"]  # members are trials: the same count
    by = {p["name"]: p for p in stacked["phases"]}
    # confirm-epochs: 3 arms x 3 batch sizes x 2 seeds -> 9 stacks of 2, dealt into 2 groups (2 slots);
    # tune: 3 arms x (4 rates x 2 seeds) -> 3 stacks of 8, 2 groups
    assert by["confirm-epochs"]["groups"] == 2 and by["tune-epochs"]["groups"] == 2
    assert {p["name"]: p["groups"] for p in separate["phases"]} == dict.fromkeys(by, None)
    assert stacked["wall_s"] < separate["wall_s"] and stacked["cpu_hours"] < separate["cpu_hours"]
    assert by["confirm-epochs"]["stacks"] == 9 and by["tune-epochs"]["stacks"] == 3
    # without a stacked timing (given none, measuring nothing) a group costs its members' times, with
    # one process start per group, not per member, and one report per round, not per stack epoch
    # (the smoke's stacks all run 3 epochs)
    plain = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=2)
    start, report = plain["calibration"]["trial_start_s"], plain["calibration"]["report_s"]
    counted = [p for p in plain["phases"] if p["groups"] and (not p["optional"] or p["refine"])]
    saved = sum(
        (p["trials"] - p["groups"]) * start + (p["stacks"] - p["groups"]) * 3 * report for p in counted
    )
    assert plain["cpu_hours"] == pytest.approx(separate["cpu_hours"] - saved / 3600)


def test_each_member_of_a_stacked_group_adds_its_result_to_every_round() -> None:
    # A group's round reports every member it trains (checkpoint share, the driver's MLflow work):
    # priced per member and epoch in a stacked phase, not at all for one trial per process. Without
    # the adequacy check (one seed per cell: its trials stack with no other; 3 and 6 epochs).
    spec = load_study(BATCHSIZE, ["analysis.adequacy.check=false"], preset="smoke")
    off = load_study(BATCHSIZE, ["execution.stack=off", "analysis.adequacy.check=false"], preset="smoke")
    stacked_cal = {**CAL, "stacked": {"*": {"step_s": 0.02, "eval_s": 0.2, "members": 8}}}

    def cpu_s(s: Any, per_member: float) -> float:
        cal = {**stacked_cal, "member_result_s": per_member}
        return 3600 * plan_study(s, kind_for(s), calibration=cal, calibrate=False, cpus=2)["cpu_hours"]

    base, one, two = (cpu_s(spec, x) for x in (0.0, 0.1, 0.2))
    assert one > base and two - base == pytest.approx(2 * (one - base))
    # the smoke's counted trials all run 3 epochs (both budgets): 0.1 s x 3 epochs per trial
    trials = plan_study(spec, kind_for(spec), calibration=stacked_cal, calibrate=False, cpus=2)["trials"]
    assert one - base == pytest.approx(0.1 * 3 * trials)
    assert cpu_s(off, 0.0) == cpu_s(off, 0.2)


# The adequate-size presets of issue #50: each validates and plans (given step times: nothing is
# timed here), keeps its own study name and the size at which its model learns the task.
ADEQUATE = {
    ("autonorm_search.yaml", "text_oanc"): "autonorm_claims_text_oanc",
    ("autonorm_search.yaml", "vision_full"): "autonorm_claims_vision_full",
    ("autonorm_search.yaml", "vision_long"): "autonorm_claims_vision_long",
    ("autonorm_search.yaml", "vision_xl"): "autonorm_claims_vision_xl",
    ("affine_divergence_table.yaml", "cnn_adequate"): "affine_divergence_table_cnn_adequate",
    ("affine_divergence_table.yaml", "mlp_adequate"): "affine_divergence_table_mlp_adequate",
}


@pytest.mark.parametrize(("file", "preset"), sorted(ADEQUATE))
def test_the_adequate_presets_validate_and_plan(file: str, preset: str) -> None:
    spec = load_study(SPECS / file, preset=preset)
    assert spec.name == ADEQUATE[(file, preset)]
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=2)
    assert plan["trials"] == KINDS[spec.kind].total_trials(spec) + sum(
        p["trials"] for p in plan["phases"] if p["look"] or p["refine"]
    )
    assert 0 < plan["cpu_hours"] <= plan["cpu_hours_max"] and plan["calibration"]["measured"] == []
    data, model = spec.data, spec.model
    if preset == "text_oanc":
        assert data.type == "oanc_pos" and model.depth is not None and model.depth >= 6
    elif preset in ("vision_full", "vision_long", "vision_xl"):
        assert data.type == "fashion_mnist" and (data.subset is None or data.subset >= 20000)
    elif preset == "mlp_adequate":  # twice the 10 epochs at which plain linear was still gaining
        assert data.type == "fashion_mnist" and data.subset is None and model.type == "mlp"
        assert spec.training.epochs >= 20 and len(spec.seeds) >= 16
    else:
        assert data.type == "fashion_mnist" and data.subset is None and model.type == "cnn"
    if spec.kind == "search":  # claim b's AutoNorm-S freezes at confirm.freeze, the searched one beside it
        assert spec.confirm is not None and spec.confirm.freeze is not None
        assert {"autonorm", "autonorm_s", "autonorm_s_searched"} <= set(spec.confirm.arms)
