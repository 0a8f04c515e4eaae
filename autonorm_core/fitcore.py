"""The one training loop and its bookkeeping, for one model and for K stacked members alike.

:func:`autonorm_core.training.fit` (one model) and :func:`autonorm_core.stacking.fit_stacked` (K
members as one stacked model) are thin drivers of :func:`train_epochs`: the loop over epochs and
updates (schedule, Gumbel temperature, divergence, loss sums, evaluation, the AutoNorm-S decision,
checkpoint, callbacks, in that order) is written once, here. What differs is how K members' updates
and evaluations are computed, behind the :class:`Members` protocol: ``training._ModuleMembers`` (one
ordinary module, its torch optimizer, bf16 autocast and ``torch.compile``: any ``nn.Module``) and
``stacking.fit._StackedRun`` (K members as one stacked model). Around those, also once: the seed
streams (:func:`derive_seed`), which modules are gates or own a generator, the torch optimizer a run's
state is written in, and per member a :class:`Ledger` of its schedule position, freeze decision,
history and status, which builds each epoch's metrics, takes the AutoNorm-S decision, writes and
checks the checkpoint state and returns the :class:`FitResult`. :mod:`autonorm_core.training`
re-exports the public names.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

from autonorm_core.config import _EXECUTION_FIELDS, TrainConfig, lr_at_step, should_freeze
from autonorm_core.optim import adamw, param_groups

__all__ = [
    "STATE_FORMAT",
    "TIMING_KEYS",
    "Callback",
    "Divergence",
    "FitResult",
    "Ledger",
    "Members",
    "StopTraining",
    "build_optimizer",
    "cpu_copy",
    "derive_seed",
    "dyt_positions",
    "is_gate",
    "is_seeded",
    "same_run",
    "train_epochs",
]

#: History keys measured with a wall clock: they differ between otherwise identical runs.
TIMING_KEYS: tuple[str, ...] = ("examples_per_s",)
#: Version of the ``state`` dict given to ``checkpoint_fn``; a resume from another version is refused.
STATE_FORMAT = 1


@runtime_checkable
class Callback(Protocol):
    """Anything with ``on_epoch_end``; called once per epoch after its metrics (and checkpoint) exist.

    Raising :class:`StopTraining` ends the fit cleanly with ``status="stopped"`` (early stopping, a
    scheduler's decision); any other exception propagates.
    """

    def on_epoch_end(self, epoch: int, model: nn.Module, metrics: dict[str, float]) -> object: ...


class StopTraining(Exception):
    """Raised by a callback to end the fit after the current epoch (``FitResult.status == "stopped"``)."""


@dataclass(frozen=True)
class Divergence:
    """Where a fit's loss became NaN/inf: the typed record both fits return (``FitResult.divergence``)
    and the trial reads, instead of parsing ``FitResult.message`` back (the message is its text).

    Attributes:
        loss: ``training`` (an update's loss; the epoch did not finish) or ``validation`` (the epoch
            finished but its validation or summed training loss is not finite).
        value: the observed loss (NaN/inf; the validation loss for ``validation``).
        epoch: the epoch in which (``training``) or after which (``validation``) it happened.
        update: the update at which a training loss diverged, else ``None``.
    """

    loss: Literal["training", "validation"]
    value: float
    epoch: int
    update: int | None = None

    def __str__(self) -> str:
        if self.loss == "training":
            return f"non-finite training loss {self.value} at epoch {self.epoch}, update {self.update}"
        return f"non-finite validation loss {self.value} after epoch {self.epoch}"


@dataclass
class FitResult:
    """What :func:`~autonorm_core.training.fit` returns (and the stacked fit, per member).

    Attributes:
        status: ``completed``; ``diverged`` when a loss became NaN/inf (history up to the last whole
            epoch kept); ``stopped`` when a callback raised :class:`StopTraining`.
        history: one metrics dict per epoch (JSON-able floats).
        updates: optimizer updates performed.
        freeze_epoch: epoch at whose end the selector was frozen, else ``None``.
        freeze_entropy: mean gate entropy on which the freeze rule decided, else ``None``.
        message: why the fit ended early, empty otherwise.
        divergence: where the loss became NaN/inf when ``status == "diverged"``, else ``None``.
    """

    status: Literal["completed", "diverged", "stopped"]
    history: list[dict[str, float]]
    updates: int = 0
    freeze_epoch: int | None = None
    freeze_entropy: float | None = None
    message: str = ""
    divergence: Divergence | None = None

    @property
    def final(self) -> dict[str, float]:
        """The last epoch's metrics (empty when no epoch finished)."""
        return self.history[-1] if self.history else {}


def same_run(saved: Mapping[str, Any], cfg: TrainConfig) -> bool:
    """Whether a state's ``config`` is ``cfg``'s, execution choices aside (see ``_EXECUTION_FIELDS``).

    A field the state lacks (written before the field existed) counts as its default.
    """
    ours = cfg.to_dict()
    defaults = TrainConfig().to_dict()
    for name in _EXECUTION_FIELDS:
        ours.pop(name)
    theirs = {k: v for k, v in saved.items() if k not in _EXECUTION_FIELDS}
    return all(theirs.get(k, defaults[k]) == v for k, v in ours.items()) and set(theirs) <= set(ours)


# -------------------------------------------------------------------------------- module plumbing


def is_gate(m: nn.Module) -> bool:
    """An AutoNorm-like layer: anything with ``gate_probs(x)`` and ``freeze()`` (duck-typed, so variants
    and subclasses qualify without this module importing them)."""
    return callable(getattr(m, "gate_probs", None)) and callable(getattr(m, "freeze", None))


def is_seeded(m: nn.Module) -> bool:
    """A module owning a generator (AutoNorm's Gumbel noise, RandomSelector)."""
    return all(callable(getattr(m, a, None)) for a in ("manual_seed", "rng_state", "set_rng_state"))


def dyt_positions(gates: Sequence[Any]) -> list[int | None]:
    """Per gate, the index of its ``dyt`` candidate (``None``: it has none)."""
    out: list[int | None] = []
    for g in gates:
        names = getattr(g, "candidates", ())
        names = [n for n in (names.keys() if isinstance(names, Mapping) else names) if isinstance(n, str)]
        out.append(names.index("dyt") if "dyt" in names else None)
    return out


def derive_seed(seed: int, *stream: int) -> int:
    """Independent 63-bit seeds for each RNG stream of a fit, from one user seed: stream 0 shuffles,
    1 seeds torch's default generator (dropout, DropPath), ``(2, i)`` the i-th seeded module."""
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, *stream])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor detached onto the CPU (state dicts alias live parameters)."""
    if isinstance(obj, Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer of a fit over ``model``'s trainable parameters (its state is the checkpoint's)."""
    groups = param_groups(model, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum)
    return adamw(groups, lr=lr)


# ---------------------------------------------------------------------------------------- ledger


class Ledger:
    """One run's bookkeeping (one member's, in a stacked fit): what the loop records around its updates.

    The loop owns the model, optimizer and generators; it advances :attr:`step` and :attr:`last_lr`
    and hands each epoch's numbers to :meth:`end_epoch`, which records the metrics and takes the
    AutoNorm-S decision. :meth:`state` is the checkpoint, :meth:`resume` checks and reads one back,
    :meth:`result` is the run's :class:`FitResult`.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        seed: int,
        *,
        task: str,
        num_train: int,
        tau0: Sequence[float],
        dyt_index: Sequence[int | None],
    ) -> None:
        self.cfg, self.seed, self.task = cfg, seed, task
        self.steps_per_epoch = cfg.steps_per_epoch(num_train)
        self.n_epochs = cfg.num_epochs(num_train)
        self.total = cfg.total_updates(num_train)
        self.warmup = cfg.warmup_updates(num_train)
        self.peak = cfg.effective_lr
        self.label_smoothing = cfg.label_smoothing if task == "classification" else 0.0
        #: per gate, its ``dyt`` candidate's index (empty: the model has no gates)
        self.dyt_index = list(dyt_index)
        self.tau0 = list(tau0)
        self.history: list[dict[str, float]] = []
        self.step = 0
        #: the learning rate of the last update (what the torch optimizer's groups hold)
        self.last_lr = self.peak
        self.frozen = False
        self.freeze_epoch: int | None = None
        self.freeze_entropy: float | None = None
        self.status: Literal["running", "diverged", "stopped"] = "running"
        self.message = ""
        self.divergence: Divergence | None = None

    @property
    def sample_after_freeze(self) -> bool:
        """Whether the gates keep their noise once frozen (the config's choice; ``False`` without one)."""
        return self.cfg.freeze.sample_after_freeze if self.cfg.freeze is not None else False

    def lr_at(self, step: int) -> float:
        """The learning rate of update ``step`` (:func:`~autonorm_core.config.lr_at_step`)."""
        return lr_at_step(
            step, total=self.total, warmup=self.warmup, peak=self.peak, schedule=self.cfg.schedule
        )

    def tau_at(self, step: int) -> list[float]:
        """Each gate's Gumbel temperature at update ``step``, annealed linearly to ``tau_final``."""
        frac = step / max(1, self.total - 1)
        return [t0 + (self.cfg.tau_final - t0) * frac for t0 in self.tau0]  # type: ignore[operator]

    def diverge(self, divergence: Divergence) -> None:
        self.status = "diverged"
        self.divergence = divergence
        self.message = str(divergence)

    def end_epoch(
        self,
        epoch: int,
        val: Mapping[str, Any],
        test: Mapping[str, Any],
        *,
        loss_sum: float,
        count: int,
        lr: float,
        examples_per_s: float,
        tau: Callable[[], float],
        freeze: Callable[[bool], None],
    ) -> bool:
        """Records a finished epoch; ``False`` (and diverged) when its validation or summed training
        loss is not finite.

        ``val``/``test``: the evaluation of each split (``loss``, ``accuracy`` | ``rmse``; ``val`` with
        ``gate_entropy`` and ``gate_mean_probs`` per gate); ``loss_sum``/``count``: the summed training
        loss and the examples it covers; ``lr``: the last update's; ``tau()``: the first gate's current
        temperature. AutoNorm-S: one decision, at the end of epoch ``t_freeze``, on this epoch's mean
        entropy; ``freeze(sample_after_freeze)`` freezes the loop's selectors.
        """
        cfg = self.cfg
        if not (math.isfinite(val["loss"]) and math.isfinite(loss_sum)):
            self.diverge(Divergence("validation", val["loss"], epoch))
            return False
        metrics: dict[str, float] = {
            "epoch": float(epoch),
            "train_loss": loss_sum / max(count, 1),
            "val_loss": val["loss"],
            "test_loss": test["loss"],
        }
        key = "rmse" if self.task == "regression" else "accuracy"
        metrics[f"val_{key}"] = val[key]
        metrics[f"test_{key}"] = test[key]
        if self.dyt_index:
            entropies = val["gate_entropy"]
            metrics["gate_entropy"] = float(sum(entropies) / len(entropies))
            for i, h in enumerate(entropies):
                metrics[f"gate_entropy/layer_{i}"] = float(h)
            for i, (probs, j) in enumerate(zip(val["gate_mean_probs"], self.dyt_index)):
                if j is not None and probs:
                    metrics[f"dyt_weight/layer_{i}"] = float(probs[j])
            if cfg.tau_final is not None:
                metrics["tau"] = float(tau())
        if cfg.freeze is not None and self.dyt_index and not self.frozen and epoch == cfg.freeze.t_freeze:
            self.freeze_entropy = metrics["gate_entropy"]
            if should_freeze(cfg.freeze.rule, self.freeze_entropy, cfg.freeze.eps_h):
                freeze(cfg.freeze.sample_after_freeze)
                self.frozen = True
                self.freeze_epoch = epoch
        metrics["selector_frozen"] = 1.0 if self.frozen else 0.0
        metrics["lr"] = float(lr)
        metrics["updates"] = float(self.step)
        metrics["examples_per_s"] = examples_per_s
        self.history.append(metrics)
        return True

    def call_back(self, epoch: int, model: nn.Module, callbacks: Sequence[Callback]) -> None:
        """Gives the epoch's metrics to each callback in order; :class:`StopTraining` stops the run."""
        try:
            for cb in callbacks:
                cb.on_epoch_end(epoch, model, dict(self.history[-1]))
        except StopTraining as stop:
            self.status = "stopped"
            self.message = str(stop) or f"stopped by a callback after epoch {epoch}"

    def state(
        self,
        epoch: int,
        *,
        model: Mapping[str, Tensor],
        optimizer: Mapping[str, Any],
        shuffle: Tensor,
        global_rng: Mapping[str, Tensor],
        modules: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The checkpoint after ``epoch`` (CPU copies, ``torch.save``-able): the model's and the torch
        optimizer's state dicts, schedule position, freeze decision, history and every generator's state
        (``shuffle``, torch's default ``global_rng`` per device, each seeded module's by name)."""
        state = {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "seed": self.seed,
            "config": self.cfg.to_dict(),
            "model": model,
            "optimizer": optimizer,
            "scheduler": {"step": self.step, "total": self.total, "warmup": self.warmup, "peak": self.peak},
            "freeze": {"frozen": self.frozen, "epoch": self.freeze_epoch, "entropy": self.freeze_entropy},
            "tau0": self.tau0,
            "history": self.history,
            "rng": {"shuffle": shuffle, "global": global_rng, "modules": modules},
        }
        out: dict[str, Any] = cpu_copy(state)
        return out

    def resume(self, st: Mapping[str, Any], *, who: str = "") -> int:
        """Reads back the bookkeeping of a :meth:`state` and returns the next epoch to train; the loop
        restores the model, optimizer and generators from it.

        Raises:
            ValueError: for another :data:`STATE_FORMAT`, or a state of another config or seed
                (:func:`same_run`); ``who`` prefixes the latter message (a stacked fit's member).
        """
        if st.get("format") != STATE_FORMAT:
            raise ValueError(f"resume_state has format {st.get('format')!r}, expected {STATE_FORMAT}")
        if not same_run(st["config"], self.cfg) or st["seed"] != self.seed:
            raise ValueError(f"{who}resume_state was written by a fit with another config or seed")
        self.frozen = bool(st["freeze"]["frozen"])
        self.freeze_epoch = st["freeze"]["epoch"]
        self.freeze_entropy = st["freeze"]["entropy"]
        self.step = int(st["scheduler"]["step"])
        groups = st["optimizer"].get("param_groups") or [{"lr": self.peak}]
        self.last_lr = float(groups[0]["lr"])
        self.tau0 = list(st["tau0"])
        self.history = copy.deepcopy(list(st["history"]))
        return int(st["epoch"]) + 1

    def result(self) -> FitResult:
        return FitResult(
            status="completed" if self.status == "running" else self.status,
            history=self.history,
            updates=self.step,
            freeze_epoch=self.freeze_epoch,
            freeze_entropy=self.freeze_entropy,
            message=self.message,
            divergence=self.divergence,
        )


# ------------------------------------------------------------------------------------------ loop


class Members(Protocol):
    """What :func:`train_epochs` trains: K members (an ordinary fit: one) and how their updates and
    evaluations are computed. The loop owns the order of things; a member set owns its model(s),
    optimizer(s) and generators.

    ``books`` holds member k's :class:`Ledger`; every member shares ``batch_size`` and the step
    structure. ``forward(b, lrs)`` computes batch ``b`` of the epoch (the last :meth:`begin_epoch`
    shuffled) at the members' learning rates and returns ``(pending, losses, counts)``: per member the
    mean training loss (a float) and the examples/tokens it covers; ``update(pending, live)`` then
    applies the update of the members in ``live`` (a member whose loss is not finite has been passed to
    :meth:`diverged` and left out).
    """

    K: int
    books: list[Ledger]
    batch_size: int
    dev: torch.device

    def seed(self, k: int) -> None: ...
    def resume(self, k: int, state: Mapping[str, Any]) -> int: ...
    def begin_epoch(self, steps: int) -> None: ...
    def set_tau(self, k: int, taus: Sequence[float]) -> None: ...
    def forward(self, b: int, lrs: Sequence[float]) -> tuple[Any, list[float], list[int]]: ...
    def diverged(self, k: int) -> None: ...
    def update(self, pending: Any, live: Sequence[int]) -> None: ...
    def end_epoch(self) -> None: ...
    def evaluate(self) -> tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]: ...
    def tau(self, k: int) -> float: ...
    def freeze(self, k: int, sample: bool) -> None: ...
    def finished(self, k: int) -> None: ...
    def member_state(self, k: int, epoch: int) -> dict[str, Any]: ...
    def member_model(self, k: int) -> nn.Module: ...
    def train(self, mode: bool) -> None: ...


def _synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_epochs(
    members: Members,
    resume: Sequence[Mapping[str, Any] | None],
    *,
    callbacks: Sequence[Sequence[Callback]],
    checkpoint_fn: Callable[[int, dict[int, dict[str, Any]]], object] | None,
) -> Iterator[int]:
    """The training loop: trains ``members`` an epoch per step and yields the epoch's number.

    Per member: seeds it (``resume[k]`` ``None``) or resumes it (all members from the same epoch);
    per update, the scheduled learning rate and Gumbel temperature, a member whose training loss is
    not finite diverges (the others go on), the summed training loss; per epoch, the evaluation of
    val (with gate statistics) and test, the metrics and AutoNorm-S decision (:meth:`Ledger.end_epoch`),
    then ``checkpoint_fn(epoch, {k: state})`` for the members still training, then each member's
    ``callbacks[k]`` (:class:`StopTraining` stops that member). The results are the ledgers'.
    """
    K, books = members.K, members.books
    if any(r is not None for r in resume) and any(r is None for r in resume):
        raise ValueError("resume_states: give a state for every member or for none")
    starts = set()
    for k in range(K):
        st = resume[k]
        if st is None:
            members.seed(k)
            starts.add(1)
        else:
            starts.add(members.resume(k, st))
    if len(starts) != 1:
        raise ValueError(f"resume_states come from different epochs: {sorted(starts)}")
    for epoch in range(starts.pop(), books[0].n_epochs + 1):
        live = [k for k in range(K) if books[k].status == "running"]
        if not live:
            break
        members.train(True)
        # the update counters and last learning rates, written back to the ledgers after the epoch
        step = [bk.step for bk in books]
        last_lr = [bk.last_lr for bk in books]
        epoch_steps = min(books[0].steps_per_epoch, books[0].total - max(step))
        members.begin_epoch(epoch_steps)
        loss_sum = [0.0] * K
        count_sum = [0] * K
        lrs = [bk.peak for bk in books]
        # Per-update work stays O(1) in Python where the members allow: the schedule is evaluated once
        # per distinct member schedule.
        sched = [(bk.warmup, bk.peak, bk.cfg.schedule) for bk in books]
        one_schedule = sched.count(sched[0]) == K
        annealed = [k for k in range(K) if books[k].cfg.tau_final is not None]
        _synchronize(members.dev)
        t0 = time.perf_counter()
        for b in range(epoch_steps):
            if one_schedule and step.count(step[0]) == K:
                lrs = [books[0].lr_at(step[0])] * K
            else:
                lrs = [bk.lr_at(s) for bk, s in zip(books, step)]
            for k in annealed:
                if books[k].status == "running":
                    members.set_tau(k, books[k].tau_at(step[k]))
            pending, values, counts = members.forward(b, lrs)
            if not all(map(math.isfinite, values)):
                for k in live:
                    if not math.isfinite(values[k]):
                        books[k].diverge(Divergence("training", values[k], epoch, step[k]))
                        members.diverged(k)
                live = [k for k in range(K) if books[k].status == "running"]
                if not live:
                    break
            members.update(pending, live)
            for k in live:
                last_lr[k] = lrs[k]
                step[k] += 1
                loss_sum[k] += values[k] * counts[k]
                count_sum[k] += int(counts[k])
        members.end_epoch()
        for bk, bk_step, bk_lr in zip(books, step, last_lr):
            bk.step, bk.last_lr = bk_step, bk_lr
        _synchronize(members.dev)
        train_time = time.perf_counter() - t0
        live = [k for k in range(K) if books[k].status == "running"]
        if not live:
            break
        members.train(False)
        val, test = members.evaluate()
        for k in live:
            recorded = books[k].end_epoch(
                epoch,
                val[k],
                test[k],
                loss_sum=loss_sum[k],
                count=count_sum[k],
                lr=lrs[k],
                examples_per_s=epoch_steps * members.batch_size / max(train_time, 1e-9),
                tau=functools.partial(members.tau, k),
                freeze=functools.partial(members.freeze, k),
            )
            if not recorded:
                members.finished(k)
        if checkpoint_fn is not None:
            states = {k: members.member_state(k, epoch) for k in live if books[k].status == "running"}
            if states:
                checkpoint_fn(epoch, states)
        for k in live:
            if books[k].status != "running" or not callbacks[k]:
                continue
            books[k].call_back(epoch, members.member_model(k), callbacks[k])
            if books[k].status == "stopped":
                members.finished(k)
        yield epoch
