"""Study kinds: one registry, one way to load, run, inspect and report every study.

Every spec names its kind in ``kind:`` (absent = ``search``). A kind is a module with:

* ``SPEC``: the pydantic spec class (``"module:Class"`` in :data:`KINDS`, imported on use);
* ``run(spec, *, runner_options) -> StudyOutcome``: turns the spec into phases, runs each phase's
  plans through :class:`workers.study.StudyRunner` (one Ray session, one MLflow study run), then
  analyses and writes the outputs into ``<storage_path>/<name>/``;
* ``status(spec) -> dict``: progress from the study directory (works while it runs and after);
* ``report(spec, out_dir) -> Path``: the report regenerated from the study directory;
* ``total_trials(spec) -> int``: every trial of every phase (what MLflow will count).

:func:`run_study_spec` adds what every kind shares: the resolved spec written to
``<storage>/<name>/study_spec.yaml``, a rerun with an edited spec refused (exit 2, the changed fields
named), the outcome printed. The CLI and the scripts in ``studies/`` call it, nothing else.
See docs/extending.md for adding a kind.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from studies.spec import SpecError, SpecIssue, load_spec, parse_yaml, read_spec_text

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "SPEC_FILE",
    "StudyKind",
    "StudyOutcome",
    "changed_fields",
    "kind_of",
    "load_study",
    "run_study_spec",
]

DEFAULT_KIND = "search"
"""The kind of a spec that names none in ``kind:``."""

SPEC_FILE = "study_spec.yaml"
"""The resolved spec inside every study directory (``<storage_path>/<name>/``)."""


@dataclass(frozen=True)
class StudyKind:
    """A registered kind: its spec class and the module that runs it.

    Attributes:
        name: the ``kind:`` value.
        spec: ``"module:Class"`` of the pydantic spec.
        module: the implementation (``run``, ``status``, ``report``, ``total_trials``).
        script: the entry script users run (``python studies/...``).
    """

    name: str
    spec: str
    module: str
    script: str

    def spec_class(self) -> type[BaseModel]:
        module, cls = self.spec.split(":")
        loaded: type[BaseModel] = getattr(importlib.import_module(module), cls)
        return loaded

    def impl(self) -> ModuleType:
        return importlib.import_module(self.module)


KINDS: dict[str, StudyKind] = {
    "search": StudyKind(
        "search", "studies.kinds.search.spec:StudySpec", "studies.kinds.search", "studies/autonorm_search.py"
    ),
    "batchsize": StudyKind(
        "batchsize",
        "studies.kinds.batchsize.spec:BatchSizeStudySpec",
        "studies.kinds.batchsize",
        "studies/batchsize_correlation.py",
    ),
}


@dataclass
class StudyOutcome:
    """What a finished (or resumed-to-the-end) study produced, whatever its kind.

    Attributes:
        kind / name: the study.
        study_dir: ``<storage_path>/<name>`` (absolute path or ``s3://...``).
        tracking_uri / parent_run_id: where its MLflow study run lives.
        summary: JSON-able summary the CLI prints (trial counts, best trial, verdicts, ...).
        verdict: the ``verdict.json`` content for hypothesis studies.
        files: output name -> local file.
    """

    kind: str
    name: str
    study_dir: str
    tracking_uri: str
    parent_run_id: str | None
    summary: dict[str, Any] = field(default_factory=dict)
    verdict: dict[str, Any] | None = None
    files: dict[str, Path] = field(default_factory=dict)


def kind_of(document: Mapping[str, Any], *, source: str | None = None) -> StudyKind:
    """The kind a loaded YAML document declares (``search`` when it declares none)."""
    name = document.get("kind", DEFAULT_KIND) if isinstance(document, Mapping) else DEFAULT_KIND
    if name not in KINDS:
        raise SpecError(
            [
                SpecIssue(
                    "kind", f"unknown study kind {name!r}; valid: {', '.join(sorted(KINDS))}", None, source
                )
            ]
        )
    return KINDS[str(name)]


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
        document, _ = parse_yaml(read_spec_text(path), source=str(path))
        study_kind = kind_of(document, source=str(path))
    else:
        study_kind = KINDS[kind]
    return load_spec(path, list(overrides), preset=preset, model=study_kind.spec_class())


def presets_of(path: str | Path) -> list[str]:
    """The preset names a spec file defines."""
    document, _ = parse_yaml(read_spec_text(path), source=str(path))
    presets = document.get("presets") if isinstance(document, Mapping) else None
    return sorted(presets) if isinstance(presets, Mapping) else []


def kind_for(spec: Any) -> StudyKind:
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
    from studies.spec import parse_yaml as _parse

    text = study_dir.read_text(SPEC_FILE)
    if text is None:
        return
    stored, _ = _parse(text, source=f"{study_dir.uri}/{SPEC_FILE}")
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


def run_study_spec(spec: Any, *, allow_changed_spec: bool = False, **runner_options: Any) -> StudyOutcome:
    """Run (or resume) a study of any kind and return its outcome.

    Writes ``<storage>/<name>/study_spec.yaml`` first (refusing a changed spec for an existing study),
    then hands over to the kind, all under the study's lease (:func:`workers.lease.study_lease`:
    a second driver of the same study gets :class:`workers.errors.LeaseError`). ``runner_options`` go to :class:`workers.study.StudyRunner`
    (``ray_address``, ``ray_init_kwargs``, ``trainable``, ``progress``).
    """
    from studies.study_dir import StudyDir
    from workers.lease import study_lease

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
        study_dir.write_text(SPEC_FILE, spec.to_yaml())
        print(f"[{spec.name}] {kind.name} study; spec -> {study_dir.uri}/{SPEC_FILE}", flush=True)
        planned = _estimate(spec) if runner_options.get("trainable") is None else None
        if planned is not None:
            runner_options["planned"] = planned
        outcome: StudyOutcome = kind.impl().run(spec, **runner_options)
    return outcome


def _estimate(spec: Any) -> dict[str, float] | None:
    """The plan's estimate (trials, CPU/GPU hours, wall time on this machine); ``None`` if planning
    fails — an estimate must never stop a study."""
    try:
        from studies.planning import plan_study

        plan = plan_study(spec)
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


def _print(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
