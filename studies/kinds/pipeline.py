"""The tuned-design pipeline: one ``run``, ``status`` and ``report`` for every kind that tunes η first.

A tuned-design kind (``batchsize``, ``compare``) runs, per *budget* (the batch-size kind's
``epochs`` / ``updates``; one unnamed budget ``""`` elsewhere): its tuning phase, the range-extension rounds
while a tuned η sits on its grid's edge, its confirmatory phase (or a sequential design's looks);
then it analyses every confirmatory trial, writes its outputs, logs them on the study run and prints
the verdict. ``report`` replays the same steps from the study directory: the tuning (extension rounds
read back, not run), the confirmatory trials, the analysis and the outputs.

:class:`TunedDesignKind` implements those :class:`~studies.kinds.contract.StudyKind` methods once;
what differs between kinds is a :class:`TunedDesign`, the kind's workflow module (its plans, its
tables and analysis, its output files, its verdict tags and metrics, the lines it prints), which
:meth:`TunedDesignKind.design` imports when a method needs it (Ray and pandas stay out of the
registry's imports).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from studies.kinds.contract import StudyKind, StudyOutcome
from studies.kinds.kit import (
    extension_runner,
    log_study_outputs,
    original_run,
    phase_status,
    print_verdict,
    read_phase_trials,
    say,
    spent,
    status_row,
    stored_rounds,
    study_outcome,
    study_runner,
)
from workers.plan import StudyPlan

__all__ = ["TunedDesign", "TunedDesignKind", "all_decided"]

Spent = tuple[float, float, float]


class TunedDesign(Protocol):
    """A tuned-design kind's hooks: what its workflow module defines (a module is the implementation).

    Attributes:
        TAG: the ``[<tag>]`` of its printed lines.
        ANALYSIS_LINE: the line printed before the analysis.
        REPORT_READS_RUN: ``report`` takes each trial's MLflow run id and the wall time from the
            outputs the run wrote (``trials.csv``, ``verdict.json``); otherwise they stay unknown.
    """

    TAG: str
    ANALYSIS_LINE: str
    REPORT_READS_RUN: bool

    # ---- phases
    def budgets(self, spec: Any) -> Sequence[str]: ...
    def tune_name(self, spec: Any, budget: str) -> str: ...
    def look_name(self, spec: Any, budget: str, look: int) -> str: ...
    def tuning_plan(self, spec: Any, budget: str, environ: Mapping[str, str] | None) -> StudyPlan: ...
    def extension_plan(
        self, spec: Any, budget: str, round_: int, lrs: Mapping[str, float], environ: Mapping[str, str] | None
    ) -> StudyPlan: ...
    def confirm_plan(
        self, spec: Any, budget: str, lr: Mapping[str, float], look: int, environ: Mapping[str, str] | None
    ) -> StudyPlan: ...

    # ---- tuning, the confirmatory table, the analysis
    def select_learning_rates(
        self, spec: Any, trials: Sequence[Any], *, run_points: Any = None
    ) -> tuple[dict[str, float], dict[str, Any]]: ...
    def check_tuned(self, spec: Any, lr: Mapping[str, float]) -> None: ...
    def confirm_table(
        self, spec: Any, trials: Sequence[Any], budget: str, record: Mapping[str, Any]
    ) -> Any: ...
    def after_confirm(self, spec: Any, runner: Any, phase: str, table: Any) -> None: ...
    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]: ...
    def analysis_inputs(self, records: Mapping[str, Any]) -> dict[str, Any]: ...

    # ---- outputs
    def write_outputs(
        self,
        spec: Any,
        verdict: dict[str, Any],
        table: Any,
        out_dir: Path,
        records: Mapping[str, Any],
        spent: Spent,
    ) -> dict[str, Path]: ...
    def verdict_tags(self, verdict: Mapping[str, Any]) -> dict[str, str]: ...
    def verdict_metrics(self, verdict: Mapping[str, Any]) -> dict[str, float]: ...
    def outcome_summary(
        self, verdict: Mapping[str, Any], records: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Any]: ...

    # ---- printed lines
    def opening_line(self, spec: Any) -> str: ...
    def tuning_line(self, spec: Any, budget: str, plan: StudyPlan) -> str: ...
    def extension_line(self, budget: str, round_: int, lrs: Mapping[str, float]) -> str: ...
    def confirm_line(self, spec: Any, budget: str, plan: StudyPlan) -> str: ...
    def verdict_lines(self, spec: Any, verdict: Mapping[str, Any]) -> list[str]: ...
    def closing_lines(self, spent: Spent) -> list[str]: ...

    # ---- status
    def status_fields(self, spec: Any, verdict: Mapping[str, Any] | None) -> dict[str, Any]: ...
    def status_row_fields(self, spec: Any, phase: str, trial: Any) -> dict[str, Any]: ...


def all_decided(verdict: Mapping[str, Any]) -> bool:
    """Every sequential hypothesis of the last look is decided (rejected or futile)."""
    looks = verdict.get("looks") or []
    if not looks:
        return False
    return all(h["decision"] in ("reject", "futile") for h in looks[-1]["hypotheses"].values())


def _concat(tables: Sequence[Any]) -> Any:
    import pandas as pd

    if len(tables) == 1:
        return tables[0]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


class TunedDesignKind(StudyKind):
    """A kind whose ``run`` / ``status`` / ``report`` are the tuned-design pipeline (module docstring):
    a subclass sets the class attributes, :meth:`spec_class`, :meth:`phases` and :meth:`design`."""

    @abstractmethod
    def design(self) -> TunedDesign:
        """The kind's hooks: its workflow module, imported here (heavy)."""

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        return self.design().analyse(table, spec, **inputs)

    def alpha(self, spec: Any) -> float:
        return float(spec.analysis.alpha)

    # ---- run ------------------------------------------------------------------------------------

    def run(
        self, spec: Any, *, environ: Mapping[str, str] | None = None, **runner_options: Any
    ) -> StudyOutcome:
        """Every phase, the analysis, the outputs written and logged; idempotent (a rerun resumes).
        ``runner_options``: :data:`studies.kinds.kit.RUNNER_OPTIONS`."""
        from studies.tuning import tuned_lines

        d = self.design()
        study = spec.study_plan(environ=environ)
        say(d.TAG, d.opening_line(spec))
        records: dict[str, Any] = {}
        tuned: dict[str, dict[str, float]] = {}
        tables: list[Any] = []
        sequential = getattr(spec, "sequential", None)
        with study_runner(study, expected_trials=spec.total_trials, **runner_options) as runner:
            for budget in d.budgets(spec):
                plan = d.tuning_plan(spec, budget, environ)
                say(d.TAG, d.tuning_line(spec, budget, plan))
                trials = runner.run(plan).trials
                lr, record = d.select_learning_rates(
                    spec, trials, run_points=self._extension_runner(d, spec, runner, budget, environ)
                )
                records[budget] = record
                for line in tuned_lines(record):
                    say(d.TAG, line)
                d.check_tuned(spec, lr)
                tuned[budget] = lr
                if sequential is None:
                    tables.append(self._confirm(d, spec, runner, budget, lr, record, look=1, environ=environ))
            if sequential is not None:
                tables = self._run_looks(d, spec, runner, tuned, records, environ=environ)
            say(d.TAG, d.ANALYSIS_LINE)
            table = _concat(tables)
            verdict = d.analyse(table, spec, **d.analysis_inputs(records))
            cpu_h, gpu_h = runner.resource_hours()
            cost = (runner.wall_time_s, cpu_h, gpu_h)
            files = self._outputs(d, spec, verdict, table, runner.local_dir(), records, cost)
            log_study_outputs(
                runner, spec, files, tags=d.verdict_tags(verdict), metrics=d.verdict_metrics(verdict)
            )
        print_verdict(d.TAG, verdict, d.verdict_lines(spec, verdict), runner)
        for line in d.closing_lines((runner.wall_time_s, cpu_h, gpu_h)):
            say(d.TAG, line)
        verdicts, tuned_lr = d.outcome_summary(verdict, records)
        return study_outcome(spec, runner, verdict, table, files, verdicts=verdicts, tuned_lr=tuned_lr)

    @staticmethod
    def _extension_runner(
        d: TunedDesign, spec: Any, runner: Any, budget: str, environ: Mapping[str, str] | None
    ) -> Any:
        return extension_runner(
            runner,
            lambda round_, lrs: d.extension_plan(spec, budget, round_, lrs, environ),
            seeds=len(spec.lr_tuning.seeds),
            line=lambda round_, lrs: d.extension_line(budget, round_, lrs),
            tag=d.TAG,
        )

    @staticmethod
    def _confirm(
        d: TunedDesign,
        spec: Any,
        runner: Any,
        budget: str,
        lr: Mapping[str, float],
        record: Mapping[str, Any],
        *,
        look: int,
        environ: Mapping[str, str] | None,
    ) -> Any:
        """One confirmatory phase (a look of a sequential design) as a trials table."""
        plan = d.confirm_plan(spec, budget, lr, look, environ)
        say(d.TAG, d.confirm_line(spec, budget, plan))
        confirmed = runner.run(plan)
        table = d.confirm_table(spec, confirmed.trials, budget, record)
        d.after_confirm(spec, runner, plan.name, table)
        return table

    def _run_looks(
        self,
        d: TunedDesign,
        spec: Any,
        runner: Any,
        tuned: Mapping[str, Mapping[str, float]],
        records: Mapping[str, Any],
        *,
        environ: Mapping[str, str] | None,
    ) -> list[Any]:
        """The confirmatory seeds in looks (every budget per look): after each, the anytime-valid
        test of every hypothesis; no more seeds once every one is decided. A look already in the study
        directory (a resumed study) and every look of an explicit ``sequential.looks`` schedule
        (``extend``) run whatever the decisions, so a rerun repeats the study and an extension adds
        exactly its seeds."""
        from studies.sequential import look_seeds
        from studies.study_dir import StudyDir
        from workers.results import read_trials

        schedule = spec.sequential.schedule()
        where = StudyDir.of(spec)
        budgets = list(d.budgets(spec))
        tables: list[Any] = []
        for j in range(1, len(schedule) + 1):
            for budget in budgets:
                tables.append(
                    self._confirm(
                        d, spec, runner, budget, tuned[budget], records[budget], look=j, environ=environ
                    )
                )
            if j == len(schedule):
                break
            verdict = d.analyse(_concat(tables), spec, **d.analysis_inputs(records))
            state = {
                k: h["decision"] for k, h in (verdict.get("looks") or [{}])[-1].get("hypotheses", {}).items()
            }
            say(
                d.TAG,
                f"look {j} ({schedule[j - 1]} seeds): " + ", ".join(f"{k} {v}" for k, v in state.items()),
            )
            ran_before = bool(
                read_trials(where.phase_plan(d.look_name(spec, budgets[0], j + 1)), history=False)
            )
            if all_decided(verdict) and not ran_before and spec.sequential.looks is None:
                say(
                    d.TAG,
                    f"every hypothesis decided after {schedule[j - 1]} of {spec.sequential.max_seeds} seeds: stop",
                )
                break
            runner.set_expected_trials(
                runner.expected_trials
                + len(dict(look_seeds(spec.seeds, schedule))[j + 1]) * spec.trials_per_seed
            )
        return tables

    @staticmethod
    def _outputs(
        d: TunedDesign,
        spec: Any,
        verdict: dict[str, Any],
        table: Any,
        out_dir: Path,
        records: Mapping[str, Any],
        cost: Spent,
    ) -> dict[str, Path]:
        """The kind's output files, then ``lr_tuning.json``: the tuning record per budget (strict
        JSON), the record itself for a kind of one unnamed budget (``""``)."""
        from studies.reporting import write_json

        files = d.write_outputs(spec, verdict, table, out_dir, records, cost)
        doc = records[""] if list(records) == [""] else records
        return {**files, "lr_tuning": write_json(out_dir / "lr_tuning.json", dict(doc))}

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
        extension rounds read back) and write the report files, ``verdict.json`` among them."""
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
        n_looks = len(spec.sequential.schedule()) if getattr(spec, "sequential", None) is not None else 1
        records: dict[str, Any] = {}
        tables = []
        for budget in d.budgets(spec):
            tune = d.tune_name(spec, budget)
            _, record = d.select_learning_rates(
                spec, phases[tune], run_points=stored_rounds(spec, f"{tune}-ext")
            )
            records[budget] = record
            looks = {d.look_name(spec, budget, j) for j in range(1, n_looks + 1)}
            trials = [t for name, ts in phases.items() if name in looks for t in ts]
            tables.append(d.confirm_table(spec, trials, budget, record))
        table = _concat(tables)
        verdict = d.analyse(table, spec, **d.analysis_inputs(records))
        out_dir.mkdir(parents=True, exist_ok=True)
        files = self._outputs(d, spec, verdict, table, out_dir, records, spent(spec, phases, wall_time_s))
        return files.get("markdown", out_dir / "report.md")
