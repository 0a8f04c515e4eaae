"""Forward+backward cost of every norm as a ratio to ``nn.LayerNorm`` measured in the same run.

Usage::

    python bench/norms.py                 # both shapes, eager + torch.compile, writes bench/results/norms.json
    python bench/norms.py --no-compile --repeats 5  # quick look

What is timed: one training step's worth of norm work, ``y = norm(x)`` followed by
``torch.autograd.grad(y, [x, *params], dy, allow_unused=True)`` (gradients returned, not accumulated, as inside a model),
in training mode. Every case is timed round-robin in the same loop and each ratio is a median over
rounds. On CPU the clock is the thread's CPU time with one intra-op thread (``--threads``), so other
processes competing for the cores do not enter the numbers; on CUDA it is wall time after a sync.

Ratios written to the JSON (``{"<name>": ratio}``, floats only):

* ``<norm>``: eager norm / eager ``nn.LayerNorm``; ``<norm>_compiled``: compiled norm / eager
  ``nn.LayerNorm`` (the fused kernel stays the reference; ``layernorm_compiled`` shows how compiling
  the baseline itself fares).
* ``autonorm_over_branches``: AutoNorm / (LayerNorm + DyT), each in the same mode (eager, or all
  compiled for ``_compiled``). Goal ≤ 1.6 eager, ≤ 1.1 compiled: the selector and the mixing cost
  little beyond the branches. ``autonorm_reference_over_branches`` is the same AutoNorm with its eager
  fast paths switched off (``autonorm_core.norms.helpers._reference_paths``: module calls, autograd over the
  lerp, ``MeanBackward``), i.e. the code before the fused mixture, timed in the same rounds.
* ``frozen_hard_over_branch``: frozen AutoNorm whose gate picks LayerNorm for every sample / LayerNorm,
  EAGER (the default path on CPU; ``_compiled`` is the compiled pair). Goal ≤ 1.15: the fast path
  costs its one branch plus the selector. ``frozen_hard_dyt_over_branch`` is the same with DyT selected.
* ``frozen_hard_floor``: (LayerNorm + the gate's token mean) / LayerNorm, timed in the same rounds —
  the least a frozen gate can cost on top of its branch, since the method pools every token of the
  input to choose; the part of ``frozen_hard_over_branch`` above it is ours (the selector MLP, the
  decision, dispatch). ``token_mean`` alone is also reported (as ``<name>``, over LayerNorm).
* ``load_avg_1m``: the machine's 1-minute load average at the end of the run (noise indicator);
  ``allocator_steady``: 1.0 when glibc was told to keep freed memory (see below), else 0.0.

Allocator (CPU): by default the script raises glibc's ``M_MMAP_THRESHOLD``/``M_TRIM_THRESHOLD`` so that
freed blocks are reused instead of returned to the kernel and faulted in again on the next step. In
a model's training loop the heap is already in that steady state (bench/step.py spends ~1 % of its
time in the kernel); a loop over one layer is not, and page faults on its fresh 2–10 MB buffers then
make up a third of the measured time and most of its run-to-run spread. ``--allocator default``
measures with glibc's defaults instead.

Which path is the default per device (docs/architecture.md): on CPU the eager hand-written mixture
(``torch.compile``'s CPU code is slower than ATen's fused LayerNorm, see ``layernorm_compiled``); on
CUDA, compile the model (Inductor fuses the reference expressions that compiled graphs take).
* Keys without a shape suffix are the maximum over the shapes (the conservative value for the goals);
  ``<key>@BxTxD`` holds each shape's value.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autonorm_core.norms import AutoNorm, create_norm
from autonorm_core.norms.helpers import _reference_paths

SHAPES = ((64, 65, 128), (32, 197, 384))
GOALS = {"autonorm_over_branches": 1.6, "frozen_hard_over_branch": 1.15}
QUICK_SHAPES = ((8, 17, 32),)


def _frozen_autonorm(dim: int, branch: str) -> nn.Module:
    """Frozen AutoNorm whose gate gives ``branch`` weight ≈ 1 − 1e-8 for every sample."""
    m = AutoNorm(dim, seed=0)
    k = m.candidates.index(branch)
    with torch.no_grad():
        m.selector.fc2.weight.zero_()
        m.selector.fc2.bias.fill_(-9.0)
        m.selector.fc2.bias[k] = 9.0
    m.freeze()
    return m


class _TokenMean(nn.Module):
    """The gate's pooling pass alone (no graph: a frozen gate builds none), for ``frozen_hard_floor``."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return x.mean(dim=1) if x.ndim == 3 else x


def _steady_allocator() -> bool:
    """Keep freed heap memory in the process (glibc ``mallopt``); False where that is unavailable."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    big = 1 << 30
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, big))


def _cases(dim: int) -> dict[str, Callable[[], nn.Module]]:
    return {
        "layernorm": lambda: nn.LayerNorm(dim),
        "rmsnorm": lambda: create_norm("rmsnorm", dim),
        "dyt": lambda: create_norm("dyt", dim),
        "dyt_naive": lambda: create_norm("dyt", dim, fused=False),
        "adanorm": lambda: create_norm("adanorm", dim),
        "film": lambda: create_norm("film", dim),
        "random_selector": lambda: create_norm("random_selector", dim, seed=0),
        "autonorm": lambda: create_norm("autonorm", dim, seed=0, selector_init="default"),
        "autonorm_reference": lambda: create_norm("autonorm", dim, seed=0, selector_init="default"),
        "autonorm_frozen_hard": lambda: _frozen_autonorm(dim, "layernorm"),
        "autonorm_frozen_hard_dyt": lambda: _frozen_autonorm(dim, "dyt"),
        "token_mean": _TokenMean,
    }


CORE = (
    "layernorm",
    "dyt",
    "autonorm",
    "autonorm_reference",
    "autonorm_frozen_hard",
    "autonorm_frozen_hard_dyt",
    "token_mean",
)


def _step_fn(
    module: nn.Module, x: Tensor, dy: Tensor, *, reference: bool = False, bf16: bool = False
) -> Callable[[], None]:
    params = [p for p in module.parameters() if p.requires_grad]

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            y = module(x)
        if y.requires_grad:  # (the token-mean case builds no graph)
            torch.autograd.grad(y, [x, *params], dy.to(y.dtype), allow_unused=True)

    def reference_step() -> None:
        with _reference_paths():
            step()

    return reference_step if reference else step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_cases(
    steps: dict[str, Callable[[], None]], *, repeats: int, inner: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per step of each case, timed round-robin."""
    # On CPU (one intra-op thread, autograd runs on the calling thread) the thread's CPU time is the
    # cost itself, unaffected by other processes taking the cores; on CUDA, wall time after a sync.
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up (allocator, lazy generators, compiled code)
        for _ in range(3):
            step()
    names = list(steps)
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]  # cancel drift within a round
        for name in order:
            _sync(device)
            t0 = clock()
            for _ in range(inner):
                steps[name]()
            _sync(device)
            samples[name].append((clock() - t0) / inner)
    return {name: statistics.median(v) for name, v in samples.items()}


def _derived(t: dict[str, float], base: float, suffix: str) -> dict[str, float]:
    out = {f"{name}{suffix}": sec / base for name, sec in t.items()}
    out[f"autonorm_over_branches{suffix}"] = t["autonorm"] / (t["layernorm"] + t["dyt"])
    out[f"autonorm_reference_over_branches{suffix}"] = t["autonorm_reference"] / (t["layernorm"] + t["dyt"])
    out[f"frozen_hard_over_branch{suffix}"] = t["autonorm_frozen_hard"] / t["layernorm"]
    out[f"frozen_hard_dyt_over_branch{suffix}"] = t["autonorm_frozen_hard_dyt"] / t["dyt"]
    out[f"frozen_hard_floor{suffix}"] = (t["layernorm"] + t["token_mean"]) / t["layernorm"]
    return out


def run(
    *,
    shapes: tuple[tuple[int, int, int], ...],
    repeats: int,
    inner: int,
    compile_: bool,
    device: torch.device,
    core: bool = False,
    bf16: bool = False,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    per_shape: dict[str, dict[str, float]] = {}
    for b, t, d in shapes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(b, t, d, generator=gen).to(device).requires_grad_(True)
        dy = torch.randn(b, t, d, generator=gen).to(device)
        cases = _cases(d)
        if core:
            cases = {name: make for name, make in cases.items() if name in CORE}
        eager = {
            name: _step_fn(make().to(device).train(), x, dy, reference=name.endswith("_reference"), bf16=bf16)
            for name, make in cases.items()
        }
        times = _time_cases(eager, repeats=repeats, inner=inner, device=device)
        ratios = _derived(times, times["layernorm"], "")
        ratios["layernorm_ms"] = times["layernorm"] * 1e3
        if compile_:
            compiled = {
                name: _step_fn(
                    cast(nn.Module, torch.compile(make().to(device).train(), dynamic=False)),
                    x,
                    dy,
                    reference=name.endswith("_reference"),
                    bf16=bf16,
                )
                for name, make in cases.items()
            }
            ctimes = _time_cases(compiled, repeats=repeats, inner=inner, device=device)
            cratios = _derived(ctimes, times["layernorm"], "_compiled")
            # Composite ratios stay within one mode: recompute them against compiled branches.
            ratios.update(cratios)
        per_shape[f"{b}x{t}x{d}"] = ratios
    keys = next(iter(per_shape.values())).keys()
    flat = {k: max(r[k] for r in per_shape.values()) for k in keys if not k.endswith("_ms")}
    for shape, r in per_shape.items():
        flat.update({f"{k}@{shape}": v for k, v in r.items() if not k.endswith("_ms")})
    return flat, per_shape


def _print_table(per_shape: dict[str, dict[str, float]], compiled: bool) -> None:
    shapes = list(per_shape)
    first = per_shape[shapes[0]]
    rows = [k for k in first if not k.endswith("_compiled") and not k.endswith("_ms")]
    header = f"{'case':<30}" + "".join(
        f"{s + ' eager':>22}" + (f"{s + ' compiled':>24}" if compiled else "") for s in shapes
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        line = f"{row:<30}"
        for s in shapes:
            line += f"{per_shape[s][row]:>22.2f}"
            if compiled:
                line += f"{per_shape[s][row + '_compiled']:>24.2f}"
        goal = GOALS.get(row)
        print(line + (f"   goal <= {goal}" if goal else ""))
    for s in shapes:
        print(f"eager nn.LayerNorm fwd+bwd at {s}: {per_shape[s]['layernorm_ms']:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timing rounds (median taken)")
    parser.add_argument("--inner", type=int, default=3, help="steps per timing sample")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (ignored on CUDA)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile half")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "norms.json")
    parser.add_argument(
        "--quick", action="store_true", help="one tiny shape, 3 rounds, eager only (seconds; for tests)"
    )
    parser.add_argument("--core", action="store_true", help="only the cases behind the goal keys")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast around each forward")
    parser.add_argument(
        "--allocator",
        choices=("steady", "default"),
        default="steady",
        help="CPU: keep freed memory in the process like a training loop's warm heap (default), or glibc's defaults",
    )
    args = parser.parse_args(argv)
    shapes = SHAPES
    if args.quick:
        shapes, args.repeats, args.inner, args.no_compile, args.core = QUICK_SHAPES, 3, 1, True, True
    device = torch.device(args.device)
    steady = False
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        steady = args.allocator == "steady" and _steady_allocator()
    flat, per_shape = run(
        shapes=shapes,
        repeats=args.repeats,
        inner=args.inner,
        compile_=not args.no_compile,
        device=device,
        core=args.core,
        bf16=args.bf16,
    )
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, device={device}, "
        f"threads={torch.get_num_threads()}, repeats={args.repeats}x{args.inner}, "
        f"allocator={'steady' if steady else 'default'}; ratios to eager "
        "nn.LayerNorm (composites within one mode)"
    )
    _print_table(per_shape, compiled=not args.no_compile)
    flat["load_avg_1m"] = os.getloadavg()[0]
    flat["allocator_steady"] = 1.0 if steady else 0.0
    print(f"load average (1 min) at the end: {flat['load_avg_1m']:.2f} on {os.cpu_count()} cores")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(flat, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
