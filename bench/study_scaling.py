"""How close a whole study comes to the ideal use of the machine's trial slots.

A study of ``--trials`` (32) trials of a FIXED amount of real training work (ViT-Lite ``tiny`` with
AutoNorm on a Fashion-MNIST subset, ``--epochs`` epochs; only the Gumbel temperature is sampled, which
changes no cost) runs through ``workers.runner.run_study`` on a local loopback Ray cluster with one
CPU per trial and as many concurrent trials as the machine has slots (``os.cpu_count()``). Every
trial writes the wall time at its start, at each report and at its end (inside the worker process).

    python bench/study_scaling.py            # 32 trials of ~20 s each (~6 minutes on 2 quiet cores)
    python bench/study_scaling.py --quick    # 2 trials of 1 epoch (for tests)
    python bench/study_scaling.py --gpu-fraction 0.125 --precision bf16 --compile on   # the GPU path

``--precision`` / ``--compile`` set ``training.precision`` / ``training.compile`` of every trial
(defaults ``fp32`` / ``auto``: compiled on CUDA, eager on CPU) and are recorded in ``setup``.

Keys of ``bench/results/study_scaling.json``:

* ``wall_over_ideal``: study wall time (``run_study`` call to return: Ray start, trials, MLflow,
  shutdown) / (Σ trial times / slots). Goal ≤ 1.15.
* ``span_over_ideal``: the same with the span from the first trial's start to the last trial's end
  (Ray start and shutdown left out): what scheduling between trials costs.
* ``startup_s`` (``run_study`` call to the first trial's start), ``teardown_s`` (last trial's end to
  return), ``trial_s_median``, ``epoch_s_median``. The start and teardown are a fixed cost (~20 s
  here, Ray's own start ~5 s of it), so ``wall_over_ideal`` depends on the trial length: with the
  default ~20-s trials it is ``span_over_ideal`` + ~0.06; with 2-s trials (``--subset 1000 --epochs 2``)
  the same fixed cost makes it ~1.5. ``span_over_ideal`` is the part that does not shrink with longer
  trials.
* ``optuna_ask_tell_ms_at_1000``: one ask + tell of the study's default sampler (TPE, ``workers.search
  .create_sampler``) on a 3-parameter space once 1,000 trials are told (median of the last 50), and
  ``optuna_total_s_1000`` for all 1,000.
* ``mlflow_log_ms_per_epoch``: one ``log_batch`` of an epoch's metrics (35 numbers) into sqlite, as the
  driver's callback sends it; ``mlflow_log_fraction_of_epoch`` = that / ``epoch_s_median``.
* ``load_avg_1m``: the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from workers.trainable import TrialSession

RESULTS = Path(__file__).resolve().parent / "results" / "study_scaling.json"
GOAL = 1.15


def timed_trial(config: dict[str, Any], session: TrialSession) -> None:
    """``autonorm_trial`` with wall-clock stamps (start, every report, end) appended to a JSONL file."""
    from workers.trainable import autonorm_trial

    timing_file = config.pop("timing_file")
    started = time.time()
    reports: list[float] = []
    throughput: list[float] = []
    inner_report = session.report

    def report(metrics: Any, **kwargs: Any) -> None:
        inner_report(metrics, **kwargs)
        reports.append(time.time())
        if isinstance(metrics.get("examples_per_s"), float):
            throughput.append(metrics["examples_per_s"])

    session.report = report  # type: ignore[method-assign]
    autonorm_trial(config, session)
    row = {
        "start": started,
        "end": time.time(),
        "reports": reports,
        "examples_per_s": throughput,
        "device": session.device,
        "pid": os.getpid(),
    }
    with open(timing_file, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def run_trials(args: argparse.Namespace, workdir: Path, slots: int) -> dict[str, Any]:
    """The study; ``slots`` trials at a time, each with 1 CPU (and ``args.gpu_fraction`` of a GPU)."""
    from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig
    from workers.runner import run_study

    timing_file = workdir / "timing.jsonl"
    base = {
        "data": {"type": args.dataset, "subset": args.subset, "val_fraction": 0.1},
        "model": {"type": "vit_lite", "preset": args.preset, "norm": {"type": "autonorm", "tau": 0.5}},
        "training": {
            "epochs": args.epochs,
            "batch_size": 64,
            "precision": args.precision,
            "compile": args.compile,
        },
        "seed": 0,
        "timing_file": str(timing_file),
    }
    plan = StudyPlan(
        name="study_scaling",
        base_config=base,
        space=(ParamDef("model.norm.tau", "float", low=0.3, high=1.0),),
        sampler=SamplerConfig(type="random", seed=0),
        num_samples=args.trials,
        max_concurrent=slots,
        resources=(("cpu", 1.0), ("gpu", args.gpu_fraction)) if args.gpu_fraction else (("cpu", 1.0),),
        storage=StorageConfig(path=str(workdir / "runs")),
        tracking=TrackingConfig(experiment="study_scaling"),
    )
    init: dict[str, Any] = {"num_cpus": args.cpus or slots, "log_to_driver": False}
    if args.gpu_fraction:
        init["num_gpus"] = 1
    # A local Ray that misses its startup deadline is retried by workers.session itself.
    temp_dir = tempfile.mkdtemp(prefix="rt_scale_", dir="/tmp")
    called = time.time()
    try:
        result = run_study(
            plan, trainable=timed_trial, progress=False, ray_init_kwargs={**init, "_temp_dir": temp_dir}
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    returned = time.time()
    statuses = [t.status for t in result.trials]
    rows = [json.loads(line) for line in timing_file.read_text().splitlines()]
    if len(rows) != args.trials:
        raise RuntimeError(f"{len(rows)} of {args.trials} trials finished; statuses {statuses}")
    trial_s = [r["end"] - r["start"] for r in rows]
    epochs = [b - a for r in rows for a, b in zip([r["start"], *r["reports"]], r["reports"])]
    steady = [b - a for r in rows for a, b in zip(r["reports"], r["reports"][1:])]
    ideal = sum(trial_s) / slots
    first, last = min(r["start"] for r in rows), max(r["end"] for r in rows)
    return {
        "wall_over_ideal": (returned - called) / ideal,
        "span_over_ideal": (last - first) / ideal,
        "goal_wall_over_ideal": GOAL,
        "study_wall_s": returned - called,
        "ideal_s": ideal,
        "startup_s": first - called,
        "teardown_s": returned - last,
        "trial_s_median": statistics.median(trial_s),
        "trial_s_sum": sum(trial_s),
        "epoch_s_median": statistics.median(steady or epochs),
        "worker_processes": len({r["pid"] for r in rows}),
        "examples_per_s_per_trial": statistics.median(
            statistics.median(r["examples_per_s"]) for r in rows if r["examples_per_s"]
        ),
        "trial_devices": sorted({r["device"] for r in rows}),
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
    }


def optuna_cost(n: int) -> dict[str, float]:
    """Seconds per ask + tell of the default sampler as the number of told trials grows to ``n``."""
    import optuna

    from workers.plan import SamplerConfig
    from workers.search import create_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=create_sampler(SamplerConfig(type="tpe")))
    per: list[float] = []
    t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        trial = study.ask()
        x = trial.suggest_float("tau", 0.1, 2.0, log=True)
        k = trial.suggest_categorical("kind", ["a", "b"])
        lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        study.tell(trial, -((x - 0.5) ** 2) - lr + (k == "a"))
        per.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    tail = per[-min(50, n) :]
    return {f"optuna_ask_tell_ms_at_{n}": statistics.median(tail) * 1e3, f"optuna_total_s_{n}": total}


def mlflow_cost(workdir: Path, repeats: int) -> float:
    """Median seconds of one epoch's ``log_batch`` (35 metrics) into a fresh sqlite store."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow_cost.db'}")
    exp = client.create_experiment("cost")
    run = client.create_run(exp)
    times: list[float] = []
    for epoch in range(1, repeats + 1):
        stamp = int(time.time() * 1000)
        metrics = [Metric(f"m{i}", float(i) / epoch, stamp, epoch) for i in range(35)]
        t0 = time.perf_counter()
        client.log_batch(run.info.run_id, metrics=metrics)
        times.append(time.perf_counter() - t0)
    client.set_terminated(run.info.run_id)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--subset", type=int, default=4000)
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cpus", type=int, default=0, help="CPUs of the Ray cluster (0: = slots)")
    parser.add_argument("--gpu-fraction", type=float, default=0.0, help="GPU share per trial (0: none)")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--preset", default="tiny", choices=("tiny", "paper"))
    parser.add_argument(
        "--precision", default="fp32", choices=("fp32", "bf16"), help="training.precision of every trial"
    )
    parser.add_argument(
        "--compile",
        default="auto",
        choices=("auto", "on", "off"),
        help="training.compile of every trial (auto: compiled on CUDA, eager on CPU)",
    )
    parser.add_argument("--optuna-trials", type=int, default=1000)
    parser.add_argument("--trials-only", action="store_true", help="skip the Optuna and MLflow costs")
    parser.add_argument("--quick", action="store_true", help="2 trials of 1 epoch, 100 Optuna trials")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.epochs, args.subset, args.optuna_trials = 2, 1, 200, 100
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local cluster on loopback only
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one CPU per trial
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        result = run_trials(args, Path(tmp), args.slots)
        if not args.trials_only:
            result.update(optuna_cost(args.optuna_trials))
            log_s = mlflow_cost(Path(tmp), repeats=3 if args.quick else 30)
            result["mlflow_log_ms_per_epoch"] = log_s * 1e3
            result["mlflow_log_fraction_of_epoch"] = log_s / result["epoch_s_median"]
    result["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["setup"] = {
        "trials": args.trials,
        "slots": args.slots,
        "work": f"vit_lite {args.preset} AutoNorm, {args.dataset} subset={args.subset}, "
        f"{args.epochs} epochs, batch 64",
        "precision": args.precision,
        "compile": args.compile,
        "resources": f"1 cpu + {args.gpu_fraction} gpu per trial, max_concurrent = slots, reuse_actors",
        "tracking": "MLflow sqlite, driver-side",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs",
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
