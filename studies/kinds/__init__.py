"""Study kinds: one registry, one way to load, run, inspect and report every study.

Every spec names its kind in ``kind:`` (absent: :data:`DEFAULT_KIND`). A kind is a folder
``studies/kinds/<kind>/`` whose ``__init__.py`` defines ``KIND``, an object implementing the contract
:class:`studies.kinds.base.StudyKind` (documented there: spec class, phases, run, analyse, status,
report, power). :data:`KINDS` maps each ``kind:`` value to that object; adding a kind is one line of
:data:`KIND_MODULES` (docs/extending.md).

:func:`run_study_spec` adds what every kind shares: the resolved spec written to
``<storage>/<name>/study_spec.yaml``, a rerun with an edited spec refused (exit 2, the changed fields
named), the outcome printed. The CLI and the scripts in ``studies/`` call it, nothing else.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.kinds.base import SHARED_VERDICT_FIELDS, Phase, StudyKind, StudyOutcome
from studies.spec import SpecError, SpecIssue, load_spec, parse_yaml, read_spec_text

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "KIND_MODULES",
    "SHARED_VERDICT_FIELDS",
    "SPEC_FILE",
    "Phase",
    "StudyKind",
    "StudyOutcome",
    "changed_fields",
    "kind_for",
    "kind_of",
    "load_study",
    "presets_of",
    "run_study_spec",
]

KIND_MODULES: tuple[str, ...] = (
    "studies.kinds.search",
    "studies.kinds.batchsize",
    "studies.kinds.compare",
)
"""The registered kinds: each module defines ``KIND`` (a :class:`StudyKind`). One line per kind."""

DEFAULT_KIND = "search"
"""The kind of a spec that names none in ``kind:``."""

SPEC_FILE = "study_spec.yaml"
"""The resolved spec inside every study directory (``<storage_path>/<name>/``)."""


def _registry() -> dict[str, StudyKind]:
    kinds: dict[str, StudyKind] = {}
    for module in KIND_MODULES:
        kind = importlib.import_module(module).KIND
        if not isinstance(kind, StudyKind) or kind.name in kinds:
            raise TypeError(f"{module}.KIND must be a StudyKind with a name of its own")
        kinds[kind.name] = kind
    return kinds


KINDS: dict[str, StudyKind] = _registry()
"""``kind:`` value -> the kind (:class:`studies.kinds.base.StudyKind`)."""


def kind_of(document: Mapping[str, Any], *, source: str | None = None, line: int | None = None) -> StudyKind:
    """The kind a loaded YAML document declares (:data:`DEFAULT_KIND` when it declares none).

    Raises:
        SpecError: ``kind`` is not one of :data:`KINDS` (a mapping, a list, an unknown name), with the
            field, the line where known and the known kinds.
    """
    name = document.get("kind", DEFAULT_KIND) if isinstance(document, Mapping) else DEFAULT_KIND
    if not isinstance(name, str) or name not in KINDS:
        shown = (
            repr(name) if isinstance(name, str | int | float | bool) or name is None else type(name).__name__
        )
        what = f"unknown study kind {shown}" if isinstance(name, str) else f"must be a kind name, got {shown}"
        raise SpecError([SpecIssue("kind", f"{what}; valid: {', '.join(sorted(KINDS))}", line, source)])
    return KINDS[name]


def load_study(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    preset: str | None = None,
    kind: str | None = None,
) -> Any:
    """Load and validate a spec file of any kind (preset, then ``--set`` overrides).

    Raises:
        SpecError: every problem found, with field paths and lines.
    """
    path = Path(path)
    if kind is None:
        document, lines = parse_yaml(read_spec_text(path), source=str(path))
        study_kind = kind_of(document, source=str(path), line=lines.get(("kind",)))
    else:
        study_kind = KINDS[kind]
    return load_spec(path, list(overrides), preset=preset, model=study_kind.spec_class())


def presets_of(path: str | Path) -> list[str]:
    """The preset names a spec file defines."""
    document, _ = parse_yaml(read_spec_text(path), source=str(path))
    presets = document.get("presets") if isinstance(document, Mapping) else None
    return sorted(presets) if isinstance(presets, Mapping) else []


def kind_for(spec: Any) -> StudyKind:
    """The kind of a validated spec."""
    return KINDS[str(getattr(spec, "kind", DEFAULT_KIND))]


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


def _check_unchanged(spec: Any, study_dir: Any, *, allow_changed: bool) -> None:
    """Refuse to resume a study whose stored spec differs from ``spec`` (two studies would mix)."""
    text = study_dir.read_text(SPEC_FILE)
    if text is None:
        return
    stored, _ = parse_yaml(text, source=f"{study_dir.uri}/{SPEC_FILE}")
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

    spec = check_decidable(spec, allow_exploratory=allow_exploratory)
    kind = kind_for(spec)
    study_dir = StudyDir.of(spec)
    # The lease first: a second driver of the same study stops here, before writing anything.
    with study_lease(
        study_dir.storage,
        spec.name,
        endpoint_override=study_dir.config.endpoint_override,
        region=study_dir.config.region,
    ):
        _check_unchanged(spec, study_dir, allow_changed=allow_changed_spec)
        fresh = study_dir.read_text(SPEC_FILE) is None
        study_dir.write_text(SPEC_FILE, spec.to_yaml())
        print(f"[{spec.name}] {kind.name} study; spec -> {study_dir.uri}/{SPEC_FILE}", flush=True)
        planned = _estimate(spec) if runner_options.get("trainable") is None else None
        if planned is not None:
            runner_options["planned"] = planned
        runner_options = {"provenance": _provenance(spec), **runner_options}
        try:
            outcome = kind.run(spec, **runner_options)
        except BaseException:
            # Refused (or failed) before its first trial left anything: take the spec back, so the
            # corrected command is a fresh start rather than "a changed spec" (issue: a refused
            # `--set resources.cpu=64` locked its own fix out).
            if fresh and study_dir.list_files() == [SPEC_FILE]:
                study_dir.delete(SPEC_FILE)
            raise
    return outcome


def _estimate(spec: Any) -> dict[str, float] | None:
    """The plan's estimate (trials, CPU/GPU hours, wall time on this machine); ``None`` if planning
    fails — an estimate must never stop a study."""
    try:
        from studies.calibration_cache import CalibrationCache
        from studies.planning import plan_study

        # Step times measured by an earlier `run` on this machine are reused (studies.calibration_cache).
        plan = plan_study(spec, cache=CalibrationCache() if CalibrationCache.enabled() else None)
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


def _provenance(spec: Any) -> dict[str, Any]:
    """The study run's provenance tags and artifact (:mod:`studies.provenance`); empty when it
    cannot be made — like the estimate, it must never stop a study."""
    try:
        from studies.provenance import study_provenance

        return study_provenance(spec)
    except Exception as exc:
        print(f"[{spec.name}] no provenance: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return {}


def _print(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
