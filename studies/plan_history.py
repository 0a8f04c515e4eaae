"""``autonorm-study plan --history``: how past estimates compared with the real runs.

Every study run logs its estimate before launch as ``planned_<key>`` params (``wall_s``, ``trials``,
``cpu_hours``, ``gpu_hours``) and what it cost as ``actual_<key>`` metrics
(:class:`workers.study.StudyRunner`). The real run's wall time is ``actual_command_wall_s`` (the
``run`` command from its start: imports, the estimate's own measurement and Ray's start included —
what ``plan``'s ``wall_s`` predicts); runs logged before that metric existed have only
``actual_wall_s`` (from the study's Ray session on), marked ``session`` in the ``measured`` column.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

__all__ = ["format_history", "plan_history"]

#: The band a plan should fall in (actual / planned wall time).
BAND = (0.67, 1.5)


def _float(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def plan_history(tracking_uri: str, *, experiment: str | None = None) -> dict[str, Any]:
    """Every finished study run with an estimate in the tracking store, oldest first, and a summary.

    Returns:
        ``{"tracking_uri", "studies": [{"study", "experiment", "run_id", "started", "status",
        "planned_wall_s", "actual_wall_s", "measured", "ratio", "planned_trials", "actual_trials"}],
        "summary": {"studies", "median_ratio", "min_ratio", "max_ratio", "within_band", "band"}}``;
        ``ratio`` is actual / planned wall time.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if experiment is not None:
        experiments = {k: v for k, v in experiments.items() if v == experiment}
    rows: list[dict[str, Any]] = []
    token = None
    ids = list(experiments)
    while ids:
        page = client.search_runs(
            ids, filter_string="tags.`autonorm.role` = 'study'", max_results=1000, page_token=token
        )
        for run in page:
            planned = _float(run.data.params.get("planned_wall_s"))
            command = _float(run.data.metrics.get("actual_command_wall_s"))
            session = _float(run.data.metrics.get("actual_wall_s"))
            actual = command if command is not None else session
            if planned is None or actual is None or planned <= 0:
                continue  # no estimate (an injected trial function) or not finished
            rows.append(
                {
                    "study": run.info.run_name,
                    "experiment": experiments.get(run.info.experiment_id),
                    "run_id": run.info.run_id,
                    "started": time.strftime(
                        "%Y-%m-%d %H:%M", time.gmtime((run.info.start_time or 0) / 1000)
                    ),
                    "status": run.info.status,
                    "planned_wall_s": planned,
                    "actual_wall_s": actual,
                    "measured": "command" if command is not None else "session",
                    "ratio": actual / planned,
                    "planned_trials": _float(run.data.params.get("planned_trials")),
                    "actual_trials": _float(run.data.metrics.get("actual_trials")),
                    "_start": run.info.start_time or 0,
                }
            )
        token = getattr(page, "token", None)
        if not token:
            break
    rows.sort(key=lambda r: r.pop("_start"))
    ratios = [r["ratio"] for r in rows]
    summary: dict[str, Any] = {"studies": len(rows), "band": list(BAND)}
    if ratios:
        summary.update(
            median_ratio=statistics.median(ratios),
            min_ratio=min(ratios),
            max_ratio=max(ratios),
            within_band=sum(BAND[0] <= r <= BAND[1] for r in ratios),
        )
    return {"tracking_uri": tracking_uri, "studies": rows, "summary": summary}


def format_history(history: dict[str, Any]) -> str:
    """The history as a table and one summary line."""
    rows = history["studies"]
    if not rows:
        return "no finished study with an estimate in this tracking store"
    lines = [
        f"{'started (UTC)':<16}  {'study':<40} {'planned s':>10} {'actual s':>10} {'actual/planned':>14}  measured",
    ]
    for r in rows:
        lines.append(
            f"{r['started']:<16}  {str(r['study'])[:40]:<40} {r['planned_wall_s']:>10.1f} "
            f"{r['actual_wall_s']:>10.1f} {r['ratio']:>14.2f}  {r['measured']}"
        )
    s = history["summary"]
    lo, hi = s["band"]
    lines.append(
        f"{s['studies']} studies: actual/planned median {s['median_ratio']:.2f} "
        f"(min {s['min_ratio']:.2f}, max {s['max_ratio']:.2f}); {s['within_band']} within {lo}-{hi}x"
    )
    return "\n".join(lines)
