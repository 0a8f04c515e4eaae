"""studies.stats: the seeds a study needs, from the noncentral t power of a one-sample t-test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from studies.stats import power_of_t_test, seeds_needed


def _pilot(mean: float, sd: float) -> list[float]:
    """Two per-seed values with exactly this mean and sample sd (ddof=1)."""
    half = sd / math.sqrt(2)
    return [mean - half, mean + half]


def _simulated_power(
    k: int, mean: float, sd: float, *, alpha: float, alternative: str, rng: np.random.Generator
) -> float:
    draws = rng.normal(mean, sd, size=(20_000, k))
    p = stats.ttest_1samp(draws, 0.0, axis=1, alternative=alternative).pvalue
    return float(np.mean(p < alpha))


def test_pilot_helper_has_the_requested_mean_and_sd() -> None:
    values = _pilot(0.3, 2.0)
    assert np.mean(values) == pytest.approx(0.3) and np.std(values, ddof=1) == pytest.approx(2.0)


# --------------------------------------------------------------------------------------------------
# textbook values


def test_textbook_one_sided_medium_effect_needs_27_seeds() -> None:
    """Cohen's d = 0.5, alpha = 0.05 one-sided, power 0.8: n = 27 (G*Power: actual power 0.8118)."""
    for alternative in ("greater", "less"):
        assert seeds_needed(_pilot(0.5, 1.0), alpha=0.05, family_size=1, alternative=alternative) == 27
    assert power_of_t_test(27, 0.5, 1.0, alpha=0.05, alternative="greater") == pytest.approx(
        0.81183, abs=1e-4
    )
    assert power_of_t_test(26, 0.5, 1.0, alpha=0.05, alternative="greater") < 0.8


def test_textbook_two_sided_medium_effect_needs_34_seeds() -> None:
    """d = 0.5, alpha = 0.05 two-sided, power 0.8: n = 34 (G*Power: actual power 0.8078)."""
    assert seeds_needed(_pilot(0.5, 1.0), alpha=0.05, family_size=1, alternative="two-sided") == 34
    assert power_of_t_test(34, 0.5, 1.0, alpha=0.05, alternative="two-sided") == pytest.approx(
        0.80778, abs=1e-4
    )


def test_power_matches_scipy_noncentral_t_directly() -> None:
    k, effect, sd, alpha = 12, 0.7, 1.3, 0.01
    nc = effect / sd * math.sqrt(k)
    one = stats.nct.sf(stats.t.isf(alpha, k - 1), k - 1, nc)
    crit = stats.t.isf(alpha / 2, k - 1)
    two = stats.nct.sf(crit, k - 1, nc) + stats.nct.cdf(-crit, k - 1, nc)
    assert power_of_t_test(k, effect, sd, alpha=alpha, alternative="less") == pytest.approx(one, rel=1e-12)
    assert power_of_t_test(k, -effect, sd, alpha=alpha, alternative="greater") == pytest.approx(
        one, rel=1e-12
    )
    assert power_of_t_test(k, effect, sd, alpha=alpha, alternative="two-sided") == pytest.approx(
        two, rel=1e-12
    )


@pytest.mark.parametrize("alternative", ["less", "greater", "two-sided"])
def test_zero_effect_has_the_tests_size(alternative: str) -> None:
    for k in (2, 5, 40):
        assert power_of_t_test(k, 0.0, 1.0, alpha=0.05, alternative=alternative) == pytest.approx(
            0.05, abs=1e-12
        )


# --------------------------------------------------------------------------------------------------
# against a simulation of the t-test itself


@pytest.mark.parametrize(
    ("alternative", "mean", "sd", "alpha", "family_size", "target"),
    [
        ("less", -0.6, 1.0, 0.05, 1, 0.8),  # the study's direction: a negative slope
        ("greater", 0.9, 1.5, 0.05, 3, 0.8),
        ("two-sided", 1.2, 1.0, 0.05, 2, 0.9),
    ],
)
def test_returned_k_reaches_the_power_in_simulation_and_k_minus_1_does_not(
    alternative: str, mean: float, sd: float, alpha: float, family_size: int, target: float
) -> None:
    rng = np.random.default_rng(20240611)
    k = seeds_needed(
        _pilot(mean, sd), alpha=alpha, family_size=family_size, power=target, alternative=alternative
    )
    assert k is not None and k > 2
    level = alpha / family_size
    se = math.sqrt(target * (1 - target) / 20_000)  # ~0.003
    at_k = _simulated_power(k, mean, sd, alpha=level, alternative=alternative, rng=rng)
    below = _simulated_power(k - 1, mean, sd, alpha=level, alternative=alternative, rng=rng)
    # The t-test on simulated normal data rejects as often as the formula says ...
    assert at_k == pytest.approx(
        power_of_t_test(k, mean, sd, alpha=level, alternative=alternative), abs=4 * se
    )
    assert below == pytest.approx(
        power_of_t_test(k - 1, mean, sd, alpha=level, alternative=alternative), abs=4 * se
    )
    # ... so K reaches the target and K - 1 falls short: exactly by the formula, and in simulation
    # within its error.
    exact_k = power_of_t_test(k, mean, sd, alpha=level, alternative=alternative)
    assert power_of_t_test(k - 1, mean, sd, alpha=level, alternative=alternative) < target <= exact_k
    assert at_k >= target - 4 * se
    assert below < target + 4 * se
    assert below < at_k


def test_simulated_rejection_rate_of_a_true_null_is_the_corrected_level() -> None:
    rng = np.random.default_rng(7)
    rate = _simulated_power(10, 0.0, 1.0, alpha=0.05 / 4, alternative="less", rng=rng)
    assert rate == pytest.approx(0.0125, abs=4 * math.sqrt(0.0125 * 0.9875 / 20_000))


# --------------------------------------------------------------------------------------------------
# shape


def test_k_decreases_with_the_effect_and_increases_with_the_sd() -> None:
    by_effect = [
        seeds_needed(_pilot(e, 1.0), alpha=0.05, family_size=1) for e in (0.2, 0.3, 0.5, 0.8, 1.2, 2.0)
    ]
    assert all(k is not None for k in by_effect)
    assert by_effect == sorted(by_effect, reverse=True) and by_effect[0] > by_effect[-1]
    by_sd = [seeds_needed(_pilot(0.5, s), alpha=0.05, family_size=1) for s in (0.25, 0.5, 1.0, 1.5, 2.5)]
    assert by_sd == sorted(by_sd) and by_sd[0] < by_sd[-1]  # type: ignore[type-var]


def test_power_grows_with_k_and_effect_and_falls_with_sd() -> None:
    ks = [power_of_t_test(k, 0.4, 1.0, alpha=0.05) for k in range(2, 200)]
    assert all(b > a for a, b in itertools.pairwise(ks))
    effects = [power_of_t_test(20, e, 1.0, alpha=0.05, alternative="less") for e in np.linspace(0, 2, 21)]
    assert all(b > a for a, b in itertools.pairwise(effects))
    sds = [power_of_t_test(20, 0.5, s, alpha=0.05) for s in np.linspace(0.2, 3, 15)]
    assert all(b < a for a, b in itertools.pairwise(sds))


def test_family_size_raises_k_as_bonferroni_level() -> None:
    values = _pilot(0.5, 1.0)
    ks = [seeds_needed(values, alpha=0.05, family_size=m, alternative="less") for m in (1, 2, 4, 8)]
    assert ks[0] == 27 and all(b > a for a, b in itertools.pairwise(ks))  # type: ignore[operator]
    # Exactly the test at alpha / family_size (Holm's first step).
    assert ks[2] == seeds_needed(values, alpha=0.05 / 4, family_size=1, alternative="less")


def test_two_sided_needs_more_seeds_than_one_sided() -> None:
    one = seeds_needed(_pilot(0.4, 1.0), alpha=0.05, family_size=2, alternative="greater")
    two = seeds_needed(_pilot(0.4, 1.0), alpha=0.05, family_size=2, alternative="two-sided")
    assert one is not None and two is not None and two > one


def test_higher_power_needs_more_seeds() -> None:
    ks = [seeds_needed(_pilot(0.5, 1.0), alpha=0.05, family_size=1, power=p) for p in (0.5, 0.8, 0.9, 0.99)]
    assert all(b > a for a, b in itertools.pairwise(ks))  # type: ignore[operator]


def test_min_effect_replaces_the_pilot_mean_but_keeps_its_sd() -> None:
    noisy_small = _pilot(0.05, 1.0)
    assert seeds_needed(noisy_small, alpha=0.05, family_size=1, min_effect=0.5, alternative="greater") == 27
    assert seeds_needed(noisy_small, alpha=0.05, family_size=1, min_effect=-0.5, alternative="greater") == 27
    assert (
        seeds_needed(_pilot(0.5, 2.0), alpha=0.05, family_size=1, min_effect=1.0, alternative="greater") == 27
    )


def test_pilot_sign_is_a_magnitude() -> None:
    up = seeds_needed(_pilot(0.5, 1.0), alpha=0.05, family_size=1, alternative="less")
    down = seeds_needed(_pilot(-0.5, 1.0), alpha=0.05, family_size=1, alternative="less")
    assert up == down == 27


def test_many_pilot_values_use_their_mean_and_sample_sd() -> None:
    values = np.random.default_rng(3).normal(0.5, 1.0, size=12)
    d = abs(values.mean()) / values.std(ddof=1)
    expected = seeds_needed(_pilot(d, 1.0), alpha=0.05, family_size=1)
    assert seeds_needed(list(values), alpha=0.05, family_size=1) == expected
    assert seeds_needed(tuple(values * 10), alpha=0.05, family_size=1) == expected  # scale-free


# --------------------------------------------------------------------------------------------------
# edges


def test_large_k_is_found_exactly() -> None:
    """Near k_max: scipy's nct.cdf gives NaN in the far tail there; the power must stay exact."""
    k = seeds_needed(_pilot(0.03, 1.0), alpha=0.05, family_size=1, alternative="two-sided")
    assert k is not None and 8000 < k <= 10_000
    assert power_of_t_test(k, 0.03, 1.0, alpha=0.05) >= 0.8 > power_of_t_test(k - 1, 0.03, 1.0, alpha=0.05)
    # Far beyond: power is ~1, never NaN, for every alternative.
    for alternative in ("less", "greater", "two-sided"):
        assert power_of_t_test(5000, 0.5, 1.0, alpha=0.05, alternative=alternative) == pytest.approx(1.0)


def test_unreachable_within_k_max_is_none() -> None:
    values = _pilot(0.5, 1.0)
    assert seeds_needed(values, alpha=0.05, family_size=1, alternative="greater", k_max=27) == 27
    assert seeds_needed(values, alpha=0.05, family_size=1, alternative="greater", k_max=26) is None
    assert seeds_needed(_pilot(0.0, 1.0), alpha=0.05, family_size=1) is None  # zero effect
    assert seeds_needed(_pilot(0.01, 1.0), alpha=0.05, family_size=1, k_max=10_000) is None


def test_zero_spread() -> None:
    assert seeds_needed([0.3, 0.3, 0.3], alpha=0.05, family_size=3) == 2
    assert seeds_needed([0.0, 0.0], alpha=0.05, family_size=1) is None
    assert seeds_needed([0.0, 0.0], alpha=0.05, family_size=1, min_effect=0.2) == 2


def test_huge_effect_needs_the_minimum_of_two_seeds() -> None:
    assert seeds_needed(_pilot(50.0, 1.0), alpha=0.05, family_size=1) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"values": [1.0]},
        {"values": [1.0, float("nan")]},
        {"values": [[1.0, 2.0]]},
        {"alpha": 0.0},
        {"alpha": 1.0},
        {"family_size": 0},
        {"power": 1.0},
        {"alternative": "smaller"},
        {"k_max": 1},
        {"min_effect": float("inf")},
    ],
)
def test_seeds_needed_rejects_bad_arguments(kwargs: dict) -> None:
    args: dict = {"values": [0.1, 0.4], "alpha": 0.05, "family_size": 1, **kwargs}
    with pytest.raises(ValueError):
        seeds_needed(**args)


@pytest.mark.parametrize(
    ("k", "effect", "sd", "alpha", "alternative"),
    [
        (1, 0.5, 1.0, 0.05, "less"),
        (2.5, 0.5, 1.0, 0.05, "less"),
        (5, 0.5, 0.0, 0.05, "less"),
        (5, float("nan"), 1.0, 0.05, "less"),
        (5, 0.5, 1.0, 1.5, "less"),
        (5, 0.5, 1.0, 0.05, "both"),
    ],
)
def test_power_rejects_bad_arguments(
    k: float, effect: float, sd: float, alpha: float, alternative: str
) -> None:
    with pytest.raises(ValueError):
        power_of_t_test(k, effect, sd, alpha=alpha, alternative=alternative)  # type: ignore[arg-type]
