"""Pins of the touch points of ``workers/ray_internals.py`` that no other test pins (issue #51): each
asserts that the private Ray name still exists, in the installed Ray, with the shape the adapter
relies on. The others are pinned beside the behaviour they serve: ``test_units.py`` (credentials,
gone checkpoints, staging folders, compact JSON, members' statistics), ``test_uploads.py`` (the
syncer and Ray's upload), ``test_tune_state.py`` (the snapshot's writer and readers, Tune's status
sets), ``test_study_ray.py`` (the idle-snapshot skip), ``test_search.py`` (``OptunaSearch``'s fields,
the scheduler's waiting sets past Tune's wrapper)."""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path

import pytest

from workers import ray_internals


def test_the_installed_ray_is_the_one_the_adapter_was_checked_against() -> None:
    # A new Ray: check every touch point listed in workers/ray_internals.py, then move the version.
    import ray

    assert ray.__version__ == ray_internals.RAY_VERSION_CHECKED


def test_the_adapters_docstring_lists_every_private_name_it_touches() -> None:
    doc = ray_internals.__doc__ or ""
    assert ray_internals.RAY_VERSION_CHECKED in doc
    missing = [name for name in ray_internals.PRIVATE_NAMES if name not in doc]
    assert missing == []
    for name in ray_internals.__all__:  # every accessor and installer is named in it too
        if callable(getattr(ray_internals, name)) and name not in ("cheaper_results",):
            assert f":func:`{name}`" in doc, name


def test_the_controller_fields_the_snapshot_reads_are_tunes() -> None:
    from ray.tune.execution.tune_controller import TuneController

    init = inspect.getsource(TuneController.__init__)
    for field in ("_trials", "_storage", "_search_alg", "_checkpoint_manager"):
        assert f"self.{field} =" in init or f"self.{field}:" in init, field
    assert list(inspect.signature(TuneController.resume).parameters) == ["self", "resume_config"]
    assert list(inspect.signature(TuneController.save_to_dir).parameters) == ["self"]
    assert "self._search_alg.save_to_dir(" in inspect.getsource(TuneController.save_to_dir)


def test_a_searcher_is_not_saved_for_one_snapshot_and_is_again_after() -> None:
    from ray.tune.search import Searcher

    assert list(inspect.signature(Searcher.save_to_dir).parameters)[:2] == ["self", "checkpoint_dir"]

    class Saving(Searcher):  # type: ignore[misc]
        saves = 0

        def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
            Saving.saves += 1

    class Controller:
        def __init__(self) -> None:
            self._search_alg = Saving()

    controller = Controller()
    with ray_internals.searcher_not_saved(controller):
        controller._search_alg.save_to_dir("dir")
        with ray_internals.searcher_not_saved(controller):  # nested: still not saved, and undone once
            controller._search_alg.save_to_dir("dir")
        controller._search_alg.save_to_dir("dir")
    assert Saving.saves == 0 and "save_to_dir" not in vars(controller._search_alg)
    controller._search_alg.save_to_dir("dir")
    assert Saving.saves == 1


def test_the_snapshot_readers_are_wrapped_once() -> None:
    from ray.tune.analysis import experiment_analysis
    from ray.tune.execution.tune_controller import TuneController

    from workers import tune_state

    tune_state.install()
    wrapped = {
        "save_to_dir": TuneController.save_to_dir,
        "resume": TuneController.resume,
        "_restore_trials": TuneController._restore_trials,
        "_load_trials": experiment_analysis.ExperimentAnalysis._load_trials,
        "_loads_with_cloudpickle": vars(experiment_analysis)["_loads_with_cloudpickle"],
    }
    tune_state.install()  # once per process
    assert TuneController.save_to_dir is wrapped["save_to_dir"]
    assert vars(experiment_analysis)["_loads_with_cloudpickle"] is wrapped["_loads_with_cloudpickle"]
    for marker, fn in zip(
        (
            "_autonorm_compacts",
            "_autonorm_at_experiment",
            "_autonorm_restores_finished",
            "_autonorm_reads_finished",
            "_autonorm_merges",
        ),
        wrapped.values(),
        strict=True,
    ):
        assert getattr(fn, marker, False), marker
    # the wrapper hands Ray's reader its one argument, the snapshot as read
    assert len(inspect.signature(vars(experiment_analysis)["_loads_with_cloudpickle"]).parameters) == 1


def test_the_worker_output_dispatcher_has_a_lock_and_a_list_of_handlers() -> None:
    import threading

    dispatcher = ray_internals.worker_stream_dispatcher()
    assert dispatcher is not None
    assert isinstance(vars(dispatcher)["_lock"], type(threading.Lock()))
    assert isinstance(dispatcher.handlers, list)
    emit = inspect.getsource(type(dispatcher).emit)  # (name, handler) pairs, called under the lock
    assert "with self._lock:" in emit and "for pair in self.handlers:" in emit and "_, handle = pair" in emit


def test_the_tuner_keeps_the_search_algorithm_it_runs_with(tmp_path: Path) -> None:
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    searcher = BasicVariantGenerator()
    tuner = tune.Tuner(
        lambda config: None,
        tune_config=tune.TuneConfig(search_alg=searcher),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pin"),
    )
    assert ray_internals.tuner_search_alg(tuner) is searcher
    assert ray_internals.tuner_search_alg(object()) is None  # a Tuner without that path: no searcher


def test_the_scheduler_accessors_read_tunes_waiting_sets() -> None:
    from ray.tune.execution.tune_controller import TrialRunnerWrapper

    class Controller:
        def __init__(self) -> None:
            self._pending_trials = {"a"}
            self._paused_trials: set[str] = set()

    controller = Controller()
    wrapped = TrialRunnerWrapper(controller, trial_executor=None)  # type: ignore[arg-type]
    assert ray_internals.unwrapped_controller(wrapped) is controller
    assert ray_internals.unwrapped_controller(controller) is controller
    assert (
        ray_internals.pending_trials(controller) == {"a"} and ray_internals.paused_trials(controller) == set()
    )
    assert ray_internals.pending_trials(object()) is None
    assert "self._tune_controller = tune_controller" in inspect.getsource(TrialRunnerWrapper.__init__)


def test_tunes_tuner_pickle_has_the_name_the_runner_checks() -> None:
    from ray.tune.impl import tuner_internal

    from workers.runner import TUNER_STATE

    assert tuner_internal._TUNER_PKL == ray_internals.TUNER_STATE_FILE == TUNER_STATE


def test_rays_autoscaler_lines_carry_the_event_mark() -> None:
    from ray._private import worker

    assert ray_internals.AUTOSCALER_EVENT in inspect.getsource(worker.filter_autoscaler_events)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (ray_internals.TRAIN_STORAGE_LOGGER, "Checkpoint successfully created"),
        (ray_internals.TRAIN_SYNCER_LOGGER, "Last sync command failed"),
        (ray_internals.EXPERIMENT_STATE_LOGGER, "Saving experiment state to storage at"),
    ],
)
def test_the_ray_loggers_named_are_the_modules_that_log_those_lines(name: str, message: str) -> None:
    import importlib

    source = inspect.getsource(importlib.import_module(name))
    assert "logging.getLogger(__name__)" in source and message in source
    assert logging.getLogger(name).name == name


def test_the_upload_is_rays_own() -> None:
    from ray.train._internal.storage import _upload_to_fs_path

    assert list(inspect.signature(_upload_to_fs_path).parameters)[:3] == ["local_path", "fs", "fs_path"]
    assert "_upload_to_fs_path(local_path, fs, fs_path)" in inspect.getsource(ray_internals.upload_to_fs_path)


def test_rays_package_prefix_and_tune_stop_handler_name_are_still_rays() -> None:
    import signal

    from ray._private.runtime_env import packaging
    from ray.tune import tune as tune_module

    assert packaging.RAY_PKG_PREFIX == ray_internals.RAY_PACKAGE_PREFIX
    assert re.search(r"def signal_interrupt_tune_run\(", inspect.getsource(tune_module))

    # Tune defines the handler inside ``run``; it is recognised by that name, nothing else is.
    def signal_interrupt_tune_run(sig: int, frame: object) -> None: ...

    assert ray_internals.is_tune_stop_handler(signal_interrupt_tune_run)
    assert not ray_internals.is_tune_stop_handler(signal.SIG_DFL)
    assert not ray_internals.is_tune_stop_handler(lambda *_: None)
