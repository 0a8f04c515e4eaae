"""studies.stats: Holm, and the anytime-valid mixture t-test (formulas checked, guarantees simulated).

The simulations are the issue's "Done when" design: normal values, looks every 2 seeds from 4 to 20,
alpha = 0.05, alternative ``less``. Each runs a few thousand studies through the public
:func:`studies.stats.sequential_test` (seeded RNG) and asserts the guarantee with a Monte-Carlo margin
of three standard errors where the guarantee is a bound.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, stats

from studies.stats import (
    confidence_sequence,
    holm,
    mixture_log_e_values,
    sequential_family,
    sequential_looks,
    sequential_test,
)

LOOKS = tuple(range(4, 21, 2))
ALPHA = 0.05
RUNS = 2000


# -- Holm ----------------------------------------------------------------------------------------------------


def test_holm_matches_a_hand_computation() -> None:
    # sorted: a .01 x3 = .03; c .03 x2 = .06; b .04 x1 = .04 -> monotone: .06
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # capped at 1
    assert list(holm({"z": 0.5, "a": 0.1})) == ["z", "a"]  # the input's order


def test_holm_leaves_missing_p_values_out_of_the_family() -> None:
    out = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None, "e": math.nan})
    assert out == {
        "a": pytest.approx(0.03),
        "b": pytest.approx(0.06),
        "c": pytest.approx(0.06),
        "d": None,
        "e": None,
    }
    assert holm({}) == {}
    assert holm({"only": None}) == {"only": None}


def test_holm_gives_ties_one_value_whatever_their_order() -> None:
    forward = holm({"a": 0.02, "b": 0.02, "c": 0.5})
    backward = holm({"c": 0.5, "b": 0.02, "a": 0.02})
    assert forward["a"] == forward["b"] == backward["a"] == backward["b"] == pytest.approx(0.06)


def test_holm_is_never_below_the_raw_p_and_keeps_their_order() -> None:
    rng = np.random.default_rng(0)
    raw = {f"h{i}": float(p) for i, p in enumerate(rng.uniform(0, 0.2, 7))}
    adj = holm(raw)
    assert all((adj[k] or 0.0) >= raw[k] for k in raw)
    ranked = sorted(raw, key=raw.__getitem__)
    assert all((adj[x] or 0.0) <= (adj[y] or 0.0) for x, y in itertools.pairwise(ranked))
    with pytest.raises(ValueError, match="bad"):
        holm({"bad": 1.5})


# -- the e-value and its confidence sequence ----------------------------------------------------------------


@pytest.mark.parametrize("g", [1.0, 0.3])
def test_e_value_is_the_bayes_factor_of_the_t_statistic(g: float) -> None:
    # E_n = integral over delta ~ N(0, g) of the noncentral-t density of t (nc = delta sqrt n), over
    # the central one: an independent route to the closed form of the protocol's section 4.
    x = np.array([0.3, -0.2, 1.1, 0.7, 0.5, 0.9])
    n = x.size
    t = math.sqrt(n) * x.mean() / x.std(ddof=1)
    num, _ = integrate.quad(
        lambda d: stats.nct.pdf(t, n - 1, d * math.sqrt(n)) * stats.norm.pdf(d, 0, math.sqrt(g)), -30, 30
    )
    expected = num / stats.t.pdf(t, n - 1)
    assert math.exp(mixture_log_e_values(x, prior_scale=g)[-1]) == pytest.approx(expected, rel=1e-6)


def test_e_value_per_prefix_and_its_limits() -> None:
    x = np.array([0.5, 0.5, 0.5, 0.5])
    log_e = mixture_log_e_values(x)
    assert log_e[0] == 0.0  # one value: no spread, no evidence
    # zero spread off the null: the largest value n values can give, c^((n - 1)/2)
    assert log_e[1:] == pytest.approx([0.5 * (k - 1) * math.log(1 + k) for k in (2, 3, 4)])
    assert mixture_log_e_values(np.zeros(3))[-1] == pytest.approx(-0.5 * math.log(4))  # t = 0
    # one-sided: no evidence for "less" from values above 0
    assert np.all(np.isneginf(mixture_log_e_values(x, alternative="less")[1:]))
    rows = np.random.default_rng(1).normal(size=(5, 8))
    per_row = np.stack([mixture_log_e_values(r) for r in rows])
    assert mixture_log_e_values(rows) == pytest.approx(per_row)  # 2-D: one study per row


def test_confidence_sequence_inverts_the_e_value() -> None:
    x = np.random.default_rng(2).normal(0.4, 1.0, 9)
    lo, hi = confidence_sequence(x, alpha=ALPHA)
    assert lo < x.mean() < hi
    for bound in (lo, hi):  # on the bound, E_n(mu) = 1 / alpha exactly
        assert math.exp(mixture_log_e_values(x - bound)[-1]) == pytest.approx(1 / ALPHA)
    # too few values for a bounded interval at g = 1, alpha = 0.05 (K >= c up to n = 4)
    assert confidence_sequence(x[:4], alpha=ALPHA) == (-math.inf, math.inf)
    assert math.isfinite(confidence_sequence(x[:5], alpha=ALPHA)[0])


def test_sequential_test_decisions_and_input_errors() -> None:
    strong = [-1.0, -1.2, -0.9, -1.1, -1.05, -0.95, -1.0, -1.1]
    out = sequential_test(strong, looks=[4, 8], alpha=ALPHA, alternative="less")
    assert set(out) == {"decision", "p_value", "ci"}
    assert out["decision"] == "reject" and out["p_value"] <= ALPHA and out["ci"][1] < 0
    # the same evidence in the other direction rejects nothing one-sided
    wrong = sequential_test([-v for v in strong], looks=[4, 8], alpha=ALPHA, alternative="less")
    assert wrong["p_value"] == 1.0 and wrong["decision"] == "inconclusive"  # last look: never continue
    early = sequential_test(strong[:4], looks=[4, 8], alpha=ALPHA, alternative="less")
    assert early["decision"] == "continue" and early["ci"] == [-math.inf, math.inf]
    flat = [0.01, -0.02, 0.0, 0.02, -0.01, 0.0, 0.01, -0.01]
    futile = sequential_test(flat, looks=[4, 8], alpha=ALPHA, alternative="greater", min_effect=0.5)
    assert futile["decision"] == "futile" and futile["ci"][1] < 0.5
    for bad in (
        {"values": strong[:5]},  # not a planned look
        {"looks": [8, 4]},
        {"alternative": "bigger"},
        {"min_effect": -1.0},
        {"alpha": 1.5},
        {"values": [*strong[:7], math.nan]},
    ):
        kwargs = {"values": strong, "looks": [4, 8], "alpha": ALPHA, "alternative": "less", **bad}
        with pytest.raises(ValueError):
            sequential_test(**kwargs)  # type: ignore[arg-type]


# -- families and looks ---------------------------------------------------------------------------------------


def test_family_applies_holm_at_the_look() -> None:
    rng = np.random.default_rng(3)
    values = {"a": rng.normal(-1.0, 1, 12), "b": rng.normal(-0.6, 1, 12), "c": rng.normal(0, 1, 12)}
    alternatives = {"a": "less", "b": "less", "c": "two-sided"}
    out = sequential_family(values, looks=[6, 12], alpha=ALPHA, alternatives=alternatives)  # type: ignore[arg-type]
    single = {
        k: sequential_test(v, looks=[6, 12], alpha=ALPHA, alternative=alternatives[k])  # type: ignore[arg-type]
        for k, v in values.items()
    }
    assert {k: r["p_value"] for k, r in out.items()} == pytest.approx(
        {k: r["p_value"] for k, r in single.items()}
    )
    assert {k: r["p_value_holm"] for k, r in out.items()} == pytest.approx(
        holm({k: r["p_value"] for k, r in single.items()})
    )
    for r in out.values():
        assert r["decision"] == ("reject" if r["p_value_holm"] <= ALPHA else "inconclusive")
    missing = sequential_family(
        {"a": values["a"], "z": None}, looks=[6, 12], alpha=ALPHA, alternatives={"a": "less", "z": "less"}
    )
    assert missing["z"]["p_value_holm"] is None and missing["z"]["decision"] == "inconclusive"
    assert missing["a"]["p_value_holm"] == pytest.approx(missing["a"]["p_value"])  # a family of one


def test_looks_stop_when_every_hypothesis_is_decided() -> None:
    rng = np.random.default_rng(4)
    values = {"big": rng.normal(-3.0, 1, 20), "none": rng.normal(0.0, 0.2, 20)}
    looks = sequential_looks(
        values, looks=LOOKS, alpha=ALPHA, alternatives={"big": "less", "none": "less"}, min_effect=1.0
    )
    assert [look["n_seeds"] for look in looks] == list(LOOKS[: len(looks)])
    assert looks[-1]["stop"] and not any(look["stop"] for look in looks[:-1])
    assert len(looks) < len(LOOKS)  # decided before the maximum
    final = looks[-1]["hypotheses"]
    assert final["big"]["decision"] == "reject" and final["none"]["decision"] == "futile"
    for look in looks[:-1]:
        assert any(h["decision"] == "continue" for h in look["hypotheses"].values())
    # a shorter record replays the looks it reaches
    partial = sequential_looks(
        {k: v[:9] for k, v in values.items()},
        looks=LOOKS,
        alpha=ALPHA,
        alternatives={"big": "less", "none": "less"},
    )
    assert [look["n_seeds"] for look in partial] == [4, 6, 8]


def test_a_rejection_stays_decided_and_its_interval_only_shrinks() -> None:
    # Strong early evidence, then seeds that alone would not reject (the c_attn pattern: rejected at
    # 16 seeds, a 24-seed confidence sequence that includes 0).
    early = [0.03, 0.025, 0.035, 0.028, 0.032, 0.027, 0.031, 0.029]
    late = [-0.04, 0.05, -0.03, 0.06, -0.05, 0.04, -0.06, 0.05, -0.04, 0.03, -0.05, 0.06]
    values = {"h": np.array(early + late)}
    looks = sequential_looks(
        values, looks=LOOKS, alpha=ALPHA, alternatives={"h": "greater"}, stop_early=False
    )
    decisions = [look["hypotheses"]["h"]["decision"] for look in looks]
    first = decisions.index("reject")
    assert first < len(looks) - 1  # rejected before the last look ...
    assert all(d == "reject" for d in decisions[first:])  # ... and rejected at every later look
    # The plain confidence sequence of all 20 values includes 0: only the intersection keeps the
    # rejection and its interval consistent.
    alone = confidence_sequence(values["h"], alpha=ALPHA)
    assert alone[0] < 0 < alone[1]
    for look in looks[first:]:
        h = look["hypotheses"]["h"]
        assert h["ci"][0] > 0  # excludes the null on the predicted side
        assert h["decided_at"] == looks[first]["n_seeds"]
    widths = [look["hypotheses"]["h"]["ci"][1] - look["hypotheses"]["h"]["ci"][0] for look in looks]
    finite = [w for w in widths if math.isfinite(w)]
    assert all(b <= a for a, b in itertools.pairwise(finite))  # the running intersection only shrinks


def test_futility_stays_decided() -> None:
    flat = [0.0, 0.01, -0.01, 0.0, 0.005, -0.005, 0.0, 0.01]
    later = [0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 0.9, 1.1, 1.0, 1.0, 0.95, 1.05]
    looks = sequential_looks(
        {"h": flat + later},
        looks=LOOKS,
        alpha=ALPHA,
        alternatives={"h": "greater"},
        min_effect=0.5,
        stop_early=False,
    )
    decisions = [look["hypotheses"]["h"]["decision"] for look in looks]
    first = decisions.index("futile")
    assert all(d == "futile" for d in decisions[first:])


def test_a_reported_hypothesis_is_tested_alone_and_keeps_no_study_running() -> None:
    rng = np.random.default_rng(11)
    claimed = {"a": rng.normal(-1.2, 1, 20), "b": rng.normal(-0.8, 1, 20)}
    e = rng.normal(0.05, 1, 20)  # a reported contrast, undecided for long
    alternatives = {"a": "less", "b": "less", "e": "two-sided"}
    common = {"looks": LOOKS, "alpha": ALPHA, "stop_early": False}
    without = sequential_looks(claimed, alternatives=alternatives, **common)  # type: ignore[arg-type]
    withe = sequential_looks(  # type: ignore[arg-type]
        {**claimed, "e": e}, alternatives=alternatives, reported={"e"}, **common
    )
    as_claim = sequential_looks({**claimed, "e": e}, alternatives=alternatives, **common)  # type: ignore[arg-type]
    for one, two, three in zip(without, withe, as_claim, strict=True):
        for k in claimed:  # the reported contrast changes no other Holm p ...
            assert two["hypotheses"][k]["p_value_holm"] == pytest.approx(one["hypotheses"][k]["p_value_holm"])
        h = two["hypotheses"]["e"]  # ... and is tested alone
        assert h["p_value_holm"] == pytest.approx(h["p_value"])
        # the same contrast claimed would have diluted the others (Holm over three)
        assert three["hypotheses"]["a"]["p_value_holm"] >= one["hypotheses"]["a"]["p_value_holm"]
    # the study stops when the claimed hypotheses are decided, whatever e says
    stopped = sequential_looks(
        {**claimed, "e": e}, alternatives=alternatives, reported={"e"}, looks=LOOKS, alpha=ALPHA
    )  # type: ignore[arg-type]
    last = stopped[-1]
    assert last["stop"] and all(last["hypotheses"][k]["decision"] == "reject" for k in claimed)
    assert last["hypotheses"]["e"]["decision"] not in ("reject", "futile")
    assert last["n_seeds"] < LOOKS[-1]
    with pytest.raises(ValueError, match="reported"):
        sequential_family(claimed, looks=LOOKS, alpha=ALPHA, alternatives=alternatives, reported={"zz"})  # type: ignore[arg-type]


# -- simulations: the guarantees -----------------------------------------------------------------------------


def _simulate(mean: float, *, min_effect: float | None, seed: int, every_look: bool) -> dict[str, float]:
    """``RUNS`` studies of N(mean, 1) values through ``sequential_test`` at every look of ``LOOKS``.

    A study stops at its first look that is not ``continue``; with ``every_look`` the test is still
    asked at every later look, for the simultaneous coverage of the intervals."""
    rng = np.random.default_rng(seed)
    data = rng.normal(mean, 1.0, size=(RUNS, LOOKS[-1]))
    rejected = covered = 0
    used: list[int] = []
    futile_excludes: list[bool] = []
    for x in data:
        stop: int | None = None
        all_cover = True
        for n in LOOKS:
            out = sequential_test(x[:n], looks=LOOKS, alpha=ALPHA, alternative="less", min_effect=min_effect)
            lo, hi = out["ci"]
            all_cover &= lo < mean < hi
            if out["decision"] == "futile":
                futile_excludes.append(lo > -min_effect)  # type: ignore[operator]
            if stop is None and out["decision"] != "continue":
                stop = n
                rejected += out["decision"] == "reject"
                if not every_look:
                    break
        assert stop is not None  # the last look never says "continue"
        used.append(stop)
        covered += all_cover
    return {
        "reject": rejected / RUNS,
        "coverage": covered / RUNS,
        "used": float(np.mean(used)) / LOOKS[-1],
        "n_futile": len(futile_excludes),
        "futile_exclude": float(np.mean(futile_excludes)) if futile_excludes else math.nan,
    }


def _mc_margin(p: float) -> float:
    return 3.0 * math.sqrt(p * (1 - p) / RUNS)


def test_simulation_type_one_error_and_simultaneous_coverage_under_the_null() -> None:
    null = _simulate(0.0, min_effect=None, seed=10, every_look=True)
    assert null["reject"] <= ALPHA + _mc_margin(ALPHA)
    assert null["coverage"] >= 0.95 - _mc_margin(0.95)
    # without a futility rule a null study runs to the maximum unless it (wrongly) rejects
    assert null["used"] >= 1.0 - null["reject"]


def test_simulation_power_at_one_sd_uses_at_most_70_percent_of_the_seeds() -> None:
    effect = _simulate(-1.0, min_effect=None, seed=11, every_look=True)
    assert effect["reject"] >= 0.8
    assert effect["used"] <= 0.70
    assert effect["coverage"] >= 0.95 - _mc_margin(0.95)


def test_simulation_futility_under_the_null() -> None:
    null = _simulate(0.0, min_effect=1.0, seed=12, every_look=False)
    assert null["n_futile"] > RUNS / 2  # most null studies end futile
    assert null["futile_exclude"] == 1.0  # every futile interval excludes -min_effect
    assert null["used"] < 1.0  # null studies stop before max_seeds on average
    assert null["reject"] <= ALPHA + _mc_margin(ALPHA)
