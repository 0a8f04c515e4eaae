"""The search kind (:class:`SearchKind`): one search under Ray Tune, then optionally the AutoNorm claims.

Running, analysing and reporting (:mod:`studies.kinds.search.workflow`, Ray and pandas) are imported
inside the methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studies.contract import StudyOutcome
from studies.kinds.base import FolderKind, KindParts
from studies.kinds.spec_surgery import extended_spec, with_seeds

__all__ = ["SearchKind"]


class SearchKind(FolderKind):
    """``kind: search``: one search under Ray Tune, then optionally the AutoNorm claims. Its phases:
    ``search``, then per confirmatory arm ``confirm-tune-<arm>``, its optional range-extension rounds
    ``confirm-tune-<arm>-ext<k>``, its refinement, for an arm a claim rests on the training-adequacy
    check ``confirm-tune-<arm>-adequacy``, and ``confirm-<arm>`` with a sequential design's optional
    later looks (:mod:`studies.kinds.search.plans`)."""

    name = "search"
    script = "studies/autonorm_search.py"
    title = "Search studies"
    summary = "One Optuna (or grid) search under Ray Tune, e.g. `studies/specs/autonorm_search.yaml`."
    example = ("studies/specs/autonorm_search.yaml", "smoke")
    tiny = (
        "training.epochs=2",
        "search.num_samples=1",
        "search.max_concurrent=1",  # one trial actor per phase: each actor process costs seconds of CPU to start
        "search.space.0.high=2",
        "confirm.arms=[autonorm, autonorm_s]",
        "confirm.seeds=[100, 101]",
        "confirm.lr_tuning={factor: 10.0, points: 1, seeds: [200], max_extensions: 0}",
        "analysis.adequacy.check=false",  # no training-adequacy phases (tests/studies/test_adequacy.py)
    )

    def parts(self) -> KindParts:
        from studies.kinds.search import decidability, plans, power, spec

        return KindParts(spec.StudySpec, decidability.undecidable, power.pilot, phases=plans.phases)

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        from studies.kinds.search.workflow import run

        return run(spec, **runner_options)

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        from studies.kinds.search.workflow import analyse

        return analyse(table, spec, **inputs)

    def status(self, spec: Any) -> dict[str, Any]:
        from studies.kinds.search.readback import status

        return status(spec)

    def report(self, spec: Any, out_dir: Path) -> Path:
        from studies.kinds.search.readback import report

        return report(spec, out_dir)

    def extended_spec(self, spec: Any, seeds: int, verdict: Mapping[str, Any]) -> Any:
        """The confirmatory seeds used so far, then ``seeds`` new ones above every seed any phase used
        (search, tuning and confirmatory), the looks made so far kept as looks."""
        assert spec.confirm is not None and spec.sequential is not None
        tuning = spec.confirm.lr_tuning.seeds if spec.confirm.lr_tuning else ()
        return extended_spec(
            spec,
            seeds,
            verdict,
            confirmatory=spec.confirm.seeds,
            taken=[*tuning, *spec.seeds],
            section="confirm",
        )

    def describe(self, spec: Any) -> str:
        plan = spec.to_plan()
        return (
            f"{len(plan.space) or len(plan.grid)} searched parameters, sampler {plan.sampler.type}, scheduler "
            f"{plan.scheduler.type}, {self.total_trials(spec)} trials ({plan.max_concurrent} at a time), metric "
            f"{plan.metric} ({plan.mode}), storage {plan.storage.path}"
        )

    def alpha(self, spec: Any) -> float:
        return float(getattr(spec.confirm, "alpha", 0.05))

    def paper_claims(self, verdict: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
        """The AutoNorm paper's claims a claims study tests: (b) on any data, (a) and (d) on images,
        (c) (its two sub-layer types) on text; a search without claims tests none."""
        hypotheses = verdict.get("hypotheses") or {}
        data_kind = str(verdict.get("data_kind") or "")
        if not hypotheses or not data_kind:
            return {}
        on = {"(a)": ("vision", ("a",)), "(c)": ("text", ("c_attn", "c_mlp")), "(d)": ("vision", ("d",))}
        out: dict[str, list[tuple[str, str]]] = {}
        if "b" in hypotheses:
            out["(b)"] = [("b", data_kind)]
        for label, (kind, names) in on.items():
            if data_kind in (kind, "any"):
                tested = [(n, n if len(names) > 1 else kind) for n in names if n in hypotheses]
                if tested:
                    out[label] = tested
        return out

    def with_seeds(self, spec: Any, k: int) -> Any:
        """``k`` confirmatory seeds (with ``confirm:``; off the search and tuning seeds), else ``k``
        search seeds."""
        confirm = spec.confirm
        if confirm is None:
            return with_seeds(spec, k, taken=())
        taken = set(spec.seeds) | set(getattr(confirm.lr_tuning, "seeds", ()) or ())
        return with_seeds(spec, k, taken=taken, start=min(confirm.seeds), section="confirm")
