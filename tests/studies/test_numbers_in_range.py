"""Every number in range and labelled (issue #47 item 4; the protocol's §5 "Numbers in range" and
"What would decide it"): intervals of a correlation inside [-1, 1], the sensitivity analysis on the
primary's test, "to decide" from the signed estimate, p-values unsigned, every estimate named."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.cli import verdict_lines
from studies.kinds.batchsize.analysis import batchsize_trend
from studies.kinds.batchsize.workflow import DESIGN
from studies.kinds.compare.report import _contrast_rows
from studies.kinds.search.report import claims_table
from studies.reporting import count, estimate_name
from studies.results import to_decide
from studies.stats import (
    confidence_sequence,
    fisher_z_interval,
    futility_needs,
    seeds_to_futility,
    t_interval,
    wrong_side,
)

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


# ---- "to decide" from the signed estimate --------------------------------------------------------


def test_wrong_side_is_read_from_the_sign_and_the_claimed_direction() -> None:
    assert wrong_side(-0.5, "greater") and wrong_side(0.5, "less")
    assert not wrong_side(0.5, "greater") and not wrong_side(-0.5, "less")
    assert not wrong_side(-0.5, "two-sided") and not wrong_side(None, "greater")


@pytest.mark.parametrize("sequential", [True, False])
def test_seeds_to_futility_is_where_the_interval_excludes_every_claimed_effect(sequential: bool) -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(-0.5, 1.0, 12)  # a claim "> 0" with an estimate against it
    k = seeds_to_futility(values, alpha=0.05, alternative="greater", min_effect=0.2, sequential=sequential)
    assert k is not None and k >= 2
    mean, sd = float(values.mean()), float(values.std(ddof=1))

    def upper(n: int) -> float:  # the interval's upper bound at n seeds of this mean and spread
        x = mean + sd * _standardised(n)
        _lo, hi = confidence_sequence(x, alpha=0.05) if sequential else t_interval(x, 0.95)
        return hi

    assert upper(k) < 0.2  # at k seeds every effect >= min_effect is excluded ...
    if k > 2:
        assert upper(k - 1) >= 0.2  # ... and not one seed earlier
    # mirrored for a claim "< 0": the same count
    assert k == seeds_to_futility(
        -values, alpha=0.05, alternative="less", min_effect=0.2, sequential=sequential
    )
    # a larger min_effect is excluded sooner; a claim the estimate supports has no futility count
    sooner = seeds_to_futility(
        values, alpha=0.05, alternative="greater", min_effect=1.0, sequential=sequential
    )
    assert sooner is not None and sooner <= k
    assert seeds_to_futility(-values, alpha=0.05, alternative="greater", min_effect=0.2) is None
    assert seeds_to_futility(values, alpha=0.05, alternative="two-sided") is None


def _standardised(n: int) -> np.ndarray:
    """n values of mean 0 and sample sd 1."""
    z = np.linspace(-1.0, 1.0, n)
    z = z - z.mean()
    return z / z.std(ddof=1)


def test_the_sequential_interval_needs_more_seeds_than_the_fixed_one() -> None:
    values = np.random.default_rng(2).normal(-0.3, 1.0, 20)
    kw: dict[str, Any] = {"alpha": 0.05, "alternative": "greater", "min_effect": 0.1}
    seq = seeds_to_futility(values, sequential=True, **kw)
    fixed = seeds_to_futility(values, sequential=False, **kw)
    assert seq is not None and fixed is not None and seq > fixed


def test_futility_needs_names_the_wrong_side_only() -> None:
    out = futility_needs(
        {"against": [-0.4, -0.6, -0.5, -0.3], "for": [0.4, 0.6, 0.5, 0.3], "both": [-0.4, -0.6, -0.5]},
        alternatives={"against": "greater", "for": "greater", "both": "two-sided"},
        alpha=0.05,
        min_effect=None,
        sequential=False,
    )
    assert out["wrong_side"] == {"against": True, "for": False, "both": False}
    assert out["estimate"]["against"] == pytest.approx(-0.45)
    assert out["futility_seeds"]["against"] is not None
    assert out["futility_seeds"]["for"] is None and out["futility_seeds"]["both"] is None
    assert out["futility_rule"] == "fixed" and out["futility_effect"] == 0.0


def test_to_decide_on_the_wrong_side_gives_the_futility_seeds_not_a_power_count() -> None:
    futile = {"seeds": 29, "estimate": -0.00506, "rule": "sequential", "effect": 0.005, "name": "difference"}
    text = to_decide(
        "inconclusive", ["CI includes 0"], None, None, seeds_used=24, cost=(0.41, 0.0), futile=futile
    )
    assert text.startswith("difference -0.00506 on the wrong side of the claim: futile at ≈29 seeds"), text
    assert "confidence sequence" in text and "every effect of 0.005 or more in the claimed direction" in text
    assert "power" not in text and text.endswith("; CI includes 0")
    # a fixed design: refuted where the t-interval lies on the other side (no min_effect: of 0)
    fixed = to_decide(
        "inconclusive",
        [],
        None,
        None,
        seeds_used=8,
        cost=None,
        futile=futile | {"rule": "fixed", "effect": 0.0},
    )
    assert "refuted at ≈29 seeds" in fixed and "t-interval" in fixed and "other side of 0" in fixed
    # ... and one that only excludes the effects worth finding (a compare margin): not reproduced
    margin = to_decide(
        "inconclusive", [], None, None, seeds_used=8, cost=None, futile=futile | {"rule": "fixed"}
    )
    assert "not reproduced at ≈29 seeds" in margin and "every effect of 0.005 or more" in margin
    # the projection already met by the seeds used: said so (what holds it open are its other reasons)
    met = to_decide("inconclusive", ["failures"], None, None, seeds_used=40, cost=None, futile=futile)
    assert "from 29 seeds, no more than the 40 used" in met and "failures: fewer failed trials" in met
    # the right side of the claim: the power count as before
    right = to_decide("inconclusive", [], 30, seeds_used=24, cost=None)
    assert right.startswith("≥30 seeds for 80% power")


# ---- p-values unsigned, estimates named, arm means and plurals ---------------------------------------


def test_the_console_names_every_estimate_and_prints_p_unsigned(tmp_path: Path) -> None:
    verdict = {
        "kind": "batchsize",
        "study_verdict": "inconclusive",
        "hypotheses": {
            "corrected": {
                "verdict": "inconclusive",
                "estimate": -0.04909,
                "ci": [-0.1, 0.01],
                "p_value_holm": 0.1887,
                "reasons": [],
            }
        },
    }
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict), encoding="utf-8")
    lines = verdict_lines(path)
    row = next(line for line in lines if "corrected" in line)
    assert "interaction -0.04909" in row and "0.1887" in row and "+0.1887" not in row
    compare = verdict | {"kind": "compare"}
    path.write_text(json.dumps(compare), encoding="utf-8")
    assert "difference -0.04909" in "\n".join(verdict_lines(path))
    # a contrast decided inside its margin is listed as equivalent (its hypothesis is inconclusive)
    path.write_text(
        json.dumps(compare | {"contrasts": {"corrected": {"verdict": "equivalent"}}}), encoding="utf-8"
    )
    row = next(line for line in verdict_lines(path) if "corrected" in line)
    assert "equivalent" in row and "inconclusive" not in row


def test_the_batchsize_verdict_lines_print_p_holm_as_a_probability() -> None:
    arm = {"n": 40, "n_failed": 0, "slope": -0.01, "slope_ci": [-0.02, 0.0], "interaction": -0.04909}
    arm |= {"interaction_ci": [-0.1, 0.01], "p_value_holm": 0.1887, "reasons": []}
    verdict = {"study_verdict": "inconclusive", "arms": {"corrected": arm}, "verdict": {"corrected": "x"}}
    lines = DESIGN.verdict_lines(SimpleNamespace(control_arms=("linear",)), verdict)  # type: ignore[arg-type]
    row = next(line for line in lines if "corrected" in line)
    assert "p_holm=0.1887" in row and "interaction=-0.0491" in row


def test_report_tables_name_their_estimates() -> None:
    contrast = {"arm": "corrected", "reference": "linear", "estimate": -0.0075, "ci": [-0.01, -0.004]}
    contrast |= {"p_value": 0.0078, "p_value_holm": 0.031, "verdict": "worse", "predicted": "better"}
    rows = _contrast_rows({"contrasts": {"c": contrast | {"hypothesis": "refuted", "reasons": []}}})
    assert rows[0]["difference"] == "-0.0075" and "estimate" not in rows[0]
    claims = {
        "a": {"verdict": "inconclusive", "estimate": -0.005, "ci": [-0.01, 0.006]},
        "c_attn": {"verdict": "supported", "estimate": 0.0104, "ci": [0.001, 0.02]},
        "d": {"verdict": "refuted", "estimate": 3.0, "ci": [2.0, 4.0]},
        "e": {"verdict": "inconclusive", "estimate": None, "ci": [None, None]},
    }
    by_id = {r["id"]: r for r in claims_table(claims)}
    assert by_id["a"]["estimate"] == "difference -0.005"
    assert by_id["c_attn"]["estimate"] == "slope 0.0104"
    assert by_id["d"]["estimate"] == "median epoch 3"
    assert by_id["e"]["estimate"] == "–"


def test_counts_take_the_right_number() -> None:
    assert count(1, "seed") == "1 seed" and count(2, "seed") == "2 seeds" and count(0, "seed") == "0 seeds"
    assert count(1, "study", "studies") == "1 study" and count(3, "study", "studies") == "3 studies"
    assert estimate_name("batchsize", "corrected") == "interaction"
    assert estimate_name("nothing-known", "x") == "estimate"


@pytest.mark.parametrize("sequential", [False, True])
def test_the_batchsize_pilot_reads_each_arm_from_its_signed_interaction(
    tmp_path: Path, sequential: bool
) -> None:
    # corrected falls with B against the control (the claim's side: a power count), prenorm_l2 rises
    # (the wrong side: the seeds at which it would be given up, no power count for |effect|)
    from studies.kinds.batchsize.power import pilot

    rng = np.random.default_rng(4)
    rows = []
    for arm, slope in (("linear", 0.0), ("corrected", -0.01), ("prenorm_l2", 0.01)):
        for b in (8, 16, 32, 64):
            for s in range(6):
                acc = 0.8 + slope * math.log2(b) + rng.normal(0, 0.01)
                rows.append(
                    {"arm": arm, "batch_size": b, "seed": s, "status": "completed", "test_accuracy": acc}
                )
    pd.DataFrame(rows).to_csv(tmp_path / "trials.csv", index=False)
    seq = SimpleNamespace(min_effect=0.005, prior_scale=1.0) if sequential else None
    analysis = SimpleNamespace(metric="test_accuracy", higher_is_better=True, min_seeds=5, confidence=0.95)
    spec = SimpleNamespace(
        analysis=analysis,
        control="linear",
        fix_arms=("corrected", "prenorm_l2"),
        data="digits",
        sequential=seq,
    )
    out = pilot(spec, tmp_path, power=0.8, min_effect=None, alpha=0.05)
    assert out["wrong_side"] == {"corrected": False, "prenorm_l2": True}
    assert out["estimate"]["corrected"] < 0 < out["estimate"]["prenorm_l2"]
    assert out["futility_seeds"]["corrected"] is None
    k = out["futility_seeds"]["prenorm_l2"]
    assert isinstance(k, int) and k >= 2
    assert out["futility_rule"] == ("sequential" if sequential else "fixed")
    assert out["futility_effect"] == (0.005 if sequential else 0.0)


def test_summary_runs_keep_an_accuracy_interval_inside_zero_one() -> None:
    from studies.summaries import arm_summaries

    table = pd.DataFrame(
        {
            "arm": ["a", "a", "a", "a"],
            "batch_size": [8, 8, 16, 16],
            "test_accuracy": [0.99, 0.60, 0.90, 0.91],
            "test_loss": [0.01, 0.9, 0.1, 0.12],
        }
    )
    (run,) = arm_summaries(table, metrics=["test_accuracy", "test_loss"], axis="batch_size")
    lo, hi = dict(run.metrics["test_accuracy_ci_low"]), dict(run.metrics["test_accuracy_ci_high"])
    assert lo[8] == 0.0 and hi[8] == 1.0  # the raw t-interval over two seeds is [-1.7, 3.3]
    assert 0.0 < lo[16] < hi[16] < 1.0  # a narrow one is left as it is
    assert dict(run.metrics["test_loss_ci_low"])[8] < 0.0  # a loss is not an accuracy: not clipped


def test_plan_pilot_says_when_the_pilot_points_against_the_claim(tmp_path: Path) -> None:
    from studies.pilot import _statement

    r: dict[str, Any] = {
        "per_seed": {"against": [-0.4, -0.6, -0.5], "for": [0.4, 0.6, 0.5]},
        "quantity": "per-seed paired difference",
        "seeds_needed": {"against": 12, "for": 12},
        "effect": {"against": -0.5, "for": 0.5},
        "sd": {"against": 0.1, "for": 0.1},
        "family_size": 2,
        "alpha": 0.05,
        "power": 0.8,
        "k": None,
        "estimate": {"against": -0.5, "for": 0.5},
        "wrong_side": {"against": True, "for": False},
        "futility_seeds": {"against": 4, "for": None},
        "futility_rule": "fixed",
    }
    text = _statement(None, r, tmp_path)
    assert "against's pilot estimate -0.5 lies on the wrong side of its claim" in text
    assert "given up at about 4 seeds" in text and "the t-interval" in text
    assert "for's pilot estimate" not in text


def test_the_batchsize_table_shows_the_rho_interval_or_n_a() -> None:
    from studies.kinds.batchsize.report import verdict_table

    for seeds in (2, 3):
        res = batchsize_trend(_table(seeds, monotone=False), n_perm=99, n_boot=200, min_seeds=2, **ARGS)
        cells = [row["spearman ρ CI"] for row in verdict_table(res)]
        if seeds < 3:
            assert cells == ["n/a", "n/a"]
        else:
            for cell in cells:
                lo, hi = (float(x) for x in cell.strip("[]").split(","))
                assert -1.0 <= lo <= hi <= 1.0
