"""The helpers a kind's methods share (the contract itself is :mod:`studies.contract`).

Building the study runner, reading each phase's trials back from the study directory, the ``status``
fields and rows every arm design shows, the cost spent, logging a finished study's outputs and its
:class:`~studies.contract.StudyOutcome`. Light on imports: what needs Ray or MLflow is imported
inside the function that needs it.
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.contract import Phase, StudyKind, StudyOutcome
from workers.plan import StudyPlan

__all__ = [
    "RUNNER_OPTIONS",
    "FolderKind",
    "KindParts",
    "arm_of",
    "chance_levels",
    "extended_spec",
    "extension_runner",
    "finite_metrics",
    "hypothesis_entry",
    "log_study_outputs",
    "metric_value",
    "original_run",
    "phase_status",
    "print_verdict",
    "read_phase_trials",
    "refine_runner",
    "run_outcome",
    "say",
    "sequential_design",
    "spent",
    "status_row",
    "stored_refinement",
    "stored_rounds",
    "study_outcome",
    "study_runner",
    "study_wall_s",
    "trial_row",
    "verdict_tags",
    "with_seeds",
]


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


def read_phase_trials(phases: Sequence[Phase], spec: Any, *, history: bool = False) -> dict[str, list[Any]]:
    """Each of ``phases``' trials (``workers.runner.TrialRecord``) read back from the study directory, by
    phase name in run order, each with its ``name`` (its MLflow run's, from the phase's run-name
    template); an optional phase (an extension round, a later look) that never ran is left out."""
    import dataclasses

    from studies.study_dir import StudyDir
    from workers.results import read_trials
    from workers.tracking.names import record_run_name

    where = StudyDir.of(spec)
    out = {}
    for phase in phases:
        trials = [
            dataclasses.replace(
                t,
                name=record_run_name(
                    phase.plan.run_name, plan_name=phase.name, trial_id=t.trial_id, config=t.config
                ),
            )
            for t in read_trials(where.phase_plan(phase.name), history=history)
        ]
        if trials or not phase.optional:  # an extension round that never ran is not a phase
            out[phase.name] = trials
    return out


def stored_rounds(spec: Any, prefix: str) -> Any:
    """A :data:`studies.tuning.RunPoints` that reads range-extension round ``k`` back from the study
    directory (the phase ``<prefix><k>``, e.g. ``tune-ext2``) instead of running it (report, status)."""
    return _stored(spec, lambda round_, lrs: f"{prefix}{round_}")


def stored_refinement(spec: Any, phase: str) -> Any:
    """A :data:`studies.tuning.RefinePoints` that reads the learning-rate refinement back from the
    study directory (the phase ``phase``, e.g. ``tune-refine``) instead of running it (report)."""
    return _stored(spec, lambda lrs: phase)


def _stored(spec: Any, phase_of: Callable[..., str]) -> Callable[..., list[Any]]:
    """Reads the phase ``phase_of(*args)`` back from the study directory for ``(*args)``."""
    from studies.study_dir import StudyDir
    from workers.results import read_trials

    where = StudyDir.of(spec)

    def read(*args: Any) -> list[Any]:
        return read_trials(where.phase_plan(phase_of(*args)), history=False)

    return read


def phase_status(
    planned: Sequence[Phase], spec: Any, phases: Mapping[str, list[Any]]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``status`` fields a fixed-design kind shares (``study`` ... ``study_verdict``), from
    :func:`read_phase_trials`'s ``phases``, and the study's ``verdict.json`` (None before there is
    one) for the kind's own fields. ``expected_trials`` is ``spec.total_trials`` plus the trials of
    the optional phases that ran (each raised the count)."""
    import json
    from collections import Counter

    from studies.study_dir import StudyDir

    optional = {p.name for p in planned if p.optional}
    every = [t for ts in phases.values() for t in ts]
    text = StudyDir.of(spec).read_text("verdict.json")
    verdict = json.loads(text) if text else None
    fields = {
        "study": spec.name,
        "kind": spec.kind,
        "directory": StudyDir.of(spec).uri,
        "expected_trials": spec.total_trials + sum(len(ts) for n, ts in phases.items() if n in optional),
        "trials": len(every),
        "by_status": dict(Counter(t.status for t in every)),
        "phases": {
            name: {"trials": len(ts), "by_status": dict(Counter(t.status for t in ts))}
            for name, ts in phases.items()
        },
        "study_verdict": verdict.get("study_verdict") if verdict else None,
        "wall_s": study_wall_s(verdict),
    }
    return fields, verdict


def study_wall_s(verdict: Mapping[str, Any] | None) -> float | None:
    """The study's wall time in seconds as its run wrote it into ``verdict.json`` (``resources``'
    ``wall_time_s``, :meth:`workers.study.StudyRunner.cost`); ``None`` before the study finished."""
    value = ((verdict or {}).get("resources") or {}).get("wall_time_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def arm_of(trial: Any) -> str:
    """The arm of an arm design's trial: its ``model.layer.type``."""
    return str(trial.config["model"]["layer"]["type"])


def metric_value(trial: Any, metric: str) -> float:
    """A trial's last reported ``metric`` as a float (NaN when it reported none, or a non-number)."""
    v = trial.metrics.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")


def trial_row(trial: Any, metric: str, cell: Mapping[str, Any], tuned: Mapping[str, Any]) -> dict[str, Any]:
    """One row of an arm design's trials table: the trial's ``cell`` (arm, seed, ...), its ``status``,
    its last ``metric`` and ``train_loss`` (:func:`metric_value`), what it ran with (``tuned``: its η,
    ...), then ``epochs_done``, ``time_total_s``, ``trial_id`` and ``mlflow_run_id``."""
    return {
        **cell,
        "status": trial.status,
        metric: metric_value(trial, metric),
        "train_loss": metric_value(trial, "train_loss"),
        **tuned,
        "epochs_done": trial.metrics.get("epoch"),
        "time_total_s": float(trial.metrics.get("time_total_s") or 0.0),
        "trial_id": trial.trial_id,
        "mlflow_run_id": trial.mlflow_run_id,
    }


def finite_metrics(pairs: Iterable[tuple[str, Any]]) -> dict[str, float]:
    """The ``(name, value)`` pairs whose value is a finite number (a bool is none), as run metrics."""
    return {
        name: float(v)
        for name, v in pairs
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def verdict_tags(
    verdict: Mapping[str, Any], labels: Mapping[str, Mapping[str, Any]], reasons: Mapping[str, Any]
) -> dict[str, str]:
    """A study run's verdict tags: ``<prefix>/<name>`` for each ``labels[prefix]`` (name -> label, e.g.
    ``verdict/<arm>``), ``verdict/study``, then a ``reasons/<name>`` per name with ``reasons``, them
    joined by ``; `` (at most 5,000 characters, MLflow's limit for a tag)."""
    tags = {
        f"{prefix}/{name}": str(label) for prefix, named in labels.items() for name, label in named.items()
    }
    tags["verdict/study"] = str(verdict.get("study_verdict", "inconclusive"))
    tags.update(
        {f"reasons/{name}": "; ".join(str(r) for r in rs)[:5000] for name, rs in reasons.items() if rs}
    )
    return tags


def status_row(phase: str, trial: Any, **fields: Any) -> dict[str, Any]:
    """One row of an arm design's ``status`` table: phase, trial (its MLflow run's name, as
    :func:`read_phase_trials` reads it; Tune's id when it has none), status, arm, seed, lr, then
    ``fields``."""
    return {
        "phase": phase,
        "trial": getattr(trial, "name", None) or trial.trial_id,
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
    verdict: Mapping[str, Any] | None = None,
) -> None:
    """A finished study's output files into its directory (when remote) and onto its MLflow run, with
    the verdict ``tags`` (and the ``autonorm.scope.*`` tags of ``verdict``'s scope) and ``metrics``
    and the analysed metric as a param (the wall time and the resource hours are the runner's own
    ``actual_*`` metrics)."""
    from studies.scope import scope_tags

    runner.publish(files.values())
    runner.log_outputs(
        files=files.values(),
        tags={**tags, **scope_tags((verdict or {}).get("scope"))},
        metrics=metrics,
        params={"analysis_metric": spec.analysis.metric},
    )


def study_outcome(
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
    its ``study_verdict``, the kind's ``verdicts`` (e.g. per arm or per contrast), the trials run in
    every phase and the wall time (:meth:`workers.study.StudyRunner.cost`: the numbers of
    ``verdict.json``, the report, ``status`` and ``ls``), the confirmatory trials by status
    (``table``'s ``status`` column), ``tuned_lr`` and where the run lives."""
    from collections import Counter

    counts = Counter(str(s) for s in table["status"]) if not table.empty else Counter()
    cost = runner.cost()
    summary = {
        "study": spec.name,
        "study_verdict": verdict.get("study_verdict"),
        **verdicts,
        "trials": int(cost["trials"]),
        "wall_s": cost["wall_time_s"],
        "confirmatory_trials": dict(counts),
        "tuned_lr": tuned_lr,
        "parent_run_id": runner.run_id,
        "tracking_uri": runner.tracking_uri,
        "study_dir": runner.study_uri,
    }
    return run_outcome(spec, runner, summary=summary, verdict=verdict, files=files)


def run_outcome(spec: Any, runner: Any, *, parent_run_id: str | None = None, **results: Any) -> StudyOutcome:
    """The :class:`StudyOutcome` of a finished ``run``: the study, where ``runner`` put it (its
    directory, tracking store and study run, or ``parent_run_id``) and ``results`` (``summary``,
    ``verdict``, ``files``)."""
    run_id = parent_run_id or runner.run_id
    return StudyOutcome(spec.kind, spec.name, runner.study_uri, runner.tracking_uri, run_id, **results)


def say(tag: str, message: str) -> None:
    """One progress line of a study run: ``[<tag>] <message>``, flushed."""
    print(f"[{tag}] {message}", flush=True)


def print_verdict(tag: str, verdict: Mapping[str, Any], lines: Sequence[str], runner: Any) -> None:
    """A finished study's verdict as printed: ``lines[0]`` (the headline), its scope (what it was
    decided on, :func:`studies.scope.scope_line`), the exploratory note when
    the design is exploratory, the rest of ``lines``, then where the outputs and the MLflow run are."""
    from studies.scope import scope_line

    say(tag, lines[0])
    if verdict.get("scope"):
        say(tag, f"scope: {scope_line(verdict['scope'])}")
    if verdict.get("exploratory"):
        say(tag, "exploratory: underpowered by design (see reasons); no claim either way")
    for line in lines[1:]:
        say(tag, line)
    say(tag, f"outputs in {runner.study_uri}; MLflow run {runner.run_id} ({runner.tracking_uri})")


def chance_levels(spec: Any) -> tuple[float, float] | None:
    """Chance accuracy 1/C and chance loss ln C of the study's data; ``None`` without classes
    (regression)."""
    from studies.schema import data_classes

    c = data_classes(spec.data)
    return (1.0 / c, math.log(c)) if c else None


def sequential_design(sequential: Any, seeds: Sequence[Any]) -> dict[str, Any] | None:
    """The sequential design an analysis replays (looks, seed order, min effect, prior scale) of a
    ``sequential:`` section over the confirmatory ``seeds`` (``None``: a fixed design)."""
    if sequential is None:
        return None
    return {
        "looks": list(sequential.schedule()),
        "seed_order": list(seeds),
        "min_effect": sequential.min_effect,
        "prior_scale": sequential.prior_scale,
    }


def _section(doc: dict[str, Any], section: str | None) -> dict[str, Any]:
    if section is None:
        return doc
    inner: dict[str, Any] = doc.setdefault(section, {})
    return inner


def with_seeds(spec: Any, k: int, *, taken: Iterable[int], start: int = 0, section: str | None = None) -> Any:
    """``spec`` with ``k`` confirmatory seeds (``seeds``, or ``<section>.seeds``): the first integers
    from ``start`` not in ``taken``. The document re-validated is what was set (``exclude_unset``): a
    full dump would also carry fields the spec derives itself, which it refuses as input."""
    doc = spec.model_dump(mode="json", exclude_unset=True)
    off = set(taken)
    _section(doc, section)["seeds"] = list(
        itertools.islice((s for s in itertools.count(start) if s not in off), k)
    )
    return type(spec).model_validate(doc)


def extended_spec(
    spec: Any,
    seeds: int,
    verdict: Mapping[str, Any],
    *,
    confirmatory: Sequence[int],
    taken: Iterable[int],
    section: str | None = None,
) -> Any:
    """The spec of ``extend``: the ``confirmatory`` seeds used so far, then ``seeds`` new ones (the
    next integers above those and every seed in ``taken``: the other phases' seeds), the looks made
    so far kept as looks (``spec.sequential``)."""
    from studies.sequential import ExtendRefused

    assert spec.sequential is not None
    used = int(verdict.get("seeds_used") or 0)
    done = [int(look["n_seeds"]) for look in verdict.get("looks") or []]
    if not used or not done:
        raise ExtendRefused("the study's verdict.json records no looks: resume it first, then extend")
    top = max([*confirmatory[:used], *taken]) + 1
    doc = spec.to_document()
    _section(doc, section)["seeds"] = [*confirmatory[:used], *range(top, top + seeds)]
    doc["sequential"] = spec.sequential.extended(done, seeds).model_dump(mode="json")
    return type(spec).model_validate(doc)


def extension_runner(
    runner: Any,
    plan_of: Callable[[int, Mapping[str, float]], StudyPlan],
    *,
    seeds: int,
    line: Callable[[int, Mapping[str, float]], str],
    tag: str,
) -> Any:
    """A :data:`studies.tuning.RunPoints` that runs range-extension round ``k`` as its own tuning
    phase (``plan_of(k, lrs)``: ordinary tuning trials, MLflow runs under the study run, resumable,
    listed by ``status``), raising the study's trial count by ``seeds`` per rate and printing ``line``."""

    def run_points(round_: int, lrs: Mapping[str, float]) -> list[Any]:
        return _run_tuning(runner, plan_of(round_, lrs), tag, line(round_, lrs), added=len(lrs) * seeds)

    return run_points


def _run_tuning(runner: Any, plan: StudyPlan, tag: str, line: str, *, added: int) -> list[Any]:
    """An extra tuning phase, run: ``line`` printed, the study's trial count raised by ``added``."""
    say(tag, line)
    runner.set_expected_trials(runner.expected_trials + added)
    return list(runner.run(plan).trials)


def refine_runner(
    runner: Any,
    plan_of: Callable[[Mapping[str, Sequence[float]]], StudyPlan],
    *,
    seeds: int,
    tag: str,
    label: str = "",
) -> Any:
    """A :data:`studies.tuning.RefinePoints` that runs the learning-rate refinement as its own
    tuning phase (``plan_of(lrs)``: ordinary tuning trials, resumable, listed by ``status``),
    raising the study's trial count by ``seeds`` per rate and printing one line (``label``: e.g.
    the budget)."""

    def run_refine(lrs: Mapping[str, Sequence[float]]) -> list[Any]:
        rates = ", ".join(f"{cell} lr={'/'.join(f'{lr:g}' for lr in v)}" for cell, v in lrs.items())
        added = sum(len(v) for v in lrs.values()) * seeds
        return _run_tuning(runner, plan_of(lrs), tag, f"  lr refinement{label}: {rates}", added=added)

    return run_refine


def original_run(spec: Any, table_file: str) -> tuple[dict[str, str], float]:
    """What only the run itself knew, from the outputs it wrote to the study directory: each trial's
    MLflow run id (its ``table_file``, e.g. ``trials.csv``) and the study's wall time (its
    ``verdict.json``); empty / NaN when the run wrote none yet."""
    import io
    import json

    import pandas as pd

    from studies.study_dir import StudyDir

    where = StudyDir.of(spec)
    run_ids: dict[str, str] = {}
    text = where.read_text(table_file)
    if text:
        df = pd.read_csv(io.StringIO(text), dtype={"trial_id": str, "mlflow_run_id": str})
        if {"trial_id", "mlflow_run_id"} <= set(df.columns):
            run_ids = {
                str(t): str(r)
                for t, r in zip(df["trial_id"], df["mlflow_run_id"])
                if isinstance(r, str) and r
            }
    wall = math.nan
    text = where.read_text("verdict.json")
    if text:
        value = (json.loads(text).get("resources") or {}).get("wall_time_s")
        if isinstance(value, int | float) and math.isfinite(value):
            wall = float(value)
    return run_ids, wall


@dataclass(frozen=True)
class KindParts:
    """What a kind's folder provides, handed over by the kind's own :meth:`FolderKind.parts`, which
    imports its modules by name (so the imports are plain imports that tools and readers follow).

    Attributes:
        spec_class: the kind's pydantic spec class (``spec.py``).
        undecidable: ``undecidable(spec)`` of ``decidability.py``: what the design can never decide.
        pilot: ``pilot(spec, study_dir, *, power, min_effect, alpha)`` of ``power.py`` (``plan --pilot``).
        phases: ``phases(spec)`` of ``plans.py``; ``None`` where the class builds its phases itself.
        design: the kind's :class:`~studies.kinds.pipeline.TunedDesign` (``workflow.DESIGN``) for a
            tuned-design kind, else ``None``.
    """

    spec_class: type[BaseModel]
    undecidable: Callable[[Any], Iterable[Any]]
    pilot: Callable[..., dict[str, Any]]
    phases: Callable[[Any], Iterable[Phase]] | None = None
    design: Any = None


class FolderKind(StudyKind):
    """A kind laid out as a package of its own (``studies/kinds/<kind>/``, docs/architecture.md):
    the class in ``kind.py`` names its folder's pieces in :meth:`parts` (spec class, phases,
    decidability, ``plan --pilot``), imported when a method needs them, so the registry stays light."""

    @abstractmethod
    def parts(self) -> KindParts:
        """The folder's pieces: import the modules inside this method and name what they provide."""

    def spec_class(self) -> type[BaseModel]:
        return self.parts().spec_class

    def phases(self, spec: Any) -> list[Phase]:
        phases = self.parts().phases
        if phases is None:
            raise NotImplementedError(f"{type(self).__name__} names no phases in parts() and builds none")
        return list(phases(spec))

    def undecidable(self, spec: Any) -> list[Any]:
        return list(self.parts().undecidable(spec))

    def power(
        self, spec: Any, study_dir: Path, *, power: float, min_effect: float | None, alpha: float
    ) -> dict[str, Any]:
        return self.parts().pilot(spec, study_dir, power=power, min_effect=min_effect, alpha=alpha)
