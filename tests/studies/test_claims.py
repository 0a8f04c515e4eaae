"""Statistics of the AutoNorm claims study: contrasts, Holm, verdicts (the gate measurements: test_search_gates.py)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.kinds.search.claims import CONFIRM_COLUMNS, autonorm_claims, paired_contrast
from studies.stats import holm

CLAIM_IDS = ("a", "b", "c", "c_attn", "c_mlp", "d", "e")


def _values(k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.normal(0.85, 0.01, k)
    return b + rng.normal(0.004, 0.01, k), b


# -- paired_contrast -----------------------------------------------------------------------------------------


def test_estimate_is_the_mean_difference_and_ci_is_scipys_t_interval() -> None:
    a, b = _values(8)
    res = paired_contrast(a, b, alternative="greater", confidence=0.9)
    d = a - b
    assert res["estimate"] == pytest.approx(d.mean(), abs=1e-15)
    assert res["differences"] == pytest.approx(list(d), abs=1e-15)
    expected = stats.t.interval(0.9, df=7, loc=d.mean(), scale=stats.sem(d))
    assert res["ci"] == pytest.approx(list(expected), rel=1e-12, abs=1e-15)
    assert res["n_seeds"] == 8 and res["method"] == "exact"


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_sign_flip_p_equals_brute_force_enumeration(alternative: str, seed: int) -> None:
    a, b = _values(6, seed)
    d = a - b
    observed = d.sum()
    hits = 0
    for signs in itertools.product((1.0, -1.0), repeat=6):
        t = float(np.dot(signs, d))
        if alternative == "greater":
            hits += t >= observed - 1e-12
        elif alternative == "less":
            hits += t <= observed + 1e-12
        else:
            hits += abs(t) >= abs(observed) - 1e-12
    res = paired_contrast(a, b, alternative=alternative)  # type: ignore[arg-type]
    assert res["p_value"] == hits / 64


def test_all_positive_differences_reach_the_smallest_exact_p() -> None:
    a = np.arange(1.0, 8.0)
    res = paired_contrast(a + 0.5, a, alternative="greater")
    assert res["p_value"] == 1 / 2**7  # only the identity pattern is as extreme
    assert res["ci"] == [0.5, 0.5]  # constant differences: the interval is the point
    assert paired_contrast(a + 0.5, a, alternative="two-sided")["p_value"] == 2 / 2**7
    assert paired_contrast(a, a, alternative="greater")["p_value"] == 1.0  # no effect at all


def test_monte_carlo_above_2_to_the_20_patterns_uses_the_plus_one_correction() -> None:
    k = 21
    strong = paired_contrast(np.ones(k), np.zeros(k), alternative="greater", n_mc=999, seed=3)
    assert strong["method"] == "monte-carlo"
    assert strong["p_value"] == 1 / 1000  # never 0: the observed pattern counts
    a, b = _values(k, seed=5)
    mc = paired_contrast(a, b, alternative="two-sided", n_mc=20_000, seed=1)
    d = a - b
    # Exact reference over all 2^21 patterns, in chunks.
    hits = 0
    bits = np.arange(k)
    for start in range(0, 2**k, 2**17):
        codes = np.arange(start, start + 2**17)[:, None]
        t = (1.0 - 2.0 * ((codes >> bits) & 1)) @ d
        hits += int(np.count_nonzero(np.abs(t) >= abs(d.sum()) - 1e-12))
    assert mc["p_value"] == pytest.approx(hits / 2**k, abs=0.015)  # ~4 Monte-Carlo standard errors
    again = paired_contrast(a, b, alternative="two-sided", n_mc=20_000, seed=1)
    assert again["p_value"] == mc["p_value"]  # seeded


def test_paired_contrast_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="aligned"):
        paired_contrast([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 seeds"):
        paired_contrast([1.0], [0.0])
    with pytest.raises(ValueError, match="finite"):
        paired_contrast([1.0, math.nan], [0.0, 0.0])
    with pytest.raises(ValueError, match="alternative"):
        paired_contrast([1.0, 2.0], [0.0, 0.0], alternative="bigger")  # type: ignore[arg-type]


# -- autonorm_claims -----------------------------------------------------------------------------------------

BASE = 0.85


def _table(n_seeds: int, effect: float, *, noise: float = 0.004, seed: int = 0) -> dict[str, list[Any]]:
    """Confirmatory table with random_selector and autonorm_s ``effect`` above autonorm."""
    rng = np.random.default_rng(seed)
    offsets = {"frozen_ln": 0.0, "frozen_dyt": -0.01, "random_selector": effect, "autonorm": 0.0}
    offsets["autonorm_s"] = effect
    cols: dict[str, list[Any]] = {c: [] for c in CONFIRM_COLUMNS}
    for s in range(100, 100 + n_seeds):
        level = BASE + rng.normal(0, 0.02)  # shared by every arm of a seed: pairing removes it
        for arm, off in offsets.items():
            acc = level + off + rng.normal(0, noise)
            row = {
                "arm": arm,
                "seed": s,
                "status": "completed",
                "test_accuracy": acc,
                "val_accuracy": acc,
                "train_loss": 0.3,
                "lr": 1e-3,
                "trial_id": f"{arm}_{s}",
                "mlflow_run_id": f"run{arm}{s}",
            }
            for c in CONFIRM_COLUMNS:
                cols[c].append(row[c])
    return cols


def _gate_logs(
    n_seeds: int, *, depth: int = 4, epochs: int = 10, dyt_slope: float = 0.0, collapse_at: int | None = 2
) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Histories of the autonorm arm: final DyT weight 0.5 + slope·(block − mean); collapse to LN."""
    rng = np.random.default_rng(1)
    logs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for s in range(100, 100 + n_seeds):
        rows = []
        for epoch in range(1, epochs + 1):
            row = {"epoch": float(epoch), "test_accuracy": 0.8}
            for layer in range(2 * depth):
                block = layer // 2
                collapsed = collapse_at is not None and epoch >= collapse_at + (s % 2)
                dyt = 0.02 if collapsed else 0.5 + dyt_slope * (block - (depth - 1) / 2)
                dyt = float(np.clip(dyt + rng.normal(0, 0.01), 0.001, 0.999))
                row[f"dyt_weight/layer_{layer}"] = dyt
                row[f"gate_entropy/layer_{layer}"] = 0.05 if collapsed else 0.6
            rows.append(row)
        logs[("autonorm", s)] = rows
    return logs


def _assert_shape(res: dict[str, dict[str, Any]]) -> None:
    assert tuple(res) == CLAIM_IDS
    for claim, r in res.items():
        assert r["verdict"] in ("supported", "refuted", "inconclusive"), claim
        assert {"estimate", "ci", "p_value", "p_value_holm", "n_seeds", "reasons"} <= set(r), claim
        if r["verdict"] != "supported":
            assert r["reasons"], claim  # every non-supported verdict says why
        if r["p_value_holm"] is not None:
            assert r["p_value_holm"] >= r["p_value"]
    json.dumps(res, allow_nan=False)


def test_fewer_than_min_seeds_makes_every_claim_inconclusive_and_says_why() -> None:
    for kind, logs in (("vision", _gate_logs(4)), ("text", _gate_logs(4, collapse_at=None, dyt_slope=0.1))):
        res = autonorm_claims(_table(4, 0.05), logs, data_kind=kind)  # type: ignore[arg-type]
        _assert_shape(res)
        assert all(r["verdict"] == "inconclusive" for r in res.values()), kind
        applicable = ("a", "b", "d", "e") if kind == "vision" else ("b", "c_attn", "c_mlp", "e")
        for claim in applicable:
            assert "underpowered" in res[claim]["reasons"], (kind, claim)
            assert res[claim]["n_seeds"] == 4


def test_planted_effects_with_12_seeds_are_supported_on_vision() -> None:
    res = autonorm_claims(pd.DataFrame(_table(12, 0.03)), _gate_logs(12), data_kind="vision")
    _assert_shape(res)
    for claim in ("a", "b"):
        assert res[claim]["verdict"] == "supported", res[claim]
        assert res[claim]["estimate"] == pytest.approx(0.03, abs=0.005)
        assert res[claim]["ci"][0] > 0 and res[claim]["p_value_holm"] < 0.05
    assert res["e"]["verdict"] == "supported" and res["e"]["direction"] == "autonorm_s better"
    assert res["d"]["verdict"] == "supported", res["d"]
    assert res["d"]["estimate"] == 2.5  # half the seeds collapse at epoch 2, half at 3
    for claim in ("c", "c_attn", "c_mlp"):
        assert res[claim]["verdict"] == "inconclusive"
        assert res[claim]["reasons"] == ["not applicable to vision"]


def test_planted_opposite_effects_are_refuted() -> None:
    vision = autonorm_claims(_table(12, -0.03), _gate_logs(12, collapse_at=None), data_kind="vision")
    _assert_shape(vision)
    for claim in ("a", "b", "d"):
        assert vision[claim]["verdict"] == "refuted", vision[claim]
    assert vision["a"]["ci"][1] < 0
    assert vision["d"]["estimate"] is None  # the typical layer never collapses
    text = autonorm_claims(
        _table(12, -0.03), _gate_logs(12, collapse_at=None, dyt_slope=-0.08), data_kind="text"
    )
    _assert_shape(text)
    for claim in ("b", "c", "c_attn", "c_mlp"):
        assert text[claim]["verdict"] == "refuted", text[claim]
    assert text["c_attn"]["ci"][1] < 0


def test_text_gates_preferring_dyt_in_deep_layers_support_claim_c() -> None:
    res = autonorm_claims(
        _table(12, 0.0), _gate_logs(12, depth=6, collapse_at=None, dyt_slope=0.05), data_kind="text"
    )
    _assert_shape(res)
    for claim in ("c", "c_attn", "c_mlp"):
        assert res[claim]["verdict"] == "supported", res[claim]
        assert res[claim]["estimate"] == pytest.approx(0.05, abs=0.01)
    assert res["c"]["p_value"] == max(res["c_attn"]["p_value"], res["c_mlp"]["p_value"])
    assert res["c"]["p_value_holm"] is None  # not in the contrast family
    for claim in ("a", "d"):
        assert res[claim]["verdict"] == "inconclusive" and res[claim]["reasons"] == ["not applicable to text"]
    assert res["a"]["p_value"] is None


def test_no_effect_is_inconclusive_not_refuted() -> None:
    table = _table(12, 0.0)
    auto = {
        s: a for arm, s, a in zip(table["arm"], table["seed"], table["test_accuracy"]) if arm == "autonorm"
    }
    for i, (arm, s) in enumerate(zip(table["arm"], table["seed"])):
        if arm == "autonorm_s":  # differences +-0.01 alternating over seeds: mean exactly 0
            table["test_accuracy"][i] = auto[s] + (0.01 if s % 2 else -0.01)
    res = autonorm_claims(table, _gate_logs(12), data_kind="vision")
    b = res["b"]
    assert b["estimate"] == pytest.approx(0.0, abs=1e-12) and b["p_value"] > 0.5
    assert b["verdict"] == "inconclusive"
    assert any(r.startswith("p = ") for r in b["reasons"]) and "CI includes 0" in b["reasons"]


def test_only_one_sublayer_type_trending_leaves_c_inconclusive() -> None:
    logs = _gate_logs(12, depth=6, collapse_at=None, dyt_slope=0.05)
    rng = np.random.default_rng(7)
    for rows in logs.values():
        for row in rows:
            for layer in range(0, 12, 2):  # pre-attention norms: flat at 0.5 + noise
                row[f"dyt_weight/layer_{layer}"] = 0.5 + rng.normal(0.0, 0.02)
    res = autonorm_claims(_table(12, 0.0), logs, data_kind="text")
    assert res["c_mlp"]["verdict"] == "supported"
    assert res["c_attn"]["verdict"] != "supported"
    assert res["c"]["verdict"] == "inconclusive"
    assert any(r.startswith("c_attn") for r in res["c"]["reasons"])


def test_holm_runs_over_the_claimed_contrasts_tested_on_this_data() -> None:
    # e (AutoNorm-S vs FrozenLN) is reported, not claimed: tested alone, outside the Holm family.
    table = _table(10, 0.01, noise=0.01)
    vision = autonorm_claims(table, _gate_logs(10), data_kind="vision")
    raw = {c: vision[c]["p_value"] for c in ("a", "b")}
    assert {c: vision[c]["p_value_holm"] for c in raw} == pytest.approx(holm(raw))
    assert vision["e"]["p_value_holm"] == pytest.approx(vision["e"]["p_value"])
    text = autonorm_claims(table, _gate_logs(10, collapse_at=None), data_kind="text")
    # b alone on text data: a family of one
    assert text["b"]["p_value_holm"] == pytest.approx(text["b"]["p_value"])
    assert text["e"]["p_value_holm"] == pytest.approx(text["e"]["p_value"])


def test_a_reported_contrast_changes_no_holm_p_of_the_claims() -> None:
    table = _table(10, 0.01, noise=0.01)
    with_e = autonorm_claims(table, _gate_logs(10), data_kind="vision")
    shifted = _table(10, 0.01, noise=0.01)
    # Move FrozenLN far away: e's p changes, a's and b's Holm p must not.
    shifted["test_accuracy"] = [
        v - 0.2 * (0.5 + i % 3) if arm == "frozen_ln" else v
        for i, (arm, v) in enumerate(zip(shifted["arm"], shifted["test_accuracy"], strict=True))
    ]
    moved = autonorm_claims(shifted, _gate_logs(10), data_kind="vision")
    assert moved["e"]["p_value"] != pytest.approx(with_e["e"]["p_value"])
    for c in ("a", "b"):
        assert moved[c]["p_value_holm"] == pytest.approx(with_e[c]["p_value_holm"])


def test_failed_trials_are_scored_at_chance_and_counted() -> None:
    table = _table(12, 0.03)
    i = table["trial_id"].index("autonorm_105")
    table["status"][i] = "diverged"
    table["test_accuracy"][i] = math.nan
    res = autonorm_claims(table, _gate_logs(12), data_kind="vision", chance=0.1)
    b = res["b"]
    assert b["n_failed"] == {"autonorm_s": 0, "autonorm": 1} and b["n_seeds"] == 12
    diff = b["differences"][b["seeds"].index(105)]
    expected = table["test_accuracy"][table["trial_id"].index("autonorm_s_105")] - 0.1
    assert diff == pytest.approx(expected)
    assert b["sensitivity"]["n_seeds"] == 11  # the analysis without the failed seed
    excluded = autonorm_claims(table, _gate_logs(12), data_kind="vision")  # no chance level
    assert excluded["b"]["n_seeds"] == 11
    assert any("excluded" in r for r in excluded["b"]["reasons"])


def test_many_failures_make_a_contrast_inconclusive() -> None:
    table = _table(12, 0.05)
    for s in range(100, 104):  # 4 of 12 autonorm trials fail: 33 % > 20 %
        table["status"][table["trial_id"].index(f"autonorm_{s}")] = "error"
    res = autonorm_claims(table, _gate_logs(12), data_kind="vision", chance=0.1)
    for claim in ("a", "b"):
        assert res[claim]["verdict"] == "inconclusive"
        assert any(r.startswith("failures") for r in res[claim]["reasons"])


def test_invalid_tables_and_options_raise() -> None:
    table = _table(6, 0.0)
    with pytest.raises(ValueError, match="data_kind"):
        autonorm_claims(table, {}, data_kind="audio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        autonorm_claims({k: v for k, v in table.items() if k != "status"}, {}, data_kind="vision")
    doubled = {k: v + v[:1] for k, v in table.items()}
    with pytest.raises(ValueError, match="more than one trial"):
        autonorm_claims(doubled, {}, data_kind="vision")


def test_missing_gate_logs_leave_gate_claims_inconclusive() -> None:
    res = autonorm_claims(_table(12, 0.03), {}, data_kind="vision")
    assert res["d"]["verdict"] == "inconclusive" and "underpowered" in res["d"]["reasons"]
    assert res["a"]["verdict"] == "supported"  # the contrasts do not need gate logs


def test_sequential_design_decides_each_claim_at_every_look() -> None:
    design = {"looks": [6, 8, 10, 12], "seed_order": list(range(100, 112)), "min_effect": 0.01}
    # vision: a and b have a clear effect, e (autonorm_s vs frozen_ln: effect 0.03 too) as well
    res = autonorm_claims(_table(12, 0.03), _gate_logs(12), data_kind="vision", sequential=design)
    looks = res.pop("_looks")
    _assert_shape(res)
    assert [look["n_seeds"] for look in looks] == [6, 8, 10, 12]
    assert set(looks[0]["hypotheses"]) == {"a", "b", "e"}  # the Holm family on images
    for claim in ("a", "b"):
        h = looks[-1]["hypotheses"][claim]
        assert res[claim]["sequential"] == h["decision"] == "reject"
        assert (
            res[claim]["p_value_holm"] == h["p_value_holm"] <= 0.05 and res[claim]["verdict"] == "supported"
        )
        assert res[claim]["ci"] == pytest.approx(h["ci"]) and res[claim]["ci"][0] > 0
        assert res[claim]["fixed_design"]["p_value"] is not None  # the sign-flip p is kept aside
    assert res["d"]["verdict"] == "supported"  # not a per-seed mean: computed as before
    # no effect on text: b and e are futile -> refuted (effect below min_effect); claim c is tested too
    text = autonorm_claims(
        _table(12, 0.0, noise=0.002), _gate_logs(12, collapse_at=None), data_kind="text", sequential=design
    )
    looks = text.pop("_looks")
    assert set(looks[-1]["hypotheses"]) == {"b", "e", "c_attn", "c_mlp"}
    for claim in ("b", "e"):
        assert text[claim]["sequential"] == "futile", text[claim]
        assert text[claim]["verdict"] == "refuted" and "effect below min_effect" in text[claim]["reasons"]
    # c's two sub-layer types are each tested at alpha on their own (not in Holm's family)
    assert (
        text["c_attn"]["p_value_holm"] is None
        and looks[-1]["hypotheses"]["c_attn"]["p_value_holm"] is not None
    )
    json.dumps(text, allow_nan=False)


def test_the_depth_slope_p_value_does_not_depend_on_the_seeds_order() -> None:
    # 24 seeds: 2^24 sign patterns, so the p-value is Monte Carlo; rereading the gate logs in another
    # order gave 0.00136 and 0.00116 for one stored study before the seeds were sorted.
    from studies.kinds.search.gates import dyt_depth_slope

    rng = np.random.default_rng(3)
    weights = {100 + i: rng.normal(0.01 * np.arange(4), 0.05) for i in range(24)}
    forward = dyt_depth_slope(weights, n_mc=2_000)
    backward = dyt_depth_slope(dict(reversed(list(weights.items()))), n_mc=2_000)
    assert forward["method"] == "monte-carlo"
    assert forward["p_value"] == backward["p_value"]
    assert list(forward["slopes"]) == sorted(weights, key=str)


def test_the_search_pilot_plans_the_depth_slope_claims_from_the_verdict(tmp_path: Path) -> None:
    from studies.kinds.search.power import _depth_slopes

    slopes = {str(100 + i): 0.01 + 0.002 * (-1) ** i for i in range(6)}
    (tmp_path / "verdict.json").write_text(
        json.dumps({"claims": {"c_attn": {"slopes": slopes}, "c_mlp": {"slopes": {"1": 0.1}}}})
    )
    found = _depth_slopes(tmp_path)
    assert list(found) == ["c_attn"]  # one seed is no spread: c_mlp cannot be planned from it
    assert found["c_attn"] == [slopes[k] for k in sorted(slopes)]
    assert _depth_slopes(tmp_path / "missing") == {}


def test_an_arm_stops_when_every_claim_on_it_is_decided() -> None:
    from studies.kinds.search.claims import arms_needed, hypothesis_arms

    arms = ["frozen_ln", "frozen_dyt", "random_selector", "autonorm", "autonorm_s"]
    assert hypothesis_arms("a") == ("random_selector", "autonorm")
    assert hypothesis_arms("c_attn", gate_arm="autonorm") == ("autonorm",)
    look = {
        "a": {"decision": "reject", "reported": False},
        "b": {"decision": "continue", "reported": False},
        "e": {"decision": "continue", "reported": True},  # reported: keeps no arm running
    }
    # a decided: random_selector stops; b open: autonorm and autonorm_s go on; FrozenLN only served e
    assert arms_needed(look, arms) == ["autonorm", "autonorm_s"]
    # an arm that failed the training-adequacy check: every claim on it ends inconclusive by rule,
    # so b (on autonorm_s) is as decided as a futile claim, and nothing else needs autonorm
    assert arms_needed(look, arms, under_trained=["autonorm_s"]) == []
    look["d"] = {"decision": "continue", "reported": False}  # on the gate arm, autonorm
    assert arms_needed(look, arms, under_trained=["autonorm_s"]) == ["autonorm"]
    assert arms_needed(look, arms, under_trained=["autonorm"]) == []
    del look["d"]
    look["b"]["decision"] = "futile"
    assert arms_needed(look, arms) == []  # every claimed hypothesis decided: the study stops
    with pytest.raises(ValueError, match="unknown claim"):
        hypothesis_arms("z")
