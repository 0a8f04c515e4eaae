"""The AutoNorm paper's qualitative claims, checked with autonorm_core alone on offline data, on ONE core.

Five arms on a Fashion-MNIST subset with a small ViT-Lite, the same seeds for every arm:

==================  =========================================================================
frozen_ln           LayerNorm in every sub-layer
frozen_dyt          DyT in every sub-layer
autonorm            AutoNorm (learned Gumbel-Softmax gate), never frozen
autonorm_s          AutoNorm-S: ``GateFreeze(t_freeze, eps_h=0.1, rule="freeze_if_high")`` (PROTOCOL default rule)
random_selector     w_DyT ~ U(0, 1) per sample per forward (mean weights in evaluation)
==================  =========================================================================

plus the Penn Treebank WSJ POS sample tagged by a text encoder with AutoNorm, for the mean noise-free
DyT weight per layer. The claims (docs/science.md): (a) random >= learned gate on stationary vision;
(b) freezing recovers it; (c) NLP gates prefer DyT in deep layers; (d) vision gates collapse to LN early
(H -> 0).

Every number comes from :func:`autonorm_core.training.fit` (test split only reported, never used for
selection). ``torch.set_num_threads(1)``; the default sizes take ~15-20 CPU minutes. Writes
``bench/results/core_claims.json`` after every run, so an interrupted bench keeps what it finished.

    python bench/core_claims.py                 # the real run
    python bench/core_claims.py --quick         # a one-minute smoke run of the same code path
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from autonorm_core.data import load_dataset
from autonorm_core.models import create_model
from autonorm_core.training import TrainConfig, fit

ARMS: dict[str, dict[str, Any]] = {
    "frozen_ln": {"norm": "layernorm", "freeze": False},
    "frozen_dyt": {"norm": "dyt", "freeze": False},
    "autonorm": {"norm": "autonorm", "freeze": False},
    "autonorm_s": {"norm": "autonorm", "freeze": True},
    "random_selector": {"norm": "random_selector", "freeze": False},
}


def _layer_values(row: dict[str, float], prefix: str) -> list[float]:
    keys = sorted(
        (k for k in row if k.startswith(prefix + "/layer_")), key=lambda k: int(k.rsplit("_", 1)[1])
    )
    return [row[k] for k in keys]


def _mean_std(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": float(len(values)),
    }


def _elementwise_mean(rows: list[list[float]]) -> list[float]:
    return [statistics.fmean(col) for col in zip(*rows)] if rows and rows[0] else []


def run_vision(args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    model_kw = {"depth": args.depth, "dim": args.dim, "heads": args.heads, "patch_size": args.patch}
    base = TrainConfig(epochs=args.epochs, batch_size=64, lr=args.lr)
    out["vision"]["setup"] = {
        "dataset": "fashion_mnist",
        "subset": {"pool": args.pool, "test": args.test, "val_fraction": 0.1},
        "model": {"name": "vit_lite", **model_kw},
        "train": base.to_dict(),
        "autonorm_s_freeze": {"t_freeze": args.t_freeze, "eps_h": 0.1, "rule": "freeze_if_high"},
        "seeds": list(range(args.seeds)),
    }
    runs = out["vision"]["runs"]
    for seed in range(args.seeds):
        splits = load_dataset("fashion_mnist", seed=seed, subset=(args.pool, args.test))
        out["vision"]["setup"]["sizes"] = {
            k: int(getattr(splits, k)[0].shape[0]) for k in ("train", "val", "test")
        }
        for arm, spec in ARMS.items():
            cfg = base
            if spec["freeze"]:
                cfg = TrainConfig.from_dict(
                    {
                        **base.to_dict(),
                        "freeze": {"t_freeze": args.t_freeze, "eps_h": 0.1, "rule": "freeze_if_high"},
                    }
                )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)  # same init stream per seed across arms (common random numbers)
                model = create_model("vit_lite", splits, preset="paper", norm=spec["norm"], **model_kw)
            t0, c0 = time.perf_counter(), time.process_time()
            result = fit(model, splits, cfg, seed=seed)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            final = result.final
            run = {
                "arm": arm,
                "seed": seed,
                "status": result.status,
                "test_accuracy": final.get("test_accuracy"),
                "val_accuracy": final.get("val_accuracy"),
                "gate_entropy_per_layer": _layer_values(final, "gate_entropy"),
                "dyt_weight_per_layer": _layer_values(final, "dyt_weight"),
                "gate_entropy_by_epoch": [
                    row["gate_entropy"] for row in result.history if "gate_entropy" in row
                ],
                "freeze_epoch": result.freeze_epoch,
                "freeze_entropy": result.freeze_entropy,
                "wall_s": wall,
                "cpu_s": cpu,
                "history": result.history,
            }
            runs.append(run)
            print(
                f"[vision] seed={seed} {arm:16s} test_acc={run['test_accuracy']:.4f} "
                f"H_final={final.get('gate_entropy', float('nan')):.3f} froze@{result.freeze_epoch} "
                f"wall={wall:.0f}s cpu={cpu:.0f}s",
                flush=True,
            )
            save()


def run_ptb(args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    model_kw = {"depth": args.ptb_depth, "dim": args.ptb_dim, "heads": 4}
    cfg = TrainConfig(epochs=args.ptb_epochs, batch_size=32, lr=args.lr)
    out["ptb"]["setup"] = {
        "dataset": "ptb_pos_sample",
        "model": {"name": "text_encoder", "norm": "autonorm", **model_kw},
        "train": cfg.to_dict(),
        "seeds": list(range(args.ptb_seeds)),
    }
    for seed in range(args.ptb_seeds):
        splits = load_dataset("ptb_pos_sample", seed=seed)
        out["ptb"]["setup"]["sizes"] = {
            k: int(getattr(splits, k)[0].shape[0]) for k in ("train", "val", "test")
        }
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = create_model("text_encoder", splits, preset="paper", norm="autonorm", **model_kw)
        t0, c0 = time.perf_counter(), time.process_time()
        result = fit(model, splits, cfg, seed=seed)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        final = result.final
        out["ptb"]["runs"].append(
            {
                "seed": seed,
                "status": result.status,
                "test_accuracy": final.get("test_accuracy"),
                "dyt_weight_per_layer": _layer_values(final, "dyt_weight"),
                "gate_entropy_per_layer": _layer_values(final, "gate_entropy"),
                "dyt_weight_by_epoch": [_layer_values(row, "dyt_weight") for row in result.history],
                "wall_s": wall,
                "cpu_s": cpu,
            }
        )
        print(
            f"[ptb] seed={seed} test_acc={final.get('test_accuracy', float('nan')):.4f} "
            f"dyt={[round(v, 2) for v in _layer_values(final, 'dyt_weight')]} wall={wall:.0f}s",
            flush=True,
        )
        save()


def summarise(out: dict[str, Any]) -> dict[str, Any]:
    """Per-arm statistics and a plain reading of each qualitative claim (no significance claimed)."""
    runs = out["vision"]["runs"]
    arms: dict[str, Any] = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm and r["status"] == "completed"]
        if not rs:
            continue
        arms[arm] = {
            "test_accuracy": _mean_std([r["test_accuracy"] for r in rs]),
            "failed_runs": sum(1 for r in runs if r["arm"] == arm and r["status"] != "completed"),
            "final_gate_entropy_per_layer": _elementwise_mean([r["gate_entropy_per_layer"] for r in rs]),
            "final_dyt_weight_per_layer": _elementwise_mean([r["dyt_weight_per_layer"] for r in rs]),
            "gate_entropy_by_epoch": _elementwise_mean([r["gate_entropy_by_epoch"] for r in rs]),
            "freeze_epochs": [r["freeze_epoch"] for r in rs],
        }
    claims: dict[str, Any] = {}
    acc = {a: v["test_accuracy"]["mean"] for a, v in arms.items()}
    paired = {
        a: [
            r["test_accuracy"] - s["test_accuracy"]
            for r in runs
            if r["arm"] == a
            for s in runs
            if s["arm"] == "autonorm" and s["seed"] == r["seed"]
        ]
        for a in ("random_selector", "autonorm_s")
    }
    if {"random_selector", "autonorm"} <= acc.keys():
        d = paired["random_selector"]
        claims["a_random_ge_learned_vision"] = {
            "criterion": "RandomSelector - AutoNorm test accuracy >= 0 on every seed (paired by seed)",
            "random_minus_autonorm_mean": statistics.fmean(d),
            "per_seed": d,
            "shows": all(x >= 0.0 for x in d),
        }
    if {"autonorm_s", "autonorm"} <= acc.keys():
        d = paired["autonorm_s"]
        claims["b_freezing_recovers"] = {
            "criterion": "AutoNorm-S - AutoNorm test accuracy > 0 on every seed (paired by seed)",
            "autonorm_s_minus_autonorm_mean": statistics.fmean(d),
            "per_seed": d,
            "froze_in_runs": sum(1 for e in arms["autonorm_s"]["freeze_epochs"] if e is not None),
            "shows": all(x > 0.0 for x in d),
        }
    if "autonorm" in arms:
        h = arms["autonorm"]["final_gate_entropy_per_layer"]
        w = arms["autonorm"]["final_dyt_weight_per_layer"]
        claims["d_vision_gates_collapse_to_ln"] = {
            "criterion": "mean final entropy < 0.1 and most layers put < 0.5 weight on DyT (AutoNorm, unfrozen)",
            "final_entropy_per_layer": h,
            "final_dyt_weight_per_layer": w,
            "final_entropy_mean": statistics.fmean(h) if h else math.nan,
            "layers_with_entropy_below_0.1": sum(1 for v in h if v < 0.1),
            "layers_preferring_ln": sum(1 for v in w if v < 0.5),
            "layers": len(h),
            "entropy_by_epoch": arms["autonorm"]["gate_entropy_by_epoch"],
            "shows": bool(h) and statistics.fmean(h) < 0.1 and sum(1 for v in w if v < 0.5) > len(w) / 2,
        }
    ptb_runs = [r for r in out["ptb"]["runs"] if r["status"] == "completed"]
    if ptb_runs:
        w = _elementwise_mean([r["dyt_weight_per_layer"] for r in ptb_runs])
        half = len(w) // 2
        shallow, deep = statistics.fmean(w[:half]), statistics.fmean(w[half:])
        claims["c_nlp_gates_prefer_dyt_deep"] = {
            "criterion": "mean DyT weight of the deeper half of the layers > 0.5 and > the shallower half's",
            "dyt_weight_per_layer": w,
            "shallow_half_mean": shallow,
            "deep_half_mean": deep,
            "ptb_test_accuracy": _mean_std([r["test_accuracy"] for r in ptb_runs]),
            "shows": deep > 0.5 and deep > shallow,
        }
    return {"arms": arms, "claims": claims}


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| arm | test accuracy % (mean ± std) | final gate entropy per layer | final DyT weight per layer | froze at |",
        "|---|---|---|---|---|",
    ]
    for arm, v in summary["arms"].items():
        acc = v["test_accuracy"]
        h, w = v["final_gate_entropy_per_layer"], v["final_dyt_weight_per_layer"]
        hs = " ".join(f"{x:.3f}" for x in h) if h else "n/a (no learned gate)"
        ws = " ".join(f"{x:.3f}" for x in w) if w else "n/a"
        froze = (
            ", ".join("-" if e is None else str(e) for e in v["freeze_epochs"]) if arm == "autonorm_s" else ""
        )
        lines.append(
            f"| {arm} | {100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} (n={int(acc['n'])}) | {hs} | {ws} | {froze} |"
        )
    c = summary["claims"].get("c_nlp_gates_prefer_dyt_deep")
    if c:
        lines.append("")
        lines.append(
            "PTB sample tagger, AutoNorm, mean DyT weight per layer (input -> output): "
            + " ".join(f"{x:.3f}" for x in c["dyt_weight_per_layer"])
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the code path in ~1 minute")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pool", type=int, default=8000, help="Fashion-MNIST training pool (train + val)")
    parser.add_argument("--test", type=int, default=2000, help="Fashion-MNIST test examples (fixed subset)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--t-freeze", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--patch", type=int, default=7)
    parser.add_argument("--ptb-seeds", type=int, default=2)
    parser.add_argument("--ptb-epochs", type=int, default=15)
    parser.add_argument("--ptb-depth", type=int, default=8)
    parser.add_argument("--ptb-dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/core_claims.json")
    parser.add_argument(
        "--resummarise", type=Path, default=None, help="recompute the summary of an existing results file"
    )
    args = parser.parse_args()
    if args.resummarise is not None:
        out = json.loads(args.resummarise.read_text())
        out["summary"] = summarise(out)
        args.resummarise.write_text(json.dumps(out, indent=1, allow_nan=False))
        print(markdown(out["summary"]))
        print(json.dumps(out["summary"]["claims"], indent=1))
        return
    if args.quick:
        args.seeds, args.pool, args.test, args.epochs, args.t_freeze = 2, 600, 200, 2, 1
        args.depth, args.dim, args.ptb_seeds, args.ptb_epochs, args.ptb_depth, args.ptb_dim = (
            2,
            32,
            1,
            2,
            2,
            32,
        )
    if args.out is None:
        # A smoke run never overwrites the real results.
        name = "core_claims_quick.json" if args.quick else "core_claims.json"
        args.out = (
            Path(tempfile.gettempdir()) / name if args.quick else Path(__file__).parent / "results" / name
        )

    torch.set_num_threads(1)
    out: dict[str, Any] = {
        "benchmark": "core_claims",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "vision": {"runs": []},
        "ptb": {"runs": []},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()

    def save() -> None:
        out["wall_s"] = time.perf_counter() - t0
        out["cpu_s"] = time.process_time() - c0
        out["summary"] = summarise(out)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1, allow_nan=False))
        tmp.replace(args.out)

    run_vision(args, out, save)
    run_ptb(args, out, save)
    save()
    print()
    print(markdown(out["summary"]))
    print()
    print(json.dumps(out["summary"]["claims"], indent=1))
    print(f"total wall {out['wall_s']:.0f}s, cpu {out['cpu_s']:.0f}s (1 thread)")


if __name__ == "__main__":
    main()
