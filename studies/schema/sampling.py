"""The shared search section: parameters of a search space, samplers, schedulers, and
:class:`SearchSpec` (metric, mode, budget, concurrency) that every kind's spec composes."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
)

from studies.schema.sections import FROZEN, PosFloat, PosInt, Scalar, Seed, SpecModel

# --------------------------------------------------------------------------------------------------
# Search space, sampler, scheduler
# --------------------------------------------------------------------------------------------------


class _ParamBase(BaseModel):
    model_config = FROZEN
    name: str = Field(min_length=1)  # dotted path into the trial config, or "seed"
    when: dict[str, Scalar] = {}  # sample only when these earlier parameters have these values


class _RangeParam(_ParamBase):
    # `log` and `step` come before the bounds so the bounds' validators can see them.
    log: StrictBool = False

    @field_validator("low", check_fields=False)
    @classmethod
    def _low_positive_for_log(cls, v: float, info: ValidationInfo) -> float:
        if info.data.get("log") and v <= 0:
            raise ValueError(f"a log-scaled range needs low > 0, got {v}")
        if info.data.get("log") and info.data.get("step") is not None:
            raise ValueError("step cannot be combined with log")
        return v

    @field_validator("high", check_fields=False)
    @classmethod
    def _high_above_low(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and v <= low:
            raise ValueError(f"high ({v}) must be above low ({low})")
        return v


class IntParam(_RangeParam):
    type: Literal["int"] = "int"
    step: PosInt | None = None
    low: Annotated[int, Field(strict=True)]
    high: Annotated[int, Field(strict=True)]


class FloatParam(_RangeParam):
    """Uniform float; ``log: true`` samples log-uniformly (``low`` must then be > 0)."""

    type: Literal["float"] = "float"
    step: PosFloat | None = None
    low: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    high: Annotated[float, Field(strict=True, allow_inf_nan=False)]


class CategoricalParam(_ParamBase):
    type: Literal["categorical"] = "categorical"
    choices: Annotated[tuple[Scalar, ...], Field(min_length=1)]

    @field_validator("choices")
    @classmethod
    def _distinct(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        keys = [json.dumps(c) for c in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"choices must be distinct, got {list(v)}")
        return v


ParamSpec = Annotated[IntParam | FloatParam | CategoricalParam, Field(discriminator="type")]


class TPESpec(SpecModel):
    """Optuna's TPE (seeded): random for the first ``n_startup_trials``, then a density model of the
    good and the bad trials proposes the next point."""

    type: Literal["tpe"] = "tpe"
    seed: Seed = 0
    n_startup_trials: PosInt = 10


class RandomSamplerSpec(SpecModel):
    """Independent uniform draws (seeded): the baseline a model-based sampler must beat."""

    type: Literal["random"] = "random"
    seed: Seed = 0


class CmaEsSpec(SpecModel):
    """Optuna's CMA-ES for numeric parameters (categorical ones are sampled at random by Optuna)."""

    type: Literal["cmaes"] = "cmaes"
    seed: Seed = 0
    n_startup_trials: PosInt = 1


class GridSpec(SpecModel):
    """Exhaustive grid over the categorical parameters' choices (x seeds), ``num_samples`` repeats."""

    type: Literal["grid"] = "grid"


SamplerSpec = Annotated[TPESpec | RandomSamplerSpec | CmaEsSpec | GridSpec, Field(discriminator="type")]


class FIFOSpec(SpecModel):
    type: Literal["fifo"] = "fifo"


class Asha(SpecModel):
    """Asynchronous successive halving over epochs (exploration only: stopped trials are PRUNED)."""

    type: Literal["asha"] = "asha"
    grace_period: PosInt = 1
    reduction_factor: Annotated[int, Field(strict=True, ge=2)] = 3


class MedianSpec(SpecModel):
    type: Literal["median"] = "median"
    grace_period: PosInt = 1


SchedulerSpec = Annotated[FIFOSpec | Asha | MedianSpec, Field(discriminator="type")]


class SearchSpec(SpecModel):
    """What to optimise and how: the space, the sampler, the early-stopping scheduler, the budget."""

    metric: str = Field(default="val_accuracy", min_length=1)
    mode: Literal["min", "max"] = "max"
    space: tuple[ParamSpec, ...] = ()
    sampler: SamplerSpec = TPESpec()
    scheduler: SchedulerSpec = FIFOSpec()
    num_samples: PosInt = 8  # trials (Optuna samplers) or repeats of the grid
    max_concurrent: PosInt = 2  # always passed to Tune: without it Optuna keeps one trial pending

    @field_validator("metric")
    @classmethod
    def _not_test_split(cls, v: str) -> str:
        if v.startswith("test_"):
            raise ValueError(f"{v!r} selects on the test split; use a validation metric (val_...)")
        return v

    @field_validator("mode")
    @classmethod
    def _mode_matches_metric(cls, v: str, info: ValidationInfo) -> str:
        metric = info.data.get("metric") or ""
        if "loss" in metric and v == "max":
            raise ValueError(f"metric {metric!r} is a loss: mode must be 'min'")
        if "accuracy" in metric and v == "min":
            raise ValueError(f"metric {metric!r} is an accuracy: mode must be 'max'")
        return v
