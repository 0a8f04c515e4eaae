"""What every study entry point shares: the same options, the same loading, the same run.

The scripts in ``studies/`` are thin wrappers around :func:`study_main`, which is what
``autonorm-study run`` does too (:func:`studies.running.run_study_spec`), so ``--spec``, ``--preset``,
``--set``, ``--storage-path`` and ``--tracking-uri`` mean the same everywhere. Spec problems are
printed with their field paths and end the process with status 2, never with a traceback.

The resolved spec is written to ``<storage_path>/<name>/study_spec.yaml`` before the study starts,
so ``autonorm-study resume|status|report <that directory>`` need nothing else.

A study driver running as a Ray job runs in Ray's temporary copy of the uploaded working directory
(``.../runtime_resources/working_dir_files/_ray_pkg_<hash>``), which Ray deletes. A relative
``storage_path`` there (and the default sqlite MLflow store inside it) would vanish with the job, so
it is placed under ``$AUTONORM_HOME`` (default ``~/autonorm``) instead (:func:`durable_storage_path`),
and the driver says where. At the end of every study the results directory and direct MLflow links
are printed (:func:`print_where`); the study's summary as JSON with ``--json`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from studies.schema import SpecError, SpecIssue
from workers.errors import StudyError
from workers.ray_internals import RAY_PACKAGE_PREFIX

__all__ = [
    "EXIT_SPEC_ERROR",
    "EXIT_STUDY_ERROR",
    "add_layer_options",
    "add_study_options",
    "decidable",
    "durable_storage_path",
    "in_ray_job_package",
    "load_for_run",
    "load_from_args",
    "load_target",
    "overrides_from_args",
    "print_spec_error",
    "print_where",
    "run_interruptible",
    "study_main",
    "validate_command",
]

EXIT_SPEC_ERROR = 2
EXIT_STUDY_ERROR = 1


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
    args: argparse.Namespace,
    *,
    spec_path: Path | None = None,
    kind: str | None = None,
    extra: Sequence[str] = (),
) -> Any:
    """Load the spec named by ``args`` (or ``spec_path``) with its preset and overrides, any kind.

    Raises:
        SpecError: every problem found.
    """
    from studies.kinds import load_study

    path = spec_path if spec_path is not None else args.spec
    return load_study(path, [*overrides_from_args(args), *extra], preset=args.preset, kind=kind)


def print_spec_error(err: SpecError, *, file: Any = None) -> None:
    print(err.format(), file=file or sys.stderr)


# ---- what the CLI's commands share, and `validate` -------------------------------------------------


def load_target(target: str, args: argparse.Namespace, extra: Sequence[str] = ()) -> Any:
    """A spec file (with preset/overrides, then ``extra``), or a study directory holding
    ``study_spec.yaml``."""
    from studies.kinds import load_study
    from studies.study_dir import SPEC_FILE

    path = Path(target)
    if path.is_dir():
        spec_file = path / SPEC_FILE
        if not spec_file.is_file():
            raise SpecError(
                [SpecIssue("", f"no {SPEC_FILE} in {target}: not a study directory", None, str(spec_file))]
            )
        if args.preset:
            raise SpecError(
                [SpecIssue("", "--preset applies to spec files, not to a study directory", None, target)]
            )
        # The directory is <storage_path>/<name>: wherever it is now, that is where the study lives.
        here = f"storage_path={json.dumps(str(path.resolve().parent))}"
        return load_study(spec_file, [here, *overrides_from_args(args), *extra], kind=args.kind, stored=True)
    return load_study(path, [*overrides_from_args(args), *extra], preset=args.preset, kind=args.kind)


def _describe(spec: Any) -> str:
    from studies.kinds import kind_for

    return kind_for(spec).describe(spec)


def decidable(spec: Any, args: argparse.Namespace) -> Any:
    """``spec``, refused (:class:`SpecError`) when its design can never decide, unless exploratory
    (``args.allow_exploratory``)."""
    from studies.decidability import check_decidable
    from studies.kinds import kind_for

    return check_decidable(spec, kind_for(spec), allow_exploratory=getattr(args, "allow_exploratory", False))


def validate_command(args: argparse.Namespace) -> int:
    """``autonorm-study validate``: each file as given (with --preset/--set), and every preset it
    defines: every file's errors (printed as each file is checked), then exit 2 when any had one."""
    targets = list(dict.fromkeys([*args.spec, *args.spec_flag]))
    if not targets:
        print("validate: a spec is needed: validate SPEC [SPEC ...] or --spec PATH", file=sys.stderr)
        return EXIT_SPEC_ERROR
    if args.print and len(targets) > 1:
        print("validate: --print takes one spec (stdout is that resolved spec)", file=sys.stderr)
        return EXIT_SPEC_ERROR
    if len(targets) == 1:
        return _validate_one(targets[0], args)
    failed = 0
    for target in targets:
        try:
            _validate_one(target, args)
        except SpecError as e:
            print_spec_error(e)
            failed += 1
    if failed:
        print(f"{failed} of {len(targets)} specs invalid", file=sys.stderr)
        return EXIT_SPEC_ERROR
    return 0


def _validate_one(target: str, args: argparse.Namespace) -> int:
    """One spec file (or study directory) and every preset it defines; raises :class:`SpecError`."""
    spec = decidable(load_target(target, args), args)
    # With --print, stdout is the resolved spec alone (`validate ... --print > my_spec.yaml` loads again).
    status_to = sys.stderr if args.print else sys.stdout
    if args.print:
        print(spec.to_yaml(), end="")
    print(f"ok: {spec.name} (kind {spec.kind}): {_describe(spec)}", file=status_to)
    path = Path(target)
    errors: list[SpecIssue] = []
    if path.is_file() and not args.preset:
        from studies.kinds import load_study, presets_of

        for preset in presets_of(path):
            try:
                other = decidable(
                    load_study(path, overrides_from_args(args), preset=preset, kind=args.kind), args
                )
                print(f"ok: preset {preset}: {other.name}: {_describe(other)}", file=status_to)
            except SpecError as e:
                errors += [
                    SpecIssue(i.path, f"[preset {preset}] {i.message}", i.line, i.source) for i in e.issues
                ]
    if errors:
        raise SpecError(errors)
    return 0


def in_ray_job_package(cwd: str | os.PathLike[str]) -> bool:
    """Whether ``cwd`` lies in a Ray runtime-env package directory (a job's uploaded working dir),
    which Ray deletes when it no longer needs it."""
    parts = PurePosixPath(Path(cwd).as_posix()).parts
    return any(p.startswith(RAY_PACKAGE_PREFIX) for p in parts) or "working_dir_files" in parts


def autonorm_home(environ: Mapping[str, str]) -> Path:
    """``$AUTONORM_HOME``, default ``~/autonorm``: where a job's relative storage paths go."""
    return Path(environ.get("AUTONORM_HOME") or "~/autonorm").expanduser().resolve()


def durable_storage_path(
    storage_path: str, *, cwd: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The storage path to use instead of ``storage_path`` when it would land in a Ray job's package.

    ``None`` (keep it) for URIs, absolute paths and any driver not running inside a package directory;
    ``<AUTONORM_HOME>/<storage_path>`` otherwise.
    """
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else Path(cwd)
    if "://" in storage_path or Path(storage_path).expanduser().is_absolute():
        return None
    if not in_ray_job_package(here):
        return None
    return str(autonorm_home(env) / storage_path)


def load_for_run(load: Callable[[Sequence[str]], Any], *, file: Any = None) -> Any:
    """``load(extra_overrides)`` for a run: again with ``storage_path=<AUTONORM_HOME>/...`` when the
    spec's storage path would land in a Ray job's temporary package (:func:`durable_storage_path`)."""
    spec = load(())
    durable = durable_storage_path(str(spec.storage_path))
    if durable is None:
        return spec
    print(
        f"[{spec.name}] running inside a Ray job's temporary working dir: storage_path {spec.storage_path!r} "
        f"-> {durable} (set AUTONORM_HOME, or give an absolute path or s3:// URI)",
        file=file or sys.stdout,
        flush=True,
    )
    return load((f"storage_path={json.dumps(durable)}",))


def print_where(outcome: Any, *, file: Any = None) -> None:
    """Where a finished study's results are, in two lines: its directory; its MLflow study run and
    runs table as direct UI links (with how to serve a local store)."""
    from workers.tracking import http_limits, mlflow_links

    out = file or sys.stdout
    print(f"[{outcome.name}] results: {outcome.study_dir}", file=out)
    if not outcome.parent_run_id:
        print(f"[{outcome.name}] MLflow tracking URI: {outcome.tracking_uri}", file=out)
        return
    try:
        from mlflow import MlflowClient

        with http_limits(10, 1, override=False):  # one lookup, not MLflow's minutes of retries
            client = MlflowClient(tracking_uri=outcome.tracking_uri)
            experiment_id = client.get_run(outcome.parent_run_id).info.experiment_id
    except Exception as exc:  # the study is done; a link we cannot make is not an error
        print(
            f"[{outcome.name}] MLflow run {outcome.parent_run_id} in {outcome.tracking_uri} "
            f"(no link: {type(exc).__name__})",
            file=out,
        )
        return
    runs, run = mlflow_links(outcome.tracking_uri, experiment_id, outcome.parent_run_id)
    serve = (
        ""
        if outcome.tracking_uri.startswith(("http://", "https://"))
        else f" (serve it with: mlflow ui --backend-store-uri {outcome.tracking_uri})"
    )
    print(f"[{outcome.name}] MLflow{serve}: study run {run}; all runs {runs}", file=out)
    out.flush()


def run_interruptible(spec: Any, *, run: Callable[..., Any] | None = None, **options: Any) -> tuple[Any, int]:
    """Run a study as a command-line driver: SIGINT/SIGTERM stop it cleanly (:mod:`workers.interrupts`).

    ``options`` go to :func:`studies.running.run_study_spec` (``allow_changed_spec``, ...).

    Returns:
        ``(outcome, 0)``, or ``(None, 128 + signal)`` after a stop, with how to resume printed.
    """
    from studies.running import run_study_spec
    from studies.study_dir import StudyDir
    from workers import interrupts

    interrupts.install()
    try:
        outcome = (run or run_study_spec)(spec, **options)
        interrupts.raise_if_interrupted()  # a signal some handler swallowed still stops the study
    except (interrupts.StudyInterrupted, KeyboardInterrupt) as exc:
        code = exc.exit_code if isinstance(exc, interrupts.StudyInterrupted) else 130
        name = "SIGTERM" if code == 143 else "SIGINT"
        print(
            f"[{spec.name}] stopped by {name}: finished trials and the last checkpoint of every unfinished "
            f"trial are kept. Resume with the same command, or: autonorm-study resume {StudyDir.of(spec).uri}",
            file=sys.stderr,
            flush=True,
        )
        return None, code
    return outcome, 0


def study_main(
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    description: str,
    default_spec: Path | None,
) -> int:
    """The body of a study script: parse options, load the spec (its ``kind`` decides), run, print.

    Returns:
        0 on success, 2 for spec errors (printed, no traceback).
    """
    from studies.kinds import kind_for

    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_study_options(parser, default_spec=default_spec)
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and print the resolved spec, run nothing"
    )
    parser.add_argument(
        "--allow-changed-spec",
        action="store_true",
        help="resume a study although its spec changed since it started (its results then mix two specs)",
    )
    parser.add_argument(
        "--allow-exploratory",
        action="store_true",
        help="run a design that can never decide anyway; its report is marked exploratory",
    )
    parser.add_argument("--json", action="store_true", help="print the study's summary as JSON at the end")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            from studies.decidability import check_decidable

            loaded = load_from_args(args)
            spec = check_decidable(loaded, kind_for(loaded), allow_exploratory=args.allow_exploratory)
            print(spec.to_yaml(), end="")
            from studies.study_dir import StudyDir

            total = kind_for(spec).total_trials(spec)
            print(f"# kind {spec.kind}: {total} trials in all, study directory {StudyDir.of(spec).uri}")
            return 0
        spec = load_for_run(lambda extra: load_from_args(args, extra=extra))
        outcome, code = run_interruptible(
            spec, allow_changed_spec=args.allow_changed_spec, allow_exploratory=args.allow_exploratory
        )
        if outcome is None:
            return code
    except SpecError as e:
        print_spec_error(e)
        return EXIT_SPEC_ERROR
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_STUDY_ERROR
    if args.json:  # the study printed its verdict and where its outputs are already
        print(json.dumps(outcome.summary, indent=2, default=str))
    print_where(outcome)
    return 0


def entry_script(file: str, spec: str, doc: str | None) -> tuple[Path, Callable[..., int]]:
    """``(DEFAULT_SPEC, main)`` of an entry script in ``studies/`` that runs ``studies/specs/<spec>``
    (any kind: the spec's ``kind:`` decides), its ``--help`` headed by the first line of ``doc``."""
    default = Path(file).resolve().parents[1] / "studies" / "specs" / spec

    def main(argv: Sequence[str] | None = None) -> int:
        return study_main(
            argv, prog=Path(file).name, description=(doc or "").splitlines()[0], default_spec=default
        )

    return default, main
