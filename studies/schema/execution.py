"""``execution:``: how a study's trials run (stacked trials, issue #38)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from studies.schema.sections import PosInt, SpecModel

__all__ = ["AUTO_STACK", "ExecutionSpec"]

#: Members trained as one stacked model at most, under ``execution.stack: auto``.
AUTO_STACK = 16


class ExecutionSpec(SpecModel):
    """How trials run. ``stack``: ``auto`` trains the trials of one cell (its seeds, its learning-rate
    points: same model, batch size and steps) as one stacked model in one process, at most 16 at once;
    ``N`` at most N at once; ``off`` one process per trial. A phase's stacks train side by side in
    one Tune trial per trial slot (at most 8 stacks' worth of members each), one epoch of each per
    report. Each stacked trial is still a trial of its own: its MLflow run, its row, its checkpoint
    state. Optuna-sampled searches always run ``off``."""

    stack: Literal["auto", "off"] | PosInt = "auto"

    @field_validator("stack", mode="before")
    @classmethod
    def _bare_off(cls, v: Any) -> Any:
        # YAML (and --set execution.stack=off) reads a bare ``off`` as false
        return "off" if v is False else v

    def members(self) -> int:
        """Trials per stacked group (1: off)."""
        if self.stack == "off":
            return 1
        if self.stack == "auto":
            return AUTO_STACK
        return int(self.stack)
