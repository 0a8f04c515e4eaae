"""Tests of ``studies.kinds.batchsize.analysis`` on synthetic trial tables with known truth (docs/science.md §2)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.kinds.batchsize.analysis import (
    HYPOTHESIS,
    batchsize_trend,
    gate_entropy,
    normalize_table,
    ols_slope,
    permutation_p_value,
    verdict_for,
)
from studies.stats import holm

CHANCE_ACC = 0.1
CHANCE_LOSS = math.log(10)
CONTROLS = ("linear", "linear_batchnorm")
ARGS: dict[str, Any] = {
    "control": "linear",
    "controls": CONTROLS,
    "metric": "test_accuracy",
    "higher_is_better": True,
    "chance_metric": CHANCE_ACC,
    "chance_loss": CHANCE_LOSS,
}


def make_table(
    *,
    slopes: dict[str, float] | None = None,
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128),
    seeds: int = 8,
    noise: float = 0.004,
    rng_seed: int = 0,
    train_loss: float = 0.3,
) -> pd.DataFrame:
    """Accuracy = 0.85 - 0.01 k + slope * log2 B + seed effect (shared by all arms: common random
    numbers) + noise; a healthy train loss everywhere."""
    slopes = slopes if slopes is not None else {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.02}
    rng = np.random.default_rng(rng_seed)
    seed_effect = rng.normal(0, 0.01, size=seeds)
    rows = []
    for k, (arm, slope) in enumerate(slopes.items()):
        for b in batch_sizes:
            for s in range(seeds):
                acc = 0.85 - 0.01 * k + slope * math.log2(b) + seed_effect[s] + rng.normal(0, noise)
                rows.append(
                    {
                        "arm": arm,
                        "batch_size": b,
                        "seed": s,
                        "status": "completed",
                        "test_accuracy": acc,
                        "train_loss": train_loss + rng.normal(0, 0.01),
                    }
                )
    return pd.DataFrame(rows)


def _at(df: pd.DataFrame, arm: str, b: int, s: int | None = None) -> pd.Series:
    mask = (df["arm"] == arm) & (df["batch_size"] == b)
    return mask if s is None else mask & (df["seed"] == s)


@pytest.fixture(scope="module")
def planted() -> dict[str, Any]:
    return batchsize_trend(make_table(), n_perm=1999, **ARGS)


def test_tiny_design_is_underpowered_even_with_a_strong_effect() -> None:
    df = make_table(batch_sizes=(8, 64, 512), seeds=2, slopes={"linear": 0.0, "corrected": -0.05})
    res = batchsize_trend(
        df,
        control="linear",
        controls=["linear"],
        **{k: ARGS[k] for k in ("metric", "chance_metric", "chance_loss")},
    )
    arm = res["arms"]["corrected"]
    assert res["verdict"]["corrected"] == "inconclusive"
    assert "underpowered" in arm["reasons"]
    assert arm["slope_ci"][1] < 0  # the effect itself is visible, the design just cannot decide
    assert arm["permutation"] == "exact" and arm["n_permutations"] == 36  # 3! per seed, 2 seeds
    assert res["exploratory"] is True
    assert res["study_verdict"] == "inconclusive" and "underpowered" in res["study_reasons"]


def test_planted_effect_is_supported(planted: dict[str, Any]) -> None:
    arm = planted["arms"]["corrected"]
    assert planted["verdict"] == {"corrected": "supported"}
    assert arm["reasons"] == []
    assert arm["p_value_holm"] < 0.05
    assert arm["slope_ci"][0] <= -0.02 <= arm["slope_ci"][1]
    assert arm["interaction_ci"][1] < 0
    assert arm["permutation"] == "monte-carlo"  # 120^8 within-seed permutations
    assert planted["controls"] == {"linear": "stable", "linear_batchnorm": "stable"}
    assert planted["study_verdict"] == "supported" and planted["study_reasons"] == []
    assert planted["exploratory"] is False
    assert planted["arms"]["linear"]["interaction"] is None
    assert planted["arms"]["linear"]["interaction_ci"] is None
    assert planted["arms"]["linear_batchnorm"]["p_value_holm"] is None  # controls: not in the family


def test_holm_is_over_fix_arms_only() -> None:
    df = make_table(slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.02, "prenorm_l2": -0.003})
    res = batchsize_trend(df, n_perm=999, **ARGS)
    arms = res["arms"]
    expected = holm({a: arms[a]["p_value"] for a in ("corrected", "prenorm_l2")})
    for a, p in expected.items():
        assert arms[a]["p_value_holm"] == pytest.approx(p)
    assert set(res["verdict"]) == {"corrected", "prenorm_l2"}


def test_arm_whose_large_batches_did_not_learn_is_optimisation_limited() -> None:
    df = make_table(slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.06})
    big = (df["arm"] == "corrected") & (df["batch_size"] >= 64)
    df.loc[big, "train_loss"] = CHANCE_LOSS * 0.98  # at chance: it never trained there
    res = batchsize_trend(df, n_perm=499, **ARGS)
    arm = res["arms"]["corrected"]
    assert res["verdict"]["corrected"] == "inconclusive"
    assert "optimisation-limited" in arm["reasons"]
    assert arm["median_train_loss_by_cell"]["128"] > 0.9 * CHANCE_LOSS
    assert arm["median_train_loss_by_cell"]["8"] < 0.5
    assert res["study_verdict"] == "inconclusive"


def test_control_that_did_not_learn_makes_the_study_inconclusive() -> None:
    df = make_table()
    df.loc[df["arm"] == "linear_batchnorm", "train_loss"] = CHANCE_LOSS
    res = batchsize_trend(df, n_perm=499, **ARGS)
    assert res["verdict"]["corrected"] == "supported"
    assert res["controls"]["linear_batchnorm"] == "unclear"
    assert "optimisation-limited" in res["arms"]["linear_batchnorm"]["reasons"]
    assert res["study_verdict"] == "inconclusive"
    assert "control unclear" in res["study_reasons"]


def test_fix_arms_inherit_the_gates_of_their_control() -> None:
    df = make_table()
    df.loc[_at(df, "linear", 128), "train_loss"] = CHANCE_LOSS
    res = batchsize_trend(df, n_perm=499, **ARGS)
    assert res["controls"]["linear"] == "unclear"
    assert "optimisation-limited" in res["arms"]["linear"]["reasons"]
    assert res["verdict"]["corrected"] == "inconclusive"
    assert "control optimisation-limited" in res["arms"]["corrected"]["reasons"]
    assert res["study_verdict"] == "inconclusive"


def test_declining_controls_are_labelled_and_refute_the_claim() -> None:
    df = make_table(slopes={"linear": -0.02, "linear_batchnorm": -0.02, "corrected": -0.05})
    res = batchsize_trend(df, n_perm=499, **ARGS)
    assert res["controls"] == {"linear": "declines", "linear_batchnorm": "declines"}
    assert res["verdict"]["corrected"] == "supported"  # declines more than the control
    # The claim's second half (the controls do not decline) fails: the claim fails.
    assert res["claim_by_budget"] == {"": "fails"}
    assert res["study_verdict"] == "refuted"
    assert res["study_reasons"] == ["control linear declines", "control linear_batchnorm declines"]


def test_control_label_thresholds_use_delta() -> None:
    # A control declining by 0.002 per doubling is within delta = 0.005: stable; with delta = 0 it
    # declines.
    df = make_table(slopes={"linear": -0.002, "linear_batchnorm": 0.0, "corrected": -0.03}, noise=0.0005)
    assert batchsize_trend(df, n_perm=199, **ARGS)["controls"]["linear"] == "stable"
    assert batchsize_trend(df, n_perm=199, delta=0.0, **ARGS)["controls"]["linear"] == "declines"


def test_opposite_trend_is_refuted() -> None:
    df = make_table(slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.02})
    res = batchsize_trend(df, n_perm=499, **ARGS)
    arm = res["arms"]["corrected"]
    assert res["verdict"]["corrected"] == "refuted"
    assert arm["reasons"] and arm["p_value"] > 0.9
    assert res["study_verdict"] == "refuted"


def test_flat_fix_arm_is_inconclusive_with_reasons() -> None:
    df = make_table(slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.0}, rng_seed=3)
    res = batchsize_trend(df, n_perm=499, **ARGS)
    if res["verdict"]["corrected"] == "inconclusive":
        assert res["arms"]["corrected"]["reasons"]
    assert res["verdict"]["corrected"] != "supported"
    assert res["study_verdict"] != "supported"


def test_failed_trials_are_counted_scored_at_chance_and_gate_the_arm() -> None:
    df = make_table()
    df.loc[_at(df, "corrected", 128, 0), "status"] = "diverged"
    df.loc[_at(df, "corrected", 128, 1), ["status", "test_accuracy"]] = ["completed", float("nan")]
    res = batchsize_trend(df, n_perm=499, **ARGS)
    arm = res["arms"]["corrected"]
    assert arm["n_failed"] == 2 and arm["n"] == 40
    assert arm["failures_by_cell"] == {"8": 0, "16": 0, "32": 0, "64": 0, "128": 2}
    # 2 of 8 = 25 % > 20 %.
    assert res["verdict"]["corrected"] == "inconclusive" and "failures" in arm["reasons"]
    # Scored at chance in the primary analysis, dropped in the sensitivity check.
    sens = arm["sensitivity"]
    assert sens["n"] == 38 and sens["slope"] != pytest.approx(arm["slope"])
    assert "failures" not in sens["reasons"]
    assert res["sensitivity"]["verdict"]["corrected"] == "supported"
    # One failure of 8 (12.5 %) is counted but does not gate.
    df.loc[_at(df, "corrected", 128, 1), "test_accuracy"] = 0.8
    res1 = batchsize_trend(df, n_perm=499, **ARGS)
    assert res1["arms"]["corrected"]["n_failed"] == 1
    assert "failures" not in res1["arms"]["corrected"]["reasons"]


def test_failed_trial_is_scored_at_chance_in_the_primary_analysis() -> None:
    df = make_table(seeds=5)
    df.loc[_at(df, "corrected", 128, 4), "status"] = "error"
    res = batchsize_trend(df, n_perm=199, **ARGS)
    x = np.log2([8, 16, 32, 64, 128])
    slopes = []
    for s in range(5):
        y = df[(df["arm"] == "corrected") & (df["seed"] == s)].sort_values("batch_size")["test_accuracy"]
        y = y.to_numpy().copy()
        if s == 4:
            y[-1] = CHANCE_ACC
        slopes.append(stats.linregress(x, y).slope)
    assert res["arms"]["corrected"]["slope"] == pytest.approx(np.mean(slopes))


def test_without_a_chance_level_failures_are_missing_cells_and_the_gate_is_off() -> None:
    df = make_table(train_loss=5.0)
    df.loc[_at(df, "corrected", 128, 0), "status"] = "error"
    res = batchsize_trend(df, n_perm=199, **(ARGS | {"chance_metric": math.nan, "chance_loss": math.nan}))
    arm = res["arms"]["corrected"]
    assert arm["n_failed"] == 1 and arm["n_complete_seeds"] == 7
    assert "optimisation-limited" not in arm["reasons"]
    assert res["verdict"]["corrected"] == "supported"


def test_lr_at_range_edge_makes_the_arm_inconclusive() -> None:
    df = make_table().assign(lr_at_edge=False)
    df.loc[_at(df, "corrected", 8), "lr_at_edge"] = True
    res = batchsize_trend(df, n_perm=199, **ARGS)
    assert res["verdict"]["corrected"] == "inconclusive"
    assert res["arms"]["corrected"]["reasons"] == ["lr-at-range-edge"]


def test_no_effect_world_is_rarely_supported() -> None:
    supported = 0
    for rep in range(200):
        df = make_table(
            slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.0},
            seeds=5,
            batch_sizes=(8, 32, 128, 512),
            rng_seed=1000 + rep,
        )
        res = batchsize_trend(df, n_perm=199, n_boot=50, seed=rep, **ARGS)
        supported += res["verdict"]["corrected"] == "supported"
    assert supported <= 10  # 5 % of 200


def test_interaction_equals_pooled_ols_of_paired_differences_and_its_t_interval() -> None:
    df = make_table(seeds=6)
    res = batchsize_trend(df, n_perm=199, **ARGS)
    cell = df.set_index(["arm", "batch_size", "seed"])["test_accuracy"]
    diff = (cell["corrected"] - cell["linear"]).reset_index()
    x = np.log2(diff["batch_size"].to_numpy(float))
    pooled = stats.linregress(x, diff["test_accuracy"].to_numpy()).slope
    arm = res["arms"]["corrected"]
    assert arm["interaction"] == pytest.approx(pooled, rel=1e-10)
    per_seed = [
        stats.linregress(np.log2(g["batch_size"].to_numpy(float)), g["test_accuracy"].to_numpy()).slope
        for _, g in diff.groupby("seed")
    ]
    lo, hi = stats.t.interval(0.95, len(per_seed) - 1, loc=np.mean(per_seed), scale=stats.sem(per_seed))
    assert arm["interaction_ci"] == [pytest.approx(lo), pytest.approx(hi)]
    assert arm["ci_method"] == "t"
    t_p = stats.ttest_1samp(per_seed, 0.0, alternative="less").pvalue
    assert arm["p_value_t"] == pytest.approx(t_p)
    assert arm["p_value"] == max(arm["p_value_t"], arm["p_value_permutation"])


def test_ten_seeds_use_the_seed_bootstrap() -> None:
    res = batchsize_trend(make_table(seeds=10), n_perm=199, n_boot=500, **ARGS)
    arm = res["arms"]["corrected"]
    assert arm["ci_method"] == "bootstrap"
    assert arm["slope_ci"][0] < arm["slope"] < arm["slope_ci"][1]


def test_exact_permutation_p_matches_brute_force() -> None:
    rng = np.random.default_rng(4)
    xs = [np.log2([8.0, 16.0, 32.0]), np.log2([8.0, 16.0, 32.0, 64.0]), np.log2([8.0, 32.0])]
    ds = [rng.normal(size=x.size) - 0.3 * x for x in xs]

    def stat(perms: tuple[tuple[int, ...], ...]) -> float:
        return float(np.mean([ols_slope(x[list(p)], d) for x, d, p in zip(xs, ds, perms)]))

    observed = stat(tuple(tuple(range(x.size)) for x in xs))
    all_stats = [
        stat(combo) for combo in itertools.product(*(itertools.permutations(range(x.size)) for x in xs))
    ]
    brute = np.mean(np.asarray(all_stats) <= observed + 1e-12)
    p, method, count = permutation_p_value(xs, ds, negative=True, n_perm=99, rng=np.random.default_rng(0))
    assert method == "exact" and count == 6 * 24 * 2
    assert p == pytest.approx(brute)
    p_up, _, _ = permutation_p_value(xs, ds, negative=False, n_perm=99, rng=np.random.default_rng(0))
    assert p_up == pytest.approx(np.mean(np.asarray(all_stats) >= observed - 1e-12))


def test_monte_carlo_permutation_p_has_the_plus_one_correction() -> None:
    xs = [np.log2([8.0, 16.0, 32.0, 64.0, 128.0])] * 8
    ds = [-x for x in xs]  # the most extreme arrangement: no permutation beats it
    p, method, count = permutation_p_value(xs, ds, negative=True, n_perm=999, rng=np.random.default_rng(1))
    assert method == "monte-carlo" and count == 999
    assert p == pytest.approx(1 / 1000)


def test_budgets_are_analysed_separately_and_must_agree() -> None:
    epochs = make_table(rng_seed=1).assign(budget="epochs")
    agree = make_table(rng_seed=2).assign(budget="updates")
    res = batchsize_trend(pd.concat([epochs, agree]), n_perm=499, **ARGS)
    assert set(res["budgets"]) == {"epochs", "updates"}
    assert res["budgets"]["epochs"]["verdict"]["corrected"] == "supported"
    assert res["verdict"]["corrected"] == "supported" and res["study_verdict"] == "supported"
    assert res["arms"]["corrected"]["by_budget"]["updates"]["verdict"] == "supported"

    assert res["claim_by_budget"] == {"epochs": "holds", "updates": "holds"}

    up = make_table(slopes={"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.02})
    res3 = batchsize_trend(
        pd.concat([up.assign(budget="epochs"), up.assign(budget="updates")]), n_perm=199, **ARGS
    )
    assert res3["verdict"]["corrected"] == "refuted" and res3["study_verdict"] == "refuted"
    assert res3["claim_by_budget"] == {"epochs": "fails", "updates": "fails"}


HOLDS = {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.02}  # fix arm declines, controls flat
CONTROL_DECLINES = {"linear": -0.02, "linear_batchnorm": 0.0, "corrected": -0.05}  # a declining control
FIX_RISES = {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.02}  # every fix arm refuted
FLAT = {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": 0.0}


def _two_budgets(epochs: dict[str, float], updates: dict[str, float], **kw: Any) -> dict[str, Any]:
    tables = [
        make_table(slopes=epochs, rng_seed=1, **kw).assign(budget="epochs"),
        make_table(slopes=updates, rng_seed=2, **kw).assign(budget="updates"),
    ]
    return batchsize_trend(pd.concat(tables), n_perm=499, **ARGS)


def test_a_claim_that_holds_under_epochs_and_fails_under_updates_is_budget_dependent() -> None:
    # Under a fixed update budget a control declines: the claim fails there, holds under fixed epochs.
    res = _two_budgets(HOLDS, CONTROL_DECLINES)
    assert res["budgets"]["updates"]["controls"]["linear"] == "declines"
    assert res["claim_by_budget"] == {"epochs": "holds", "updates": "fails"}
    assert res["study_verdict"] == "budget-dependent"
    assert res["study_reasons"] == [
        "the claim holds under a fixed epoch budget only and fails under a fixed update budget: "
        "the decline follows the number of updates, not the batch size"
    ]
    # The other way round, with the fix arm refuted under fixed epochs.
    other = _two_budgets(FIX_RISES, HOLDS)
    assert other["claim_by_budget"] == {"epochs": "fails", "updates": "holds"}
    assert other["study_verdict"] == "budget-dependent"
    assert other["study_reasons"] == [
        "the claim holds under a fixed update budget only and fails under a fixed epoch budget"
    ]


def test_a_claim_that_fails_under_every_budget_is_refuted_even_by_a_control_alone() -> None:
    res = _two_budgets(CONTROL_DECLINES, FIX_RISES)
    assert res["budgets"]["epochs"]["verdict"]["corrected"] == "supported"  # the fix arm itself declines
    assert res["claim_by_budget"] == {"epochs": "fails", "updates": "fails"}
    assert res["study_verdict"] == "refuted" and "control linear declines" in res["study_reasons"]


def test_a_claim_that_holds_under_one_budget_and_is_undecided_under_the_other_is_inconclusive() -> None:
    # Too few seeds under one budget to decide anything there (a power gate), the claim holds under the other.
    undecided = make_table(slopes=FLAT, seeds=3, rng_seed=2).assign(budget="updates")
    res = batchsize_trend(
        pd.concat([make_table(rng_seed=1).assign(budget="epochs"), undecided]), n_perm=499, **ARGS
    )
    assert res["claim_by_budget"] == {"epochs": "holds", "updates": "undecided"}
    assert res["study_verdict"] == "inconclusive"
    assert res["study_reasons"][0] == "epochs: holds" and "underpowered" in res["study_reasons"]


def test_single_budget_column_is_one_analysis() -> None:
    res = batchsize_trend(make_table().assign(budget="epochs"), n_perm=199, **ARGS)
    assert res["budgets"] is None and res["budget"] == "epochs"
    assert res["verdict"]["corrected"] == "supported"


def test_lower_is_better_mirrors_the_signs() -> None:
    df = make_table()
    up = batchsize_trend(df, n_perm=499, seed=5, **ARGS)
    loss = df.assign(test_accuracy=-df["test_accuracy"])
    down = batchsize_trend(
        loss, n_perm=499, seed=5, **(ARGS | {"higher_is_better": False, "chance_metric": -CHANCE_ACC})
    )
    assert down["direction"] == "positive" and up["direction"] == "negative"
    assert down["verdict"] == up["verdict"] and down["controls"] == up["controls"]
    for arm in up["arms"]:
        assert down["arms"][arm]["slope"] == pytest.approx(-up["arms"][arm]["slope"])
        assert down["arms"][arm]["p_value"] == up["arms"][arm]["p_value"]


def test_deterministic_strict_json_and_independent_of_other_arms(planted: dict[str, Any]) -> None:
    df = make_table()
    again = batchsize_trend(df, n_perm=1999, **ARGS)
    assert json.dumps(again, sort_keys=True, allow_nan=False) == json.dumps(planted, sort_keys=True)
    extra = make_table(slopes={"prenorm_l2": -0.01})
    both = batchsize_trend(pd.concat([df, extra]), n_perm=1999, **ARGS)
    assert both["arms"]["corrected"]["p_value"] == planted["arms"]["corrected"]["p_value"]
    assert both["arms"]["corrected"]["interaction_ci"] == planted["arms"]["corrected"]["interaction_ci"]
    keys = {"verdict", "controls", "study_verdict", "study_reasons", "exploratory", "metric", "control"}
    keys |= {"alpha", "delta", "arms", "sensitivity"}
    assert keys <= set(planted) and planted["hypothesis"] == HYPOTHESIS
    per_arm = {"reasons", "slope", "slope_ci", "interaction", "interaction_ci", "p_value", "p_value_holm"}
    per_arm |= {"n", "n_failed", "n_seeds", "spearman_rho", "spearman_rho_ci", "failures_by_cell"}
    per_arm |= {"median_train_loss_by_cell", "sensitivity"}
    for arm in planted["arms"].values():
        assert per_arm <= set(arm)


def test_validation_errors() -> None:
    df = make_table()
    with pytest.raises(ValueError, match="control arm"):
        batchsize_trend(df, **(ARGS | {"control": "plain"}))
    with pytest.raises(ValueError, match="missing columns"):
        batchsize_trend(df.drop(columns="seed"), **ARGS)
    with pytest.raises(ValueError, match="positive"):
        normalize_table(df.assign(batch_size=0), "test_accuracy")
    with pytest.raises(ValueError, match="n_boot"):
        batchsize_trend(df, n_boot=0, **ARGS)


@pytest.mark.parametrize(
    ("slope_ci", "interaction_ci", "higher_is_better", "p_holm", "expected"),
    [
        ((-0.3, -0.1), (-0.2, -0.05), True, 0.01, "supported"),
        ((-0.3, -0.1), (-0.2, -0.05), True, 0.2, "inconclusive"),  # not significant
        ((-0.3, -0.1), (-0.2, 0.05), True, 0.01, "inconclusive"),  # interaction CI touches 0
        ((0.0, 0.2), (-0.2, -0.05), True, 0.5, "refuted"),  # "at or above 0"
        ((-0.3, -0.1), (0.0, 0.1), True, 0.9, "refuted"),  # the interaction alone refutes
        ((0.1, 0.3), (0.05, 0.2), False, 0.01, "supported"),  # a loss: signs flip
        ((-0.2, 0.0), (0.05, 0.2), False, 0.01, "refuted"),
    ],
)
def test_verdict_rule(slope_ci, interaction_ci, higher_is_better, p_holm, expected) -> None:
    got = verdict_for(slope_ci, interaction_ci, higher_is_better=higher_is_better, p_holm=p_holm)
    assert got == expected


def test_gate_entropy_matches_scipy() -> None:
    p = np.array([[0.5, 0.5], [1.0, 0.0], [0.9, 0.1]])
    assert gate_entropy(p) == pytest.approx(stats.entropy(p, axis=1))
    with pytest.raises(ValueError):
        gate_entropy([-0.1, 1.1])


def test_sequential_design_tests_each_fix_arm_at_every_look() -> None:
    # corrected declines with B; prenorm_l2 does not (its interaction is 0): with min_effect the
    # first is rejected, the second futile -> refuted for "effect below min_effect"
    slopes = {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.02, "prenorm_l2": 0.0}
    df = make_table(slopes=slopes, seeds=12, rng_seed=3)
    order = [str(s) for s in (5, 3, 0, 1, 2, 4, 6, 7, 8, 9, 10, 11)]  # the spec's order, not sorted
    design = {"looks": [6, 8, 10, 12], "seed_order": order, "min_effect": 0.01, "prior_scale": 1.0}
    res = batchsize_trend(df, n_perm=999, sequential=design, **ARGS)
    looks = res["looks"]
    assert [look["n_seeds"] for look in looks] == [6, 8, 10, 12]  # every look the data reach
    fixed = batchsize_trend(df, n_perm=999, **ARGS)
    final = looks[-1]["hypotheses"]
    corrected, prenorm = res["arms"]["corrected"], res["arms"]["prenorm_l2"]
    # the sequential p and confidence sequence replace the fixed-design ones (kept aside)
    assert corrected["p_value"] == final["corrected"]["p_value"] and corrected["sequential"] == "reject"
    assert corrected["fixed_design"]["p_value"] == fixed["arms"]["corrected"]["p_value"]
    assert corrected["interaction_ci"] == pytest.approx(final["corrected"]["ci"])
    # a confidence sequence is wider than the fixed-n t-interval on the same seeds
    lo, hi = corrected["interaction_ci"]
    flo, fhi = fixed["arms"]["corrected"]["interaction_ci"]
    assert hi - lo > fhi - flo
    assert res["verdict"]["corrected"] == "supported"
    assert prenorm["sequential"] == "futile" and res["verdict"]["prenorm_l2"] == "refuted"
    assert prenorm["reasons"] == ["effect below min_effect"]
    # the looks use the seeds in the given order: the first look is seeds 5, 3, 0, 1, 2, 4
    per_seed = dict(zip(res["seeds"], corrected["interaction_by_seed"], strict=True))
    first = [per_seed[s] for s in order[:6]]
    assert final["corrected"]["n"] == 12 and looks[0]["hypotheses"]["corrected"]["estimate"] == pytest.approx(
        float(np.mean(first))
    )
    holm_first = holm({k: h["p_value"] for k, h in looks[0]["hypotheses"].items()})
    assert {k: h["p_value_holm"] for k, h in looks[0]["hypotheses"].items()} == pytest.approx(holm_first)
    json.dumps(res, allow_nan=False)  # strict JSON
