"""The statistics of one arm under one budget of the batch-size analysis: the per-seed slope and
Spearman rho of its metric against ``log2 B`` and, against the control, the interaction (the
per-seed slope of the paired differences) with its permutation and t-test p (:func:`arm_statistics`);
the sequential looks over the fix arms' per-seed interactions (:func:`interaction_looks`). The
gates and verdicts are :mod:`studies.kinds.batchsize.analysis`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from studies.kinds.batchsize.seedstats import arm_rng, none_if_nan, row_slopes, row_spearman
from studies.stats import (
    EXACT_PERMUTATION_LIMIT,
    fisher_z_interval,
    log_n_permutations,
    permutation_p_value,
    seed_interval,
    sequential_looks,
    t_test_p,
)

__all__ = ["arm_statistics", "cell_key", "interaction_looks"]


def cell_key(b: float) -> str:
    """A batch size as the key of its cell in a result (``32``, not ``32.0``)."""
    return str(int(b)) if float(b).is_integer() else str(b)


def arm_statistics(
    v: np.ndarray,
    d: np.ndarray | None,
    x: np.ndarray,
    *,
    negative: bool,
    n_perm: int,
    n_boot: int,
    confidence: float,
    seed: int,
    salt: str,
) -> dict[str, Any]:
    """Slope, Spearman and (with paired differences ``d``) interaction statistics of one arm.

    ``spearman_rho`` is the mean per-seed rho, ``spearman_rho_ci`` its interval on the Fisher-z scale
    (:func:`studies.stats.fisher_z_interval`: inside [-1, 1], ``None`` below 3 seeds)."""
    slopes = row_slopes(x, v)
    slope, slope_ci, ci_method = seed_interval(
        slopes, confidence=confidence, n_boot=n_boot, rng=arm_rng(seed, salt, 0)
    )
    rhos = row_spearman(v)
    finite_rhos = rhos[np.isfinite(rhos)]
    rho = float(finite_rhos.mean()) if finite_rhos.size else math.nan
    # On the Fisher-z scale, back-transformed: always inside [-1, 1]; None below 3 seeds.
    rho_ci = fisher_z_interval(finite_rhos, confidence=confidence)
    out: dict[str, Any] = {
        "n_seeds": int(np.isfinite(slopes).sum()),
        "slope": none_if_nan(slope),
        "slope_ci": slope_ci,
        "ci_method": ci_method,
        "spearman_rho": none_if_nan(rho),
        "spearman_rho_ci": rho_ci,
        "interaction": None,
        "interaction_ci": None,
        "n_pairs": None,
        "p_value": None,
        "p_value_permutation": None,
        "p_value_t": None,
        "permutation": None,
        "n_permutations": None,
        "min_attainable_p": None,
    }
    if d is None:
        return out
    out["n_pairs"] = int(np.isfinite(d).sum())
    d_slopes = row_slopes(x, d)
    inter, inter_ci, _ = seed_interval(
        d_slopes, confidence=confidence, n_boot=n_boot, rng=arm_rng(seed, salt, 2)
    )
    out["interaction"] = none_if_nan(inter)
    out["interaction_ci"] = inter_ci
    out["interaction_by_seed"] = [none_if_nan(float(v)) for v in d_slopes]
    rows = [(x[np.isfinite(r)], r[np.isfinite(r)]) for r in d]
    rows = [(xx, rr) for xx, rr in rows if xx.size >= 2]
    if rows:
        log_n = log_n_permutations([xx for xx, _ in rows])
        exact = log_n <= math.log(EXACT_PERMUTATION_LIMIT) + 1e-9
        min_p = math.exp(-log_n) if exact else max(math.exp(-log_n), 1.0 / (n_perm + 1))
        out["min_attainable_p"] = min_p
        p_perm, method, count = permutation_p_value(
            [xx for xx, _ in rows],
            [rr for _, rr in rows],
            negative=negative,
            n_perm=n_perm,
            rng=arm_rng(seed, salt, 3),
        )
        p_t = t_test_p(d_slopes, negative=negative)
        out.update(
            p_value_permutation=p_perm,
            p_value_t=p_t,
            permutation=method,
            n_permutations=count,
            p_value=max(p_perm, p_t) if p_t is not None else p_perm,
        )
    return out


def interaction_looks(
    arms: Mapping[str, Mapping[str, Any]],
    fix_arms: Sequence[str],
    seeds: Sequence[str],
    sequential: Mapping[str, Any] | None,
    *,
    alpha: float,
    negative: bool,
) -> list[dict[str, Any]]:
    """Every look of a sequential design over the fix arms' per-seed interaction slopes."""
    if sequential is None or not fix_arms:
        return []
    order = [str(s) for s in sequential["seed_order"]]
    position = {s: i for i, s in enumerate(seeds)}
    values: dict[str, list[float]] = {}
    for arm in fix_arms:
        by_seed = arms[arm].get("interaction_by_seed") or []
        picked = [by_seed[position[s]] for s in order if s in position and position[s] < len(by_seed)]
        values[arm] = [float(v) for v in picked if v is not None]
    planned = [n for n in sequential["looks"]]
    have = max((len(v) for v in values.values()), default=0)
    if have < planned[0]:
        return []
    looks = sequential_looks(
        values,
        looks=planned,
        alpha=alpha,
        alternatives=dict.fromkeys(fix_arms, "less" if negative else "greater"),
        min_effect=sequential.get("min_effect"),
        prior_scale=float(sequential.get("prior_scale", 1.0)),
        stop_early=False,
    )
    for look in looks:  # strict JSON: an unbounded interval (too few seeds) has None bounds
        for h in look["hypotheses"].values():
            h["ci"] = [none_if_nan(v) for v in h["ci"]]
    return looks
