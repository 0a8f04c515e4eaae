"""The gate logs of the claims study and what claims c and d measure in them: the per-epoch gate
arrays of a trial, the slope of the final DyT weight against depth (:func:`dyt_depth_slope`, claim c)
and the epoch each layer's gate collapses to LayerNorm (:func:`collapse_epochs`, claim d), with the
order-statistic CI of a median. The verdicts are :mod:`studies.kinds.search.claims`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from studies.kinds.search.values import check_confidence, float_or_none, seed_key, to_float
from studies.stats import paired_contrast

__all__ = ["binom", "collapse_epochs", "dyt_depth_slope", "gate_arrays", "median_ci", "seeds_of"]


def binom() -> Any:
    """``scipy.stats.binom``, imported on first use (validating a spec reads the claims module's
    tables but never needs SciPy's ~0.4 s import)."""
    from scipy import stats

    return stats.binom


def dyt_depth_slope(
    final_dyt_weight: Mapping[Any, Sequence[float] | np.ndarray],
    *,
    confidence: float = 0.95,
    n_mc: int = 99_999,
    seed: int = 0,
) -> dict[str, Any]:
    """Claim (c) for one sub-layer type: does the gate's DyT weight grow with depth?

    Per seed, the OLS slope of the final DyT weight against the block index ``0..n_blocks − 1``; then
    the mean slope over seeds, its t-interval (K − 1 df) and the one-sided (greater) sign-flip p, i.e.
    :func:`paired_contrast` of the slopes against zero.

    Args:
        final_dyt_weight: seed → the final-epoch DyT weight of each block, in block order (all seeds
            the same number of blocks, at least 2).
        confidence: level of the t-interval.
        n_mc: Monte-Carlo sign patterns above 2^20.
        seed: seeds the Monte-Carlo draws.

    Returns:
        ``{"slopes": {seed: slope}, "estimate", "ci", "p_value", "n_seeds", "n_blocks", "method"}``.

    Raises:
        ValueError: fewer than 2 seeds or blocks, unequal block counts, non-finite weights.
    """
    # Seeds in a fixed order (as the contrasts sort them): beyond 2^20 sign patterns the p-value is
    # Monte Carlo, whose draws pair with the values in order, so the order must not depend on how
    # the logs were read (it did: a 24-seed study's p came out 0.00136 and 0.00116 on rereading).
    weights = {
        seed_key(s): np.asarray(w, dtype=float).ravel()
        for s, w in sorted(final_dyt_weight.items(), key=lambda item: str(seed_key(item[0])))
    }
    sizes = {w.size for w in weights.values()}
    if len(sizes) != 1:
        raise ValueError(f"every seed needs the same number of blocks, got sizes {sorted(sizes)}")
    (n_blocks,) = sizes
    if n_blocks < 2:
        raise ValueError(f"a slope needs at least 2 blocks, got {n_blocks}")
    if not all(np.isfinite(w).all() for w in weights.values()):
        raise ValueError("final DyT weights must be finite")
    depth = np.arange(n_blocks, dtype=float)
    centred = depth - depth.mean()
    slopes = {s: float(centred @ (w - w.mean()) / (centred @ centred)) for s, w in weights.items()}
    values = np.array(list(slopes.values()))
    test = paired_contrast(
        values, np.zeros_like(values), alternative="greater", confidence=confidence, n_mc=n_mc, seed=seed
    )
    return {
        "slopes": slopes,
        "estimate": test["estimate"],
        "ci": test["ci"],
        "p_value": test["p_value"],
        "n_seeds": test["n_seeds"],
        "n_blocks": int(n_blocks),
        "method": test["method"],
    }


def median_ci(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Distribution-free CI of the median from order statistics ``[X_(r), X_(K+1−r)]``.

    ``r`` is the largest rank whose coverage ``1 − 2 P(Bin(K, 1/2) ≤ r − 1)`` reaches ``confidence``;
    when even ``[min, max]`` does not, that interval is returned with its (lower) coverage. Being
    rank-based it handles censored values (``inf`` = "never") exactly.
    """
    x = np.sort(values)
    k = x.size
    r = 1
    for cand in range(1, k // 2 + 1):
        if 1.0 - 2.0 * float(binom().cdf(cand - 1, k, 0.5)) >= confidence:
            r = cand
    coverage = 1.0 - 2.0 * float(binom().cdf(r - 1, k, 0.5))
    return float(x[r - 1]), float(x[k - r]), coverage


def _first_collapse(entropy: np.ndarray, ln_weight: np.ndarray, eps: float) -> np.ndarray:
    """First epoch (1-based) per layer with entropy < eps and LN weight > 0.5; ``inf`` if never."""
    hit = (entropy < eps) & (ln_weight > 0.5)  # NaN compares False: a diverged epoch is no collapse
    first = np.argmax(hit, axis=0).astype(float) + 1.0
    first[~hit.any(axis=0)] = math.inf
    return first


def collapse_epochs(
    entropy_by_epoch: Mapping[Any, Sequence[Sequence[float]] | np.ndarray],
    ln_weight_by_epoch: Mapping[Any, Sequence[Sequence[float]] | np.ndarray],
    *,
    eps: float = 0.1,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Claim (d)'s measurement: when does each layer's gate collapse to LayerNorm?

    A layer has collapsed at the first epoch where its gate entropy is below ``eps`` AND its LN
    weight exceeds 0.5 (a gate that collapses onto DyT never counts). Epochs are 1-based: row ``i``
    of a seed's array is epoch ``i + 1``. A layer that never collapses is "never" (``None``): it is
    counted, as a value above every epoch, in the medians and their order-statistic CIs.

    Args:
        entropy_by_epoch: seed → ``(n_epochs, n_layers)`` gate entropy per epoch and layer (natural
            log, noise-free probabilities; ``gate_entropy/layer_<i>`` of the training loop).
        ln_weight_by_epoch: seed → ``(n_epochs, n_layers)`` LN weight, same shape per seed.
        eps: entropy threshold (0.1).
        confidence: level of the median CIs.

    Returns:
        ``{"eps", "n_seeds", "n_layers", "layers": [{"layer", "epochs": {seed: epoch | None},
        "n_never", "median", "ci": [lo, hi], "ci_coverage"}, ...], "per_seed_median": {seed: m | None}}``
        where ``per_seed_median`` is the median over layers of each seed's collapse epochs (the
        statistic of claim d), ``None`` meaning "never" (or a median beyond the last epoch).

    Raises:
        ValueError: different seeds or shapes in the two mappings, no seeds, not 2-D.
    """
    check_confidence(confidence)
    if set(map(seed_key, entropy_by_epoch)) != set(map(seed_key, ln_weight_by_epoch)):
        raise ValueError("entropy_by_epoch and ln_weight_by_epoch must have the same seeds")
    if not entropy_by_epoch:
        raise ValueError("no seeds")
    ln_by_key = {seed_key(s): np.asarray(v, dtype=float) for s, v in ln_weight_by_epoch.items()}
    firsts: dict[int | str, np.ndarray] = {}
    n_layers: int | None = None
    for s, ent in entropy_by_epoch.items():
        key = seed_key(s)
        h = np.asarray(ent, dtype=float)
        w = ln_by_key[key]
        if h.ndim != 2 or h.shape != w.shape:
            raise ValueError(f"seed {key!r}: need two (n_epochs, n_layers) arrays, got {h.shape}, {w.shape}")
        if n_layers is not None and h.shape[1] != n_layers:
            raise ValueError(f"seed {key!r} has {h.shape[1]} layers, others {n_layers}")
        n_layers = h.shape[1]
        firsts[key] = _first_collapse(h, w, eps)
    assert n_layers is not None  # entropy_by_epoch is not empty
    layers = []
    for j in range(n_layers):
        per_seed = np.array([f[j] for f in firsts.values()])
        lo, hi, coverage = median_ci(per_seed, confidence)
        layers.append(
            {
                "layer": j,
                "epochs": {s: float_or_none(f[j]) for s, f in firsts.items()},
                "n_never": int(np.isinf(per_seed).sum()),
                "median": float_or_none(np.median(per_seed)),
                "ci": [float_or_none(lo), float_or_none(hi)],
                "ci_coverage": coverage,
            }
        )
    return {
        "eps": eps,
        "n_seeds": len(firsts),
        "n_layers": n_layers,
        "layers": layers,
        "per_seed_median": {s: float_or_none(np.median(f)) for s, f in firsts.items()},
    }


# ----------------------------------------------------------------------------------- gate logs

_LAYER_NAMES = ("gate_entropy", "dyt_weight", "ln_weight")
_LAYER_KEY = re.compile(rf"^({'|'.join(_LAYER_NAMES)})/layer_(\d+)$")


def layer_count(rows: Iterable[Mapping[str, Any]], names: Collection[str] = _LAYER_NAMES) -> int:
    """How many layers ``rows`` log a ``<name>/layer_<i>`` of ``names`` for: 1 + the largest ``i``."""
    found = (_LAYER_KEY.match(str(key)) for row in rows for key in row)
    return max((int(m.group(2)) + 1 for m in found if m and m.group(1) in names), default=0)


def gate_arrays(rows: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Per-epoch result rows → ``{"entropy", "dyt", "ln"}`` arrays of shape (n_epochs, n_layers)."""
    ordered = sorted(rows, key=lambda r: to_float(r.get("epoch", 0.0))) if rows else []
    n_layers = layer_count(ordered)

    def grid(name: str) -> np.ndarray:
        return np.array(
            [[to_float(row.get(f"{name}/layer_{j}", math.nan)) for j in range(n_layers)] for row in ordered],
            dtype=float,
        ).reshape(len(ordered), n_layers)

    dyt = grid("dyt_weight")
    has_ln = any(f"ln_weight/layer_{j}" in row for row in ordered for j in range(n_layers))
    ln = grid("ln_weight") if has_ln else 1.0 - dyt  # two candidates (dyt, layernorm): w_LN = 1 − w_DyT
    return {"entropy": grid("gate_entropy"), "dyt": dyt, "ln": ln}


def seeds_of(
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]], arm: str
) -> dict[int | str, Any]:
    return {seed_key(s): rows for (a, s), rows in gate_logs.items() if a == arm}
