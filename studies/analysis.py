"""Statistics for hypothesis studies: the batch-size trend test and gate-entropy summaries.

The batch-size hypothesis (PROTOCOL.md §2): layers that correct the affine divergence get *worse* as
the batch size B grows, and BatchNorm / plain affine layers do not. :func:`batchsize_trend` turns a
table of finished trials into per-arm statistics and a verdict; its return value is exactly what a
study writes to ``verdict.json``.

Design choices that matter for validity:

* Seeds are the experimental unit. Every arm is run with the same seeds (common random numbers), so
  uncertainty comes from a *cluster* bootstrap that resamples whole seeds (all batch sizes of a seed
  together), never individual trials: trials of one seed share an initialisation and a data order.
* The interaction is the trend of the paired differences ``metric(arm) - metric(control)`` per
  ``(B, seed)`` cell. Its permutation test shuffles the batch-size labels of those differences
  *within each seed*: under the null of no trend in the differences the labels are exchangeable
  there, and the seed structure is kept. Shuffling arm labels within cells instead would test the
  arms' level difference, not their trend, and is not valid here.
* Failed or diverged trials (status not completed, or a non-finite metric) are counted per arm and
  reported, never silently dropped; the statistics use the completed ones.
* Every random draw comes from a ``numpy.random.Generator`` owned by the call, derived from
  ``seed`` and the arm name, so results do not depend on global state or on which other arms are in
  the table.
"""

from __future__ import annotations

import itertools
import math
import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

__all__ = [
    "COMPLETED_STATUSES",
    "DIVERGENCE_FIXES",
    "HYPOTHESIS",
    "MIN_SEEDS",
    "VERDICTS",
    "batchsize_trend",
    "gate_entropy",
    "holm_adjust",
    "normalize_table",
    "ols_slope",
    "verdict_for",
]

HYPOTHESIS = (
    "Performance of layers that correct the affine divergence correlates negatively with batch size "
    "(it gets worse as B grows); BatchNorm and plain affine layers do not show this trend."
)

#: Arms the hypothesis predicts to get worse with B (the divergence-correcting layers); the others
#: (plain affine, BatchNorm, LayerNorm and their conv versions) are predicted to show no such trend.
DIVERGENCE_FIXES = frozenset({"prenorm_l2", "prenorm_rms", "corrected", "patchnorm"})

#: Trial statuses that count as finished; anything else (``failed``, ``error``, ``diverged``,
#: ``running``, ...) counts as a failure. Compared case-insensitively; ``terminated`` is Ray Tune's
#: name for a trial that ran to the end.
COMPLETED_STATUSES = frozenset({"completed", "terminated"})

VERDICTS = ("supported", "refuted", "inconclusive")

#: Below this many seeds per arm the seed bootstrap has too few distinct resamples to trust its CI
#: (PROTOCOL.md §2 asks for >= 5); the result then carries a warning. The verdict rule is unchanged.
MIN_SEEDS = 5

_REQUIRED_COLUMNS = ("arm", "batch_size", "seed", "status")


def ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` on ``x``; NaN when ``x`` has fewer than two distinct values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 2:
        return math.nan
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx <= 1e-12 * max(1.0, float(np.abs(x).max()) ** 2):
        return math.nan
    return float(xc @ (y - y.mean()) / sxx)


def holm_adjust(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm step-down adjusted p-values over the arms whose p-value is defined.

    ``p_holm_(i) = max_{j <= i} min(1, (m - j + 1) * p_(j))`` over the ascending order; arms with a
    ``None``/NaN p-value are not part of the family and stay ``None``.
    """
    defined = {k: float(v) for k, v in p_values.items() if v is not None and math.isfinite(v)}
    out: dict[str, float | None] = {k: None for k in p_values}
    m = len(defined)
    running = 0.0
    for rank, (name, p) in enumerate(sorted(defined.items(), key=lambda kv: (kv[1], kv[0]))):
        running = max(running, min(1.0, (m - rank) * p))
        out[name] = running
    return out


def verdict_for(
    slope_ci: Sequence[float] | None,
    interaction_ci: Sequence[float] | None,
    *,
    higher_is_better: bool = True,
) -> str:
    """The verdict rule of PROTOCOL.md §2, for one arm.

    With ``higher_is_better`` (accuracy), "worse as B grows" is a negative slope: ``supported`` when the
    slope CI and the interaction CI both lie strictly below 0, ``refuted`` when the slope CI lies at
    or above 0, else ``inconclusive``. With ``higher_is_better=False`` (a loss) every sign flips:
    ``supported`` when both CIs lie strictly above 0, ``refuted`` when the slope CI lies at or below 0.
    A missing CI (too little data) gives ``inconclusive`` unless the slope CI alone refutes.
    """
    sign = 1.0 if higher_is_better else -1.0

    def oriented(ci: Sequence[float] | None) -> tuple[float, float] | None:
        # Map the CI onto the "goodness" scale, where the hypothesis direction is always negative.
        if ci is None or any(v is None or not math.isfinite(v) for v in ci):
            return None
        lo, hi = sorted((sign * float(ci[0]), sign * float(ci[1])))
        return lo, hi

    s = oriented(slope_ci)
    i = oriented(interaction_ci)
    if s is not None and i is not None and s[1] < 0 and i[1] < 0:
        return "supported"
    if s is not None and s[0] >= 0:
        return "refuted"
    return "inconclusive"


def gate_entropy(probs: np.ndarray | Sequence[float], *, axis: int = -1) -> np.ndarray:
    """Shannon entropy ``-sum p log p`` (natural log) of gate probabilities along ``axis``.

    Use it on ``softmax(logits)``, never on Gumbel samples (PROTOCOL.md §1). ``0 log 0`` is 0, so a
    collapsed gate has entropy exactly 0; a uniform 2-way gate has ``ln 2``.
    """
    p = np.asarray(probs, dtype=float)
    if np.any(p < 0):
        raise ValueError("gate probabilities must be non-negative")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.asarray(-terms.sum(axis=axis))


def _arm_rng(seed: int, arm: str, stream: int) -> np.random.Generator:
    # Derived from the arm's name (not its position) so adding an arm does not change another's CI.
    return np.random.default_rng([int(seed), zlib.crc32(arm.encode()), stream])


def _cluster_bootstrap_slopes(
    x: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Slopes of ``y`` on ``x`` refitted on ``n_boot`` resamples of whole groups (seeds).

    A resample draws the seeds with replacement; a seed drawn k times enters the fit with weight k,
    which is the same as repeating its rows k times, so all resamples are one weighted least-squares
    computation. Resamples whose points have a single distinct ``x`` give NaN, and so does every
    resample when there is only one group: resampling one seed says nothing about seed-to-seed
    variation.
    """
    uniq, gidx = np.unique(groups, return_inverse=True)
    n_groups = uniq.size
    if n_groups < 2:
        return np.full(n_boot, np.nan)
    counts = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(float)
    w = counts[:, gidx]  # (n_boot, n_points)
    xc = x - x.mean()
    yc = y - y.mean()
    sw = w.sum(axis=1)
    xm = (w @ xc) / sw
    ym = (w @ yc) / sw
    sxx = w @ (xc * xc) - sw * xm * xm
    sxy = w @ (xc * yc) - sw * xm * ym
    scale = max(1.0, float(np.abs(xc).max()) ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.where(sxx > 1e-9 * scale * sw, sxy / sxx, np.nan)
    return np.asarray(slopes)


def _percentile_ci(samples: np.ndarray, confidence: float) -> list[float] | None:
    finite = samples[np.isfinite(samples)]
    # Too few defined resamples means the data cannot support an interval at all.
    if finite.size < max(10, samples.size // 2):
        return None
    alpha = 1.0 - confidence
    lo, hi = np.quantile(finite, [alpha / 2.0, 1.0 - alpha / 2.0])
    return [float(lo), float(hi)]


def _permutation_p_value(
    x: np.ndarray,
    d: np.ndarray,
    groups: np.ndarray,
    *,
    observed: float,
    n_perm: int,
    rng: np.random.Generator,
    negative: bool,
    chunk: int = 2048,
) -> float:
    """One-sided p-value of the slope of ``d`` on ``x``, shuffling ``x`` within each group.

    The multiset of ``x`` is unchanged by the shuffle, so the centred ``x`` and ``sum (x - mean)^2``
    are constants and each permuted slope is one dot product. ``p = (1 + #{perm at least as extreme})
    / (1 + n_perm)`` (Phipson & Smyth 2010), which is never 0.
    """
    xc = x - x.mean()
    sxx = float(xc @ xc)
    dc = d - d.mean()
    order = np.argsort(groups, kind="stable")
    g_sorted = groups[order]
    bounds = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1], True])
    tol = 1e-10 * max(1.0, abs(observed))
    hits = 0
    done = 0
    while done < n_perm:
        m = min(chunk, n_perm - done)
        perm_x = np.empty((m, x.size))
        for a, b in itertools.pairwise(bounds):
            idx = order[a:b]
            perm_x[:, idx] = rng.permuted(np.broadcast_to(xc[idx], (m, idx.size)), axis=1)
        slopes = perm_x @ dc / sxx
        hits += int(np.count_nonzero(slopes <= observed + tol if negative else slopes >= observed - tol))
        done += m
    return (1.0 + hits) / (1.0 + n_perm)


def _finite_or_none(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def normalize_table(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Validate a trial table and add ``value`` (the metric as float), ``ok`` (completed and finite) and ``log2_b``.

    Raises:
        ValueError: a required column is missing or a batch size is not positive.
    """
    missing = [c for c in _REQUIRED_COLUMNS if c not in table.columns]
    value_col = metric if metric in table.columns else "metric" if "metric" in table.columns else None
    if missing or value_col is None:
        need = [*_REQUIRED_COLUMNS, f"{metric!r} or 'metric'"]
        raise ValueError(f"table is missing columns {missing or [metric]}; required: {need}")
    df = table.loc[:, list(_REQUIRED_COLUMNS)].copy()
    df["value"] = pd.to_numeric(table[value_col], errors="coerce").astype(float)
    df["batch_size"] = pd.to_numeric(df["batch_size"], errors="raise")
    if (df["batch_size"] <= 0).any():
        raise ValueError("batch_size must be positive (its log2 is the regressor)")
    df["arm"] = df["arm"].astype(str)
    status_ok = df["status"].astype(str).str.lower().isin(COMPLETED_STATUSES)
    df["ok"] = status_ok & np.isfinite(df["value"].to_numpy())
    df["log2_b"] = np.log2(df["batch_size"].to_numpy(dtype=float))
    return df


def batchsize_trend(
    table: pd.DataFrame,
    *,
    control: str = "linear",
    metric: str = "test_accuracy",
    higher_is_better: bool = True,
    n_boot: int = 2000,
    seed: int = 0,
    n_perm: int = 9999,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Test the batch-size hypothesis per arm and return the ``verdict.json`` dictionary.

    Per arm, over its completed trials: Spearman ρ of the metric vs B; the OLS slope of the metric vs
    ``log2 B`` over all points with a seed-resampling bootstrap CI; and, against ``control``, the
    interaction — the OLS slope vs ``log2 B`` of the paired differences ``metric(arm) -
    metric(control)`` over the ``(B, seed)`` cells where both completed — with a bootstrap CI and a
    one-sided permutation p-value in the hypothesis direction. p-values are Holm-adjusted across the
    non-control arms.

    Sign convention: slopes are always reported on the metric's own scale. The hypothesis direction
    ("worse as B grows") is a *negative* slope when ``higher_is_better`` and a *positive* one
    otherwise (a loss); the verdict rule and the one-sided p-value follow that direction, and the
    returned ``direction`` field says which it was.

    Args:
        table: one row per trial with columns ``arm``, ``batch_size``, ``seed``, ``status`` and the
            metric — a column named ``metric`` (the argument) or, failing that, ``"metric"``.
        control: the arm the interaction is measured against; it must be in the table.
        metric: the metric's name (and column, when present).
        higher_is_better: whether larger metric values are better (accuracy) or worse (loss).
        n_boot: bootstrap resamples of seeds.
        seed: seeds every random draw (bootstrap and permutations), per arm.
        n_perm: permutations for the interaction p-value; at least 9,999 for a confirmatory run.
        confidence: two-sided level of the percentile bootstrap intervals.

    Returns:
        ``{"hypothesis", "metric", "control", "higher_is_better", "direction", "confidence", "n_boot",
        "n_perm", "seed", "arms": {arm: {...}}, "verdict": {arm: "supported" | "refuted" |
        "inconclusive"}}``; per arm ``n`` (completed), ``n_failed``, ``spearman_rho``, ``slope``,
        ``slope_ci``, ``interaction``, ``interaction_ci``, ``n_pairs``, ``p_value``,
        ``p_value_holm``, ``batch_sizes``, ``n_seeds``; ``warnings`` lists arms with fewer than
        :data:`MIN_SEEDS` seeds or with failed trials. Undefined numbers are ``None`` (JSON null); the control's
        interaction fields are always ``None``.

    Raises:
        ValueError: a required column is missing, ``control`` is not an arm of the table, or an
            argument is out of range.
    """
    if n_boot < 1 or n_perm < 1:
        raise ValueError(f"n_boot and n_perm must be >= 1, got n_boot={n_boot}, n_perm={n_perm}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    df = normalize_table(table, metric)
    arms = sorted(df["arm"].unique())
    if control not in arms:
        raise ValueError(f"control arm {control!r} is not in the table; arms: {arms}")
    negative = higher_is_better

    ok = df[df["ok"]]
    ctrl = ok[ok["arm"] == control].groupby(["batch_size", "seed"])["value"].mean()

    results: dict[str, dict[str, Any]] = {}
    for arm in arms:
        rows = df[df["arm"] == arm]
        good = rows[rows["ok"]]
        x = good["log2_b"].to_numpy(dtype=float)
        y = good["value"].to_numpy(dtype=float)
        groups = good["seed"].astype(str).to_numpy()
        res: dict[str, Any] = {
            "n": len(good),
            "n_failed": int(len(rows) - len(good)),
            "n_seeds": int(good["seed"].nunique()),
            "batch_sizes": sorted(int(b) for b in rows["batch_size"].unique()),
            "spearman_rho": None,
            "slope": None,
            "slope_ci": None,
            "interaction": None,
            "interaction_ci": None,
            "n_pairs": None,
            "p_value": None,
            "p_value_holm": None,
        }
        if len(good) >= 2 and np.unique(x).size >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # constant input: rho is undefined, reported as null
                rho = stats.spearmanr(good["batch_size"].to_numpy(dtype=float), y).statistic
            res["spearman_rho"] = _finite_or_none(float(rho))
            res["slope"] = _finite_or_none(ols_slope(x, y))
            boot = _cluster_bootstrap_slopes(x, y, groups, n_boot=n_boot, rng=_arm_rng(seed, arm, 0))
            res["slope_ci"] = _percentile_ci(boot, confidence)

        if arm != control:
            mine = good.groupby(["batch_size", "seed"])["value"].mean()
            diff = (mine - ctrl).dropna()  # inner join on (B, seed): cells where both completed
            res["n_pairs"] = len(diff)
            if len(diff) >= 2:
                dx = np.log2(diff.index.get_level_values("batch_size").to_numpy(dtype=float))
                dy = diff.to_numpy(dtype=float)
                dg = diff.index.get_level_values("seed").astype(str).to_numpy()
                inter = ols_slope(dx, dy)
                if math.isfinite(inter):
                    res["interaction"] = inter
                    boot_i = _cluster_bootstrap_slopes(dx, dy, dg, n_boot=n_boot, rng=_arm_rng(seed, arm, 1))
                    res["interaction_ci"] = _percentile_ci(boot_i, confidence)
                    res["p_value"] = _permutation_p_value(
                        dx,
                        dy,
                        dg,
                        observed=inter,
                        n_perm=n_perm,
                        rng=_arm_rng(seed, arm, 2),
                        negative=negative,
                    )
        results[arm] = res

    holm = holm_adjust({a: r["p_value"] for a, r in results.items() if a != control})
    for arm, p in holm.items():
        results[arm]["p_value_holm"] = p

    warns = []
    for arm, r in results.items():
        if r["n_seeds"] < MIN_SEEDS:
            warns.append(
                f"{arm}: {r['n_seeds']} seed(s) with completed trials; bootstrap CIs over fewer than "
                f"{MIN_SEEDS} seeds are unreliable, treat the verdict as exploratory"
            )
        if r["n_failed"]:
            warns.append(
                f"{arm}: {r['n_failed']} of {r['n'] + r['n_failed']} trials failed or diverged (excluded)"
            )
    verdict = {
        arm: verdict_for(r["slope_ci"], r["interaction_ci"], higher_is_better=higher_is_better)
        for arm, r in results.items()
    }
    return {
        "hypothesis": HYPOTHESIS,
        "metric": metric,
        "control": control,
        "higher_is_better": bool(higher_is_better),
        "direction": "negative" if negative else "positive",
        "confidence": float(confidence),
        "n_boot": int(n_boot),
        "n_perm": int(n_perm),
        "seed": int(seed),
        "arms": results,
        "verdict": verdict,
        "warnings": warns,
    }
