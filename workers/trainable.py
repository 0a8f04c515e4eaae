"""The Tune side of one trial: trial config -> autonorm_core data/model/fit -> ``ray.tune.report``.

A *trial function* ``fn(config, session)`` gets the resolved trial config (``plan.base_config`` with
the sampled dotted-path parameters applied) and a :class:`TrialSession` through which it reports one
result per epoch, with the whole training state as a checkpoint. :func:`autonorm_trial` is the
default; tests and benchmarks inject their own, and get the same reporting/resume path.

Why it looks like this (docs/architecture.md):

* ``ray.tune.report`` only -- ``ray.train.report`` inside a Tune trial fails the trial.
* Every report carries ``status``: ``running`` until the last epoch, then ``completed`` or
  ``diverged``. The searcher tells Optuna PRUNED for a trial whose last result is not final, so the
  one field separates "a scheduler stopped it" from "it finished".
* Every report carries the study's search metric. Tune checks each result for it and a result
  without it raises inside ``Tuner.fit``, ending the whole study (and every restore of it): a trial
  that diverged before finishing an epoch reports the metric as NaN; the searcher tells Optuna FAIL.
* Every report carries the resolved trial config as JSON (:data:`CONFIG_RESULT_KEY`), so the driver
  reads it from ``trial.last_result`` instead of resolving it again.
* A new trial process costs ~10 s here (torch import, first optimizer). Tune reuses actors
  (``reuse_actors=True``); torch is imported once per worker process, inside the trial, so the
  driver never pays for it, and loaded data sets are memoised per process (see :func:`_load_splits`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from workers.dotted import with_values
from workers.members import member_params

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_FILE",
    "CONFIG_RESULT_KEY",
    "TrialFunction",
    "TrialSession",
    "autonorm_trial",
    "build_trial",
    "config_from_result",
    "resolve_trial_config",
    "tune_entry",
]

#: File name of the training state inside a Tune checkpoint directory.
CHECKPOINT_FILE = "state.pt"

#: Result key of the resolved trial config, as JSON text: one string column in Tune's logs, never a
#: number, so the MLflow callback (numbers only) never logs it. Read it with :func:`config_from_result`.
CONFIG_RESULT_KEY = "config_resolved"
#: Wall-clock stamps every report carries (see :attr:`TrialSession.started_at`); they differ between
#: two runs of the same trial, like ``autonorm_core.training.TIMING_KEYS``.
WALL_KEYS: tuple[str, str] = ("wall_started", "wall_reported")


def resolve_trial_config(base_config: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The config a trial runs: a deep copy of ``base_config`` with each dotted-path param applied.

    ``params`` are Tune's trial config: Optuna's suggested values or one grid point, keyed by dotted
    path (``"model.norm.tau"``, ``"model.hidden.0"``, ``"seed"``). Nested mappings (Tune's own
    unflattening of ``a/b`` keys) are applied leaf by leaf. A thin alias of
    :func:`workers.dotted.with_values`, the one implementation spec validation uses too.

    Raises:
        workers.dotted.PathError: a path descends into a single value, or a list index is out of range.
    """
    return with_values(base_config, params)


def config_from_result(
    result: Mapping[str, Any] | None, base_config: Mapping[str, Any], params: Mapping[str, Any]
) -> dict[str, Any]:
    """The resolved trial config, read from a trial's result when the trial put it there.

    Every report made through a :class:`TrialSession` started by :func:`tune_entry` carries the
    config as JSON under :data:`CONFIG_RESULT_KEY`, so the driver (runner, tracking) reads it from
    ``trial.last_result`` instead of resolving it again. A trial that never reported (it errored
    first) falls back to :func:`resolve_trial_config`.
    """
    text = (result or {}).get(CONFIG_RESULT_KEY)
    if isinstance(text, str):
        try:
            config = json.loads(text)
        except ValueError:
            config = None
        if isinstance(config, dict):
            return config
    return resolve_trial_config(base_config, params)


def _with_search_metric(payload: dict[str, Any], metric: str | None) -> None:
    """Tune's strict metric check ends the whole study at a result without the search metric: a
    trial with nothing finite to report (diverged in its first epoch) reports NaN instead."""
    if metric is not None and payload.get(metric) is None:
        payload[metric] = math.nan


def _diverged_report(result: Any) -> dict[str, Any]:
    """The last report of a diverged fit: the last whole epoch's metrics (``epoch`` 0 when none
    finished) with the loss that blew up as ``train_loss`` (or ``val_loss``), NaN/inf as observed,
    read from the fit's typed :class:`~autonorm_core.training.Divergence` (NaN when it has none)."""
    metrics: dict[str, Any] = dict(result.final)
    metrics["epoch"] = metrics.get("epoch", 0)
    divergence = getattr(result, "divergence", None)
    observed = math.nan if divergence is None else float(divergence.value)
    if divergence is not None and divergence.loss == "validation":
        metrics["val_loss"] = observed
        metrics["train_loss"] = math.nan  # the epoch did not finish: no whole-epoch training loss
    else:
        metrics["train_loss"] = observed
    return metrics


class TrialSession:
    """What a trial function talks to: per-epoch reports with checkpoints, and the state to resume.

    Created by the Tune entry point for every trial run (also when Tune restarts a failed trial or
    resumes one after ``Tuner.restore``: then :attr:`resume_state` holds the last checkpoint).

    Args:
        report_fn: ``ray.tune.report`` in a trial; injectable for tests without Ray.
        checkpoint: the checkpoint Tune hands back (``ray.tune.get_checkpoint()``), or ``None``.
        tracking_uri: the study's resolved MLflow URI (passed explicitly: a relative or default URI
            would resolve differently in each worker).
        metric: the study's search metric. Every report carries it; NaN when the trial function
            left it out (or reported ``None``), so Tune's strict metric check never ends the study.
        config: the resolved trial config, added to every report as JSON under
            :data:`CONFIG_RESULT_KEY`.
    """

    def __init__(
        self,
        *,
        report_fn: Callable[..., None] | None = None,
        checkpoint: Any = None,
        tracking_uri: str | None = None,
        metric: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._report_fn = report_fn
        self.metric = metric
        # Serialised once: a few hundred bytes per report, no work per epoch.
        self._config_json = None if config is None else json.dumps(config, sort_keys=True, default=str)
        #: The study's MLflow URI, for trial functions that log artifacts of their own. Runs and
        #: metrics are written by the driver; a trial never needs it for those.
        self.tracking_uri = tracking_uri
        self._checkpoint = checkpoint
        self._resume_state: dict[str, Any] | None = None
        self._resume_loaded = False
        self.last_status: str | None = None
        self.last_metrics: dict[str, Any] = {}
        self.reports = 0
        self._last_state: Mapping[str, Any] | None = None
        #: Wall clock (``time.time()``) when this run of the trial began in its worker. Every report
        #: carries it as ``wall_started`` and its own send time as ``wall_reported``: a trial's time
        #: measured inside the worker, as the scaling benches and the concurrency test read it from
        #: Tune's result files (Tune's own ``timestamp`` is whole seconds; its ``time_total_s``
        #: leaves out the setup before the first report).
        self.started_at = time.time()

    def rewind(self) -> None:
        """Make :attr:`resume_state` the last state reported in this process (an in-process retry
        resumes where the trial last checkpointed, not from scratch)."""
        if self._last_state is not None:
            self._resume_state = dict(self._last_state)
            self._resume_loaded = True

    @functools.cached_property
    def node_id(self) -> str:
        """The Ray node this trial runs on (reported so a study can show where trials ran)."""
        import ray

        # Asking an uninitialised Ray for its context would start a whole local cluster.
        if not ray.is_initialized():
            return "local"
        return str(ray.get_runtime_context().get_node_id())

    @functools.cached_property
    def trial_id(self) -> str:
        """Tune's id of this trial (``local`` outside Tune)."""
        import ray

        if not ray.is_initialized():
            return "local"
        from ray import tune

        return str(tune.get_context().get_trial_id() or "local")

    @functools.cached_property
    def device(self) -> str:
        """``cuda`` when Ray gave this trial a GPU, else ``cpu``.

        Ray sets ``CUDA_VISIBLE_DEVICES`` to the trial's GPUs, so ``cuda`` is always the right one.
        """
        import ray

        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
        if not gpu_ids:
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def resume_state(self) -> dict[str, Any] | None:
        """The training state of the last reported checkpoint, ``None`` on a fresh start."""
        if not self._resume_loaded:
            self._resume_loaded = True
            if self._checkpoint is not None:
                self._resume_state = _resume_from(self._checkpoint, self.trial_id)
        return self._resume_state

    def report(
        self, metrics: Mapping[str, Any], *, state: Mapping[str, Any] | None = None, status: str = "running"
    ) -> None:
        """Report one epoch (``metrics["epoch"]`` is the trial's own epoch) to Tune.

        Args:
            metrics: JSON-able numbers; ``epoch`` should be present (MLflow steps use it, and a trial's
                MLflow run is created at its first result with an ``epoch``).
            state: the whole training state, saved as this epoch's checkpoint.
            status: ``running``, or on the last report ``completed`` / ``diverged`` / ``error``.
        """
        payload = dict(metrics)
        payload["status"] = status
        payload["node_id"] = self.node_id
        payload[WALL_KEYS[0]] = self.started_at
        payload[WALL_KEYS[1]] = time.time()
        _with_search_metric(payload, self.metric)
        if self._config_json is not None:
            payload[CONFIG_RESULT_KEY] = self._config_json
        report_fn = self._report_fn
        if report_fn is None:
            from ray import tune

            report_fn = tune.report
        if state is None:
            report_fn(payload)
        else:
            from ray import tune

            from autonorm_core.training import save_state

            directory = tempfile.mkdtemp(prefix="autonorm-ckpt-")
            try:
                save_state(os.path.join(directory, CHECKPOINT_FILE), state)
                # tune.report persists (copies) the checkpoint to storage before it returns.
                report_fn(payload, checkpoint=tune.Checkpoint.from_directory(directory))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        self.last_status = status
        self.last_metrics = payload
        self.reports += 1
        if state is not None:
            self._last_state = state


def _read_state(checkpoint: Any) -> dict[str, Any]:
    from autonorm_core.training import load_state

    with checkpoint.as_directory() as directory:
        return load_state(os.path.join(directory, CHECKPOINT_FILE))


def _older_checkpoints(checkpoint: Any) -> list[Any]:
    """The trial's checkpoints older than ``checkpoint`` (Tune keeps a few), newest first."""
    import pyarrow.fs
    from ray import tune

    fs, path = checkpoint.filesystem, str(checkpoint.path).rstrip("/")
    parent, _, name = path.rpartition("/")
    infos = fs.get_file_info(pyarrow.fs.FileSelector(parent))
    older = sorted(
        i.base_name
        for i in infos
        if i.type == pyarrow.fs.FileType.Directory
        and i.base_name.startswith("checkpoint_")
        and i.base_name < name
    )
    return [tune.Checkpoint(f"{parent}/{n}", filesystem=fs) for n in reversed(older)]


def _resume_from(checkpoint: Any, trial_id: str) -> dict[str, Any] | None:
    """The training state to resume from: the newest readable checkpoint, ``None`` (from scratch)
    when none is. A node that died while writing leaves a truncated (or empty) newest checkpoint;
    that must cost the epochs since the previous one, not the trial, and it is said in one line:
    which checkpoint, which one the trial resumed from and which epochs that keeps. Nothing is
    deleted: the unreadable folder stays for Tune's checkpoint manager, which tracks it."""
    try:
        return _read_state(checkpoint)
    except Exception as exc:
        problem = _problem(exc)
    try:
        candidates = _older_checkpoints(checkpoint)
    except Exception:
        candidates = []
    where = f"{_experiment_prefix()}trial {trial_id}: checkpoint {checkpoint.path} is unreadable ({problem})"
    for older in candidates:
        try:
            state = _read_state(older)
        except Exception:
            continue
        epoch = state.get("epoch") if isinstance(state, dict) else None
        kept = (
            f", epochs 1-{int(epoch)} kept; training goes on from epoch {int(epoch) + 1}"
            if isinstance(epoch, int | float) and epoch >= 1
            else ""
        )
        _say(f"{where}; resumed from {_base_name(older.path)}{kept}")
        return state
    _say(f"{where}; no older one, restarting it from scratch")
    return None


def _problem(exc: BaseException) -> str:
    """``Type: first sentence`` of an exception, short enough for one line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = text.split(". ")[0][:100]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _base_name(path: Any) -> str:
    return str(path).rstrip("/").rpartition("/")[2]


def _experiment_prefix() -> str:
    """``[<phase>] `` (the Tune experiment's name, as the progress lines show it) inside Tune."""
    try:
        import ray

        if not ray.is_initialized():
            return ""
        from ray import tune

        name = tune.get_context().get_experiment_name()
    except Exception:
        return ""
    return f"[{name}] " if name else ""


def _say(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


TrialFunction = Callable[[dict[str, Any], TrialSession], None]
"""``fn(config, session)``: runs one trial, reporting every epoch through ``session``."""


class _EpochReporter:
    """``fit`` callback + ``checkpoint_fn``: pairs an epoch's metrics with its state, then reports.

    ``fit`` calls ``checkpoint_fn`` before the callbacks; pairing by epoch keeps this correct in
    either order.
    """

    def __init__(self, session: TrialSession, *, num_epochs: int) -> None:
        self._session = session
        self._num_epochs = num_epochs
        self._states: dict[int, dict[str, Any]] = {}
        self._metrics: dict[int, dict[str, Any]] = {}

    def checkpoint_fn(self, epoch: int, state: dict[str, Any]) -> None:
        self._states[epoch] = state
        self._flush(epoch)

    def on_epoch_end(self, epoch: int, model: Any, metrics: dict[str, float]) -> None:
        self._metrics[epoch] = dict(metrics)
        self._flush(epoch)

    def _flush(self, epoch: int) -> None:
        if epoch in self._metrics and epoch in self._states:
            self._report(epoch)

    def _report(self, epoch: int) -> None:
        metrics = self._metrics.pop(epoch)
        state = self._states.pop(epoch, None)
        metrics.setdefault("epoch", epoch)
        status = "completed" if epoch >= self._num_epochs else "running"
        self._session.report(metrics, state=state, status=status)

    def finish(self) -> None:
        """Report epochs whose state never arrived (no checkpoint_fn call), in order."""
        for epoch in sorted(self._metrics):
            self._report(epoch)
        self._states.clear()


_FILE_OPTIONS = ("path", "target", "test_path", "test_fraction", "ood_test", "max_tokens")
"""Loader keywords passed through to ``load_dataset``: the generic loaders' (``arrays``, ``table``) and
``oanc_pos``'s (``test_fraction``, ``ood_test``, ``max_tokens``)."""


@functools.lru_cache(maxsize=2)
def _load_splits(
    name: str,
    seed: int,
    data_root: str | None,
    val_fraction: float,
    subset: Any,
    device: str,
    options: tuple[tuple[str, Any], ...] = (),
) -> Any:
    """Memoised per worker process: with ``reuse_actors`` the next trial on the same data skips the
    parse. Splits are read-only inputs to ``fit``, so sharing them between trials is safe."""
    from autonorm_core.data import load_dataset

    return load_dataset(
        name,
        seed=seed,
        data_root=data_root,
        val_fraction=val_fraction,
        subset=subset,
        device=device,
        **dict(options),
    )


def build_trial(
    config: Mapping[str, Any], device: str, *, data_memo: dict[Any, Any] | None = None
) -> tuple[Any, Any, Any]:
    """``(splits, model, TrainConfig)`` of a resolved trial config, as every trial builds them (one
    alone, or a member of a stacked group): the data split and the model's initial weights both
    from the config's ``seed``.

    Config sections (see :mod:`workers.plan`): ``data`` (``type`` = data set name, plus
    ``load_dataset`` keywords), ``model`` (``type`` = model name; ``preset`` and the rest passed to
    ``create_model``), ``training`` (``TrainConfig.from_dict``), ``seed``.

    ``data_memo``: splits already loaded for other trials of this process, by their loading
    arguments; the members of a group that share a seed (its cells' seeds) share one split, so a
    group holds one copy per distinct seed, not one per member.
    """
    import torch

    from autonorm_core.models import create_model
    from autonorm_core.training import TrainConfig

    seed = int(config.get("seed", 0))
    data = dict(config["data"])
    data_name = data.pop("type")
    subset = data.pop("subset", None)
    if isinstance(subset, list):
        subset = tuple(subset)  # lru_cache needs hashable keys; YAML gives lists
    args = (
        data_name,
        seed,
        data.pop("data_root", None),
        float(data.pop("val_fraction", 0.1)),
        subset,
        device,
        tuple((k, data.pop(k)) for k in _FILE_OPTIONS if data.get(k) is not None),
    )
    data = {k: v for k, v in data.items() if not (k in _FILE_OPTIONS and v is None)}
    if data:
        raise ValueError(
            f"unknown data keys {sorted(data)}; valid: type, subset, val_fraction, data_root, {', '.join(_FILE_OPTIONS)}"
        )
    splits = data_memo.get(args) if data_memo is not None else None
    if splits is None:
        splits = _load_splits(*args)
        if data_memo is not None:
            data_memo[args] = splits
    model_cfg = dict(config["model"])
    model_name = model_cfg.pop("type")
    # create_model initialises from torch's default generator: seed a forked copy so the trial is
    # reproducible from its seed and the worker's global RNG (shared with the next trial) is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_model(model_name, splits, **model_cfg)
    return splits, model, TrainConfig.from_dict(config.get("training", {}))


def autonorm_trial(config: dict[str, Any], session: TrialSession) -> None:
    """The default trial: build data, model and ``TrainConfig`` through autonorm_core and ``fit``.

    Config sections (see :mod:`workers.plan`): ``data`` (``type`` = data set name, plus
    ``load_dataset`` keywords), ``model`` (``type`` = model name; ``preset`` and the rest passed to
    ``create_model``), ``training`` (``TrainConfig.from_dict``), ``seed``. The seed drives the data
    split, the model init and the fit.
    """
    from autonorm_core.training import fit

    seed = int(config.get("seed", 0))
    splits, model, cfg = build_trial(config, session.device)
    reporter = _EpochReporter(session, num_epochs=cfg.num_epochs(splits.sizes["train"]))
    result = fit(
        model,
        splits,
        cfg,
        seed=seed,
        callbacks=(reporter,),
        device=session.device,
        resume_state=session.resume_state,
        checkpoint_fn=reporter.checkpoint_fn,
    )
    reporter.finish()
    if result.status == "diverged":
        # Always one more report: the fit stopped inside an epoch (or at its validation), so no
        # report says so yet. It has the last whole epoch's metrics (none: epoch 0, the search
        # metric NaN) and the loss that blew up.
        session.report(_diverged_report(result), status="diverged")
    elif session.last_status != "completed":
        # An early stop before the planned last epoch: the last whole epoch's metrics, once more,
        # so the trial's final status is on record.
        session.report(dict(result.final), status="completed")


def tune_entry(
    config: dict[str, Any],
    *,
    trial_fn: TrialFunction,
    base_config: Mapping[str, Any],
    tracking_uri: str | None = None,
    metric: str | None = None,
    retries: int = 0,
) -> None:
    """Tune function trainable: resolve the trial config, hand the checkpoint over, run ``trial_fn``.

    Wrapped with ``tune.with_parameters`` by the runner so ``trial_fn`` and ``base_config`` travel
    through the object store once, not inside every trial config.

    Args:
        config: Tune's trial config (sampled parameters by dotted path).
        trial_fn: the trial function.
        base_config: the plan's base trial config.
        tracking_uri: the study's MLflow URI, for the session.
        metric: the plan's search metric (``plan.metric``). Every report then carries it (NaN when
            the trial has no value), which Tune requires of every result; ``None`` adds nothing.
        retries: in-process retries of application errors (see :func:`run_with_retries`).
    """
    from ray import tune

    _quiet_exit_in_callbacks()
    if member_params(config) is not None:
        raise ValueError("a stacked group's trial config: it runs through workers.group_trial.group_entry")
    resolved = resolve_trial_config(base_config, config)
    session = TrialSession(
        checkpoint=tune.get_checkpoint(), tracking_uri=tracking_uri, metric=metric, config=resolved
    )
    run_with_retries(trial_fn, resolved, session, retries=retries)


def _quiet_unraisable(info: Any) -> None:
    if info.exc_type is SystemExit:
        return  # Ray stopping this worker (its SIGTERM handler raises SystemExit), inside a GC callback
    sys.__unraisablehook__(info)


def _quiet_exit_in_callbacks() -> None:
    """When Ray stops an idle trial worker at the end of a study, its SIGTERM handler raises
    ``SystemExit`` wherever the process is, often inside a weakref callback, where Python prints it
    as an "Exception ignored" traceback that Ray forwards to the driver: the user would read it as
    a failure. Only that case is silenced; every other unraisable exception is printed as before."""
    sys.unraisablehook = _quiet_unraisable


def run_with_retries(
    trial_fn: TrialFunction, config: dict[str, Any], session: TrialSession, *, retries: int
) -> None:
    """Run ``trial_fn``; an exception of the trial's own (application error) is retried in this
    process up to ``retries`` times from the last reported checkpoint, then the trial ends with a
    final ``status: error`` report instead of raising.

    Application errors and infrastructure failures are kept apart this way: Tune's ``FailureConfig``
    then only sees a trial's process or node dying (a preempted spot node, an OOM kill), which
    ``StudyPlan.node_failures`` bounds, and a preemption never uses up the study's ``retries``.
    Ray's own control-flow exceptions are re-raised untouched.
    """
    attempt = 0
    while True:
        try:
            trial_fn(config, session)
            return
        except Exception as exc:
            if type(exc).__module__.startswith("ray."):
                raise
            attempt += 1
            if attempt > retries:
                logger.error("trial failed after %d attempt(s): %r", attempt, exc)
                final = {"epoch": session.last_metrics.get("epoch", 0), "attempts": float(attempt)}
                session.report(final, status="error")
                return
            logger.warning(
                "trial error (attempt %d of %d), retrying from the last checkpoint: %r",
                attempt,
                retries + 1,
                exc,
            )
            session.rewind()
