"""The Tune side of one trial: trial config -> autonorm_core data/model/fit -> ``ray.tune.report``.

A *trial function* ``fn(config, session)`` gets the resolved trial config (``plan.base_config`` with
the sampled dotted-path parameters applied) and a :class:`TrialSession` through which it reports one
result per epoch, with the whole training state as a checkpoint. :func:`autonorm_trial` is the
default; tests and benchmarks inject their own, and get the same reporting/resume path.

Why it looks like this (DESIGN.md):

* ``ray.tune.report`` only -- ``ray.train.report`` inside a Tune trial fails the trial.
* Every report carries ``status``: ``running`` until the last epoch, then ``completed`` or
  ``diverged``. The searcher tells Optuna PRUNED for a trial whose last result is not final, so the
  one field separates "a scheduler stopped it" from "it finished".
* A new trial process costs ~10 s here (torch import, first optimizer). Tune reuses actors
  (``reuse_actors=True``); torch is imported once per worker process, inside the trial, so the
  driver never pays for it, and loaded data sets are memoised per process (see :func:`_load_splits`).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CHECKPOINT_FILE",
    "TrialFunction",
    "TrialSession",
    "autonorm_trial",
    "resolve_trial_config",
    "set_dotted",
]

#: File name of the training state inside a Tune checkpoint directory.
CHECKPOINT_FILE = "state.pt"


def set_dotted(config: dict[str, Any], path: str, value: Any) -> None:
    """Set ``config["a"]["b"]["c"] = value`` for ``path="a.b.c"``, creating missing mappings.

    Raises:
        ValueError: when a path component exists but is not a mapping.
    """
    parts = path.split(".")
    node = config
    for i, key in enumerate(parts[:-1]):
        child = node.get(key)
        if child is None:
            child = {}
            node[key] = child
        elif not isinstance(child, dict):
            raise ValueError(
                f"cannot set {path!r}: {'.'.join(parts[: i + 1])!r} is a {type(child).__name__}, not a mapping"
            )
        node = child
    node[parts[-1]] = value


def resolve_trial_config(base_config: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The config a trial runs: a deep copy of ``base_config`` with each dotted-path param applied.

    ``params`` are Tune's trial config: Optuna's suggested values or one grid point, keyed by dotted
    path (``"model.norm.tau"``, ``"seed"``). Nested mappings (Tune's own unflattening of ``a/b`` keys)
    are applied leaf by leaf.
    """
    config = copy.deepcopy(dict(base_config))
    for path, value in _flatten(params):
        set_dotted(config, path, value)
    return config


def _flatten(params: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items.extend(_flatten(value, prefix=f"{path}."))
        else:
            items.append((path, value))
    return items


class TrialSession:
    """What a trial function talks to: per-epoch reports with checkpoints, and the state to resume.

    Created by the Tune entry point for every trial run (also when Tune restarts a failed trial or
    resumes one after ``Tuner.restore``: then :attr:`resume_state` holds the last checkpoint).

    Args:
        report_fn: ``ray.tune.report`` in a trial; injectable for tests without Ray.
        checkpoint: the checkpoint Tune hands back (``ray.tune.get_checkpoint()``), or ``None``.
        tracking_uri: the study's resolved MLflow URI (passed explicitly: a relative or default URI
            would resolve differently in each worker).
    """

    def __init__(
        self,
        *,
        report_fn: Callable[..., None] | None = None,
        checkpoint: Any = None,
        tracking_uri: str | None = None,
    ) -> None:
        self._report_fn = report_fn
        #: The study's MLflow URI, for trial functions that log artifacts of their own. Runs and
        #: metrics are written by the driver; a trial never needs it for those.
        self.tracking_uri = tracking_uri
        self._checkpoint = checkpoint
        self._resume_state: dict[str, Any] | None = None
        self._resume_loaded = False
        self.last_status: str | None = None
        self.last_metrics: dict[str, Any] = {}
        self.reports = 0

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
                from autonorm_core.training import load_state

                with self._checkpoint.as_directory() as directory:
                    self._resume_state = load_state(os.path.join(directory, CHECKPOINT_FILE))
        return self._resume_state

    def report(
        self, metrics: Mapping[str, Any], *, state: Mapping[str, Any] | None = None, status: str = "running"
    ) -> None:
        """Report one epoch (``metrics["epoch"]`` is the trial's own epoch) to Tune.

        Args:
            metrics: JSON-able numbers; ``epoch`` should be present (MLflow steps use it).
            state: the whole training state, saved as this epoch's checkpoint.
            status: ``running``, or on the last report ``completed`` / ``diverged``.
        """
        payload = dict(metrics)
        payload["status"] = status
        payload["node_id"] = self.node_id
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


@functools.lru_cache(maxsize=2)
def _load_splits(
    name: str, seed: int, data_root: str | None, val_fraction: float, subset: Any, device: str
) -> Any:
    """Memoised per worker process: with ``reuse_actors`` the next trial on the same data skips the
    parse. Splits are read-only inputs to ``fit``, so sharing them between trials is safe."""
    from autonorm_core.data import load_dataset

    return load_dataset(
        name, seed=seed, data_root=data_root, val_fraction=val_fraction, subset=subset, device=device
    )


def autonorm_trial(config: dict[str, Any], session: TrialSession) -> None:
    """The default trial: build data, model and ``TrainConfig`` through autonorm_core and ``fit``.

    Config sections (see :mod:`workers.plan`): ``data`` (``type`` = data set name, plus
    ``load_dataset`` keywords), ``model`` (``type`` = model name; ``preset`` and the rest passed to
    ``create_model``), ``training`` (``TrainConfig.from_dict``), ``seed``. The seed drives the data
    split, the model init and the fit.
    """
    import torch

    from autonorm_core.models import create_model
    from autonorm_core.training import TrainConfig, fit

    seed = int(config.get("seed", 0))
    data = dict(config["data"])
    data_name = data.pop("type")
    subset = data.pop("subset", None)
    if isinstance(subset, list):
        subset = tuple(subset)  # lru_cache needs hashable keys; YAML gives lists
    splits = _load_splits(
        data_name,
        seed,
        data.pop("data_root", None),
        float(data.pop("val_fraction", 0.1)),
        subset,
        session.device,
    )
    if data:
        raise ValueError(f"unknown data keys {sorted(data)}; valid: type, subset, val_fraction, data_root")
    model_cfg = dict(config["model"])
    model_name = model_cfg.pop("type")
    # create_model initialises from torch's default generator: seed a forked copy so the trial is
    # reproducible from its seed and the worker's global RNG (shared with the next trial) is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_model(model_name, splits, **model_cfg)
    cfg = TrainConfig.from_dict(config.get("training", {}))
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
    final = "diverged" if result.status == "diverged" else "completed"
    if session.last_status != final:
        # The fit ended before its planned last epoch (divergence mid-epoch, early stop): one more
        # report, with the last whole epoch's metrics, so the trial's final status is on record.
        session.report(dict(result.final), status=final)


def tune_entry(
    config: dict[str, Any],
    *,
    trial_fn: TrialFunction,
    base_config: Mapping[str, Any],
    tracking_uri: str | None = None,
) -> None:
    """Tune function trainable: resolve the trial config, hand the checkpoint over, run ``trial_fn``.

    Wrapped with ``tune.with_parameters`` by the runner so ``trial_fn`` and ``base_config`` travel
    through the object store once, not inside every trial config.
    """
    from ray import tune

    session = TrialSession(checkpoint=tune.get_checkpoint(), tracking_uri=tracking_uri)
    trial_fn(resolve_trial_config(base_config, config), session)
