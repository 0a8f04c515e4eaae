"""Cost of running a training as a Ray Tune trial with MLflow logging, against a plain loop.

The same training (data, model, seed, epochs) runs three times: as a plain ``autonorm_core.fit``
call, as a one-trial study through ``workers.run_study`` (checkpoint every epoch, per-epoch
``ray.tune.report``, driver-side MLflow logging into sqlite), and as a plain call again. The plain
baseline is the mean of the two plain runs, so a drift in machine load during the benchmark hits
both sides. Like the trial, each plain run is a FRESH Python process (``--plain-child``) that imports
only torch and autonorm_core: measured in the driver after Ray and MLflow were imported (their
threads, a warm or cold allocator) it was not like-for-like, and a ratio above 1 showed it.

Throughput is measured in steady state: examples of epochs 2..E divided by the wall time between
the end of epoch 1 and the end of epoch E, as the training process sees it (for the trial: after
``tune.report`` returned, i.e. with the checkpoint persisted). ``startup_s`` is the time from
calling ``run_study`` to the end of the trial's first epoch, minus the same for the plain process
(from its launch, interpreter start and imports included, to the end of its first epoch): what a
study pays before its first result beyond a plain script (Ray start, worker process, MLflow schema).
``startup_s_running_cluster`` is the same for the study run on a Ray cluster that is already up
(started by the benchmark just before, its own start reported as ``ray_local_start_s``): how a
``ray job submit`` study starts, and the part of ``startup_s`` that is ours rather than Ray's.
``startup_breakdown`` splits the cold start at the moment the trial function begins.
``cpu_throughput_ratio`` is the same ratio over the training process's CPU seconds: on a machine
shared with other jobs wall time swings by 2x between identical runs, CPU time much less.

    python bench/trial_overhead.py [--epochs 5] [--subset 4000] [--threads 2]
    python bench/trial_overhead.py --quick      # 2 epochs on 300 examples, one plain run (for tests)

Writes ``bench/results/trial_overhead.json``; the goals are ``throughput_ratio >= 0.97`` and
``startup_s <= 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from autonorm_core.data import load_dataset
from autonorm_core.models import create_model
from autonorm_core.training import TrainConfig, fit

if TYPE_CHECKING:
    from workers.trainable import TrialSession

# workers (Ray, MLflow) is imported inside the functions that need it, so that the --plain-child
# process imports torch and autonorm_core only.

RESULTS = Path(__file__).resolve().parent / "results" / "trial_overhead.json"


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "data": {"type": "fashion_mnist", "subset": args.subset, "val_fraction": 0.1},
        "model": {"type": "vit_lite", "preset": "tiny", "norm": {"type": "autonorm", "tau": 0.5}},
        "training": {"epochs": args.epochs, "batch_size": 64},
        "seed": 0,
    }


def plain_run(config: dict[str, Any], threads: int) -> tuple[list[float], list[float]]:
    """Epoch-end wall times (``time.time()``) and process CPU times of a plain fit, built as the trial
    builds it. Runs in the ``--plain-child`` process."""
    torch.set_num_threads(threads)
    imported = time.time()
    splits = load_dataset(
        config["data"]["type"], seed=config["seed"], subset=config["data"]["subset"], val_fraction=0.1
    )
    model_cfg = dict(config["model"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config["seed"])
        model = create_model(model_cfg.pop("type"), splits, **model_cfg)
    ends: list[float] = []
    cpu: list[float] = []

    class Timer:
        def on_epoch_end(self, epoch: int, model: Any, metrics: dict[str, float]) -> None:
            ends.append(time.time())
            cpu.append(time.process_time())

    fit(model, splits, TrainConfig.from_dict(config["training"]), seed=config["seed"], callbacks=(Timer(),))
    return [imported, *ends], cpu


def plain_subprocess(args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    """:func:`plain_run` in a fresh interpreter: epoch ends in seconds since the launch, their CPU
    times, and when its imports were done (seconds since the launch)."""
    with tempfile.TemporaryDirectory(prefix="bench_plain_") as tmp:
        out = Path(tmp) / "plain.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--plain-child", str(out)]
        cmd += ["--epochs", str(args.epochs), "--subset", str(args.subset), "--threads", str(args.threads)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))  # what Ray gives a trial worker
        launched = time.time()
        subprocess.run(cmd, check=True, env=env)
        row = json.loads(out.read_text())
    imported, *ends = (t - launched for t in row["ends"])
    return ends, row["cpu"], imported


def timed_trial(config: dict[str, Any], session: TrialSession) -> None:
    """``autonorm_trial`` that also writes the wall time after each report (checkpoint persisted) and
    the Ray node it runs on."""
    import ray

    from workers.trainable import autonorm_trial

    timing_file = config.pop("timing_file")
    with open(
        timing_file, "a"
    ) as fh:  # the trial function starts: Ray, Tune, the actor and its imports are done
        fh.write(json.dumps({"mark": "trial_start", "t": time.time()}) + "\n")
        fh.write(json.dumps({"node": ray.get_runtime_context().get_node_id()}) + "\n")
    inner_report = session.report

    def report(metrics: Any, **kwargs: Any) -> None:
        inner_report(metrics, **kwargs)
        with open(timing_file, "a") as fh:
            row = {"epoch": metrics.get("epoch"), "t": time.time(), "cpu": time.process_time()}
            fh.write(json.dumps(row) + "\n")

    session.report = report  # type: ignore[method-assign]
    autonorm_trial(config, session)


def tune_run(
    config: dict[str, Any], threads: int, workdir: Path, *, name: str = "trial_overhead"
) -> tuple[list[float], list[float], float, float, dict[str, float]]:
    """Epoch-end times (seconds since run_study was called) of the same training as a one-trial study,
    and the time the trial function started (``marks["trial_start"]``)."""
    from workers.plan import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig
    from workers.runner import run_study

    timing_file = workdir / f"{name}.timing.jsonl"
    base = dict(config, timing_file=str(timing_file))
    plan = StudyPlan(
        name=name,
        base_config=base,
        # One trial; the single "search" dimension is fixed to the same seed as the plain run.
        space=(ParamDef("seed", "categorical", choices=(config["seed"],)),),
        sampler=SamplerConfig(type="random", seed=0),
        num_samples=1,
        max_concurrent=1,
        resources=(("cpu", float(threads)),),
        storage=StorageConfig(path=str(workdir / "runs")),
        tracking=TrackingConfig(experiment="trial_overhead"),
    )
    import ray

    running = ray.is_initialized()  # a cluster that is already up: run_study joins it
    ray_node = ray.get_runtime_context().get_node_id() if running else None
    # A local Ray that misses its startup deadline is retried by workers.session itself.
    temp_dir = tempfile.mkdtemp(prefix="rt_bench_", dir="/tmp")
    init_kwargs = {} if running else {"num_cpus": threads, "_temp_dir": temp_dir, "log_to_driver": False}
    called = time.time()
    try:
        result = run_study(plan, trainable=timed_trial, progress=False, ray_init_kwargs=init_kwargs)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    total = time.time() - called
    (trial,) = result.trials
    if trial.status != "completed":
        raise RuntimeError(f"benchmark trial ended {trial.status}")
    lines = [json.loads(line) for line in timing_file.read_text().splitlines()]
    rows = [r for r in lines if "epoch" in r]
    marks = {r["mark"]: r["t"] - called for r in lines if "mark" in r}
    nodes = {r["node"] for r in lines if "node" in r}
    if nodes != {ray_node} and running:
        raise RuntimeError(
            f"the study's trial ran on node(s) {sorted(nodes)}, not on the running cluster's {ray_node}"
        )
    return (
        [r["t"] - called for r in rows],
        [r["cpu"] for r in rows],
        total,
        float(trial.metrics["val_accuracy"]),
        marks,
    )


def running_cluster_run(
    config: dict[str, Any], threads: int, workdir: Path
) -> tuple[list[float], dict[str, float], float, bool]:
    """:func:`tune_run` on a local cluster started beforehand (its start timed on its own): epoch ends,
    marks, the seconds ``ray.init`` took, and whether the cluster was still up after the study (the
    study joined it and left it running; :func:`tune_run` checks that its trial ran there)."""
    import ray

    from workers.session import ray_session

    temp_dir = tempfile.mkdtemp(prefix="rt_bench_", dir="/tmp")
    try:
        started = time.time()
        with ray_session(init_kwargs={"num_cpus": threads, "_temp_dir": temp_dir, "log_to_driver": False}):
            ray_start_s = time.time() - started
            assert ray.is_initialized()
            ends, _cpu, _total, _acc, marks = tune_run(
                config, threads, workdir, name="trial_overhead_running"
            )
            kept_up = ray.is_initialized()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return ends, marks, ray_start_s, kept_up


def steady_throughput(ends: list[float], n_train: int) -> float:
    """Examples per second over epochs 2..E."""
    return n_train * (len(ends) - 1) / (ends[-1] - ends[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--subset", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--quick", action="store_true", help="2 epochs on 300 examples, one plain run (for tests)"
    )
    parser.add_argument("--plain-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.subset = 2, 300
    config = _config(args)
    if args.plain_child is not None:  # the plain baseline's own process: no Ray, no MLflow imported
        ends, cpu = plain_run(config, args.threads)
        args.plain_child.write_text(json.dumps({"ends": ends, "cpu": cpu}))
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local cluster on loopback only
    n_train = load_dataset("fashion_mnist", seed=0, subset=args.subset, val_fraction=0.1).sizes["train"]
    n_train_used = (n_train // config["training"]["batch_size"]) * config["training"]["batch_size"]

    load_before = os.getloadavg()[0]
    plain_a, plain_a_cpu, plain_a_imported = plain_subprocess(args)
    with tempfile.TemporaryDirectory(prefix="bench_trial_") as workdir:
        tune_ends, tune_cpu, tune_total, tune_acc, marks = tune_run(config, args.threads, Path(workdir))
        warm_ends, warm_marks, ray_start_s, kept_up = running_cluster_run(config, args.threads, Path(workdir))
    # --quick proves the code path only: one plain run stands for both (the mean of a run with itself).
    plain_b, plain_b_cpu, plain_b_imported = (
        (plain_a, plain_a_cpu, plain_a_imported) if args.quick else plain_subprocess(args)
    )
    # CPU seconds of the training process (the trial worker includes Ray's own threads): far less
    # sensitive than wall time to other jobs on a shared machine.
    plain_cpu_tp = (
        steady_throughput(plain_a_cpu, n_train_used) + steady_throughput(plain_b_cpu, n_train_used)
    ) / 2
    tune_cpu_tp = steady_throughput(tune_cpu, n_train_used)

    plain_tp = (steady_throughput(plain_a, n_train_used) + steady_throughput(plain_b, n_train_used)) / 2
    tune_tp = steady_throughput(tune_ends, n_train_used)
    plain_first = (plain_a[0] + plain_b[0]) / 2
    tune_first_epoch = tune_ends[1] - tune_ends[0]  # a steady epoch, to separate startup from work
    result = {
        "throughput_ratio": round(tune_tp / plain_tp, 4),
        "startup_s": round(tune_ends[0] - plain_first, 2),
        "goal_throughput_ratio": 0.97,
        "goal_startup_s": 5.0,
        "cpu_throughput_ratio": round(tune_cpu_tp / plain_cpu_tp, 4),
        "plain_examples_per_cpu_s": round(plain_cpu_tp, 1),
        "tune_examples_per_cpu_s": round(tune_cpu_tp, 1),
        "plain_examples_per_s": round(plain_tp, 1),
        "tune_examples_per_s": round(tune_tp, 1),
        "plain_runs_examples_per_s": [
            round(steady_throughput(plain_a, n_train_used), 1),
            round(steady_throughput(plain_b, n_train_used), 1),
        ],
        # Where the startup goes: the study until the trial function runs (Ray start, Tune, the trial
        # actor and its imports) against the plain process until its imports are done; then each side's
        # data load, model build and first epoch (the trial's also checkpoints and reports).
        "startup_breakdown": {
            "tune_to_trial_start_s": round(marks["trial_start"], 2),
            "plain_to_imports_done_s": round((plain_a_imported + plain_b_imported) / 2, 2),
            "tune_trial_start_to_first_epoch_s": round(tune_ends[0] - marks["trial_start"], 2),
            "plain_imports_to_first_epoch_s": round(
                plain_first - (plain_a_imported + plain_b_imported) / 2, 2
            ),
        },
        # The same study on a Ray cluster that is already up (how `ray job submit` runs it; MLflow's
        # store exists from the first run): Ray's own start is then not part of the study's startup.
        "startup_s_running_cluster": round(warm_ends[0] - plain_first, 2),
        "running_cluster_to_trial_start_s": round(warm_marks["trial_start"], 2),
        "ray_local_start_s": round(ray_start_s, 2),
        "running_cluster_kept_up": kept_up,
        "time_to_first_epoch_s": round(tune_ends[0], 2),
        "plain_first_epoch_s": round(plain_first, 2),
        "tune_steady_epoch_s": round(tune_first_epoch, 2),
        "tune_study_total_s": round(tune_total, 2),
        "tune_val_accuracy": round(tune_acc, 4),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "setup": {
            "data": f"fashion_mnist subset={args.subset} (train {n_train})",
            "model": "vit_lite tiny, AutoNorm",
            "epochs": args.epochs,
            "batch_size": config["training"]["batch_size"],
            "threads": args.threads,
            "tracking": "MLflow sqlite (driver-side callback, log_batch per epoch)",
            "plain": "fresh process per plain run (torch + autonorm_core only), OMP_NUM_THREADS=threads",
            "checkpoint": "every epoch",
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs",
            "torch": torch.__version__,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
