"""``fit_stacked``: K members of one architecture trained as one stacked model, each as ``fit`` trains it.

Member k is the separate ``fit(models[k], splits[k], cfgs[k], seed=seeds[k])``: the same init (its
model is stacked bit for bit), shuffling (its own generator seeded as ``fit`` seeds it), noise (each
AutoNorm / RandomSelector layer draws from member k's copy of its generator, seeded as ``fit`` seeds
the layer; DropPath from member k's stand-in of the default generator), learning-rate schedule,
clipping, label smoothing, freeze decision, divergence handling and metric names. It differs from the
separate run only by float rounding (other kernels: batched matmuls, grouped convolutions), see
tests/core/test_stacking.py. What the K members must share: model architecture, task and split
sizes, and the TrainConfig fields that fix the step structure (:data:`SHARED_FIELDS`); everything
else (lr, weight decay, momentum, clipping, smoothing, schedule, warm-up, freezing, tau annealing,
AutoNorm's tau, the corrected layer's beta) may differ per member. Each member's bookkeeping (schedule,
metrics, freeze decision, checkpoint state, resume check, result) is a :class:`~autonorm_core.fitcore.Ledger`,
and the loop is :func:`~autonorm_core.fitcore.train_epochs`, both the ones ``fit`` uses: only the
updates and evaluations are computed here, stacked (``_StackedRun``, the loop's ``Members``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.fitcore import (
    Callback,
    FitResult,
    Ledger,
    build_optimizer,
    derive_seed,
    dyt_positions,
    is_gate,
    is_seeded,
    train_epochs,
)
from autonorm_core.stacking.evaluate import evaluate_stacked
from autonorm_core.stacking.layers import BackwardSGD, NotStackableError, StackedLinear, StackedMixture
from autonorm_core.stacking.models import StackedModel, stack_models, training_reason
from autonorm_core.stacking.optim import StackedOptimizer
from autonorm_core.training import TrainConfig, fit

__all__ = ["SHARED_FIELDS", "StackedFitResult", "StackedTraining", "fit_stacked", "start_stacked"]

#: TrainConfig fields every member of one stacked fit must share (they fix the batches and the steps).
SHARED_FIELDS = (
    "epochs",
    "batch_size",
    "budget",
    "max_updates",
    "reference_batch_size",
    "eval_batch_size",
    "optimizer",
    "precision",
)

CheckpointFn = Callable[[int, dict[int, dict[str, Any]]], object]


@dataclass
class StackedFitResult:
    """What :func:`fit_stacked` returns.

    Attributes:
        results: one :class:`~autonorm_core.training.FitResult` per member, in member order.
        stacked: whether the members trained stacked (``False``: one separate ``fit`` each).
        reason: why they did not (the :func:`stackable` reason), empty when stacked.
        states: each member's final ``state_dict`` (a diverged member's as of its divergence).
    """

    results: list[FitResult]
    stacked: bool
    reason: str = ""
    states: list[dict[str, Tensor]] = field(default_factory=list)


def _check_members(cfgs: Sequence[TrainConfig], splits: Sequence[Any]) -> None:
    for name in SHARED_FIELDS:
        values = [getattr(c, name) for c in cfgs]
        if any(v != values[0] for v in values):
            raise ValueError(f"stacked members must share TrainConfig.{name}; got {values}")
    if all(s is splits[0] for s in splits):
        return  # one Splits shared by every member
    tasks = {getattr(s, "task", "classification") for s in splits}
    if len(tasks) != 1:
        raise ValueError(f"stacked members must share one task, got {sorted(tasks)}")
    for part in ("train", "val", "test"):
        sizes = {getattr(s, part)[0].shape for s in splits}
        if len(sizes) != 1:
            raise ValueError(f"stacked members' {part} splits differ in shape: {sorted(map(tuple, sizes))}")


def _member_loss(
    out: Tensor, y: Tensor, task: str, smoothing: Sequence[float]
) -> tuple[Tensor, Tensor | int]:
    """Per-member mean training loss ``(K,)`` and the examples/tokens each covers (``(K,)``, or one int
    that every member covers: classification, regression)."""
    K = out.shape[0]
    if task == "regression":
        per = F.mse_loss(out.reshape(y.shape).float(), y.float(), reduction="none").reshape(K, -1)
        return per.sum(1) / max(per.shape[1], 1), per.shape[1]
    if task == "tagging":
        flat = y.reshape(K, -1)
        per = F.cross_entropy(
            out.reshape(flat.numel(), -1).float(), flat.reshape(-1), ignore_index=-100, reduction="none"
        ).reshape(K, -1)
        count = (flat != -100).sum(1)
        return per.sum(1) / count.clamp_min(1), count
    C = out.shape[-1]
    s0 = smoothing[0]
    if list(smoothing).count(s0) == len(smoothing):
        per = F.cross_entropy(
            out.reshape(-1, C).float(), y.reshape(-1), label_smoothing=s0, reduction="none"
        ).reshape(K, -1)
    else:
        per = torch.stack(
            [
                F.cross_entropy(out[k].float(), y[k], label_smoothing=s, reduction="none")
                for k, s in enumerate(smoothing)
            ]
        )
    return per.sum(1) / per.shape[1], per.shape[1]


def _as_list(value: Any, k: int, what: str) -> list[Any]:
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = list(value)
        if len(items) != k:
            raise ValueError(f"{what}: expected {k} entries (one per member), got {len(items)}")
        return items
    return [value] * k


def fit_stacked(
    models: Sequence[nn.Module],
    splits: Any,
    cfgs: TrainConfig | Sequence[TrainConfig],
    *,
    seeds: Sequence[int],
    callbacks: Sequence[Sequence[Callback]] = (),
    device: str | torch.device = "cpu",
    resume_states: Sequence[Mapping[str, Any]] | None = None,
    checkpoint_fn: CheckpointFn | None = None,
) -> StackedFitResult:
    """Trains K members as ``fit`` trains each one, as one stacked model where :func:`stackable` allows.

    Args:
        models: K member models of one architecture, each built under its own seed as the separate
            run builds it (:func:`~autonorm_core.stacking.create_members`). Trained in place: at the
            end each holds its member's final weights (a diverged member: as of its divergence).
        splits: one :class:`~autonorm_core.data.Splits` shared by every member, or K of them (same
            task and split sizes, e.g. each member's seed-dependent split).
        cfgs: one TrainConfig or K; they must agree on :data:`SHARED_FIELDS`.
        seeds: member seeds (drive shuffling, module generators and the default-generator stand-in).
        callbacks: per member, a sequence of callbacks (``on_epoch_end(epoch, model, metrics)`` with the
            member's own model holding its current weights). :class:`StopTraining` stops that member.
        device: where the stacked model and the data live.
        resume_states: per member, a state given to ``checkpoint_fn`` (or written by a separate
            ``fit``'s ``checkpoint_fn``: the format is the same), all of the same epoch.
        checkpoint_fn: called at the end of every epoch with ``(epoch, {member index: state})`` for the
            members still training; each state is exactly what the separate ``fit`` would checkpoint,
            so ``fit(..., resume_state=state)`` continues that member alone, and ``fit_stacked``
            continues the stack.

    Returns:
        A :class:`StackedFitResult`: one FitResult per member (same status values, history keys and
        messages as ``fit``). When the members cannot be stacked, each runs its own ``fit`` one after
        the other and ``reason`` says why.
    """
    prepared = start_stacked(
        models,
        splits,
        cfgs,
        seeds=seeds,
        callbacks=callbacks,
        device=device,
        resume_states=resume_states,
        checkpoint_fn=checkpoint_fn,
    )
    if isinstance(prepared, StackedTraining):
        for _ in prepared.epochs():
            pass
        return prepared.result()
    cfg_list, split_list, seed_list, cb_list, resume_list = _member_lists(
        models, splits, cfgs, seeds, callbacks, resume_states
    )
    return _fit_separately(
        models, split_list, cfg_list, seed_list, cb_list, device, resume_list, checkpoint_fn, prepared
    )


def _member_lists(
    models: Sequence[nn.Module],
    splits: Any,
    cfgs: TrainConfig | Sequence[TrainConfig],
    seeds: Sequence[int],
    callbacks: Sequence[Sequence[Callback]],
    resume_states: Sequence[Mapping[str, Any]] | None,
) -> tuple[list[TrainConfig], list[Any], list[int], list[Sequence[Callback]], list[Mapping[str, Any] | None]]:
    """The per-member arguments of :func:`fit_stacked`, one entry per member, checked."""
    K = len(models)
    if K == 0:
        raise ValueError("fit_stacked needs at least one member")
    cfg_list: list[TrainConfig] = _as_list(cfgs, K, "cfgs")
    split_list = _as_list(splits, K, "splits")
    seed_list = [int(s) for s in _as_list(list(seeds), K, "seeds")]
    cb_list: list[Sequence[Callback]] = _as_list(list(callbacks), K, "callbacks") if callbacks else [()] * K
    resume_list: list[Mapping[str, Any] | None] = (
        _as_list(list(resume_states), K, "resume_states") if resume_states is not None else [None] * K
    )
    _check_members(cfg_list, split_list)
    return cfg_list, split_list, seed_list, cb_list, resume_list


class StackedTraining:
    """One stacked fit advanced an epoch at a time (:func:`start_stacked`): :meth:`epochs` trains one
    epoch per step (its metrics, ``checkpoint_fn`` and callbacks as :func:`fit_stacked`'s) and yields
    its number; once exhausted, :meth:`result` is what :func:`fit_stacked` returns. Several, stepped in
    turn, train several cells in one process (workers/group_trial.py), each the same computation as
    alone (its own generators, no shared random state)."""

    def __init__(self, run: _StackedRun, resume: Sequence[Mapping[str, Any] | None]) -> None:
        self._run, self._resume = run, resume

    def epochs(self) -> Iterator[int]:
        run = self._run
        return train_epochs(run, self._resume, callbacks=run.callbacks, checkpoint_fn=run.checkpoint_fn)

    def result(self) -> StackedFitResult:
        return self._run._result()


def start_stacked(
    models: Sequence[nn.Module],
    splits: Any,
    cfgs: TrainConfig | Sequence[TrainConfig],
    *,
    seeds: Sequence[int],
    callbacks: Sequence[Sequence[Callback]] = (),
    device: str | torch.device = "cpu",
    resume_states: Sequence[Mapping[str, Any]] | None = None,
    checkpoint_fn: CheckpointFn | None = None,
) -> StackedTraining | str:
    """:func:`fit_stacked`'s arguments, prepared but not trained: a :class:`StackedTraining`, or the
    reason these members cannot be stacked (then :func:`fit_stacked` would fit them one by one)."""
    cfg_list, split_list, seed_list, cb_list, resume_list = _member_lists(
        models, splits, cfgs, seeds, callbacks, resume_states
    )
    reason = training_reason(cfg_list[0])
    if reason:
        return reason
    try:
        stacked = stack_models(list(models))
    except NotStackableError as err:
        return str(err)
    except ValueError as err:
        return f"invalid model config: {err}"
    run = _StackedRun(
        stacked, models, split_list, cfg_list, seed_list, cb_list, torch.device(device), checkpoint_fn
    )
    return StackedTraining(run, resume_list)


def _fit_separately(
    models: Sequence[nn.Module],
    splits: Sequence[Any],
    cfgs: Sequence[TrainConfig],
    seeds: Sequence[int],
    callbacks: Sequence[Sequence[Callback]],
    device: str | torch.device,
    resume: Sequence[Mapping[str, Any] | None],
    checkpoint_fn: CheckpointFn | None,
    reason: str,
) -> StackedFitResult:
    results = []
    for k, model in enumerate(models):

        def member_checkpoint(epoch: int, state: dict[str, Any], k: int = k) -> None:
            if checkpoint_fn is not None:
                checkpoint_fn(epoch, {k: state})

        results.append(
            fit(
                model,
                splits[k],
                cfgs[k],
                seed=seeds[k],
                callbacks=callbacks[k],
                device=device,
                resume_state=resume[k],
                checkpoint_fn=member_checkpoint if checkpoint_fn is not None else None,
            )
        )
    states = [{n: t.detach().clone() for n, t in m.state_dict().items()} for m in models]
    return StackedFitResult(results=results, stacked=False, reason=reason, states=states)


class _StackedRun:
    """The state of one stacked fit: the stacked model, its optimizer and each member's generators, and
    per member the :class:`~autonorm_core.fitcore.Ledger` that ``fit`` keeps for its one run."""

    def __init__(
        self,
        stacked: StackedModel,
        models: Sequence[nn.Module],
        splits: Sequence[Any],
        cfgs: Sequence[TrainConfig],
        seeds: Sequence[int],
        callbacks: Sequence[Sequence[Callback]],
        dev: torch.device,
        checkpoint_fn: CheckpointFn | None,
    ):
        self.K = len(models)
        self.batch_size = cfgs[0].batch_size
        self.models = list(models)
        self.cfgs = list(cfgs)
        self.seeds = list(seeds)
        self.callbacks = callbacks
        self.dev = dev
        self.checkpoint_fn = checkpoint_fn
        self.task = getattr(splits[0], "task", "classification")
        shared = all(s is splits[0] for s in splits)
        parts: dict[str, list[tuple[Tensor, Tensor]]] = {}
        for name in ("train", "val", "test"):
            moved = [tuple(t.to(dev) for t in getattr(s, name)) for s in (splits[:1] if shared else splits)]
            parts[name] = moved * self.K if shared else moved  # type: ignore[assignment]
        self.parts = parts
        self.shared = shared
        self.stacked = stacked.to(dev)
        ref = models[0]
        self.gate_names = [n for n, m in ref.named_modules() if is_gate(m)]
        self.seeded_names = [n for n, m in ref.named_modules() if is_seeded(m)]
        self.gates: list[StackedMixture] = [self.stacked.get_submodule(n) for n in self.gate_names]  # type: ignore[misc]
        self.named_params = list(self.stacked.named_parameters())
        self.opt = StackedOptimizer(self.named_params, kind=cfgs[0].optimizer, num_members=self.K)
        # Plain-SGD steps of the linears fed by data happen in their backward (BackwardSGD), for two or
        # more members: one member's weight is the separate run's, whose two passes cost less than the
        # hook (MLP tiny, B=8: 13.4 -> 12.5 ms per fit alone, the separate fit 11.6 ms).
        self.backward_sgd = BackwardSGD()
        for m in self.stacked.modules():
            if isinstance(m, StackedLinear) and self.K > 1:
                m.backward_sgd = self.backward_sgd
        self.num_train = parts["train"][0][0].shape[0]
        #: each member's bookkeeping, as ``fit`` keeps it (steps and epochs are shared)
        self.books = [
            Ledger(
                cfg,
                seed,
                task=self.task,
                num_train=self.num_train,
                tau0=[g.taus[k] for g in self.gates],
                dyt_index=dyt_positions(self.gates),
            )
            for k, (cfg, seed) in enumerate(zip(cfgs, seeds))
        ]
        self.smoothing = [bk.label_smoothing for bk in self.books]
        self.shuffle = [torch.Generator() for _ in range(self.K)]
        self.global_cpu = [torch.Generator() for _ in range(self.K)]
        self.global_dev = (
            [torch.Generator(device=dev) for _ in range(self.K)] if dev.type == "cuda" else self.global_cpu
        )
        self.stacked.member_rng.generators = self.global_dev
        self.final_states: list[dict[str, Tensor] | None] = [None] * self.K
        self._mask_cache: tuple[tuple[Any, ...], dict[str, Tensor]] | None = None
        self.selector_params = {
            name
            for name, _ in self.named_params
            if any(name.startswith(f"{g}.selector.") for g in self.gate_names)
        }

    # ------------------------------------------------------------------------------------- seeding

    def seed(self, k: int) -> None:
        s = self.seeds[k]
        self.shuffle[k].manual_seed(derive_seed(s, 0))
        self.global_cpu[k].manual_seed(derive_seed(s, 1))
        if self.global_dev is not self.global_cpu:
            self.global_dev[k].manual_seed(derive_seed(s, 1))
        for i, name in enumerate(self.seeded_names):
            mod = self.stacked.get_submodule(name)
            assert isinstance(mod, StackedMixture)
            mod.rngs[k].manual_seed(derive_seed(s, 2, i))

    def freeze(self, k: int, sample: bool) -> None:
        for g in self.gates:
            g.freeze(k, sample=sample)

    def resume(self, k: int, st: Mapping[str, Any]) -> int:
        start_epoch = self.books[k].resume(st, who=f"member {k}: ")
        model = self.models[k]
        model.load_state_dict(st["model"])
        self.stacked.load_member_state_dict(k, model.state_dict())
        if self.books[k].frozen:
            self.freeze(k, self.books[k].sample_after_freeze)
            self._sync_member(k)  # its selector frozen too: fit's optimizer (and state) leaves it out
        opt = self._torch_optimizer(k)
        opt.load_state_dict(st["optimizer"])
        names = {id(p): n for n, p in model.named_parameters()}
        for group in opt.param_groups:
            for p in group["params"]:
                self.opt.load_member_state(names[id(p)], k, opt.state.get(p))
        self.shuffle[k].set_state(st["rng"]["shuffle"])
        self.global_cpu[k].set_state(st["rng"]["global"]["cpu"])
        if self.global_dev is not self.global_cpu and "cuda" in st["rng"]["global"]:
            self.global_dev[k].set_state(st["rng"]["global"]["cuda"])
        for name in self.seeded_names:
            mod = self.stacked.get_submodule(name)
            assert isinstance(mod, StackedMixture)
            mod.rngs[k].set_rng_state(st["rng"]["modules"][name])
        return start_epoch

    # --------------------------------------------------------------------------- member state (fit's)

    def _write_member(self, k: int, state: Mapping[str, Tensor], index: int | None = None) -> None:
        """Copies a member state (``index`` given: slice ``index`` of stacked tensors) into model k.

        What ``load_state_dict`` does for these models (same keys, checked by ``stack_models``), without
        its per-module traversal: a tenth of the cost, which K members pay at every sync.
        """
        own = self.models[k].state_dict(keep_vars=True)
        with torch.no_grad():
            for name, t in own.items():
                t.copy_(state[name] if index is None else state[name][index])

    def _sync_member(self, k: int, state: Mapping[str, Tensor] | None = None) -> nn.Module:
        """Member k's own model, holding its current weights (or ``state``) and freeze flags."""
        model = self.models[k]
        if state is None:
            self._write_member(k, self.stacked.state_dict(), index=k)
        else:
            self._write_member(k, state)
        frozen = self.books[k].frozen
        if frozen:
            for m in model.modules():
                if is_gate(m) and not getattr(m, "frozen", False):
                    m.freeze()  # type: ignore[operator]
        for name in self.gate_names:
            sub: Any = model.get_submodule(name)
            gate = self.stacked.get_submodule(name)
            assert isinstance(gate, StackedMixture)
            sub.tau = gate.taus[k]
            if frozen and hasattr(sub, "sample_after_freeze"):
                sub.sample_after_freeze = gate.sample_after_freeze[k]
        return model

    def _torch_optimizer(self, k: int) -> torch.optim.Optimizer:
        # fit's optimizer holds the lr of the last update in its groups
        return build_optimizer(self.models[k], self.cfgs[k], self.books[k].last_lr)

    def member_state(self, k: int, epoch: int) -> dict[str, Any]:
        model = self._sync_member(k)
        opt = self._torch_optimizer(k)
        names = {id(p): n for n, p in model.named_parameters()}
        for group in opt.param_groups:
            for p in group["params"]:
                entry = self.opt.member_state(names[id(p)], k, momentum=self.cfgs[k].momentum)
                if entry is not None:
                    if "step" in entry:
                        entry["step"] = entry["step"].to(p.device)
                    opt.state[p] = entry
        cuda_state = (
            {"cuda": self.global_dev[k].get_state()} if self.global_dev is not self.global_cpu else {}
        )
        return self.books[k].state(
            epoch,
            model=model.state_dict(),
            optimizer=opt.state_dict(),
            shuffle=self.shuffle[k].get_state(),
            global_rng={"cpu": self.global_cpu[k].get_state(), **cuda_state},
            modules={
                name: self.stacked.get_submodule(name).rngs[k].rng_state()  # type: ignore[union-attr,index]
                for name in self.seeded_names
            },
        )

    # ------------------------------------------------------------------------------------------- loop

    def _masks(self) -> dict[str, Tensor]:
        """Per parameter, which members update it (the same mapping until a member stops or freezes)."""
        running_list = [bk.status == "running" for bk in self.books]
        frozen_list = [bk.frozen for bk in self.books]
        key = (tuple(running_list), tuple(frozen_list))
        if self._mask_cache is None or self._mask_cache[0] != key:
            running = torch.tensor(running_list, device=self.dev)
            trainable = running & ~torch.tensor(frozen_list, device=self.dev)
            masks = {n: (trainable if n in self.selector_params else running) for n, _ in self.named_params}
            self._mask_cache = (key, masks)
        return self._mask_cache[1]

    def _live_vector(self, live: list[int]) -> Tensor:
        """``(K,)``: 1.0 for the members in ``live``, 0.0 for the others."""
        return torch.zeros(self.K, device=self.dev).index_fill_(0, torch.tensor(live, device=self.dev), 1.0)

    def _epoch_order(self, perms: list[Tensor], steps: int) -> Tensor:
        """``(steps, K*B)``: row b holds member 0's batch-b indices, then member 1's, ... (one copy/epoch)."""
        B = self.cfgs[0].batch_size
        order = torch.stack(perms)[:, : steps * B].reshape(self.K, steps, B)
        return order.transpose(0, 1).reshape(steps, self.K * B)

    def _batch(self, order: Tensor, b: int) -> tuple[Tensor, Tensor]:
        """Member k's batch b (``fit``'s ``perm[b*B:(b+1)*B]`` of its own permutation), stacked ``(K, B, ...)``."""
        K, B = self.K, self.cfgs[0].batch_size
        flat = order[b]
        if self.shared:
            x_all, y_all = self.parts["train"][0]
            x, y = x_all.index_select(0, flat), y_all.index_select(0, flat)  # index_select: 4x faster
            return x.reshape(K, B, *x.shape[1:]), y.reshape(K, B, *y.shape[1:])
        idx = flat.reshape(K, B)
        xs = [self.parts["train"][k][0].index_select(0, idx[k]) for k in range(K)]
        ys = [self.parts["train"][k][1].index_select(0, idx[k]) for k in range(K)]
        return torch.stack(xs), torch.stack(ys)

    # ---------------------------------------------------------------- the loop's hooks (fitcore.Members)

    def train(self, mode: bool) -> None:
        self.stacked.train(mode)

    def begin_epoch(self, steps: int) -> None:
        perms: list[Tensor] = []
        for k in range(self.K):
            if self.books[k].status == "running":
                perms.append(torch.randperm(self.num_train, generator=self.shuffle[k]).to(self.dev))
            else:  # a finished member's slot still computes; its results are ignored
                perms.append(torch.arange(self.num_train, device=self.dev))
        self._order = self._epoch_order(perms, steps)
        # the hyperparameter lists, built once per epoch
        self._clips = [c.grad_clip for c in self.cfgs]
        self._wds = [c.weight_decay for c in self.cfgs]
        self._moms = [c.momentum for c in self.cfgs]
        self._ones = torch.ones(self.K, device=self.dev)
        self._masks_now = self._masks()

    def set_tau(self, k: int, taus: Sequence[float]) -> None:
        for g, tau in zip(self.gates, taus):
            g.taus[k] = tau

    def forward(self, b: int, lrs: Sequence[float]) -> tuple[Any, list[float], list[int]]:
        x, y = self._batch(self._order, b)
        sgd = self.backward_sgd
        sgd.lr = self.opt.plain_sgd_lr(
            lr=lrs, weight_decay=self._wds, momentum=self._moms, max_norms=self._clips
        )
        losses, counts = _member_loss(self.stacked(x), y, self.task, self.smoothing)
        count_list = [counts] * self.K if isinstance(counts, int) else counts.tolist()
        return (losses, lrs), losses.tolist(), count_list

    def diverged(self, k: int) -> None:
        self.final_states[k] = self.stacked.member_state_dict(k)
        self._masks_now = self._masks()

    def update(self, pending: Any, live: Sequence[int]) -> None:
        losses, lrs = pending
        masks, sgd = self._masks_now, self.backward_sgd
        self.opt.zero_grad()
        if sgd.lr is not None and not self.opt.every_member(masks):
            sgd.lr = None  # a member stopped or froze: masked updates, from gradients
        # d(sum of the live members' losses): no sum node in the graph
        losses.backward(self._ones if len(live) == self.K else self._live_vector(list(live)))
        self.opt.clip_(self._clips, masks)
        self.opt.step(lr=lrs, weight_decay=self._wds, momentum=self._moms, masks=masks, updated=sgd.updated)
        sgd.updated.clear()
        sgd.lr = None

    def end_epoch(self) -> None:
        self.backward_sgd.lr = None

    def evaluate(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        batch_size = self.cfgs[0].eval_batch_size
        val = evaluate_stacked(
            self.stacked, self.parts["val"], self.task, batch_size=batch_size, gates=self.gates
        )
        test = evaluate_stacked(self.stacked, self.parts["test"], self.task, batch_size=batch_size)
        return val, test

    def finished(self, k: int) -> None:
        self.final_states[k] = self.stacked.member_state_dict(k)

    def member_model(self, k: int) -> nn.Module:
        return self._sync_member(k)

    def tau(self, k: int) -> float:
        return float(self.gates[0].taus[k])

    def _result(self) -> StackedFitResult:
        states = []
        current = self.stacked.state_dict()
        for k in range(self.K):
            state = self.final_states[k]
            if state is None:
                state = {
                    n: t[k].detach().clone(memory_format=torch.contiguous_format) for n, t in current.items()
                }
                self._sync_member(k, state)
            else:
                self._write_member(k, state)
            states.append(state)
        return StackedFitResult(results=[bk.result() for bk in self.books], stacked=True, states=states)
