"""Search-space checks: every value a parameter can take is written into the base trial config and
re-validated, so a bad range is a spec error before any trial starts; and the search section compiled
into plan dimensions."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    ValidationError,
)

from studies.schema.errors import SpecError, SpecIssue
from studies.schema.loading import _pydantic_issues
from studies.schema.sampling import CategoricalParam, FloatParam, IntParam
from studies.schema.sections import TrialSections
from workers.dotted import PathError, set_path

_TRIAL_ROOTS = ("model", "data", "training")


def check_search_space(
    space: Sequence[IntParam | FloatParam | CategoricalParam],
    base_config: Mapping[str, Any],
    *,
    sampler: str = "tpe",
    seeds: Sequence[int] = (0,),
    prefix: str = "search.space",
) -> list[SpecIssue]:
    """Check that every parameter addresses a real field and that each of its values gives a valid trial.

    For each parameter, its ``when`` conditions and then each representative value (``low``, ``high``,
    every choice; for an integer range every value in between too, or a sample of a wide one) are
    written into ``base_config`` at the parameter's path with :func:`workers.dotted.set_path`, exactly
    as trials will do, and the result is validated as :class:`TrialSections`. A value that fails names the parameter
    (``search.space.3.high``) and the trial-config field it broke.

    Args:
        space: the parameters, in sampling order.
        base_config: the trial config every trial starts from.
        sampler: ``grid`` needs categorical parameters without conditions.
        seeds: the study's seeds (a searched ``seed`` parameter must not also be fixed by several).
        prefix: path of the space in the spec, for messages.
    """
    issues: list[SpecIssue] = []
    names: dict[str, int] = {}
    taken: dict[str, list[Any]] = {}
    for i, p in enumerate(space):
        where = f"{prefix}.{i}"
        if p.name in names:
            issues.append(
                SpecIssue(f"{where}.name", f"{p.name!r} is already searched by {prefix}.{names[p.name]}")
            )
            continue
        root = p.name.split(".", 1)[0]
        if p.name != "seed" and (root not in _TRIAL_ROOTS or "." not in p.name):
            issues.append(
                SpecIssue(
                    f"{where}.name",
                    f"{p.name!r} must be 'seed' or a dotted path below model., data. or training.",
                )
            )
            continue
        for cond_name, cond_value in p.when.items():
            if cond_name not in names:
                issues.append(
                    SpecIssue(
                        f"{where}.when.{cond_name}",
                        "a condition must name a parameter listed before this one",
                    )
                )
                continue
            cond = space[names[cond_name]]
            if isinstance(cond, CategoricalParam) and cond_value not in cond.choices:
                issues.append(
                    SpecIssue(
                        f"{where}.when.{cond_name}",
                        f"{cond_value!r} is not one of {cond_name}'s choices {list(cond.choices)}; "
                        "the parameter would never be sampled",
                    )
                )
        names[p.name] = i
        if sampler == "grid":
            if not isinstance(p, CategoricalParam):
                issues.append(SpecIssue(f"{where}.type", "the grid sampler needs categorical parameters"))
            if p.when:
                issues.append(SpecIssue(f"{where}.when", "the grid sampler does not support conditions"))
        if p.name == "seed" and len(seeds) > 1:
            issues.append(SpecIssue(f"{where}.name", "seed is both searched and fixed by 'seeds'"))
        values: list[tuple[str, Any]]
        interior: list[Any] = []
        if isinstance(p, CategoricalParam):
            values = [(f"choices.{j}", c) for j, c in enumerate(p.choices)]
        elif isinstance(p, IntParam):
            grid = _int_values(p)
            values = [("low", grid[0]), ("high", grid[-1])]
            interior = grid[1:-1]
        else:
            values = [("low", p.low), ("high", p.high)]
        taken[p.name] = [v for _, v in values] + interior
        path_ok = True
        n_before = len(issues)
        for field, value in values:
            problems_or_err = _try_value(base_config, p, value)
            if isinstance(problems_or_err, PathError):
                issues.append(
                    SpecIssue(f"{where}.name", f"{p.name!r} does not address a field: {problems_or_err}")
                )
                path_ok = False
                break
            problems = problems_or_err
            section = p.name.rsplit(".", 1)[0]
            leftovers = [
                pr.path.rsplit(".", 1)[1]
                for pr in problems
                if p.name.endswith(".type")
                and pr.path.startswith(section + ".")
                and "unknown field" in pr.message
            ]
            if leftovers and len(leftovers) == len(problems):
                # Workers set only the `type` key, so the base variant's own fields stay behind.
                issues.append(
                    SpecIssue(
                        f"{where}.{field}",
                        f"{p.name}={value!r} keeps the base {section}'s fields {', '.join(leftovers)}, "
                        f"which type {value!r} does not have; start from a base {section} whose fields "
                        "every searched type accepts (e.g. only `type`)",
                    )
                )
                continue
            for prob in problems:
                issues.append(
                    SpecIssue(
                        f"{where}.{field}",
                        f"{p.name}={value!r} gives an invalid trial: {prob.path}: {prob.message}",
                    )
                )
            if problems and all(
                pr.path.startswith(p.name) and "unknown field" in pr.message for pr in problems
            ):
                path_ok = False
                break  # the path itself is wrong; one message is enough
        if path_ok and interior and len(issues) == n_before:
            # The endpoints passed or failed above; a value between them can still fail on its own
            # (heads=3 with dim 64, patch_size=3 on 8x8 images).
            failed: list[tuple[Any, SpecIssue]] = []
            for value in interior:
                result = _try_value(base_config, p, value)
                if isinstance(result, list) and result:
                    failed.append((value, result[0]))
            if failed:
                value, prob = failed[0]
                others = [v for v, _ in failed[1:]]
                also = f" (also {', '.join(map(str, others))})" if others else ""
                issues.append(
                    SpecIssue(
                        where,
                        f"{p.name}={value!r}{also}, inside [{values[0][1]}, {values[-1][1]}], gives an invalid trial: "
                        f"{prob.path}: {prob.message}; narrow the range or list valid values as categorical",
                    )
                )
    issues += _freeze_within_epochs(space, names, taken, prefix)
    return issues


_DENSE_INT_RANGE = 64
"""Integer ranges with at most this many values are checked value by value."""
_INT_SAMPLE = 16


def _int_values(p: IntParam) -> list[int]:
    """The values an int parameter can take: all of them when there are at most :data:`_DENSE_INT_RANGE`,
    else both endpoints and :data:`_INT_SAMPLE` evenly spaced ones (a sample: a value rejected only
    between two sampled points of a wide range goes unnoticed until a trial draws it)."""
    step = p.step or 1
    count = (p.high - p.low) // step + 1
    if count <= _DENSE_INT_RANGE:
        return [p.low + k * step for k in range(count)]
    picks = {0, count - 1, *(round(i * (count - 1) / (_INT_SAMPLE + 1)) for i in range(1, _INT_SAMPLE + 1))}
    return [p.low + k * step for k in sorted(picks)]


def _try_value(base_config: Mapping[str, Any], p: Any, value: Any) -> list[SpecIssue] | PathError:
    cfg = copy.deepcopy(dict(base_config))
    try:
        for cond_name, cond_value in p.when.items():
            set_path(cfg, cond_name, cond_value)
        set_path(cfg, p.name, value)
    except PathError as e:
        return e
    return _trial_issues(cfg)


def _freeze_within_epochs(
    space: Sequence[Any], names: Mapping[str, int], taken: Mapping[str, list[Any]], prefix: str
) -> list[SpecIssue]:
    """A searched t_freeze must stay within every epochs value the search can pair it with."""
    tf, ep = "training.freeze.t_freeze", "training.epochs"
    if tf not in names or ep not in names:
        return []  # a fixed side is checked against each value of the other when it is written in
    tfs = [v for v in taken.get(tf, []) if isinstance(v, int) and not isinstance(v, bool)]
    eps = [v for v in taken.get(ep, []) if isinstance(v, int) and not isinstance(v, bool)]
    if not tfs or not eps or max(tfs) <= min(eps):
        return []
    p = space[names[tf]]
    field = "high" if not isinstance(p, CategoricalParam) else "choices"
    return [
        SpecIssue(
            f"{prefix}.{names[tf]}.{field}",
            f"{tf} can be {max(tfs)} while {ep} can be {min(eps)}: such a trial ends before its "
            "freeze epoch and silently never freezes the gate; keep t_freeze at most the smallest epochs",
        )
    ]


def _trial_issues(cfg: Mapping[str, Any]) -> list[SpecIssue]:
    try:
        TrialSections.model_validate(cfg)
    except SpecError as e:
        return list(e.issues)
    except ValidationError as e:
        return _pydantic_issues(e, cfg, TrialSections)
    return []
