"""``autonorm-study reproduce RUN``: a study's verdict again, from its MLflow record alone.

``RUN`` is the study's MLflow run id, a link to it in the MLflow UI (``.../#/experiments/<e>/runs/<id>``:
the tracking server is the link's address), or a study directory (its ``study_spec.yaml`` locates the
run; nothing else is read from it).

* By default the verdict is **re-analysed**: the trial table is rebuilt from the trial runs' own params,
  tags and metrics in MLflow (:class:`workers.tracking.replay.TrackedTrials`; no table artifact, the
  study directory may be gone), the kind's analysis runs on it
  (:meth:`studies.contract.StudyKind.reanalyse`) and the result is compared with the
  ``verdict.json`` logged on the run: every verdict, reason and number (floating point to 1e-9).
  Trial tables logged on the run (``trials.csv``, ...; rows with ``mlflow_run_id``) are compared with
  the trial runs' metrics too, so a metric changed in MLflow after the study is named by its trial.
* ``--rerun`` runs the study again from the logged spec into a new study directory and a new MLflow
  run (tag :data:`TAG_REPRODUCES` names the original), after checking the code (the commit, a tracked
  file modified: refused unless ``--allow-different-code``) and the data (the data fingerprint:
  always refused on a mismatch); then compares trial by trial (status and final metrics) and
  verdict by verdict.

* A study directory whose run no tracking store holds (its store gone or never there: a copy in
  ``results/<study>/``, another machine), or any directory with ``--offline``, is **re-analysed from
  its own tables**: the kind's analysis on its trial table and recorded tuning
  (:mod:`studies.offline`), compared with its ``verdict.json``. No tracking store is opened that does
  not exist already, so none is created.

All print ``reproduced`` and exit 0 when nothing differs; else one line per difference (the trial's
run name or the hypothesis, the field, the logged and the recomputed value) and exit 1. Exit 2: the
run cannot be found or read, or a rerun is refused.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from studies.verdict_diff import Difference, compare_verdicts, number, same

__all__ = [
    "EXIT_DIFFERENT",
    "EXIT_REFUSED",
    "TAG_REPRODUCES",
    "Difference",
    "NoStudyRun",
    "ReproduceError",
    "compare_trials",
    "compare_verdicts",
    "find_study_run",
    "reanalyse",
    "reanalyse_directory",
    "rerun",
    "stored_study",
]

TAG_REPRODUCES = "autonorm.reproduces"
"""On a rerun's study run: the run id of the study it repeats."""
EXIT_DIFFERENT = 1
EXIT_REFUSED = 2
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_TABLE_SUFFIXES = (".csv",)
_TIMING = ("examples_per_s", "time_total_s", "time_this_iter_s")
"""Metrics that measure the machine, not the trial: not compared by a rerun."""


class ReproduceError(Exception):
    """The run cannot be found or read, or a rerun is refused (exit 2)."""


class NoStudyRun(ReproduceError):
    """No tracking store holds a study directory's run: the store does not exist (it is not
    created by looking), cannot be read, or has no run of that directory."""


# ---- locating the run ------------------------------------------------------------------------------


@dataclass
class StudyRun:
    """The study's own run and what was logged on it."""

    tracking_uri: str
    run: Any
    spec_text: str
    verdict: dict[str, Any] | None
    tables: dict[str, Any]  # artifact path -> DataFrame (trial tables logged on the run)

    @property
    def run_id(self) -> str:
        return str(self.run.info.run_id)


def _client(tracking_uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _parse_target(target: str, tracking_uri: str | None) -> tuple[str | None, str | None, Path | None]:
    """``(tracking_uri, run_id, study_dir)`` from RUN."""
    parts = urlsplit(target)
    if parts.scheme in ("http", "https") and parts.netloc:
        ids = _RUN_ID.findall(parts.fragment or parts.path)
        if not ids:
            raise ReproduceError(f"RUN: {target} is not a link to an MLflow run (no run id in it)")
        base = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")
        return tracking_uri or base, ids[-1], None
    path = Path(target)
    if path.is_dir():
        return tracking_uri, None, path
    if _RUN_ID.fullmatch(target):
        return tracking_uri, target, None
    raise ReproduceError(
        f"RUN: {target!r} is neither an MLflow run id (32 hex digits), a link to a run, nor a study directory"
    )


def _spec_from_text(text: str, source: str, overrides: Sequence[str] = ()) -> Any:
    from studies.kinds import load_study

    with tempfile.TemporaryDirectory(prefix="reproduce-spec-") as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return load_study(path, list(overrides), stored=True)  # a study's spec, as it ran
        except Exception as exc:
            raise ReproduceError(f"the spec logged on {source} does not load here: {exc}") from None


def find_study_run(target: str, tracking_uri: str | None = None) -> tuple[str, str]:
    """``(tracking_uri, study run id)`` of RUN (see the module docstring)."""
    import os

    from studies.study_dir import SPEC_FILE
    from workers.tracking.names import ROLE_STUDY, TAG_ROLE, TAG_STUDY_KEY, study_key

    uri, run_id, study_dir = _parse_target(target, tracking_uri)
    if study_dir is not None:
        spec_file = study_dir / SPEC_FILE
        if not spec_file.is_file():
            raise ReproduceError(f"RUN: no {SPEC_FILE} in {study_dir}: not a study directory")
        here = f"storage_path={json.dumps(str(study_dir.resolve().parent))}"
        spec = _spec_from_text(spec_file.read_text(encoding="utf-8"), str(spec_file), [here])
        if uri is None:
            uri = _spec_tracking_uri(spec)
        if not store_exists(uri):
            raise NoStudyRun(f"no tracking store at {_redact(uri)} (where {study_dir}'s study run would be)")
        from studies.study_dir import StudyDir

        key = study_key(StudyDir.of(spec).uri)
        filt = f"tags.`{TAG_STUDY_KEY}` = '{key}' and tags.`{TAG_ROLE}` = '{ROLE_STUDY}'"
        try:
            client = _client(uri)
            experiments = [e.experiment_id for e in client.search_experiments()]
            found = client.search_runs(experiments, filter_string=filt, max_results=10) if experiments else []
        except Exception as exc:  # unreachable server, unreadable database
            raise NoStudyRun(
                f"the tracking store {_redact(uri)} cannot be read ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        if not found:
            raise NoStudyRun(f"no study run for {study_dir} in the tracking store {_redact(uri)}")
        return uri, str(min(found, key=lambda r: r.info.start_time or 0).info.run_id)
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ReproduceError(
            "--tracking-uri: which tracking store holds the run? (or set MLFLOW_TRACKING_URI)"
        )
    assert run_id is not None
    return uri, run_id


def _spec_tracking_uri(spec: Any) -> str:
    """The tracking store a study of ``spec`` used (its ``tracking.uri``, MLFLOW_TRACKING_URI, or the
    workers' default next to its storage)."""
    from studies.study_dir import StudyDir
    from workers.plan import StorageConfig, StudyPlan, TrackingConfig
    from workers.preflight import _tracking_uri
    from workers.storage import resolve_storage

    where = StudyDir.of(spec)
    storage = StorageConfig(path=str(spec.storage_path), endpoint_override=where.config.endpoint_override)
    import os

    probe = StudyPlan(
        name=spec.name,
        base_config={},
        storage=storage,
        tracking=TrackingConfig(uri=spec.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or None),
    )
    return str(_tracking_uri(probe, resolve_storage(storage)))


def store_exists(uri: str) -> bool:
    """Whether the tracking store at ``uri`` is there to be read: a sqlite file or a local file
    store that exists (MLflow would create a missing one on first use); any server is assumed to."""
    parts = urlsplit(uri)
    if parts.scheme == "sqlite":
        path = uri.split("sqlite:///", 1)[1].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        return bool(path) and Path(path).is_file()
    if parts.scheme in ("", "file"):
        return Path(parts.path if parts.scheme == "file" else uri).is_dir()
    return True


def _redact(uri: str) -> str:
    from workers.tracking import redact_uri

    return str(redact_uri(uri))


def _artifact_paths(client: Any, run_id: str, path: str | None = None, depth: int = 0) -> list[str]:
    out: list[str] = []
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            if depth < 2:
                out += _artifact_paths(client, run_id, info.path, depth + 1)
        else:
            out.append(info.path)
    return out


def load_study_run(tracking_uri: str, run_id: str) -> StudyRun:
    """The study run, its logged spec, ``verdict.json`` and trial tables."""
    import mlflow.artifacts
    import pandas as pd

    from workers.tracking.names import ROLE_STUDY, TAG_ROLE

    client = _client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        if type(exc).__name__ in ("MlflowException", "RestException") and "not found" in str(exc).lower():
            raise ReproduceError(
                f"RUN: no run {run_id} in the tracking store {_redact(tracking_uri)}"
            ) from None
        raise
    if run.data.tags.get(TAG_ROLE) != ROLE_STUDY:
        raise ReproduceError(
            f"RUN: run {run_id} is not a study's own run ({TAG_ROLE}={run.data.tags.get(TAG_ROLE)!r}); "
            "give the study run (the parent of its phase runs)"
        )
    paths = _artifact_paths(client, run_id)
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:

        def read(path: str) -> str:
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=tracking_uri
            )
            return Path(local).read_text(encoding="utf-8")

        if "spec.yaml" not in paths:
            raise ReproduceError(f"RUN: run {run_id} has no spec.yaml artifact: it cannot be re-analysed")
        spec_text = read("spec.yaml")
        verdicts = [p for p in paths if p.rsplit("/", 1)[-1] == "verdict.json"]
        verdicts.sort(key=lambda p: (p.count("/"), p))  # the root one first
        verdict = json.loads(read(verdicts[0])) if verdicts else None
        tables: dict[str, Any] = {}
        for path in paths:
            if path.endswith(_TABLE_SUFFIXES):
                local = mlflow.artifacts.download_artifacts(
                    run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=tracking_uri
                )
                try:
                    frame = pd.read_csv(local)
                except Exception:
                    continue
                if "mlflow_run_id" in frame.columns:
                    tables[path] = frame
    return StudyRun(tracking_uri, run, spec_text, verdict, tables)


# ---- comparing -------------------------------------------------------------------------------------


def compare_tables(tables: Mapping[str, Any], tracked: Any) -> list[Difference]:
    """Each logged trial table's numbers against the trial runs' metrics in MLflow now (a value that
    is the trial's configured one, not a metric, is left alone: :func:`_configured`)."""
    records = {
        r.info.run_id: r for runs in tracked.runs.values() for r in runs
    }  # run id -> the MLflow run (its latest metric values)
    out = []
    for _path, frame in sorted(tables.items()):
        for row in frame.to_dict(orient="records"):
            run = records.get(str(row.get("mlflow_run_id")))
            if run is None:
                continue
            for column, value in row.items():
                metric = run.data.metrics.get(column)
                if metric is None or not number(value) or column == "epoch":
                    continue
                if same(float(value), float(metric)) or _configured(run, column, float(value)):
                    continue
                out.append(Difference(run.info.run_name, column, float(value), float(metric)))
    return _unique(out)


def _configured(run: Any, column: str, value: float) -> bool:
    """The table's value is the trial's configured one (a param ``<...>.<column>``): a column named
    like a metric that holds configuration (a claims table's ``lr`` is ``training.lr``, while the
    ``lr`` metric is the schedule's last rate)."""
    for key, text in run.data.params.items():
        if key == column or key.endswith(f".{column}"):
            try:
                if same(value, float(text)):
                    return True
            except ValueError:
                continue
    return False


def _unique(items: Iterable[Difference]) -> list[Difference]:
    seen: list[Difference] = []
    for d in items:
        if d not in seen:
            seen.append(d)
    return seen


def compare_trials(original: Any, again: Any) -> list[Difference]:
    """Trial by trial (same phase and run name): status and every final metric both runs have but
    the timing ones (:data:`_TIMING`: throughput depends on the machine's load)."""
    out = []
    for phase in sorted(set(original.runs) | set(again.runs)):
        old = {r.info.run_name: r for r in original.runs.get(phase, [])}
        new = {r.info.run_name: r for r in again.runs.get(phase, [])}
        for name in sorted(set(old) | set(new)):
            if name not in new or name not in old:
                out.append(
                    Difference(
                        name,
                        "trial",
                        "present" if name in old else "absent",
                        "present" if name in new else "absent",
                    )
                )
                continue
            a, b = old[name], new[name]
            status = "autonorm.trial_status"
            if a.data.tags.get(status) != b.data.tags.get(status):
                out.append(Difference(name, "status", a.data.tags.get(status), b.data.tags.get(status)))
            for key in sorted((set(a.data.metrics) & set(b.data.metrics)) - set(_TIMING)):
                if not same(a.data.metrics[key], b.data.metrics[key]):
                    out.append(Difference(name, key, a.data.metrics[key], b.data.metrics[key]))
    return out


# ---- the two modes ---------------------------------------------------------------------------------


def reanalyse(study: StudyRun) -> list[Difference]:
    """Re-analyse the study from its trial runs; the differences from the logged verdict."""
    from studies.kinds import kind_for
    from workers.tracking.replay import TrackedTrials

    if study.verdict is None:
        raise ReproduceError(f"RUN: run {study.run_id} has no verdict.json artifact (did the study finish?)")
    spec = _spec_from_text(study.spec_text, f"run {study.run_id}")
    tracked = TrackedTrials(_client(study.tracking_uri), study.run_id)
    if not tracked.runs:
        raise ReproduceError(f"RUN: run {study.run_id} has no trial runs under it")
    recomputed = kind_for(spec).reanalyse(spec, tracked)
    return compare_tables(study.tables, tracked) + compare_verdicts(study.verdict, recomputed)


def stored_study(directory: Path) -> tuple[Any, Any]:
    """``(spec, kind)`` of a study directory (or a stored copy of one): its ``study_spec.yaml``,
    placed where the directory lies now.

    Raises:
        ReproduceError: no ``study_spec.yaml``, or one that does not load here.
    """
    from studies.kinds import kind_for
    from studies.study_dir import SPEC_FILE

    spec_file = directory / SPEC_FILE
    if not spec_file.is_file():
        raise ReproduceError(f"RUN: no {SPEC_FILE} in {directory}: not a study directory")
    here = f"storage_path={json.dumps(str(directory.resolve().parent))}"
    spec = _spec_from_text(spec_file.read_text(encoding="utf-8"), str(spec_file), [here])
    return spec, kind_for(spec)


def reanalyse_directory(directory: Path) -> list[Difference]:
    """Re-analyse a study directory from its own tables (:mod:`studies.offline`); the differences
    from its ``verdict.json``. Reads nothing but the directory (and the data set's class count)."""
    from studies.offline import OfflineError, compare_offline, reanalyse_tables

    spec, kind = stored_study(directory)
    verdict_file = directory / "verdict.json"
    if not verdict_file.is_file():
        raise ReproduceError(f"RUN: no verdict.json in {directory} (did the study finish?)")
    logged = json.loads(verdict_file.read_text(encoding="utf-8"))
    try:
        recomputed = reanalyse_tables(spec, kind, directory, logged)
    except OfflineError as exc:
        raise ReproduceError(str(exc)) from None
    return compare_offline(logged, recomputed)


def _check_code(study: StudyRun, *, allow_different_code: bool) -> None:
    import os

    from studies.provenance import TAG_GIT_DIRTY, git_dirty
    from studies.schema import git_commit
    from workers.tracking.names import SOURCE_GIT_COMMIT

    tags = study.run.data.tags
    logged = tags.get(SOURCE_GIT_COMMIT) or tags.get("autonorm.git_commit") or "unknown"
    here = git_commit(os.environ)
    problems = []
    if logged == "unknown" or here == "unknown":
        problems.append(f"the commit is not known (study: {logged}, this checkout: {here})")
    elif logged != here:
        problems.append(
            f"the study ran at commit {logged}, this checkout is at {here} (git checkout {logged})"
        )
    if git_dirty() != "false":
        problems.append("this checkout has modified tracked files (git status): commit or stash them")
    if tags.get(TAG_GIT_DIRTY) == "true":
        problems.append("the study itself ran from a checkout with modified tracked files")
    if problems and not allow_different_code:
        raise ReproduceError(
            "refusing to rerun: " + "; ".join(problems) + " (--allow-different-code reruns anyway)"
        )
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)


def rerun(
    study: StudyRun,
    *,
    allow_different_code: bool = False,
    storage_path: str | None = None,
    progress: bool = True,
) -> tuple[list[Difference], str | None]:
    """Run the study again from its logged spec; the differences and the new study run's id."""
    from studies.kinds import kind_for
    from studies.provenance import TAG_DATA_FINGERPRINT, study_provenance
    from studies.running import run_study_spec
    from workers.tracking.replay import TrackedTrials

    if study.verdict is None:
        raise ReproduceError(f"RUN: run {study.run_id} has no verdict.json artifact (did the study finish?)")
    _check_code(study, allow_different_code=allow_different_code)
    original = _spec_from_text(study.spec_text, f"run {study.run_id}")
    client = _client(study.tracking_uri)
    experiment = client.get_experiment(study.run.info.experiment_id).name
    name = f"{original.name}-rerun-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = [
        f"name={name}",
        f"tracking.uri={json.dumps(study.tracking_uri)}",
        f"tracking.experiment={json.dumps(experiment)}",
    ]
    if storage_path is not None:
        overrides.append(f"storage_path={json.dumps(storage_path)}")
    spec = _spec_from_text(study.spec_text, f"run {study.run_id}", overrides)
    provenance = study_provenance(spec, kind_for(spec))
    logged_data = study.run.data.tags.get(TAG_DATA_FINGERPRINT)
    here_data = provenance["tags"][TAG_DATA_FINGERPRINT]
    if logged_data is None:
        raise ReproduceError(f"refusing to rerun: run {study.run_id} records no {TAG_DATA_FINGERPRINT}")
    if logged_data != here_data:
        raise ReproduceError(
            f"refusing to rerun: the data differ ({TAG_DATA_FINGERPRINT} {logged_data} logged, {here_data} "
            "here; the per-file digests are in the run's provenance.json)"
        )
    provenance["tags"][TAG_REPRODUCES] = study.run_id
    print(f"rerunning {original.name!r} as {name!r} (storage {spec.storage_path})", flush=True)
    outcome = run_study_spec(spec, allow_exploratory=True, progress=progress, provenance=provenance)
    if outcome.parent_run_id is None:
        raise ReproduceError("the rerun has no MLflow study run to compare")
    again = TrackedTrials(client, outcome.parent_run_id)
    before = TrackedTrials(client, study.run_id)
    diffs = compare_trials(before, again) + compare_verdicts(study.verdict, outcome.verdict or {})
    return diffs, outcome.parent_run_id


def main(
    target: str,
    *,
    tracking_uri: str | None = None,
    do_rerun: bool = False,
    allow_different_code: bool = False,
    storage_path: str | None = None,
    offline: bool = False,
) -> int:
    """The CLI command; returns the exit status. ``offline``: re-analyse the study directory
    ``target`` from its own tables without looking for its run in any tracking store."""
    from workers.tracking import http_limits

    try:
        if offline:
            if do_rerun:
                raise ReproduceError(
                    "--offline re-analyses a directory's own tables; --rerun needs its MLflow run"
                )
            if not Path(target).is_dir():
                raise ReproduceError(f"RUN: with --offline, a study directory is needed ({target} is none)")
            diffs = _from_tables(Path(target), "--offline")
        else:
            try:
                with http_limits(30, 3, override=False):
                    uri, run_id = find_study_run(target, tracking_uri)
            except NoStudyRun as exc:
                if do_rerun:
                    raise
                diffs = _from_tables(Path(target), str(exc))
            else:
                with http_limits(30, 3, override=False):
                    study = load_study_run(uri, run_id)
                if do_rerun:
                    diffs, new_id = rerun(
                        study, allow_different_code=allow_different_code, storage_path=storage_path
                    )
                    print(f"rerun: MLflow run {new_id} ({TAG_REPRODUCES}={run_id})")
                else:
                    diffs = reanalyse(study)
    except ReproduceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    for d in diffs:
        print(d.line())
    if diffs:
        print(f"not reproduced: {len(diffs)} difference(s)")
        return EXIT_DIFFERENT
    print("reproduced")
    return 0


def _from_tables(directory: Path, why: str) -> list[Difference]:
    """:func:`reanalyse_directory`, saying why and from which files."""
    from studies.offline import TABLE_FILES

    files = ", ".join(name for name in TABLE_FILES if (directory / name).is_file()) or "no table"
    print(f"{why}: re-analysing {directory} from its own tables ({files})", flush=True)
    return reanalyse_directory(directory)
