"""The search kind's spec: :class:`StudySpec` (one search under Ray Tune) and its ``confirm:`` section,
the AutoNorm claims study after the search.

The search picks the best AutoNorm-S configuration on its own seeds; its score is optimistic (the
winner's curse) and compares nothing. The confirmatory phase runs that configuration and the
baselines on FRESH seeds, each arm with its own tuned learning rate, and the claims phase tests the
paper's claims on the per-seed paired differences (docs/science.md, "The AutoNorm claims").
``confirm: null`` (the default) skips both phases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from studies.adequacy import AdequacySpec
from studies.schema.errors import SpecError, SpecIssue
from studies.schema.execution import ExecutionSpec
from studies.schema.metrics import metric_issues
from studies.schema.plan import build_plan, plan_settings, spec_hash
from studies.schema.reading import dump_yaml
from studies.schema.sampling import (
    FIFOSpec,
    FloatParam,
    SearchSpec,
)
from studies.schema.sections import (
    DataSpec,
    FashionMNISTSpec,
    ModelSpec,
    NonNegInt,
    ResourcesSpec,
    Seed,
    SpecModel,
    StorageSpec,
    TrackingSpec,
    TrainingSpec,
    ViTLiteSpec,
    section_issues,
    trial_config,
    type_first,
)
from studies.schema.space import check_search_space
from studies.schema.urls import StoragePath
from workers.plan import StudyPlan

__all__ = [
    "CONFIRM_ARMS",
    "MIN_FROZEN_SHARE",
    "REPORTED_ARMS",
    "ConfirmFreezeSpec",
    "ConfirmLRSpec",
    "ConfirmSpec",
    "SearchAnalysisSpec",
    "StudySpec",
    "data_kind_of",
]
from studies.sequential import SequentialSpec
from studies.tuning import LRGrid

Arm = Literal["frozen_ln", "frozen_dyt", "random_selector", "autonorm", "autonorm_s", "autonorm_s_searched"]
CONFIRM_ARMS: tuple[str, ...] = (
    "frozen_ln",
    "frozen_dyt",
    "random_selector",
    "autonorm",
    "autonorm_s",
    "autonorm_s_searched",
)
"""LayerNorm only, DyT only, a random gate, the learned gate never frozen, AutoNorm-S (the searched
gate frozen at ``confirm.freeze``: claim b's arm) and the best searched configuration as found
(reported, not a claim's arm)."""
REPORTED_ARMS = frozenset({"autonorm_s_searched"})
"""Arms confirmed and reported, in no claim's contrast."""
MIN_FROZEN_SHARE = 0.5
"""Claim b's AutoNorm-S must have its gate frozen for at least this share of the training epochs."""

_VISION = frozenset({"fashion_mnist", "digits", "mnist", "cifar10", "cifar100", "svhn"})
_TEXT = frozenset({"ptb_pos_sample", "oanc_pos", "pang_lee_polarity", "sst2", "ptb_pos"})

FROZEN = ConfigDict(extra="forbid", frozen=True)
_Seed = Annotated[int, Field(strict=True, ge=0, lt=2**32)]


def data_kind_of(data_type: Any) -> str:
    """``vision`` (stationary image data), ``text`` or ``tabular``: which claims apply. Takes a data
    set name or a data section (a file of one's own is ``vision`` when it holds images)."""
    if not isinstance(data_type, str):
        from studies.schema.sections import FileDataSpec

        if isinstance(data_type, FileDataSpec):
            return "vision" if data_type.file_info().layout == "image" else "tabular"
        data_type = data_type.type
    if data_type in _VISION:
        return "vision"
    if data_type in _TEXT:
        return "text"
    return "tabular"


class ConfirmLRSpec(BaseModel):
    """Each arm's η: a log-spaced grid around the searched η, every point on every tuning seed
    (held out from search and confirmatory seeds); the best mean validation metric wins. Without it
    only AutoNorm-S would have a tuned η. A winner on the grid's edge extends it by one point of its
    ratio, up to ``max_extensions`` times (:mod:`studies.tuning`; a grid of fewer than 3 points never);
    an interior winner is refined by ``refine`` more rates between it and its neighbours (2: the
    geometric midpoints) on the tuning seeds, then selected again (a study stored before ``refine``
    existed reads as ``refine: 0``: :attr:`StudySpec.stored_defaults`)."""

    model_config = FROZEN

    factor: Annotated[float, Field(strict=True, gt=1)] = 10.0  # grid spans searched η / factor .. η * factor
    points: Annotated[int, Field(strict=True, ge=1, le=32)] = 5
    seeds: Annotated[tuple[_Seed, ...], Field(min_length=1)] = (200, 201)
    epochs: Annotated[int, Field(strict=True, ge=1)] | None = None  # None: the confirmatory budget

    max_extensions: Annotated[int, Field(strict=True, ge=0, le=20)] = 3  # edge extensions (studies.tuning)
    # even: refine/2 more rates between an interior best η and each neighbour (2: the geometric midpoints; 0: none)
    refine: Annotated[int, Field(strict=True, ge=0, le=8, multiple_of=2)] = 2
    # each point's mean and standard error over the seeds; a pick ahead of the runner-up by less than one
    # SE carries `lr-tuning-noisy` (informational); a confirmatory design then needs >= 2 seeds (a study
    # stored before this field reads as false)
    flag_noisy: StrictBool = True

    def lr_grid(self, center: float) -> LRGrid:
        """The grid around ``center`` (the searched η), before any extension."""
        return LRGrid.relative(center, self.factor, self.points)

    def grid(self, center: float) -> tuple[float, ...]:
        """``points`` learning rates, log-spaced and centred on ``center``."""
        return self.lr_grid(center).points


class ConfirmFreezeSpec(BaseModel):
    """How claim b's AutoNorm-S freezes its gate: the paper's warm-up then freeze, whatever the search
    found. At the end of epoch ``t_freeze`` (``None``: ⌈epochs / 3⌉ of ``training.epochs``) the rule
    decides (``always``: the gate freezes whatever its entropy; ``freeze_if_high``: the paper's text,
    freeze while the gate entropy is at least ``eps_h``, the paper's ε_H; ``freeze_if_low``). A design
    that leaves less than half of training frozen (:data:`MIN_FROZEN_SHARE`) cannot tell AutoNorm-S
    from AutoNorm and is refused unless exploratory (:mod:`studies.kinds.search.decidability`)."""

    model_config = FROZEN

    t_freeze: Annotated[int, Field(strict=True, ge=1)] | None = None  # None: ceil(training.epochs / 3)
    eps_h: Annotated[float, Field(strict=True, ge=0, le=math.log(2.0))] = 0.1  # the paper's ε_H
    rule: Literal["always", "freeze_if_high", "freeze_if_low"] = "always"

    def epoch(self, epochs: int) -> int:
        """The freezing epoch in a run of ``epochs`` epochs."""
        return self.t_freeze if self.t_freeze is not None else max(1, math.ceil(epochs / 3))

    def frozen_share(self, epochs: int) -> float:
        """The share of the ``epochs`` training epochs that run with the gate frozen (rule ``always``;
        at most this for the entropy rules)."""
        return max(0, epochs - self.epoch(epochs)) / epochs


class ConfirmSpec(BaseModel):
    """Confirmatory phase and claims of a search study.

    Every arm runs on every seed of ``seeds`` (same seed -> same split, data order and, where shapes
    agree, initialisation), the full training budget, no early stopping.
    """

    model_config = FROZEN

    arms: Annotated[tuple[Arm, ...], Field(min_length=2)] = CONFIRM_ARMS  # type: ignore[assignment]
    # claim b's AutoNorm-S freezes here, for at least half of the epochs (a later freeze is refused unless
    # exploratory); null: it is the searched configuration as found (a stored study's design: a study stored
    # before `freeze` existed reads as null), and autonorm_s_searched (reported, in no claim) is not an arm
    freeze: ConfirmFreezeSpec | None = ConfirmFreezeSpec()
    seeds: Annotated[tuple[_Seed, ...], Field(min_length=2)] = tuple(range(100, 110))
    lr_tuning: ConfirmLRSpec | None = ConfirmLRSpec()  # null: every arm uses the searched η
    metric: Literal["test_accuracy", "test_loss"] = "test_accuracy"
    # 6: the fewest seeds at which a one-sided sign-flip p (1/2^K) times the Holm family (a, b) is < 0.05, and
    # claim e's two-sided 2/2^K alone (it is reported, outside Holm)
    min_seeds: Annotated[int, Field(strict=True, ge=2)] = 6
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
        if self.freeze is None and "autonorm_s_searched" in self.arms:
            raise ValueError(
                "arm autonorm_s_searched needs confirm.freeze: without it autonorm_s is the searched configuration"
            )
        if self.lr_tuning is not None:
            overlap = sorted(set(self.lr_tuning.seeds) & set(self.seeds))
            if overlap:
                raise ValueError(
                    f"lr_tuning.seeds {overlap} are also confirmatory seeds; tune on held-out seeds"
                )
        return self


class SearchAnalysisSpec(BaseModel):
    """What the claims analysis checks besides the claims: the training-adequacy gate
    (:mod:`studies.kinds.search.adequacy`), for the arms the claims rest on. A study stored before it
    existed ran without the check (:attr:`StudySpec.stored_defaults`)."""

    model_config = FROZEN

    # training adequacy: each arm a claim rests on, at its confirmed configuration, for twice the
    # budget on the first tuning seed (phase confirm-tune-<arm>-adequacy); a floor
    adequacy: AdequacySpec = AdequacySpec()


# --------------------------------------------------------------------------------------------------
# The study spec
# --------------------------------------------------------------------------------------------------


def _confirm_issues(spec: Any) -> list[SpecIssue]:
    """The claims study needs an AutoNorm search and seeds that no earlier phase used."""
    confirm = spec.confirm
    if confirm is None:
        return []
    issues = []
    norm = getattr(spec.model, "norm", None)
    if getattr(norm, "type", None) != "autonorm":
        issues.append(
            SpecIssue(
                "confirm", "the AutoNorm claims need model.norm.type 'autonorm' (set confirm: null otherwise)"
            )
        )
    used = sorted(set(confirm.seeds) & set(spec.seeds))
    if used:
        issues.append(
            SpecIssue("confirm.seeds", f"seeds {used} are search seeds; the confirmation needs fresh ones")
        )
    if confirm.freeze is not None and confirm.freeze.epoch(spec.training.epochs) > spec.training.epochs:
        issues.append(
            SpecIssue(
                "confirm.freeze.t_freeze",
                f"{confirm.freeze.t_freeze} is beyond training.epochs ({spec.training.epochs}): the gate would never freeze",
            )
        )
    if confirm.lr_tuning is not None:
        used = sorted(set(confirm.lr_tuning.seeds) & set(spec.seeds))
        if used:
            issues.append(
                SpecIssue("confirm.lr_tuning.seeds", f"seeds {used} are search seeds; tune on held-out ones")
            )
    return issues


class StudySpec(SpecModel):
    """One study: what to train, what to search, where it runs and where results go."""

    kind: Literal["search"] = "search"  # the batch-size study says "batchsize"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # Tune dir + MLflow experiment
    description: str = ""
    hypothesis: str | None = None
    model: ModelSpec = ViTLiteSpec()  # the AutoNorm studies' model; `kind` and `name` alone validate
    data: DataSpec = FashionMNISTSpec()
    training: TrainingSpec = TrainingSpec()
    # Without a search section: the learning rate, log-uniform (a space of one's own replaces it).
    search: SearchSpec = SearchSpec(space=(FloatParam(name="training.lr", low=1e-4, high=1e-2, log=True),))
    resources: ResourcesSpec = ResourcesSpec()
    execution: ExecutionSpec = ExecutionSpec()  # the confirmation's seeds stacked; the search itself never
    retries: NonNegInt = 2  # FailureConfig(max_failures)
    seeds: Annotated[tuple[Seed, ...], Field(min_length=1)] = (0,)
    tracking: TrackingSpec = TrackingSpec()
    storage_path: StoragePath = "runs"  # local dir (relative: to the cwd), file:///abs or s3://bucket/prefix
    storage: StorageSpec = StorageSpec()
    confirm: ConfirmSpec | None = None  # the AutoNorm claims after the search; None: search only
    exploratory: StrictBool = False  # run a design that cannot decide (report marked exploratory)
    sequential: SequentialSpec | None = None  # confirm.seeds in looks (studies.sequential); None: fixed
    analysis: SearchAnalysisSpec = SearchAnalysisSpec()  # the claims' training-adequacy gate

    stored_defaults: ClassVar[Mapping[str, Any]] = {
        "confirm.lr_tuning.refine": 0,
        "confirm.lr_tuning.flag_noisy": False,
        "confirm.freeze": None,
        "execution": {"stack": "off"},
        "analysis": {"adequacy": {"check": False, "max_gain": None, "min_metric": None}},
    }
    """Fields added after studies were stored, with what a stored spec without them ran as
    (:func:`studies.schema.stored_defaults_missing`): no refinement before ``refine`` existed, no
    tuning-noise flag before ``flag_noisy``, claim b's AutoNorm-S was the searched configuration
    before ``confirm.freeze``, and no training-adequacy check before ``analysis.adequacy`` (its
    verdict says ``"adequacy": "not measured"``)."""

    @model_validator(mode="after")
    def _cross(self) -> StudySpec:
        issues = list(section_issues(self.model, self.data, self.training))
        issues += _confirm_issues(self)
        if self.sequential is not None:
            if self.confirm is None:
                issues.append(
                    SpecIssue("sequential", "a sequential design needs a `confirm:` phase to run in looks")
                )
            elif len(self.confirm.seeds) < self.sequential.max_seeds:
                issues.append(
                    SpecIssue(
                        "sequential.max_seeds",
                        f"{self.sequential.max_seeds} seeds planned but `confirm.seeds` lists "
                        f"{len(self.confirm.seeds)}; list at least max_seeds (they are taken in order)",
                    )
                )
        if len(set(self.seeds)) != len(self.seeds):
            issues.append(SpecIssue("seeds", f"seeds must be distinct, got {list(self.seeds)}"))
        if len(self.seeds) > 1 and self.search.sampler.type != "grid":
            issues.append(
                SpecIssue(
                    "seeds",
                    "several seeds need the grid sampler; an optimiser searching over seeds fits noise",
                )
            )
        sched = self.search.scheduler
        if not isinstance(sched, FIFOSpec) and sched.grace_period > self.training.epochs:
            issues.append(
                SpecIssue(
                    "search.scheduler.grace_period",
                    f"grace_period ({sched.grace_period}) exceeds training.epochs ({self.training.epochs})",
                )
            )
        if self.search.sampler.type != "grid" and not self.search.space:
            issues.append(SpecIssue("search.space", f"sampler {self.search.sampler.type!r} needs parameters"))
        issues += metric_issues(
            self.search.metric, self.search.mode, model=self.model, data=self.data, space=self.search.space
        )
        if not issues:
            issues += check_search_space(
                self.search.space,
                self.base_config(),
                sampler=self.search.sampler.type,
                seeds=self.seeds,
            )
        if issues:
            raise SpecError(issues)
        return self

    @property
    def sequential_family(self) -> int:
        """Claimed hypotheses a sequential design must decide (``plan``'s expected cost): a and b on
        images; b and claim c's two sub-layer types on text. The reported contrast e is tested alone
        and keeps no seed running (:data:`studies.kinds.search.claims.REPORTED`): not counted."""
        if self.confirm is None:
            return 1
        from studies.kinds.search.claims import claimed_sequential

        kind = self.confirm.data_kind if self.confirm.data_kind != "auto" else data_kind_of(self.data)
        return max(1, len(claimed_sequential(kind)))

    def base_config(self) -> dict[str, Any]:
        """The trial config every trial starts from (first seed)."""
        return trial_config(self.model, self.data, self.training, self.seeds[0])

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data (what ``spec.yaml`` next to the results holds)."""
        doc: dict[str, Any] = type_first(self.model_dump(mode="json"))
        if doc.get("sequential") is None:  # a fixed design's document stays what it was
            doc.pop("sequential", None)
        return doc

    def to_yaml(self) -> str:
        return dump_yaml(self.to_document())

    def hash(self) -> str:
        return spec_hash(self.to_document())

    def to_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """The plan ``workers.run_study`` executes.

        Args:
            environ: environment to read ``MLFLOW_TRACKING_URI`` (and the git commit override) from;
                ``os.environ`` by default.
        """
        return build_plan(
            name=self.name,
            base_config=self.base_config(),
            search=self.search,
            seeds=self.seeds,
            **plan_settings(self),
            environ=environ,
        )
