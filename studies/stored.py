"""Stored studies (``results/<study>/``) brought up to today's rules: ``autonorm-study results
--reanalyse`` rewrites each ``verdict.json`` from its own tables (:func:`rewrite_stored`) and writes its
report and plots beside them (:func:`write_stored_report`). Built on :mod:`studies.offline` (the
re-analysis) and :func:`studies.reproduce.stored_study` (the spec and kind of a directory)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studies.offline import (
    OfflineError,
    _budgets,
    _read_json,
    _table_and_inputs,
    compare_offline,
    reanalyse_tables,
)

__all__ = ["REPORT_SUFFIXES", "rewrite_stored", "write_stored_report"]


#: The leaves of a verdict that are decisions (what ``results --reanalyse`` prints when they change).
_DECISION_FIELDS = ("verdict", "label", "study_verdict")


def rewrite_stored(directory: Path) -> list[Any]:
    """Re-analyse a stored study from its own tables under today's rules and rewrite its
    ``verdict.json`` (``autonorm-study results --reanalyse``): the analysis's fields replaced, what only
    the run could record (``resources``, the rest of ``scope``) kept. Uses the seeds the tables hold
    (no truncation). A rule that needs trials the study lacks (the adequacy budget check) leaves
    ``adequacy`` as ``"not measured"``.

    Returns:
        the differences whose field is a decision (a hypothesis's ``verdict`` or ``label``, the
        ``study_verdict``), old against new (:class:`studies.verdict_diff.Difference`).

    Raises:
        OfflineError: no study, no ``verdict.json`` or a file the analysis needs is missing.
    """
    from studies.reporting import write_json
    from studies.reproduce import ReproduceError, stored_study

    try:
        spec, kind = stored_study(directory)
    except ReproduceError as exc:
        raise OfflineError(str(exc)) from None
    verdict_file = directory / "verdict.json"
    if not verdict_file.is_file():
        raise OfflineError(f"no verdict.json in {directory} (did the study finish?)")
    logged = json.loads(verdict_file.read_text(encoding="utf-8"))
    recomputed = reanalyse_tables(spec, kind, directory, logged)
    merged = dict(logged)
    for key, value in recomputed.items():
        if key == "scope" and isinstance(logged.get("scope"), Mapping):
            merged["scope"] = {**logged["scope"], **value}
        else:
            merged[key] = value
    merged.setdefault("adequacy", "not measured")
    changed = [
        d
        for d in compare_offline(logged, recomputed)
        if d.field.split(".")[-1] in _DECISION_FIELDS and not d.field.startswith(("looks", "budgets"))
    ]
    write_json(verdict_file, merged)
    return changed


#: What a stored study keeps of its report (``report.html`` and the tables stay with the run).
REPORT_SUFFIXES = (".md", ".png")


def write_stored_report(directory: Path) -> list[Path]:
    """The report a stored study's verdict and tables give (``report.md`` and its plots), written
    into ``directory`` beside them (``autonorm-study results --reanalyse``); the kind's own report
    writer, run on the stored files in a scratch folder, of which only the ``.md`` and ``.png`` files
    are kept: ``verdict.json`` and the tables are never rewritten here.

    Raises:
        OfflineError: a file the report needs is missing.
    """
    import shutil
    import tempfile

    from studies.kinds.pipeline import Analysed, TunedDesignKind
    from studies.reproduce import ReproduceError, stored_study

    try:
        spec, kind = stored_study(directory)
    except ReproduceError as exc:
        raise OfflineError(str(exc)) from None
    verdict = json.loads((directory / "verdict.json").read_text(encoding="utf-8"))
    resources = verdict.get("resources") if isinstance(verdict.get("resources"), Mapping) else {}
    spent = tuple(
        float(v) if isinstance(v, int | float) else math.nan
        for v in (
            (resources or {}).get("wall_time_s"),
            (resources or {}).get("cpu_hours"),
            (resources or {}).get("gpu_hours"),
        )
    )
    table, inputs = _table_and_inputs(spec, kind, directory, verdict)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        if isinstance(kind, TunedDesignKind):
            design = kind.design()
            doc = _read_json(directory, "lr_tuning.json")
            records = {"": doc} if _budgets(spec, design) == [""] else dict(doc)
            design.write_outputs(Analysed(spec, dict(verdict), table, records, spent), out)  # type: ignore[arg-type]
            from studies.plots import LR_TUNING_PNG, plot_lr_tuning

            plot_lr_tuning(records, out / LR_TUNING_PNG, metric=spec.lr_tuning.metric)
        else:
            from studies.kinds.search.report import write_claims_report
            from studies.kinds.search.workflow import SHARED, _sequential_of

            write_claims_report(
                verdict["claims"],
                table,
                inputs["gate_logs"],
                out,
                title=f"AutoNorm claims: {spec.name}",
                protocol=spec.to_document(),
                data_kind=verdict["data_kind"],
                best_config=verdict.get("best_config"),
                tuned_lr=verdict.get("tuned_lr"),
                wall_time_s=spent[0],
                cpu_hours=spent[1],
                gpu_hours=spent[2],
                shared={k: verdict[k] for k in SHARED if k in verdict},
                sequential=_sequential_of(verdict),
            )
        kept = []
        for path in sorted(out.iterdir()):
            if path.is_file() and path.suffix in REPORT_SUFFIXES:
                kept.append(Path(shutil.copyfile(path, directory / path.name)))
    return kept
