"""Mixtures of candidate norms: the gate :class:`NormSelector`, :class:`RandomSelector`, :class:`AutoNorm`.

Both mixtures draw their random numbers from a ``torch.Generator`` of their own (:class:`_OwnsGenerator`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autonorm_core.norms.fused import _mix
from autonorm_core.norms.helpers import _check_dim, _eager_only, _pool_tokens
from autonorm_core.norms.registry import create_norm, get_norm_layer, register_norm


class NoiseStream:
    """A noise stream: a ``torch.Generator`` created lazily on the device of the first draw and seeded
    with ``seed`` (a draw on another device restarts the stream from the seed there).

    :meth:`rng_state` / :meth:`set_rng_state` work before the first draw too (the seed and any pending
    state are enough to recreate the generator), in one ``torch.save``-able format. One per mixture
    layer (:class:`_OwnsGenerator`), one per member of a stacked layer
    (:class:`autonorm_core.stacking.layers.StackedMixture`): a stacked member draws the separate run's
    numbers because it is this same stream.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.generator: torch.Generator | None = None
        self.pending: Tensor | None = None

    def manual_seed(self, seed: int) -> None:
        """Restart the stream from ``seed`` (applied now, or when the generator is created)."""
        self.seed = int(seed)
        self.pending = None
        if self.generator is not None:
            self.generator.manual_seed(self.seed)

    def rng_state(self) -> dict[str, Any]:
        """Opaque state of the stream, for :meth:`set_rng_state` (possibly in another process)."""
        if self.generator is not None:
            state: Tensor | None = self.generator.get_state()
        else:
            state = None if self.pending is None else self.pending.clone()
        return {"seed": self.seed, "state": state}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        self.seed = int(state["seed"])
        saved: Tensor | None = state["state"]
        if saved is None:
            self.generator, self.pending = None, None
        elif self.generator is not None:
            self.generator.set_state(saved)
        else:
            self.pending = saved.clone()

    def uniform(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """float32 U(0, 1) draws from the stream (never the global RNG)."""
        if self.generator is None or self.generator.device != device:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            if self.pending is not None:
                gen.set_state(self.pending)
                self.pending = None
            self.generator = gen
        return torch.rand(shape, generator=self.generator, device=device, dtype=torch.float32)


def simplex_weights(u: Tensor, k: int) -> Tensor:
    """RandomSelector's weights ``(..., k)`` from U(0, 1) draws ``u`` (``(..., 1)`` for two candidates,
    candidate 0 getting ``u``; else ``(..., k)``, normalised Exp(1) draws: uniform on the simplex)."""
    if k == 2:
        return torch.cat([u, 1.0 - u], dim=-1)
    e = -torch.log(u.clamp_min(1e-12))
    return e / e.sum(dim=-1, keepdim=True)


def gumbel(u: Tensor, dtype: torch.dtype) -> Tensor:
    """AutoNorm's Gumbel(0, 1) noise from float32 U(0, 1) draws, computed in ``dtype`` (clamped to
    ``[1e-6, 1 − 1e-6]`` first: ``F.gumbel_softmax`` has produced NaNs)."""
    return -torch.log(-torch.log(u.clamp(1e-6, 1.0 - 1e-6).to(dtype)))


class _OwnsGenerator(nn.Module):
    """Base for modules that draw random numbers from a :class:`NoiseStream` of their own (``noise``).

    Without an explicit ``seed`` the seed is drawn from the global RNG at construction, exactly like
    the parameter init, so a model built under one ``torch.manual_seed`` is reproducible and its
    layers still draw different noise. A training loop seeds each such module with :meth:`manual_seed`
    and checkpoints :meth:`rng_state` for an exact resume.
    """

    def __init__(self, *, seed: int | None) -> None:
        super().__init__()
        self.noise = NoiseStream(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))

    @property
    def generator(self) -> torch.Generator | None:
        """The stream's generator (``None`` before the first draw)."""
        return self.noise.generator

    def manual_seed(self, seed: int) -> None:
        self.noise.manual_seed(seed)

    def rng_state(self) -> dict[str, Any]:
        return self.noise.rng_state()

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        self.noise.set_rng_state(state)

    @_eager_only
    def _uniform(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """The stream's draws, kept out of ``torch.compile`` graphs: a generator argument is not
        traceable, and the draw is tiny (one number per sample and candidate)."""
        return self.noise.uniform(shape, device)


def _build_branches(
    dim: int, candidates: Sequence[str], candidate_kwargs: Mapping[str, Mapping[str, Any]] | None
) -> tuple[tuple[str, ...], nn.ModuleList]:
    names = tuple(candidates)
    if len(names) < 2:
        raise ValueError(f"need at least 2 candidates, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"candidates must be distinct, got {names!r}")
    for name in names:
        if name in ("autonorm", "random_selector"):
            raise ValueError(f"candidate {name!r} is itself a mixture; use plain norms")
        get_norm_layer(name)  # raises ValueError listing valid names
    kwargs = dict(candidate_kwargs or {})
    unknown = set(kwargs) - set(names)
    if unknown:
        raise ValueError(f"candidate_kwargs for names not in candidates: {sorted(unknown)}")
    branches = nn.ModuleList(create_norm(name, dim, **dict(kwargs.get(name, {}))) for name in names)
    return names, branches


def _at_least_float32(t: Tensor) -> Tensor:
    """Gate arithmetic runs in float32 under reduced precision (NaN-free Gumbel noise), float64 stays."""
    if t.dtype in (torch.float32, torch.float64):
        return t  # no dispatch for the common case
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _no_autocast(device_type: str) -> AbstractContextManager[object]:
    """``autocast(enabled=False)`` where autocast is on, else a free no-op context (the gate runs per layer)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return nullcontext()


class NormSelector(nn.Module):
    """Gate network of AutoNorm: token mean → ``Linear(D, D/2)`` → ReLU → ``Linear(D/2, K)`` → logits.

    The token mean runs over the real tokens of a ``mask`` (padding excluded): otherwise the gate of a
    padded text batch mostly sees the sentence length.

    Args:
        dim: number of input channels ``D``.
        num_choices: number of candidates ``K``.
        hidden_dim: hidden width; ``None`` means ``max(1, dim // 2)``.
        init: ``"zeros"`` zero-initialises the last layer, so every gate starts at ``1/K`` (protocol
            default, open choice); ``"default"`` keeps PyTorch's Linear init.
    """

    INITS = ("zeros", "default")

    def __init__(self, dim: int, num_choices: int = 2, *, hidden_dim: int | None = None, init: str = "zeros"):
        super().__init__()
        _check_dim(dim)
        if init not in self.INITS:
            raise ValueError(f"unknown selector init {init!r}; valid: {', '.join(self.INITS)}")
        if num_choices < 2:
            raise ValueError(f"num_choices must be >= 2, got {num_choices}")
        self.dim = dim
        self.num_choices = num_choices
        self.hidden_dim = hidden_dim if hidden_dim is not None else max(1, dim // 2)
        self.init = init
        self.fc1 = nn.Linear(dim, self.hidden_dim)
        self.fc2 = nn.Linear(self.hidden_dim, num_choices)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.fc1.reset_parameters()
        if self.init == "zeros":
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)
        else:
            self.fc2.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Logits ``(B, K)`` for a ``(B, T, D)`` or ``(B, D)`` input; ``mask`` (B, T), True = real token."""
        return self.fc2(F.relu(self.fc1(_pool_tokens(x, mask))))

    def extra_repr(self) -> str:
        return f"{self.dim}, num_choices={self.num_choices}, hidden_dim={self.hidden_dim}, init={self.init!r}"


@register_norm("random_selector")
class RandomSelector(_OwnsGenerator):
    """Baseline of the AutoNorm paper: candidates mixed with random weights, nothing learned.

    In training, each sample of each forward draws weights uniformly from the simplex (for the default
    two candidates: ``w_DyT ~ U(0, 1)``, ``w_LN = 1 − w_DyT``). In evaluation the weights are the
    expectation ``1/K`` (``eval_mode="mean"``, deterministic) or fresh draws (``"sample"``).

    Args:
        dim: number of channels.
        candidates: registry names of the mixed norms.
        eval_mode: ``"mean"`` or ``"sample"``.
        seed: seed of the module's generator; ``None`` draws one from the global RNG at construction.
        candidate_kwargs: per-candidate constructor options, e.g. ``{"dyt": {"alpha_init": 1.0}}``.
    """

    EVAL_MODES = ("mean", "sample")

    def __init__(
        self,
        dim: int,
        *,
        candidates: Sequence[str] = ("dyt", "layernorm"),
        eval_mode: str = "mean",
        seed: int | None = None,
        candidate_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__(seed=seed)
        _check_dim(dim)
        if eval_mode not in self.EVAL_MODES:
            raise ValueError(f"unknown eval_mode {eval_mode!r}; valid: {', '.join(self.EVAL_MODES)}")
        self.dim = dim
        self.eval_mode = eval_mode
        self.candidates, self.branches = _build_branches(dim, candidates, candidate_kwargs)
        self.last_weights: Tensor | None = None

    def reset_parameters(self) -> None:
        for branch in self.branches:
            branch.reset_parameters()  # type: ignore[operator]

    def _weights(self, x: Tensor) -> Tensor:
        batch, k = x.shape[0], len(self.candidates)
        dtype = torch.promote_types(x.dtype, torch.float32)
        if not self.training and self.eval_mode == "mean":
            return torch.full((batch, k), 1.0 / k, device=x.device, dtype=dtype)
        return simplex_weights(self._uniform((batch, k if k > 2 else 1), x.device).to(dtype), k)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """The weights do not depend on ``x``; ``mask`` only reaches candidates that pool."""
        if x.ndim not in (2, 3):
            raise ValueError(f"expected a (B, T, D) or (B, D) input, got shape {tuple(x.shape)}")
        weights = self._weights(x)
        self.last_weights = weights.detach()
        return _mix(self.branches, x, weights, mask)

    def extra_repr(self) -> str:
        return f"{self.dim}, candidates={self.candidates}, eval_mode={self.eval_mode!r}"


@register_norm("autonorm")
class AutoNorm(_OwnsGenerator):
    """AutoNorm: a learned per-sample gate mixing candidate norms, ``Σ_k w_k · norm_k(x)``.

    The gate is a :class:`NormSelector` on the sub-layer input (its token mean over the real tokens of
    ``mask``). Training draws the weights with a Gumbel-Softmax at temperature ``tau`` (soft by
    default, straight-through one-hot with ``hard=True``); the noise is our own float32 implementation
    (``u.clamp(1e-6, 1 − 1e-6)``, autocast off) from the module's generator, because
    ``F.gumbel_softmax`` has produced NaNs. Evaluation uses ``eval_mode``: ``"softmax"``
    (deterministic), ``"argmax"`` (one-hot) or ``"sample"`` (noisy).

    With ``hard=True`` evaluation is always one-hot, never the soft mixture the network was not
    trained on: ``"softmax"`` and ``"argmax"`` both give the argmax of the noise-free probabilities,
    ``"sample"`` the one-hot Gumbel-max draw (the argmax of the noisy logits).

    AutoNorm-S freezes the gate after a warm-up: :meth:`freeze` stops the selector's parameters for
    good (``requires_grad`` off and stale gradients dropped, so no optimizer moves them) and switches
    training to deterministic weights unless ``sample_after_freeze``. While frozen, a batch whose every
    sample puts weight ≥ ``fast_path_threshold`` on the same candidate computes only that candidate.

    Args:
        dim: number of channels.
        candidates: registry names of the mixed norms (default ``("dyt", "layernorm")``).
        tau: Gumbel-Softmax temperature; a plain attribute, so a training loop may anneal it.
        hard: straight-through one-hot weights in training (one-hot deterministic weights when
            frozen) and one-hot weights in evaluation, whatever ``eval_mode``.
        eval_mode: ``"softmax"``, ``"argmax"`` or ``"sample"``.
        selector_init: ``"zeros"`` (gate starts uniform) or ``"default"``, see :class:`NormSelector`.
        sample_after_freeze: keep drawing Gumbel noise in training after :meth:`freeze`.
        fast_path_threshold: gate weight from which a frozen batch runs a single branch; the output
            then differs from the full mixture by at most ``1 − threshold`` times the branch gap (set it
            to 1.0 to require an exact one-hot gate).
        hidden_dim: selector hidden width (``None``: ``dim // 2``).
        seed: seed of the module's generator; ``None`` draws one from the global RNG at construction.
        candidate_kwargs: per-candidate constructor options, e.g. ``{"dyt": {"alpha_init": 1.0}}``.
    """

    EVAL_MODES = ("softmax", "argmax", "sample")

    def __init__(
        self,
        dim: int,
        *,
        candidates: Sequence[str] = ("dyt", "layernorm"),
        tau: float = 0.5,
        hard: bool = False,
        eval_mode: str = "softmax",
        selector_init: str = "zeros",
        sample_after_freeze: bool = False,
        fast_path_threshold: float = 1.0 - 1e-3,
        hidden_dim: int | None = None,
        seed: int | None = None,
        candidate_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__(seed=seed)
        _check_dim(dim)
        if eval_mode not in self.EVAL_MODES:
            raise ValueError(f"unknown eval_mode {eval_mode!r}; valid: {', '.join(self.EVAL_MODES)}")
        if not 0.5 < fast_path_threshold <= 1.0:
            raise ValueError(f"fast_path_threshold must be in (0.5, 1], got {fast_path_threshold}")
        self.dim = dim
        self.tau = tau
        self.hard = hard
        self.eval_mode = eval_mode
        self.sample_after_freeze = sample_after_freeze
        self.fast_path_threshold = float(fast_path_threshold)
        self.candidates, self.branches = _build_branches(dim, candidates, candidate_kwargs)
        self.selector = NormSelector(dim, len(self.candidates), hidden_dim=hidden_dim, init=selector_init)
        self._frozen = False
        self.last_probs: Tensor | None = None
        self.last_weights: Tensor | None = None

    # -- configuration ----------------------------------------------------------------------------------

    @property
    def tau(self) -> float:
        """Gumbel-Softmax temperature (settable; must stay positive)."""
        return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        value = float(value)
        if not (value > 0.0 and math.isfinite(value)):
            raise ValueError(f"tau must be a positive finite number, got {value}")
        self._tau = value

    @property
    def frozen(self) -> bool:
        """Whether :meth:`freeze` has stopped the selector."""
        return self._frozen

    def freeze(self) -> None:
        """Stop the selector for good (AutoNorm-S); the candidate norms keep training.

        Turns ``requires_grad`` off and drops stored gradients: optimizers (AdamW's weight decay
        included) skip parameters whose ``grad`` is ``None``, so the selector stays bit-identical even
        with an optimizer built before the freeze. Rebuild optimizers with
        :func:`autonorm_core.optim.param_groups` to also drop their state. The frozen flag is not part
        of the ``state_dict``: a resumed run calls :meth:`freeze` again.
        """
        for p in self.selector.parameters():
            p.requires_grad_(False)
            p.grad = None
        self._frozen = True

    def unfreeze(self) -> None:
        """Let the selector train again."""
        for p in self.selector.parameters():
            p.requires_grad_(True)
        self._frozen = False

    def reset_parameters(self) -> None:
        for branch in self.branches:
            branch.reset_parameters()  # type: ignore[operator]
        self.selector.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, candidates={self.candidates}, tau={self.tau}, hard={self.hard}, "
            f"eval_mode={self.eval_mode!r}, frozen={self.frozen}"
        )

    # -- gate --------------------------------------------------------------------------------------------

    def gate_probs(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Noise-free gate probabilities ``softmax(logits)``, at least float32, shape ``(B, K)``."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            return _at_least_float32(self.selector(x, mask)).softmax(dim=-1)

    def gate_entropy(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Natural-log entropy of :meth:`gate_probs`, shape ``(B,)`` (``ln K`` for a uniform gate)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            log_p = _at_least_float32(self.selector(x, mask)).log_softmax(dim=-1)
            return -(log_p.exp() * log_p).sum(dim=-1)

    def _samples(self) -> bool:
        """Whether this forward draws Gumbel noise (training, or ``eval_mode="sample"``)."""
        if self.training:
            return not self._frozen or self.sample_after_freeze
        return self.eval_mode == "sample"

    def _gumbel_noise(self, batch: int, device: torch.device) -> Tensor:
        """Gumbel(0, 1) noise ``(B, K)``: float32 draws, computed in the gate's dtype (≥ float32)."""
        u = self._uniform((batch, len(self.candidates)), device)
        return gumbel(u, torch.promote_types(self.selector.fc2.weight.dtype, torch.float32))

    @staticmethod
    def _straight_through(soft: Tensor) -> Tensor:
        hard = F.one_hot(soft.argmax(dim=-1), soft.shape[-1]).to(soft.dtype)
        return hard - soft.detach() + soft

    def _gate(self, x: Tensor, gumbel: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Noise-free probabilities and mixing weights, both ``(B, K)`` and at least float32."""
        logits = self.selector(x, mask)  # (B, K)
        with _no_autocast(x.device.type):
            logits = _at_least_float32(logits)
            probs = logits.softmax(dim=-1)
            if gumbel is not None:
                soft = ((logits + gumbel) / self.tau).softmax(dim=-1)
                if self.hard and not self.training:  # evaluation: an exact one-hot draw, no graph trick
                    weights = F.one_hot(soft.argmax(dim=-1), soft.shape[-1]).to(soft.dtype)
                else:
                    weights = self._straight_through(soft) if self.hard else soft
            elif not self.training and (self.hard or self.eval_mode == "argmax"):
                weights = F.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)
            elif self.training and self.hard:  # frozen, noise off: deterministic one-hot
                weights = self._straight_through(probs)
            else:
                weights = probs
        return probs, weights

    @_eager_only
    def _single_branch(self, weights: Tensor) -> int | None:
        """Index of the branch that takes ≥ ``fast_path_threshold`` of the weight for every sample.

        Since the threshold exceeds 0.5, at most one column's minimum over the batch can pass. One
        host sync per forward, only while frozen; kept out of compiled graphs because the control flow
        depends on the data.
        """
        for k, low in enumerate(weights.detach().amin(dim=0).tolist()):
            if low >= self.fast_path_threshold:
                return k
        return None

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """Mixture of the candidates; ``mask`` (B, T), True at real tokens, restricts the gate's token
        mean (and any pooling candidate's) to the real tokens."""
        gumbel = self._gumbel_noise(x.shape[0], x.device) if self._samples() else None
        if not self._frozen:
            probs, weights = self._gate(x, gumbel, mask)
        else:
            # Decide the fast path without building a graph through the (frozen) gate.
            with torch.no_grad():
                probs, weights = self._gate(x, gumbel, mask)
            k = self._single_branch(weights)
            if k is not None:
                self.last_probs, self.last_weights = probs, weights
                out: Tensor = self.branches[k](x, mask=mask)
                return out
            if torch.is_grad_enabled() and x.requires_grad:
                # The mixture depends on x through the gate too: recompute it with a graph (same noise).
                probs, weights = self._gate(x, gumbel, mask)
        self.last_probs = probs.detach()
        self.last_weights = weights.detach()
        return _mix(self.branches, x, weights, mask)
