"""The batch-size correlation study: does a divergence-correcting layer get worse as the batch grows?

    python studies/batchsize_correlation.py                    # default spec; $RAY_ADDRESS or a local Ray
    python studies/batchsize_correlation.py --preset smoke     # 2 CPU cores, < 3 min, every output
    python studies/batchsize_correlation.py --preset cnn       # PatchNorm / conv variant
    python studies/batchsize_correlation.py --set lr_policy=tuned --set 'seeds=[0,1,2,3,4,5,6,7]'
    ray job submit --working-dir . -- python studies/batchsize_correlation.py

Phases (PROTOCOL.md §2, DESIGN.md "data flow"):

1. ``lr_policy: tuned`` only -- one Optuna (TPE) study of ``training.lr`` per ``(arm, batch size)``
   cell, on a held-out tuning seed, selected on the validation metric.
2. Confirmatory -- a grid over ``model.layer.type x training.batch_size x seed``, FIFO scheduler (no
   early stopping), the same seeds (initialisation seed and data order) for every arm.
3. Analysis -- :func:`studies.analysis.batchsize_trend` on the final test metric of every trial
   (failed/diverged trials counted, not dropped), then ``verdict.json``, ``report.md``,
   ``report.html``, ``trials.csv`` and plots in the study directory (``<storage_path>/<name>/``),
   all logged on the study's MLflow parent run with a ``verdict/<arm>`` tag per arm.

The script is idempotent like ``workers.run_study``: rerun after a crash, finished trials and phases
are restored, not repeated.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from studies._entry import (  # noqa: E402
    EXIT_SPEC_ERROR,
    add_study_options,
    load_from_args,
    print_spec_error,
)
from studies.batchsize_spec import BatchSizeStudySpec, cell_key  # noqa: E402
from studies.spec import SpecError  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd

    from workers.plan import StudyPlan
    from workers.runner import StudyResult, TrialRecord
    from workers.trainable import TrialFunction

__all__ = [
    "DEFAULT_SPEC",
    "BatchSizeStudyOutcome",
    "main",
    "run_batchsize_study",
    "trials_table",
]

DEFAULT_SPEC = _ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
_TAG = "batchsize"


@dataclass(frozen=True)
class BatchSizeStudyOutcome:
    """What :func:`run_batchsize_study` produced.

    Attributes:
        study_dir: where the outputs were written (``<storage_path>/<name>``; a URI for S3).
        verdict: the ``verdict.json`` dictionary (:func:`studies.analysis.batchsize_trend`).
        table: one row per confirmatory trial (arm, batch_size, seed, metric, status, lr, ...).
        files: output name -> local path of the written files (a temporary copy for S3 storage).
        parent_run_id: the MLflow run holding the outputs and the ``verdict/<arm>`` tags.
        tracking_uri: where that run lives.
        tuned_lr: ``arm@B -> lr`` for the ``tuned`` policy, else ``None``.
        wall_time_s / cpu_hours / gpu_hours: resources spent (trial time x per-trial resources).
    """

    study_dir: str
    verdict: dict[str, Any]
    table: pd.DataFrame
    files: dict[str, Path]
    parent_run_id: str | None
    tracking_uri: str
    tuned_lr: dict[str, float] | None = None
    wall_time_s: float = 0.0
    cpu_hours: float = 0.0
    gpu_hours: float = 0.0
    phase_runs: dict[str, str] = field(default_factory=dict)


def _say(message: str) -> None:
    print(f"[{_TAG}] {message}", flush=True)


def trials_table(trials: Sequence[TrialRecord], *, metric: str) -> pd.DataFrame:
    """One row per confirmatory trial: the analysis input plus provenance.

    Columns: ``arm, batch_size, seed, <metric>, status, lr, epochs_done, time_total_s, trial_id,
    mlflow_run_id``. ``status`` is the runner's (``completed | diverged | error | pruned``); the analysis
    counts everything but ``completed`` as a failure.
    """
    import pandas as pd

    rows = []
    for t in trials:
        cfg = t.config
        value = t.metrics.get(metric)
        rows.append(
            {
                "arm": str(cfg["model"]["layer"]["type"]),
                "batch_size": int(cfg["training"]["batch_size"]),
                "seed": int(cfg.get("seed", 0)),
                metric: float(value) if isinstance(value, int | float) else math.nan,
                "status": t.status,
                "lr": float(cfg["training"]["lr"]),
                "epochs_done": t.metrics.get("epoch"),
                "time_total_s": float(t.metrics.get("time_total_s") or 0.0),
                "trial_id": t.trial_id,
                "mlflow_run_id": t.mlflow_run_id,
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["arm", "batch_size", "seed", metric, "status", "lr"])
    return df.sort_values(["arm", "batch_size", "seed"], kind="stable").reset_index(drop=True)


@contextlib.contextmanager
def _ray_session(ray_address: str | None, init_kwargs: Mapping[str, Any] | None) -> Iterator[None]:
    """One Ray connection for every phase (a tuned study runs many plans; starting Ray per plan
    would cost ~15-20 s each). Joins ``ray_address`` / ``$RAY_ADDRESS`` or starts a loopback cluster,
    and stops only what it started, waiting for its worker processes."""
    import ray

    if ray.is_initialized():
        yield
        return
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **dict(init_kwargs or {}))
        try:
            yield
        finally:
            ray.shutdown()  # disconnects this driver; the cluster keeps running
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every listener on 127.0.0.1
    kwargs: dict[str, Any] = {"include_dashboard": False}
    kwargs.update(init_kwargs or {})
    ray.init(**kwargs)
    try:
        yield
    finally:
        import psutil

        children = psutil.Process().children(recursive=True)
        ray.shutdown()
        _, alive = psutil.wait_procs(children, timeout=30)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _resource_hours(trials: Sequence[TrialRecord], plan: StudyPlan) -> tuple[float, float]:
    res = dict(plan.resources)
    seconds = sum(float(t.metrics.get("time_total_s") or 0.0) for t in trials)
    return seconds * res.get("cpu", 0.0) / 3600.0, seconds * res.get("gpu", 0.0) / 3600.0


def tune_learning_rates(
    spec: BatchSizeStudySpec,
    *,
    run: Callable[[StudyPlan], StudyResult],
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, float], dict[str, Any], list[tuple[StudyPlan, StudyResult]]]:
    """Phase 1 of ``lr_policy: tuned``: one Optuna study of ``training.lr`` per (arm, batch size).

    Returns:
        ``cell -> best lr``, a JSON-able record per cell (best lr, its validation metric, trial
        counts, whether the best lr sits at an edge of the search range), and each cell's plan and result.
    """
    lr_table: dict[str, float] = {}
    record: dict[str, Any] = {}
    results = []
    cells = [(arm, b) for arm in spec.arms for b in spec.batch_sizes]
    lo, hi = math.log(spec.lr_tuning.low), math.log(spec.lr_tuning.high)
    for i, (arm, b) in enumerate(cells, start=1):
        key = cell_key(arm, b)
        _say(f"phase lr_tuning: cell {i}/{len(cells)} ({key}), {spec.lr_tuning.trials} trials")
        plan = spec.tuning_plan(arm, b, environ=environ)
        result = run(plan)
        results.append((plan, result))
        best = result.best(spec.lr_tuning.metric, spec.lr_tuning.mode)
        if best is None:
            # Nothing finished: fall back to the configured lr so the cell still runs, and say so.
            lr = float(spec.training.lr)
            record[key] = {"lr": lr, "fallback": True, "reason": "no completed tuning trial"}
            _say(f"  {key}: no completed tuning trial; using training.lr={lr:g}")
        else:
            lr = float(best.config["training"]["lr"])
            # Within 5 % of the log range of an edge: the optimum may lie outside the range.
            edge = min(math.log(lr) - lo, hi - math.log(lr)) < 0.05 * (hi - lo)
            record[key] = {
                "lr": lr,
                spec.lr_tuning.metric: float(best.metrics[spec.lr_tuning.metric]),
                "trials_completed": result.count("completed"),
                "trials_failed": len(result.trials) - result.count("completed"),
                "at_range_edge": bool(edge),
                "mlflow_parent_run_id": result.parent_run_id,
            }
            _say(f"  {key}: lr={lr:.4g}{' (at the edge of the range!)' if edge else ''}")
        lr_table[key] = lr
    return lr_table, record, results


def _umbrella_run(tracking_uri: str, experiment: str, name: str, key: str, tags: Mapping[str, str]) -> str:
    """Find or create the study-level MLflow run of a multi-plan (tuned) study, by a stable key."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    found = client.search_runs(
        [exp_id], filter_string=f"tags.`autonorm.umbrella_key` = '{key}'", max_results=1
    )
    if found:
        return str(found[0].info.run_id)
    run = client.create_run(exp_id, run_name=name, tags={**tags, "autonorm.umbrella_key": key})
    return str(run.info.run_id)


def _log_outputs(
    tracking_uri: str,
    run_id: str,
    files: Mapping[str, Path],
    verdict: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> None:
    """Outputs as artifacts, one ``verdict/<arm>`` tag per arm, the per-arm statistics as metrics."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking_uri=tracking_uri)
    for path in files.values():
        # All at the artifact root: report.html links its plots by relative name.
        client.log_artifact(run_id, str(path))
    now = int(time.time() * 1000)
    tags = [RunTag(f"verdict/{arm}", str(v)) for arm, v in verdict["verdict"].items()]
    metrics = []
    for arm, res in verdict["arms"].items():
        for key in ("slope", "interaction", "p_value", "p_value_holm", "spearman_rho", "n", "n_failed"):
            value = res.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                metrics.append(Metric(f"{key}/{arm}", float(value), now, 0))
    for key, value in extra.items():
        metrics.append(Metric(key, float(value), now, 0))
    params = [Param("analysis_metric", str(verdict["metric"])), Param("control", str(verdict["control"]))]
    existing = client.get_run(run_id).data.params
    params = [p for p in params if p.key not in existing]
    client.log_batch(run_id, metrics=metrics, params=params, tags=tags)


def _write_study_dir(plan: StudyPlan, name: str, files: Mapping[str, Path]) -> str:
    """Copy the outputs into ``<storage_path>/<name>/`` when storage is remote; returns its URI."""
    from workers.storage import resolve_storage

    storage = resolve_storage(plan.storage)
    if storage.is_local:
        return storage.experiment_uri(name)
    target = storage.experiment_path(name)
    fs = storage.filesystem
    if fs is None:  # resolve_storage gives remote storage a filesystem; be explicit anyway
        raise RuntimeError(f"no filesystem for remote storage {storage.storage_path!r}")
    fs.create_dir(target, recursive=True)
    for path in files.values():
        with fs.open_output_stream(f"{target}/{path.name}") as out:
            out.write(path.read_bytes())
    return storage.experiment_uri(name)


def run_batchsize_study(
    spec: BatchSizeStudySpec,
    *,
    ray_address: str | None = None,
    ray_init_kwargs: Mapping[str, Any] | None = None,
    trainable: TrialFunction | None = None,
    progress: bool = True,
    environ: Mapping[str, str] | None = None,
) -> BatchSizeStudyOutcome:
    """Run every phase of the study, analyse, write and log the outputs.

    Args:
        spec: the validated spec.
        ray_address: cluster to join (``$RAY_ADDRESS`` when ``None``; a local loopback Ray when neither).
        ray_init_kwargs: extra ``ray.init`` keywords for the local case (``num_cpus``, ``_temp_dir``).
        trainable: trial function (``workers.trainable.autonorm_trial`` by default; tests inject one).
        progress: print progress lines (trials done / total, ETA, per phase).
        environ: environment for the tracking URI and git commit (``os.environ`` by default).
    """
    from studies.analysis import batchsize_trend
    from studies.report import write_batchsize_report
    from workers.runner import run_study
    from workers.storage import resolve_storage

    start = time.monotonic()

    def run(plan: StudyPlan) -> StudyResult:
        return run_study(plan, trainable=trainable, progress=progress)

    total = spec.expected_trials + spec.tuning_trials
    _say(
        f"study {spec.name!r}: {len(spec.arms)} arms x {len(spec.batch_sizes)} batch sizes x "
        f"{len(spec.seeds)} seeds = {spec.expected_trials} confirmatory trials"
        + (f" + {spec.tuning_trials} lr-tuning trials" if spec.tuning_trials else "")
        + f" ({total} total), lr_policy={spec.lr_policy}"
    )
    tuned_lr: dict[str, float] | None = None
    tuning_record: dict[str, Any] = {}
    results: list[tuple[StudyPlan, StudyResult]] = []
    with _ray_session(ray_address, ray_init_kwargs):
        if spec.lr_policy == "tuned":
            tuned_lr, tuning_record, tuning_results = tune_learning_rates(spec, run=run, environ=environ)
            results += tuning_results
            plans = [
                spec.confirmatory_plan(tuned_lr=tuned_lr, arms=[arm], environ=environ) for arm in spec.arms
            ]
        else:
            plans = [spec.confirmatory_plan(environ=environ)]
        confirmatory: list[TrialRecord] = []
        for i, plan in enumerate(plans, start=1):
            _say(f"phase confirmatory {i}/{len(plans)}: {plan.name} (grid, FIFO, full budget)")
            result = run(plan)
            results.append((plan, result))
            confirmatory += result.trials

    _say("phase analysis: statistics, verdict, report")
    a = spec.analysis
    table = trials_table(confirmatory, metric=a.metric)
    verdict = batchsize_trend(
        table,
        control=spec.control,
        metric=a.metric,
        higher_is_better=a.higher_is_better,
        n_boot=a.n_boot,
        seed=a.seed,
        n_perm=a.n_perm,
        confidence=a.confidence,
    )
    cpu_h = gpu_h = 0.0
    for plan, result in results:
        c, g = _resource_hours(result.trials, plan)
        cpu_h += c
        gpu_h += g
    wall = time.monotonic() - start

    main_plan, main_result = results[-1]
    storage = resolve_storage(main_plan.storage)
    local_dir = Path(storage.experiment_path(spec.name)) if storage.is_local else Path(tempfile.mkdtemp())
    protocol = spec.to_document()
    if tuned_lr is not None:
        protocol["tuned_lr"] = tuned_lr
    files = write_batchsize_report(
        verdict,
        table,
        local_dir,
        title=f"Batch-size correlation study: {spec.name}",
        protocol=protocol,
        wall_time_s=wall,
        cpu_hours=cpu_h,
        gpu_hours=gpu_h,
    )
    (local_dir / "spec.yaml").write_text(spec.to_yaml())
    files["spec"] = local_dir / "spec.yaml"
    if tuning_record:
        (local_dir / "lr_tuning.json").write_text(json.dumps(tuning_record, indent=2) + "\n")
        files["lr_tuning"] = local_dir / "lr_tuning.json"
    study_dir = _write_study_dir(main_plan, spec.name, files)

    tracking_uri = main_result.tracking_uri
    phase_runs = {plan.name: r.parent_run_id for plan, r in results if r.parent_run_id}
    parent: str | None = main_result.parent_run_id
    if len(results) > 1:
        # Several plans (tuned policy): one study-level run, the phases' parent runs nested under it.
        key = hashlib.sha256(study_dir.encode()).hexdigest()[:16]
        parent = _umbrella_run(
            tracking_uri, main_plan.tracking.experiment, spec.name, key, dict(main_plan.tags)
        )
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        for run_id in phase_runs.values():
            client.set_tag(run_id, "mlflow.parentRunId", parent)
        client.set_terminated(parent, "FINISHED")
    if parent is not None:
        extra = {"wall_time_s": wall, "cpu_hours": cpu_h, "gpu_hours": gpu_h}
        _log_outputs(tracking_uri, parent, files, verdict, extra)

    _say(f"outputs in {study_dir}; MLflow run {parent} ({tracking_uri})")
    for arm in sorted(verdict["verdict"], key=lambda x: (x != spec.control, x)):
        r = verdict["arms"][arm]
        ci = r["slope_ci"]
        ci_txt = f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "n/a"
        _say(
            f"  {arm:<18} n={r['n']:<3} failed={r['n_failed']:<2} slope={_num(r['slope'])} {ci_txt} "
            f"interaction={_num(r['interaction'])} p_holm={_num(r['p_value_holm'])} -> {verdict['verdict'][arm]}"
        )
    for warning in verdict.get("warnings", []):
        _say(f"  warning: {warning}")
    _say(f"wall time {wall / 60:.1f} min, {cpu_h:.3f} CPU h, {gpu_h:.3f} GPU h")
    return BatchSizeStudyOutcome(
        study_dir=study_dir,
        verdict=verdict,
        table=table,
        files=dict(files),
        parent_run_id=parent,
        tracking_uri=tracking_uri,
        tuned_lr=tuned_lr,
        wall_time_s=wall,
        cpu_hours=cpu_h,
        gpu_hours=gpu_h,
        phase_runs=phase_runs,
    )


def _num(v: Any) -> str:
    return f"{v:+.4f}" if isinstance(v, int | float) else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``--spec`` (default: the shipped spec), ``--preset``, ``--set``; exit 2 on spec errors."""
    parser = argparse.ArgumentParser(
        prog="batchsize_correlation.py", description=(__doc__ or "").splitlines()[0]
    )
    add_study_options(parser, default_spec=DEFAULT_SPEC)
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and print the resolved spec, run nothing"
    )
    args = parser.parse_args(argv)
    try:
        spec = load_from_args(args, model=BatchSizeStudySpec)
    except SpecError as e:
        print_spec_error(e)
        return EXIT_SPEC_ERROR
    if args.dry_run:
        print(spec.to_yaml(), end="")
        print(f"# {spec.expected_trials} confirmatory trials, {spec.tuning_trials} tuning trials")
        return 0
    run_batchsize_study(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
