"""AutoNorm search: T_freeze, ε_H, freeze rule, Gumbel τ and divergence-fix variant (+ lr) with Optuna.

    python studies/autonorm_search.py --preset smoke            # 2 CPU cores, < 3 min
    python studies/autonorm_search.py --set storage_path=/data/runs --set search.num_samples=96
    ray job submit --working-dir . -- python studies/autonorm_search.py --preset smoke

Runs from any working directory, including a Ray job's uploaded copy of the repository: the repo
root is put on ``sys.path`` first. Prints the best configuration, its metric and the MLflow parent run;
then draws the gate entropy per layer of the trials and logs the plot on the parent run.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import tempfile  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from studies._entry import best_trial, read_trials, study_main  # noqa: E402
from workers.plan import StudyPlan  # noqa: E402

DEFAULT_SPEC = _ROOT / "studies" / "specs" / "autonorm_search.yaml"


def _tracking_uri(plan: StudyPlan, result: Any) -> str:
    uri = getattr(result, "tracking_uri", None) or plan.tracking.uri
    if uri:
        return str(uri)
    from workers.tracking import default_tracking_uri

    return default_tracking_uri(plan.storage.path)


def log_gate_entropy_plot(spec: Any, plan: StudyPlan, result: Any) -> None:
    """Plot gate entropy per layer over epochs for the best trials and log it on the parent run.

    A plotting failure must not turn a finished study into a failed job, so it is reported on stderr.
    """
    try:
        from studies.report import plot_gate_entropy

        trials = read_trials(plan)
        best = best_trial(trials, plan.metric, plan.mode)
        ordered = sorted(trials, key=lambda t: t is not best)  # best first, the rest in trial order
        histories = {t.trial_id: t.history for t in ordered if t.history}
        if not histories:
            print("gate-entropy plot: no trial histories found", file=sys.stderr)
            return
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_gate_entropy(histories, Path(tmp) / "gate_entropy_per_layer.png")
            parent = getattr(result, "parent_run_id", None)
            if parent:
                from mlflow import MlflowClient

                MlflowClient(tracking_uri=_tracking_uri(plan, result)).log_artifact(
                    str(parent), str(png), "plots"
                )
                print(f"gate-entropy plot logged on MLflow run {parent} (plots/{png.name})")
    except Exception as e:  # reported, not raised: the study itself succeeded
        print(f"gate-entropy plot skipped: {type(e).__name__}: {e}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(
        argv,
        prog="autonorm_search.py",
        description=__doc__.splitlines()[0] if __doc__ else "",
        default_spec=DEFAULT_SPEC,
        after=log_gate_entropy_plot,
    )


if __name__ == "__main__":
    sys.exit(main())
