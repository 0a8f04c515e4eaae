"""The Optuna study of a phase copied out of its searcher: ``<experiment dir>/optuna.db`` for
``optuna-dashboard``, also an artifact of the phase's MLflow run."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers import ray_internals
from workers.plan import StudyPlan
from workers.storage import ResolvedStorage

if TYPE_CHECKING:
    from workers.tracking.callback import MlflowTrackingCallback

__all__ = ["OPTUNA_DB", "OptunaExport", "export_optuna_study", "export_trials"]

logger = logging.getLogger(__name__)


def _searcher_of(tuner: Any) -> Any:
    """The Optuna searcher a Tuner ran with: Tune restores the pickled one in place after a restore,
    and wraps it (``ConcurrencyLimiter``) without copying it. Private Ray API (read through
    :mod:`workers.ray_internals`); ``None`` if it moved."""
    search = ray_internals.tuner_search_alg(tuner)
    while search is not None and not ray_internals.has_optuna_study(search) and hasattr(search, "searcher"):
        search = search.searcher
    return search if ray_internals.has_optuna_study(search) else None


OPTUNA_DB = "optuna.db"


def export_optuna_study(source: Any, path: str | os.PathLike[str], study_name: str) -> int:
    """Copy every finished trial of the Optuna study ``source`` into the SQLite study ``study_name``
    at ``path`` (created when missing); trials copied before are skipped. Returns how many were added.

    A trial is known by the ``autonorm.source_number`` user attribute it gets here, so running this
    again after a resumed study adds only the trials that finished since.
    """
    return export_trials(source.get_trials(deepcopy=True), source.directions, path, study_name)


def export_trials(trials: Any, directions: Any, path: str | os.PathLike[str], study_name: str) -> int:
    """:func:`export_optuna_study` from the study's trials (``FrozenTrial``) and directions."""
    import optuna

    url = f"sqlite:///{Path(path).resolve()}"
    target = optuna.create_study(
        storage=url, study_name=study_name, directions=directions, load_if_exists=True
    )
    done = {t.user_attrs.get("autonorm.source_number") for t in target.get_trials(deepcopy=False)}
    new = []
    for trial in trials:
        if not trial.state.is_finished() or trial.number in done:
            continue
        trial.set_user_attr("autonorm.source_number", trial.number)
        new.append(trial)
    target.add_trials(new)
    return len(new)


@dataclass
class OptunaExport:
    """``<experiment dir>/optuna.db`` (for ``optuna-dashboard``), also an artifact of the plan's run,
    made by a child process while the driver goes on with the study's end.

    The searcher keeps its study in memory (what Tune pickles and restores); this is a copy made at
    the end of every run. Optuna's SQLite storage writes a trial in about 44 statements: 15 s for a
    1,000-trial study here, which the driver spent waiting before (issue #40). :meth:`start` hands
    the finished trials to ``python -m workers.optuna_export`` and returns; :meth:`finish` waits for
    it, uploads the file (S3 storage), prints where it is and logs it to MLflow. Never fails the
    study: a problem is logged.
    """

    plan_name: str
    storage: ResolvedStorage
    experiment_path: str
    local: Path  # the optuna.db the child writes (in the experiment folder, or a scratch copy for S3)
    scratch: Path  # the trials handed to the child; removed by finish
    proc: Any  # the child process

    @classmethod
    def start(
        cls, plan: StudyPlan, storage: ResolvedStorage, experiment_path: str, searcher: Any
    ) -> OptunaExport | None:
        import pickle
        import shutil
        import subprocess
        import sys
        import tempfile

        scratch = Path(tempfile.mkdtemp(prefix="optuna-"))
        try:
            study = ray_internals.optuna_study(searcher)
            trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
            (scratch / "trials.pkl").write_bytes(pickle.dumps((list(study.directions), trials)))
            if storage.is_local:
                local = Path(experiment_path) / OPTUNA_DB
            else:
                local = scratch / OPTUNA_DB
                fs = storage.filesystem
                assert fs is not None
                with (
                    contextlib.suppress(FileNotFoundError, OSError),
                    fs.open_input_stream(f"{experiment_path}/{OPTUNA_DB}") as src,
                ):
                    local.write_bytes(src.read())
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "workers.optuna_export",
                    str(scratch / "trials.pkl"),
                    str(local),
                    plan.name,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except Exception as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            logger.error("could not save the Optuna study of %s to %s: %s", plan.name, OPTUNA_DB, exc)
            return None
        return cls(plan.name, storage, experiment_path, local, scratch, proc)

    def finish(self, tracker: MlflowTrackingCallback, timeout_s: float = 600.0) -> None:
        import shutil

        try:
            out, err = self.proc.communicate(timeout=timeout_s)
            if self.proc.returncode != 0:
                last = (err or "").strip().splitlines()[-1:] or [f"exit status {self.proc.returncode}"]
                raise RuntimeError(last[0])
            added = int(out.strip().splitlines()[-1])
            if not self.storage.is_local:
                fs = self.storage.filesystem
                assert fs is not None
                with fs.open_output_stream(f"{self.experiment_path}/{OPTUNA_DB}") as dst:
                    dst.write(self.local.read_bytes())
            where = f"{self.storage.experiment_uri(self.plan_name)}/{OPTUNA_DB}"
            logger.info("optuna study %s: %d trial(s) added to %s", self.plan_name, added, where)
            if self.storage.is_local:
                print(
                    f"[{self.plan_name}] optuna study -> optuna-dashboard sqlite:///{self.local.resolve()}",
                    flush=True,
                )
            else:
                print(
                    f"[{self.plan_name}] optuna study -> {where} "
                    "(download it, then optuna-dashboard sqlite:///optuna.db)"
                )
            tracker.log_file(self.local)
        except BaseException as exc:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if not isinstance(exc, Exception):
                raise  # Ctrl-C while waiting: the copy is made by the next run
            logger.error("could not save the Optuna study of %s to %s: %s", self.plan_name, OPTUNA_DB, exc)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _main(argv: list[str]) -> int:
    """``python -m workers.optuna_export TRIALS_PICKLE DB STUDY_NAME``: prints how many were added."""
    import pickle

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials_path, db, name = argv
    with open(trials_path, "rb") as f:
        directions, trials = pickle.load(f)
    print(export_trials(trials, directions, db, name), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
