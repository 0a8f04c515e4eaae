"""Cost of one whole training step of ViT-Lite with AutoNorm, against the same model with LayerNorm.

Usage::

    python bench/step.py                  # paper preset, 28x28, batch 64, writes bench/results/step.json
    python bench/step.py --quick          # tiny preset, batch 8, 3 rounds (seconds; for tests)
    python bench/step.py --device cuda --compile --bf16   # the GPU variant (bench/gpu_smoke.sh)

One step is what ``autonorm_core.training.fit`` does per batch: forward, label-smoothed cross-entropy,
``zero_grad``, backward, gradient clipping at 1.0 and AdamW over ``autonorm_core.optim.param_groups``.
The input batch (``B x 1 x 28 x 28``, Fashion-MNIST's shape) and its labels are synthetic and already
on the device. Every case is its own freshly initialised model (seed 0) in training mode; the cases
are timed round-robin in the same loop (order reversed every other round) and each ratio is a
median over rounds. On CPU the clock is the process's CPU time with ``--threads`` intra-op threads
(1 by default, like bench/norms.py), so other jobs on the machine's cores enter the numbers as
little as possible; on CUDA it is wall time after a synchronize.

Ratios written to the JSON (``bench/results/step.json``):

* ``autonorm_over_frozen_ln``: AutoNorm in every sub-layer / LayerNorm in every sub-layer (the
  ``frozen_ln`` arm). Goal ≤ 1.10.
* ``autonorm_reference_over_frozen_ln``: the same AutoNorm with its eager fast paths switched off
  (``autonorm_core.norms.helpers._reference_paths``): the code before the fused mixture, same rounds.
* ``dyt_over_layernorm``: DyT in every sub-layer / LayerNorm in every sub-layer.
* ``autonorm_s_frozen_over_frozen_ln``: AutoNorm-S after its freeze with every gate at LayerNorm
  (the frozen-hard fast path) / LayerNorm.
* ``both_branches_floor``: (FrozenDyT step + FrozenLN step − the step with no norm) / FrozenLN step:
  a model whose every norm computed LayerNorm AND DyT with no selector and no mixing. Any AutoNorm
  computes both branches, so ``autonorm_over_frozen_ln`` cannot go below this on the same kernels;
  what lies between the two is the selector, the mixing and the gate's parameters in AdamW.
* ``<case>_ms``: median milliseconds per step; ``load_avg_1m``: the 1-minute load average at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autonorm_core.models import PRESETS, ViTLite, ViTLiteConfig
from autonorm_core.norms import AutoNorm
from autonorm_core.norms.helpers import _reference_paths
from autonorm_core.optim import adamw, param_groups

RESULTS = Path(__file__).resolve().parent / "results" / "step.json"
GOAL = 1.10
CASES = ("frozen_ln", "frozen_dyt", "autonorm", "autonorm_reference", "autonorm_s_frozen", "no_norm")
_NORM = {
    "no_norm": "identity",
    "frozen_ln": "layernorm",
    "frozen_dyt": "dyt",
    "autonorm": "autonorm",
    "autonorm_reference": "autonorm",
    "autonorm_s_frozen": "autonorm",
}


def build_model(case: str, preset: str, device: torch.device) -> nn.Module:
    """ViT-Lite for 1x28x28 inputs and 10 classes, with ``case``'s norm in every sub-layer."""
    torch.manual_seed(0)
    cfg = ViTLiteConfig(
        **PRESETS["vit_lite"][preset],
        norm=_NORM[case],
        in_channels=1,
        image_size=(28, 28),
        num_classes=10,
    )
    model = ViTLite(cfg)
    if case == "autonorm_s_frozen":  # every gate frozen on LayerNorm (weight 1 - 1.5e-8)
        for m in model.modules():
            if isinstance(m, AutoNorm):
                k = m.candidates.index("layernorm")
                with torch.no_grad():
                    m.selector.fc2.weight.zero_()
                    m.selector.fc2.bias.fill_(-9.0)
                    m.selector.fc2.bias[k] = 9.0
                m.freeze()
    return model.to(device).train()


def make_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    reference: bool,
    compile_: bool,
    bf16: bool,
) -> Callable[[], None]:
    """One ``fit``-like update of ``model`` on the batch ``(x, y)``."""
    opt = adamw(param_groups(model, weight_decay=1e-4), lr=1e-3)  # what fit builds
    params = [p for group in opt.param_groups for p in group["params"]]
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compile_ else model

    def step() -> None:
        ctx = _reference_paths() if reference else contextlib.nullcontext()
        amp = torch.autocast(x.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            with amp:
                out = forward(x)
            loss = F.cross_entropy(out.float(), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    import gc

    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def time_steps(
    steps: dict[str, Callable[[], None]], *, repeats: int, inner: int, warmup: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per step of every case, timed round-robin."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    for step in steps.values():
        for _ in range(warmup):
            step()
    _sync(device)
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    with _quiet_gc():
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                _sync(device)
                t0 = clock()
                for _ in range(inner):
                    steps[name]()
                _sync(device)
                samples[name].append((clock() - t0) / inner)
    return {name: statistics.median(v) for name, v in samples.items()}


def run(
    *,
    preset: str,
    batch: int,
    repeats: int,
    inner: int,
    warmup: int,
    device: torch.device,
    compile_: bool = False,
    bf16: bool = False,
    cases: tuple[str, ...] = CASES,
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    steps = {
        case: make_step(
            build_model(case, preset, device),
            x,
            y,
            reference=case.endswith("_reference"),
            compile_=compile_,
            bf16=bf16,
        )
        for case in cases
    }
    t = time_steps(steps, repeats=repeats, inner=inner, warmup=warmup, device=device)
    base = t["frozen_ln"]
    keys = {
        "autonorm_over_frozen_ln": "autonorm",
        "autonorm_reference_over_frozen_ln": "autonorm_reference",
        "dyt_over_layernorm": "frozen_dyt",
        "autonorm_s_frozen_over_frozen_ln": "autonorm_s_frozen",
    }
    result: dict[str, Any] = {key: t[case] / base for key, case in keys.items() if case in t}
    if {"frozen_dyt", "no_norm"} <= t.keys():
        result["both_branches_floor"] = (t["frozen_dyt"] + base - t["no_norm"]) / base
    result["goal_autonorm_over_frozen_ln"] = GOAL
    result.update({f"{case}_ms": sec * 1e3 for case, sec in t.items()})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="paper", choices=("paper", "tiny"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds (median taken)")
    parser.add_argument("--inner", type=int, default=2, help="steps per timing sample")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (ignored on CUDA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward")
    parser.add_argument("--quick", action="store_true", help="tiny preset, batch 8, 3 rounds (for tests)")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated subset of {','.join(CASES)} (frozen_ln always)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cases = tuple(dict.fromkeys(["frozen_ln", *(c for c in args.cases.split(",") if c)]))
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    if args.quick:
        args.preset, args.batch, args.repeats, args.inner, args.warmup = "tiny", 8, 3, 1, 1
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    result = run(
        preset=args.preset,
        batch=args.batch,
        repeats=args.repeats,
        inner=args.inner,
        warmup=args.warmup,
        device=device,
        compile_=args.compile,
        bf16=args.bf16,
        cases=cases,
    )
    result["load_avg_1m"] = os.getloadavg()[0]
    result["setup"] = {
        "model": f"vit_lite {args.preset} preset, 1x28x28, 10 classes",
        "batch": args.batch,
        "step": "forward + label-smoothed CE + backward + clip 1.0 + AdamW",
        "repeats": f"{args.repeats}x{args.inner} (median), round-robin",
        "clock": "process CPU time" if device.type == "cpu" else "wall time after synchronize",
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "device": str(device),
        "compile": args.compile,
        "bf16": args.bf16,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs",
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
