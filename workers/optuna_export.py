"""The Optuna study of a phase copied out of its searcher: ``<experiment dir>/optuna.db`` for
``optuna-dashboard``, also an artifact of the phase's MLflow run."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.plan import StudyPlan
from workers.storage import ResolvedStorage

if TYPE_CHECKING:
    from workers.tracking.callback import MlflowTrackingCallback

__all__ = ["OPTUNA_DB", "export_optuna_study"]

logger = logging.getLogger(__name__)


def _searcher_of(tuner: Any) -> Any:
    """The Optuna searcher a Tuner ran with: Tune restores the pickled one in place after a restore,
    and wraps it (``ConcurrencyLimiter``) without copying it. Private Ray API; ``None`` if it moved."""
    config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    search = getattr(config, "search_alg", None)
    while search is not None and not hasattr(search, "_ot_study") and hasattr(search, "searcher"):
        search = search.searcher
    return search if hasattr(search, "_ot_study") else None


OPTUNA_DB = "optuna.db"


def export_optuna_study(source: Any, path: str | os.PathLike[str], study_name: str) -> int:
    """Copy every finished trial of the Optuna study ``source`` into the SQLite study ``study_name``
    at ``path`` (created when missing); trials copied before are skipped. Returns how many were added.

    A trial is known by the ``autonorm.source_number`` user attribute it gets here, so running this
    again after a resumed study adds only the trials that finished since.
    """
    import optuna

    url = f"sqlite:///{Path(path).resolve()}"
    target = optuna.create_study(
        storage=url, study_name=study_name, directions=source.directions, load_if_exists=True
    )
    done = {t.user_attrs.get("autonorm.source_number") for t in target.get_trials(deepcopy=False)}
    new = []
    for trial in source.get_trials(deepcopy=True):
        if not trial.state.is_finished() or trial.number in done:
            continue
        trial.set_user_attr("autonorm.source_number", trial.number)
        new.append(trial)
    target.add_trials(new)
    return len(new)


def _save_optuna_study(
    plan: StudyPlan,
    storage: ResolvedStorage,
    experiment_path: str,
    searcher: Any,
    tracker: MlflowTrackingCallback,
) -> None:
    """``<experiment dir>/optuna.db`` (for ``optuna-dashboard``), also an artifact of the plan's run.

    The searcher keeps its study in memory (what Tune pickles and restores); this is a copy made at
    the end of every run. Never fails the study: a problem is logged.
    """
    import shutil
    import tempfile

    scratch: Path | None = None  # S3 storage: the copy is made here, then removed
    try:
        if storage.is_local:
            local = Path(experiment_path) / OPTUNA_DB
            added = export_optuna_study(searcher._ot_study, local, plan.name)
        else:
            scratch = Path(tempfile.mkdtemp(prefix="optuna-"))
            local = scratch / OPTUNA_DB
            fs = storage.filesystem
            assert fs is not None
            with (
                contextlib.suppress(FileNotFoundError, OSError),
                fs.open_input_stream(f"{experiment_path}/{OPTUNA_DB}") as src,
            ):
                local.write_bytes(src.read())
            added = export_optuna_study(searcher._ot_study, local, plan.name)
            with fs.open_output_stream(f"{experiment_path}/{OPTUNA_DB}") as out:
                out.write(local.read_bytes())
        where = f"{storage.experiment_uri(plan.name)}/{OPTUNA_DB}"
        logger.info("optuna study %s: %d trial(s) added to %s", plan.name, added, where)
        if storage.is_local:
            print(f"[{plan.name}] optuna study -> optuna-dashboard sqlite:///{local.resolve()}", flush=True)
        else:
            print(
                f"[{plan.name}] optuna study -> {where} (download it, then optuna-dashboard sqlite:///optuna.db)"
            )
        tracker.log_file(local)
    except Exception as exc:
        logger.error("could not save the Optuna study of %s to %s: %s", plan.name, OPTUNA_DB, exc)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
