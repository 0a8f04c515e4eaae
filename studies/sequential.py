"""Sequential confirmation, shared by every kind: the ``sequential:`` spec section and its looks.

A kind with ``sequential:`` runs its confirmatory seeds (taken in the order of its seed list) in
*looks*: the first look at ``min_seeds``, then every ``look_every`` seeds, the last at ``max_seeds``.
After each look the kind tests each hypothesis's per-seed values with the anytime-valid mixture
t-test (:func:`studies.stats.sequential_looks`, Holm across the family at every look) and stops
launching seeds when every hypothesis is decided (rejected, or futile: its confidence sequence
excludes every effect of at least ``min_effect`` in the predicted direction). The error guarantee
holds under any stopping rule and any number of looks, so a finished study can be extended
(``autonorm-study extend``): its earlier looks stay looks, and the spec records them in
``sequential.looks``.

This module knows nothing about a kind: it turns the section into a look schedule, says which seeds
each look adds, and builds the ``verdict.json`` fields every sequential kind writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ExtendRefused",
    "SequentialSpec",
    "look_seeds",
    "plot_intervals",
    "sequential_fields",
]

_LookCount = Annotated[int, Field(strict=True, ge=2, le=100_000)]


class SequentialSpec(BaseModel):
    """``sequential:``: the confirmatory seeds in looks, each look tested anytime-validly.

    Absent from a spec: today's fixed design (every seed, one test). ``prior_scale`` is the
    mixture's g (the standardised effect mixed over N(0, g)); g = 1 rejects nothing before 5 seeds
    (6 with a family of 3: the e-value is at most (1 + n g)^((n - 1)/2)). ``looks`` is written by
    ``extend`` (the looks a study actually made); by default the schedule is ``min_seeds``,
    ``min_seeds + look_every``, ..., ``max_seeds``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_seeds: _LookCount = 5  # the first look
    max_seeds: _LookCount  # the last look (the kind's seed list must hold at least this many)
    look_every: Annotated[int, Field(strict=True, ge=1, le=100_000)] = 1
    min_effect: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] | None = None
    prior_scale: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] = 1.0
    looks: tuple[_LookCount, ...] | None = None  # explicit schedule (written by `extend`)

    @model_validator(mode="after")
    def _order(self) -> SequentialSpec:
        if self.min_seeds > self.max_seeds:
            raise ValueError(f"min_seeds ({self.min_seeds}) must not exceed max_seeds ({self.max_seeds})")
        if self.looks is not None:
            looks = list(self.looks)
            if looks != sorted(set(looks)) or looks[-1] != self.max_seeds or looks[0] != self.min_seeds:
                raise ValueError(
                    f"looks must be strictly ascending from min_seeds ({self.min_seeds}) to max_seeds "
                    f"({self.max_seeds}), got {looks}"
                )
        return self

    def schedule(self) -> tuple[int, ...]:
        """The planned looks (seed counts), ascending; the last is ``max_seeds``."""
        if self.looks is not None:
            return tuple(self.looks)
        out = list(range(self.min_seeds, self.max_seeds, self.look_every))
        return (*out, self.max_seeds)

    def extended(self, done: Sequence[int], added: int) -> SequentialSpec:
        """The section after ``extend``: the looks made so far, then ``added`` more seeds in looks of
        ``look_every``, the last at the new ``max_seeds``."""
        if not done or added < 1:
            raise ValueError("extend needs the looks made so far and at least one more seed")
        top = done[-1] + added
        more = list(range(done[-1] + self.look_every, top, self.look_every))
        return self.model_copy(update={"max_seeds": top, "looks": (*done, *more, top)})


def look_seeds(seeds: Sequence[Any], looks: Sequence[int]) -> list[tuple[int, tuple[Any, ...]]]:
    """``[(look number (1-based), the seeds that look adds), ...]`` for the seed list in order."""
    out = []
    previous = 0
    for j, n in enumerate(looks, start=1):
        out.append((j, tuple(seeds[previous:n])))
        previous = n
    return out


def sequential_fields(
    looks: Sequence[Mapping[str, Any]],
    seeds: Sequence[Any],
    *,
    max_seeds: int,
    trials_per_seed: int,
    trials_run: int | None = None,
) -> dict[str, Any]:
    """``verdict.json``'s sequential fields from a replay of the looks (:func:`studies.stats.sequential_looks`).

    Returns:
        ``{"looks": [{n_seeds, seeds, hypotheses: {name: {decision, p_value, p_value_holm, ci,
        estimate, n}}}], "seeds_used", "max_seeds", "trials_saved"}``; ``trials_saved`` = the fixed
        design's trials at ``max_seeds`` minus those run: ``trials_run`` when given (per-arm
        stopping: arms stop at different looks), else ``trials_per_seed`` per seed used.
    """
    used = int(looks[-1]["n_seeds"]) if looks else 0
    run = used * trials_per_seed if trials_run is None else int(trials_run)
    return {
        "looks": [
            {
                "n_seeds": int(look["n_seeds"]),
                "seeds": list(seeds[: int(look["n_seeds"])]),
                "hypotheses": {k: _json_safe(v) for k, v in look["hypotheses"].items()},
            }
            for look in looks
        ],
        "seeds_used": used,
        "max_seeds": int(max_seeds),
        "trials_saved": int(max(0, max_seeds * trials_per_seed - run)),
    }


def _json_safe(h: Mapping[str, Any]) -> dict[str, Any]:
    """A hypothesis at a look with infinite interval bounds (too few seeds) as ``None`` (strict JSON)."""
    out = dict(h)
    if "ci" in out and out["ci"] is not None:
        out["ci"] = [v if isinstance(v, int | float) and math.isfinite(v) else None for v in out["ci"]]
    return out


class ExtendRefused(Exception):
    """``extend`` cannot add seeds to this study (the message says why); nothing was run."""


def plot_intervals(verdict: Mapping[str, Any], path: Any) -> Any:
    """Each hypothesis's confidence sequence (and estimate) against the seeds, one look per point:
    how the interval narrowed and where the study stopped. ``None`` when the verdict has no looks."""
    looks = verdict.get("looks") or []
    if not looks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({name for look in looks for name in look["hypotheses"]})
    fig, ax = plt.subplots(figsize=(7, 0.6 + 1.2 * max(2, len(names))))
    colours = {
        "reject": "tab:green",
        "futile": "tab:red",
        "continue": "tab:gray",
        "inconclusive": "tab:orange",
    }
    for row, name in enumerate(names):
        for look in looks:
            h = look["hypotheses"].get(name)
            if h is None or h.get("estimate") is None:
                continue
            n = look["n_seeds"]
            lo, hi = (h.get("ci") or [None, None])[:2]
            y = (
                row
                + (n - looks[0]["n_seeds"]) / max(1, looks[-1]["n_seeds"] - looks[0]["n_seeds"] + 1) * 0.6
                - 0.3
            )
            colour = colours.get(str(h.get("decision")), "black")
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], color=colour, lw=2)
            ax.plot([h["estimate"]], [y], "o", color=colour, ms=4)
            ax.annotate(f"n={n}", (h["estimate"], y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("per-seed effect: confidence sequence at each look (green reject, red futile)")
    ax.set_title(f"Sequential looks: {verdict.get('seeds_used')} of {verdict.get('max_seeds')} seeds used")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
