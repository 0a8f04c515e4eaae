"""Know the cost and the seeds of a study before launching it.

Two questions, answered from the spec alone (and, for the second, a finished pilot):

* :func:`plan_study`: every phase the kind's ``run`` will run, with its trials (tuning included),
  epochs and updates per trial, the predicted time of a trial, CPU- and GPU-hours and the wall
  time on a given cluster. Step times are measured on this machine, a few real updates of each
  distinct (model, data, batch size) of the study run exactly as a trial runs them
  (:func:`studies.calibration.calibrate_trial`); or they are read from a calibration measured
  on the target kind of machine (the ``calibration`` this function returns is such a mapping: save
  it there with :func:`save_calibration`, load it here with :func:`load_calibration`).
* :func:`studies.pilot.pilot_power`: from a finished pilot study directory, the per-seed values of
  the quantity each confirmatory test is run on, the seeds K each test needs for the requested
  power (:func:`studies.stats.seeds_needed`), and the cost of the study with that many seeds.

Time model (all seconds; every constant can be overridden by the calibration mapping)::

    trial_s = trial_start_s + setup_s[key] + updates * step_s[key] + epochs * (eval_s[key] + report_s)
    phase   = LPT packing of its trials onto the slots, + worker_start_s per slot used, + phase_start_s
    study   = study_start_s + calibration_s + sum of the phases (phases run one after another)
    stack   = trial_start_s + K * setup_s[key] + updates * stacked step(K) + epochs * (stacked eval(K)
              + report_s + K * member_result_s); a group: its stacks, one start, one report a round
    slots   = min(max_concurrent, floor(cpus / cpu per trial), floor(gpus / gpu per trial) if gpu > 0)

``key`` is :func:`studies.calibration.timing_key` of a trial config (model, data, batch size; a
budget changes how many updates and epochs a trial runs, not how long one takes). ``step_s`` (one
whole update), ``eval_s`` (one epoch's end: validation, test and the checkpoint) and ``setup_s``
(loading the data, building the model) are what :mod:`studies.calibration` measures. The constants
below were measured with the smoke preset of the batch-size study on a 2-core machine (local Ray,
reused actors); they are the part of a trial that does not scale with the work.

Only a Tune grid is enumerated exactly; a sampled search's trials are taken at the spec's base
config (the sampled values do not change a trial's update count unless ``training.epochs``,
``training.batch_size`` or ``training.max_updates`` is searched), and an early-stopping scheduler
makes every figure an upper bound (``upper_bound`` in the phase).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studies.calibration import calibrate_stacked, calibrate_trial, data_key, load_trial_data, timing_key
from studies.contract import Phase, StudyKind
from workers.plan import StudyPlan

if TYPE_CHECKING:
    from studies.calibration_cache import CalibrationCache

__all__ = [
    "DEFAULTS",
    "format_duration",
    "format_plan",
    "load_calibration",
    "phases_of",
    "plan_study",
    "save_calibration",
]

#: Fixed costs (seconds) that do not scale with a trial's work; the calibration mapping overrides each.
#: Re-measured (issue 38) from per-phase timelines of the batch-size `local` preset, run `off` and
#: stacked on the quiet 2-core machine (each trial's start and reports as its worker stamped them in
#: Tune's result files, against the command's own log): after this round's cuts (byte-compiled
#: packages, no ``torch._dynamo`` import in the norms or an optimizer's construction, no TensorBoard
#: logger, compact snapshots) every fixed cost fell to about a third of what issue 28 measured under
#: load.
DEFAULTS: dict[str, float] = {
    # A trial on a reused actor (Tune reuse_actors=True): Tune's turnaround, trial setup, the MLflow
    # child run. Measured 0.07 s of driver turnaround between one trial's end and the next's start in
    # its slot, and ~0.1 s inside a trial besides its training and its reports.
    "trial_start_s": 0.15,
    # A new Ray worker process (interpreter, torch import, first optimizer): once per slot per phase
    # (every phase's Tuner starts new actors). The first trial of a phase took 2.3 s against 0.35 s for
    # the next (`off`), the first report of a stacked group 1.6 s against 0.2-0.5 s a round.
    "worker_start_s": 2.0,
    # Tuner start / restore and its experiment state, the phase's MLflow run, the previous phase's
    # end (its runs closed, its analysis): 1.9 s (`off`) to 2.7 s (stacked: a group closes all its
    # members' runs at its end) from one phase's last report to the next phase's first trial.
    "phase_start_s": 2.0,
    # The `run` command itself: interpreter and imports, ray.init, the study's MLflow run, the spec
    # and provenance (7-8 s before the first phase), analysis, report and plots at the end (3-4 s).
    # The estimate's own step-time measurement, which `run` repeats before it starts, is added as
    # measured (``calibration_s``).
    "study_start_s": 11.0,
    # Per epoch (per round of a stacked group): tune.report with its checkpoint persisted to storage,
    # the round trip through the driver the trial waits for: 0.04-0.1 s a round of a group whose
    # rounds train little.
    "report_s": 0.05,
    # Per member and epoch of a stacked group, on top of its round's report: the member's share of the
    # round's checkpoint (every unfinished member's training state, 4.4 MB for 90 MLP members) and
    # of the driver's work on the round's result (each member's MLflow run, Tune's snapshot), which on
    # a machine whose cores the trials fill is taken from the trials. Measured on the batch-size
    # `local` preset stacked (2 cores): a confirm-epochs group of 90 members trained its 5 rounds in
    # 5.7 s alone in a plain process and took 11.2-11.9 s in the study, ~0.01 s per member-epoch.
    "member_result_s": 0.01,
}


# --------------------------------------------------------------------------------------------------
# Phases: exactly what a kind's ``run`` runs (the kind says which)
# --------------------------------------------------------------------------------------------------


def phases_of(spec: Any, kind: StudyKind) -> list[Phase]:
    """The phases ``run`` runs for ``spec``, in order, each with every trial config: the kind's
    :meth:`~studies.contract.StudyKind.phases`."""
    return kind.phases(spec)


# --------------------------------------------------------------------------------------------------
# Calibration mappings: given, saved, looked up
# --------------------------------------------------------------------------------------------------


def load_calibration(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A calibration JSON (what :func:`plan_study` returns under ``calibration``, saved elsewhere)."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a calibration is a JSON object, got {type(doc).__name__}")
    return doc


def save_calibration(calibration: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a calibration (e.g. ``plan_study(spec)["calibration"]`` on the target machine) as JSON."""
    out = Path(path)
    out.write_text(json.dumps(dict(calibration), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _lookup(cal: Mapping[str, Any], field: str, key: str) -> float | None:
    """``cal[field][key]``, else ``cal[field]["*"]``, else a number ``cal[field]``; ``None`` when absent."""
    value = cal.get(field)
    if isinstance(value, Mapping):
        value = value.get(key, value.get("*"))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"calibration {field}[{key!r}] must be a finite number >= 0, got {value!r}")
    return float(value)


def _constant(cal: Mapping[str, Any], name: str) -> float:
    v = _lookup(cal, name, "*")
    return DEFAULTS[name] if v is None else v


# --------------------------------------------------------------------------------------------------
# plan_study
# --------------------------------------------------------------------------------------------------


def _pack(durations: Sequence[float], slots: int, start_s: float) -> float:
    """Makespan of longest-processing-time-first greedy packing; each slot used pays ``start_s`` once."""
    if not durations:
        return 0.0
    used = min(slots, len(durations))
    loads = [start_s] * used
    heapq.heapify(loads)
    for d in sorted(durations, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + d)
    return max(loads)


def _slots(plan: StudyPlan, cpus: float, gpus: float) -> int:
    res = dict(plan.resources)
    cpu, gpu = float(res.get("cpu", 0.0)), float(res.get("gpu", 0.0))
    limits = [max(1, plan.max_concurrent)]
    if cpu > 0:
        limits.append(math.floor(cpus / cpu + 1e-9))
    if gpu > 0:
        limits.append(math.floor(gpus / gpu + 1e-9))
    slots = min(limits)
    if slots < 1:
        raise ValueError(
            f"a trial needs {cpu:g} CPU and {gpu:g} GPU; the cluster has {cpus:g} CPUs and {gpus:g} GPUs: "
            "no trial can start"
        )
    return int(slots)


def _by_batch(values: Sequence[tuple[int, int]]) -> dict[str, int]:
    return {str(b): n for b, n in sorted(set(values))}


def plan_study(
    spec: Any,
    kind: StudyKind,
    *,
    cpus: float | None = None,
    gpus: float | None = None,
    calibration: Mapping[str, Any] | None = None,
    calibrate: bool = True,
    steps: int = 10,
    warmup: int = 3,
    eval_rows: int = 256,
    cache: CalibrationCache | None = None,
) -> dict[str, Any]:
    """Trials, CPU/GPU-hours and wall time of ``spec`` before running it.

    Args:
        spec: a validated spec of any kind (``studies.kinds.load_study``).
        kind: the spec's kind (from the registry, :func:`studies.kinds.kind_for`).
        cpus / gpus: the cluster (default: this machine's CPUs, no GPU).
        calibration: measured values to use instead of measuring here (schema: the ``calibration``
            this function returns): ``step_s`` / ``eval_s`` / ``setup_s`` as ``{key: s}`` (``"*"``
            for every key) or one number, ``data`` as ``{data_key: {"train", "val", "test"}}``,
            ``stacked`` as ``{"<timing key>|K=<members>" (or "*"): {"step_s", "eval_s", "members"}}``
            (a stacked phase's group: :func:`studies.calibration.calibrate_stacked`; neither given nor
            measured: a group costs its members' separate times), and any of :data:`DEFAULTS`.
        calibrate: measure the keys the calibration lacks (``False``: a missing ``step_s`` is an error).
        steps / warmup / eval_rows: size of each measurement (:func:`calibrate_trial`).
        cache: a :class:`studies.calibration_cache.CalibrationCache` (what ``run``'s estimate passes):
            a key neither ``calibration`` nor the cache has is measured and kept in the cache; keys found
            there are listed under ``calibration["cached"]``. ``None``: measure (``plan``).

    Returns:
        ``{"study", "kind", "trials", "trials_max", "cpu_hours", "gpu_hours", "cpu_hours_max",
        "gpu_hours_max", "wall_s", "wall_s_max", "calibration_s" (the step-time measurement here, which
        ``run`` repeats: part of ``wall_s``), "cluster": {"cpus", "gpus"}, "phases": [{"name",
        "trials", "budget", "optional", "look", "refine", "epochs" | "updates", "epochs_by_batch_size",
        "updates_by_batch_size", "slots", "trial_s" (mean), "trial_s_min", "trial_s_max",
        "cpu_hours", "gpu_hours", "wall_s", "upper_bound"}], "calibration": {...}}``.
        ``trials`` / ``wall_s`` / ``*_hours``: no learning-rate range extension firing (one runs only
        when a tuned rate sits on its grid's edge), every tuned rate refined (the refinement phases:
        ``lr_tuning.refine``) and, for a sequential spec, every look run to ``max_seeds`` (a fixed
        design without refinement: the kind's ``total_trials(spec)``); ``trials_max`` /
        ``wall_s_max`` / ``*_hours_max`` count every extension too; a sequential spec also gets
        ``trials_expected`` / ``wall_s_expected`` / ``*_hours_expected``, the looks it is expected to
        run. Each count is what one real run can do, so each wall time can be held against one.

    Raises:
        ValueError: the cluster cannot start a trial, or a step time is missing with ``calibrate=False``.
    """
    cal: dict[str, Any] = json.loads(json.dumps(dict(calibration or {})))  # a deep, JSON-able copy
    cpus = float(os.cpu_count() or 1) if cpus is None else float(cpus)
    gpus = 0.0 if gpus is None else float(gpus)
    if cpus < 0 or gpus < 0:
        raise ValueError(f"cpus and gpus must be >= 0, got {cpus}, {gpus}")
    phases = phases_of(spec, kind)
    for ph in phases:  # a cluster that cannot start a trial: say so before timing anything
        _slots(ph.plan, cpus, gpus)

    # Split sizes per data config: from the calibration, else loaded as a trial would.
    data_sizes: dict[str, dict[str, int]] = {
        k: {s: int(n) for s, n in v.items()}
        for k, v in (cal.get("data") or {}).items()
        if isinstance(v, Mapping)
    }
    res = dict(phases[0].plan.resources) if phases else {}
    needs_gpu = float(res.get("gpu", 0.0)) > 0
    device = "cpu"
    if needs_gpu:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = max(1, int(float(res.get("cpu", 1.0)) or 1))

    def per_key(field: str) -> dict[str, Any]:
        value = cal.get(field)
        if isinstance(value, Mapping):
            return dict(value)
        return {} if value is None else {"*": value}  # one number: every key

    step_s, eval_s, setup_s = per_key("step_s"), per_key("eval_s"), per_key("setup_s")
    cal.update(step_s=step_s, eval_s=eval_s, setup_s=setup_s)
    measured: list[str] = []
    cached: list[str] = []
    missing: list[str] = []
    representative: dict[str, dict[str, Any]] = {}
    for ph in phases:
        for c in ph.configs:
            representative.setdefault(timing_key(c), c)
    calibration_started = time.perf_counter()
    for key, config in representative.items():
        if _lookup(cal, "step_s", key) is not None:
            continue
        hit = cache.get(config, threads=threads, device=device) if cache is not None else None
        if hit is not None:
            step_s[key], eval_s[key], setup_s[key] = hit["step_s"], hit["eval_s"], hit["setup_s"]
            data_sizes.setdefault(data_key(config), hit["data"])
            cached.append(key)
            continue
        if not calibrate:
            missing.append(key)
            continue
        m = calibrate_trial(
            config, steps=steps, warmup=warmup, eval_rows=eval_rows, threads=threads, device=device
        )
        step_s[key], eval_s[key], setup_s[key] = m["step_s"], m["eval_s"], m["setup_s"]
        data_sizes.setdefault(data_key(config), m["data"])
        measured.append(key)
        if cache is not None:
            cache.put(config, m, threads=threads, device=device)
    if cache is not None and measured:
        cache.save()
    # `run` measures again before it starts (its own estimate): the real run pays this once more.
    # A given calibration carries the time its measurement took on its machine, which `run` repeats.
    calibration_s = (
        time.perf_counter() - calibration_started if measured else (_lookup(cal, "calibration_s", "*") or 0.0)
    )
    if missing:
        raise ValueError(
            f"calibration has no step_s for {missing} (calibrate=False); measure them with calibrate=True "
            "or give step_s for those keys (or '*')"
        )
    cal.update(step_s=step_s, eval_s=eval_s, setup_s=setup_s)
    stacked_cal: dict[str, dict[str, Any]] = {
        k: dict(v) for k, v in (cal.get("stacked") or {}).items() if isinstance(v, Mapping)
    }
    stacked_started = time.perf_counter()
    stacked_measured: list[str] = []
    stacked_cached: list[str] = []
    for key, (config, members) in _stacked_keys(phases).items():
        if key in stacked_cal or "*" in stacked_cal:
            continue
        hit = (
            cache.get_stacked(config, members, threads=threads, device=device) if cache is not None else None
        )
        if hit is not None:
            stacked_cal[key] = hit
            stacked_cached.append(key)
            continue
        if not calibrate:
            continue  # neither given nor measured: the group costs its members' separate times
        stacked_cal[key] = calibrate_stacked(
            config, members, steps=steps, eval_rows=eval_rows, threads=threads, device=device
        )
        stacked_measured.append(key)
        if cache is not None:
            cache.put_stacked(config, stacked_cal[key], threads=threads, device=device)
    if stacked_measured:  # `run` measures these again too
        calibration_s += time.perf_counter() - stacked_started
        if cache is not None:
            cache.save()
    cal.update(stacked=stacked_cal, stacked_measured=stacked_measured, stacked_cached=stacked_cached)

    def sizes_of(config: Mapping[str, Any]) -> dict[str, int]:
        dk = data_key(config)
        if dk not in data_sizes:
            splits, _ = load_trial_data(config, "cpu")
            data_sizes[dk] = dict(splits.sizes)
        return data_sizes[dk]

    from autonorm_core.config import TrainConfig  # no torch: a cached calibration plans without it

    consts = {name: _constant(cal, name) for name in DEFAULTS}
    out_phases: list[dict[str, Any]] = []
    total_cpu_h = total_gpu_h = 0.0
    max_cpu_h = max_gpu_h = 0.0
    look_cost = {"trials": 0.0, "wall_s": 0.0, "cpu_hours": 0.0, "gpu_hours": 0.0}
    wall = wall_max = consts["study_start_s"] + calibration_s
    for ph in phases:
        res = dict(ph.plan.resources)
        durations: list[float] = []
        epochs_b: list[tuple[int, int]] = []
        updates_b: list[tuple[int, int]] = []
        budgets: set[str] = set()
        for c in ph.configs:
            key = timing_key(c)
            cfg = TrainConfig.from_dict(c.get("training", {}))
            n_train = sizes_of(c)["train"]
            updates, epochs = cfg.total_updates(n_train), cfg.num_epochs(n_train)
            epochs_b.append((cfg.batch_size, epochs))
            updates_b.append((cfg.batch_size, updates))
            budgets.add(cfg.budget)
            step = _lookup(cal, "step_s", key)
            assert step is not None  # measured or given above
            per_epoch = (_lookup(cal, "eval_s", key) or 0.0) + consts["report_s"]
            durations.append(
                consts["trial_start_s"]
                + (_lookup(cal, "setup_s", key) or 0.0)
                + updates * step
                + epochs * per_epoch
            )
        slots = _slots(ph.plan, cpus, gpus)
        seconds = sum(durations)
        groups = _stacked_groups(ph)
        if groups is not None:  # one Tune trial per group of stacks (execution.stack)
            durations = [
                _group_seconds(g, durations, ph.configs, cal, consts, stacked_cal, sizes_of) for g in groups
            ]
            seconds = sum(durations)
        phase_wall = consts["phase_start_s"] + _pack(durations, slots, consts["worker_start_s"])
        cpu_h = seconds * float(res.get("cpu", 0.0)) / 3600.0
        gpu_h = seconds * float(res.get("gpu", 0.0)) / 3600.0
        max_cpu_h += cpu_h
        max_gpu_h += gpu_h
        wall_max += phase_wall
        if _counted(ph):
            total_cpu_h += cpu_h
            total_gpu_h += gpu_h
            wall += phase_wall
        if getattr(ph, "look", False):
            for key, value in (
                ("trials", len(ph.configs)),
                ("wall_s", phase_wall),
                ("cpu_hours", cpu_h),
                ("gpu_hours", gpu_h),
            ):
                look_cost[key] += value
        budget = budgets.pop() if len(budgets) == 1 else "mixed"
        entry: dict[str, Any] = {
            "name": ph.name,
            "trials": len(ph.configs),
            "budget": budget,
            "optional": ph.optional,
            "look": bool(getattr(ph, "look", False)),
            "refine": bool(getattr(ph, "refine", False)),
        }
        if budget == "epochs":
            entry["epochs"] = max(e for _, e in epochs_b)
        elif budget == "updates":
            entry["updates"] = max(u for _, u in updates_b)
        entry.update(
            epochs_by_batch_size=_by_batch(epochs_b),
            updates_by_batch_size=_by_batch(updates_b),
            slots=slots,
            trial_s=seconds / len(ph.configs) if ph.configs else 0.0,
            groups=len(groups) if groups is not None else None,
            stacks=sum(len(g) for g in groups) if groups is not None else None,
            trial_s_min=min(durations, default=0.0),
            trial_s_max=max(durations, default=0.0),
            cpu_hours=cpu_h,
            gpu_hours=gpu_h,
            wall_s=phase_wall,
            upper_bound=ph.plan.scheduler.type != "fifo",
        )
        out_phases.append(entry)
    cal.update(
        data=data_sizes,
        calibration_s=calibration_s,
        **consts,
        device=device if measured else cal.get("device", device),
        threads=threads if measured else cal.get("threads", threads),
        measured=measured,
        cached=cached,
        machine=cal.get("machine") if not measured else f"{platform.machine()} x{os.cpu_count()} CPUs",
    )
    out = {
        "study": getattr(spec, "name", None),
        "kind": kind.name,
        "trials": sum(len(ph.configs) for ph in phases if _counted(ph)),
        "trials_max": sum(len(ph.configs) for ph in phases),
        "cpu_hours": total_cpu_h,
        "gpu_hours": total_gpu_h,
        "cpu_hours_max": max_cpu_h,
        "gpu_hours_max": max_gpu_h,
        "wall_s": wall,
        "wall_s_max": wall_max,
        "calibration_s": calibration_s,
        "cluster": {"cpus": cpus, "gpus": gpus},
        "phases": out_phases,
        "calibration": cal,
    }
    seq = getattr(spec, "sequential", None)
    if seq is not None:
        out.update(_expected_cost(spec, seq, out, look_cost))
    return out


def _stacked_groups(phase: Phase) -> list[list[list[int]]] | None:
    """The indices of ``phase.configs`` per group, per stack (:func:`workers.members.bundle_indices`,
    as the runner deals the grid), ``None`` when the phase runs one trial per process."""
    plan = phase.plan
    if plan.sampler.type != "grid" or plan.stack <= 1 or not phase.configs:
        return None
    from workers.members import bundle_indices

    return bundle_indices({}, phase.configs, plan.stack, plan.max_concurrent)


def _stacked_keys(phases: Sequence[Phase]) -> dict[str, tuple[dict[str, Any], int]]:
    """``<timing key>|K=<members>`` of the largest group of each timing key: what is measured."""
    largest: dict[str, tuple[dict[str, Any], int]] = {}
    for ph in phases:
        for g in (st for group in _stacked_groups(ph) or [] for st in group):
            config = ph.configs[g[0]]
            key = timing_key(config)
            if len(g) > largest.get(key, ({}, 0))[1]:
                largest[key] = (dict(config), len(g))
    return {f"{key}|K={k}": (config, k) for key, (config, k) in largest.items()}


def _stack_seconds(
    separate: Sequence[float],
    configs: Sequence[Mapping[str, Any]],
    cal: Mapping[str, Any],
    consts: Mapping[str, float],
    stacked_cal: Mapping[str, Mapping[str, Any]],
    sizes_of: Any,
) -> float:
    """One stack's seconds, as if it ran alone: its members' set-up one after the other, then its
    updates and epoch ends as one stacked model. A stacked update of K members is interpolated between
    the two measured points, the single trial's update and the largest stack's (``max(step_s,
    step_K_max * K / K_max)``), and so is an epoch end; each member's result adds ``member_result_s``
    an epoch."""
    from autonorm_core.config import TrainConfig

    key = timing_key(configs[0])
    measured = next((v for k, v in stacked_cal.items() if k.split("|K=")[0] == key), stacked_cal.get("*"))
    if measured is None or len(configs) == 1:  # one process still starts once
        return float(sum(separate)) - consts["trial_start_s"] * (len(configs) - 1)
    k, k_max = len(configs), int(measured["members"])
    cfg = TrainConfig.from_dict(configs[0].get("training", {}))
    n_train = sizes_of(configs[0])["train"]
    updates, epochs = cfg.total_updates(n_train), cfg.num_epochs(n_train)
    step = max(_lookup(cal, "step_s", key) or 0.0, float(measured["step_s"]) * k / k_max)
    epoch_end = max(_lookup(cal, "eval_s", key) or 0.0, float(measured["eval_s"]) * k / k_max)
    setup = (_lookup(cal, "setup_s", key) or 0.0) * k
    per_epoch = epoch_end + consts["report_s"] + consts["member_result_s"] * k
    return consts["trial_start_s"] + setup + updates * step + epochs * per_epoch


def _group_seconds(
    group: Sequence[Sequence[int]],
    separate: Sequence[float],
    configs: Sequence[Mapping[str, Any]],
    cal: Mapping[str, Any],
    consts: Mapping[str, float],
    stacked_cal: Mapping[str, Mapping[str, Any]],
    sizes_of: Any,
) -> float:
    """One group's seconds (one Tune trial): its stacks side by side (:func:`_stack_seconds` each),
    with one trial start and one report per round (the most epochs any of its stacks runs), not one
    per stack epoch."""
    from autonorm_core.config import TrainConfig

    total = 0.0
    epochs: list[int] = []
    for st in group:
        total += _stack_seconds(
            [separate[i] for i in st], [configs[i] for i in st], cal, consts, stacked_cal, sizes_of
        )
        config = configs[st[0]]
        epochs.append(TrainConfig.from_dict(config.get("training", {})).num_epochs(sizes_of(config)["train"]))
    total -= consts["trial_start_s"] * (len(group) - 1)
    return total - consts["report_s"] * (sum(epochs) - max(epochs, default=0))


def _counted(phase: Phase) -> bool:
    """Whether ``phase`` counts in ``plan``'s ``trials`` (not only in its maxima): every phase but the
    optional ones, and of those the later looks and the learning-rate refinement."""
    return not phase.optional or phase.look or phase.refine


def _expected_cost(
    spec: Any, seq: Any, plan: Mapping[str, Any], look_cost: Mapping[str, float]
) -> dict[str, Any]:
    """Expected trials, hours and wall time of a sequential spec, under no effect and under
    ``min_effect`` (:func:`studies.stats.expected_seeds`; the per-seed values' sd taken as
    ``min_effect``, i.e. a 1-SD effect, since no pilot says otherwise); ``trials_expected`` etc. are
    the larger of the two. The looks after the first cost in proportion to the seeds they add
    (``plan`` counts every look: the first look alone is ``plan`` less ``look_cost``)."""
    from studies.stats import expected_seeds

    schedule = seq.schedule()
    first, top = schedule[0], schedule[-1]
    analysis = getattr(spec, "analysis", None)
    alpha = float(getattr(analysis, "alpha", 0.05))
    family = int(getattr(spec, "sequential_family", 1))
    futility = 1.0 if seq.min_effect is not None else None
    scenarios: dict[str, Any] = {}
    for name, effect in (("no_effect", 0.0), ("min_effect", 1.0)):
        seeds = expected_seeds(
            schedule,
            family=family,
            alpha=alpha,
            effect=effect,
            min_effect=futility,
            prior_scale=seq.prior_scale,
        )
        share = (seeds - first) / (top - first) if top > first else 0.0
        scenarios[name] = {"seeds": seeds} | {
            key: plan[key] - (1.0 - share) * look_cost[key]
            for key in ("trials", "wall_s", "cpu_hours", "gpu_hours")
        }
    worst = max(scenarios.values(), key=lambda sc: sc["trials"])
    return {
        "trials_expected": round(worst["trials"]),
        "wall_s_expected": worst["wall_s"],
        "cpu_hours_expected": worst["cpu_hours"],
        "gpu_hours_expected": worst["gpu_hours"],
        "expected": {
            "looks": list(schedule),
            "family": family,
            "assumes": "per-seed sd = min_effect (a 1-SD effect); `plan --pilot` uses the pilot's",
            **scenarios,
        },
    }


def format_duration(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h`` (``n/a`` when not finite): the durations of a plan's text."""
    if not math.isfinite(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_plan(result: Mapping[str, Any]) -> str:
    """The plan as a few lines of text (what ``autonorm-study plan`` prints)."""
    c = result["cluster"]
    lines = [
        f"study {result['study']} ({result['kind']}): {result['trials']} trials, "
        f"{result['cpu_hours']:.3g} CPU h, {result['gpu_hours']:.3g} GPU h, wall ~{format_duration(result['wall_s'])} "
        f"on {c['cpus']:g} CPUs / {c['gpus']:g} GPUs",
    ]
    if result.get("trials_max", result["trials"]) != result["trials"]:
        lines.append(
            f"  at most {result['trials_max']} trials, wall ~{format_duration(result['wall_s_max'])} "
            "(every learning-rate range extension firing, every look to max_seeds)"
        )
    if "trials_expected" in result:
        exp = result["expected"]
        lines.append(
            f"  sequential, looks at {exp['looks']} seeds: expected ~{exp['no_effect']['seeds']:.1f} seeds with no "
            f"effect, ~{exp['min_effect']['seeds']:.1f} at min_effect: ~{result['trials_expected']} trials, "
            f"wall ~{format_duration(result['wall_s_expected'])}"
        )
    for ph in result["phases"]:
        size = (
            f"{ph['epochs']} epochs"
            if "epochs" in ph
            else f"{ph['updates']} updates"
            if "updates" in ph
            else ph["budget"]
        )
        # the refinement is optional too, but counted: it runs wherever a tuned rate is interior
        needed = (
            " (interior winners)" if ph.get("refine") else " (only if needed)" if ph.get("optional") else ""
        )
        groups = ph.get("groups")
        if groups:  # stacked: one Tune trial (and one time) per group of stacks
            per = (
                f"{ph.get('stacks') or groups} stacks in {groups} groups, "
                f"group ~{format_duration(ph['trial_s'] * ph['trials'] / groups)}"
            )
        else:
            per = f"trial ~{format_duration(ph['trial_s'])}"
        lines.append(
            f"  {ph['name']:<22} {ph['trials']:>5} trials x {size:<12} {per} "
            f"({format_duration(ph['trial_s_min'])}-{format_duration(ph['trial_s_max'])}), {ph['slots']} at once, "
            f"wall ~{format_duration(ph['wall_s'])}"
            + (" (upper bound: early stopping)" if ph["upper_bound"] else "")
            + needed
        )
    cal = result["calibration"]
    for key, timing in sorted((cal.get("stacked") or {}).items()):
        if isinstance(timing, Mapping) and timing.get("stacked") is False:
            lines.append(f"  not stacked: {key.split('|K=')[0]}: {timing.get('reason') or 'no stacked form'}")
    lines.append(
        f"  calibration: {len(cal.get('measured') or [])} keys measured here ({cal.get('machine')})"
        + (f", {len(cal['cached'])} from this machine's cache" if cal.get("cached") else "")
        + ", "
        f"trial start {cal['trial_start_s']:g} s, worker start {cal['worker_start_s']:g} s"
    )
    return "\n".join(lines)
