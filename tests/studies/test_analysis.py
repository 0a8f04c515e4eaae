"""Tests of ``studies.analysis`` against numpy/scipy on data with known answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.analysis import (
    batchsize_trend,
    gate_entropy,
    holm_adjust,
    normalize_table,
    ols_slope,
    verdict_for,
)

BATCH_SIZES = (8, 16, 32, 64, 128)
SEEDS = tuple(range(6))
TRUE_SLOPE = -0.02  # accuracy lost per doubling of B by the planted arm


def planted_table(
    *,
    slopes: dict[str, float] | None = None,
    seeds: tuple[int, ...] = SEEDS,
    noise: float = 0.004,
    rng_seed: int = 0,
) -> pd.DataFrame:
    """Accuracy = 0.9 + slope * log2 B + seed effect (shared by all arms, as with common random
    numbers) + arm level + noise."""
    slopes = (
        slopes if slopes is not None else {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": TRUE_SLOPE}
    )
    rng = np.random.default_rng(rng_seed)
    seed_effect = {s: rng.normal(0, 0.01) for s in seeds}
    rows = []
    for k, (arm, slope) in enumerate(slopes.items()):
        for b in BATCH_SIZES:
            for s in seeds:
                value = 0.9 - 0.01 * k + slope * math.log2(b) + seed_effect[s] + rng.normal(0, noise)
                rows.append(
                    {"arm": arm, "batch_size": b, "seed": s, "test_accuracy": value, "status": "completed"}
                )
    return pd.DataFrame(rows)


def damaged_table() -> pd.DataFrame:
    """The planted table with two failed trials, one NaN metric and one missing cell."""
    df = planted_table()

    def at(arm: str, b: int, s: int) -> pd.Index:
        return df.index[(df["arm"] == arm) & (df["batch_size"] == b) & (df["seed"] == s)]

    df.loc[at("corrected", 128, 0), "status"] = "failed"
    df.loc[at("linear", 16, 3), "status"] = "error"
    df.loc[at("corrected", 64, 2), "test_accuracy"] = float("nan")
    return df.drop(index=at("corrected", 8, 5)).reset_index(drop=True)


@pytest.fixture(scope="module")
def damaged_result() -> dict:
    return batchsize_trend(damaged_table(), n_boot=1000, n_perm=9999, seed=3)


def _completed(df: pd.DataFrame, arm: str) -> pd.DataFrame:
    return df[(df["arm"] == arm) & (df["status"] == "completed") & df["test_accuracy"].notna()]


def test_counts_completed_and_failed(damaged_result: dict) -> None:
    arms = damaged_result["arms"]
    # corrected: 30 cells, one missing row, one failed status, one NaN metric.
    assert (arms["corrected"]["n"], arms["corrected"]["n_failed"]) == (27, 2)
    assert (arms["linear"]["n"], arms["linear"]["n_failed"]) == (29, 1)
    assert (arms["linear_batchnorm"]["n"], arms["linear_batchnorm"]["n_failed"]) == (30, 0)


def test_slope_and_spearman_match_scipy(damaged_result: dict) -> None:
    df = damaged_table()
    for arm, res in damaged_result["arms"].items():
        good = _completed(df, arm)
        lr = stats.linregress(np.log2(good["batch_size"]), good["test_accuracy"])
        rho = stats.spearmanr(good["batch_size"], good["test_accuracy"]).statistic
        assert res["slope"] == pytest.approx(lr.slope, rel=1e-9, abs=1e-12)
        assert res["spearman_rho"] == pytest.approx(rho, rel=1e-9)
    assert damaged_result["arms"]["corrected"]["slope"] == pytest.approx(TRUE_SLOPE, abs=0.002)


def test_interaction_is_slope_of_paired_differences(damaged_result: dict) -> None:
    df = damaged_table()
    ctrl = _completed(df, "linear").set_index(["batch_size", "seed"])["test_accuracy"]
    for arm in ("corrected", "linear_batchnorm"):
        mine = _completed(df, arm).set_index(["batch_size", "seed"])["test_accuracy"]
        both = mine.index.intersection(ctrl.index)
        diff = mine.loc[both] - ctrl.loc[both]
        x = np.log2(diff.index.get_level_values("batch_size").to_numpy(dtype=float))
        lr = stats.linregress(x, diff.to_numpy())
        res = damaged_result["arms"][arm]
        assert res["n_pairs"] == len(both)
        assert res["interaction"] == pytest.approx(lr.slope, rel=1e-9, abs=1e-12)
    # corrected loses 3 cells itself, linear loses (16, 3): 30 - 4 pairs.
    assert damaged_result["arms"]["corrected"]["n_pairs"] == 26


def test_control_has_no_interaction(damaged_result: dict) -> None:
    ctrl = damaged_result["arms"]["linear"]
    for key in ("interaction", "interaction_ci", "p_value", "p_value_holm", "n_pairs"):
        assert ctrl[key] is None


def test_verdicts_on_planted_trend(damaged_result: dict) -> None:
    assert damaged_result["verdict"]["corrected"] == "supported"
    assert damaged_result["verdict"]["linear_batchnorm"] != "supported"
    lo, hi = damaged_result["arms"]["corrected"]["slope_ci"]
    assert lo <= TRUE_SLOPE <= hi
    assert damaged_result["arms"]["corrected"]["interaction_ci"][1] < 0


def test_permutation_p_value_small_for_planted_trend_large_for_none(damaged_result: dict) -> None:
    p = damaged_result["arms"]["corrected"]["p_value"]
    assert p == pytest.approx(1 / 10000)  # no permutation reaches a 26-point trend this strong
    assert damaged_result["arms"]["linear_batchnorm"]["p_value"] > 0.05


def test_permutation_p_values_are_roughly_uniform_under_the_null() -> None:
    ps = []
    for rep in range(120):
        df = planted_table(slopes={"linear": 0.0, "corrected": 0.0}, seeds=(0, 1, 2, 3), rng_seed=100 + rep)
        res = batchsize_trend(df, n_boot=20, n_perm=199, seed=rep)
        ps.append(res["arms"]["corrected"]["p_value"])
    ps_arr = np.asarray(ps)
    assert 0.4 < ps_arr.mean() < 0.6
    # Rejections at 5 %: expected 6 of 120; binomial 99.9 % upper bound is about 15.
    assert np.count_nonzero(ps_arr <= 0.05) <= 15
    assert stats.kstest(ps_arr, "uniform").pvalue > 0.001


def test_p_value_is_one_sided_in_the_hypothesis_direction() -> None:
    # An arm that gets *better* with B has a large p for "gets worse".
    df = planted_table(slopes={"linear": 0.0, "corrected": 0.02})
    res = batchsize_trend(df, n_boot=200, n_perm=999)
    assert res["arms"]["corrected"]["p_value"] > 0.95
    assert res["verdict"]["corrected"] == "refuted"


def test_bootstrap_ci_covers_the_true_slope() -> None:
    hits = 0
    reps = 60
    for rep in range(reps):
        df = planted_table(
            slopes={"linear": 0.0, "corrected": TRUE_SLOPE}, seeds=tuple(range(8)), rng_seed=rep
        )
        lo, hi = batchsize_trend(df, n_boot=400, n_perm=1, seed=rep)["arms"]["corrected"]["slope_ci"]
        hits += lo <= TRUE_SLOPE <= hi
    # Nominal 95 %; a percentile bootstrap over 8 clusters under-covers somewhat.
    assert hits >= 0.8 * reps


def test_cluster_bootstrap_matches_a_naive_loop() -> None:
    df = planted_table()
    res = batchsize_trend(df, n_boot=4000, n_perm=1, seed=1)["arms"]["corrected"]
    good = df[df["arm"] == "corrected"]
    by_seed = {
        s: (np.log2(g["batch_size"].to_numpy(float)), g["test_accuracy"].to_numpy())
        for s, g in good.groupby("seed")
    }
    rng = np.random.default_rng(123)
    slopes = []
    for _ in range(4000):
        pick = rng.choice(SEEDS, size=len(SEEDS), replace=True)
        x = np.concatenate([by_seed[s][0] for s in pick])
        y = np.concatenate([by_seed[s][1] for s in pick])
        slopes.append(stats.linregress(x, y).slope)
    naive = np.quantile(slopes, [0.025, 0.975])
    width = naive[1] - naive[0]
    assert res["slope_ci"][0] == pytest.approx(naive[0], abs=0.15 * width)
    assert res["slope_ci"][1] == pytest.approx(naive[1], abs=0.15 * width)


def test_holm_matches_hand_computation() -> None:
    # Ascending: a .01 -> 3*.01 = .03; c .03 -> 2*.03 = .06; b .04 -> 1*.04 = .04, raised to .06.
    out = holm_adjust({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert out == {"a": pytest.approx(0.03), "b": pytest.approx(0.06), "c": pytest.approx(0.06), "d": None}
    assert holm_adjust({"a": 0.6, "b": 0.9}) == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}


def test_holm_is_applied_across_arms(damaged_result: dict) -> None:
    arms = damaged_result["arms"]
    expected = holm_adjust({a: arms[a]["p_value"] for a in ("corrected", "linear_batchnorm")})
    for arm, p in expected.items():
        assert arms[arm]["p_value_holm"] == pytest.approx(p)
        assert arms[arm]["p_value_holm"] >= arms[arm]["p_value"]


@pytest.mark.parametrize(
    ("slope_ci", "interaction_ci", "higher_is_better", "expected"),
    [
        ((-0.3, -0.1), (-0.2, -0.05), True, "supported"),
        ((-0.3, -0.1), (-0.2, 0.05), True, "inconclusive"),  # interaction CI touches 0
        ((-0.3, 0.0), (-0.2, -0.05), True, "inconclusive"),  # "below 0" is strict
        ((0.0, 0.2), (-0.2, -0.05), True, "refuted"),  # "at or above 0"
        ((0.1, 0.2), None, True, "refuted"),
        ((-0.3, -0.1), None, True, "inconclusive"),  # control: no interaction
        (None, None, True, "inconclusive"),
        ((-0.1, 0.1), (-0.1, 0.1), True, "inconclusive"),
        # A loss: worse as B grows is a positive slope.
        ((0.1, 0.3), (0.05, 0.2), False, "supported"),
        ((-0.2, 0.0), (0.05, 0.2), False, "refuted"),
        ((-0.3, -0.1), (-0.2, -0.05), False, "refuted"),
        ((-0.1, 0.1), (0.05, 0.2), False, "inconclusive"),
    ],
)
def test_verdict_rule(slope_ci, interaction_ci, higher_is_better, expected) -> None:
    assert verdict_for(slope_ci, interaction_ci, higher_is_better=higher_is_better) == expected


def test_lower_is_better_mirrors_the_signs() -> None:
    df = damaged_table()
    up = batchsize_trend(df, n_boot=300, n_perm=999, seed=5)
    loss = df.assign(test_accuracy=-df["test_accuracy"])
    down = batchsize_trend(loss, higher_is_better=False, n_boot=300, n_perm=999, seed=5)
    assert down["direction"] == "positive" and up["direction"] == "negative"
    assert down["verdict"] == up["verdict"]
    for arm in up["arms"]:
        assert down["arms"][arm]["slope"] == pytest.approx(-up["arms"][arm]["slope"])
        assert down["arms"][arm]["p_value"] == up["arms"][arm]["p_value"]


def test_deterministic_and_independent_of_other_arms() -> None:
    df = damaged_table()
    a = batchsize_trend(df, n_boot=200, n_perm=499, seed=7)
    b = batchsize_trend(df, n_boot=200, n_perm=499, seed=7)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    fewer = batchsize_trend(df[df["arm"] != "linear_batchnorm"], n_boot=200, n_perm=499, seed=7)
    assert fewer["arms"]["corrected"]["slope_ci"] == a["arms"]["corrected"]["slope_ci"]
    assert fewer["arms"]["corrected"]["p_value"] == a["arms"]["corrected"]["p_value"]
    other = batchsize_trend(df, n_boot=200, n_perm=499, seed=8)
    assert other["arms"]["corrected"]["slope_ci"] != a["arms"]["corrected"]["slope_ci"]


def test_result_is_strict_json_with_the_documented_keys(damaged_result: dict) -> None:
    text = json.dumps(damaged_result, allow_nan=False)
    back = json.loads(text)
    assert {"hypothesis", "metric", "control", "arms", "verdict"} <= set(back)
    keys = {"n", "n_failed", "spearman_rho", "slope", "slope_ci", "interaction", "interaction_ci"}
    keys |= {"p_value", "p_value_holm"}
    for arm in ("linear", "linear_batchnorm", "corrected"):
        assert keys <= set(back["arms"][arm])
        assert back["verdict"][arm] in {"supported", "refuted", "inconclusive"}


def test_arm_with_only_failures_is_inconclusive() -> None:
    df = planted_table()
    df.loc[df["arm"] == "corrected", "status"] = "failed"
    res = batchsize_trend(df, n_boot=100, n_perm=99)
    arm = res["arms"]["corrected"]
    assert (arm["n"], arm["n_failed"], arm["slope"], arm["p_value"]) == (0, 30, None, None)
    assert res["verdict"]["corrected"] == "inconclusive"


def test_generic_metric_column_and_validation_errors() -> None:
    df = planted_table().rename(columns={"test_accuracy": "metric"})
    res = batchsize_trend(df, n_boot=100, n_perm=99)
    assert res["metric"] == "test_accuracy" and res["verdict"]["corrected"] == "supported"
    with pytest.raises(ValueError, match="control arm 'plain'"):
        batchsize_trend(df, control="plain")
    with pytest.raises(ValueError, match="missing columns"):
        batchsize_trend(df.drop(columns="seed"))
    with pytest.raises(ValueError, match="positive"):
        normalize_table(df.assign(batch_size=0), "metric")
    with pytest.raises(ValueError, match="n_boot"):
        batchsize_trend(df, n_boot=0)


def test_ols_slope_matches_polyfit_and_is_nan_for_one_x() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20), rng.normal(size=20)
    assert ols_slope(x, y) == pytest.approx(np.polyfit(x, y, 1)[0])
    assert math.isnan(ols_slope(np.ones(5), y[:5]))


def test_gate_entropy_matches_scipy() -> None:
    p = np.array([[0.5, 0.5], [1.0, 0.0], [0.9, 0.1], [0.2, 0.3]])
    p[3] /= p[3].sum()
    expected = stats.entropy(p, axis=1)
    assert gate_entropy(p) == pytest.approx(expected)
    assert gate_entropy([0.5, 0.5]) == pytest.approx(math.log(2))
    assert gate_entropy([1.0, 0.0]) == 0.0
    with pytest.raises(ValueError):
        gate_entropy([-0.1, 1.1])


def test_warnings_name_failures_and_too_few_seeds(damaged_result: dict) -> None:
    warns = damaged_result["warnings"]
    assert any(w.startswith("corrected: 2 of 29 trials failed") for w in warns)
    assert any(w.startswith("linear: 1 of 30 trials failed") for w in warns)
    assert not any(w.startswith("linear_batchnorm") for w in warns)  # 6 seeds, no failures
    few = batchsize_trend(planted_table(seeds=(0, 1, 2)), n_boot=50, n_perm=99)
    assert {a["n_seeds"] for a in few["arms"].values()} == {3}
    assert sum("fewer than 5 seeds" in w for w in few["warnings"]) == 3


def test_an_arm_left_with_one_seed_gets_no_interval() -> None:
    df = planted_table()
    df.loc[(df["arm"] == "corrected") & (df["seed"] != 0), "status"] = "failed"
    res = batchsize_trend(df, n_boot=100, n_perm=99)
    arm = res["arms"]["corrected"]
    assert arm["n_seeds"] == 1 and arm["slope"] == pytest.approx(TRUE_SLOPE, abs=0.01)
    assert arm["slope_ci"] is None and arm["interaction_ci"] is None
    assert res["verdict"]["corrected"] == "inconclusive"
