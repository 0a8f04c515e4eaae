"""A finished study's outputs: the uniform hypothesis entry of ``verdict.json``, the study run's
verdict tags and metrics, the output files logged and the :class:`~studies.contract.StudyOutcome`
``run`` returns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from studies.contract import StudyOutcome

__all__ = [
    "finite_metrics",
    "hypothesis_entry",
    "log_study_outputs",
    "run_outcome",
    "study_outcome",
    "verdict_tags",
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
