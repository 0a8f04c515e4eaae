"""A phase's trials read back: from Tune's ``Trial`` objects, from the study directory (no Ray cluster
needed), or, inside :func:`workers.tracking.replay.replaying`, from the phase's trial runs in MLflow."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from workers.members import member_history, views
from workers.plan import StudyPlan
from workers.records import TrialRecord, trial_status
from workers.storage import resolve_storage

__all__ = ["read_histories", "read_trials"]


def _record(trial: Any, run_ids: Mapping[str, str], base_config: Mapping[str, Any]) -> TrialRecord:
    from workers.trainable import config_from_result

    last = dict(trial.last_result or {})
    params = dict(trial.config or {})
    return TrialRecord(
        trial_id=trial.trial_id,
        params=params,
        config=config_from_result(last, base_config, params),
        status=trial_status(trial.status, last),
        metrics=last,
        node_id=last.get("node_id"),
        mlflow_run_id=run_ids.get(trial.trial_id),
    )


def _tune_results(trials: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
    """Every result each trial reported, as Tune keeps it in the study directory (its
    ``result.json``, one JSON object per line; local or S3). A file that cannot be read is skipped:
    its trial's results then come from this run's memory only."""
    import json

    out: dict[str, list[dict[str, Any]]] = {}
    for trial in trials:
        try:
            fs = trial.storage.storage_filesystem
            with fs.open_input_stream(f"{trial.path}/result.json") as stream:
                text = stream.read().decode("utf-8", errors="replace")
        except Exception:
            continue
        rows = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
        members = views(trial)
        if len(members) == 1 and members[0] is trial:
            out[trial.trial_id] = rows
        else:
            for member in members:
                out[member.trial_id] = member_history(rows, member.k)
    return out


def _summary(trials: list[Any] | None, total: int) -> dict[str, float] | None:
    if trials is None:
        return None
    counts = {"completed": 0, "diverged": 0, "pruned": 0, "error": 0}
    for trial in (v for t in trials for v in views(t)):
        counts[trial_status(trial.status, trial.last_result)] += 1
    summary = {f"trials_{k}": float(v) for k, v in counts.items()}
    summary["trials_expected"] = float(total)
    return summary


def read_trials(plan: StudyPlan, *, history: bool = True) -> list[TrialRecord]:
    """A study's trials read back from its Tune experiment directory (no Ray cluster needed).

    Same records as :func:`workers.runner.run_study` returns (``mlflow_run_id`` excepted), so status and reports
    use one vocabulary. Empty when the study has not written its state yet. Inside
    :func:`workers.tracking.replay.replaying`: the phase's trial runs in MLflow instead.

    Without ``history`` only Tune's state is read (not each trial's result file). A process that
    reads the same phase again (a report reads a phase three times) gets the records it read before
    while the phase's state files are unchanged (names, sizes and modification times).
    """
    from workers.tracking.replay import replayed

    replay = replayed(plan.name, history=history)
    if replay is not None:
        return replay
    from workers import tune_state

    tune_state.install()  # finished trials live in their own files (workers.tune_state)
    storage = resolve_storage(plan.storage)
    path = storage.experiment_path(plan.name)
    signature = _state_signature(storage.filesystem, path)
    for wanted in ((path, history), (path, True)):
        hit = _READ.get(wanted)
        if hit is not None and hit[0] == signature and hit[1] == plan.base_config:
            records = list(hit[2])
            return (
                records if history or not wanted[1] else [dataclasses.replace(r, history=()) for r in records]
            )
    analysis = _analysis(storage, path, history=history)
    if analysis is None:
        return []
    frames = analysis.trial_dataframes if history else {}
    records = []
    for trial in analysis.trials:
        df = frames.get(trial.trial_id)
        rows = df.to_dict(orient="records") if df is not None and not df.empty else []
        for view in views(trial):
            record = _record(view, {}, plan.base_config)
            own = rows if view is trial else member_history(rows, view.k)
            if own:
                record = dataclasses.replace(record, history=tuple(own))
            records.append(record)
    if signature is not None:
        _READ[(path, history)] = (signature, copy.deepcopy(dict(plan.base_config)), tuple(records))
        while len(_READ) > _READ_KEPT:
            _READ.pop(next(iter(_READ)))
    return records


def read_histories(plan: StudyPlan, trial_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Every result each of ``trial_ids`` reported (members of stacked groups included), read from
    those trials' own result files only: what :func:`read_trials` with ``history`` gives them, for
    a few trials of a large study without loading every trial's file (a 1,000-trial search study's
    gate-entropy plot shows 12). Rows hold the keys each result had (no NaN filling across rows).
    Trials with no result are left out."""
    from workers.tracking.replay import replayed

    wanted = set(trial_ids)
    replay = replayed(plan.name, history=True)
    if replay is not None:
        return {
            t.trial_id: [dict(r) for r in t.history] for t in replay if t.trial_id in wanted and t.history
        }
    from workers import tune_state

    tune_state.install()
    storage = resolve_storage(plan.storage)
    analysis = _analysis(storage, storage.experiment_path(plan.name), history=False)
    if analysis is None:
        return {}
    trials = [t for t in analysis.trials if any(v.trial_id in wanted for v in views(t))]
    rows = _tune_results(trials)
    return {tid: rows[tid] for tid in trial_ids if rows.get(tid)}


# (experiment path, history) -> (state signature, base config, records): the phases this process read.
_READ: dict[tuple[str, bool], tuple[tuple[Any, ...], dict[str, Any], tuple[TrialRecord, ...]]] = {}
_READ_KEPT = 16


def _state_signature(fs: Any, path: str) -> tuple[Any, ...] | None:
    """Name, size and modification time of every file at the top of the experiment directory (Tune's
    snapshot, its searcher's state, the finished-trials files): any write of Tune's changes it.
    ``None`` when the directory cannot be listed."""
    import pyarrow.fs

    if fs is None:  # a local storage path
        fs = pyarrow.fs.LocalFileSystem()
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    except (OSError, ValueError):
        return None
    return tuple(
        sorted((i.base_name, i.size, i.mtime_ns) for i in infos if i.type == pyarrow.fs.FileType.File)
    )


def _analysis(storage: Any, path: str, *, history: bool) -> Any | None:
    """Tune's ``ExperimentAnalysis`` of the experiment at ``path`` (:func:`_analysis_class`), or
    ``None`` when it has written no state yet."""
    # Trials that never reported have no result file yet; Tune warns about each.
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _analysis_class(history)(path, storage_filesystem=storage.filesystem)
    except (ValueError, FileNotFoundError):
        return None
    finally:
        quiet.setLevel(level)


@functools.cache
def _analysis_class(history: bool) -> Any:
    """Tune's ``ExperimentAnalysis``; without ``history``, one that does not load every trial's
    result file into a DataFrame when it is built (``_fetch_trial_dataframes``, private)."""
    from ray.tune import ExperimentAnalysis

    if history:
        return ExperimentAnalysis

    class StateOnlyAnalysis(ExperimentAnalysis):  # type: ignore[misc]
        def _fetch_trial_dataframes(self) -> dict[str, Any]:
            return {}

    return StateOnlyAnalysis
