"""SGD and AdamW over member-stacked parameters: every hyperparameter and every update per member.

The separate fit runs ``torch.optim.SGD`` / fused ``AdamW`` over
:func:`autonorm_core.optim.param_groups` (decay for tensors of >= 2 member dimensions, none for the
rest) after ``clip_grad_norm_`` over the optimized parameters. Here the same arithmetic runs on
``(K, ...)`` tensors with per-member learning rate, weight decay, momentum and clipping norm, and a
per-member, per-parameter ``mask``: a member that diverged, stopped, or froze that parameter (the
AutoNorm-S selector) leaves parameter, moments and step count untouched, exactly as a parameter
outside the separate optimizer.

AdamW is the separate fit's own kernel (``torch._fused_adamw_``, elementwise), called on each
member's slices with its own values: the kernel's vectorized loop and its scalar tail round apart, so
one call over the whole stack would let a member's numbers depend on where its slice falls. Member
k's update is therefore the same wherever it trains (alone, in any stack), bit for bit.

State per parameter: ``step`` ``(K,)`` (float32, as the fused kernel keeps it), ``exp_avg`` /
``exp_avg_sq`` (AdamW) or ``momentum_buffer`` (SGD with momentum; allocated with the first update
that uses momentum), all ``(K, ...)``: :meth:`member_state` / :meth:`load_member_state`
convert member k's slice to and from ``torch.optim`` state entries.

Plain SGD at one learning rate (no decay, momentum or clipping; :meth:`StackedOptimizer.plain_sgd_lr`)
runs as ``torch.optim.SGD``'s own ``p.add_(grad, alpha=-lr)``, for all parameters in one foreach call;
``fit_stacked`` then lets the first linear apply its update inside its backward
(:class:`~autonorm_core.stacking.layers.BackwardSGD`) and :meth:`StackedOptimizer.step` only counts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from autonorm_core.optim import _FUSED_DEVICES

__all__ = ["StackedOptimizer"]

#: per parameter: whether some member updates it, whether every member does, which members do
_Flags = tuple[bool, bool, list[bool]]
BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, which autonorm_core.optim.adamw keeps
EPS = 1e-8


class StackedOptimizer:
    """One optimizer step for K members at once (``kind``: ``sgd`` or ``adamw``)."""

    def __init__(self, named_params: Sequence[tuple[str, nn.Parameter]], *, kind: str, num_members: int):
        if kind not in ("sgd", "adamw"):
            raise ValueError(f"unknown optimizer {kind!r}")
        self.kind = kind
        self.k = num_members
        self.params = list(named_params)
        self._by_name = dict(self.params)
        self.state: dict[str, dict[str, Tensor]] = {}
        self._vectors: dict[str, tuple[tuple[float, ...], Tensor]] = {}
        self._uniform_lr: float | None = None
        # the last masks mapping seen (held: its identity is the cache key) -> per parameter (any, every)
        self._mask_plan: tuple[Mapping[str, Tensor], dict[str, _Flags]] | None = None
        self._pending_steps: dict[str, int] = {}  # see _count
        self._views: dict[str, tuple[Sequence[Tensor], ...]] = {}  # see _member_views
        for name, p in self.params:
            st = {"step": torch.zeros(num_members, dtype=torch.float32, device=p.device)}
            if kind == "adamw":
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.state[name] = st

    def _momentum_buffer(self, name: str) -> Tensor:
        """SGD's ``momentum_buffer`` of ``name``, allocated (zeros) on first use: plain SGD never needs one."""
        st = self.state[name]
        if "momentum_buffer" not in st:
            p = self._by_name[name]
            st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st["momentum_buffer"]

    def _vector(self, key: str, values: Sequence[float]) -> Tensor:
        """Per-member float64 values on the device, rebuilt only when they change (one host copy)."""
        values = tuple(float(v) for v in values)
        cached = self._vectors.get(key)
        if cached is None or cached[0] != values:
            device = self.params[0][1].device
            cached = (values, torch.tensor(values, dtype=torch.float64, device=device))
            self._vectors[key] = cached
        return cached[1]

    def zero_grad(self) -> None:
        # Dropped, as fit's ``zero_grad(set_to_none=True)``: the backward's fresh gradient then becomes
        # ``p.grad`` as is (its layout is the parameter's, also for the transposed linear weights), where a
        # zeroed gradient costs a fill and an accumulating add, two more passes over every stacked
        # gradient per step. A parameter that gets no gradient in a step is skipped, as torch.optim does.
        for _, p in self.params:
            p.grad = None

    @staticmethod
    def decays(p: Tensor) -> bool:
        """``param_groups``' rule on the member's tensor: >= 2 dimensions decay."""
        return p.ndim - 1 >= 2

    def _view(self, v: Tensor, like: Tensor) -> Tensor:
        return v.reshape(self.k, *([1] * (like.ndim - 1)))

    @torch.no_grad()
    def clip_(self, max_norms: Sequence[float | None], masks: Mapping[str, Tensor]) -> None:
        """``clip_grad_norm_`` per member over the parameters it optimizes (``masks[name][k]``): the norm
        of the per-tensor norms, ``max_norm / (norm + 1e-6)`` clamped to 1, one foreach product."""
        if all(m is None for m in max_norms):
            return
        named = [(name, p.grad) for name, p in self.params if p.grad is not None]
        if not named:
            return
        # Over the member's dimensions, whatever the layout (a stacked linear's weight is transposed), in
        # float64: a member's norm then rounds to the same float32 coefficient whatever its stack.
        dims = [tuple(range(1, g.ndim)) for _, g in named]
        norms = torch.stack(
            [torch.linalg.vector_norm(g, dim=d, dtype=torch.float64) for (_, g), d in zip(named, dims)]
        )
        flags = self._flags(masks)
        if not all(flags[name][1] for name, _ in named):
            norms = torch.where(torch.stack([masks[name] for name, _ in named]), norms, 0.0)
        total = torch.linalg.vector_norm(norms, dim=0)  # (K,)
        limit = self._vector("clip", [float("inf") if m is None else m for m in max_norms])
        coef = (limit / (total + 1e-6)).clamp(max=1.0)
        if None in max_norms:
            coef = torch.where(torch.isinf(limit), 1.0, coef)
        coef = coef.to(named[0][1].dtype)
        grads = [g for _, g in named]
        torch._foreach_mul_(grads, [self._view(coef, g) for g in grads])

    def plain_sgd_lr(
        self,
        *,
        lr: Sequence[float],
        weight_decay: Sequence[float],
        momentum: Sequence[float],
        max_norms: Sequence[float | None],
    ) -> float | None:
        """The learning rate when this step is ``p -= lr * grad`` for every member (SGD, one lr, no
        weight decay, momentum or clipping), else ``None``: the step a :class:`BackwardSGD` may apply."""
        if self.kind != "sgd" or lr.count(lr[0]) != len(lr) or max_norms.count(None) != len(max_norms):
            return None
        if weight_decay.count(0.0) != len(weight_decay) or momentum.count(0.0) != len(momentum):
            return None
        return float(lr[0])

    def every_member(self, masks: Mapping[str, Tensor]) -> bool:
        """Whether every member updates every parameter under ``masks``."""
        return all(flags[1] for flags in self._flags(masks).values())

    def _flags(self, masks: Mapping[str, Tensor]) -> dict[str, _Flags]:
        """Per parameter ``(mask.any(), mask.all(), mask as a list)``, read once per masks mapping: callers
        pass the same mapping (of never-mutated masks) until a member stops or freezes (``fit_stacked``
        caches it)."""
        if self._mask_plan is None or self._mask_plan[0] is not masks:
            read: dict[int, _Flags] = {}
            flags = {}
            for name, _ in self.params:
                mask = masks[name]
                if id(mask) not in read:
                    values = [bool(v) for v in mask.tolist()]
                    read[id(mask)] = (any(values), all(values), values)
                flags[name] = read[id(mask)]
            self._mask_plan = (masks, flags)
        return self._mask_plan[1]

    @torch.no_grad()
    def step(
        self,
        *,
        lr: Sequence[float],
        weight_decay: Sequence[float],
        momentum: Sequence[float],
        masks: Mapping[str, Tensor],
        updated: Sequence[Tensor] = (),
    ) -> None:
        """One update; ``masks[name]`` ``(K,)`` bool: which members update that parameter.

        ``updated``: parameters a :class:`~autonorm_core.stacking.layers.BackwardSGD` already stepped in
        the backward (their plain-SGD update of this step; they have no gradient): only counted.
        """
        if updated:
            ids = {id(t) for t in updated}
            self._count(name for name, p in self.params if id(p) in ids)
        lr0 = lr[0]
        self._uniform_lr = float(lr0) if lr.count(lr0) == len(lr) else None
        need_wd = weight_decay.count(0.0) != len(weight_decay)
        need_mom = momentum.count(0.0) != len(momentum)
        flags = self._flags(masks)
        if self.kind == "sgd" and self._uniform_lr is not None and not need_wd and not need_mom:
            # Plain SGD at one lr (a sweep over seeds): torch.optim.SGD's own per-parameter update
            # ``p.add_(grad, alpha=-lr)``, for all parameters in one foreach call (the same kernel and
            # arithmetic), when every member updates every parameter that has a gradient.
            todo = [(name, p) for name, p in self.params if p.grad is not None and flags[name][0]]
            if all(flags[name][1] for name, _ in todo):
                if todo:
                    params = [p for _, p in todo]
                    grads = [p.grad for p in params]
                    torch._foreach_add_(params, grads, alpha=-self._uniform_lr)  # type: ignore[arg-type]
                    self._count(name for name, _ in todo)
                return
        self._flush_steps()
        if self.kind == "adamw":
            self._adamw(lr, weight_decay, flags)
            return
        lr64 = self._vector("lr", lr)
        wd64 = self._vector("wd", weight_decay)
        mom = self._vector("mom", momentum)
        if need_mom:
            for name, _ in self.params:
                self._momentum_buffer(name)
        for name, p in self.params:
            some, every, _ = flags[name]
            if p.grad is None or not some:
                continue
            st = self.state[name]
            g = p.grad
            wd = wd64 if (need_wd and self.decays(p)) else None
            step = st["step"] + 1.0
            if every:
                # In place, the common case: every member updates this parameter.
                st["step"] = step
                self._sgd_(p, g, st, step, lr64, wd, mom if need_mom else None)
                continue
            # Some members keep this parameter (diverged, stopped, frozen): update copies, then select.
            mask = masks[name]
            mb = self._view(mask, p)
            new_p = p.detach().clone()
            new_st = {key: v.clone() for key, v in st.items() if key != "step"}
            new_st["step"] = step
            self._sgd_(new_p, g, new_st, step, lr64, wd, mom if need_mom else None)
            p.copy_(torch.where(mb, new_p, p))
            st["step"] = torch.where(mask, step, st["step"])
            for key, value in new_st.items():
                if key != "step":
                    st[key].copy_(torch.where(mb, value, st[key]))

    def _count(self, names: Iterable[str]) -> None:
        """One update of every member of these parameters, counted in Python until a step count is read
        (:meth:`_flush_steps`): plain SGD itself never reads them."""
        pending = self._pending_steps
        for name in names:
            pending[name] = pending.get(name, 0) + 1

    def _flush_steps(self) -> None:
        if self._pending_steps:
            for name, n in self._pending_steps.items():
                self.state[name]["step"].add_(float(n))
            self._pending_steps.clear()

    def _adamw(self, lr: Sequence[float], weight_decay: Sequence[float], flags: Mapping[str, _Flags]) -> None:
        """The separate fit's fused AdamW, member by member (see the module docstring): the decayed and
        the other group of member k's slices, each one kernel call."""
        todo = [(name, p) for name, p in self.params if p.grad is not None and flags[name][0]]
        if not todo:
            return
        fused = todo[0][1].device.type in _FUSED_DEVICES
        for decays in (True, False):
            group = [(name, p) for name, p in todo if self.decays(p) == decays]
            if not group:
                continue
            sts = [self.state[name] for name, _ in group]
            # per tensor its K member views (a member's slice as K=1 would hold it); the state's are kept
            views: list[tuple[Any, ...]] = []
            for (name, p), st in zip(group, sts):
                grad: Tensor = p.grad  # type: ignore[assignment]
                if self.k == 1:
                    views.append((p, grad, st["exp_avg"], st["exp_avg_sq"], st["step"]))
                else:
                    p_k, avg_k, sq_k, step_k = self._member_views(name, p, st)
                    views.append((p_k, grad.unbind(0), avg_k, sq_k, step_k))
            for k in range(self.k):
                mine = [v for (name, _), v in zip(group, views) if flags[name][2][k]]
                if not mine:
                    continue
                if self.k == 1:
                    params, grads, avgs, sqs, steps = (list(t) for t in zip(*mine))
                else:
                    params, grads, avgs, sqs, steps = ([t[k] for t in ts] for ts in zip(*mine))
                hyper: dict[str, Any] = {"lr": float(lr[k]), "eps": EPS, "amsgrad": False, "maximize": False}
                hyper.update(
                    weight_decay=float(weight_decay[k]) if decays else 0.0, beta1=BETAS[0], beta2=BETAS[1]
                )
                if not fused:
                    from torch.optim.adam import adam

                    adam(
                        params,
                        grads,
                        avgs,
                        sqs,
                        [],
                        steps,
                        foreach=False,
                        decoupled_weight_decay=True,
                        **hyper,
                    )
                    continue
                torch._foreach_add_(steps, 1.0)
                torch._fused_adamw_(params, grads, avgs, sqs, [], steps, **hyper)

    def _member_views(self, name: str, p: Tensor, st: Mapping[str, Tensor]) -> tuple[Sequence[Tensor], ...]:
        """Member views of ``p`` and its AdamW state (updated in place, never replaced), made once."""
        views = self._views.get(name)
        if views is None:
            views = self._views[name] = tuple(
                t.unbind(0) if key != "step" else t.split(1)
                for key, t in (
                    ("p", p),
                    ("exp_avg", st["exp_avg"]),
                    ("exp_avg_sq", st["exp_avg_sq"]),
                    ("step", st["step"]),
                )
            )
        return views

    def _sgd_(
        self,
        p: Tensor,
        g: Tensor,
        st: Mapping[str, Tensor],
        step: Tensor,
        lr: Tensor,
        wd: Tensor | None,
        mom: Tensor | None,
    ) -> None:
        """``torch.optim.SGD``'s arithmetic (no dampening, no Nesterov), in place, per-member values."""
        dt = p.dtype
        d_p = g if wd is None else g + self._view(wd.to(dt), p) * p
        if mom is not None:
            buf = st["momentum_buffer"]
            first = self._view(step == 1.0, p)
            use = self._view(mom != 0.0, p)
            new_buf = torch.where(first, d_p, buf * self._view(mom.to(dt), p) + d_p)
            buf.copy_(torch.where(use, new_buf, buf))
            d_p = torch.where(use, buf, d_p)
        if self._uniform_lr is not None:
            p.add_(d_p, alpha=-self._uniform_lr)  # every member at one lr: torch.optim.SGD's own call
        else:
            p.addcmul_(d_p, self._view((-lr).to(dt), p))

    # -- member k <-> torch.optim state entries ---------------------------------------------------------

    def member_state(self, name: str, k: int, *, momentum: float) -> dict[str, Tensor] | None:
        """Member ``k``'s ``torch.optim`` state entry for ``name`` (``None``: never updated)."""
        self._flush_steps()
        st = self.state[name]
        steps = float(st["step"][k])
        if steps == 0.0:
            return None
        # Contiguous copies, like the member's parameters (a stacked linear's weight is stored transposed;
        # fused AdamW expects state laid out like its contiguous parameter).
        fmt = torch.contiguous_format
        if self.kind == "adamw":
            return {
                "step": torch.tensor(steps, dtype=torch.float32),
                "exp_avg": st["exp_avg"][k].clone(memory_format=fmt),
                "exp_avg_sq": st["exp_avg_sq"][k].clone(memory_format=fmt),
            }
        if momentum == 0.0:
            return None
        return {"momentum_buffer": self._momentum_buffer(name)[k].clone(memory_format=fmt)}

    def load_member_state(self, name: str, k: int, entry: Mapping[str, Tensor] | None) -> None:
        self._flush_steps()
        st = self.state[name]
        with torch.no_grad():
            if not entry:
                st["step"][k] = 0.0
                for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                    if key in st:
                        st[key][k].zero_()
                return
            if self.kind == "adamw":
                st["step"][k] = float(entry["step"])
                st["exp_avg"][k].copy_(entry["exp_avg"])
                st["exp_avg_sq"][k].copy_(entry["exp_avg_sq"])
            else:
                buf = entry.get("momentum_buffer")
                if buf is not None:
                    self._momentum_buffer(name)[k].copy_(buf)
                    st["step"][k] = max(float(st["step"][k]), 1.0)
