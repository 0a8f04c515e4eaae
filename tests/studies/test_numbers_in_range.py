"""Every number in range and labelled (issue #47 item 4; the protocol's §5 "Numbers in range"):
intervals of a correlation inside [-1, 1], the sensitivity analysis on the primary's test."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.kinds.batchsize.analysis import batchsize_trend
from studies.stats import fisher_z_interval

ARGS: dict[str, Any] = {
    "control": "linear",
    "controls": ("linear",),
    "metric": "test_accuracy",
    "higher_is_better": True,
    "chance_metric": 0.1,
    "chance_loss": math.log(10),
}


def _inside(ci: list[float]) -> bool:
    return -1.0 <= ci[0] <= ci[1] <= 1.0


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 1.0, 1.0],
        [-1.0, -1.0, -1.0],
        [1.0, -1.0, 1.0],
        [1.0] * 10,
        [-1.0] * 10,
        [1.0, -1.0] * 5,
        [0.9, -0.8, 1.0],  # a t-interval on the rho themselves: [-2.4, 2.8]
        [1.0, 0.5, -1.0, 1.0, 0.8, -0.5, 1.0, 0.2, -1.0, 1.0],
    ],
)
def test_fisher_z_interval_stays_inside_minus_one_one(values: list[float]) -> None:
    ci = fisher_z_interval(values, confidence=0.95)
    assert ci is not None and _inside(ci)
    # the interval holds the mean of the clipped rho on the z scale, tanh(mean atanh(rho))
    z = np.arctanh(np.clip(values, -0.999, 0.999))
    assert ci[0] <= math.tanh(float(z.mean())) <= ci[1]


def test_fisher_z_interval_needs_three_seeds_and_rejects_non_correlations() -> None:
    assert fisher_z_interval([1.0, -1.0], confidence=0.95) is None
    assert fisher_z_interval([0.3, float("nan"), 0.5], confidence=0.95) is None  # 2 finite values
    with pytest.raises(ValueError):
        fisher_z_interval([0.3, 1.5, 0.2], confidence=0.95)


def test_fisher_z_interval_narrows_with_seeds_and_covers_the_truth() -> None:
    rng = np.random.default_rng(0)
    wide = fisher_z_interval(np.tanh(rng.normal(0.5, 0.3, 3)), confidence=0.95)
    narrow = fisher_z_interval(np.tanh(rng.normal(0.5, 0.3, 200)), confidence=0.95)
    assert wide is not None and narrow is not None
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert narrow[0] < math.tanh(0.5) < narrow[1]


def _table(seeds: int, *, monotone: bool, rng_seed: int = 0) -> pd.DataFrame:
    """Two arms over 4 batch sizes; ``monotone``: every seed's fix arm strictly falls (rho = -1) or
    strictly rises (rho = +1) with B, alternating by seed; else noisy."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for s in range(seeds):
        sign = -1.0 if s % 2 == 0 else 1.0
        for j, b in enumerate((8, 16, 32, 64)):
            for arm in ("linear", "corrected"):
                trend = sign * 0.02 * j if (monotone and arm == "corrected") else 0.0
                acc = 0.8 + trend + rng.normal(0, 0.001 if monotone else 0.02)
                rows.append(
                    {
                        "arm": arm,
                        "batch_size": b,
                        "seed": s,
                        "status": "completed",
                        "test_accuracy": acc,
                        "train_loss": 0.3,
                    }
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seeds", [2, 3, 10])
@pytest.mark.parametrize("monotone", [True, False])
def test_spearman_interval_of_the_batchsize_kind_is_inside_minus_one_one(seeds: int, monotone: bool) -> None:
    res = batchsize_trend(_table(seeds, monotone=monotone), n_perm=99, n_boot=200, min_seeds=2, **ARGS)
    for arm, r in res["arms"].items():
        rho, ci = r["spearman_rho"], r["spearman_rho_ci"]
        assert rho is not None and -1.0 <= rho <= 1.0, arm
        if seeds < 3:
            assert ci is None, arm  # below 3 seeds: no interval ("n/a")
        else:
            assert ci is not None and _inside(ci), (arm, ci)
    if monotone:  # every per-seed rho of the fix arm is -1 or +1 (alternating by seed)
        signs = [-1.0 if s % 2 == 0 else 1.0 for s in range(seeds)]
        assert res["arms"]["corrected"]["spearman_rho"] == pytest.approx(float(np.mean(signs)))


def test_all_seeds_perfectly_monotone_give_an_interval_at_the_clipped_bound() -> None:
    df = _table(10, monotone=True)
    df.loc[df["arm"] == "corrected", "test_accuracy"] = 0.8 - 0.02 * np.log2(
        df.loc[df["arm"] == "corrected", "batch_size"].to_numpy(dtype=float)
    )
    res = batchsize_trend(df, n_perm=99, n_boot=200, min_seeds=2, **ARGS)
    r = res["arms"]["corrected"]
    assert r["spearman_rho"] == pytest.approx(-1.0)
    assert r["spearman_rho_ci"] == pytest.approx([-0.999, -0.999])


def _sequential_table(seeds: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    seed_effect = rng.normal(0, 0.01, size=seeds)
    slopes = {"linear": 0.0, "corrected": -0.02, "prenorm_l2": 0.0}
    rows = []
    for k, (arm, slope) in enumerate(slopes.items()):
        for b in (8, 16, 32, 64, 128):
            for s in range(seeds):
                acc = 0.85 - 0.01 * k + slope * math.log2(b) + seed_effect[s] + rng.normal(0, 0.004)
                rows.append(
                    {
                        "arm": arm,
                        "batch_size": b,
                        "seed": s,
                        "status": "completed",
                        "test_accuracy": acc,
                        "train_loss": 0.3,
                    }
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("sequential", [False, True])
def test_without_failures_the_sensitivity_analysis_equals_the_primary(sequential: bool) -> None:
    design = (
        {
            "looks": [6, 8, 10, 12],
            "seed_order": [str(s) for s in range(12)],
            "min_effect": 0.01,
            "prior_scale": 1.0,
        }
        if sequential
        else None
    )
    res = batchsize_trend(_sequential_table(), n_perm=999, sequential=design, **ARGS)
    test = "sequential" if sequential else "fixed"
    assert res["test"] == test and res["sensitivity"]["test"] == test
    assert res["sensitivity"]["verdict"] == res["verdict"]
    assert res["sensitivity"]["study_verdict"] == res["study_verdict"]
    for arm, r in res["arms"].items():
        sens = r["sensitivity"]
        assert sens["test"] == test
        for key in ("p_value", "p_value_holm", "interaction_ci", "slope_ci", "reasons"):
            assert sens[key] == r[key], (arm, key)
        assert sens.get("verdict", sens.get("label")) == r.get("verdict", r.get("label"))
    if sequential:  # the case the old sensitivity (always fixed-design) got wrong
        assert res["arms"]["prenorm_l2"]["sequential"] == "futile"
        assert res["arms"]["prenorm_l2"]["sensitivity"]["reasons"] == ["effect below min_effect"]


def test_sensitivity_drops_failures_under_the_sequential_test() -> None:
    df = _sequential_table()
    failed = (df["arm"] == "corrected") & (df["seed"] == 0) & (df["batch_size"] == 128)
    df.loc[failed, "status"] = "diverged"
    design = {"looks": [6, 8, 10, 12], "seed_order": [str(s) for s in range(12)], "min_effect": 0.01}
    res = batchsize_trend(df, n_perm=999, sequential=design, **ARGS)
    corrected = res["arms"]["corrected"]
    assert res["sensitivity"]["test"] == "sequential" == corrected["sensitivity"]["test"]
    assert corrected["n_failed"] == 1 and corrected["sensitivity"]["n"] == corrected["n"] - 1
    # the sequential confidence sequence, not the fixed t-interval: wider than the fixed design's
    fixed = batchsize_trend(df, n_perm=999, **ARGS)["arms"]["corrected"]["sensitivity"]["interaction_ci"]
    lo, hi = corrected["sensitivity"]["interaction_ci"]
    assert hi - lo > fixed[1] - fixed[0]
