"""A study's verdict re-derived from the small files its directory keeps: no Tune state, no MLflow.

A finished study directory holds its confirmatory trial table and its tuning record next to
``verdict.json``; ``results/<study>/`` (:mod:`studies.results`) holds only those. Re-analysing them
runs the kind's own analysis (:meth:`studies.contract.StudyKind.analyse`) on the table,
with the analysis inputs the run recorded, and compares the result with the stored verdict
(``autonorm-study reproduce DIR`` when no tracking store holds the study's run):

* a tuned-design kind (batch size, compare; :class:`studies.kinds.pipeline.TunedDesignKind`):
  ``trials.csv`` and ``lr_tuning.json`` (the tuning record per budget, the kind's
  ``analysis_inputs``);
* a claims study (``confirm_trials.csv``): that table, the per-epoch gate logs of the confirmatory
  trials (``gate_logs.json``, :func:`write_gate_logs`: only the columns the claims read), each arm's
  tuning record and whether the search found a configuration (``tuned_lr``, ``best_config`` of the
  stored verdict: the tuning's outcome is an input of the analysis, not re-derived here).

What is compared: every field the analysis produces (numbers to 1e-9, as
:func:`studies.verdict_diff.compare_verdicts`), and of the verdict's ``scope`` the two parts the table
decides (each arm's mean metric, the seeds used). What the report adds from the run itself (its
``resources``, the rest of ``scope``: data rows, model size, device) is not evidence about the
tables and is left as recorded.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "GATE_LOGS_FILE",
    "TABLE_FILES",
    "OfflineError",
    "compare_offline",
    "read_gate_logs",
    "reanalyse_tables",
    "write_gate_logs",
]

GATE_LOGS_FILE = "gate_logs.json"
"""A claims study's per-epoch gate logs per (arm, seed): ``[{"arm", "seed", "rows": [...]}]``."""
TABLE_FILES = ("trials.csv", "lr_tuning.json", "confirm_trials.csv", GATE_LOGS_FILE)
"""The analysis inputs a study directory (or its ``results/`` copy) may hold."""
_GATE_COLUMN = re.compile(r"^(epoch|(gate_entropy|dyt_weight|ln_weight)/layer_\d+)$")
"""What the claims read from a gate log row (``studies.kinds.search.gates.gate_arrays``)."""


class OfflineError(Exception):
    """The directory lacks what its analysis needs."""


# ---- gate logs ----------------------------------------------------------------------------------


def write_gate_logs(spec: Any, out: Path) -> Path | None:
    """``out / gate_logs.json`` from a claims study's confirmatory trials in its study directory
    (every look), the columns the claims read only; ``None`` for a spec without ``confirm:``."""
    if getattr(spec, "confirm", None) is None:
        return None
    from studies.kinds.search.workflow import confirm_table
    from studies.reporting import json_safe

    _, logs = confirm_table(spec, {})
    doc = [
        {
            "arm": str(arm),
            "seed": seed,
            "rows": [{k: v for k, v in row.items() if _GATE_COLUMN.match(str(k))} for row in rows],
        }
        for (arm, seed), rows in sorted(logs.items(), key=lambda item: (str(item[0][0]), str(item[0][1])))
    ]
    path = out / GATE_LOGS_FILE
    path.write_text(json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def read_gate_logs(path: Path) -> dict[tuple[str, Any], list[dict[str, Any]]]:
    """:func:`write_gate_logs`' file as the analysis takes it: ``(arm, seed) -> rows``."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {(str(e["arm"]), e["seed"]): [dict(r) for r in e["rows"]] for e in doc}


# ---- re-analysis ----------------------------------------------------------------------------------


def _json(value: Any) -> Any:
    """As ``verdict.json`` stores it: strict JSON (NaN as null, tuples as lists, keys as text)."""
    from studies.reporting import json_safe

    return json.loads(json.dumps(json_safe(value), allow_nan=False))


def _read_json(directory: Path, name: str) -> Any:
    path = directory / name
    if not path.is_file():
        raise OfflineError(f"no {name} in {directory}: it cannot be re-analysed from its own tables")
    return json.loads(path.read_text(encoding="utf-8"))


def _read_table(directory: Path, name: str) -> Any:
    import pandas as pd

    path = directory / name
    if not path.is_file():
        raise OfflineError(f"no {name} in {directory}: it cannot be re-analysed from its own tables")
    return pd.read_csv(path)


def _table_and_inputs(
    spec: Any, kind: Any, directory: Path, logged: Mapping[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The table the kind's analysis takes and its other inputs, from the directory's files."""
    from studies.kinds.pipeline import TunedDesignKind

    if isinstance(kind, TunedDesignKind):
        design = kind.design()
        doc = _read_json(directory, "lr_tuning.json")
        records = {"": doc} if _budgets(spec, design) == [""] else dict(doc)
        from studies.adequacy import logged_checks

        inputs = dict(design.analysis_inputs(records))
        # the training-adequacy check's trials are not among the tables: its logged entries are an input
        inputs["adequacy"] = logged_checks(spec, logged)
        return _read_table(directory, "trials.csv"), inputs
    if (directory / "confirm_trials.csv").is_file():
        path = directory / GATE_LOGS_FILE
        if not path.is_file():
            raise OfflineError(
                f"no {GATE_LOGS_FILE} in {directory}: the claims need the gate logs "
                "(`autonorm-study results --export` writes them from the study directory)"
            )
        inputs = {
            "gate_logs": read_gate_logs(path),
            "tuned": dict(logged.get("tuned_lr") or {}),
            "searched": logged.get("best_config") is not None,
            # the training-adequacy check's trials are not among the tables: its logged entries are an input
            "adequacy": logged.get("adequacy") if isinstance(logged.get("adequacy"), Mapping) else None,
        }
        return _read_table(directory, "confirm_trials.csv"), inputs
    raise OfflineError(
        f"{directory} holds no trial table of its hypotheses (trials.csv with lr_tuning.json, or "
        "confirm_trials.csv): nothing to re-analyse offline"
    )


def _budgets(spec: Any, design: Any) -> list[str]:
    """A tuned design's budgets (``""``: the one unnamed budget), as its ``lr_tuning.json`` is keyed."""
    names = getattr(spec, "budget_names", None)
    if names is None and hasattr(design, "budgets"):
        names = design.budgets(spec)
    return [str(b) for b in names] if names is not None else [""]


def _table_scope(table: Any, scope: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a verdict's ``scope`` its table decides: each arm's mean metric, the seeds used
    (as :func:`studies.scope.study_scope` computes them)."""
    metric = scope.get("metric")
    arms: dict[str, float] = {}
    if len(table) and "arm" in table.columns and metric in table.columns:
        for arm, v in sorted(table.groupby("arm")[metric].mean().items()):
            if isinstance(v, float) and math.isfinite(v):
                arms[str(arm)] = float(v)
    seeds = len({int(s) for s in table["seed"]}) if len(table) and "seed" in table.columns else 0
    return {"arms": arms, "seeds": seeds}


def reanalyse_tables(spec: Any, kind: Any, directory: Path, logged: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict the kind's analysis gives on ``directory``'s tables (strict JSON, as stored), with
    ``scope`` holding the parts the table decides (when ``logged`` has a scope).

    Raises:
        OfflineError: a file the analysis needs is missing.
    """
    table, inputs = _table_and_inputs(spec, kind, directory, logged)
    verdict = dict(kind.analyse(table, spec, **inputs))
    if isinstance(logged.get("scope"), Mapping):
        verdict["scope"] = _table_scope(table, logged["scope"])
    return dict(_json(verdict))


def compare_offline(logged: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[Any]:
    """:func:`studies.verdict_diff.compare_verdicts` on the fields the re-analysis produces (module
    docstring): a field the stored verdict lacks is a difference, one only the report adds is not."""
    from studies.verdict_diff import compare_verdicts

    view: dict[str, Any] = {}
    for key in recomputed:
        if key not in logged:
            continue  # compare_verdicts names it: present recomputed, absent logged
        if key == "scope" and isinstance(logged[key], Mapping):
            view[key] = {part: logged[key].get(part) for part in recomputed[key]}
        else:
            view[key] = logged[key]
    return list(compare_verdicts(view, recomputed))
