"""``plan --pilot`` for the compare kind: seeds each paired contrast needs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from studies.kinds.compare.spec import CompareStudySpec
from studies.stats import Alternative

__all__ = ["pilot"]


def pilot(
    spec: CompareStudySpec, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
) -> dict[str, Any]:
    """``plan --pilot``: per contrast, the per-seed paired differences in ``<study_dir>/trials.csv``
    (failed trials scored as in the analysis) and the seeds :func:`studies.pilot.per_seed_need`
    asks for over the family (two-sided, Holm over the spec's contrasts); from the signed estimate,
    ``wrong_side`` (a difference against the contrast's predicted direction) and ``futility_seeds``
    (then: the seeds at which the t-interval excludes every difference of ``analysis.margin`` or
    more in the predicted direction; :func:`studies.stats.futility_needs`).

    Raises:
        ValueError: no ``trials.csv`` or a column missing.
    """
    from studies.kinds.compare.workflow import TABLE_FILE, chance_scores
    from studies.pilot import paired_seed_needs, pilot_scores, pilot_table
    from studies.stats import futility_needs

    metric = spec.analysis.metric
    table = pilot_table(
        study_dir,
        TABLE_FILE,
        missing="the pilot has no confirmatory trial table (arms x seeds)",
        columns=("arm", "seed", "status", metric),
    )
    failed_value, _ = chance_scores(spec)
    scored = pilot_scores(table, metric, failed=math.nan if failed_value is None else failed_value)
    contrasts = spec.contrast_specs
    m = len(contrasts)
    out = paired_seed_needs(
        table,
        scored,
        [(name, c.arm, c.reference, "two-sided") for name, c in contrasts.items()],
        alpha=alpha,
        power=power,
        min_effect=min_effect,
    )
    # From the signed estimate: a difference on the wrong side of its predicted direction says so,
    # with the seeds at which the t-interval would exclude every difference of at least the margin
    # in the predicted direction (the fixed design's analogue of futility).
    a = spec.analysis
    claimed: dict[str, Alternative] = {
        n: "greater" if (c.predicted == "better") == a.higher_is_better else "less"
        for n, c in contrasts.items()
    }
    out.update(
        futility_needs(
            out["per_seed"],
            alternatives=claimed,
            alpha=alpha,
            min_effect=a.margin or None,
            sequential=False,
            confidence=a.confidence,
        )
    )
    out.update(
        claimed_direction=claimed,
        quantity=f"per-seed paired difference of {metric}",
        metric=metric,
        contrasts={
            n: {"a": c.arm, "b": c.reference, "alternative": "two-sided"} for n, c in contrasts.items()
        },
        family_size=m,
        # The fewest seeds that can decide at all: analysis.min_seeds, and the sign-flip floor
        # 2 / 2^K x m < alpha (the power of a t-test alone would plan fewer).
        min_seeds=max(spec.analysis.min_seeds, _floor_seeds(m, spec.analysis.alpha)),
    )
    return out


def _floor_seeds(family: int, alpha: float) -> int:
    """The fewest seeds K with ``2 / 2^K x family < alpha`` (the smallest two-sided sign-flip p)."""
    from studies.stats import min_sign_flip_p

    k = 2
    while min_sign_flip_p(k, "two-sided") * family >= alpha:
        k += 1
    return k
