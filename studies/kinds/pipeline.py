"""The tuned-design pipeline: one ``run``, ``status`` and ``report`` for every kind that tunes η first.

A tuned-design kind (``batchsize``, ``compare``) runs, per *budget* (the batch-size kind's
``epochs`` / ``updates``; one unnamed budget ``""`` elsewhere): its tuning phase, the range-extension rounds
while a tuned η sits on its grid's edge, the refinement of the interior winners, its confirmatory
phase (or a sequential design's looks); then it analyses every confirmatory trial, writes its
outputs, logs them on the study run and prints the verdict. ``report`` replays the same steps from
the study directory: the tuning (extension rounds and refinement read back, not run), the
confirmatory trials, the analysis and the outputs.

:class:`TunedDesignKind` implements those :class:`~studies.contract.StudyKind` methods once;
the phases are the spec's (:class:`studies.schema.arms.ArmStudySpec`); what differs between kinds
is a :class:`TunedDesign` in the kind's workflow module (its tables and analysis, its output files,
its verdict tags and metrics, the lines it prints), which
:meth:`TunedDesignKind.design` imports when a method needs it (Ray and pandas stay out of the
registry's imports).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from studies.contract import Phase, StudyOutcome
from studies.kinds.base import FolderKind
from studies.kinds.looks import BudgetLooks, n_looks, run_looks
from studies.kinds.outcome import log_study_outputs, study_outcome
from studies.kinds.printing import print_verdict, say
from studies.kinds.records import (
    arm_of,
    original_run,
    phase_status,
    read_phase_trials,
    spent,
    status_row,
    stored_refinement,
    stored_rounds,
)
from studies.kinds.spec_surgery import with_seeds
from studies.kinds.study_runner import extension_runner, refine_runner, study_runner
from studies.schema.arms import CELL_STAGE, phase_name
from studies.tuning import LRGrid, refine_points, tuned_rates
from workers.plan import StudyPlan

__all__ = ["TINY", "Analysed", "TunedDesign", "TunedDesignKind"]

Spent = tuple[float, float, float]
Environ = Mapping[str, str] | None
Rates = Mapping[str, float]

TINY: tuple[str, ...] = (
    "training.epochs=1",
    "arms=[linear, corrected]",
    "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], max_extensions: 0, refine: 0}",
    "max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
    "analysis.adequacy.check=false",  # no training-adequacy phase (tests/studies/test_compare_study.py runs it)
)
"""The overrides every tuned design's :attr:`~studies.contract.StudyKind.tiny` starts with: one
epoch, two arms, three rates, no optional phase (no range extension, no refinement), no
training-adequacy check."""


@dataclass(frozen=True)
class Analysed:
    """A tuned-design study once analysed: what :meth:`TunedDesign.write_outputs` is handed.

    Attributes:
        spec: the validated spec.
        verdict: the ``verdict.json`` dictionary (a hook may add fields before it is written).
        table: every confirmatory trial, one row each (the kind's trials table).
        records: the tuning record per budget (``""`` for a kind of one unnamed budget).
        spent: ``(wall s, CPU h, GPU h)``.
    """

    spec: Any
    verdict: dict[str, Any]
    table: Any
    records: Mapping[str, Any]
    spent: Spent

    @property
    def resources(self) -> dict[str, float]:
        """:attr:`spent` by name, as the report writers take it: ``wall_time_s``, ``cpu_hours``,
        ``gpu_hours``."""
        return dict(zip(("wall_time_s", "cpu_hours", "gpu_hours"), self.spent))


class TunedDesign(ABC):
    """A tuned-design kind's hooks: its workflow module defines one subclass and its instance
    ``DESIGN``, which :meth:`TunedDesignKind.design` imports when a method needs it.

    The phases are the spec's (:class:`studies.schema.arms.ArmStudySpec`): per budget of
    ``spec.budget_names`` (one unnamed ``""`` unless the kind has several) ``spec.tuning_plan``,
    ``spec.extension_plan``, ``spec.refine_plan`` and ``spec.confirmatory_plan``, named by
    :func:`studies.schema.arms.phase_name` (``tune[-<budget>]``, ``confirm[-<budget>][-look<j>]``).
    The defaults are those of a kind that checks nothing after tuning, logs nothing after a
    confirmatory phase, hands its analysis nothing but the table and prints no closing line.

    Attributes:
        TAG: the ``[<tag>]`` of its printed lines.
        ANALYSIS_LINE: the line printed before the analysis.
        REPORT_READS_RUN: ``report`` takes each trial's MLflow run id and the wall time from the
            outputs the run wrote (``trials.csv``, ``verdict.json``); otherwise they stay unknown.
    """

    TAG: ClassVar[str]
    ANALYSIS_LINE: ClassVar[str]
    REPORT_READS_RUN: ClassVar[bool] = False

    # ---- tuning, the confirmatory table, the analysis

    def look_arms(self, spec: Any, verdict: Mapping[str, Any], budget: str) -> list[str] | None:
        """Per-arm stopping (PROTOCOL §5): the arms the next look of ``budget`` runs, given the
        ``verdict`` of the looks so far; ``None``: every arm (the default: a kind whose hypotheses
        share every arm)."""
        return None

    def cell_of(self, spec: Any, trial: Any) -> str:
        """The tuning cell (one of ``spec.tuning_cells``) a tuning trial belongs to: its arm."""
        return arm_of(trial)

    def select_learning_rates(
        self, spec: Any, trials: Sequence[Any], *, run_points: Any = None, run_refine: Any = None
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The tuned η per cell of ``spec.tuning_cells`` (:meth:`cell_of`) from one budget's tuning
        trials (:func:`studies.tuning.tuned_rates`): the η with the best mean validation metric over
        the tuning seeds (a failed trial scores the worst value); a winner on the edge of its grid
        extends it through ``run_points`` (up to ``lr_tuning.max_extensions`` rounds), an interior
        winner is refined through ``run_refine`` (``lr_tuning.refine`` rates); ``None``: neither
        (``run`` runs them, ``report`` reads them back). Returns the η per cell and a JSON-able
        record per cell (every η's mean score, the winner, the final grid, the refinement, whether
        the winner still sits on its edge, trials completed / failed)."""
        return tuned_rates(
            spec.tuning_cells,
            trials,
            cell_of=lambda t: self.cell_of(spec, t),
            tuning=spec.lr_tuning,
            run_points=run_points,
            run_refine=run_refine,
        )

    def check_tuned(self, spec: Any, lr: Rates) -> None:
        """After tuning, before the confirmatory phase: raise when ``lr`` cannot be confirmed (by
        default every cell the tuning saw confirms with its η)."""
        return None

    @abstractmethod
    def confirm_table(self, spec: Any, trials: Sequence[Any], budget: str, record: Mapping[str, Any]) -> Any:
        """One budget's confirmatory trials as the kind's trials table."""

    def after_confirm(self, spec: Any, runner: Any, phase: str, table: Any) -> None:
        """After each confirmatory phase of ``run`` (e.g. summary runs under its phase run); by
        default nothing."""
        return None

    @abstractmethod
    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        """The ``verdict.json`` dictionary (:meth:`studies.contract.StudyKind.analyse`)."""

    def analysis_inputs(self, records: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`analyse` reads besides the table, from the tuning records per budget."""
        return {}

    # ---- outputs

    @abstractmethod
    def write_outputs(self, done: Analysed, out_dir: Path) -> dict[str, Path]:
        """The kind's output files in ``out_dir`` (``lr_tuning.json`` is the pipeline's), by name."""

    @abstractmethod
    def verdict_tags(self, verdict: Mapping[str, Any]) -> dict[str, str]:
        """The study run's verdict tags."""

    @abstractmethod
    def verdict_metrics(self, verdict: Mapping[str, Any]) -> dict[str, float]:
        """The numbers the verdict rests on, as the study run's metrics."""

    @abstractmethod
    def outcome_summary(
        self, verdict: Mapping[str, Any], records: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Any]:
        """The run's summary: the kind's verdicts and the tuned η."""

    # ---- printed lines

    def opening_line(self, spec: Any) -> str:
        """Before the first phase: the design (:meth:`design_size`), its trial counts (the
        confirmatory ones through a sequential design's first look), then :meth:`design_note`."""
        check = spec.adequacy_trials
        confirmatory = spec.total_trials - spec.tuning_trials - check
        adequacy = f" + {check} adequacy-check" if check else ""
        return (
            f"study {spec.name!r}: {self.design_size(spec)} = {confirmatory} confirmatory + "
            f"{spec.tuning_trials} lr-tuning{adequacy} trials ({spec.total_trials} total){self.design_note(spec)}"
        )

    @abstractmethod
    def design_size(self, spec: Any) -> str:
        """The design in words, for :meth:`opening_line` (``5 arms x 8 seeds``)."""

    def design_note(self, spec: Any) -> str:
        """What :meth:`opening_line` ends with (``"; contrasts: ..."``); nothing by default."""
        return ""

    @abstractmethod
    def tuning_line(self, spec: Any, budget: str, plan: StudyPlan) -> str:
        """Before a tuning phase."""

    def cell_tuning_line(self, spec: Any, budget: str, plan: StudyPlan) -> str:
        """Before the second tuning stage (``tune[-<budget>]-cells``)."""
        cells = len(dict(plan.grid)["@"])
        return f"phase {plan.name}: {cells} (cell, lr) points x {len(spec.lr_tuning.seeds)} seeds around each tuned lr"

    def extension_line(self, budget: str, round_: int, lrs: Rates) -> str:
        """Before a range-extension round: each edge cell's new η."""
        within = f" ({budget} budget)" if budget else ""
        return f"  range extension {round_}{within}: " + ", ".join(f"{k} lr={v:g}" for k, v in lrs.items())

    @abstractmethod
    def confirm_line(self, spec: Any, budget: str, plan: StudyPlan) -> str:
        """Before a confirmatory phase."""

    @abstractmethod
    def verdict_lines(self, spec: Any, verdict: Mapping[str, Any]) -> list[str]:
        """The printed verdict: the headline first (:func:`studies.kinds.printing.print_verdict`)."""

    def closing_lines(self, spent: Spent) -> list[str]:
        """After the verdict (``spent``: wall s, CPU h, GPU h)."""
        return []

    # ---- status

    @abstractmethod
    def status_fields(self, spec: Any, verdict: Mapping[str, Any] | None) -> dict[str, Any]:
        """The kind's own ``status`` fields, from ``verdict.json`` (None before there is one)."""

    @abstractmethod
    def status_row_fields(self, spec: Any, phase: str, trial: Any) -> dict[str, Any]:
        """The kind's own columns of a trial's ``status`` row."""


def _inputs(d: TunedDesign, records: Mapping[str, Any], checks: Mapping[str, Any]) -> dict[str, Any]:
    """What :meth:`TunedDesign.analyse` is handed besides the table: the kind's own inputs and
    ``adequacy``, the training-adequacy check's entries per budget (:mod:`studies.adequacy`)."""
    return {**d.analysis_inputs(records), "adequacy": dict(checks)}


def _stored_check(spec: Any, budget: str, lr: Rates, phases: Mapping[str, Sequence[Any]]) -> Any:
    """The budget's adequacy check read back from the study directory (``report``):
    :data:`studies.adequacy.NOT_MEASURED` when the spec has it off or its phase holds no trial."""
    from studies import adequacy

    trials = phases.get(adequacy.phase_of(budget)) or []
    if not adequacy.enabled(spec) or not trials:
        return adequacy.NOT_MEASURED
    return adequacy.measure(spec, budget, lr, trials, _tuning_of(phases, budget))


def _recording(run: Any, ran: list[Any]) -> Any:
    """``run`` (a ``run_points`` / ``run_refine``), its trials also added to ``ran``."""

    def recorded(*args: Any) -> Any:
        trials = list(run(*args))
        ran.extend(trials)
        return trials

    return recorded


def adequacy_line(spec: Any, budget: str, plan: StudyPlan) -> str:
    """Before the adequacy check's phase."""
    from studies.adequacy import FACTOR, check_seeds

    cells = len(dict(plan.grid)["@"])
    return (
        f"phase {plan.name}: {cells} cells at their tuned lr, {FACTOR}x the budget (and 1x where the "
        f"tuning lacks it) x {len(check_seeds(spec))} tuning seed(s): training adequacy"
    )


def adequacy_lines(entries: Any) -> list[str]:
    """One line per cell of the adequacy check: reached, gain, passed or under-trained."""
    if not isinstance(entries, Mapping):
        return [f"  training adequacy: {entries}"]
    out = []
    for cell, e in entries.items():
        if not isinstance(e, Mapping):
            out.append(f"  {cell}: adequacy {e}")
            continue
        reached = "n/a" if e.get("reached") is None else f"{e['reached']:.4g}"
        gain = "n/a" if e.get("gain") is None else f"{e['gain']:+.4g}"
        state = "passed" if e.get("passed") else "UNDER-TRAINED"
        if "below min_metric" in str(e.get("reason")):
            state += " (below min_metric)"
        out.append(f"  {cell}: reached {reached}, {gain} at twice the budget -> {state}")
    return out


def _tuning_of(phases: Mapping[str, Sequence[Any]], budget: str) -> list[Any]:
    """The budget's tuning trials (``tune[-<budget>]``, its extension rounds and refinement) among
    ``phases`` (read back from the study directory)."""
    stems = (phase_name("tune", budget), phase_name("tune", budget) + CELL_STAGE)
    return [
        t
        for name, ts in phases.items()
        for tune in stems
        if name == tune or name.startswith(f"{tune}-ext") or name == f"{tune}-refine"
        for t in ts
    ]


def select_cell_rates(
    spec: Any,
    grids: Mapping[str, LRGrid],
    reference: Mapping[str, Any],
    trials: Sequence[Any],
    *,
    run_points: Any = None,
    run_refine: Any = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The second tuning stage's selection (:meth:`~studies.schema.arms.ArmStudySpec.cell_grids`):
    each finer cell's η on its own grid from the stage's ``trials``, extended and refined as the
    first stage (:func:`studies.tuning.tune`). Returns the η per cell and the record: the first
    stage's entries (``reference``, each marked ``"stage": "reference"``) and each cell's (``"stage":
    "cell"``); a cell with no winner is left out."""
    from studies.adequacy import check_key

    lr, record = tuned_rates(
        list(grids),
        trials,
        cell_of=lambda t: check_key(spec, t.config),
        tuning=spec.lr_tuning,
        run_points=run_points,
        run_refine=run_refine,
        grids=grids,
    )
    cells = {cell: {**rec, "stage": "cell"} for cell, rec in record.items()}
    first = {cell: {**rec, "stage": "reference"} for cell, rec in reference.items()}
    return lr, {**first, **cells}


def _concat(tables: Sequence[Any]) -> Any:
    import pandas as pd

    if len(tables) == 1:
        return tables[0]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


@dataclass(frozen=True)
class _Running:
    """One ``run`` of a tuned design under way: its hooks, spec, study runner and environment."""

    d: TunedDesign
    spec: Any
    runner: Any
    environ: Environ

    def tuning_rounds(self, budget: str, ran: list[Any], stage: str = "") -> dict[str, Any]:
        """The budget's range-extension rounds and refinement (of the tuning stage ``stage``: ``""``
        or :data:`~studies.schema.arms.CELL_STAGE`), each run as its own tuning phase: the
        ``run_points`` and ``run_refine`` of :meth:`TunedDesign.select_learning_rates`; their trials
        are added to ``ran``."""
        d, spec, seeds = self.d, self.spec, len(self.spec.lr_tuning.seeds)
        rounds = self._rounds(budget, d, spec, seeds, stage)
        return {key: _recording(run, ran) for key, run in rounds.items()}

    def _rounds(self, budget: str, d: TunedDesign, spec: Any, seeds: int, stage: str) -> dict[str, Any]:
        env = self.environ
        return {
            "run_points": extension_runner(
                self.runner,
                lambda round_, lrs: spec.extension_plan(budget, round_, lrs, environ=env, stage=stage),
                seeds=seeds,
                line=lambda round_, lrs: d.extension_line(budget, round_, lrs),
                tag=d.TAG,
            ),
            "run_refine": refine_runner(
                self.runner,
                lambda lrs: spec.refine_plan(budget, lrs, environ=env, stage=stage),
                seeds=seeds,
                tag=d.TAG,
                label=f" ({budget} budget)" if budget else "",
            ),
        }

    def cell_stage(
        self, budget: str, lr: dict[str, float], record: dict[str, Any], ran: list[Any]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The second tuning stage where the spec has one (:meth:`~studies.schema.arms.ArmStudySpec.cell_grids`),
        run as ``tune[-<budget>]-cells`` (with its own extension rounds and refinement): the η per
        finer cell and the merged record; its trials are added to ``ran``. Else ``lr`` and ``record``."""
        grids = self.spec.cell_grids(lr)
        if not grids:
            return lr, record
        plan = self.spec.cell_tuning_plan(budget, grids, environ=self.environ)
        say(self.d.TAG, self.d.cell_tuning_line(self.spec, budget, plan))
        trials = list(self.runner.run(plan).trials)
        rounds = self.tuning_rounds(budget, trials, CELL_STAGE)
        out = select_cell_rates(self.spec, grids, record, trials, **rounds)
        ran.extend(trials)
        return out

    def adequacy(self, budget: str, lr: Rates, tuning: Sequence[Any]) -> Any:
        """The budget check (:mod:`studies.adequacy`), run as the phase ``tune[-<budget>]-adequacy``:
        each cell's entry, one line per cell printed; :data:`studies.adequacy.NOT_MEASURED` when the
        spec switches it off."""
        from studies import adequacy

        if not adequacy.enabled(self.spec):
            return adequacy.NOT_MEASURED
        plan = adequacy.adequacy_plan(self.spec, budget, lr, environ=self.environ)
        say(self.d.TAG, adequacy_line(self.spec, budget, plan))
        entries = adequacy.measure(self.spec, budget, lr, self.runner.run(plan).trials, tuning)
        for line in adequacy_lines(entries):
            say(self.d.TAG, line)
        return entries

    def confirm(
        self,
        budget: str,
        lr: Rates,
        record: Mapping[str, Any],
        *,
        look: int,
        arms: Sequence[str] | None = None,
    ) -> Any:
        """One confirmatory phase (a look of a sequential design) as a trials table; ``arms``: only
        these (per-arm stopping), ``None``: every arm."""
        d, spec = self.d, self.spec
        only = {} if arms is None else {"arms": list(arms)}
        plan = spec.confirmatory_plan(budget, lr, look=look, environ=self.environ, **only)
        say(d.TAG, d.confirm_line(spec, budget, plan))
        confirmed = self.runner.run(plan)
        table = d.confirm_table(spec, confirmed.trials, budget, record)
        d.after_confirm(spec, self.runner, plan.name, table)
        return table


class TunedDesignKind(FolderKind):
    """A kind whose ``run`` / ``status`` / ``report`` are the tuned-design pipeline (module docstring):
    a subclass sets the class attributes and :meth:`~studies.kinds.base.FolderKind.parts`, whose
    ``design`` is its folder's ``workflow.DESIGN`` (:class:`TunedDesign`)."""

    def design(self) -> TunedDesign:
        """The kind's hooks: ``parts().design`` (its ``workflow.DESIGN``)."""
        return cast(TunedDesign, self.parts().design)

    def phases(self, spec: Any) -> list[Phase]:
        """Per budget ``tune[-<budget>]``, the optional range-extension rounds ``...-ext<k>`` (run only
        while a tuned η sits on its grid's edge), the refinement ``...-refine`` (``lr_tuning.refine``
        rates per cell with an interior winner; counted by ``plan`` as if every winner were), then
        ``confirm[-<budget>]`` and a sequential design's optional later looks
        ``confirm[-<budget>]-look<j>``. The spec's η stands in for the tuned one (and the grid's top
        for an edge winner): the trial counts do not depend on them."""
        from studies import adequacy

        tuning = spec.lr_tuning
        grid = tuning.lr_grid()
        rounds = tuning.max_extensions if grid.extendable else 0
        around = refine_points(grid, grid.point(1), tuning.refine)  # around an interior winner
        cells = spec.tuning_cells
        edge, placeholder = (
            dict.fromkeys(cells, tuning.high),
            dict.fromkeys(spec.tuned_cells, spec.training.lr),
        )
        grids = spec.cell_grids(dict.fromkeys(cells, spec.training.lr))
        out = []
        for budget in spec.budget_names:
            out.append(Phase.of(spec.tuning_plan(budget)))
            out += [
                Phase.of(spec.extension_plan(budget, k, edge), optional=True) for k in range(1, rounds + 1)
            ]
            if around:
                out.append(Phase.of(spec.refine_plan(budget, dict.fromkeys(cells, around)), refine=True))
            if grids:
                out += self._cell_stage_phases(spec, budget, grids)
            if adequacy.enabled(spec):
                out.append(Phase.of(adequacy.adequacy_plan(spec, budget, placeholder)))
            out.append(Phase.of(spec.confirmatory_plan(budget, placeholder)))
            looks = range(2, n_looks(spec) + 1)  # a sequential design's looks after the first
            out += [Phase.of(spec.confirmatory_plan(budget, placeholder, look=j), look=True) for j in looks]
        return out

    @staticmethod
    def _cell_stage_phases(spec: Any, budget: str, grids: Mapping[str, LRGrid]) -> list[Phase]:
        """The second tuning stage's phases (for ``plan`` and ``status``): the cells' grids, their
        optional extension rounds and the refinement (counted as if every winner were interior)."""
        tuning = spec.lr_tuning
        out = [Phase.of(spec.cell_tuning_plan(budget, grids))]
        edge = {cell: g.next_point("high") for cell, g in grids.items() if g.extendable}
        out += [
            Phase.of(spec.extension_plan(budget, k, edge, stage=CELL_STAGE), optional=True)
            for k in range(1, tuning.max_extensions + 1)
            if edge
        ]
        around = {cell: refine_points(g, g.point(1), tuning.refine) for cell, g in grids.items()}
        if any(around.values()):
            out.append(Phase.of(spec.refine_plan(budget, around, stage=CELL_STAGE), refine=True))
        return out

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds, off the tuning seeds. The document re-validated is what was set
        (``exclude_unset``): a full dump would also carry fields the spec derives itself (the layer,
        the LR scaling), which it refuses as input."""
        return with_seeds(spec, k, taken=spec.lr_tuning.seeds)

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        return self.design().analyse(table, spec, **inputs)

    def alpha(self, spec: Any) -> float:
        return float(spec.analysis.alpha)

    # ---- run ------------------------------------------------------------------------------------

    def run(self, spec: Any, *, environ: Environ = None, **runner_options: Any) -> StudyOutcome:
        """Every phase, the analysis, the outputs written and logged; idempotent (a rerun resumes).
        ``runner_options``: :data:`studies.kinds.study_runner.RUNNER_OPTIONS`."""
        from studies.tuning import tuned_lines

        d = self.design()
        study = spec.study_plan(environ=environ)
        say(d.TAG, d.opening_line(spec))
        records: dict[str, Any] = {}
        checks: dict[str, Any] = {}
        tuned: dict[str, dict[str, float]] = {}
        tables: list[Any] = []
        sequential = getattr(spec, "sequential", None)
        with study_runner(study, expected_trials=spec.total_trials, **runner_options) as runner:
            r = _Running(d, spec, runner, environ)
            for budget in spec.budget_names:
                plan = spec.tuning_plan(budget, environ=environ)
                say(d.TAG, d.tuning_line(spec, budget, plan))
                trials = list(runner.run(plan).trials)
                lr, record = d.select_learning_rates(spec, trials, **r.tuning_rounds(budget, trials))
                lr, record = r.cell_stage(budget, lr, record, trials)
                records[budget] = record
                for line in tuned_lines(record):
                    say(d.TAG, line)
                d.check_tuned(spec, lr)
                tuned[budget] = lr
                checks[budget] = r.adequacy(budget, lr, trials)
                if sequential is None:
                    tables.append(r.confirm(budget, lr, record, look=1))
            if sequential is not None:
                looks = BudgetLooks(
                    spec,
                    confirm=lambda b, j, arms: r.confirm(b, tuned[b], records[b], look=j, arms=arms),
                    analyse=lambda ts: d.analyse(_concat(ts), spec, **_inputs(d, records, checks)),
                    look_arms=lambda verdict, b: d.look_arms(spec, verdict, b),
                )
                run_looks(looks, sequential=sequential, seeds=spec.seeds, runner=runner, tag=d.TAG)
                tables = looks.tables
            say(d.TAG, d.ANALYSIS_LINE)
            table = _concat(tables)
            verdict = d.analyse(table, spec, **_inputs(d, records, checks))
            cpu_h, gpu_h = runner.resource_hours()
            cost = (runner.wall_time_s, cpu_h, gpu_h)
            files = self._outputs(d, spec, verdict, table, runner.local_dir(), records, cost)
            log_study_outputs(
                runner,
                spec,
                files,
                tags=d.verdict_tags(verdict),
                metrics=d.verdict_metrics(verdict),
                verdict=verdict,
            )
        print_verdict(d.TAG, verdict, d.verdict_lines(spec, verdict), runner)
        for line in d.closing_lines((runner.wall_time_s, cpu_h, gpu_h)):
            say(d.TAG, line)
        verdicts, tuned_lr = d.outcome_summary(verdict, records)
        return study_outcome(spec, runner, verdict, table, files, verdicts=verdicts, tuned_lr=tuned_lr)

    def _outputs(
        self,
        d: TunedDesign,
        spec: Any,
        verdict: dict[str, Any],
        table: Any,
        out_dir: Path,
        records: Mapping[str, Any],
        cost: Spent,
    ) -> dict[str, Path]:
        """The verdict's ``scope`` (:mod:`studies.scope`: the confirmatory trials' data, model and
        budget, the arms' mean metric) and ``execution`` (stacked or not, the arms that fall back), the
        kind's output files, then ``lr_tuning.json``: the tuning record per budget (strict JSON), the
        record itself for a kind of one unnamed budget (``""``)."""
        from studies.reporting import write_json
        from studies.scope import execution_record, study_scope

        looks = {
            phase_name("confirm", budget, j)
            for budget in spec.budget_names
            for j in range(1, n_looks(spec) + 1)
        }
        configs = [c for phase in self.phases(spec) if phase.name in looks for c in phase.configs]
        verdict["scope"] = study_scope(configs, table, metric=spec.analysis.metric, gpu_hours=cost[2])
        verdict["execution"] = execution_record(
            spec.execution.stack, {arm: spec.base_config(arm=arm) for arm in spec.arm_names}
        )
        files = d.write_outputs(Analysed(spec, verdict, table, records, cost), out_dir)
        doc = records[""] if list(records) == [""] else records
        files = {**files, **self._plots(spec, sorted(looks), records, out_dir, files.get("markdown"))}
        return {**files, "lr_tuning": write_json(out_dir / "lr_tuning.json", dict(doc))}

    def _plots(
        self,
        spec: Any,
        confirm_phases: Sequence[str],
        records: Mapping[str, Any],
        out_dir: Path,
        report: Path | None,
    ) -> dict[str, Path]:
        """``lr_tuning.png`` and ``learning_curves.png`` (:mod:`studies.plots`) in the study
        directory, linked from the report's end; logged with the other outputs."""
        from studies.plots import write_study_plots
        from studies.study_dir import StudyDir
        from workers.results import read_trials

        where = StudyDir.of(spec)
        trials = [
            (arm_of(t), t)
            for name in confirm_phases
            for t in read_trials(where.phase_plan(name), history=True)
        ]
        return write_study_plots(records, trials, out_dir, metric=spec.lr_tuning.metric, report=report)

    # ---- status / report, from the study directory ---------------------------------------------

    def status(self, spec: Any) -> dict[str, Any]:
        """Progress of every phase from the study directory (extension rounds and looks that ran add
        their trials to ``expected_trials``: each changed the count)."""
        d = self.design()
        planned = self.phases(spec)
        phases = read_phase_trials(planned, spec)
        fields, verdict = phase_status(planned, spec, phases)
        return {
            **fields,
            **d.status_fields(spec, verdict),
            "rows": [
                status_row(name, t, **d.status_row_fields(spec, name, t))
                for name, ts in phases.items()
                for t in ts
            ],
        }

    def report(self, spec: Any, out_dir: Path) -> Path:
        """Re-analyse the finished phases from the study directory (the tuning replayed with its
        extension rounds and refinement read back) and write the report files, ``verdict.json``
        among them."""
        import dataclasses
        import math

        d = self.design()
        phases = read_phase_trials(self.phases(spec), spec)
        wall_time_s = math.nan
        if d.REPORT_READS_RUN:
            run_ids, wall_time_s = original_run(spec, "trials.csv")
            phases = {
                name: [
                    dataclasses.replace(t, mlflow_run_id=t.mlflow_run_id or run_ids.get(t.trial_id))
                    for t in ts
                ]
                for name, ts in phases.items()
            }
        last = n_looks(spec)
        records: dict[str, Any] = {}
        checks: dict[str, Any] = {}
        tables = []
        for budget in spec.budget_names:
            tune = phase_name("tune", budget)
            lr, record = d.select_learning_rates(
                spec,
                phases[tune],
                run_points=stored_rounds(spec, f"{tune}-ext"),
                run_refine=stored_refinement(spec, f"{tune}-refine"),
            )
            grids = spec.cell_grids(lr)
            if grids:
                cells = f"{tune}{CELL_STAGE}"
                lr, record = select_cell_rates(
                    spec,
                    grids,
                    record,
                    phases.get(cells) or [],
                    run_points=stored_rounds(spec, f"{cells}-ext"),
                    run_refine=stored_refinement(spec, f"{cells}-refine"),
                )
            records[budget] = record
            checks[budget] = _stored_check(spec, budget, lr, phases)
            looks = {phase_name("confirm", budget, j) for j in range(1, last + 1)}
            trials = [t for name, ts in phases.items() if name in looks for t in ts]
            tables.append(d.confirm_table(spec, trials, budget, record))
        table = _concat(tables)
        verdict = d.analyse(table, spec, **_inputs(d, records, checks))
        out_dir.mkdir(parents=True, exist_ok=True)
        files = self._outputs(d, spec, verdict, table, out_dir, records, spent(spec, phases, wall_time_s))
        return files.get("markdown", out_dir / "report.md")
