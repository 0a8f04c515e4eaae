"""The contract every study kind implements, documented in one place.

A study kind is a folder ``studies/kinds/<kind>/`` whose ``__init__.py`` defines ``KIND``, an
instance of a :class:`StudyKind` subclass, and whose module path is one line of
:data:`studies.kinds.KIND_MODULES`. Everything else — the CLI (``validate``, ``plan``, ``run``,
``resume``, ``status``, ``report``, ``submit``), the entry scripts, the planner, the spec reference
generator — reaches the kind through that object and never branches on its name.

When each method is called:

* :meth:`StudyKind.spec_class` — on every load (``validate``, ``run``, ``plan``, ...): the pydantic
  class the YAML is validated into (composed of the shared sections in :mod:`studies.schema`).
* :meth:`StudyKind.phases` — by ``plan`` (trial counts, cost; an ``optional`` phase, e.g. a
  learning-rate range extension, counts only in the maxima), by :meth:`StudyKind.total_trials` (the
  study run's ``expected_trials``), by ``status`` (one entry per phase) and by the kind's own ``run``
  (the phase names it runs). A phase's name is its folder ``<study>/<phase>/``, its MLflow run name,
  the ``autonorm.phase`` tag of that run and of each of its trial runs, and what ``plan`` and
  ``status`` print.
* :meth:`StudyKind.run` — by ``run`` / ``resume`` / the entry scripts, through
  :func:`studies.running.run_study_spec` (which holds the lease and writes the resolved spec first).
* :meth:`StudyKind.analyse` — by ``run`` after the last phase and by ``report``: the trial table →
  the ``verdict.json`` dictionary. It always carries :data:`SHARED_VERDICT_FIELDS`.
* :meth:`StudyKind.report` — by ``report``: re-read the study directory, analyse again, write files.
* :meth:`StudyKind.reanalyse` — by ``reproduce``: the verdict again from the trial runs in MLflow
  (default: :meth:`StudyKind.report` with ``read_trials`` answering from MLflow).
* :meth:`StudyKind.status` — by ``status``, during a run and after it.
* :meth:`StudyKind.power` / :meth:`StudyKind.with_seeds` / :meth:`StudyKind.alpha` — by
  ``plan --pilot`` (:func:`studies.pilot.pilot_power`).
* :meth:`StudyKind.undecidable` — by ``validate``, ``plan``, ``run`` and ``submit``
  (:func:`studies.decidability.check_decidable`): hypotheses the design can never decide.

A kind keeps its heavy imports (Ray, pandas, matplotlib) inside its methods: the registry is imported
by every command, including ``validate``.
"""

from __future__ import annotations

import importlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from workers.dotted import with_values
from workers.plan import StudyPlan, expected_trials

__all__ = [
    "RUNNER_OPTIONS",
    "SHARED_VERDICT_FIELDS",
    "STUDY_VERDICTS",
    "Phase",
    "StudyKind",
    "StudyOutcome",
    "arm_of",
    "hypothesis_entry",
    "log_study_outputs",
    "metric_value",
    "phase_status",
    "read_phase_trials",
    "spent",
    "status_row",
    "stored_rounds",
    "study_outcome",
    "study_runner",
]

STUDY_VERDICTS: tuple[str, ...] = ("supported", "refuted", "inconclusive", "none")
"""Values of ``study_verdict``: ``none`` for a study that tests no hypothesis (a search alone)."""

SHARED_VERDICT_FIELDS: tuple[str, ...] = ("kind", "study_verdict", "hypotheses")
"""Fields every ``verdict.json`` has, whatever its kind; ``hypotheses`` maps a hypothesis's name to
``{verdict, reasons, estimate, ci, p_value, p_value_holm}`` (:func:`hypothesis_entry`)."""

StudyVerdict = Literal["supported", "refuted", "inconclusive", "none"]


def hypothesis_entry(
    result: Mapping[str, Any], *, estimate: str = "estimate", ci: str = "ci"
) -> dict[str, Any]:
    """One hypothesis in the uniform view: ``verdict``, ``reasons``, ``estimate``, ``ci``, ``p_value``,
    ``p_value_holm``, read from a kind's own result (``estimate`` / ``ci`` name its keys)."""
    return {
        "verdict": result.get("verdict"),
        "reasons": list(result.get("reasons") or []),
        "estimate": result.get(estimate),
        "ci": result.get(ci),
        "p_value": result.get("p_value"),
        "p_value_holm": result.get("p_value_holm"),
    }


RUNNER_OPTIONS = ("ray_address", "ray_init_kwargs", "trainable", "progress", "planned", "provenance")
"""What :meth:`StudyKind.run` passes on to :class:`workers.study.StudyRunner` (``provenance``:
``{"tags", "artifacts"}`` added to the study run's own, :func:`studies.provenance.study_provenance`)."""


def study_runner(study: StudyPlan, *, expected_trials: int, **options: Any) -> Any:
    """The :class:`workers.study.StudyRunner` of a study: name, storage, tracking, tags, params,
    artifacts and resources from ``study`` (the study-level plan), ``expected_trials`` every trial
    the phases plan; ``options``: :data:`RUNNER_OPTIONS`."""
    from workers.study import StudyRunner

    provenance = options.get("provenance") or {}
    return StudyRunner(
        name=study.name,
        storage=study.storage,
        tracking=study.tracking,
        expected_trials=expected_trials,
        tags={**dict(study.tags), **dict(provenance.get("tags") or {})},
        params=dict(study.params),
        artifacts={**dict(study.artifacts), **dict(provenance.get("artifacts") or {})},
        resources=study.resources,
        **{k: v for k, v in options.items() if k in RUNNER_OPTIONS and k != "provenance"},
    )


def _grid_points(plan: StudyPlan) -> list[dict[str, Any]]:
    """Tune's trial set of a plan: the grid product x ``num_samples`` (the base config for samplers)."""
    if plan.sampler.type != "grid":
        return [{} for _ in range(plan.num_samples)]
    names = [name for name, _ in plan.grid]
    product = itertools.product(*(values for _, values in plan.grid))
    points = [dict(zip(names, combo)) for combo in product]
    return [p for _ in range(plan.num_samples) for p in points]


@dataclass(frozen=True)
class Phase:
    """One phase of a study: its name, its plan and the plan's trial configs.

    The name is the plan's name (``plan.name``): the folder ``<study>/<name>/``, the phase run's name
    and its ``autonorm.phase`` tag. Values a phase only learns from an earlier one (the tuned η, the
    best searched configuration) are placeholders here; the trial count does not depend on them.
    """

    name: str
    plan: StudyPlan
    configs: tuple[dict[str, Any], ...]
    optional: bool = False  # runs only when needed (a range extension): in ``plan``'s maxima only
    look: bool = False  # a sequential design's look after the first (optional too): its expected cost

    @classmethod
    def of(cls, plan: StudyPlan, *, optional: bool = False, look: bool = False) -> Phase:
        configs = tuple(with_values(plan.base_config, point) for point in _grid_points(plan))
        if len(configs) != expected_trials(plan):  # the plan contract; never expected to fail
            raise AssertionError(
                f"phase {plan.name}: {len(configs)} configs for {expected_trials(plan)} trials"
            )
        return cls(name=plan.name, plan=plan, configs=configs, optional=optional or look, look=look)


@dataclass
class StudyOutcome:
    """What a finished (or resumed-to-the-end) study produced, whatever its kind.

    Attributes:
        kind / name: the study.
        study_dir: ``<storage_path>/<name>`` (absolute path or ``s3://...``).
        tracking_uri / parent_run_id: where its MLflow study run lives.
        summary: JSON-able summary the CLI prints (trial counts, best trial, verdicts, ...).
        verdict: the ``verdict.json`` content.
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


def read_phase_trials(kind: StudyKind, spec: Any, *, history: bool = False) -> dict[str, list[Any]]:
    """Each phase's trials (``workers.runner.TrialRecord``) read back from the study directory, by
    phase name in run order; an optional phase (an extension round, a later look) that never ran is
    left out."""
    from studies.study_dir import StudyDir
    from workers.runner import read_trials

    where = StudyDir.of(spec)
    out = {}
    for phase in kind.phases(spec):
        trials = read_trials(where.phase_plan(phase.name), history=history)
        if trials or not phase.optional:  # an extension round that never ran is not a phase
            out[phase.name] = trials
    return out


def stored_rounds(spec: Any, prefix: str) -> Any:
    """A :data:`studies.tuning.RunPoints` that reads range-extension round ``k`` back from the study
    directory (the phase ``<prefix><k>``, e.g. ``tune-ext2``) instead of running it (report, status)."""
    from studies.study_dir import StudyDir
    from workers.runner import read_trials

    where = StudyDir.of(spec)

    def read_points(round_: int, lrs: Mapping[str, float]) -> Any:
        return read_trials(where.phase_plan(f"{prefix}{round_}"), history=False)

    return read_points


def phase_status(
    kind: StudyKind, kind_name: str, spec: Any, phases: Mapping[str, list[Any]]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``status`` fields a fixed-design kind shares (``study`` ... ``study_verdict``), from
    :func:`read_phase_trials`'s ``phases``, and the study's ``verdict.json`` (None before there is
    one) for the kind's own fields. ``expected_trials`` is ``spec.total_trials`` plus the trials of
    the optional phases that ran (each raised the count)."""
    import json
    from collections import Counter

    from studies.study_dir import StudyDir

    optional = {p.name for p in kind.phases(spec) if p.optional}
    every = [t for ts in phases.values() for t in ts]
    text = StudyDir.of(spec).read_text("verdict.json")
    verdict = json.loads(text) if text else None
    fields = {
        "study": spec.name,
        "kind": kind_name,
        "directory": StudyDir.of(spec).uri,
        "expected_trials": spec.total_trials + sum(len(ts) for n, ts in phases.items() if n in optional),
        "trials": len(every),
        "by_status": dict(Counter(t.status for t in every)),
        "phases": {
            name: {"trials": len(ts), "by_status": dict(Counter(t.status for t in ts))}
            for name, ts in phases.items()
        },
        "study_verdict": verdict.get("study_verdict") if verdict else None,
    }
    return fields, verdict


def arm_of(trial: Any) -> str:
    """The arm of an arm design's trial: its ``model.layer.type``."""
    return str(trial.config["model"]["layer"]["type"])


def metric_value(trial: Any, metric: str) -> float:
    """A trial's last reported ``metric`` as a float (NaN when it reported none, or a non-number)."""
    v = trial.metrics.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")


def status_row(phase: str, trial: Any, **fields: Any) -> dict[str, Any]:
    """One row of an arm design's ``status`` table: phase, trial, status, arm, seed, lr, then ``fields``."""
    return {
        "phase": phase,
        "trial": trial.trial_id,
        "status": trial.status,
        "arm": arm_of(trial),
        "seed": trial.config.get("seed"),
        "lr": trial.config["training"]["lr"],
        **fields,
    }


def spent(spec: Any, phases: Mapping[str, list[Any]], wall_time_s: float) -> tuple[float, float, float]:
    """``(wall s, CPU h, GPU h)`` of a study from its trials' ``time_total_s`` and the per-trial
    resources of ``spec`` (what the report shows; the wall time is the run's own, NaN if unknown)."""
    seconds = sum(float(t.metrics.get("time_total_s") or 0.0) for ts in phases.values() for t in ts)
    res = dict(spec.resources.as_plan())
    return wall_time_s, seconds * res.get("cpu", 0.0) / 3600, seconds * res.get("gpu", 0.0) / 3600


def log_study_outputs(
    runner: Any,
    spec: Any,
    files: Mapping[str, Path],
    *,
    tags: Mapping[str, str],
    metrics: Mapping[str, float],
) -> None:
    """A finished study's output files into its directory (when remote) and onto its MLflow run, with
    the verdict ``tags`` and ``metrics`` and the analysed metric as a param (the wall time and the
    resource hours are the runner's own ``actual_*`` metrics)."""
    runner.publish(files.values())
    runner.log_outputs(
        files=files.values(), tags=tags, metrics=metrics, params={"analysis_metric": spec.analysis.metric}
    )


def study_outcome(
    kind_name: str,
    spec: Any,
    runner: Any,
    verdict: dict[str, Any],
    table: Any,
    files: dict[str, Path],
    *,
    verdicts: Mapping[str, Any],
    tuned_lr: Any,
) -> StudyOutcome:
    """The :class:`StudyOutcome` of a fixed-design kind's finished ``run``: its summary is the study,
    its ``study_verdict``, the kind's ``verdicts`` (e.g. per arm or per contrast), the trials by
    status (``table``'s ``status`` column), ``tuned_lr`` and where the run lives."""
    from collections import Counter

    counts = Counter(str(s) for s in table["status"]) if not table.empty else Counter()
    return StudyOutcome(
        kind=kind_name,
        name=spec.name,
        study_dir=runner.study_uri,
        tracking_uri=runner.tracking_uri,
        parent_run_id=runner.run_id,
        summary={
            "study": spec.name,
            "study_verdict": verdict.get("study_verdict"),
            **verdicts,
            "trials": dict(counts),
            "tuned_lr": tuned_lr,
            "parent_run_id": runner.run_id,
            "tracking_uri": runner.tracking_uri,
            "study_dir": runner.study_uri,
        },
        verdict=verdict,
        files=files,
    )


class StudyKind(ABC):
    """A study kind. Subclasses set :attr:`name` and :attr:`spec` and implement the abstract methods.

    Attributes:
        name: the ``kind:`` value.
        spec: ``"module:Class"`` of the pydantic spec class (imported on use).
        script: the entry script users ``ray job submit`` (``None``: ``python -m studies.cli run``).
        title: a heading for the spec reference.
        summary: one sentence for the spec reference.
        module: the module holding the kind's ``run(spec, **runner_options)``, ``analyse(table, spec,
            **inputs)``, ``status(spec)``, ``report(spec, out_dir)`` and ``pilot(spec, study_dir, ...)``,
            which the default methods call (imported on use: it may import Ray).
        example: the shipped spec file (relative to the repository root) and its preset that the
            contract suite (``tests/studies/test_kinds_contract.py``) starts from.
        tiny: ``--set`` overrides over ``example`` for the contract suite's one run: the cheapest
            fixed design (no optional phase fires) that still runs every phase.
        decidability: the module whose ``undecidable(spec)`` the default :meth:`undecidable` calls
            (imported on use; ``None``: a kind without hypotheses).
    """

    name: ClassVar[str]
    spec: ClassVar[str]
    script: ClassVar[str | None] = None
    title: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    module: ClassVar[str]
    example: ClassVar[tuple[str, str | None]]
    tiny: ClassVar[tuple[str, ...]] = ()
    decidability: ClassVar[str | None] = None

    def spec_class(self) -> type[BaseModel]:
        """The pydantic spec class (``extra="forbid"``, frozen, a ``kind: Literal[name]`` field)."""
        module, cls = self.spec.split(":")
        loaded: type[BaseModel] = getattr(importlib.import_module(module), cls)
        return loaded

    @abstractmethod
    def phases(self, spec: Any) -> list[Phase]:
        """Every phase ``run`` runs, in order, each with every trial config."""

    def total_trials(self, spec: Any) -> int:
        """Every trial of every phase but the optional ones (the study run's ``expected_trials``)."""
        return sum(len(p.configs) for p in self.phases(spec) if not p.optional)

    def describe(self, spec: Any) -> str:
        """One line for ``validate``."""
        return f"{self.total_trials(spec)} trials in all phases, storage {spec.storage_path}"

    def impl(self) -> Any:
        """The kind's :attr:`module`."""
        return importlib.import_module(self.module)

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        """Run (or resume) every phase, analyse, write ``verdict.json`` and the report, log them.

        ``runner_options`` go to :class:`workers.study.StudyRunner` (:data:`RUNNER_OPTIONS`)."""
        outcome: StudyOutcome = self.impl().run(spec, **runner_options)
        return outcome

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        """The ``verdict.json`` dictionary from the trial table (with :data:`SHARED_VERDICT_FIELDS`);
        ``inputs``: what else the kind's analysis reads (per-epoch logs, tuning records)."""
        verdict: dict[str, Any] = self.impl().analyse(table, spec, **inputs)
        return verdict

    def reanalyse(self, spec: Any, trials: Any) -> dict[str, Any]:
        """The ``verdict.json`` dictionary recomputed from trial records that do not come from the
        study directory (``autonorm-study reproduce``): ``trials`` is a
        :class:`workers.tracking.replay.TrackedTrials` (the study's trial runs in MLflow, by phase).

        The default runs the kind's own :meth:`report` into a scratch directory while
        :func:`workers.runner.read_trials` answers from ``trials`` (so every kind whose report reads
        its phases with ``read_trials`` re-analyses from MLflow unchanged) and returns the
        ``verdict.json`` it wrote. A kind that reads anything else from its study directory overrides
        this."""
        import json
        import tempfile

        from workers.tracking.replay import replaying

        with tempfile.TemporaryDirectory(prefix=f"reanalyse-{self.name}-") as tmp, replaying(trials):
            self.report(spec, Path(tmp))
            verdict: dict[str, Any] = json.loads((Path(tmp) / "verdict.json").read_text(encoding="utf-8"))
        return verdict

    def status(self, spec: Any) -> dict[str, Any]:
        """Progress from the study directory: ``study``, ``kind``, ``directory``, ``expected_trials``,
        ``trials``, ``by_status``, ``phases: {name: {trials, by_status}}``, ``study_verdict``, ``rows``."""
        status: dict[str, Any] = self.impl().status(spec)
        return status

    def report(self, spec: Any, out_dir: Path) -> Path:
        """Re-analyse the study directory and write the report files (``verdict.json`` among them)
        into ``out_dir``; returns the Markdown report."""
        path: Path = self.impl().report(spec, out_dir)
        return path

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        """Seeds each confirmatory test needs, from a finished pilot in ``study_dir``:
        ``{"seeds_needed": {test: K | None}, "per_seed", "effect", "sd", "quantity", "family_size",
        "min_seeds", ...}`` (:func:`studies.pilot.pilot_power` adds the cost)."""
        result: dict[str, Any] = self.impl().pilot(
            spec, study_dir, power=power, min_effect=min_effect, alpha=alpha
        )
        return result

    def alpha(self, spec: Any) -> float:
        """The spec's significance level (``plan --pilot`` default)."""
        return 0.05

    def undecidable(self, spec: Any) -> list[Any]:
        """The hypotheses the design can never decide, whatever the data (``studies.decidability.
        Undecidable`` each): by ``validate``, ``plan``, ``run`` and ``submit``, which refuse such a design
        (exit 2) unless it is exploratory. Default: :attr:`decidability`'s ``undecidable(spec)``; none
        without one (a kind without hypotheses)."""
        if self.decidability is None:
            return []
        found: list[Any] = importlib.import_module(self.decidability).undecidable(spec)
        return found

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``spec`` with ``k`` confirmatory seeds, re-validated (``plan --pilot`` prices it)."""
        raise ValueError(f"a {self.name} study has no confirmatory seeds to set")

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        """``autonorm-study extend``: the spec of a finished sequential study with ``seeds`` more
        confirmatory seeds (:func:`studies.running.extend_study` runs it). The default refuses."""
        from studies.sequential import ExtendRefused

        raise ExtendRefused(f"the {self.name} kind cannot extend a study")
