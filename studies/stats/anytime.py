"""Sequential designs (the protocol's §4): the normal-mixture t-test, anytime-valid for unknown
variance (Wang & Ramdas, arXiv 2310.03722, Thm 4.9; the ``safestats`` R package), for one
hypothesis and for a family with Holm at every look, the replay of a study's looks and the
expected seed count of a sequential plan."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from studies.stats._checks import Alternative, _check_alpha, _check_alternative
from studies.stats.multiplicity import holm

__all__ = [
    "DECISIONS",
    "confidence_sequence",
    "expected_seeds",
    "mixture_log_e_values",
    "sequential_family",
    "sequential_looks",
    "sequential_test",
]

#: Decisions of a sequential look: ``reject`` (the null is rejected at its Holm level), ``futile``
#: (the confidence sequence excludes every effect of at least ``min_effect`` in the predicted
#: direction), ``continue`` (undecided, more seeds planned), ``inconclusive`` (undecided at the last look).
DECISIONS = ("reject", "futile", "continue", "inconclusive")


def _check_prior_scale(prior_scale: float) -> None:
    if isinstance(prior_scale, bool) or not (
        isinstance(prior_scale, int | float) and math.isfinite(prior_scale) and prior_scale > 0
    ):
        raise ValueError(f"prior_scale must be finite and > 0, got {prior_scale!r}")


def _prefix_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and sample sd of every prefix ``x[..., :k]``, k = 1..n, along the last axis (sd NaN at k = 1).

    Shifted by the overall mean first so that the running sums of squares lose no digits."""
    n = x.shape[-1]
    shift = x.mean(axis=-1, keepdims=True)
    y = x - shift
    k = np.arange(1, n + 1, dtype=float)
    s1 = np.cumsum(y, axis=-1)
    s2 = np.cumsum(y * y, axis=-1)
    mean_y = s1 / k
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(k > 1, np.maximum(s2 - k * mean_y * mean_y, 0.0) / (k - 1), np.nan)
    return k, mean_y + shift, np.sqrt(var)


def _log_e(n: np.ndarray, mean: np.ndarray, sd: np.ndarray, mu0: float, g: float) -> np.ndarray:
    """log E_n of the normal-mixture t-test (the protocol's §4), elementwise; 0 (E = 1) below n = 2.

    ``E_n = c^(-1/2) [(1 + t^2/nu) / (1 + t^2/(nu c))]^(n/2)`` with ``c = 1 + n g``, ``nu = n - 1``,
    ``t = sqrt(n) (mean - mu0) / sd``. Zero spread with a mean off ``mu0`` is the limit t -> inf,
    ``E_n = c^((n - 1)/2)``, the largest value n values can give.
    """
    n = np.asarray(n, dtype=float)
    c = 1.0 + n * g
    nu = np.maximum(n - 1.0, 1.0)
    diff = np.asarray(mean, dtype=float) - mu0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        u = n * diff * diff / (nu * sd * sd)  # t^2 / nu
        u = np.where(sd > 0, u, np.where(diff == 0, 0.0, np.inf))
        finite = 0.5 * n * (np.log1p(u) - np.log1p(u / c)) - 0.5 * np.log(c)
        log_e = np.where(np.isinf(u), 0.5 * (n - 1.0) * np.log(c), finite)
    return np.where(n >= 2, log_e, 0.0)


def _directional(log_e: np.ndarray, mean: np.ndarray, mu0: float, alternative: str) -> np.ndarray:
    """log E restricted to means on the alternative's side (-inf elsewhere): a one-sided test rejects
    only there, a subset of the two-sided rejection region, so its error stays below alpha."""
    if alternative == "less":
        return np.where(mean < mu0, log_e, -np.inf)
    if alternative == "greater":
        return np.where(mean > mu0, log_e, -np.inf)
    return log_e


def mixture_log_e_values(
    values: Sequence[float] | np.ndarray,
    *,
    mu0: float = 0.0,
    prior_scale: float = 1.0,
    alternative: Alternative = "two-sided",
) -> np.ndarray:
    """log e-value ``log E_k`` of the mixture t-test of mean ``mu0`` after each prefix of ``values``.

    Under the null (normal values of mean ``mu0``, any variance) ``E_k`` is a test martingale, so
    ``P(exists k: E_k >= 1/alpha) <= alpha`` under any stopping rule (Ville's inequality).
    ``prior_scale`` is the mixture's g (the standardised effect is mixed over N(0, g)). A one-sided
    ``alternative`` sets ``E_k = 0`` (log -inf) where the prefix mean is on the wrong side.

    Returns:
        ``log E_1 .. log E_n`` (``log E_1 = 0``: one value has no spread); along the last axis when
        ``values`` is 2-D (one row per simulated study).
    """
    _check_prior_scale(prior_scale)
    _check_alternative(alternative)
    x = np.asarray(values, dtype=float)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("values must hold at least one number")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite (score failed trials before testing)")
    k, mean, sd = _prefix_moments(x)
    return _directional(_log_e(k, mean, sd, mu0, float(prior_scale)), mean, mu0, alternative)


def confidence_sequence(
    values: Sequence[float] | np.ndarray, *, alpha: float, prior_scale: float = 1.0
) -> tuple[float, float]:
    """The mixture t-test's two-sided confidence sequence for the mean after all of ``values``.

    Inverting ``E_n(mu) < 1/alpha``: with ``c = 1 + n g``, ``K = (c / alpha^2)^(1/n)`` and
    ``W = nu (K - 1) / (1 - K/c)``, ``mu`` lies in ``mean +- sd / sqrt(n) * sqrt(W)``. The intervals of
    every n hold the true mean at once with probability >= 1 - alpha. Unbounded (``-inf, inf``) while
    ``K >= c``, i.e. with too few values (g = 1, alpha = 0.05: fewer than 5), and below 2 values.
    """
    _check_alpha(alpha)
    _check_prior_scale(prior_scale)
    x = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(x).all():
        raise ValueError("values must be finite (score failed trials before testing)")
    n = x.size
    if n < 2:
        return -math.inf, math.inf
    mean = float(x.mean())
    sd = float(x.std(ddof=1))
    c = 1.0 + n * prior_scale
    log_k = (math.log(c) - 2.0 * math.log(alpha)) / n
    if log_k >= math.log(c):
        return -math.inf, math.inf
    kk = math.exp(log_k)
    w = (n - 1) * (kk - 1.0) / (1.0 - kk / c)
    half = sd / math.sqrt(n) * math.sqrt(w)
    return mean - half, mean + half


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(n) for n in looks)
    if not out or any(isinstance(n, bool) or int(n) != n for n in looks):
        raise ValueError(f"looks must be a non-empty list of seed counts, got {list(looks)!r}")
    if out[0] < 1 or any(b <= a for a, b in itertools.pairwise(out)):
        raise ValueError(f"looks must be positive and strictly ascending, got {list(out)}")
    return out


def _futile(ci: tuple[float, float], alternative: str, min_effect: float | None) -> bool:
    """The interval excludes every effect of at least ``min_effect`` in the predicted direction."""
    if min_effect is None:
        return False
    lo, hi = ci
    if alternative == "less":
        return lo > -min_effect
    if alternative == "greater":
        return hi < min_effect
    return lo > -min_effect and hi < min_effect


def _check_min_effect(min_effect: float | None) -> None:
    if min_effect is not None and not (
        not isinstance(min_effect, bool)
        and isinstance(min_effect, int | float)
        and math.isfinite(min_effect)
        and min_effect > 0
    ):
        raise ValueError(f"min_effect must be finite and > 0 (or None), got {min_effect!r}")


def _anytime_p(log_e: np.ndarray) -> float:
    best = float(np.max(log_e))
    return 1.0 if best <= 0 else float(min(1.0, math.exp(-best)))


def sequential_test(
    values: Sequence[float] | np.ndarray,
    *,
    looks: Sequence[int],
    alpha: float,
    alternative: Alternative,
    min_effect: float | None = None,
    prior_scale: float = 1.0,
) -> dict[str, Any]:
    """One hypothesis's decision at a look of a sequential study (the anytime-valid mixture t-test).

    Args:
        values: the per-seed values so far, in seed order (paired differences, per-seed slopes);
            ``len(values)`` must be one of ``looks``.
        looks: the planned seed counts, ascending; the last is the maximum.
        alpha: the level (for one hypothesis; :func:`sequential_family` applies Holm to a family).
        alternative: ``"less"``, ``"greater"`` (one-sided, for the mean) or ``"two-sided"``.
        min_effect: the smallest effect worth finding; ``None`` = no futility stop.
        prior_scale: the mixture's g (the standardised effect ~ N(0, g)); 1 by default.

    Returns:
        ``{"decision", "p_value", "ci": [low, high]}``: ``p_value`` is the anytime-valid p so far
        (``min(1, 1 / max_k E_k)`` over every prefix, on the alternative's side), ``ci`` the two-sided
        confidence sequence at level 1 - ``alpha`` (infinite bounds while too few values).
        ``decision``: ``reject`` when ``p_value <= alpha``; else ``futile`` when ``ci`` excludes every
        effect of size ``min_effect`` or more in the alternative's direction; else ``inconclusive``
        at the last look and ``continue`` before it.

    Guarantees, for normal values with unknown variance: any look says ``reject`` under mean 0 with
    probability at most ``alpha`` (whatever the looks); ``ci`` holds the true mean at every look at
    once with probability at least 1 - ``alpha``.

    Raises:
        ValueError: non-finite values, ``len(values)`` not a planned look, bad options.
    """
    _check_alpha(alpha)
    _check_alternative(alternative)
    _check_min_effect(min_effect)
    planned = _check_looks(looks)
    x = np.asarray(values, dtype=float).ravel()
    if x.size not in planned:
        raise ValueError(f"len(values) = {x.size} is not one of the planned looks {list(planned)}")
    log_e = mixture_log_e_values(x, prior_scale=prior_scale, alternative=alternative)
    p = _anytime_p(log_e)
    ci = confidence_sequence(x, alpha=alpha, prior_scale=prior_scale)
    decision = _decide(p <= alpha, ci, alternative, min_effect, last=x.size == planned[-1])
    return {"decision": decision, "p_value": p, "ci": [ci[0], ci[1]]}


def _decide(
    rejected: bool, ci: tuple[float, float], alternative: str, min_effect: float | None, *, last: bool
) -> str:
    if rejected:
        return "reject"
    if _futile(ci, alternative, min_effect):
        return "futile"
    return "inconclusive" if last else "continue"


def sequential_family(
    values: Mapping[str, Sequence[float] | np.ndarray | None],
    *,
    looks: Sequence[int],
    alpha: float,
    alternatives: Mapping[str, Alternative],
    min_effect: float | Mapping[str, float | None] | None = None,
    prior_scale: float = 1.0,
    n_seeds: int | None = None,
    reported: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """Decisions for a family of hypotheses at one look, Holm over their anytime p-values.

    Each hypothesis's running anytime-valid p is a valid p-value at any stopping time, and Holm is
    monotone in them, so rejecting where the Holm-adjusted p is ``<= alpha`` keeps the family-wise
    error at most ``alpha`` over all looks; a rejection stays (the running p never rises).
    Futility is per hypothesis, on its own 1 - ``alpha`` confidence sequence (non-binding: stopping
    for futility never raises the type-I error).

    Args:
        values: hypothesis -> its per-seed values at this look (``None`` or fewer than 2 values:
            not testable yet, left out of Holm's family, ``continue``/``inconclusive``). A list may
            be shorter than the look's seed count (a seed without a value is left out).
        looks: the planned seed counts, ascending.
        alpha: the family-wise level.
        alternatives: hypothesis -> ``"less" | "greater" | "two-sided"``.
        min_effect: one value for all, or hypothesis -> value (``None``: no futility).
        prior_scale: the mixture's g.
        n_seeds: the look's seed count (default: the longest list); the look is the last when it
            reaches ``looks[-1]``, and there the undecided are ``inconclusive``.
        reported: hypotheses that are reported, not claimed (the protocol's §5): each is tested alone
            at ``alpha`` (its ``p_value_holm`` is its ``p_value``) and none enters the others' Holm.

    Returns:
        hypothesis -> ``{"decision", "p_value", "p_value_holm", "ci", "estimate", "n"}``.
    """
    _check_alpha(alpha)
    _check_prior_scale(prior_scale)
    planned = _check_looks(looks)
    arrays = {k: (None if v is None else np.asarray(v, dtype=float).ravel()) for k, v in values.items()}
    if n_seeds is None:
        n_seeds = max((a.size for a in arrays.values() if a is not None), default=0)
    last = n_seeds >= planned[-1]
    raw: dict[str, dict[str, Any]] = {}
    for name, x in arrays.items():
        alternative = alternatives[name]
        effect = min_effect.get(name) if isinstance(min_effect, Mapping) else min_effect
        _check_alternative(alternative)
        _check_min_effect(effect)
        r: dict[str, Any] = {"_alt": alternative, "_effect": effect, "n": 0 if x is None else int(x.size)}
        if x is None or x.size < 2:
            r.update(p_value=None, ci=(-math.inf, math.inf))
            r["estimate"] = None if x is None or x.size == 0 else float(x.mean())
        else:
            log_e = mixture_log_e_values(x, prior_scale=prior_scale, alternative=alternative)
            r.update(
                p_value=_anytime_p(log_e),
                ci=confidence_sequence(x, alpha=alpha, prior_scale=prior_scale),
                estimate=float(x.mean()),
            )
        raw[name] = r
    unknown = sorted(set(reported) - set(raw))
    if unknown:
        raise ValueError(f"reported hypotheses {unknown} are not in the family {sorted(raw)}")
    adjusted = holm({name: r["p_value"] for name, r in raw.items() if name not in reported})
    adjusted.update({name: raw[name]["p_value"] for name in reported})
    out: dict[str, dict[str, Any]] = {}
    for name, r in raw.items():
        p_holm = adjusted[name]
        ci = (float(r["ci"][0]), float(r["ci"][1]))
        decision = _decide(p_holm is not None and p_holm <= alpha, ci, r["_alt"], r["_effect"], last=last)
        out[name] = {
            "decision": decision,
            "p_value": r["p_value"],
            "p_value_holm": p_holm,
            "ci": [ci[0], ci[1]],
            "estimate": r["estimate"],
            "n": r["n"],
        }
    return out


def sequential_looks(
    values: Mapping[str, Sequence[float] | np.ndarray | None],
    *,
    looks: Sequence[int],
    stop_early: bool = True,
    reported: Collection[str] = (),
    **family: Any,
) -> list[dict[str, Any]]:
    """Replay a sequential study's looks from its per-seed values (in seed order).

    Look j uses the first ``looks[j]`` values of every hypothesis, decided by
    :func:`sequential_family` (``family``: its ``alpha``, ``alternatives``, ``min_effect``,
    ``prior_scale``), and then made final (the protocol's §5):

    - the interval of each hypothesis is the running intersection of its confidence sequences,
      ``CS*_n = CS_1 ∩ .. ∩ CS_n`` (valid at every n at once, like each ``CS_n``; it can only shrink);
      futility is read on it;
    - a hypothesis ``reject``ed or ``futile`` at a look keeps that decision (and its running-minimum
      Holm p) at every later look, whatever the later values say.

    Because ``reject`` needs ``E_k(0) >= 1/alpha`` at some look k, 0 lies outside ``CS_k`` and so outside
    the intersection: a rejection's interval always excludes the null on the predicted side.

    The replay ends at the first look where every *claimed* hypothesis (not in ``reported``) is
    decided — the study stops launching seeds there; a reported one never keeps it going — or at the
    last look the values reach (``stop_early=False``: always the latter, for a study that went on,
    e.g. extended, after a decided look). Deterministic, so a report regenerated from the trials
    repeats the study's own looks.

    Returns:
        ``[{"n_seeds", "hypotheses": {name: {decision, p_value, p_value_holm, ci, estimate, n,
        decided_at, reported}}, "stop": bool}, ...]``; ``decided_at`` is the seed count of the look
        that decided it (``None`` while undecided); ``stop`` is true on a look where every claimed
        hypothesis is decided or the last planned look.
    """
    planned = _check_looks(looks)
    arrays = {k: (None if v is None else np.asarray(v, dtype=float).ravel()) for k, v in values.items()}
    have = max((a.size for a in arrays.values() if a is not None), default=0)
    claimed = [k for k in arrays if k not in reported]
    out: list[dict[str, Any]] = []
    previous: dict[str, dict[str, Any]] = {}
    for n in planned:
        if n > have:
            break
        prefix = {k: (None if a is None else a[:n]) for k, a in arrays.items()}
        decided = sequential_family(prefix, looks=planned, n_seeds=n, reported=reported, **family)
        for name, h in decided.items():
            _make_final(name, h, previous.get(name), n, family)
            h["reported"] = name in reported
        previous = decided
        stop = n == planned[-1] or all(decided[k]["decision"] in ("reject", "futile") for k in claimed)
        out.append({"n_seeds": n, "hypotheses": decided, "stop": stop})
        if stop and stop_early:
            break
    return out


def _make_final(
    name: str, h: dict[str, Any], before: Mapping[str, Any] | None, n: int, family: Mapping[str, Any]
) -> None:
    """Intersect ``h``'s interval with the running one and keep a decision made at an earlier look."""
    lo, hi = float(h["ci"][0]), float(h["ci"][1])
    if before is not None:
        b_lo, b_hi = (-math.inf if v is None else float(v) for v in before["ci"])
        # Disjoint intervals (a confidence sequence that missed, probability <= alpha): keep the
        # running one rather than report an empty set.
        if max(lo, b_lo) <= min(hi, b_hi):
            lo, hi = max(lo, b_lo), min(hi, b_hi)
        else:
            lo, hi = b_lo, b_hi
    h["ci"] = [lo, hi]
    if before is not None and before["decision"] in ("reject", "futile"):
        h["decision"] = before["decision"]
        h["decided_at"] = before["decided_at"]
        if before.get("p_value_holm") is not None and h.get("p_value_holm") is not None:
            h["p_value_holm"] = min(float(h["p_value_holm"]), float(before["p_value_holm"]))
        return
    if h["decision"] in ("continue", "inconclusive"):
        effect = family.get("min_effect")
        effect = effect.get(name) if isinstance(effect, Mapping) else effect
        alternative = family["alternatives"][name]
        if _futile((lo, hi), alternative, effect):
            h["decision"] = "futile"
    h["decided_at"] = n if h["decision"] in ("reject", "futile") else None


def expected_seeds(
    looks: Sequence[int],
    *,
    family: int,
    alpha: float,
    effect: float,
    min_effect: float | None,
    prior_scale: float = 1.0,
    runs: int = 300,
    seed: int = 0,
) -> float:
    """The mean seed count a sequential study stops at, by simulation (``plan`` for sequential specs).

    ``family`` independent hypotheses, each with normal per-seed values of mean ``effect`` in the
    predicted direction and sd 1 (``effect`` and ``min_effect`` in sd units), tested with Holm at every
    look (:func:`sequential_family`, one-sided); a study stops at the first look where every
    hypothesis is decided, else at ``looks[-1]``. A seeded generator owned by the call.
    """
    planned = _check_looks(looks)
    if family < 1:
        raise ValueError(f"family must be >= 1, got {family}")
    rng = np.random.default_rng(seed)
    names = [f"h{i}" for i in range(family)]
    alternatives: dict[str, Alternative] = dict.fromkeys(names, "greater")
    before_last = planned[-2] if len(planned) > 1 else 0
    used = []
    for _ in range(runs):
        data = rng.normal(effect, 1.0, size=(family, planned[-1]))
        # The looks before the last: a study that no look of them stops runs to the last look.
        replay = sequential_looks(
            dict(zip(names, data[:, :before_last])),
            looks=planned,
            alpha=alpha,
            alternatives=alternatives,
            min_effect=min_effect,
            prior_scale=prior_scale,
        )
        used.append(replay[-1]["n_seeds"] if replay and replay[-1]["stop"] else planned[-1])
    return float(np.mean(used))
