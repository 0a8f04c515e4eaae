"""The training loop: AdamW/SGD, warm-up + cosine, clipping, label smoothing, AutoNorm-S gate freezing.

``fit(model, splits, TrainConfig(...), seed=0)`` trains a model built by :mod:`autonorm_core.models` on
:class:`autonorm_core.data.Splits` and returns a :class:`FitResult` holding one metrics dict per epoch.
It uses torch alone, so the same call runs in a notebook, a test and a Ray Tune trial (which passes
``callbacks`` to report and ``checkpoint_fn`` / ``resume_state`` to survive restarts). Its loop is
:func:`autonorm_core.fitcore.train_epochs`, the one the stacked fit (:mod:`autonorm_core.stacking`)
drives too, with its bookkeeping (schedule, metrics, freeze decision, checkpoint state, resume check,
result) in :class:`autonorm_core.fitcore.Ledger`; here is only how one module's updates and
evaluations are computed (``_ModuleMembers``).

Design notes (why it looks like this):

- Reproducible without global seeding. Shuffling draws from a ``torch.Generator`` owned by the fit; each
  module that owns a generator (AutoNorm's Gumbel noise, RandomSelector) is seeded through its
  ``manual_seed``. Layers that still draw from torch's default generator (dropout, stochastic depth) run
  inside ``torch.random.fork_rng``, seeded from ``seed``, so the caller's global RNG is left as found.
- Whole-state checkpoints. ``checkpoint_fn(epoch, state)`` receives CPU copies of the model, optimizer,
  schedule position, freeze decision, history and every RNG; ``fit(..., resume_state=state)`` continues
  bit-for-bit, so a resumed run's history equals an uninterrupted one (timing keys aside).
- The learning-rate schedule is a pure function of the update index (:func:`lr_at_step`): it needs no
  state of its own and survives rebuilding the optimizer when the selector is frozen.
- Gate statistics come from the noise-free ``gate_probs`` on the validation split in eval mode
  (docs/science.md), never from the noisy training samples, and see the same padding mask as the
  gate itself (text: the mean over real tokens).
- The GPU path is two switches, ``precision`` (bf16 autocast around every forward; parameters,
  gradients, optimizer state and the loss stay float32) and ``compile`` (``torch.compile`` of a
  wrapper around the model; ``auto`` = on CUDA only, see :func:`resolve_compile`). The wrapper shares
  the model's parameters, so checkpoints, callbacks and the caller keep the plain module and its
  ``state_dict`` keys: a state written by a compiled run resumes an eager one and vice versa.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "COMPILE_SETTINGS",
    "FREEZE_RULES",
    "PRECISIONS",
    "RECOMPILE_LIMIT",
    "STATE_FORMAT",
    "TIMING_KEYS",
    "Callback",
    "CompileSetting",
    "Divergence",
    "FitResult",
    "FreezeRule",
    "GateFreeze",
    "Precision",
    "StopTraining",
    "TrainConfig",
    "fit",
    "load_state",
    "lr_at_step",
    "reported_metrics",
    "resolve_compile",
    "same_run",
    "save_state",
    "should_freeze",
]

from autonorm_core.config import (  # re-exported: the training API as before
    COMPILE_SETTINGS,
    FREEZE_RULES,
    PRECISIONS,
    CompileSetting,
    FreezeRule,
    GateFreeze,
    Precision,
    TrainConfig,
    _choice,
    lr_at_step,
    reported_metrics,
    should_freeze,
)
from autonorm_core.fitcore import (  # re-exported: the training API as before
    STATE_FORMAT,
    TIMING_KEYS,
    Callback,
    Divergence,
    FitResult,
    Ledger,
    StopTraining,
    build_optimizer,
    dyt_positions,
    is_gate,
    is_seeded,
    same_run,
    train_epochs,
)
from autonorm_core.fitcore import derive_seed as _derive_seed


def resolve_compile(setting: str, device: str | torch.device) -> bool:
    """Whether :func:`fit` runs the model's forward through ``torch.compile`` on ``device``.

    ``on`` and ``off`` are what they say on any device; ``auto`` compiles on CUDA devices only (see
    :attr:`TrainConfig.compile` for why not on CPU). Needs no GPU: ``torch.device("cuda")`` resolves
    anywhere.

    Raises:
        ValueError: for a setting other than ``auto``, ``on``, ``off``.
    """
    _choice("compile", setting, COMPILE_SETTINGS)
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return setting == "on"


# -------------------------------------------------------------------------------- module plumbing


def _freeze_selector(module: Any, *, sample: bool) -> None:
    module.freeze()
    # The fit's GateFreeze decides whether noise continues after freezing, whatever the layer was
    # constructed with.
    if hasattr(module, "sample_after_freeze"):
        module.sample_after_freeze = sample


def _rebuild_optimizer(
    old: torch.optim.Optimizer, model: nn.Module, cfg: TrainConfig, lr: float
) -> torch.optim.Optimizer:
    """A fresh optimizer over the now-trainable parameters, keeping their moment estimates."""
    new = build_optimizer(model, cfg, lr)
    for group in new.param_groups:
        for p in group["params"]:
            if p in old.state:
                new.state[p] = old.state[p]
    return new


def _optimized_params(opt: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


# ----------------------------------------------------------------------------------- evaluation


def _task_loss(
    out: Tensor, y: Tensor, task: str, *, label_smoothing: float, reduction: str = "mean"
) -> tuple[Tensor, int]:
    """Loss and the number of examples/tokens it covers (tagging ignores -100 positions)."""
    if task == "regression":
        pred = out.reshape(y.shape).float()
        loss = F.mse_loss(pred, y.float(), reduction="sum")
        count = y.numel()
    elif task == "tagging":
        flat_y = y.reshape(-1)
        loss = F.cross_entropy(
            out.reshape(flat_y.numel(), -1).float(), flat_y, ignore_index=-100, reduction="sum"
        )
        count = int((flat_y != -100).sum().item())
    else:
        loss = F.cross_entropy(out.float(), y, label_smoothing=label_smoothing, reduction="sum")
        count = y.shape[0]
    if reduction == "mean":
        loss = loss / max(count, 1)
    return loss, count


def _correct(out: Tensor, y: Tensor, task: str) -> int:
    if task == "tagging":
        flat_y = y.reshape(-1)
        pred = out.reshape(flat_y.numel(), -1).argmax(-1)
        mask = flat_y != -100
        return int((pred[mask] == flat_y[mask]).sum().item())
    return int((out.argmax(-1) == y).sum().item())


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    data: tuple[Tensor, Tensor],
    task: str,
    *,
    batch_size: int,
    gates: Sequence[Any] = (),
    forward: Callable[[Tensor], Tensor] | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Loss and accuracy/RMSE on one split in eval mode; with ``gates``, noise-free gate statistics.

    ``forward``: the compiled wrapper of ``model`` when the fit compiles (``None``: eager ``model``);
    ``precision`` is the fit's (``bf16``: every batch under autocast).

    Eager, the gate statistics hook each AutoNorm's input and call its ``gate_probs`` (deterministic
    softmax, in float32 whatever the autocast dtype of the input), so they are what the gate would
    choose, not what a noisy training sample drew. A compiled forward cannot run Python hooks
    registered after it was compiled (Dynamo does not guard on hooks), so there each gate's own
    ``last_probs`` is read after the batch instead: the same noise-free softmax over the same
    (masked) input, computed inside the gate's forward (under bf16, from the autocast selector).
    """
    x_all, y_all = data
    run = model if forward is None else forward
    from_last_probs = forward is not None
    total_loss = 0.0
    total_count = 0
    correct = 0
    ent_sum = [0.0] * len(gates)
    prob_sum: list[Tensor | None] = [None] * len(gates)
    n_gate = [0] * len(gates)

    def add(i: int, probs: Tensor) -> None:
        probs = probs.float()  # (B, K)
        p = probs.clamp_min(1e-12)
        ent_sum[i] += float(-(probs * p.log()).sum(-1).sum().item())
        s = probs.sum(0).detach().cpu().double()
        prob_sum[i] = s if prob_sum[i] is None else prob_sum[i] + s  # type: ignore[operator]
        n_gate[i] += probs.shape[0]

    def make_hook(i: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0]
            if x.dtype in (torch.float16, torch.bfloat16):
                x = x.float()  # an autocast activation; gate_probs runs with autocast off
            # The gate's own padding mask: text gates pool over real tokens only.
            add(i, module.gate_probs(x, mask=kwargs.get("mask")))

        return hook

    handles = (
        []
        if from_last_probs
        else [g.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, g in enumerate(gates)]
    )
    try:
        for start in range(0, x_all.shape[0], batch_size):
            x = x_all[start : start + batch_size]
            y = y_all[start : start + batch_size]
            if from_last_probs:
                for g in gates:
                    g.last_probs = None
            with _autocast(precision, x.device):
                out = run(x)
            out = out.float()
            if from_last_probs:
                for i, g in enumerate(gates):
                    if g.last_probs is not None:  # None: the layer did not run on this batch
                        add(i, g.last_probs)
            loss, count = _task_loss(out, y, task, label_smoothing=0.0, reduction="sum")
            total_loss += float(loss.item())
            total_count += count
            if task != "regression":
                correct += _correct(out, y, task)
    finally:
        for h in handles:
            h.remove()
    denom = max(total_count, 1)
    result: dict[str, Any] = {"loss": total_loss / denom}
    if task == "regression":
        result["rmse"] = math.sqrt(total_loss / denom)
    else:
        result["accuracy"] = correct / denom
    result["gate_entropy"] = [e / max(n, 1) for e, n in zip(ent_sum, n_gate)]
    result["gate_mean_probs"] = [
        (s / max(n, 1)).tolist() if s is not None else [] for s, n in zip(prob_sum, n_gate)
    ]
    return result


# ------------------------------------------------------------------------------------- the loop


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on ``device`` for ``precision="bf16"``, else a no-op context."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _check_precision(precision: str, device: torch.device) -> None:
    if precision == "bf16" and not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"precision='bf16' needs autocast, which device type {device.type!r} lacks")


#: Dynamo's per-function cache limit while a compiled fit runs (PyTorch's default: 8). One fit keeps
#: up to 8 variants of a gate's forward (train, the full and the two partial evaluation batch sizes,
#: each before and after the freeze), and a worker process that runs trial after trial keeps those of
#: earlier trials too (other batch sizes): past the limit Dynamo silently runs that function eagerly.
RECOMPILE_LIMIT = 64


def _recompile_room(compiling: bool) -> contextlib.AbstractContextManager[object]:
    """Raises Dynamo's recompile limit to :data:`RECOMPILE_LIMIT` for the block (when compiling)."""
    if not compiling:
        return contextlib.nullcontext()
    import torch._dynamo

    limit = max(int(torch._dynamo.config.recompile_limit), RECOMPILE_LIMIT)
    return torch._dynamo.config.patch(recompile_limit=limit)


def _compiled(model: nn.Module, cfg: TrainConfig, gates: Sequence[Any]) -> Callable[[Tensor], Tensor]:
    """``torch.compile`` of a wrapper around ``model`` (the module itself is left as it is).

    The wrapper (an ``OptimizedModule``) shares the model's parameters and buffers; only the fit's
    forward passes go through it, so ``model.state_dict()`` keeps its keys (the wrapper's own would
    carry an ``_orig_mod.`` prefix) and callbacks see the plain module. Static shapes: the
    evaluation batch size and the last, partial evaluation batch of each split are one recompile
    each, the AutoNorm-S freeze (``requires_grad`` and a Python flag, both guarded) one more per
    graph. Under ``tau_final`` the Gumbel temperature, a Python float that static compilation would
    bake into the graph and recompile for at every update, is why that case compiles with automatic
    dynamic shapes instead (PyTorch's default: what changes once becomes symbolic).
    """
    missing = [type(g).__name__ for g in gates if not hasattr(g, "last_probs")]
    if missing:
        raise ValueError(
            f"a compiled fit reads gate statistics from each gate's last_probs; {sorted(set(missing))} "
            "lack it: set compile='off'"
        )
    compiled: Callable[[Tensor], Tensor] = torch.compile(
        model, dynamic=None if cfg.tau_final is not None else False
    )
    return compiled


@contextlib.contextmanager
def _forked_global_rng(device: torch.device) -> Iterator[None]:
    """Forks torch's default generator(s) so seeding them inside does not leak to the caller."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    with torch.random.fork_rng(devices=devices):
        yield


def _seed_global(seed: int, device: torch.device) -> None:
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def _global_rng_state(device: torch.device) -> dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_global_rng_state(state: Mapping[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _splits_parts(splits: Any, device: torch.device) -> tuple[str, dict[str, tuple[Tensor, Tensor]]]:
    task = getattr(splits, "task", "classification")
    _choice("task", task, ("classification", "tagging", "regression"))
    parts = {}
    for name in ("train", "val", "test"):
        x, y = getattr(splits, name)
        parts[name] = (x.to(device), y.to(device))
    return task, parts


class _ModuleMembers:
    """One ordinary module as the loop's one member (:class:`~autonorm_core.fitcore.Members`, K = 1):
    its torch optimizer, shuffling generator and the forked default generator, bf16 autocast and the
    compiled forward. Any ``nn.Module`` trains here, stackable or not."""

    K = 1

    def __init__(self, model: nn.Module, splits: Any, cfg: TrainConfig, seed: int, dev: torch.device):
        self.dev, self.cfg, self.model = dev, cfg, model
        self.task, self.parts = _splits_parts(splits, dev)
        model.to(dev)
        self.batch_size = cfg.batch_size
        self.gates: list[Any] = [m for m in model.modules() if is_gate(m)]
        self.seeded: list[tuple[str, Any]] = [(name, m) for name, m in model.named_modules() if is_seeded(m)]
        book = Ledger(
            cfg,
            seed,
            task=self.task,
            num_train=self.parts["train"][0].shape[0],
            tau0=[float(getattr(m, "tau", 1.0)) for m in self.gates],
            dyt_index=dyt_positions(self.gates),
        )
        self.books = [book]
        _check_precision(cfg.precision, dev)
        # Forward passes go through ``run`` (the compiled wrapper when compiling); everything else
        # (optimizer, state_dict, callbacks) uses ``model`` itself.
        self.compiled = _compiled(model, cfg, self.gates) if resolve_compile(cfg.compile, dev) else None
        self.run: Callable[[Tensor], Tensor] = model if self.compiled is None else self.compiled
        self.shuffle = torch.Generator()
        self.optimizer = build_optimizer(model, cfg, book.peak)
        self.perm = torch.arange(0)

    def seed(self, k: int) -> None:
        seed = self.books[0].seed
        self.shuffle.manual_seed(_derive_seed(seed, 0))
        _seed_global(_derive_seed(seed, 1), self.dev)
        for i, (_, m) in enumerate(self.seeded):
            m.manual_seed(_derive_seed(seed, 2, i))

    def resume(self, k: int, state: Mapping[str, Any]) -> int:
        book = self.books[0]
        start_epoch = book.resume(state)
        self.model.load_state_dict(state["model"])
        for m in self.gates if book.frozen else ():
            _freeze_selector(m, sample=book.sample_after_freeze)
        self.shuffle.set_state(state["rng"]["shuffle"])
        _set_global_rng_state(state["rng"]["global"], self.dev)
        for name, m in self.seeded:
            m.set_rng_state(state["rng"]["modules"][name])
        self.optimizer = build_optimizer(self.model, self.cfg, book.peak)  # without a frozen selector
        self.optimizer.load_state_dict(state["optimizer"])
        return start_epoch

    def train(self, mode: bool) -> None:
        self.model.train(mode)

    def begin_epoch(self, steps: int) -> None:
        self.perm = torch.randperm(self.parts["train"][0].shape[0], generator=self.shuffle).to(self.dev)

    def set_tau(self, k: int, taus: Sequence[float]) -> None:
        for m, tau in zip(self.gates, taus):
            m.tau = tau

    def forward(self, b: int, lrs: Sequence[float]) -> tuple[Any, list[float], list[int]]:
        idx = self.perm[b * self.batch_size : (b + 1) * self.batch_size]
        x_train, y_train = self.parts["train"]
        x, y = x_train[idx], y_train[idx]
        for group in self.optimizer.param_groups:
            group["lr"] = lrs[0]
        with _autocast(self.cfg.precision, self.dev):
            out = self.run(x)
        loss, count = _task_loss(out.float(), y, self.task, label_smoothing=self.books[0].label_smoothing)
        return loss, [float(loss.item())], [count]

    def diverged(self, k: int) -> None:
        pass  # the model stays as it was at the divergence

    def update(self, pending: Any, live: Sequence[int]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        pending.backward()
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(_optimized_params(self.optimizer), self.cfg.grad_clip)
        self.optimizer.step()

    def end_epoch(self) -> None:
        pass

    def evaluate(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        evaluate = functools.partial(
            _evaluate,
            self.model,
            task=self.task,
            batch_size=self.cfg.eval_batch_size,
            forward=self.compiled,
            precision=self.cfg.precision,
        )
        return [evaluate(self.parts["val"], gates=self.gates)], [evaluate(self.parts["test"])]

    def tau(self, k: int) -> float:
        return float(getattr(self.gates[0], "tau", math.nan))

    def freeze(self, k: int, sample: bool) -> None:
        # Dropping the selector from the optimizer keeps AdamW's decoupled weight decay from moving it;
        # the backbone keeps its moment estimates.
        for m in self.gates:
            _freeze_selector(m, sample=sample)
        self.optimizer = _rebuild_optimizer(self.optimizer, self.model, self.cfg, self.books[0].last_lr)

    def finished(self, k: int) -> None:
        pass  # the model itself holds the final weights

    def member_state(self, k: int, epoch: int) -> dict[str, Any]:
        return self.books[0].state(
            epoch,
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            shuffle=self.shuffle.get_state(),
            global_rng=_global_rng_state(self.dev),
            modules={name: m.rng_state() for name, m in self.seeded},
        )

    def member_model(self, k: int) -> nn.Module:
        return self.model


def fit(
    model: nn.Module,
    splits: Any,
    cfg: TrainConfig,
    *,
    seed: int,
    callbacks: Sequence[Callback] = (),
    device: str | torch.device = "cpu",
    resume_state: Mapping[str, Any] | None = None,
    checkpoint_fn: Callable[[int, dict[str, Any]], object] | None = None,
) -> FitResult:
    """Trains ``model`` on ``splits.train`` and records per-epoch metrics on val and test.

    Model selection belongs to the caller and must use the ``val_*`` keys; ``test_*`` are recorded for
    the final report only.

    Args:
        model: any ``nn.Module`` mapping a batch of inputs to logits (classification: (B, C); tagging:
            (B, T, C); regression: (B,) or (B, 1)). It is moved to ``device`` and trained in place.
        splits: an :class:`autonorm_core.data.Splits` (``train``/``val``/``test`` (inputs, targets)
            pairs and ``task``).
        cfg: the training configuration.
        seed: drives shuffling, every module-owned generator and the forked default generator; the
            same seed on the same device and model init gives the same history.
        callbacks: objects with ``on_epoch_end(epoch, model, metrics)``, called in order after the
            epoch's metrics exist and after ``checkpoint_fn``.
        device: where the model and the (small) data sets live; with ``cfg.compile="auto"`` a CUDA
            device also compiles the forward (:func:`resolve_compile`).
        resume_state: a ``state`` previously passed to ``checkpoint_fn`` (or :func:`load_state`); the
            fit continues after that state's epoch. It must come from the same config and seed
            (``compile`` aside, an execution choice; fields the state predates count as defaults).
        checkpoint_fn: called at the end of every epoch with ``(epoch, state)``, ``state`` being a
            ``torch.save``-able dict of CPU copies (model, optimizer, schedule, freeze decision,
            history, RNGs).

    Returns:
        A :class:`FitResult`. A NaN/inf loss ends the fit with ``status="diverged"`` instead of raising.

    Metric keys per epoch: ``epoch``, ``train_loss``, ``val_loss``, ``val_accuracy`` | ``val_rmse``,
    ``test_loss``, ``test_accuracy`` | ``test_rmse``, ``lr`` (of the epoch's last update), ``updates``,
    ``examples_per_s`` (training throughput), ``selector_frozen`` (1.0 once frozen; the freeze epoch's
    row already shows the decision) and, when the model has AutoNorm layers, ``gate_entropy`` (mean over
    layers), ``gate_entropy/layer_<i>`` and ``dyt_weight/layer_<i>`` (mean validation probability of
    the ``dyt`` candidate), layers numbered in module order; with ``tau_final``, also ``tau``.
    """
    dev = torch.device(device)
    members = _ModuleMembers(model, splits, cfg, seed, dev)

    def checkpoint(epoch: int, states: dict[int, dict[str, Any]]) -> None:
        assert checkpoint_fn is not None
        checkpoint_fn(epoch, states[0])

    with _forked_global_rng(dev), _recompile_room(members.compiled is not None):
        for _ in train_epochs(
            members,
            [resume_state],
            callbacks=[callbacks],
            checkpoint_fn=checkpoint if checkpoint_fn is not None else None,
        ):
            pass
    return members.books[0].result()


def save_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Writes a fit state atomically (temporary file + rename), so a crash never leaves half a file."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".state-", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(dict(state), fh)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a state written by :func:`save_state` (tensors and plain data only: ``weights_only``)."""
    state: dict[str, Any] = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    return state
