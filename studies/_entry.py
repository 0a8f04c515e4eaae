"""What every study entry point shares: the same options, the same loading, the same run.

The scripts in ``studies/`` are thin wrappers around :func:`study_main`, which is what
``autonorm-study run`` does too (:func:`studies.kinds.run_study_spec`), so ``--spec``, ``--preset``,
``--set``, ``--storage-path`` and ``--tracking-uri`` mean the same everywhere. Spec problems are
printed with their field paths and end the process with status 2, never with a traceback.

The resolved spec is written to ``<storage_path>/<name>/study_spec.yaml`` before the study starts,
so ``autonorm-study resume|status|report <that directory>`` need nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.spec import SpecError
from workers.errors import StudyError

__all__ = [
    "EXIT_SPEC_ERROR",
    "EXIT_STUDY_ERROR",
    "add_layer_options",
    "add_study_options",
    "load_from_args",
    "overrides_from_args",
    "print_spec_error",
    "study_main",
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
    args: argparse.Namespace, *, spec_path: Path | None = None, kind: str | None = None
) -> Any:
    """Load the spec named by ``args`` (or ``spec_path``) with its preset and overrides, any kind.

    Raises:
        SpecError: every problem found.
    """
    from studies.kinds import load_study

    path = spec_path if spec_path is not None else args.spec
    return load_study(path, overrides_from_args(args), preset=args.preset, kind=kind)


def print_spec_error(err: SpecError, *, file: Any = None) -> None:
    print(err.format(), file=file or sys.stderr)


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
    from studies.kinds import kind_for, run_study_spec

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
    args = parser.parse_args(argv)
    try:
        spec = load_from_args(args)
        if args.dry_run:
            print(spec.to_yaml(), end="")
            from studies.study_dir import StudyDir

            total = kind_for(spec).impl().total_trials(spec)
            print(f"# kind {spec.kind}: {total} trials in all, study directory {StudyDir.of(spec).uri}")
            return 0
        outcome = run_study_spec(spec, allow_changed_spec=args.allow_changed_spec)
    except SpecError as e:
        print_spec_error(e)
        return EXIT_SPEC_ERROR
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_STUDY_ERROR
    print(json.dumps(outcome.summary, indent=2, default=str))
    return 0
