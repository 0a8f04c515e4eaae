"""``plan --pilot`` for the search kind: seeds each paired contrast of the AutoNorm claims needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.kinds.search.claims import _CONTRASTS
from studies.kinds.search.spec import data_kind_of

__all__ = ["pilot"]


def pilot(
    spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
) -> dict[str, Any]:
    """Per contrast a (random_selector - autonorm, greater; image data only), b (autonorm_s -
    autonorm, greater), e (autonorm_s - frozen_ln, two-sided): the per-seed paired differences of the
    test accuracy in ``<study_dir>/confirm_trials.csv`` (failed trials scored at chance) and the seeds
    :func:`studies.stats.seeds_needed` asks for over the family.

    Raises:
        ValueError: no ``confirm_trials.csv`` (the pilot had no confirmatory phase) or a column missing.
    """
    from studies.pilot import chance_accuracy, paired_seed_needs, pilot_scores, pilot_table
    from studies.stats import paired_contrast

    table = pilot_table(
        study_dir,
        "confirm_trials.csv",
        missing="the pilot has no confirmatory phase (arms x seeds, confirm_trials.csv), so there are no "
        "per-seed paired differences to plan the seeds with",
        columns=("arm", "seed", "status", "test_accuracy"),
    )
    confirm = spec.confirm
    data_kind = getattr(confirm, "data_kind", "auto")
    if data_kind == "auto":
        data_kind = data_kind_of(spec.data)
    contrasts = [c for c in _CONTRASTS if c[0] != "a" or data_kind == "vision"]
    m = len(contrasts)
    scored = pilot_scores(
        table, "test_accuracy", failed=chance_accuracy(spec.data), ok=("completed", "terminated")
    )

    def differences(a: list[float], b: list[float], alternative: Any) -> list[float]:
        if len(a) < 2:
            return []
        found: list[float] = paired_contrast(a, b, alternative=alternative)["differences"]
        return found

    out = paired_seed_needs(
        table, scored, contrasts, alpha=alpha, power=power, min_effect=min_effect, differences=differences
    )
    out.update(
        quantity="per-seed paired difference of test_accuracy",
        metric="test_accuracy",
        contrasts={n: {"a": a, "b": b, "alternative": alt} for n, a, b, alt in contrasts},
        family_size=m,
        data_kind=data_kind,
        min_seeds=getattr(confirm, "min_seeds", None),
    )
    return out
