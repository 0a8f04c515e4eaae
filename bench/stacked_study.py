"""A whole study run stacked (``execution.stack: auto``) and one trial per process (``off``), side by side.

Usage::

    python bench/stacked_study.py                       # the batch-size `local` preset (~10 min on 2 cores)
    python bench/stacked_study.py --preset smoke        # the smoke preset (~1.5 min)
    python bench/stacked_study.py --preset smoke --set seeds=[0,1,2]

Both runs go through ``autonorm-study run`` as a user runs them (local Ray, sqlite MLflow, offline data),
one after the other, ``off`` first, each in its own fresh storage folder; the clock is the command's
wall time and its CPU time (``getrusage`` of the command and every process it waited for: Ray's
workers are children of its raylet, which the command starts and stops, so their CPU is counted).
Then it compares what a researcher reads:

* the study verdict, every arm's verdict and every control's label (``verdict.json``);
* ``trials.csv``: the same rows (arm, batch size, seed, budget, lr) in both, and each row's
  ``test_accuracy`` against its ``off`` twin (largest and mean absolute difference).

JSON (``bench/results/stacked_study.json``, ``--output`` elsewhere)::

    {"preset", "runs": {"off": {"wall_s", "cpu_s", "cpu_hours", "trials", "verdict"}, "auto": {...}},
     "wall_ratio" (off / auto), "cpu_ratio", "same_verdicts", "same_rows",
     "test_accuracy_diff": {"max", "mean"}, "goals", "goals_met", "machine", "date", "load_avg_1m"}

Goals (issue #38): the `local` preset stacked takes at least 3x less wall time than ``off``, with the
same verdicts and labels; on the smoke preset every ``test_accuracy`` within 0.05 of its twin, mean
|difference| at most 0.01.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "stacked_study.json"
SPEC = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
ROW_KEYS = ("arm", "batch_size", "seed", "budget", "lr")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_study(mode: str, preset: str, storage: Path, extra: list[str]) -> dict[str, Any]:
    """One ``autonorm-study run`` of the spec with ``execution.stack=<mode>``; its clocks and outputs."""
    name = f"stacked_bench_{mode}"
    cmd = [
        sys.executable,
        "-m",
        "studies.cli",
        "run",
        str(SPEC),
        "--preset",
        preset,
        "--set",
        f"execution.stack={mode}",
        "--set",
        f"name={name}",
        "--set",
        f"storage_path={storage}",
    ]
    for item in extra:
        cmd += ["--set", item]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"[stacked_study] the {mode} run failed (exit {proc.returncode})")
    study = storage / name
    verdict = json.loads((study / "verdict.json").read_text())
    import csv

    with (study / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_hours": cpu / 3600,
        "trials": len(rows),
        "verdict": _verdicts(verdict),
        "rows": rows,
    }


def _verdicts(verdict: dict[str, Any]) -> dict[str, Any]:
    """What a researcher reads: the study verdict, each hypothesis' verdict, each fix arm's verdict,
    each arm's label, the claim per budget."""
    hypotheses = verdict.get("hypotheses") or {}
    return {
        "study": verdict.get("study_verdict"),
        "hypotheses": {k: (v or {}).get("verdict") for k, v in sorted(hypotheses.items())},
        "verdict": dict(sorted((verdict.get("verdict") or {}).items())),
        "controls": dict(sorted((verdict.get("controls") or {}).items())),
        "labels": {k: (v or {}).get("label") for k, v in sorted((verdict.get("arms") or {}).items())},
        "claim_by_budget": dict(sorted((verdict.get("claim_by_budget") or {}).items())),
    }


def _row_key(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(str(row.get(k, "")) for k in ROW_KEYS)


def compare(off: dict[str, Any], auto: dict[str, Any]) -> dict[str, Any]:
    by_off = {_row_key(r): r for r in off["rows"]}
    by_auto = {_row_key(r): r for r in auto["rows"]}
    diffs = []
    for key, row in by_auto.items():
        twin = by_off.get(key)
        if twin is None:
            continue
        try:
            diffs.append(abs(float(row["test_accuracy"]) - float(twin["test_accuracy"])))
        except (KeyError, ValueError):
            continue
    only = {
        "off": [dict(zip(ROW_KEYS, k, strict=True)) for k in sorted(set(by_off) - set(by_auto))],
        "auto": [dict(zip(ROW_KEYS, k, strict=True)) for k in sorted(set(by_auto) - set(by_off))],
    }
    return {
        "rows_only_in": only,
        "same_rows": sorted(by_off) == sorted(by_auto) and len(by_off) == len(off["rows"]),
        "same_verdicts": off["verdict"] == auto["verdict"],
        "test_accuracy_diff": {
            "max": max(diffs, default=float("nan")),
            "mean": sum(diffs) / len(diffs) if diffs else float("nan"),
            "rows": len(diffs),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="local")
    parser.add_argument("--set", action="append", default=[], dest="extra", help="more --set overrides")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, default=None, help="keep both studies under this folder")
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="stacked-bench-") as scratch:
        tmp = str(args.keep) if args.keep is not None else scratch
        for mode in ("off", "auto"):
            print(f"[stacked_study] {args.preset}: execution.stack={mode} ...", flush=True)
            runs[mode] = run_study(mode, args.preset, Path(tmp) / mode, args.extra)
            r = runs[mode]
            print(
                f"[stacked_study]   {mode}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, {r['trials']} rows, "
                f"verdict {r['verdict']}",
                flush=True,
            )
    result = compare(runs["off"], runs["auto"])
    wall_ratio = runs["off"]["wall_s"] / runs["auto"]["wall_s"]
    cpu_ratio = runs["off"]["cpu_s"] / max(runs["auto"]["cpu_s"], 1e-9)
    goals = {"wall_ratio_min": 3.0, "test_accuracy_diff_max": 0.05, "test_accuracy_diff_mean": 0.01}
    met = {
        "wall_ratio": wall_ratio >= goals["wall_ratio_min"],
        "same_verdicts": result["same_verdicts"],
        "same_rows": result["same_rows"],
        "test_accuracy": result["test_accuracy_diff"]["max"] <= goals["test_accuracy_diff_max"]
        and result["test_accuracy_diff"]["mean"] <= goals["test_accuracy_diff_mean"],
    }
    out = {
        "preset": args.preset,
        "overrides": args.extra,
        "runs": {m: {k: v for k, v in r.items() if k != "rows"} for m, r in runs.items()},
        "wall_ratio": wall_ratio,
        "cpu_ratio": cpu_ratio,
        **result,
        "goals": goals,
        "goals_met": met,
        "machine": f"{platform.machine()} x{os.cpu_count()} CPUs",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(
        f"[stacked_study] wall off/auto = {wall_ratio:.2f}x, CPU off/auto = {cpu_ratio:.2f}x; same verdicts: "
        f"{result['same_verdicts']}; same rows: {result['same_rows']}; test_accuracy |diff| max "
        f"{result['test_accuracy_diff']['max']:.4f}, mean {result['test_accuracy_diff']['mean']:.4f}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"[stacked_study] wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
