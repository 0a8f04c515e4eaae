"""Running a study spec of any kind: what every kind shares around its own ``run``.

:func:`run_study_spec` holds the study's lease, refuses a design that can never decide, writes the
resolved spec to ``<storage>/<name>/study_spec.yaml`` (refusing a rerun with an edited spec, the
changed fields named), prints the start-up estimate, attaches the provenance and hands over to the
kind. :func:`extend_study` runs a finished sequential study again with more seeds. The CLI, the
entry scripts (:mod:`studies.entrypoints`) and ``reproduce --rerun`` call these; the kind comes from
the registry (:func:`studies.kinds.kind_for`) here and is handed to the kit from here on.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from studies.contract import StudyKind, StudyOutcome
from studies.kinds import kind_for
from studies.provenance import PROVENANCE_ARTIFACT
from studies.schema import SpecError, SpecIssue, parse_yaml, stored_defaults_missing
from studies.sequential import ExtendRefused
from studies.study_dir import SPEC_FILE
from workers.console import DRIVER_LOG
from workers.cost import SESSIONS_FILE

__all__ = ["changed_fields", "extend_study", "run_study_spec"]


def changed_fields(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths where two spec documents differ (leaves; whole lists when their lengths differ)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(sub)
            else:
                out += changed_fields(old[key], new[key], sub)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new)):
            out += changed_fields(a, b, f"{path}.{i}" if path else str(i))
        return out
    return [] if old == new else [path or "<root>"]


def _set_by_spec(spec: Any, path: str) -> bool:
    """Whether ``spec`` sets the dotted field ``path`` itself (file, preset or ``--set``), rather than
    leaving it to its default."""
    node = spec
    for key in path.split("."):
        if key not in (getattr(node, "model_fields_set", None) or ()):
            return False
        node = getattr(node, key)
    return True


def _as_stored(spec: Any, stored: dict[str, Any]) -> Any:
    """``spec`` against a study whose stored spec (``stored``, a document) predates fields added
    since (:func:`studies.schema.stored_defaults_missing`): ``stored`` gets the value the study ran
    with for each, and so does ``spec`` where it leaves the field to today's default (a study from
    before ``lr_tuning.refine`` resumes unrefined). A field ``spec`` sets itself stays: a change."""
    from workers.dotted import set_path, split_path

    missing = stored_defaults_missing(stored, type(spec))
    for path, value in missing.items():
        set_path(stored, split_path(path), value)
    adopt = {path: value for path, value in missing.items() if not _set_by_spec(spec, path)}
    if not adopt:
        return spec
    doc = spec.to_document()
    for path, value in adopt.items():
        set_path(doc, split_path(path), value)
        print(f"[{spec.name}] {path}: {value}, as the study ran (its spec predates the field)", flush=True)
    return type(spec).model_validate(doc)


def _check_unchanged(spec: Any, study_dir: Any, *, allow_changed: bool) -> Any:
    """Refuse to resume a study whose stored spec differs from ``spec`` (two studies would mix);
    returns ``spec``, with what the study ran as for the fields its stored spec predates
    (:func:`_as_stored`)."""
    text = study_dir.read_text(SPEC_FILE)
    if text is None:
        return spec
    stored, _ = parse_yaml(text, source=f"{study_dir.uri}/{SPEC_FILE}")
    spec = _as_stored(spec, stored)
    current = spec.to_document()
    # Where the study lives may move (a copied directory, another mount): that is not a new study.
    ignore = {"storage_path", "presets"}
    changes = [c for c in changed_fields(stored, current) if c.split(".")[0] not in ignore]
    if changes and not allow_changed:
        raise SpecError(
            [
                SpecIssue(
                    c,
                    f"differs from the study already in {study_dir.uri} (its {SPEC_FILE}); rerunning would mix two "
                    "studies: change `name` (or storage_path) for a new study, or pass --allow-changed-spec",
                    None,
                    None,
                )
                for c in changes
            ]
        )
    return spec


def run_study_spec(
    spec: Any, *, allow_changed_spec: bool = False, allow_exploratory: bool = False, **runner_options: Any
) -> StudyOutcome:
    """Run (or resume) a study of any kind and return its outcome.

    Writes ``<storage>/<name>/study_spec.yaml`` first (refusing a changed spec for an existing study),
    then hands over to the kind, all under the study's lease (:func:`workers.lease.study_lease`:
    a second driver of the same study gets :class:`workers.errors.LeaseError`). ``runner_options`` go to :class:`workers.study.StudyRunner`
    (``ray_address``, ``ray_init_kwargs``, ``trainable``, ``progress``). A design that can never
    decide is refused before anything is written (:func:`studies.decidability.check_decidable`)
    unless it is exploratory (``exploratory: true``, or ``allow_exploratory``).
    """
    from studies.decidability import check_decidable
    from studies.study_dir import StudyDir
    from workers.lease import study_lease

    kind = kind_for(spec)
    spec = check_decidable(spec, kind, allow_exploratory=allow_exploratory)
    study_dir = StudyDir.of(spec)
    # The lease first: a second driver of the same study stops here, before writing anything.
    with study_lease(
        study_dir.storage,
        spec.name,
        endpoint_override=study_dir.config.endpoint_override,
        region=study_dir.config.region,
    ):
        spec = _check_unchanged(spec, study_dir, allow_changed=allow_changed_spec)
        fresh = study_dir.read_text(SPEC_FILE) is None
        study_dir.write_text(SPEC_FILE, spec.to_yaml())
        print(
            f"[{spec.name}] {kind.name} study; spec -> {study_dir.uri}/{SPEC_FILE}, "
            f"Ray, Tune and MLflow output -> {DRIVER_LOG}",
            flush=True,
        )
        planned = _estimate(spec, kind) if runner_options.get("trainable") is None else None
        if planned is not None:
            runner_options["planned"] = planned
        runner_options = {"provenance": _provenance(spec, kind), **runner_options}
        _keep_provenance(study_dir, runner_options["provenance"])
        try:
            outcome = kind.run(spec, **runner_options)
        except BaseException:
            # Refused (or failed) before its first trial left anything: take the spec back, so the
            # corrected command is a fresh start rather than "a changed spec" (issue: a refused
            # `--set resources.cpu=64` locked its own fix out).
            # (the driver log of that start, which says why, goes with them)
            # (and so does the record of that session, which ran nothing: workers.cost.Sessions)
            if fresh and set(study_dir.list_files()) <= {
                SPEC_FILE,
                PROVENANCE_ARTIFACT,
                DRIVER_LOG,
                SESSIONS_FILE,
            }:
                study_dir.delete(SESSIONS_FILE)
                study_dir.delete(DRIVER_LOG)
                study_dir.delete(PROVENANCE_ARTIFACT)
                study_dir.delete(SPEC_FILE)
            raise
    return outcome


def _estimate(spec: Any, kind: StudyKind) -> dict[str, float] | None:
    """The plan's estimate (trials, CPU/GPU hours, wall time on this machine); ``None`` if planning
    fails — an estimate must never stop a study."""
    try:
        from studies.calibration_cache import CalibrationCache
        from studies.planning import plan_study

        # Step times measured by an earlier `run` on this machine are reused (studies.calibration_cache).
        plan = plan_study(spec, kind, cache=CalibrationCache() if CalibrationCache.enabled() else None)
    except Exception as exc:
        print(f"[{spec.name}] no estimate: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
    est = {k: float(plan[k]) for k in ("trials", "cpu_hours", "gpu_hours", "wall_s")}
    print(
        f"[{spec.name}] plan: {int(est['trials'])} trials, {est['cpu_hours']:.3g} CPU h, {est['gpu_hours']:.3g} GPU h, "
        f"~{est['wall_s'] / 60:.1f} min on this machine (`autonorm-study plan` for details)",
        flush=True,
    )
    return est


def _provenance(spec: Any, kind: StudyKind) -> dict[str, Any]:
    """The study run's provenance tags and artifact (:mod:`studies.provenance`); empty when it
    cannot be made — like the estimate, it must never stop a study."""
    try:
        from studies.provenance import study_provenance

        return study_provenance(spec, kind)
    except Exception as exc:
        print(f"[{spec.name}] no provenance: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return {}


def _keep_provenance(study_dir: Any, provenance: Mapping[str, Any]) -> None:
    """The provenance record in the study directory too (``provenance.json`` beside the spec), so a
    copy of the directory (``autonorm-study results --export``) carries it without MLflow."""
    text = (provenance.get("artifacts") or {}).get(PROVENANCE_ARTIFACT)
    if text:
        study_dir.write_text(PROVENANCE_ARTIFACT, text)


def extend_study(spec: Any, seeds: int) -> Any:
    """``autonorm-study extend``: ``seeds`` more confirmatory seeds for a finished sequential study.

    The kind turns the stored spec into the extended one (:meth:`StudyKind.extended_spec`:
    the longer seed list, the raised ``max_seeds``, the looks made so far kept as looks); it is run
    like a resumed study, so finished trials are restored (none re-run, no MLflow run duplicated) and
    only the new seeds' trials run, under the same study run, which then records the extension.

    Raises:
        ExtendRefused: a fixed-design study (its fixed test has already spent alpha), a kind that
            cannot extend, an unfinished study, or ``seeds < 1``.
    """
    import datetime
    import json

    from studies.study_dir import StudyDir

    if seeds < 1:
        raise ExtendRefused(f"--seeds must be at least 1, got {seeds}")
    if getattr(spec, "sequential", None) is None:
        raise ExtendRefused(
            f"study {spec.name!r} has a fixed design: its fixed-n test has already spent alpha, and more seeds "
            "would need a new test. Run it with a `sequential:` section to be able to extend it."
        )
    kind = kind_for(spec)
    where = StudyDir.of(spec)
    text = where.read_text("verdict.json")
    if where.read_text(SPEC_FILE) is None or text is None:
        raise ExtendRefused(f"no finished study at {where.uri} (resume it first, then extend)")
    verdict = json.loads(text)
    new = kind.extended_spec(spec, seeds, verdict)
    added = [s for s in new.seeds if s not in set(spec.seeds[: int(verdict.get("seeds_used") or 0)])]
    print(
        f"[{spec.name}] extend: {seeds} more seed(s) {added}, max_seeds {new.sequential.max_seeds}",
        flush=True,
    )
    outcome = run_study_spec(new, allow_changed_spec=True)
    record = {"seeds_added": added, "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if outcome.parent_run_id:
        try:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=outcome.tracking_uri)
            done = [k for k in client.get_run(outcome.parent_run_id).data.tags if k.startswith("extend/")]
            client.set_tag(outcome.parent_run_id, f"extend/{len(done) + 1}", json.dumps(record))
        except Exception as exc:  # the study itself is done and on disk: say so, do not fail
            print(f"[{spec.name}] could not record the extension on the study run: {exc}", flush=True)
    return outcome
