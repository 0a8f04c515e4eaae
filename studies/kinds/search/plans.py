"""The search kind's plans and phases, from a validated spec (light: no Ray).

Phases, each in its own folder ``<study>/<phase>/`` with its own phase run under the study run:

* ``search``: the Optuna (or grid) search;
* with ``confirm:``, per arm: ``confirm-tune-<arm>`` (the η grid around the searched η on held-out
  tuning seeds, when ``confirm.lr_tuning`` is set; then its range extensions
  ``confirm-tune-<arm>-ext<k>`` and its refinement ``confirm-tune-<arm>-refine``), for an arm a
  claim rests on the training-adequacy check ``confirm-tune-<arm>-adequacy``
  (:mod:`studies.kinds.search.adequacy`), then ``confirm-<arm>`` (every confirmatory seed).

"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from studies.contract import Phase
from studies.kinds.search.spec import CONFIRM_ARMS
from studies.tuning import refine_points
from workers.dotted import ROOT
from workers.plan import StudyPlan
from workers.trainable import CONFIG_RESULT_KEY

__all__ = [
    "SEARCH_PHASE",
    "arm_config",
    "check_plan",
    "confirm_plan",
    "extension_plan",
    "look_plan_name",
    "phases",
    "refine_plan",
    "search_plan",
    "tune_plan",
]

SEARCH_PHASE = "search"
"""The search phase's name: its folder, phase run and ``autonorm.phase`` tag."""


def arm_config(best: Mapping[str, Any], arm: str, freeze: Any = None) -> dict[str, Any]:
    """The trial config of a confirmatory arm: the best searched configuration with its norm (and
    freezing) replaced; everything else (model size, divergence fix, data, budget) unchanged.

    ``freeze`` (``confirm.freeze``, a :class:`~studies.kinds.search.spec.ConfirmFreezeSpec`): claim
    b's ``autonorm_s`` freezes the searched gate at its ``t_freeze`` by its rule (the searched
    ``sample_after_freeze`` kept), and ``autonorm_s_searched`` is the searched configuration as
    found; ``None`` (a study stored before ``confirm.freeze``): ``autonorm_s`` is the searched one."""
    cfg = copy.deepcopy(dict(best))
    cfg.pop(CONFIG_RESULT_KEY, None)
    norm = dict(cfg["model"]["norm"])
    candidates = list(norm.get("candidates") or ("dyt", "layernorm"))
    if arm == "autonorm_s_searched" or (arm == "autonorm_s" and freeze is None):
        return cfg  # the searched AutoNorm-S, freezing rule and all
    if arm == "autonorm_s":
        searched = cfg["training"].get("freeze") or {}
        cfg["training"]["freeze"] = {
            "t_freeze": freeze.epoch(int(cfg["training"]["epochs"])),
            "eps_h": freeze.eps_h,
            "rule": freeze.rule,
            "sample_after_freeze": bool(searched.get("sample_after_freeze", False)),
        }
        return cfg
    cfg["training"]["freeze"] = None
    if arm == "autonorm":
        cfg["model"]["norm"] = norm  # the same gate, never frozen
    elif arm == "frozen_ln":
        cfg["model"]["norm"] = {"type": "layernorm"}
    elif arm == "frozen_dyt":
        cfg["model"]["norm"] = {"type": "dyt"}
    elif arm == "random_selector":
        cfg["model"]["norm"] = {"type": "random_selector", "candidates": candidates}
    else:
        raise ValueError(f"unknown confirmatory arm {arm!r}; valid: {', '.join(CONFIRM_ARMS)}")
    return cfg


def search_plan(spec: Any) -> StudyPlan:
    """The search phase's plan (the spec's plan under the phase's name)."""
    plan: StudyPlan = spec.to_plan()
    return dataclasses.replace(plan, name=SEARCH_PHASE, run_name="search-{index:03d}")


def _grid_plan(
    plan: StudyPlan,
    *,
    name: str,
    base: Mapping[str, Any],
    grid: Any,
    arm: str,
    run_name: str,
    slots: int,
    stack: int = 1,
) -> StudyPlan:
    from workers.plan import SamplerConfig, SchedulerConfig

    return dataclasses.replace(
        plan,
        name=name,
        run_name=run_name,
        tags=(*plan.tags, ("autonorm.arm", arm)),
        base_config=copy.deepcopy(dict(base)),
        space=(),
        grid=tuple(grid),
        sampler=SamplerConfig(type="grid"),
        scheduler=SchedulerConfig(type="fifo"),
        num_samples=1,
        max_concurrent=slots,
        stack=stack,
    )


def tune_plan(spec: Any, plan: StudyPlan, base: Mapping[str, Any], arm: str, searched_lr: float) -> StudyPlan:
    """Phase ``confirm-tune-<arm>``: the arm's η grid around ``searched_lr`` on the tuning seeds."""
    confirm = spec.confirm
    tune = confirm.lr_tuning
    tune_base = copy.deepcopy(dict(base))
    if tune.epochs is not None:
        tune_base["training"]["epochs"] = tune.epochs
    return _grid_plan(
        plan,
        name=f"confirm-tune-{arm}",
        base=tune_base,
        grid=(("training.lr", tuple(tune.grid(searched_lr))), ("seed", tuple(tune.seeds))),
        arm=arm,
        run_name=f"{arm}-lr{{training.lr:.3g}}-s{{seed}}",
        slots=confirm.max_concurrent or plan.max_concurrent,
        stack=spec.execution.members(),
    )


def extension_plan(
    spec: Any, plan: StudyPlan, base: Mapping[str, Any], arm: str, round_: int, lr: float
) -> StudyPlan:
    """Phase ``confirm-tune-<arm>-ext<round_>``: one learning-rate range extension (the one new η on
    the tuning seeds), run only while the arm's tuned η sits on its grid's edge."""
    tune = spec.confirm.lr_tuning
    tplan = tune_plan(spec, plan, base, arm, lr)
    return dataclasses.replace(
        tplan,
        name=f"confirm-tune-{arm}-ext{round_}",
        grid=(("training.lr", (lr,)), ("seed", tuple(tune.seeds))),
    )


def refine_plan(
    spec: Any, plan: StudyPlan, base: Mapping[str, Any], arm: str, lrs: Sequence[float]
) -> StudyPlan:
    """Phase ``confirm-tune-<arm>-refine``: the learning-rate refinement (``lrs``, around the arm's
    interior winner, on the tuning seeds)."""
    tune = spec.confirm.lr_tuning
    tplan = tune_plan(spec, plan, base, arm, lrs[0])
    return dataclasses.replace(
        tplan,
        name=f"confirm-tune-{arm}-refine",
        grid=(("training.lr", tuple(lrs)), ("seed", tuple(tune.seeds))),
    )


def look_plan_name(arm: str, look: int) -> str:
    """The folder of an arm's confirmatory look: ``confirm-<arm>`` (the first, or the fixed design's
    only one), ``confirm-<arm>-look<j>`` after it."""
    return f"confirm-{arm}" if look <= 1 else f"confirm-{arm}-look{int(look)}"


def confirm_plan(
    spec: Any, plan: StudyPlan, base: Mapping[str, Any], arm: str, *, look: int = 1
) -> StudyPlan:
    """Phase ``confirm-<arm>``: the arm (``base``, its η set) on every confirmatory seed; with
    ``sequential:``, look ``look`` (``confirm-<arm>-look<j>`` after the first) on the seeds it adds."""
    from studies.sequential import look_seeds

    confirm = spec.confirm
    seeds = tuple(confirm.seeds)
    if spec.sequential is not None:
        seeds = dict(look_seeds(confirm.seeds, spec.sequential.schedule()))[look]
    return _grid_plan(
        plan,
        name=look_plan_name(arm, look),
        base=base,
        grid=(("seed", seeds),),
        arm=arm,
        run_name=f"{arm}-s{{seed}}",
        slots=confirm.max_concurrent or plan.max_concurrent,
        stack=spec.execution.members(),
    )


def check_plan(spec: Any, plan: StudyPlan, base: Mapping[str, Any], arm: str) -> StudyPlan:
    """Phase ``confirm-tune-<arm>-adequacy``: ``base`` (the arm's confirmed configuration, its η
    set) at twice the budget, and at the budget where the tuning lacks it, on :func:`check_seed`."""
    from studies.adequacy import FACTOR
    from studies.kinds.search.adequacy import budget_training, check_seed, phase_of, reuses_tuning

    training = dict(base["training"])
    budgets = [FACTOR] if reuses_tuning(spec) else [1, FACTOR]
    cells = tuple({"training": budget_training(training, f)} for f in budgets)
    out = _grid_plan(
        plan,
        name=phase_of(arm),
        base=copy.deepcopy(dict(base)),
        grid=((ROOT, cells), ("seed", (check_seed(spec),))),
        arm=arm,
        run_name=f"{arm}-lr{{training.lr:.3g}}-e{{training.epochs}}-s{{seed}}",
        slots=spec.confirm.max_concurrent or plan.max_concurrent,
    )
    return out  # never stacked: its runs differ in budget


def phases(spec: Any) -> list[Phase]:
    """``search``, then per confirmatory arm ``confirm-tune-<arm>``, its optional range-extension
    rounds ``confirm-tune-<arm>-ext<k>``, its refinement ``confirm-tune-<arm>-refine`` (counted by
    ``plan`` as if the winner were interior), for an arm a claim rests on its training-adequacy
    check ``confirm-tune-<arm>-adequacy``, and ``confirm-<arm>`` (a sequential design's first look;
    its later looks are the optional ``confirm-<arm>-look<j>``). The
    best searched configuration is not known before the search: the spec's base config stands in
    for it (same model, data and budget; only sampled values differ)."""
    from studies.kinds.search.adequacy import checked_arms

    plan = search_plan(spec)
    out = [Phase.of(plan)]
    if spec.confirm is None:
        return out
    checked = checked_arms(spec)
    lr = float(plan.base_config["training"]["lr"])
    for arm in spec.confirm.arms:
        base = arm_config(plan.base_config, arm, spec.confirm.freeze)
        tune = spec.confirm.lr_tuning
        if tune is not None:
            out.append(Phase.of(tune_plan(spec, plan, base, arm, lr)))
            rounds = tune.max_extensions if tune.lr_grid(lr).extendable else 0
            out += [
                Phase.of(extension_plan(spec, plan, base, arm, k, lr), optional=True)
                for k in range(1, rounds + 1)
            ]
            grid = tune.lr_grid(lr)
            around = refine_points(grid, grid.point(1), tune.refine)  # for the count
            if around:
                out.append(Phase.of(refine_plan(spec, plan, base, arm, around), refine=True))
        if arm in checked:  # the training-adequacy check at the arm's tuned eta (issue #47)
            out.append(Phase.of(check_plan(spec, plan, base, arm)))
        out.append(Phase.of(confirm_plan(spec, plan, base, arm)))
        if spec.sequential is not None:  # the looks after the first: run until decided
            looks = range(2, len(spec.sequential.schedule()) + 1)
            out += [Phase.of(confirm_plan(spec, plan, base, arm, look=j), look=True) for j in looks]
    return out
