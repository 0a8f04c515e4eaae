"""``autonorm-study``: validate, run, resume, submit, inspect and report studies.

    autonorm-study validate SPEC [SPEC ...] [--preset NAME] [--set KEY=VALUE ...] [--print] [--allow-exploratory]
    autonorm-study plan     SPEC [--cpus N] [--gpus M] [--json] [--pilot STUDY_DIR --power 0.8]
    autonorm-study plan     --history [--tracking-uri URI] [--json]   # past estimates against the real runs
    autonorm-study run      SPEC [--preset NAME] [--set KEY=VALUE ...] [--json]
    autonorm-study resume   SPEC|STUDY_DIR [...]
    autonorm-study submit   SPEC [--address URL] [--wait] [...]     # a Ray job on a cluster
    autonorm-study status   SPEC|STUDY_DIR | --job ID [--address URL]
    autonorm-study report   SPEC|STUDY_DIR [--out DIR]
    autonorm-study reproduce RUN_ID|RUN_URL|STUDY_DIR [--tracking-uri URI] [--rerun [--allow-different-code]] [--offline]
    autonorm-study results  [DIR ...] [--output PATH] [--export STUDY_DIR --to ROOT]   # docs/results.md from results/
    autonorm-study ls       [--tracking-uri URI] [--json]            # every study in a tracking store, newest first

SPEC may also be given as ``--spec PATH`` (as in every entry point). ``validate``, ``plan``, ``run``
and ``submit`` refuse a design that can never decide (:mod:`studies.decidability`) unless it is
exploratory (``--allow-exploratory`` or ``exploratory: true``).

Exit status: 0 success, 1 a failed job or an unreachable service, 2 an invalid spec (every error
printed with its field path and YAML line, never a traceback).

Every command works on every study kind (``kind:`` in the spec, :data:`studies.kinds.DEFAULT_KIND` when absent; see
:mod:`studies.kinds`): ``run`` is what the scripts in ``studies/`` do, ``status``/``report``/``resume``
read the study directory ``<storage_path>/<name>/`` (its ``study_spec.yaml`` says everything else).

``submit`` uploads the working directory (minus ``.venv``, ``.git``, ``runs``, ``mlruns``, ``*.db``, ...)
as a Ray job whose entry point is ``python -m studies.cli run SPEC ...``. Only non-secret settings
(tracking URI, experiment name, S3 endpoint and region, git commit; see :func:`carried_env`) are passed
in the job's ``env_vars``: Ray keeps a job's runtime_env in its job table (``ray job list``, the
dashboard) and logs it verbatim, so credentials belong in the cluster's own environment or secret
store; one named with ``--env NAME`` is carried with a warning. ``RAY_AUTH_TOKEN`` (or the file named by
``RAY_AUTH_TOKEN_PATH``) authenticates this client: Ray ≥ 2.59 clusters enable token auth, and Ray's
job client only attaches the token by itself when ``RAY_AUTH_MODE=token`` is also set in the client's
environment, so we send the ``Authorization`` header explicitly (checked against a token-auth
``ray start --head`` cluster: without it the submission is refused, with only ``RAY_AUTH_TOKEN`` set it
succeeds). The token is not put into the job's environment (the cluster already has it) and no value
of a carried variable is printed.

For a cluster on another machine (an address that is not loopback) ``submit`` drops a loopback
``MLFLOW_TRACKING_URI`` (it would name the cluster's own host; the cluster needs its own tracking
server) and requires durable storage: ``s3://...`` or an absolute path, never a relative one. With
``--wait`` it follows the job's log as it is written (Ray's log tail) and exits 0 only when the job
SUCCEEDED. Every ``run`` ends by printing the results directory and direct MLflow links.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.entrypoints import (
    EXIT_SPEC_ERROR,
    add_layer_options,
    load_for_run,
    overrides_from_args,
    print_spec_error,
    print_where,
    validate_command,
)
from studies.entrypoints import decidable as _decidable
from studies.entrypoints import load_target as _load_target
from studies.kinds import DEFAULT_KIND, KINDS, kind_for
from studies.results import add_arguments as add_results_arguments
from studies.running import run_study_spec
from studies.schema import SpecError, SpecIssue, resolve_storage_path
from studies.study_dir import SPEC_FILE
from studies.submit import (
    CARRIED_NAMES,
    DEFAULT_EXCLUDES,
    carried_env,
    drop_loopback_tracking_uri,
    durable_storage_issue,
    is_loopback,
    job_entrypoint,
    ray_auth_headers,
)
from workers.errors import StudyError

__all__ = [
    "CARRIED_NAMES",
    "DEFAULT_EXCLUDES",
    "carried_env",
    "drop_loopback_tracking_uri",
    "is_loopback",
    "job_entrypoint",
    "main",
    "ray_auth_headers",
]

_TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# --------------------------------------------------------------------------------------------------
# validate / run / resume
# --------------------------------------------------------------------------------------------------


def _run(spec: Any, args: argparse.Namespace) -> int:
    from studies.entrypoints import run_interruptible

    outcome, code = run_interruptible(
        spec,
        allow_changed_spec=getattr(args, "allow_changed_spec", False),
        allow_exploratory=getattr(args, "allow_exploratory", False),
        run=run_study_spec,
    )
    if outcome is None:
        return code
    if getattr(args, "json", False):  # the verdict and where the outputs are were printed by the study
        _print_json(outcome.summary)
    print_where(outcome)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    return _run(load_for_run(lambda extra: _load_target(args.spec, args, extra)), args)


def _cmd_resume(args: argparse.Namespace) -> int:
    from studies.study_dir import StudyDir

    spec = load_for_run(lambda extra: _load_target(args.target, args, extra))
    where = StudyDir.of(spec)
    if where.read_text(SPEC_FILE) is None:
        print(f"nothing to resume: no study at {where.uri} (use `autonorm-study run`)", file=sys.stderr)
        return 1
    print(f"resuming study {spec.name!r} from {where.uri}", flush=True)
    return _run(spec, args)


def _cmd_extend(args: argparse.Namespace) -> int:
    from studies.running import extend_study
    from studies.sequential import ExtendRefused

    spec = _load_target(args.target, args)
    try:
        outcome = extend_study(spec, args.seeds)
    except ExtendRefused as e:
        print(f"extend refused: {e}", file=sys.stderr)
        return EXIT_SPEC_ERROR
    if args.json:  # the study printed its verdict, lines per hypothesis and cost already
        _print_json(outcome.summary)
    else:
        print(extend_line(outcome, args.seeds))
    print_where(outcome)
    return 0


def extend_line(outcome: Any, seeds: int) -> str:
    """``extend``'s one line after the study's own: the seeds added, the study verdict now and the
    trials run in all (the count ``status`` and ``ls`` show)."""
    summary = outcome.summary or {}
    trials = summary.get("trials")
    ran = f", trials run: {trials}" if isinstance(trials, int) else ""
    return (
        f"[{outcome.name}] extended by {seeds} seed{'' if seeds == 1 else 's'}: "
        f"study verdict {summary.get('study_verdict')}{ran}"
    )


# --------------------------------------------------------------------------------------------------
# submit
# --------------------------------------------------------------------------------------------------


def _cmd_submit(args: argparse.Namespace) -> int:
    # Validate locally first: a bad spec (or one that cannot decide) never reaches the cluster.
    spec = _decidable(_load_target(args.spec, args), args)
    script = args.script or kind_for(spec).script
    working_dir = Path(args.working_dir).resolve()
    spec_path = Path(args.spec).resolve()
    try:
        spec_rel = spec_path.relative_to(working_dir).as_posix()
    except ValueError:
        raise SpecError(
            [
                SpecIssue(
                    "",
                    f"the spec must lie inside the uploaded working directory {working_dir}",
                    None,
                    args.spec,
                )
            ]
        ) from None
    cluster = args.address or os.environ.get("RAY_ADDRESS")
    issue = durable_storage_issue(str(spec.storage_path), cluster)
    if issue is not None:
        raise SpecError([SpecIssue("storage_path", issue, None, args.spec)])
    overrides = overrides_from_args(args)
    if spec.exploratory and "exploratory" not in spec.model_fields_set:
        overrides.append("exploratory=true")  # --allow-exploratory, carried into the job
    storage = resolve_storage_path(spec.storage_path)
    if storage != spec.storage_path:
        # A relative storage_path would land in the job's temporary copy of the working dir.
        overrides.append(f"storage_path={json.dumps(storage)}")
    excludes = [*DEFAULT_EXCLUDES, *args.exclude]
    try:
        inside = Path(storage).relative_to(working_dir).as_posix()
        excludes.append(inside)
    except ValueError:
        pass
    env = carried_env(os.environ, args.env, warn=lambda msg: print(msg, file=sys.stderr))
    drop_loopback_tracking_uri(env, cluster, warn=lambda msg: print(msg, file=sys.stderr))
    entrypoint = job_entrypoint(
        spec_rel, preset=args.preset, overrides=overrides, script=script, python=args.python
    )
    runtime_env = {"working_dir": str(working_dir), "excludes": excludes, "env_vars": env}
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(args.address, headers=ray_auth_headers(os.environ))
        job_id = client.submit_job(
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            submission_id=args.job_id,
            metadata={
                "autonorm.study_name": spec.name,
                "autonorm.kind": kind_for(spec).name,
                "autonorm.spec_hash": spec.hash(),
            },
        )
    except Exception as e:  # the service boundary: unreachable, refused, unauthenticated (RayError)
        print(f"submit failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"submitted job {job_id} for study {spec.name!r}")
    print(f"  entrypoint: {entrypoint}")
    print(f"  carried env: {', '.join(sorted(env))} (values not shown)")
    print(f"  results: {storage}/{spec.name}")
    if not args.wait:
        print(
            f"  follow: autonorm-study status --job {job_id}"
            + (f" --address {args.address}" if args.address else "")
        )
        return 0
    return _follow(client, job_id, timeout=args.timeout)


async def _tail(client: Any, job_id: str) -> None:
    async for chunk in client.tail_job_logs(job_id):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _status(client: Any, job_id: str) -> str:
    return str(client.get_job_status(job_id)).rsplit(".", 1)[-1]


def _follow(client: Any, job_id: str, *, timeout: float | None) -> int:
    """Stream the job's logs as they come (Ray's log tail) until it ends; 0 only when it SUCCEEDED."""
    start = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(_tail(client, job_id), timeout))
    except TimeoutError:
        pass
    except Exception as e:  # the stream broke (a dashboard restart): the job's status still decides
        print(f"log stream of job {job_id} ended: {type(e).__name__}: {e}", file=sys.stderr)
    # The stream closes when the driver exits; the job's final status may follow a moment later.
    status = _status(client, job_id)
    while status not in _TERMINAL and (timeout is None or time.monotonic() - start < timeout):
        time.sleep(2.0)
        status = _status(client, job_id)
    if status not in _TERMINAL:
        print(f"job {job_id} still {status} after {timeout:.0f} s; not waiting longer", file=sys.stderr)
        return 1
    print(f"job {job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


# --------------------------------------------------------------------------------------------------
# status / report
# --------------------------------------------------------------------------------------------------


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cmd_ls(args: argparse.Namespace) -> int:
    """``ls``: every study in a tracking store, one line each, newest first."""
    from studies.listing import format_studies, list_studies

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        print("ls: which tracking store? give --tracking-uri (or MLFLOW_TRACKING_URI)", file=sys.stderr)
        return EXIT_SPEC_ERROR
    rows = list_studies(uri)
    if args.json:
        _print_json(rows)
    else:
        print(format_studies(rows))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    if args.job:
        from ray.job_submission import JobSubmissionClient

        try:
            client = JobSubmissionClient(args.address, headers=ray_auth_headers(os.environ))
            info = client.get_job_info(args.job)
        except Exception as e:  # the service boundary: unreachable, refused, unauthenticated (RayError)
            print(f"status failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        _print_json(
            {
                "job": args.job,
                "status": str(info.status).rsplit(".", 1)[-1],
                "message": info.message,
                "entrypoint": info.entrypoint,
                "metadata": info.metadata,
            }
        )
        return 0
    if not args.target:
        print("status needs a spec, a study directory or --job ID", file=sys.stderr)
        return EXIT_SPEC_ERROR
    spec = _load_target(args.target, args)
    status = kind_for(spec).status(spec)
    if "wall_s" not in status:  # a kind whose status does not read it: the wall time its run wrote
        from studies.kinds.records import study_wall_s
        from studies.study_dir import StudyDir

        text = StudyDir.of(spec).read_text("verdict.json")
        status["wall_s"] = study_wall_s(json.loads(text) if text else None)
    if args.json:
        _print_json(status)
        return 0
    print("\n".join(format_status(spec, status)))
    return 0


def aligned(rows: Sequence[Mapping[str, Any]], indent: str = "  ") -> list[str]:
    """``rows`` as a text table: a header of their keys (first-seen order), one line per row,
    columns padded to their widest cell (numbers right-aligned), missing cells blank."""
    if not rows:
        return []
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    cells = [[_short(row[c]) if c in row and row[c] is not None else "" for c in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(c), int | float) or row.get(c) is None for row in rows) for c in columns
    ]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(columns), *(line(c) for c in cells)]


def format_status(spec: Any, status: Mapping[str, Any]) -> list[str]:
    """``status`` as text: totals, trials per status, a table of phases (trials per status), the
    verdict, then every trial grouped by phase (each phase with its own columns: a tuning phase shows
    its selection metric, never the test set's)."""
    by_status = dict(sorted((status.get("by_status") or {}).items()))
    lines = [f"study {spec.name} ({spec.kind}) at {status['directory']}"]
    from workers.console import format_wall

    lines.append(
        f"trials run: {status['trials']} of {status['expected_trials']} planned"
        + ("" if by_status else " (none yet)")
    )
    if status.get("wall_s") is not None:  # a finished study: the wall time its run wrote
        lines.append(f"wall time: {format_wall(status['wall_s'])}")
    lines += aligned([{"status": k, "trials": v} for k, v in by_status.items()])
    phases = status.get("phases") or {}
    if phases:
        names = sorted({k for ph in phases.values() for k in ph.get("by_status") or {}})
        lines.append("")
        lines += aligned(
            [
                {
                    "phase": name,
                    "trials": ph["trials"],
                    **{k: (ph.get("by_status") or {}).get(k, 0) for k in names},
                }
                for name, ph in phases.items()
            ]
        )
    if status.get("best_trial"):
        metric = status["metric"]
        lines.append(f"best completed: {status['best_trial']} {metric}={_short(status[f'best_{metric}'])}")
    if status.get("study_verdict"):
        lines.append(f"study verdict: {status['study_verdict']}")
        per = status.get("verdict") or status.get("claims") or {}
        lines += aligned([{"hypothesis": k, "verdict": v} for k, v in per.items()])
    rows = list(status.get("rows") or [])
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get("phase", "")), []).append(row)
    for name, group in groups.items():
        lines.append("")
        if name:
            lines.append(f"phase {name}:")
        lines += aligned([{k: v for k, v in row.items() if k != "phase"} for row in group])
    return lines


def _cmd_plan(args: argparse.Namespace) -> int:
    """Trials per phase, calibrated cost and wall time before launch; with ``--pilot``, seeds needed."""
    from studies.pilot import format_pilot, pilot_power
    from studies.planning import format_plan, load_calibration, plan_study, save_calibration

    if args.history:
        return _plan_history(args)
    if args.spec is None:
        print("plan: a spec is needed (plan SPEC, or --spec PATH), or --history", file=sys.stderr)
        return EXIT_SPEC_ERROR
    spec = _decidable(_load_target(args.spec, args), args)
    calibration = load_calibration(args.calibration) if args.calibration else None
    try:
        if args.pilot:
            result = pilot_power(
                spec,
                kind_for(spec),
                args.pilot,
                power=args.power,
                min_effect=args.min_effect,
                cpus=args.cpus,
                gpus=args.gpus,
                calibration=calibration,
                calibrate=not args.no_calibrate,
            )
            text = format_pilot(result)
        else:
            result = plan_study(
                spec,
                kind_for(spec),
                cpus=args.cpus,
                gpus=args.gpus,
                calibration=calibration,
                calibrate=not args.no_calibrate,
            )
            text = format_plan(result)
            if args.save_calibration:
                save_calibration(result["calibration"], args.save_calibration)
    except ValueError as e:  # no pilot trials, a cluster too small for one trial, no step times
        raise SpecError([SpecIssue("", str(e), None, args.spec)]) from None
    if args.json:
        _print_json(result)
    else:
        print(text)
    return 0


def _plan_history(args: argparse.Namespace) -> int:
    """``plan --history``: actual / planned wall time of every past study in the tracking store."""
    from studies.plan_history import format_history, plan_history

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if args.spec is not None:
        spec = _load_target(args.spec, args)
        uri = uri or spec.tracking.uri
    if not uri:
        print(
            "plan --history: which tracking store? give --tracking-uri (or MLFLOW_TRACKING_URI)",
            file=sys.stderr,
        )
        return EXIT_SPEC_ERROR
    history = plan_history(uri)
    if args.json:
        _print_json(history)
    else:
        print(format_history(history))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from studies.study_dir import StudyDir

    spec = _load_target(args.target, args)
    if args.out:
        out = Path(args.out)
    else:
        where = StudyDir.of(spec)
        if where.storage.filesystem is not None:
            print(f"the study lives at {where.uri}; give --out DIR for the report", file=sys.stderr)
            return 1
        out = Path(where.path) / "report"
    return _report(spec, out)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from studies.reproduce import main as reproduce

    return reproduce(
        args.run,
        tracking_uri=args.tracking_uri,
        do_rerun=args.rerun,
        allow_different_code=args.allow_different_code,
        storage_path=args.storage_path,
        offline=args.offline,
    )


def verdict_lines(path: Path) -> list[str]:
    """The study verdict, its scope (what it was decided on) and one line per hypothesis (its verdict, estimate, CI, Holm p and
    reasons), from a ``verdict.json`` (every kind's shared fields); nothing when there is none."""
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    reasons = "; ".join(str(r) for r in verdict.get("study_reasons") or [])
    lines = [f"study verdict: {verdict.get('study_verdict')}" + (f" ({reasons})" if reasons else "")]
    if verdict.get("scope"):
        from studies.scope import scope_line

        lines.append(f"scope: {scope_line(verdict['scope'])}")
    from studies.claims_page import shown_verdict
    from studies.reporting import estimate_name

    rows = []
    for name, h in (verdict.get("hypotheses") or {}).items():
        ci = h.get("ci")
        est = h.get("estimate")
        rows.append(
            {
                "hypothesis": name,
                "verdict": shown_verdict(verdict, str(name)),
                # every estimate with its name: the batch-size kind's is the interaction, not a slope
                "estimate": f"{estimate_name(verdict.get('kind'), str(name))} {_short(est)}"
                if isinstance(est, int | float) and not isinstance(est, bool)
                else "n/a",
                "ci": f"[{_short(ci[0])}, {_short(ci[1])}]"
                if isinstance(ci, list | tuple) and len(ci) == 2 and None not in ci
                else "n/a",
                "p_holm": h.get("p_value_holm"),
                "reasons": "; ".join(str(r) for r in h.get("reasons") or []),
            }
        )
    return lines + aligned(rows)


def _report(spec: Any, out: Path) -> int:
    """The report, marked partial while the study runs or after it stopped short; exit 1 without
    writing anything when there is nothing to report yet. Never takes the study's lease."""
    import shutil

    from studies.study_dir import StudyDir
    from workers.lease import lease_holder

    where = StudyDir.of(spec)
    kind = kind_for(spec)
    holder = lease_holder(
        where.storage, spec.name, endpoint_override=where.config.endpoint_override, region=where.config.region
    )
    status = kind.status(spec)
    why = None
    if holder:
        why = f"it is running (driver pid {holder.get('pid')} on {holder.get('host')})"
    elif status["trials"] < status["expected_trials"]:
        why = f"{status['trials']} of {status['expected_trials']} trials have results"
    if why and not status["trials"]:
        print(f"the study has not finished ({why}); no trial has results yet, so no report", file=sys.stderr)
        return 1
    from workers.cost import registered

    # The regenerated verdict.json and report show the numbers status shows: the trials in the study
    # directory and the wall time its run wrote (a re-analysis has no wall time of its own).
    kept: dict[str, float] = {"trials": status["trials"]}
    if status.get("wall_s") is not None:
        kept["wall_time_s"] = status["wall_s"]
    existed = out.exists()
    try:
        with registered(lambda: dict(kept)):
            report = kind.report(spec, out)
    except Exception as e:
        if why is None:
            raise
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        print(f"the study has not finished ({why}); no report yet ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    for line in verdict_lines(report.parent / "verdict.json"):
        print(line)
    if why:
        text = report.read_text(encoding="utf-8")
        banner = f"> **Partial report**: the study has not finished ({why}); `autonorm-study report` again when it has.\n\n"
        report.write_text(banner + text, encoding="utf-8")
        print(f"partial report (the study has not finished: {why}) written to {report}")
        return 0
    print(f"report written to {report}")
    return 0


# --------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------


_ALLOW_HELP = "resume although the spec changed since the study started (its results then mix two specs)"
_EXPLORATORY_HELP = (
    "run (validate, plan) a design that can never decide anyway; its report is marked exploratory "
    "(same as `exploratory: true` in the spec)"
)


def _spec_argument(p: argparse.ArgumentParser, dest: str, help: str, *, optional: bool = False) -> None:
    """The spec as a positional argument or as ``--spec PATH`` (every entry point takes ``--spec``)."""
    p.add_argument(dest, nargs="?", default=None, help=help)
    p.add_argument(
        "--spec", dest=f"{dest}_flag", default=None, metavar="PATH", help=f"same as the {dest} argument"
    )
    p.set_defaults(_spec_dest=dest, _spec_optional=optional)


def _add_exploratory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-exploratory", action="store_true", help=_EXPLORATORY_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autonorm-study",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default=None,
        help=f"spec kind (default: the file's `kind:`, else {DEFAULT_KIND})",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "validate",
        help="check specs (and every preset in each); print every error with its field path and line",
    )
    p.add_argument("spec", nargs="*", default=[], help="spec YAML files (or study directories)")
    p.add_argument(
        "--spec",
        dest="spec_flag",
        action="append",
        default=[],
        metavar="PATH",
        help="same as a spec argument",
    )
    add_layer_options(p)
    _add_exploratory(p)
    p.add_argument(
        "--print",
        action="store_true",
        help="print the resolved spec (a loadable YAML; status lines go to stderr)",
    )
    p.set_defaults(func=validate_command)

    p = sub.add_parser("plan", help="what a study will run and cost before launch; seeds needed from a pilot")
    _spec_argument(p, "spec", "spec YAML (or a study directory)", optional=True)
    add_layer_options(p)
    _add_exploratory(p)
    p.add_argument("--cpus", type=float, default=None, help="cluster CPUs (default: this machine's)")
    p.add_argument("--gpus", type=float, default=None, help="cluster GPUs (default: 0)")
    p.add_argument("--calibration", default=None, help="step times measured on the target machine (JSON)")
    p.add_argument("--save-calibration", default=None, help="write this machine's measured step times (JSON)")
    p.add_argument("--no-calibrate", action="store_true", help="use --calibration only, time nothing here")
    p.add_argument("--pilot", default=None, help="a finished pilot study directory: seeds needed for --power")
    p.add_argument("--power", type=float, default=0.8)
    p.add_argument("--min-effect", type=float, default=None, help="smallest effect worth detecting")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--history",
        action="store_true",
        help="actual / planned wall time of every past study in the tracking store (--tracking-uri)",
    )
    p.set_defaults(func=_cmd_plan)

    for name, what, dest, target, func in (
        ("run", "run a study here (restores it when it was interrupted)", "spec", "spec YAML", _cmd_run),
        (
            "resume",
            "continue an interrupted study (fails when there is nothing to resume)",
            "target",
            "spec YAML or the study directory (<storage_path>/<name>)",
            _cmd_resume,
        ),
    ):
        p = sub.add_parser(name, help=what)
        _spec_argument(p, dest, target)
        add_layer_options(p)
        _add_exploratory(p)
        p.add_argument("--allow-changed-spec", action="store_true", help=_ALLOW_HELP)
        p.add_argument("--json", action="store_true", help="print the study's summary as JSON at the end")
        p.set_defaults(func=func)

    p = sub.add_parser("extend", help="more seeds for a finished sequential study (its looks stay valid)")
    p.add_argument("target", help="the study directory (<storage_path>/<name>)")
    p.add_argument("--seeds", type=int, required=True, help="how many more confirmatory seeds")
    p.add_argument("--json", action="store_true", help="print the extended study's summary as JSON")
    add_layer_options(p)
    p.set_defaults(func=_cmd_extend)

    p = sub.add_parser("submit", help="run a study as a Ray job on a cluster")
    _spec_argument(p, "spec", "spec YAML")
    add_layer_options(p)
    _add_exploratory(p)
    p.add_argument("--address", default=None, help="Ray dashboard address (default: $RAY_ADDRESS)")
    p.add_argument("--working-dir", default=".", help="directory uploaded as the job's working dir")
    p.add_argument("--exclude", action="append", default=[], help="extra upload exclude pattern (repeatable)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="extra env var for the job (the only way credentials are carried: the value is readable through "
        "the Ray job API, so submit warns)",
    )
    p.add_argument("--script", default=None, help="study entry script instead of `python -m studies.cli run`")
    p.add_argument(
        "--python",
        default="python",
        help="interpreter on the cluster (default: `python` on the job's PATH; a local cluster started from "
        "a virtualenv without activating it needs that venv's python here)",
    )
    p.add_argument("--job-id", default=None, help="submission id (default: chosen by Ray)")
    p.add_argument(
        "--wait", action="store_true", help="stream logs until the job ends; exit 1 unless it succeeded"
    )
    p.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")
    p.set_defaults(func=_cmd_submit)

    p = sub.add_parser("ls", help="every study in a tracking store, one line each, newest first")
    p.add_argument("--tracking-uri", default=None, help="the tracking store (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("status", help="a study's progress (from its storage) or a Ray job's state")
    _spec_argument(p, "target", "spec YAML or study directory", optional=True)
    add_layer_options(p)
    p.add_argument("--job", default=None, help="a submitted job's id")
    p.add_argument("--address", default=None, help="Ray dashboard address (with --job)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("report", help="regenerate a study's report from its directory")
    _spec_argument(p, "target", "spec YAML or study directory")
    add_layer_options(p)
    p.add_argument("--out", default=None, help="output directory (default: <study dir>/report)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("reproduce", help="recompute a study's verdict from its MLflow record (or rerun it)")
    p.add_argument("run", help="the study's MLflow run id, its MLflow UI link, or the study directory")
    p.add_argument("--tracking-uri", default=None, help="the tracking store (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--rerun", action="store_true", help="run the study again and compare trial by trial")
    p.add_argument(
        "--allow-different-code",
        action="store_true",
        help="with --rerun: run although the commit differs or tracked files are modified",
    )
    p.add_argument("--storage-path", default=None, help="with --rerun: where the new study directory goes")
    p.add_argument("--offline", action="store_true", help="re-analyse a study directory from its own tables")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("results", help="the stored studies' hypotheses, one row each, into docs/results.md")
    add_results_arguments(p)  # studies.results: --export STUDY_DIR --to ROOT, --output PATH
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    dest = getattr(args, "_spec_dest", None)
    if dest is not None:
        given, flag = getattr(args, dest), getattr(args, f"{dest}_flag")
        if given is not None and flag is not None and given != flag:
            parser.error(f"{args.command}: the spec given twice ({given} and --spec {flag})")
        setattr(args, dest, given if given is not None else flag)
        if getattr(args, dest) is None and not args._spec_optional:
            parser.error(f"{args.command}: a spec is needed: {args.command} SPEC or --spec PATH")
    try:
        code: int = args.func(args)
    except SpecError as e:
        print_spec_error(e)
        return EXIT_SPEC_ERROR
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
