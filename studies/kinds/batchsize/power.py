"""``plan --pilot`` for the batch-size kind: seeds each fix arm's interaction test needs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.stats import Alternative

__all__ = ["interaction_slopes", "pilot"]


def interaction_slopes(sub: Any, *, fix: str, control: str, chance: float) -> list[float]:
    """Per seed: OLS slope vs log2 B of the paired differences fix - control per (B, seed) cell.

    Rows come from :func:`studies.kinds.batchsize.analysis.normalize_table`; failed trials are scored at ``chance``
    (with a NaN chance they are missing cells), as the primary analysis does.
    """
    import numpy as np

    from studies.stats import ols_slope

    df = sub.copy()
    df["score"] = np.where(df["ok"], df["value"], chance)
    df = df[np.isfinite(df["score"].to_numpy(dtype=float))]
    cells = df.groupby(["arm", "seed", "batch_size"])["score"].mean()
    out = []
    seeds = sorted(sub["seed"].unique(), key=lambda s: (len(s), s))
    for seed in seeds:
        xs, ds = [], []
        for b in sorted(float(b) for b in sub["batch_size"].unique()):
            a_key, c_key = (fix, seed, b), (control, seed, b)
            if a_key in cells.index and c_key in cells.index:
                xs.append(math.log2(b))
                ds.append(float(cells[a_key]) - float(cells[c_key]))
        if len(xs) >= 2:
            slope = ols_slope(np.asarray(xs), np.asarray(ds))
            if math.isfinite(slope):
                out.append(slope)
    return out


def pilot(
    spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
) -> dict[str, Any]:
    """Per fix arm (``spec.fix_arms``) and budget: the per-seed interaction slopes (OLS slope vs
    log2 B of the paired differences fix - ``spec.control`` per (B, seed) cell, failed trials scored
    at chance as the analysis does) from ``<study_dir>/trials.csv``, and the seeds
    :func:`studies.stats.seeds_needed` asks for over a family of ``len(fix_arms)``, one-sided in the
    hypothesis direction; with several budgets an arm needs the most seeds any budget needs.

    Read from the signed estimate: ``estimate`` (the binding budget's mean interaction),
    ``wrong_side`` (on the wrong side of the claim under every budget) and ``futility_seeds`` (then:
    the seeds at which the interval the study decides with -- the confidence sequence of a
    ``sequential`` spec, else the t-interval -- excludes every effect of ``min_effect`` (0 for a fixed
    design) in the claimed direction under every budget; :func:`studies.stats.futility_needs`).

    Raises:
        ValueError: no ``trials.csv`` (the pilot has not finished its confirmatory phase), or no trial
            of the control arm.
    """
    from studies.kinds.batchsize.analysis import normalize_table
    from studies.pilot import chance_accuracy, pilot_table, seed_needs
    from studies.stats import futility_needs

    a = spec.analysis
    missing = "the pilot has not finished its confirmatory phase (no trials.csv)"
    df = normalize_table(pilot_table(study_dir, "trials.csv", missing=missing), a.metric)
    if spec.control not in set(df["arm"]):
        raise ValueError(f"the control arm {spec.control!r} has no trial in {study_dir / 'trials.csv'}")
    fix_arms = list(spec.fix_arms)
    m = len(fix_arms)
    alternative: Alternative = "less" if a.higher_is_better else "greater"
    chance = chance_accuracy(spec.data) if a.metric.endswith("accuracy") else math.nan
    budgets = sorted(b for b in df["budget"].unique()) or [""]
    by_budget: dict[str, Any] = {}
    seq = getattr(spec, "sequential", None)
    for budget in budgets:
        sub = df[df["budget"] == budget]
        slopes = {
            arm: interaction_slopes(sub, fix=arm, control=spec.control, chance=chance) for arm in fix_arms
        }
        by_budget[budget or "all"] = seed_needs(
            slopes,
            alternatives=dict.fromkeys(fix_arms, alternative),
            alpha=alpha,
            power=power,
            min_effect=min_effect,
        )
        # An interaction on the wrong side of the claim: the seeds at which it would be given up.
        by_budget[budget or "all"].update(
            futility_needs(
                slopes,
                alternatives=dict.fromkeys(fix_arms, alternative),
                alpha=alpha,
                min_effect=seq.min_effect if seq is not None else None,
                sequential=seq is not None,
                prior_scale=seq.prior_scale if seq is not None else 1.0,
                confidence=a.confidence,
            )
        )
    # Per arm, the budget that needs the most seeds (None, i.e. unreachable, wins).
    out: dict[str, Any] = {
        "seeds_needed": {},
        "per_seed": {},
        "effect": {},
        "sd": {},
        "binding_budget": {},
        "estimate": {},
        "wrong_side": {},
        "futility_seeds": {},
    }
    for arm in fix_arms:

        def need(b: str, arm: str = arm) -> float:
            k = by_budget[b]["seeds_needed"][arm]
            return math.inf if k is None else float(k)

        worst = max(by_budget, key=need)
        for field in ("seeds_needed", "per_seed", "effect", "sd"):
            out[field][arm] = by_budget[worst][field][arm]
        out["binding_budget"][arm] = worst
        # Refuted (futile) only when it is under every budget: on the wrong side in each, and the
        # seeds the slowest budget needs to get there.
        sides = [by_budget[b]["wrong_side"][arm] for b in by_budget]
        ks = [by_budget[b]["futility_seeds"][arm] for b in by_budget]
        out["estimate"][arm] = by_budget[worst]["estimate"][arm]
        out["wrong_side"][arm] = all(sides)
        out["futility_seeds"][arm] = max(ks) if all(sides) and None not in ks else None
    first = next(iter(by_budget.values()))
    out.update(
        futility_rule=first["futility_rule"],
        futility_effect=first["futility_effect"],
        quantity="per-seed interaction slope (fix - control) vs log2 batch size",
        metric=a.metric,
        alternative=alternative,
        family_size=m,
        by_budget=by_budget,
        min_seeds=a.min_seeds,
    )
    return out
