"""Examples/s of K members trained stacked (``fit_stacked``) against the same K trained one by one (``fit``).

Usage::

    python bench/stacking.py                  # MLP, CNN, ViT-Lite tiny; B = 8, 64; K = 1, 4, 16
    python bench/stacking.py --quick          # B = 8, K = 1, 4, 2 updates per fit, 1 round (seconds; for tests)
    python bench/stacking.py --device cuda    # the GPU variant (bench/gpu_smoke.sh)

Each case is a whole training run, as a study trial runs it: K members of one ``tiny`` preset (each
built under its own seed), one epoch of ``--updates`` updates at batch size B on synthetic
Fashion-MNIST-shaped data (1x28x28, 10 classes, already on the device), followed by the per-epoch
evaluation on 64 validation and 64 test examples. ``separate``: K calls of
``autonorm_core.training.fit``, one after the other (K plain loops); ``stacked``: one call of
``autonorm_core.stacking.fit_stacked`` over the K members. MLP and CNN train with plain SGD (their
specs' optimizer), ViT-Lite with AdamW, clipping and label smoothing (the AutoNorm search's). Both
modes of a (model, B, K) cell are timed round-robin in the same rounds (order reversed every other
round); each number is a median over rounds. On CPU the clock is the process's CPU time with
``--threads`` intra-op threads (1 by default, like bench/step.py), so other jobs on the machine's
cores enter the numbers as little as possible; on CUDA it is wall time after a synchronize.

JSON (``bench/results/stacking.json``, ``--output`` elsewhere)::

    {"gain": {"<model>": {"<B>": {"<K>": stacked examples/s / separate examples/s}}},
     "examples_per_s": {"<model>": {"<B>": {"<K>": {"stacked": ..., "separate": ...}}}},
     "goals": {...}, "goals_met": {...}, "machine": ..., "date": ..., "load_avg_1m": ..., "setup": {...}}

Goals: 16 stacked MLP members at B = 8 reach >= 5x the examples/s of 16 separate loops; CNN and
ViT-Lite >= 2x.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autonorm_core.data import Splits
from autonorm_core.stacking import create_members, fit_stacked
from autonorm_core.training import TrainConfig, fit

RESULTS = Path(__file__).resolve().parent / "results" / "stacking.json"
MODELS = ("mlp", "cnn", "vit_lite")
GOALS = {"mlp": 5.0, "cnn": 2.0, "vit_lite": 2.0}  # at K = 16, B = 8
_MODEL_KWARGS: dict[str, dict[str, Any]] = {
    "mlp": {"preset": "tiny"},
    "cnn": {"preset": "tiny"},
    "vit_lite": {"preset": "tiny", "norm": "autonorm"},
}


def _config(model: str, batch: int) -> TrainConfig:
    if model == "vit_lite":
        return TrainConfig(epochs=1, batch_size=batch, lr=1e-3, compile="off")
    return TrainConfig(
        epochs=1,
        batch_size=batch,
        lr=0.05,
        optimizer="sgd",
        weight_decay=0.0,
        schedule="constant",
        warmup_fraction=0.0,
        grad_clip=None,
        label_smoothing=0.0,
        compile="off",
    )


def _splits(batch: int, updates: int, device: torch.device) -> Splits:
    g = torch.Generator().manual_seed(0)

    def part(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 10, (n,), generator=g)
        x = torch.randn(n, 1, 28, 28, generator=g) + 0.1 * y[:, None, None, None].float()
        return x.to(device), y.to(device)

    return Splits("synthetic", part(batch * updates), part(64), part(64), "classification", 10, (1, 28, 28))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _case(
    model: str, batch: int, k: int, mode: str, splits: Splits, device: torch.device
) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """``(build, train)``: members are built outside the clock (a trial's model init is not training)."""
    cfg = _config(model, batch)
    seeds = list(range(k))

    def build() -> Any:
        return create_members(model, splits, seeds, **_MODEL_KWARGS[model])

    def train(members: Any) -> None:
        if mode == "stacked":
            out = fit_stacked(members, splits, cfg, seeds=seeds, device=device)
            assert out.stacked, out.reason
        else:
            for seed, member in zip(seeds, members):
                fit(member, splits, cfg, seed=seed, device=device)

    return build, train


def time_cell(
    model: str, batch: int, k: int, *, updates: int, repeats: int, device: torch.device, warmup: bool = True
) -> dict[str, float]:
    """Median examples/s (all K members together) of both modes of one cell."""
    splits = _splits(batch, updates, device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    runs = {mode: _case(model, batch, k, mode, splits, device) for mode in ("separate", "stacked")}
    if warmup:  # one member each way: allocator, lazy initialisation, first-call dispatch
        for mode in runs:
            build, train = _case(model, batch, 1, mode, splits, device)
            train(build())
    samples: dict[str, list[float]] = {mode: [] for mode in runs}
    names = list(runs)
    for r in range(repeats):
        for mode in names if r % 2 == 0 else names[::-1]:
            build, train = runs[mode]
            members = build()
            gc.collect()
            _sync(device)
            t0 = clock()
            train(members)
            _sync(device)
            samples[mode].append(k * batch * updates / (clock() - t0))
    return {mode: statistics.median(v) for mode, v in samples.items()}


def run_all(
    *,
    models: tuple[str, ...],
    batches: tuple[int, ...],
    ks: tuple[int, ...],
    updates: int,
    repeats: int,
    device: torch.device,
    warmup: bool = True,
) -> dict[str, Any]:
    gain: dict[str, dict[str, dict[str, float]]] = {}
    raw: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for model in models:
        for batch in batches:
            for k in ks:
                eps = time_cell(
                    model, batch, k, updates=updates, repeats=repeats, device=device, warmup=warmup
                )
                ratio = eps["stacked"] / eps["separate"]
                gain.setdefault(model, {}).setdefault(str(batch), {})[str(k)] = ratio
                raw.setdefault(model, {}).setdefault(str(batch), {})[str(k)] = eps
                print(
                    f"{model:9s} B={batch:<3d} K={k:<3d} separate {eps['separate']:9.0f} ex/s   "
                    f"stacked {eps['stacked']:9.0f} ex/s   gain {ratio:6.2f}x",
                    flush=True,
                )
    goals_met = {}
    for model, goal in GOALS.items():
        g = gain.get(model, {}).get("8", {}).get("16")
        if g is not None:
            goals_met[model] = g >= goal
            print(
                f"goal {model}: 16 stacked at B=8 = {g:.2f}x separate (goal >= {goal}x): "
                f"{'met' if g >= goal else 'NOT met'}"
            )
    return {
        "gain": gain,
        "examples_per_s": raw,
        "goals": {f"{m}_k16_b8": v for m, v in GOALS.items()},
        "goals_met": goals_met,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--ks", default="1,4,16")
    parser.add_argument("--updates", type=int, default=30, help="updates per fit (one epoch)")
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds (median taken)")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (ignored on CUDA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="B = 8, K = 1 and 4, 2 updates per fit, 1 round, no warm-up (for tests)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.repeats, args.batches, args.ks = 2, 1, "8", "1,4"
    models = tuple(m for m in args.models.split(",") if m)
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    result = run_all(
        models=models,
        batches=tuple(int(b) for b in args.batches.split(",")),
        ks=tuple(int(k) for k in args.ks.split(",")),
        updates=args.updates,
        repeats=args.repeats,
        device=device,
        warmup=not args.quick,
    )
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs"
    result["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    result["load_avg_1m"] = os.getloadavg()[0]
    result["setup"] = {
        "models": {m: _MODEL_KWARGS[m] for m in models},
        "data": "synthetic 1x28x28, 10 classes, on the device; val/test 64 examples",
        "run": f"one epoch of {args.updates} updates + evaluation, per member",
        "optimizer": "mlp/cnn: SGD lr 0.05; vit_lite: AdamW, clip 1.0, label smoothing 0.1",
        "repeats": f"{args.repeats} (median), round-robin",
        "clock": "process CPU time" if device.type == "cpu" else "wall time after synchronize",
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
