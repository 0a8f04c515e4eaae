"""What every study entry point shares: the same options, spec loading, running, and reading results back.

A study script (``studies/autonorm_search.py``) is a thin wrapper around :func:`study_main`; the
``autonorm-study`` CLI reuses the same pieces, so ``--spec``, ``--preset``, ``--set``,
``--storage-path`` and ``--tracking-uri`` mean the same everywhere. Spec problems are printed with
their field paths and end the process with status 2, never with a traceback.

The resolved spec is also written to ``<storage_path>/<name>/study_spec.yaml`` before the study
starts, so ``autonorm-study resume|status|report <that directory>`` need nothing else.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.spec import SpecError, SpecIssue, StudySpec, load_spec
from workers.plan import StudyPlan

__all__ = [
    "EXIT_SPEC_ERROR",
    "SPEC_FILE",
    "TrialRecord",
    "add_study_options",
    "best_trial",
    "config_value",
    "describe_result",
    "experiment_location",
    "load_from_args",
    "overrides_from_args",
    "print_spec_error",
    "read_study_spec",
    "read_trials",
    "study_main",
    "write_study_spec",
]

EXIT_SPEC_ERROR = 2
SPEC_FILE = "study_spec.yaml"
"""The resolved spec, written into the study's Tune experiment directory."""


def add_study_options(parser: argparse.ArgumentParser, *, default_spec: Path | None = None) -> None:
    """The options every study entry point takes.

    Args:
        parser: the parser to extend.
        default_spec: the study's shipped spec; ``None`` makes ``--spec`` required.
    """
    parser.add_argument(
        "--spec",
        type=Path,
        default=default_spec,
        required=default_spec is None,
        help="study spec YAML" + (f" (default: {default_spec})" if default_spec else ""),
    )
    add_layer_options(parser)


def add_layer_options(parser: argparse.ArgumentParser) -> None:
    """``--preset``, ``--set``, ``--storage-path``, ``--tracking-uri`` (the layers over a spec file)."""
    parser.add_argument("--preset", default=None, help="a named preset from the spec's `presets:` section")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field by dotted path, value parsed as YAML (repeatable), "
        "e.g. --set training.epochs=5 --set 'model.norm={type: layernorm}'",
    )
    parser.add_argument(
        "--storage-path",
        default=None,
        help="same as --set storage_path=PATH (local directory or s3://bucket/prefix)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="same as --set tracking.uri=URI (default: $MLFLOW_TRACKING_URI, else sqlite in the storage dir)",
    )


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the shortcut options, in the order they apply."""
    overrides = list(args.overrides or [])
    if getattr(args, "storage_path", None):
        overrides.append(f"storage_path={json.dumps(str(args.storage_path))}")
    if getattr(args, "tracking_uri", None):
        overrides.append(f"tracking.uri={json.dumps(str(args.tracking_uri))}")
    return overrides


def load_from_args(
    args: argparse.Namespace, *, spec_path: Path | None = None, model: type[BaseModel] = StudySpec
) -> Any:
    """Load the spec named by ``args`` (or ``spec_path``) with its preset and overrides.

    Raises:
        SpecError: every problem found.
    """
    path = spec_path if spec_path is not None else args.spec
    return load_spec(path, overrides_from_args(args), preset=args.preset, model=model)


def print_spec_error(err: SpecError, *, file: Any = None) -> None:
    print(err.format(), file=file or sys.stderr)


# --------------------------------------------------------------------------------------------------
# The study directory: spec file and trials
# --------------------------------------------------------------------------------------------------


def experiment_location(plan: StudyPlan) -> tuple[Any, str, str]:
    """``(pyarrow filesystem or None, path for it, user-facing URI)`` of the study's Tune directory."""
    from workers.storage import resolve_storage

    storage = resolve_storage(plan.storage)
    return storage.filesystem, storage.experiment_path(plan.name), storage.experiment_uri(plan.name)


def write_study_spec(plan: StudyPlan, text: str) -> str:
    """Write the resolved spec into the study directory (local or S3); returns its URI."""
    fs, path, uri = experiment_location(plan)
    if fs is None:
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        (target / SPEC_FILE).write_text(text, encoding="utf-8")
    else:
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{SPEC_FILE}") as f:
            f.write(text.encode("utf-8"))
    return f"{uri}/{SPEC_FILE}"


def read_study_spec(
    study_dir: str | Path, *, overrides: Sequence[str] = (), model: type[BaseModel] = StudySpec
) -> Any:
    """Load the spec written into a local study directory (``--set`` still applies)."""
    path = Path(study_dir) / SPEC_FILE
    if not path.is_file():
        raise SpecError(
            [SpecIssue("", f"no {SPEC_FILE} in {study_dir}: not a study directory", None, str(path))]
        )
    return load_spec(path, overrides, model=model)


@dataclass
class TrialRecord:
    """One trial as read back from the Tune experiment directory."""

    trial_id: str
    status: str
    config: dict[str, Any]
    last_result: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def read_trials(plan: StudyPlan) -> list[TrialRecord]:
    """The study's trials from Tune's experiment state (no Ray cluster needed).

    Returns an empty list when the study has not written its state yet.
    """
    from ray.tune import ExperimentAnalysis

    fs, path, _ = experiment_location(plan)
    # Trials that never reported have no result file yet; Tune warns about each, we list them as such.
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        analysis = ExperimentAnalysis(path, storage_filesystem=fs)
    except (ValueError, FileNotFoundError):
        return []
    finally:
        quiet.setLevel(level)
    frames = analysis.trial_dataframes
    records = []
    for trial in analysis.trials:
        df = frames.get(trial.trial_id)
        history = [] if df is None or df.empty else df.to_dict(orient="records")
        records.append(
            TrialRecord(
                trial_id=str(trial.trial_id),
                status=str(trial.status),
                config=dict(trial.config or {}),
                last_result=dict(trial.last_result or {}),
                history=history,
            )
        )
    return records


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """A searched value from a trial config, whether Tune stored it flat or nested."""
    if dotted in config:
        return config[dotted]
    cur: Any = config
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def best_trial(trials: Sequence[TrialRecord], metric: str, mode: str) -> TrialRecord | None:
    scored = [
        t
        for t in trials
        if isinstance(t.last_result.get(metric), int | float) and math.isfinite(float(t.last_result[metric]))
    ]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda t: sign * float(t.last_result[metric]))


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def describe_result(result: Any, plan: StudyPlan) -> dict[str, Any]:
    """The printable summary of ``workers.run_study``'s :class:`~workers.runner.StudyResult`.

    Best configuration (its searched values and full config) with its metric, the MLflow parent run,
    trial counts by status, and where everything lives.
    """
    trials = list(getattr(result, "trials", []) or [])
    best = result.best(plan.metric, plan.mode) if hasattr(result, "best") else None
    out: dict[str, Any] = {
        "study": plan.name,
        "metric": plan.metric,
        "mode": plan.mode,
        "best_metric": best.metrics.get(plan.metric) if best is not None else None,
        "best_trial_id": best.trial_id if best is not None else None,
        "best_params": dict(best.params) if best is not None else None,
        "parent_run_id": getattr(result, "parent_run_id", None),
        "tracking_uri": getattr(result, "tracking_uri", None),
        "experiment_path": getattr(result, "experiment_path", None),
        "restored": getattr(result, "restored", None),
        "trials": dict(Counter(str(t.status) for t in trials)),
        "best_config": dict(best.config) if best is not None else None,
    }
    return out


def run_plan(plan: StudyPlan, *, spec_text: str, quiet: bool = False) -> Any:
    """Write the resolved spec next to the results, then run the study (idempotent: restores)."""
    from workers import run_study  # heavy (Ray, Optuna, MLflow): only when actually running

    where = write_study_spec(plan, spec_text)
    if not quiet:
        print(f"study {plan.name!r}: spec -> {where}", flush=True)
    return run_study(plan)


AfterHook = Callable[[Any, StudyPlan, Any], None]
"""Called as ``after(spec, plan, result)`` once a study finished (plots, extra artifacts)."""


def study_main(
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    description: str,
    default_spec: Path | None,
    model: type[BaseModel] = StudySpec,
    after: AfterHook | None = None,
) -> int:
    """The body of a study entry point: parse options, load the spec, run, print the result.

    Returns:
        0 on success, 2 for spec errors (printed, no traceback).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_study_options(parser, default_spec=default_spec)
    parser.add_argument("--dry-run", action="store_true", help="validate and print the plan, run nothing")
    args = parser.parse_args(argv)
    try:
        spec = load_from_args(args, model=model)
        plan = spec.to_plan()
    except SpecError as e:
        print_spec_error(e)
        return EXIT_SPEC_ERROR
    if args.dry_run:
        print(spec.to_yaml(), end="")
        print(
            f"# {len(plan.space)} searched parameters, {plan.num_samples} samples, storage {plan.storage.path}"
        )
        return 0
    result = run_plan(plan, spec_text=spec.to_yaml())
    summary = describe_result(result, plan)
    print(json.dumps(summary, indent=2, default=str))
    if after is not None:
        after(spec, plan, result)
    return 0
