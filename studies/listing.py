"""``autonorm-study ls``: every study in a tracking store, one line each, newest first.

A study is its MLflow study run (``autonorm.role = study``): its name, kind (``autonorm.kind``), the
run's state, its study verdict (the ``verdict/study`` tag, written when the study ends), how many
trials it ran (``actual_trials``, else the ``expected_trials`` param of a study still running), its
wall time (``actual_wall_s``: the number ``verdict.json``, the report and the run's closing lines show,
:meth:`workers.study.StudyRunner.cost`; ``actual_command_wall_s`` for a run that logged only that)
and when it started. The store is read a
page at a time, so a store of many studies costs one request per thousand of them.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["format_studies", "list_studies"]


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def list_studies(tracking_uri: str) -> list[dict[str, Any]]:
    """``[{"study", "kind", "state", "study_verdict", "trials", "wall_s", "started", "experiment",
    "run_id"}]`` of every study run in the store, newest first (``None`` where a value is not known
    yet, e.g. the verdict of a running study)."""
    from mlflow import MlflowClient

    from workers.tracking.names import ROLE_STUDY, TAG_KIND, TAG_ROLE

    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    rows: list[dict[str, Any]] = []
    token: str | None = None
    while experiments:
        page = client.search_runs(
            list(experiments),
            filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_STUDY}'",
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        for run in page:
            metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
            trials = _number(metrics.get("actual_trials"))
            if trials is None:
                trials = _number(params.get("expected_trials"))
            wall = _number(metrics.get("actual_wall_s"))
            rows.append(
                {
                    "study": run.info.run_name,
                    "kind": tags.get(TAG_KIND),
                    "state": run.info.status,
                    "study_verdict": tags.get("verdict/study"),
                    "trials": int(trials) if trials is not None else None,
                    "wall_s": wall if wall is not None else _number(metrics.get("actual_command_wall_s")),
                    "started": time.strftime(
                        "%Y-%m-%d %H:%M:%S", time.gmtime((run.info.start_time or 0) / 1000)
                    ),
                    "experiment": experiments.get(run.info.experiment_id),
                    "run_id": run.info.run_id,
                    "_start": run.info.start_time or 0,
                }
            )
        token = getattr(page, "token", None)
        if not token:
            break
    rows.sort(key=lambda r: r["_start"], reverse=True)  # one order across experiments
    for r in rows:
        del r["_start"]
    return rows


def format_studies(rows: list[dict[str, Any]]) -> str:
    """One line per study under a header; a plain sentence for an empty store."""
    if not rows:
        return "no study in this tracking store"

    from workers.console import format_wall

    def cell(v: Any) -> str:
        return "-" if v is None else str(v)

    header = (
        f"{'study':<36} {'kind':<10} {'state':<9} {'verdict':<17} {'trials':>6} {'wall':>9}  started (UTC)"
    )
    lines = [header]
    for r in rows:
        wall = format_wall(r["wall_s"])
        lines.append(
            f"{str(r['study'])[:36]:<36} {cell(r['kind']):<10} {cell(r['state']):<9} "
            f"{cell(r['study_verdict']):<17} {cell(r['trials']):>6} {wall:>9}  {r['started']}"
        )
    return "\n".join(lines)
