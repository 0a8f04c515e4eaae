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
    :func:`studies.stats.seeds_needed` asks for over the family; on text data also claims c_attn and
    c_mlp (each at ``alpha`` alone, as the claims test them), from the per-seed DyT depth slopes the
    study's ``verdict.json`` holds. From the signed estimate: ``estimate``, ``wrong_side`` and, for
    a one-sided claim whose estimate points the other way, ``futility_seeds``
    (:func:`studies.stats.futility_needs`).

    Raises:
        ValueError: no ``confirm_trials.csv`` (the pilot had no confirmatory phase) or a column missing.
    """
    from studies.pilot import chance_accuracy, paired_seed_needs, pilot_scores, pilot_table, seed_needs
    from studies.stats import futility_needs, paired_contrast

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
    for name, slopes in _depth_slopes(study_dir).items():
        # Claims c_attn / c_mlp: each tested alone at alpha, on the per-seed DyT depth slopes.
        one = seed_needs(
            {name: slopes}, alternatives={name: "greater"}, alpha=alpha, power=power, min_effect=min_effect
        )
        for key in ("seeds_needed", "per_seed", "effect", "sd", "problems"):
            if name in one[key]:
                out.setdefault(key, {})[name] = one[key][name]
    # From the signed estimate: a claim whose per-seed values point the other way says so, with the
    # seeds at which it would be declared futile (the confidence sequence of a sequential spec, else
    # the t-interval, excluding every effect of min_effect or more in the claimed direction).
    alternatives = {name: alt for name, _, _, alt in contrasts} | {
        name: "greater" for name in out.get("per_seed", {}) if name.startswith("c_")
    }
    seq = getattr(spec, "sequential", None)
    out.update(
        futility_needs(
            {name: out["per_seed"][name] for name in alternatives if name in out.get("per_seed", {})},
            alternatives=alternatives,
            alpha=alpha,
            min_effect=seq.min_effect if seq is not None else None,
            sequential=seq is not None,
            prior_scale=seq.prior_scale if seq is not None else 1.0,
        )
    )
    needed = out.get("seeds_needed", {})
    if "c_attn" in needed and "c_mlp" in needed:
        # Claim c holds when both sub-layer types do (intersection-union): the larger count.
        sub = (needed["c_attn"], needed["c_mlp"])
        needed["c"] = None if None in sub else max(sub)
    out.update(
        quantity="per-seed paired difference of test_accuracy",
        metric="test_accuracy",
        contrasts={n: {"a": a, "b": b, "alternative": alt} for n, a, b, alt in contrasts},
        family_size=m,
        data_kind=data_kind,
        min_seeds=getattr(confirm, "min_seeds", None),
    )
    return out


def _depth_slopes(study_dir: Path) -> dict[str, list[float]]:
    """Per-seed DyT depth slopes of claims c_attn / c_mlp from ``<study_dir>/verdict.json`` (none when
    the study has no verdict yet or is not a text study)."""
    import json

    try:
        claims = (
            json.loads((Path(study_dir) / "verdict.json").read_text(encoding="utf-8")).get("claims") or {}
        )
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}
    for name in ("c_attn", "c_mlp"):
        slopes = (claims.get(name) or {}).get("slopes") if isinstance(claims.get(name), dict) else None
        if isinstance(slopes, dict) and len(slopes) >= 2:
            out[name] = [float(slopes[k]) for k in sorted(slopes, key=str)]
    return out
