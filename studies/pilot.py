"""``autonorm-study plan --pilot``: how many seeds a study needs, from a finished pilot's per-seed
values, and what the study costs with that many (:func:`studies.planning.plan_study`)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studies.planning import format_duration, plan_study

if TYPE_CHECKING:
    from studies.contract import StudyKind

__all__ = [
    "chance_accuracy",
    "format_pilot",
    "paired_seed_needs",
    "per_seed_need",
    "pilot_power",
    "pilot_scores",
    "pilot_table",
    "seed_needs",
]


def chance_accuracy(data: Any) -> float:
    """1/C for a data set with C classes (NaN for regression): a data section (a file of one's own
    counts its classes from the file) or a registered data-set name."""
    from studies.schema import data_classes

    if isinstance(data, str):
        from autonorm_core.data import class_count

        c = class_count(data)
    else:
        c = data_classes(data)
    return 1.0 / c if c else math.nan


def pilot_table(
    study_dir: str | os.PathLike[str], name: str, *, missing: str, columns: Sequence[str] = ()
) -> Any:
    """A finished pilot's trial table ``<study_dir>/<name>`` (a DataFrame), with ``columns``.

    Raises:
        ValueError: no such file (``missing``: what that means for the pilot), or a column missing.
    """
    import pandas as pd

    path = Path(study_dir) / name
    if not path.is_file():
        raise ValueError(f"{path} not found: {missing}")
    table = pd.read_csv(path)
    for col in columns:
        if col not in table.columns:
            raise ValueError(f"{path} lacks column {col!r}; required: {', '.join(columns)}")
    return table


def pilot_scores(table: Any, metric: str, *, failed: float, ok: Sequence[str] = ("completed",)) -> Any:
    """Each row's final ``metric`` as the analysis scores it: ``failed`` for a failed trial (its
    status not among ``ok``, or a value that is not a finite number)."""
    import numpy as np
    import pandas as pd

    values = pd.to_numeric(table[metric], errors="coerce").to_numpy(dtype=float)
    finished = table["status"].astype(str).str.lower().isin(set(ok)).to_numpy() & np.isfinite(values)
    return np.where(finished, values, failed)


def per_seed_need(
    values: Sequence[float], **kwargs: Any
) -> tuple[int | None, float | None, float | None, str | None]:
    """``(K, effect, sd, problem)`` from per-seed values (``problem`` when fewer than 2); ``kwargs``
    go to :func:`studies.stats.seeds_needed`."""
    import numpy as np

    from studies.stats import seeds_needed

    if len(values) < 2:
        return None, None, None, f"{len(values)} per-seed value(s); the pilot needs at least 2 seeds"
    arr = np.asarray(values, dtype=float)
    min_effect = kwargs.get("min_effect")
    effect = abs(float(min_effect)) if min_effect is not None else float(arr.mean())
    return seeds_needed(values, **kwargs), effect, float(arr.std(ddof=1)), None


def paired_seed_needs(
    table: Any,
    scored: Any,
    contrasts: Sequence[tuple[str, str, str, str]],
    *,
    alpha: float,
    power: float,
    min_effect: float | None,
    differences: Callable[[list[float], list[float], str], list[float]] | None = None,
) -> dict[str, Any]:
    """Seeds each paired contrast of a pilot needs (:func:`per_seed_need`), from its confirmatory
    ``table`` (columns ``arm``, ``seed``) and each row's ``scored`` value (a failed trial's stand-in
    already in it). ``contrasts``: ``(name, arm, reference, alternative)``; a contrast's per-seed
    values are ``differences(arm values, reference values, alternative)`` over the seeds both arms
    scored finitely (default ``arm − reference``). Returns ``seeds_needed``, ``per_seed``, ``effect``,
    ``sd`` by contrast name and ``problems`` (a contrast that cannot be planned, and why)."""
    cells: dict[str, dict[str, float]] = {}
    for arm, seed, v in zip(table["arm"].astype(str), table["seed"].astype(str), scored):
        cells.setdefault(arm, {})[seed] = float(v)
    per_seed: dict[str, list[float]] = {}
    alternatives: dict[str, str] = {}
    labels: dict[str, str] = {}
    for name, arm_a, arm_b, alternative in contrasts:
        a_cells, b_cells = cells.get(arm_a, {}), cells.get(arm_b, {})
        seeds = sorted(
            (
                s
                for s in set(a_cells) & set(b_cells)
                if math.isfinite(a_cells[s]) and math.isfinite(b_cells[s])
            ),
            key=lambda s: (len(s), s),
        )
        a_values, b_values = [a_cells[s] for s in seeds], [b_cells[s] for s in seeds]
        diffs = (
            [a - b for a, b in zip(a_values, b_values)]
            if differences is None
            else differences(a_values, b_values, alternative)
        )
        per_seed[name] = diffs
        alternatives[name] = alternative
        labels[name] = f"{arm_a} - {arm_b}: "
    return seed_needs(
        per_seed, alternatives=alternatives, alpha=alpha, power=power, min_effect=min_effect, labels=labels
    )


def seed_needs(
    per_seed: Mapping[str, Sequence[float]],
    *,
    alternatives: Mapping[str, str],
    alpha: float,
    power: float,
    min_effect: float | None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`per_seed_need` for each test of a family (Holm over ``len(per_seed)`` tests), from each
    test's per-seed values and its ``alternatives[name]``. Returns ``seeds_needed``, ``per_seed``,
    ``effect``, ``sd`` by test name and ``problems`` (a test that cannot be planned, and why, after
    ``labels[name]`` where given)."""
    out: dict[str, Any] = {"seeds_needed": {}, "per_seed": {}, "effect": {}, "sd": {}, "problems": {}}
    for name, values in per_seed.items():
        k, effect, sd, problem = per_seed_need(
            values,
            alpha=alpha,
            family_size=len(per_seed),
            power=power,
            min_effect=min_effect,
            alternative=alternatives[name],
        )
        out["seeds_needed"][name] = k
        out["per_seed"][name] = values
        out["effect"][name] = effect
        out["sd"][name] = sd
        if problem:
            out["problems"][name] = f"{(labels or {}).get(name, '')}{problem}"
    return out


def pilot_power(
    spec: Any,
    kind: StudyKind,
    study_dir: str | os.PathLike[str],
    *,
    power: float = 0.8,
    min_effect: float | None = None,
    alpha: float | None = None,
    cpus: float | None = None,
    gpus: float | None = None,
    calibration: Mapping[str, Any] | None = None,
    calibrate: bool = True,
) -> dict[str, Any]:
    """Seeds each confirmatory test needs, from a finished pilot, and the cost of the study with them.

    The kind estimates the seeds (:meth:`~studies.contract.StudyKind.power`; e.g. the batch-size
    kind's per-seed interaction slopes, the search kind's per-seed paired contrasts); this function
    prices the study with that many seeds (:meth:`~studies.contract.StudyKind.with_seeds`, then
    :func:`plan_study`) and says it in words. ``alpha`` defaults to the spec's.

    Returns:
        ``{"seeds_needed": {arm_or_contrast: K | None}, "per_seed", "effect", "sd", "power", "alpha",
        "family_size", "k": max K (None when no test reaches the power), "seeds_planned": the seeds
        the cost is computed with (K, raised to the spec's ``analysis.min_seeds``), "cost":
        :func:`plan_study` of the spec with those seeds (``None`` when it cannot be built, see
        ``cost_note``), "statement": one plain-language paragraph, ...}``.
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie strictly between 0 and 1, got {power!r}")
    if alpha is None:
        alpha = kind.alpha(spec)
    directory = Path(study_dir)
    if not directory.is_dir():
        raise ValueError(f"pilot study directory {directory} does not exist")
    result = kind.power(spec, directory, power=power, min_effect=min_effect, alpha=alpha)
    reached = [k for k in result["seeds_needed"].values() if k is not None]
    k = max(reached) if reached else None
    floor = result.get("min_seeds") or 2
    planned = max(k, floor) if k is not None else None
    cost: dict[str, Any] | None = None
    note: str | None = None
    if planned is not None:
        try:
            cost = plan_study(
                kind.with_seeds(spec, planned),
                kind,
                cpus=cpus,
                gpus=gpus,
                calibration=calibration,
                calibrate=calibrate,
            )
        except Exception as exc:  # a spec that cannot take K seeds (e.g. a sampled search)
            note = f"no cost for {planned} seeds: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        note = "no test reaches the requested power within the seed limit"
    result.update(power=power, alpha=alpha, k=k, seeds_planned=planned, cost=cost, cost_note=note)
    result["statement"] = _statement(spec, result, directory)
    return result


def _statement(spec: Any, r: Mapping[str, Any], directory: Path) -> str:
    n_pilot = max((len(v) for v in r["per_seed"].values()), default=0)
    parts = [
        f"From {n_pilot} pilot seeds in {directory}, the {r['quantity']} was estimated for "
        f"{len(r['seeds_needed'])} test(s) (family of {r['family_size']}, each planned at alpha "
        f"{r['alpha']:g}/{r['family_size']}, power {r['power']:g})."
    ]
    for name, k in r["seeds_needed"].items():
        eff, sd = r["effect"].get(name), r["sd"].get(name)
        if eff is None or sd is None:
            parts.append(f"{name}: not estimable ({r.get('problems', {}).get(name, 'no data')}).")
        else:
            need = f"needs {k} seeds" if k is not None else "cannot reach that power with any practical K"
            parts.append(f"{name}: mean {eff:+.4g}, sd {sd:.3g} per seed, {need}.")
            if (r.get("wrong_side") or {}).get(name):  # the pilot points against the claim
                kf = (r.get("futility_seeds") or {}).get(name)
                until = f"given up at about {kf} seeds at this mean and spread" if kf else "not given up"
                parts.append(
                    f"{name}'s pilot estimate {r['estimate'][name]:+.4g} lies on the wrong side of its claim: "
                    f"a power count plans for an effect the pilot does not show; the claim would be {until} "
                    f"({'the confidence sequence' if r.get('futility_rule') == 'sequential' else 'the t-interval'} "
                    "excluding the claimed effects)."
                )
    if r["k"] is not None:
        extra = (
            f" ({r['seeds_planned']} with the spec's minimum of {r.get('min_seeds')} seeds)"
            if r["seeds_planned"] != r["k"]
            else ""
        )
        if r["cost"] is not None:
            c = r["cost"]
            parts.append(
                f"Running the study with {r['k']} seeds{extra} takes {c['trials']} trials, about "
                f"{c['cpu_hours']:.3g} CPU-hours and {c['gpu_hours']:.3g} GPU-hours, and about "
                f"{format_duration(c['wall_s'])} of wall time on {c['cluster']['cpus']:g} CPUs / {c['cluster']['gpus']:g} GPUs."
            )
        else:
            parts.append(f"The study needs {r['k']} seeds{extra}; {r['cost_note']}.")
    parts.append(
        "The pilot's spread is itself uncertain with few seeds and the effect is assumed to be as large "
        "as the pilot's (or min_effect), so treat these seed counts as lower bounds."
    )
    return " ".join(parts)


def format_pilot(result: Mapping[str, Any]) -> str:
    """The pilot's answer as text: the statement, then one line per test."""
    lines = [result["statement"], ""]
    for name, k in result["seeds_needed"].items():
        lines.append(f"  {name:<20} K={k if k is not None else 'n/a':<6} per-seed {result['per_seed'][name]}")
    return "\n".join(lines)
