"""``autonorm-study results``: the stored studies in ``results/<study>/`` and their one page.

A finished study is **exported** (:func:`export_study`, ``autonorm-study results --export
STUDY_DIR``) into ``results/<study>/`` with the few kilobytes its verdict rests on:

* ``verdict.json`` and ``study_spec.yaml`` (a tracking URI's credentials redacted);
* ``provenance.json``: the study run's record (data fingerprint, machine, seeds, git state; from the
  study directory, else the run's MLflow artifact) plus ``study_run``: its MLflow run id, tracking
  store and what it cost (the run's ``actual_*`` metrics);
* its analysis inputs (:data:`studies.offline.TABLE_FILES`): ``trials.csv`` and ``lr_tuning.json``
  (a tuned-design kind), ``confirm_trials.csv`` and ``gate_logs.json`` (a claims study).

``autonorm-study reproduce results/<study>`` re-analyses such a copy from those tables, without MLflow
(:mod:`studies.offline`). :func:`result_rows` reads the copies back, one row per hypothesis and one
for each study's own verdict (:class:`Row`), and :func:`render_page` makes ``docs/results.md`` of
them: the same bytes for the same directories (rows sorted, numbers to fixed digits, nothing of the
moment it runs). An inconclusive row says what would decide it (:func:`to_decide`).
"""

from __future__ import annotations

import json
import os
import shutil
from argparse import ArgumentParser, Namespace
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from studies.decide import NONE, POWER, seed_needs, to_decide
from studies.decide import num as _num
from studies.offline import GATE_LOGS_FILE, TABLE_FILES
from studies.provenance import PROVENANCE_ARTIFACT
from studies.study_dir import SPEC_FILE

__all__ = [
    "DEFAULT_PAGE",
    "DEFAULT_ROOT",
    "POWER",
    "RESULT_FILES",
    "ResultsError",
    "Row",
    "add_arguments",
    "command",
    "export_study",
    "render_page",
    "result_rows",
    "scope_short",
    "study_dirs",
    "to_decide",
    "write_page",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = Path("results")
DEFAULT_PAGE = Path("docs/results.md")
VERDICT_FILE = "verdict.json"
RESULT_FILES = (SPEC_FILE, VERDICT_FILE, PROVENANCE_ARTIFACT, *TABLE_FILES)
"""Every file a stored study may hold (an export replaces them all)."""


class ResultsError(Exception):
    """A directory that is not a finished study (or a folder of them), or an export refused."""


# ---- export ---------------------------------------------------------------------------------------


def _finished(directory: Path) -> None:
    for name in (SPEC_FILE, VERDICT_FILE):
        if not (directory / name).is_file():
            raise ResultsError(f"{directory}: no {name}, so not a finished study directory")


def _redacted_spec(text: str, spec: Any) -> str:
    from workers.tracking import redact_uri

    uri = getattr(getattr(spec, "tracking", None), "uri", None)
    if uri and str(redact_uri(uri)) != uri:
        return text.replace(uri, str(redact_uri(uri)))
    return text


def _artifact_text(uri: str, run_id: str) -> str | None:
    """The study run's ``provenance.json`` artifact; ``None`` when it has none."""
    import tempfile

    import mlflow.artifacts
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    before = os.environ.get(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name)
    os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = "false"  # one small file: no bar
    try:
        with tempfile.TemporaryDirectory(prefix="results-export-") as tmp:
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=PROVENANCE_ARTIFACT, dst_path=tmp, tracking_uri=uri
            )
            return Path(local).read_text(encoding="utf-8")
    except Exception:  # no such artifact (a run from before provenance), an unreadable store
        return None
    finally:
        if before is None:
            os.environ.pop(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, None)
        else:
            os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = before


def _study_run(
    directory: Path, tracking_uri: str | None
) -> tuple[dict[str, Any] | None, str | None, list[str]]:
    """``(study_run, provenance artifact text, notes)`` from the tracking store holding the
    directory's study run (none when no store holds it: nothing is created looking)."""
    from studies.reproduce import ReproduceError, _client, _redact, find_study_run
    from workers.tracking import http_limits

    try:
        with http_limits(30, 3, override=False):
            uri, run_id = find_study_run(str(directory), tracking_uri)
            client = _client(uri)
            run = client.get_run(run_id)
            text = None if (directory / PROVENANCE_ARTIFACT).is_file() else _artifact_text(uri, run_id)
    except ReproduceError as exc:
        return None, None, [f"no MLflow run id: {exc}"]
    metrics = run.data.metrics
    actual = {
        key: float(metrics[f"actual_{key}"])
        for key in ("cpu_hours", "gpu_hours", "wall_s")
        if isinstance(metrics.get(f"actual_{key}"), int | float)
    }
    return {"run_id": run_id, "tracking_uri": _redact(uri), "actual": actual}, text, []


def export_study(study_dir: Path, root: Path, *, tracking_uri: str | None = None) -> tuple[Path, list[str]]:
    """Copy a finished study directory's small files into ``root/<name>/`` (module docstring), and
    the run's ``report.md`` with its plots; an earlier export of it is replaced. Returns the directory and notes (what could not be recorded).

    Raises:
        ResultsError: ``study_dir`` is no finished study, or is the destination itself.
    """
    from studies.offline import write_gate_logs
    from studies.reproduce import ReproduceError, stored_study

    study_dir = Path(study_dir)
    _finished(study_dir)
    try:
        spec, _ = stored_study(study_dir)
    except ReproduceError as exc:
        raise ResultsError(str(exc)) from None
    out = Path(root) / str(spec.name)
    if out.resolve() == study_dir.resolve():
        raise ResultsError(f"{study_dir} is already the stored copy (export from the study directory itself)")
    out.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
        (out / name).unlink(missing_ok=True)
    spec_text = (study_dir / SPEC_FILE).read_text(encoding="utf-8")
    (out / SPEC_FILE).write_text(_redacted_spec(spec_text, spec), encoding="utf-8")
    shutil.copyfile(study_dir / VERDICT_FILE, out / VERDICT_FILE)
    for name in TABLE_FILES:
        if name != GATE_LOGS_FILE and (study_dir / name).is_file():
            shutil.copyfile(study_dir / name, out / name)
    # the run's own report and its plots, as the run wrote them (``--reanalyse`` rewrites them)
    for path in [study_dir / "report.md", *sorted(study_dir.glob("*.png"))]:
        if path.is_file():
            shutil.copyfile(path, out / path.name)
    notes: list[str] = []
    if (study_dir / "confirm_trials.csv").is_file() and write_gate_logs(spec, out) is None:
        notes.append("no gate logs: the spec has no confirm section")
    run, artifact, run_notes = _study_run(study_dir, tracking_uri)
    notes += run_notes
    local = study_dir / PROVENANCE_ARTIFACT
    text = local.read_text(encoding="utf-8") if local.is_file() else artifact
    record: dict[str, Any] = json.loads(text) if text else {}
    if not text:
        notes.append(f"no {PROVENANCE_ARTIFACT}: neither in the study directory nor on a study run")
    record["study_run"] = run
    (out / PROVENANCE_ARTIFACT).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out, notes


# ---- reading the stored studies ---------------------------------------------------------------------


def study_dirs(paths: Iterable[Path]) -> list[Path]:
    """Each of ``paths`` that is a finished study directory, and the finished study directories
    directly inside each other one (``results/``), once each, by name.

    Raises:
        ResultsError: a path that does not exist or is a file.
    """
    found: dict[Path, Path] = {}
    for path in map(Path, paths):
        if (path / VERDICT_FILE).is_file():
            found.setdefault(path.resolve(), path)
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if (child / VERDICT_FILE).is_file():
                    found.setdefault(child.resolve(), child)
        else:
            raise ResultsError(f"{path}: neither a study directory nor a folder of study directories")
    return sorted(found.values(), key=lambda p: (p.name, str(p.resolve())))


@dataclass(frozen=True)
class Row:
    """One hypothesis of a stored study (``hypothesis`` ``(study)``: the study's own verdict), every
    field already text."""

    study: str
    hypothesis: str
    claim: str
    kind: str
    verdict: str
    estimate: str
    seeds: str
    scope: str
    cost: str
    mlflow_run: str
    reproduce: str
    to_decide: str


COLUMNS = (
    "study",
    "hypothesis",
    "claim",
    "kind",
    "verdict",
    "estimate [CI]",
    "seeds",
    "scope",
    "cost (CPU-h, GPU-h)",
    "MLflow run",
    "reproduce",
    "to decide",
)
STUDY_ROW = "(study)"


def _estimate(h: Mapping[str, Any], name: str = "") -> str:
    """``difference 0.0036 [-0.00025, 0.0075]``: the estimate after its ``name``
    (:func:`studies.reporting.estimate_name`), then its interval."""
    est, ci = h.get("estimate"), h.get("ci")
    by_budget = h.get("by_budget")
    if _num(est) == NONE and isinstance(by_budget, Mapping) and by_budget:
        # several budgets, one estimate each (the batch-size kind's interaction per budget)
        return "; ".join(f"{b}: {_estimate(e, name)}" for b, e in by_budget.items() if isinstance(e, Mapping))
    if _num(est) == NONE:
        return NONE
    interval = ""
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(_num(c) != NONE for c in ci):
        interval = f" [{_num(ci[0])}, {_num(ci[1])}]"
    return f"{name + ' ' if name else ''}{_num(est)}{interval}"


def _equivalence_reason(verdict: Mapping[str, Any], entry: Mapping[str, Any], label: str) -> list[str]:
    """Why a hypothesis whose contrast is ``equivalent`` is neither supported nor refuted: the
    difference was decided to be inside the margin, so more seeds do not decide the direction."""
    if label != "inconclusive" or entry.get("verdict") != "equivalent":
        return []
    margin = verdict.get("margin")
    within = f"±{_num(margin)}" if isinstance(margin, (int, float)) else "the margin"
    return [
        f"equivalent: the interval lies inside {within}, so the predicted difference is absent at this "
        "margin (decided); only a smaller margin, with more seeds, could tell a direction"
    ]


def _section_entry(verdict: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The kind's own entry of hypothesis ``name`` (a claim, a contrast or an arm)."""
    for section in ("claims", "contrasts", "arms"):
        entry = (verdict.get(section) or {}) if isinstance(verdict.get(section), Mapping) else {}
        if isinstance(entry.get(name), Mapping):
            return dict(entry[name])
    return {}


def _claim(verdict: Mapping[str, Any], name: str) -> str:
    """What hypothesis ``name`` says: the claim's own sentence, a contrast's predicted direction, or
    a batch-size fix arm's trend against the control."""
    entry = _section_entry(verdict, name)
    if entry.get("claim"):
        return str(entry["claim"])
    if entry.get("arm") and entry.get("reference") and entry.get("predicted"):
        predicted = str(entry["predicted"])
        relation = "equivalent to" if predicted == "equivalent" else f"{predicted} than"
        return f"{entry['arm']} {relation} {entry['reference']} on {verdict.get('metric', 'the metric')}"
    if verdict.get("control") and verdict.get("direction"):
        trend = "falls" if verdict["direction"] == "negative" else "rises"
        return f"{name}'s {verdict.get('metric', 'metric')} {trend} as batch size grows, unlike {verdict['control']}'s"
    return name


def _seeds_used(verdict: Mapping[str, Any]) -> int | None:
    scope = verdict.get("scope") if isinstance(verdict.get("scope"), Mapping) else {}
    for value in (verdict.get("seeds_used"), (scope or {}).get("seeds")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    seeds = verdict.get("seeds")
    if isinstance(seeds, list) and seeds:
        return len(seeds)
    entries = [_section_entry(verdict, str(name)) for name in verdict.get("hypotheses") or {}]
    counts = [int(e["n_seeds"]) for e in entries if isinstance(e.get("n_seeds"), int)]
    return max(counts) if counts else None


def _budget_short(budget: Mapping[str, Any]) -> str:
    parts = []
    for key in ("epochs", "updates"):
        value = budget.get(key)
        if value is not None:
            text = "/".join(str(v) for v in value) if isinstance(value, list) else str(value)
            parts.append(f"{text} {key.removesuffix('s') if value == 1 else key}")
    return " or ".join(parts)


def scope_short(scope: Any) -> str:
    """A verdict's ``scope`` in a few words (``digits (1,222 train), ViT-Lite tiny, 3 epochs, 3
    seeds, CPU fp32``); ``—`` without one."""
    if not isinstance(scope, Mapping) or not scope:
        return NONE
    data = scope.get("data") or {}
    train = (data.get("rows") or {}).get("train")
    model = scope.get("model") or {}
    parts = [
        f"{data.get('name')}" + (f" ({train:,} train)" if isinstance(train, int) else "")
        if data.get("name")
        else "",
        str(model.get("name") or model.get("type") or ""),
        _budget_short(scope.get("budget") or {}),
        f"{scope['seeds']} seed{'' if scope['seeds'] == 1 else 's'}"
        if isinstance(scope.get("seeds"), int)
        else "",
        " ".join(str(scope[k]) for k in ("device", "precision") if scope.get(k)),
    ]
    return ", ".join(p for p in parts if p) or NONE


def _cost(verdict: Mapping[str, Any], provenance: Mapping[str, Any]) -> tuple[float, float] | None:
    """The study's (CPU hours, GPU hours): the study run's actual cost, else the verdict's
    ``resources``."""
    run = provenance.get("study_run") if isinstance(provenance.get("study_run"), Mapping) else None
    for source in ((run or {}).get("actual") or {}, verdict.get("resources") or {}):
        cpu, gpu = source.get("cpu_hours"), source.get("gpu_hours")
        if isinstance(cpu, int | float) and _num(cpu) != NONE:
            return float(cpu), (float(gpu) if isinstance(gpu, int | float) and _num(gpu) != NONE else 0.0)
    return None


def _cost_text(cost: tuple[float, float] | None) -> str:
    return NONE if cost is None else f"{_num(cost[0], 2)} CPU-h, {_num(cost[1], 2)} GPU-h"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the same text wherever the command
    runs from), else as given."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def result_rows(directory: Path) -> list[Row]:
    """The rows of one stored study: its own verdict first, then each hypothesis by name."""
    from studies.claims_page import shown_verdict
    from studies.reporting import estimate_name
    from studies.reproduce import ReproduceError, stored_study

    verdict = _read_json(directory / VERDICT_FILE)
    provenance = _read_json(directory / PROVENANCE_ARTIFACT)
    try:
        spec, kind = stored_study(directory)
    except (ReproduceError, OSError):
        spec, kind = None, None
    name = str(getattr(spec, "name", None) or directory.name)
    needs, min_seeds, why, futility = (
        seed_needs(spec, kind, directory) if _undecided(verdict) else ({}, 2, None, {})
    )
    cost = _cost(verdict, provenance)
    used = _seeds_used(verdict)
    run = provenance.get("study_run") if isinstance(provenance.get("study_run"), Mapping) else None
    common = {
        "study": name,
        "kind": str(verdict.get("kind") or getattr(kind, "name", NONE)),
        "scope": scope_short(verdict.get("scope")),
        "cost": _cost_text(cost),
        "mlflow_run": str((run or {}).get("run_id") or NONE),
        "reproduce": f"autonorm-study reproduce {display_path(directory)}",
    }

    def needed(test: str | None) -> tuple[int | None, str | None]:
        """Seeds for ``test`` (every test: the study), or why there is no count."""
        if why is not None:
            return None, why
        values = [v for k, v in needs.items() if test is None or k == test]
        if not values and test is not None and test in futility:
            return None, None  # on the wrong side of its claim: the futility count says it
        if not values and futility:
            return None, "every estimate points against its claim: each row says when it would be given up"
        if not values:
            return None, "no seed count is planned for it"
        if None in values:
            return None, f"no practical seed count reaches {POWER:.0%} power"
        return max(max(v for v in values if v is not None), min_seeds), None

    def row(hypothesis: str, claim: str, h: Mapping[str, Any], reasons: Any, n: Any, test: str | None) -> Row:
        label = str(h.get("verdict"))
        return Row(
            hypothesis=hypothesis,
            claim=claim,
            # an equivalent contrast (decided inside the margin) is shown as such, not as inconclusive
            verdict=str(shown_verdict(verdict, test)) if test is not None else label,
            estimate=_estimate(h, estimate_name(verdict.get("kind"), hypothesis))
            if test is not None
            else NONE,
            seeds=_num(n) if n is not None else NONE,
            to_decide=to_decide(
                label,
                [str(r) for r in reasons or []],
                *needed(test),
                seeds_used=used,
                cost=cost,
                futile={**futility[test], "name": estimate_name(verdict.get("kind"), test)}
                if test is not None and test in futility
                else None,
            ),
            **common,
        )

    study = {"verdict": verdict.get("study_verdict")}
    claim = str(verdict.get("hypothesis") or "every hypothesis together (the study verdict)")
    rows = [row(STUDY_ROW, claim, study, verdict.get("study_reasons"), used, None)]
    for hyp, h in sorted((verdict.get("hypotheses") or {}).items()):
        entry = _section_entry(verdict, hyp)
        n = entry.get("n_seeds") if isinstance(entry.get("n_seeds"), int) else used
        # an equivalent contrast is decided whatever else its reasons say (lr-tuning-noisy, ...)
        reasons = [*_equivalence_reason(verdict, entry, str(h.get("verdict"))), *(h.get("reasons") or [])]
        rows.append(row(str(hyp), _claim(verdict, str(hyp)), h, reasons, n, str(hyp)))
    return rows


def _undecided(verdict: Mapping[str, Any]) -> bool:
    labels = [verdict.get("study_verdict")] + [
        h.get("verdict") for h in (verdict.get("hypotheses") or {}).values()
    ]
    return "inconclusive" in labels


# ---- the page -------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def table_lines(rows: Sequence[Row]) -> list[str]:
    """The rows as a Markdown table (header first)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [getattr(row, f.name) for f in fields(Row)]
        cells[COLUMNS.index("reproduce")] = f"`{cells[COLUMNS.index('reproduce')]}`"
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def render_page(
    dirs: Sequence[Path],
    rows: Sequence[Row],
    claims: Sequence[Any] = (),
    figure: str | None = None,
    planned: Sequence[str] = (),
) -> str:
    """``docs/results.md``: one table of the papers' claims (``claims``,
    :func:`studies.claims_page.claim_rows`) and its ``figure``, the claims' adequate-size presets priced
    but not stored (``planned``: :func:`studies.planned.planned_lines`), then per study its shared
    scope, cost, run and reproduce command once and one row per hypothesis (or that nothing is stored
    yet)."""
    from studies.claims_page import claim_lines

    head = [
        "# Results",
        "",
        "<!-- Generated by `autonorm-study results`: edit the stored studies, not this file. "
        "tests/test_results_page.py regenerates it from results/ and fails when they differ. -->",
        "",
    ]
    if not rows:
        return "\n".join([*head, "No study is stored yet.", ""])
    out = [
        *head,
        "One row per claim of the two papers, read from the stored studies in `results/` (each "
        "estimate in the claim's units with its 95% interval; a sequential study's interval is the "
        "running intersection of its confidence sequences). Adequacy says whether the arms learned the "
        "task, beside what the paper reports. A study stored before that check existed (the small-scale "
        "studies) is marked `unchecked` (its adequacy `not measured`, with the arm means it reached); "
        "where a checked study tests the same claim, the claim's verdict and sentence are the checked "
        "study's, the unchecked verdict beside it.",
        "",
        *claim_lines(claims),
        "",
    ]
    if figure:
        out += [f"![every claim's estimate and interval, coloured by verdict]({figure})", ""]
    if planned:
        out += [
            "## Planned at an adequate size",
            "",
            "Presets at the size at which the models learn the task (`results/planned.yaml`), priced by "
            "`autonorm-study plan SPEC --preset P --json` (CPU-hours: every look to the maximum, no range "
            "extension) and not stored yet: no verdict. One over the machine's budget is `not testable "
            "on this machine`. A preset's rows leave this table once its study is stored; until then the "
            "claim's row above rests on the studies stored so far.",
            "",
            *planned,
            "",
        ]
    out += [
        "## Per study",
        "",
        "Each stored study (`results/<study>/`: `verdict.json`, `study_spec.yaml`, `provenance.json`, the "
        "trial tables; `autonorm-study results --export STUDY_DIR` copies a finished study there) with its "
        "scope, cost, MLflow run and reproduce command once, then one row per hypothesis. `autonorm-study "
        "reproduce results/<study>` re-analyses it from its own tables and prints `reproduced`. An "
        "undecided row says what would decide it: the seeds that reach "
        f"{POWER:.0%} power at the effect and spread the study saw (a lower bound) or, for an estimate on the "
        "wrong side of its claim, the seeds at which the claim would be given up, priced as a rerun at the "
        "study's cost per seed, and the remedy of each other reason.",
        "",
    ]
    for d in dirs:
        mine = [r for r in rows if r.study == _study_name(d, rows)]
        if not mine:
            continue
        first = mine[0]
        out += [
            f"### `{display_path(d)}`",
            "",
            f"{first.kind} study, verdict **{_study_verdict(mine)}**. Scope: {first.scope}. Cost: {first.cost}. "
            f"MLflow run `{first.mlflow_run}`. Reproduce: `{first.reproduce}`.",
            "",
            *study_table_lines(mine),
            "",
        ]
    return "\n".join(out)


def _study_name(directory: Path, rows: Sequence[Row]) -> str:
    """The study name its rows carry (the spec's name, else the directory's)."""
    names = {r.study for r in rows}
    return (
        directory.name
        if directory.name in names
        else next((r.study for r in rows if r.reproduce.endswith(display_path(directory))), directory.name)
    )


def _study_verdict(rows: Sequence[Row]) -> str:
    return next((r.verdict for r in rows if r.hypothesis == STUDY_ROW), NONE)


STUDY_COLUMNS = ("hypothesis", "claim", "verdict", "estimate [CI]", "seeds", "to decide")


def study_table_lines(rows: Sequence[Row]) -> list[str]:
    """One study's hypotheses as Markdown lines (what :func:`render_page` shows per study)."""
    lines = ["| " + " | ".join(STUDY_COLUMNS) + " |", "|" + "---|" * len(STUDY_COLUMNS)]
    for r in rows:
        if r.hypothesis == STUDY_ROW:
            continue
        cells = (r.hypothesis, r.claim, r.verdict, r.estimate, r.seeds, r.to_decide)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def write_page(paths: Iterable[Path], output: Path) -> tuple[list[Row], str]:
    """Read every stored study under ``paths`` (:func:`study_dirs`), write the page to ``output`` and
    its figure beside it (``<output stem>.png``); the rows and the page's text."""
    from studies.claims_page import claim_rows, plot_claims
    from studies.planned import PlannedError, planned_lines, read_planned

    paths = list(paths)
    dirs = study_dirs(paths)
    rows = [row for d in dirs for row in result_rows(d)]
    claims = (
        claim_rows([(d.name, _read_json(d / VERDICT_FILE)) for d in dirs], scope_text=scope_short)
        if rows
        else []
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    figure = plot_claims(claims, output.with_suffix(".png")) if claims else None
    try:
        planned = planned_lines(read_planned(paths), {r.study for r in rows})
    except PlannedError as exc:
        raise ResultsError(str(exc)) from None
    text = render_page(dirs, rows, claims, figure.name if figure is not None else None, planned)
    output.write_text(text, encoding="utf-8")
    return rows, text


def main(
    paths: Sequence[str],
    *,
    output: str | None = None,
    export: Sequence[str] = (),
    to: str | None = None,
    tracking_uri: str | None = None,
    reanalyse: bool = False,
) -> int:
    """The CLI command: export ``export`` into ``to`` (default ``results``), with ``reanalyse`` rewrite
    each stored study's ``verdict.json`` from its own tables under today's rules
    (:func:`studies.stored.rewrite_stored`, printing every verdict that changed), then print one row
    per hypothesis of the stored studies in ``paths`` (default: ``to``) and write ``output`` (default
    ``docs/results.md``) from them. Exit 2 for a directory that is no study."""
    import sys

    root = Path(to) if to else DEFAULT_ROOT
    try:
        if reanalyse:
            _reanalyse(study_dirs([Path(p) for p in paths] or [root]))
        for source in export:
            out, notes = export_study(Path(source), root, tracking_uri=tracking_uri)
            print(f"exported {source} -> {out}")
            for note in notes:
                print(f"  note: {note}", file=sys.stderr)
        page = Path(output) if output else DEFAULT_PAGE
        rows, _ = write_page([Path(p) for p in paths] or [root], page)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in table_lines(rows) if rows else []:
        print(line)
    studies = len({r.study for r in rows})
    print(f"{len(rows)} row(s) from {studies} stud{'y' if studies == 1 else 'ies'} -> {page}")
    return 0


def _reanalyse(dirs: Sequence[Path]) -> None:
    """``--reanalyse``: every stored study's verdict again under today's rules; the changes printed."""
    from studies.offline import OfflineError
    from studies.stored import rewrite_stored, write_stored_report

    for directory in dirs:
        try:
            changed = rewrite_stored(directory)
            write_stored_report(directory)
        except OfflineError as exc:
            raise ResultsError(str(exc)) from None
        name = display_path(directory)
        if not changed:
            print(f"{name}: re-analysed, no verdict changed")
        seen: set[tuple[str, str, str]] = set()
        for d in changed:  # a verdict shown twice in verdict.json (claims.c, hypotheses.c) once
            key = (d.what, str(d.logged), str(d.recomputed))
            if key not in seen:
                seen.add(key)
                print(f"{name}: {d.what}: {d.logged} -> {d.recomputed}")


def add_arguments(p: ArgumentParser) -> None:
    """The ``results`` subcommand's arguments (its parser is the CLI's)."""
    p.add_argument(
        "dirs",
        nargs="*",
        default=[],
        metavar="DIR",
        help="stored study directories, or folders of them (default: the --to folder, results/)",
    )
    p.add_argument("--output", default=None, metavar="PATH", help="the page (default: docs/results.md)")
    p.add_argument(
        "--reanalyse",
        action="store_true",
        help="first rewrite each stored study's verdict.json from its own tables under today's rules "
        "(prints every verdict that changed)",
    )
    p.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="STUDY_DIR",
        help="first copy this finished study's verdict, spec, provenance and trial tables into --to (repeatable)",
    )
    p.add_argument(
        "--to", default=None, metavar="ROOT", help="where --export stores studies (default: results/)"
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="with --export: the study runs' tracking store (default: each spec's)",
    )
    p.set_defaults(func=command)


def command(args: Namespace) -> int:
    """``autonorm-study results`` (:func:`main`)."""
    return main(
        args.dirs,
        output=args.output,
        export=args.export,
        to=args.to,
        tracking_uri=args.tracking_uri,
        reanalyse=args.reanalyse,
    )
