"""The contract every study kind implements: one class, :class:`StudyKind`, whose methods are the kind.

A kind is a subclass of :class:`StudyKind`, registered as an instance: a shipped kind is one line of
:data:`studies.kinds.KIND_MODULES` (its package defines ``KIND``), a kind from another package is
an entry point in the group ``autonorm_studies.kinds`` (docs/extending.md). Everything else — the
CLI (``validate``, ``plan``, ``run``, ``resume``, ``status``, ``report``, ``extend``, ``submit``,
``reproduce``), the entry scripts, the planner, the spec reference generator — reaches the kind
through that object and never branches on its name. The shared helpers a kind's methods use (the
study runner, reading phases back, status rows, logging outputs) are in the modules of
:mod:`studies.kinds` named for their job (:mod:`~studies.kinds.study_runner`, :mod:`~studies.kinds.records`,
:mod:`~studies.kinds.outcome`, :mod:`~studies.kinds.printing`, ...).

A kind keeps its heavy imports (Ray, pandas, matplotlib, torch) inside its methods: the registry is
imported by every command, ``validate`` included. Like Optuna's ``BaseSampler``, the abstract
methods are the minimum; the others have defaults a kind overrides when it has more to say.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from workers.dotted import with_values
from workers.plan import StudyPlan, expected_trials

__all__ = ["SHARED_VERDICT_FIELDS", "STUDY_VERDICTS", "Phase", "StudyKind", "StudyOutcome", "StudyVerdict"]

STUDY_VERDICTS: tuple[str, ...] = (
    "supported",
    "refuted",
    "budget-dependent",
    "equivalent",
    "inconclusive",
    "none",
)
"""Values of ``study_verdict``: ``none`` for a study that tests no hypothesis (a search alone);
``budget-dependent`` (decided) for a claim that holds under one training budget and fails under
another (the batch-size kind; the verdict's ``study_reasons`` says which); ``equivalent`` (decided)
for a kind with an equivalence margin whose every contrast is decided and a predicted difference lies
inside the margin (the compare kind: the claim is not reproduced, and is not refuted either)."""

StudyVerdict = Literal["supported", "refuted", "budget-dependent", "equivalent", "inconclusive", "none"]

SHARED_VERDICT_FIELDS: tuple[str, ...] = ("kind", "study_verdict", "hypotheses")
"""Fields every ``verdict.json`` has, whatever its kind; ``hypotheses`` maps a hypothesis's name to
``{verdict, reasons, estimate, ci, p_value, p_value_holm}`` (:func:`studies.kinds.outcome.hypothesis_entry`)."""


def _grid_points(plan: StudyPlan) -> list[dict[str, Any]]:
    """Tune's trial set of a plan: the grid product x ``num_samples`` (the base config for samplers)."""
    if plan.sampler.type != "grid":
        return [{} for _ in range(plan.num_samples)]
    names = [name for name, _ in plan.grid]
    points = [dict(zip(names, combo)) for combo in itertools.product(*(values for _, values in plan.grid))]
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
    # the learning-rate refinement (optional too: skipped where a tuned η stays on its grid's edge),
    # counted in ``plan``'s trials: an interior winner, the usual case, is refined
    refine: bool = False

    @classmethod
    def of(
        cls, plan: StudyPlan, *, optional: bool = False, look: bool = False, refine: bool = False
    ) -> Phase:
        configs = tuple(with_values(plan.base_config, point) for point in _grid_points(plan))
        if len(configs) != expected_trials(plan):  # the plan contract; never expected to fail
            raise AssertionError(
                f"phase {plan.name}: {len(configs)} configs for {expected_trials(plan)} trials"
            )
        return cls(
            name=plan.name,
            plan=plan,
            configs=configs,
            optional=optional or look or refine,
            look=look,
            refine=refine,
        )


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


class StudyKind(ABC):
    """A study kind. Subclasses set :attr:`name` and :attr:`example` and implement the abstract methods.

    Attributes:
        name: the ``kind:`` value.
        script: the entry script users ``ray job submit`` (``None``: ``python -m studies.cli run``).
        title / summary: a heading and one sentence for the spec reference.
        example: the spec file (relative to the repository root, or absolute) and its preset that the
            contract suite (``tests/studies/test_kinds_contract.py``) starts from.
        tiny: ``--set`` overrides over ``example`` for the contract suite's one run: the cheapest
            fixed design (no optional phase fires) that still runs every phase.
    """

    name: ClassVar[str]
    script: ClassVar[str | None] = None
    title: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    example: ClassVar[tuple[str, str | None]]
    tiny: ClassVar[tuple[str, ...]] = ()

    # ---- the spec and its phases (light: no Ray, no torch) -------------------------------------

    @abstractmethod
    def spec_class(self) -> type[BaseModel]:
        """The pydantic spec class, on every load (``validate``, ``run``, ``plan``, ...): frozen,
        ``extra="forbid"``, a ``kind: Literal[name]`` field, composed of :mod:`studies.schema`'s sections."""

    @abstractmethod
    def phases(self, spec: Any) -> list[Phase]:
        """Every phase ``run`` runs, in order, each with every trial config: for ``plan`` (trial
        counts, cost; an ``optional`` phase counts only in the maxima), :meth:`total_trials` (the study
        run's ``expected_trials``), ``status`` (one entry per phase) and the kind's own ``run``."""

    def total_trials(self, spec: Any) -> int:
        """Every trial of every phase but the optional ones (the study run's ``expected_trials``)."""
        return sum(len(p.configs) for p in self.phases(spec) if not p.optional)

    def describe(self, spec: Any) -> str:
        """One line for ``validate``."""
        return f"{self.total_trials(spec)} trials in all phases, storage {spec.storage_path}"

    def undecidable(self, spec: Any) -> list[Any]:
        """The hypotheses the design can never decide, whatever the data (``studies.decidability.
        Undecidable`` each), for ``validate``, ``plan``, ``run`` and ``submit``, which refuse such a
        design (exit 2) unless it is exploratory. Default: none (a kind without hypotheses)."""
        return []

    def alpha(self, spec: Any) -> float:
        """The spec's significance level (``plan --pilot`` default)."""
        return 0.05

    # ---- running and reading back (heavy imports inside) ----------------------------------------

    @abstractmethod
    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        """Run (or resume) every phase, analyse, write ``verdict.json`` and the report, log them, through
        :func:`studies.running.run_study_spec` (which holds the lease and writes the resolved spec
        first). ``runner_options`` go to :class:`workers.study.StudyRunner` (:data:`studies.kinds.study_runner.RUNNER_OPTIONS`)."""

    @abstractmethod
    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        """The ``verdict.json`` dictionary from the trial table (with :data:`SHARED_VERDICT_FIELDS`), by
        ``run`` after the last phase and by ``report``; ``inputs``: what else the analysis reads."""

    @abstractmethod
    def status(self, spec: Any) -> dict[str, Any]:
        """Progress from the study directory, during a run and after it: ``study``, ``kind``,
        ``directory``, ``expected_trials``, ``trials``, ``by_status``, ``phases: {name: {trials,
        by_status}}``, ``study_verdict``, ``rows``."""

    @abstractmethod
    def report(self, spec: Any, out_dir: Path) -> Path:
        """Re-analyse the study directory and write the report files (``verdict.json`` among them) into
        ``out_dir``; returns the Markdown report."""

    def reanalyse(self, spec: Any, trials: Any) -> dict[str, Any]:
        """The ``verdict.json`` dictionary recomputed from trial records that do not come from the study
        directory (``autonorm-study reproduce``): ``trials`` is a
        :class:`workers.tracking.replay.TrackedTrials` (the study's trial runs in MLflow, by phase).

        The default runs :meth:`report` into a scratch directory while :func:`workers.results.read_trials`
        answers from ``trials`` and returns the ``verdict.json`` it wrote; a kind that reads anything else
        from its study directory overrides this."""
        import json
        import tempfile

        from workers.tracking.replay import replaying

        with tempfile.TemporaryDirectory(prefix=f"reanalyse-{self.name}-") as tmp, replaying(trials):
            self.report(spec, Path(tmp))
            verdict: dict[str, Any] = json.loads((Path(tmp) / "verdict.json").read_text(encoding="utf-8"))
        return verdict

    # ---- the results page (studies.claims_page) ------------------------------------------------

    def paper_claims(self, verdict: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
        """Which of the papers' claims (:data:`studies.claims_page.PAPER_CLAIMS`, by ``label``) a
        stored ``verdict.json`` of this kind tests, and with what: ``{label: [(hypothesis, short
        label), ...]}``, each hypothesis a key of ``verdict["hypotheses"]`` (``"(study)"``: the study
        verdict). The results page reads only this, so a new kind needs no edit of the page.
        Default: none."""
        return {}

    def claim_estimates(
        self, label: str, study: str, verdict: Mapping[str, Any]
    ) -> tuple[list[str], list[Any]] | None:
        """The results page's estimate cells and figure points (:class:`studies.claims_page.Point`) for
        the paper claim ``label`` this kind's ``verdict`` (of the stored study ``study``) tests, where
        its estimand is not a hypothesis's own ``estimate`` and ``ci`` (the batch-size kind's
        per-budget interactions). ``None`` (the default): each tested hypothesis's own."""
        return None

    # ---- seeds: plan --pilot and extend ---------------------------------------------------------

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        """Seeds each confirmatory test needs, from a finished pilot in ``study_dir`` (``plan --pilot``):
        ``{"seeds_needed": {test: K | None}, "per_seed", "effect", "sd", "quantity", "family_size",
        "min_seeds", ...}`` (:func:`studies.pilot.pilot_power` adds the cost). Default: refused."""
        raise ValueError(f"a {self.name} study has no confirmatory tests to size")

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``spec`` with ``k`` confirmatory seeds, re-validated (``plan --pilot`` prices it)."""
        raise ValueError(f"a {self.name} study has no confirmatory seeds to set")

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        """``autonorm-study extend``: the spec of a finished sequential study with ``seeds`` more
        confirmatory seeds (:func:`studies.running.extend_study` runs it). The default refuses."""
        from studies.sequential import ExtendRefused

        raise ExtendRefused(f"the {self.name} kind cannot extend a study")
