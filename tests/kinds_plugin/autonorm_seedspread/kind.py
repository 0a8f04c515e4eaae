"""The seedspread kind: one class whose methods are the kind (heavy imports inside them)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from studies.contract import Phase, StudyKind, StudyOutcome

HERE = Path(__file__).resolve().parent


class SeedSpreadKind(StudyKind):
    """``kind: seedspread``: each arm's seed-to-seed spread of the final metric at a fixed η."""

    name = "seedspread"
    title = "Seed-spread studies"
    summary = "Every arm on every seed at one learning rate: the spread of the metric (a plug-in kind)."
    example = (str(HERE / "seedspread.yaml"), "smoke")
    tiny = ("training.epochs=1", "seeds=[0, 1]", "max_concurrent=1")

    def spec_class(self) -> type[BaseModel]:
        from autonorm_seedspread.spec import SeedSpreadSpec

        return SeedSpreadSpec

    def phases(self, spec: Any) -> list[Phase]:
        """One phase, ``train``."""
        return [Phase.of(spec.train_plan())]

    def run(self, spec: Any, **runner_options: Any) -> StudyOutcome:
        from studies.kinds.outcome import log_study_outputs
        from studies.kinds.study_runner import study_runner

        with study_runner(spec.study_plan(), expected_trials=spec.total_trials, **runner_options) as runner:
            result = runner.run(spec.train_plan())
            table = self._table(spec, result.trials)
            verdict = self.analyse(table, spec)
            files = self._write(spec, verdict, table, runner.local_dir())
            log_study_outputs(
                runner,
                spec,
                files,
                tags={"verdict/study": "none"},
                metrics=_metrics(verdict),
                verdict=verdict,
            )
        for arm, row in verdict["arms"].items():
            print(
                f"[seedspread] {arm}: mean {row['mean']:.4f}, sd {row['sd']:.4f} over {row['n']} seeds",
                flush=True,
            )
        return StudyOutcome(
            kind=self.name,
            name=spec.name,
            study_dir=runner.study_uri,
            tracking_uri=runner.tracking_uri,
            parent_run_id=runner.run_id,
            summary={"study": spec.name, "study_verdict": "none", "arms": verdict["arms"]},
            verdict=verdict,
            files=files,
        )

    def analyse(self, table: Any, spec: Any, **inputs: Any) -> dict[str, Any]:
        """Per arm: ``n`` (seeds that finished), ``mean``, ``sd`` and ``range`` of the metric."""
        arms: dict[str, dict[str, Any]] = {}
        for arm in spec.arms:
            values = [r["value"] for r in table if r["arm"] == arm and math.isfinite(r["value"])]
            arms[arm] = {
                "n": len(values),
                "mean": statistics.fmean(values) if values else None,
                "sd": statistics.stdev(values) if len(values) > 1 else None,
                "range": [min(values), max(values)] if values else None,
            }
        return {
            "kind": self.name,
            "study_verdict": "none",
            "hypotheses": {},
            "metric": spec.analysis.metric,
            "arms": arms,
        }

    def status(self, spec: Any) -> dict[str, Any]:
        from studies.kinds.records import phase_status, read_phase_trials, status_row

        phases = self.phases(spec)
        trials = read_phase_trials(phases, spec)
        fields, _ = phase_status(phases, spec, trials)
        fields["rows"] = [status_row(name, t) for name, ts in trials.items() for t in ts]
        return fields

    def report(self, spec: Any, out_dir: Path) -> Path:
        from studies.kinds.records import read_phase_trials

        trials = read_phase_trials(self.phases(spec), spec).get("train", [])
        out_dir.mkdir(parents=True, exist_ok=True)
        table = self._table(spec, trials)
        return self._write(spec, self.analyse(table, spec), table, out_dir)["report"]

    # ---- the kind's own pieces ------------------------------------------------------------------

    @staticmethod
    def _table(spec: Any, trials: Any) -> list[dict[str, Any]]:
        from studies.kinds.records import arm_of, metric_value

        rows = [
            {
                "arm": arm_of(t),
                "seed": int(t.config["seed"]),
                "status": t.status,
                "value": metric_value(t, spec.analysis.metric),
            }
            for t in trials
        ]
        return sorted(rows, key=lambda r: (r["arm"], r["seed"]))

    def _write(
        self, spec: Any, verdict: dict[str, Any], table: list[dict[str, Any]], out_dir: Path
    ) -> dict[str, Path]:
        from studies.reporting import fmt, md_table, write_json
        from studies.scope import scope_line, study_scope

        metric = spec.analysis.metric
        verdict["scope"] = study_scope(  # what the numbers were measured on (every kind's verdict has it)
            self.phases(spec)[0].configs,
            [{"arm": r["arm"], "seed": r["seed"], metric: r["value"]} for r in table],
            metric=metric,
        )

        rows = [
            {"arm": arm, "seeds": str(r["n"]), "mean": fmt(r["mean"]), "sd": fmt(r["sd"])}
            for arm, r in verdict["arms"].items()
        ]
        text = (
            f"**Seed spread (no verdict)**\\\n*Scope: {scope_line(verdict['scope'])}*\n\n"
            f"# Seed spread: {spec.name}\n\n{verdict['metric']} over seeds at lr {spec.training.lr:g}\n\n"
        )
        report = out_dir / "report.md"
        report.write_text(text + md_table(rows) + "\n", encoding="utf-8")
        return {"report": report, "verdict": write_json(out_dir / "verdict.json", verdict)}


def _metrics(verdict: dict[str, Any]) -> dict[str, float]:
    return {
        f"{stat}/{arm}": float(r[stat])
        for arm, r in verdict["arms"].items()
        for stat in ("mean", "sd")
        if r[stat] is not None
    }
