"""The ``confirm:`` section of a search spec: the AutoNorm claims study after the search.

The search picks the best AutoNorm-S configuration on its own seeds; its score is optimistic (the
winner's curse) and compares nothing. The confirmatory phase runs that configuration and the
baselines on FRESH seeds, each arm with its own tuned learning rate, and the claims phase tests the
paper's claims on the per-seed paired differences (docs/science.md, "The AutoNorm claims").
``confirm: null`` (the default) skips both phases.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

__all__ = ["CONFIRM_ARMS", "ConfirmLRSpec", "ConfirmSpec", "data_kind_of"]

Arm = Literal["frozen_ln", "frozen_dyt", "random_selector", "autonorm", "autonorm_s"]
CONFIRM_ARMS: tuple[str, ...] = ("frozen_ln", "frozen_dyt", "random_selector", "autonorm", "autonorm_s")
"""LayerNorm only, DyT only, a random gate, the learned gate never frozen, the best searched AutoNorm-S."""

_VISION = frozenset({"fashion_mnist", "digits", "mnist", "cifar10", "cifar100", "svhn"})
_TEXT = frozenset({"ptb_pos_sample", "pang_lee_polarity", "sst2", "ptb_pos"})

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_Seed = Annotated[int, Field(strict=True, ge=0, lt=2**32)]


def data_kind_of(data_type: str) -> str:
    """``vision`` (stationary image data), ``text`` or ``tabular``: which claims apply."""
    if data_type in _VISION:
        return "vision"
    if data_type in _TEXT:
        return "text"
    return "tabular"


class ConfirmLRSpec(BaseModel):
    """Each arm's η: a log-spaced grid around the searched η, every point on every tuning seed
    (held out from search and confirmatory seeds); the best mean validation metric wins. Without it
    only AutoNorm-S would have a tuned η."""

    model_config = _FROZEN

    factor: Annotated[float, Field(strict=True, gt=1)] = 10.0  # grid spans searched η / factor .. η * factor
    points: Annotated[int, Field(strict=True, ge=1, le=32)] = 5
    seeds: Annotated[tuple[_Seed, ...], Field(min_length=1)] = (200, 201)
    epochs: Annotated[int, Field(strict=True, ge=1)] | None = None  # None: the confirmatory budget

    def grid(self, center: float) -> tuple[float, ...]:
        """``points`` learning rates, log-spaced and centred on ``center``."""
        if self.points == 1:
            return (float(center),)
        lo, hi = math.log10(center / self.factor), math.log10(center * self.factor)
        step = (hi - lo) / (self.points - 1)
        return tuple(float(f"{10 ** (lo + i * step):.6g}") for i in range(self.points))


class ConfirmSpec(BaseModel):
    """Confirmatory phase and claims of a search study.

    Every arm runs on every seed of ``seeds`` (same seed -> same split, data order and, where shapes
    agree, initialisation), the full training budget, no early stopping.
    """

    model_config = _FROZEN

    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] = CONFIRM_ARMS  # type: ignore[assignment]
    seeds: Annotated[tuple[_Seed, ...], Field(min_length=2)] = tuple(range(100, 110))
    lr_tuning: ConfirmLRSpec | None = ConfirmLRSpec()  # null: every arm uses the searched η
    metric: Literal["test_accuracy", "test_loss"] = "test_accuracy"
    min_seeds: Annotated[int, Field(strict=True, ge=2)] = 5
    alpha: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.05
    eps: Annotated[float, Field(strict=True, gt=0)] = 0.1  # claim d: "collapsed" = gate entropy below eps
    data_kind: Literal["auto", "vision", "text", "tabular"] = "auto"  # auto: from data.type
    max_concurrent: Annotated[int, Field(strict=True, ge=1)] | None = None  # None: the search's
    run_claims: StrictBool = True

    @model_validator(mode="after")
    def _distinct(self) -> ConfirmSpec:
        for name, values in (("arms", self.arms), ("seeds", self.seeds)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} must be distinct, got {list(values)}")
        if self.lr_tuning is not None:
            overlap = sorted(set(self.lr_tuning.seeds) & set(self.seeds))
            if overlap:
                raise ValueError(
                    f"lr_tuning.seeds {overlap} are also confirmatory seeds; tune on held-out seeds"
                )
        return self
