"""What would decide an inconclusive hypothesis, and what that costs: the "to decide" column of the
results page (:mod:`studies.results`).

Read from the *signed* estimate: one on the claimed side gets the seeds at which a fixed-design
t-test reaches :data:`POWER` at the effect and spread the study saw; one on the wrong side of its
claim says so and gives the seeds at which the claim would be given up
(:func:`studies.stats.futility_needs`: the confidence sequence of a sequential design, the t-interval
of a fixed one, excluding every claimed effect), never a power count for its ``|effect|``. Then the
remedy of each other reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["NONE", "POWER", "num", "seed_needs", "to_decide"]

POWER = 0.8
"""The power an inconclusive row's seed count is planned for (as ``plan --pilot``'s default)."""
NONE = "—"


def num(v: Any, digits: int = 3) -> str:
    """A number for a page cell: an integer as it is, a float to ``digits`` significant digits,
    :data:`NONE` for anything else."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return NONE
    return str(int(v)) if isinstance(v, int) else f"{float(v):.{digits}g}"


_REMEDIES = (
    ("lr-at-range-edge", "a wider η grid (more lr_tuning range extensions)"),
    ("lr-tuning-noisy", "more tuning seeds or lr_tuning.refine (informational: the η pick led by < 1 SE)"),
    ("optimisation-limited", "longer training (more epochs)"),
    ("failures", "fewer failed trials (a lower η or a longer warm-up)"),
)


def seed_needs(
    spec: Any, kind: Any, directory: Path
) -> tuple[dict[str, int | None], int, str | None, dict[str, dict[str, Any]]]:
    """``(seeds needed per test, the spec's minimum seeds, why none, futility per test)`` at
    :data:`POWER`, from the directory's confirmatory table (:meth:`studies.contract.StudyKind.power`).
    A test whose estimate lies on the wrong side of its claim is in the last mapping instead of the
    first: ``{"seeds", "estimate", "rule", "effect"}``, the seeds at which it would be given up
    (:func:`studies.stats.futility_needs`), not a power count for its ``|effect|``."""
    if kind is None:
        return {}, 2, "the spec does not load here", {}
    try:
        result = kind.power(spec, directory, power=POWER, min_effect=None, alpha=kind.alpha(spec))
    except Exception as exc:
        why = f"not estimable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        return {}, 2, why, {}
    needed = {
        str(k): (int(v) if isinstance(v, int) else None)
        for k, v in (result.get("seeds_needed") or {}).items()
    }
    futile: dict[str, dict[str, Any]] = {}
    for name, side in (result.get("wrong_side") or {}).items():
        if side:
            k = (result.get("futility_seeds") or {}).get(name)
            futile[str(name)] = {
                "seeds": int(k) if isinstance(k, int) else None,
                "estimate": (result.get("estimate") or {}).get(name),
                "rule": result.get("futility_rule") or "fixed",
                "effect": result.get("futility_effect") or 0.0,
                "min_seeds": int(result.get("min_seeds") or 2),
            }
            needed.pop(str(name), None)
    return needed, int(result.get("min_seeds") or 2), None, futile


def _futility_text(futile: Mapping[str, Any], *, seeds_used: int | None, price: Any) -> str:
    """What decides a test whose estimate points against its claim: where the interval the study
    decides with would exclude every claimed effect (at the mean and spread it saw)."""
    est, k, effect = futile.get("estimate"), futile.get("seeds"), float(futile.get("effect") or 0.0)
    sequential = futile.get("rule") == "sequential"
    interval = "confidence sequence" if sequential else "t-interval"
    # sequential: futility; fixed: the interval wholly on the other side of 0 refutes, one that only
    # excludes the effects worth finding (the compare kind's margin) leaves the claim not reproduced
    outcome = "futile" if sequential else ("not reproduced" if effect > 0 else "refuted")
    excludes = (
        f"excludes every effect of {num(effect)} or more in the claimed direction"
        if effect > 0
        else "lies entirely on the other side of 0"
    )
    head = f"{futile.get('name') or 'estimate'} {num(est)} on the wrong side of the claim"
    if k is None:
        return f"{head}: no practical seed count makes its {interval} exclude the claimed effects"
    floor = int(futile.get("min_seeds") or 2)
    if seeds_used and max(k, floor) <= seeds_used:
        return (
            f"{head}: at the mean and spread seen its {interval} {excludes} from {k} seeds, "
            f"no more than the {seeds_used} used"
        )
    if k < floor:
        return (
            f"{head}: {outcome} at ≈{floor} seeds, the design's minimum (its {interval}, at the mean "
            f"and spread seen, {excludes} from {k}){price(floor)}"
        )
    return (
        f"{head}: {outcome} at ≈{k} seeds, where its {interval}, at the mean and spread seen, "
        f"{excludes}{price(k)}"
    )


def to_decide(
    verdict_label: str,
    reasons: Sequence[str],
    seeds: int | None,
    why_no_seeds: str | None = None,
    *,
    seeds_used: int | None,
    cost: tuple[float, float] | None,
    futile: Mapping[str, Any] | None = None,
) -> str:
    """What would decide an inconclusive hypothesis and what that costs (``—`` for a decided one):
    the seeds that reach :data:`POWER` at the effect and spread the study saw (raised to the spec's
    minimum; a lower bound), priced as a rerun with that many seeds at this study's cost per seed,
    then the remedy of each other reason. An estimate on the wrong side of the claim (``futile``:
    ``{"seeds", "estimate", "rule", "effect"}`` from :func:`_seed_needs`, and the estimate's
    ``name``) says so and gives the seeds at which the claim would be given up (futile under a
    sequential design, refuted under a fixed one) instead of a power count for its ``|effect|``."""
    if verdict_label != "inconclusive":
        return NONE
    if any(str(r).startswith("equivalent:") for r in reasons):
        seeds, why_no_seeds = None, None  # decided inside the margin: seeds for a direction would mislead
    parts = []

    def price(n: int) -> str:
        if cost is None or not seeds_used:
            return ""
        cpu, gpu = (c * n / seeds_used for c in cost)
        return f" (≈{num(cpu, 2)} CPU-h, {num(gpu, 2)} GPU-h: a rerun at this study's cost per seed)"

    if futile is not None and not any(str(r).startswith("equivalent:") for r in reasons):
        parts.append(_futility_text(futile, seeds_used=seeds_used, price=price))
    elif seeds is not None and seeds_used and seeds <= seeds_used:
        # The planning t-test is satisfied already: the sequential (anytime-valid) test the study
        # decided with pays for looking at every step with a wider interval, so it needs more.
        parts.append(
            f"more than the {seeds_used} seeds used: a fixed-design test would need {seeds} for "
            f"{POWER:.0%} power, the sequential test this study decides with needs more, by how much "
            f"is not planned here; e.g. {2 * seeds_used} seeds{price(2 * seeds_used)}"
        )
    elif seeds is not None:
        parts.append(f"≥{seeds} seeds for {POWER:.0%} power{price(seeds)}")
    elif any(str(r) == "underpowered" for r in reasons):
        parts.append("more seeds" + (f" ({why_no_seeds})" if why_no_seeds else ""))
    elif why_no_seeds and not any("not applicable" in str(r) for r in reasons):
        parts.append(why_no_seeds)
    for reason in reasons:
        text = str(reason)
        if text == "underpowered":
            continue
        remedy = next((r for prefix, r in _REMEDIES if text.startswith(prefix)), None)
        part = f"{text}: {remedy}" if remedy else text
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "no reason recorded"
