"""Measure a trial's step times on this machine: the calibration :func:`studies.planning.plan_study`
prices a study with.

:func:`calibrate_trial` builds one distinct (model, data, batch size) of a study exactly as a trial
does (the trial's data parsing, :func:`autonorm_core.data.load_dataset`,
:func:`autonorm_core.models.create_model` under the trial's seeded RNG fork,
:meth:`autonorm_core.training.TrainConfig.from_dict`) and runs a few real updates of
:func:`autonorm_core.training.fit`. ``step_s`` is the median time between the starts of consecutive
training forwards (one whole update: forward, loss, backward, optimizer step, batch indexing),
warm-up updates excluded, with torch limited to the trial's CPUs (Ray sets ``OMP_NUM_THREADS`` to
them). ``eval_s`` is one epoch's end: validation and test passes (timed on a subset of ``eval_rows``
rows each and scaled to the real split sizes) plus the checkpoint the trial writes every epoch.
``setup_s`` is loading the data and building the model, which a trial does at its start.

A measurement is keyed by :func:`timing_key` (model, data, batch size: a budget changes how many
updates and epochs a trial runs, not how long one takes) and its split sizes by :func:`data_key`;
:class:`studies.calibration_cache.CalibrationCache` keys its entries with both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["calibrate_stacked", "calibrate_trial", "data_key", "load_trial_data", "timing_key"]

# --------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _data_section(config: Mapping[str, Any]) -> dict[str, Any]:
    return dict(config.get("data") or {})


def data_key(config: Mapping[str, Any]) -> str:
    """``digits`` or ``digits{...}`` with the data section's other fields (sizes do not depend on the seed)."""
    data = _data_section(config)
    name = str(data.pop("type", "?"))
    data = {k: v for k, v in data.items() if v is not None}
    return name + (_canonical(data) if data else "")


def timing_key(config: Mapping[str, Any]) -> str:
    """The calibration key of a trial config: model, data and batch size, e.g.
    ``mlp:tiny[hidden=[32],layer=corrected]|digits|B=32``.

    Sub-sections with a ``type`` show as ``name=type`` (the arm of a batch-size study, the norm and
    linear of a search), other fields as ``name=value``; learning rate, seed, epochs and budget are
    not part of it (they do not change how long one update takes).
    """
    model = dict(config.get("model") or {})
    mtype = str(model.pop("type", "?"))
    preset = model.pop("preset", None)
    parts = []
    for name in sorted(model):
        value = model[name]
        if isinstance(value, Mapping):
            if "type" in value:
                parts.append(f"{name}={value['type']}")
        elif value is not None:
            parts.append(f"{name}={_canonical(value)}")
    head = mtype + (f":{preset}" if preset is not None else "")
    batch = (config.get("training") or {}).get("batch_size")
    data = _data_section(config).get("type", "?")
    return f"{head}[{','.join(parts)}]|{data}|B={batch}"


# --------------------------------------------------------------------------------------------------
# Calibration: real training steps through the trial's code path
# --------------------------------------------------------------------------------------------------


_LOADER_KEYS = ("path", "target", "test_path", "test_fraction", "ood_test", "max_tokens")
"""The data loaders' own keywords: the generic loaders' (``arrays``, ``table``) and ``oanc_pos``'s."""


def _trial_data_args(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The data-set name and :func:`load_dataset` keywords, parsed as :func:`workers.trainable.autonorm_trial` does."""
    data = _data_section(config)
    name = str(data.pop("type"))
    subset = data.pop("subset", None)
    if isinstance(subset, list):
        subset = tuple(subset)
    kwargs = {
        "seed": int(config.get("seed", 0)),
        "data_root": data.pop("data_root", None),
        "val_fraction": float(data.pop("val_fraction", 0.1)),
        "subset": subset,
    }
    for key in _LOADER_KEYS:
        value = data.pop(key, None)
        if value is not None:
            kwargs[key] = value
    if data:
        raise ValueError(f"unknown data keys {sorted(data)}; valid: type, subset, val_fraction, data_root")
    return name, kwargs


def load_trial_data(config: Mapping[str, Any], device: str) -> tuple[Any, float]:
    """The splits a trial of ``config`` loads, loaded the same way, and the seconds loading took."""
    from autonorm_core.data import load_dataset

    name, kwargs = _trial_data_args(config)
    t0 = time.perf_counter()
    splits = load_dataset(name, device=device, **kwargs)
    return splits, time.perf_counter() - t0


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Marks:
    """``fit`` callback + model hook + checkpoint_fn recording when each part of an epoch starts."""

    def __init__(self, out_dir: str) -> None:
        self.events: list[tuple[float, str]] = []
        self._path = os.path.join(out_dir, "state.pt")

    def forward(self, module: Any, args: Any) -> None:
        self.events.append((time.perf_counter(), "train" if module.training else "eval"))

    def checkpoint_fn(self, epoch: int, state: dict[str, Any]) -> None:
        from autonorm_core.training import save_state

        self.events.append((time.perf_counter(), "ckpt"))
        save_state(self._path, state)  # what the trial's report does with every epoch's state
        self.events.append((time.perf_counter(), "ckpt_end"))

    def on_epoch_end(self, epoch: int, model: Any, metrics: dict[str, float]) -> None:
        self.events.append((time.perf_counter(), "epoch"))


def calibrate_trial(
    config: Mapping[str, Any],
    *,
    steps: int = 10,
    warmup: int = 3,
    eval_rows: int = 256,
    threads: int = 1,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time one trial config's real training steps on this machine.

    Builds data, model and training config as :func:`workers.trainable.autonorm_trial` does, then runs
    :func:`autonorm_core.training.fit` for ``warmup + steps + 1`` updates (``budget="updates"``; the
    validation and test splits cut to ``eval_rows`` rows so the epoch ends stay cheap) with hooks
    that record the start of every forward pass and the checkpoint write.

    Returns:
        ``{"step_s", "eval_s", "setup_s", "steps", "data": {"train", "val", "test"}}``: the median
        update time after the warm-up, one epoch end (validation + test passes scaled to the real
        split sizes, plus the checkpoint), data loading + model build, the updates timed, the split
        sizes.
    """
    import torch

    from autonorm_core.models import create_model
    from autonorm_core.training import TrainConfig, fit

    if steps < 1 or warmup < 0 or eval_rows < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, eval_rows >= 1; got {steps}, {warmup}, {eval_rows}")
    seed = int(config.get("seed", 0))
    with _torch_threads(threads):
        splits, load_s = load_trial_data(config, device)
        model_cfg = dict(config["model"])
        model_name = model_cfg.pop("type")
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = create_model(model_name, splits, **model_cfg)
        cfg = TrainConfig.from_dict(config.get("training", {}))
        build_s = time.perf_counter() - t0
        sizes = dict(splits.sizes)
        e_val, e_test = min(eval_rows, sizes["val"]), min(eval_rows, sizes["test"])
        small = dataclasses.replace(
            splits,
            val=(splits.val[0][:e_val], splits.val[1][:e_val]),
            test=(splits.test[0][:e_test], splits.test[1][:e_test]),
        )
        timing_cfg = dataclasses.replace(cfg, budget="updates", max_updates=warmup + steps + 1)
        with tempfile.TemporaryDirectory(prefix="autonorm-plan-") as tmp:
            marks = _Marks(tmp)
            handle = model.register_forward_pre_hook(marks.forward)
            try:
                fit(
                    model,
                    small,
                    timing_cfg,
                    seed=seed,
                    callbacks=(marks,),
                    device=device,
                    checkpoint_fn=marks.checkpoint_fn,
                )
            finally:
                handle.remove()
    ev = marks.events
    intervals = [b[0] - a[0] for a, b in itertools.pairwise(ev) if a[1] == "train" and b[1] == "train"]
    timed = intervals[warmup:] or intervals
    if not timed:
        raise RuntimeError(f"no update was timed for {timing_key(config)} (events: {len(ev)})")
    evals: list[float] = []
    ckpts: list[float] = []
    start: float | None = None
    prev = 0.0
    for t, what in ev:
        if what == "eval" and start is None:
            start = t
        elif what == "ckpt":
            if start is not None:
                evals.append(t - start)
            start = None
        elif what == "ckpt_end":
            ckpts.append(t - prev)
        prev = t
    evals = evals[1:] or evals  # the first epoch end warms the evaluation up
    ckpts = ckpts[1:] or ckpts
    scale = (sizes["val"] + sizes["test"]) / max(1, e_val + e_test)
    eval_s = (statistics.median(evals) if evals else 0.0) * scale
    eval_s += statistics.median(ckpts) if ckpts else 0.0
    return {
        "step_s": float(statistics.median(timed)),
        "eval_s": float(eval_s),
        "setup_s": float(load_s + build_s),
        "steps": len(timed),
        "data": sizes,
    }


def calibrate_stacked(
    config: Mapping[str, Any],
    members: int,
    *,
    steps: int = 10,
    eval_rows: int = 256,
    threads: int = 1,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time ``members`` trials of ``config`` trained as one stacked model (``execution.stack``).

    A stacked update cannot be hooked from outside :func:`autonorm_core.stacking.fit_stacked`, so it
    is timed by difference: three one-epoch stacked fits of the members (seeds ``0 .. members-1``, as
    a group trial builds them), A with ``steps`` updates and ``eval_rows`` evaluation rows, B with
    ``2 * steps`` updates, C with ``2 * eval_rows`` rows; ``step_s = (B - A) / steps`` and the
    evaluation's time per row ``(C - A) / eval_rows``, scaled to the real split sizes. Set-up,
    warm-up and the per-epoch checkpoint are in all three fits and cancel (the checkpoint is left out:
    for these models it is small next to an epoch).

    Returns:
        ``{"step_s", "eval_s", "members", "stacked", "reason"}``: one stacked update of every member,
        one epoch end of the whole group, the member count and whether the members stacked (``False``:
        the model has no stacked form and the members train one after the other, ``reason`` says why;
        the times are then those of that fallback).
    """
    import torch

    from autonorm_core.models import create_model
    from autonorm_core.stacking import fit_stacked
    from autonorm_core.training import TrainConfig

    if members < 1 or steps < 1 or eval_rows < 1:
        raise ValueError(f"need members, steps and eval_rows >= 1; got {members}, {steps}, {eval_rows}")
    with _torch_threads(threads):
        splits, _ = load_trial_data(config, device)
        sizes = dict(splits.sizes)
        cfg = TrainConfig.from_dict(config.get("training", {}))
        model_cfg = dict(config["model"])
        model_name = model_cfg.pop("type")

        def run(updates: int, rows: int) -> tuple[float, bool]:
            e_val, e_test = min(rows, sizes["val"]), min(rows, sizes["test"])
            small = dataclasses.replace(
                splits,
                val=(splits.val[0][:e_val], splits.val[1][:e_val]),
                test=(splits.test[0][:e_test], splits.test[1][:e_test]),
            )
            models = []
            for seed in range(members):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    models.append(create_model(model_name, small, **model_cfg))
            timing = dataclasses.replace(cfg, budget="updates", max_updates=updates)
            states: list[Any] = []
            t0 = time.perf_counter()
            out = fit_stacked(
                models,
                small,
                timing,
                seeds=list(range(members)),
                device=device,
                checkpoint_fn=lambda epoch, st: states.append(st),
            )
            return time.perf_counter() - t0, out.stacked

        per_epoch = max(1, cfg.steps_per_epoch(sizes["train"]))
        n = max(1, min(steps, per_epoch // 2))  # A and B stay within one epoch
        a, stacked = run(n, eval_rows)
        b, _ = run(2 * n, eval_rows)
        c, _ = run(n, 2 * eval_rows)
    step_s = max(0.0, (b - a) / n)
    rows = min(eval_rows, sizes["val"]) + min(eval_rows, sizes["test"])
    per_row = max(0.0, (c - a) / max(1, rows))
    eval_s = per_row * (sizes["val"] + sizes["test"])
    from autonorm_core.stacking import stackable

    _, reason = stackable(dict(config))
    return {
        "step_s": float(step_s),
        "eval_s": float(eval_s),
        "members": members,
        "stacked": bool(stacked),
        "reason": "" if stacked else (reason or "fit_stacked fell back to separate fits"),
    }
