"""The seedspread spec: arms of an MLP or CNN, seeds, one fixed learning rate (``training.lr``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool

from studies.schema.arms import ArmStudySpec
from studies.schema.sections import FROZEN, TrainingSpec
from workers.plan import StudyPlan


class SpreadAnalysisSpec(BaseModel):
    """What is measured: the trial's last ``metric`` (``higher_is_better`` orders the arms)."""

    model_config = FROZEN

    metric: str = "test_accuracy"
    higher_is_better: StrictBool = True


class SeedSpreadSpec(ArmStudySpec):
    """``kind: seedspread``: every arm on every seed at ``training.lr``; no learning-rate tuning."""

    kind: Literal["seedspread"] = "seedspread"
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "seedspread"
    analysis: SpreadAnalysisSpec = SpreadAnalysisSpec()

    @property
    def total_trials(self) -> int:
        return len(self.arms or ()) * len(self.seeds)

    def train_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """The one phase, ``train``: every arm x every seed at ``training.lr`` (FIFO, full budget)."""
        arms = tuple(self.arms or ())
        training = TrainingSpec.model_validate(self.training.model_dump())
        cells: list[dict[str, Any]] = [
            {"model": {"layer": {"type": arm}}, "training": {"lr": float(self.training.lr)}} for arm in arms
        ]
        return self.phase_plan(
            "train",
            cells,
            self.seeds,
            base_config=self.arm_config(arms[0], training),
            run_name="{model.layer.type}-s{seed}",
            extra_params=(("arms", ",".join(arms)), ("seeds", ",".join(str(s) for s in self.seeds))),
            environ=environ,
        )

    def study_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """The study run's plan (name, storage, tracking, tags, params, spec)."""
        return self.study_level_plan(self.train_plan(environ=environ))
