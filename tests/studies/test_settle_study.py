"""Settling a verdict on a real local Ray (issue 24): one batch-size smoke whose learning-rate range is
deliberately too low (the range extension must find the optimum, the refinement then tries the
midpoints around it: issue 39 item 3) and whose seeds run sequentially,
then ``extend STUDY_DIR --seeds 2`` on it. One study for the whole module, cut to 2 arms (the control
and one fix arm, so there is one hypothesis to look at) x 2 batch sizes (the fewest the spec accepts;
the analysis calls it underpowered at any count below 4, as it does the smoke's 3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from studies.batchsize_correlation import DEFAULT_SPEC
from studies.kinds import StudyOutcome
from studies.kinds.batchsize.spec import BatchSizeStudySpec
from studies.running import run_study_spec
from studies.schema import load_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

# The smoke commands, made cheaper: a range more than two decades too low for both arms, 3 seeds
# in looks of 1; 2 arms x 2 batch sizes (the reference B = 32 among them) instead of the smoke's 3 x 3,
# and a decade per grid point ([1e-4, 1e-2] in 3 points, where the issue's [1e-3, 1e-2] had half a
# decade): the corrected arm's optimum (~3) is then 3-4 extension rounds away instead of 6, the maximum.
SETTLE = (
    "arms=[linear,corrected]",
    "batch_sizes=[32,128]",
    "lr_tuning.low=0.0001",
    "lr_tuning.high=0.01",
    "lr_tuning.points=3",
    "lr_tuning.max_extensions=6",
    "lr_tuning.refine=2",  # the smoke's is 0: 2 more rates per arm around the extended grid's winner
    "sequential.min_seeds=2",
    "sequential.max_seeds=3",
    "sequential.look_every=1",
    "seeds=[0,1,2]",
    "analysis.min_seeds=2",
    # The check runs (its phase and entries are asserted) but flags no cell: a fix arm on a flagged
    # cell takes no seeds after the first look (tests/studies/test_adequacy.py), and this study is
    # here to run every look and then extend.
    "analysis.adequacy.max_gain=1.0",
    "max_concurrent=1",  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _study_tags(out: StudyOutcome) -> dict[str, str]:
    from mlflow import MlflowClient

    return dict(MlflowClient(tracking_uri=out.tracking_uri).get_run(out.parent_run_id).data.tags)  # type: ignore[arg-type]


def _trial_runs(out: StudyOutcome) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=out.tracking_uri)
    exp = client.get_run(out.parent_run_id).info.experiment_id  # type: ignore[arg-type]
    return client.search_runs([exp], filter_string="tags.`autonorm.role` = 'trial'", max_results=5000)


@pytest.fixture(scope="module")
def settled(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The study, its verdict and trial runs before and after ``extend --seeds 2``."""
    from studies import cli

    storage = tmp_path_factory.mktemp("settle")
    spec: BatchSizeStudySpec = load_spec(
        DEFAULT_SPEC, [f"storage_path={storage}", *SETTLE], preset="smoke", model=BatchSizeStudySpec
    )
    out = run_study_spec(spec, progress=False)
    study_dir = Path(out.study_dir)
    before = {
        "verdict": json.loads((study_dir / "verdict.json").read_text()),
        "lr": json.loads((study_dir / "lr_tuning.json").read_text()),
        "runs": _trial_runs(out),
        "spec": yaml.safe_load((study_dir / "study_spec.yaml").read_text()),
        "study_tags": _study_tags(out),
    }
    code = cli.main(["extend", str(study_dir), "--seeds", "2"])
    after = {
        "code": code,
        "verdict": json.loads((study_dir / "verdict.json").read_text()),
        "runs": _trial_runs(out),
        "spec": yaml.safe_load((study_dir / "study_spec.yaml").read_text()),
    }
    yield {"spec": spec, "out": out, "dir": study_dir, "before": before, "after": after}


def test_range_extension_finds_every_arms_optimum(settled: dict[str, Any]) -> None:
    spec, before = settled["spec"], settled["before"]
    tuned = before["lr"]["epochs"]
    assert set(tuned) == set(spec.arms)
    for arm, rec in tuned.items():
        assert not rec["at_range_edge"], (arm, rec)
        assert rec["lr"] > spec.lr_tuning.high, (arm, rec)  # above the whole planned range
        assert rec["extensions"] >= 1 and rec["grid"][0] == spec.lr_tuning.low
    verdict = before["verdict"]
    assert not any("lr-at-range-edge" in r for res in verdict["arms"].values() for r in res["reasons"])
    # extension trials are ordinary tuning trials: MLflow runs under their own phase runs
    runs = before["runs"]
    ext_tags = {r.data.tags["autonorm.phase"] for r in runs if "-ext" in r.data.tags["autonorm.phase"]}
    rounds = max(rec["extensions"] for rec in tuned.values())
    assert ext_tags == {f"tune-epochs-ext{k}" for k in range(1, rounds + 1)}
    # then the refinement: each arm's winner is interior, so the geometric midpoints to its two
    # neighbours ran on the tuning seeds, in one more tuning phase, and the best of all rates won
    seeds = len(spec.lr_tuning.seeds)
    for arm, rec in tuned.items():
        low, high = rec["refine"]["points"]
        grid = rec["grid"]
        i = grid.index(rec["refine"]["grid_lr"])
        assert 0 < i < len(grid) - 1, (arm, rec)
        assert low == pytest.approx((grid[i - 1] * grid[i]) ** 0.5, rel=1e-5)
        assert high == pytest.approx((grid[i] * grid[i + 1]) ** 0.5, rel=1e-5)
        best = max(rec["scores"], key=lambda lr: rec["scores"][lr] if rec["scores"][lr] is not None else -1)
        assert rec["lr"] == float(best) and rec["refine"]["moved"] == (rec["lr"] != rec["refine"]["grid_lr"])
    refine_runs = [r for r in runs if r.data.tags["autonorm.phase"] == "tune-epochs-refine"]
    assert len(refine_runs) == 2 * len(spec.arms) * seeds
    n_ext = sum(rec["trials"] for rec in tuned.values()) - spec.tuning_trials - len(refine_runs)
    assert n_ext == sum(seeds * rec["extensions"] for rec in tuned.values())


def test_sequential_looks_and_seeds_used_in_the_verdict(settled: dict[str, Any]) -> None:
    spec, before = settled["spec"], settled["before"]
    verdict = before["verdict"]
    # 2 then 3 seeds: nothing can be decided with so few (the confidence sequence is unbounded)
    assert [look["n_seeds"] for look in verdict["looks"]] == [2, 3]
    assert [look["seeds"] for look in verdict["looks"]] == [[0, 1], [0, 1, 2]]
    assert verdict["seeds_used"] == 3 and verdict["max_seeds"] == 3 and verdict["trials_saved"] == 0
    for look in verdict["looks"]:
        assert set(look["hypotheses"]) == set(spec.fix_arms)
        for h in look["hypotheses"].values():
            assert h["decision"] in ("continue", "inconclusive") and h["ci"] == [None, None]
    assert verdict["looks"][-1]["hypotheses"]["corrected"]["decision"] == "inconclusive"
    assert (settled["dir"] / "intervals_vs_seeds.png").read_bytes()[:4] == b"\x89PNG"
    # every trial run is accounted for: tuning (with extensions) + the training-adequacy check + 3
    # seeds of the confirmatory grid
    n_tuning = sum(rec["trials"] for rec in before["lr"]["epochs"].values())
    assert len(before["runs"]) == n_tuning + spec.adequacy_trials + 3 * spec.trials_per_seed
    phases = {r.data.tags["autonorm.phase"] for r in before["runs"]}
    assert {"tune-epochs-adequacy", "confirm-epochs", "confirm-epochs-look2"} <= phases
    assert set(verdict["adequacy"]) == {f"{a}@{b}" for a in spec.arms for b in spec.batch_sizes}
    # the study run's count, updated by each extension round and look, equals its trial runs
    assert int(before["study_tags"]["expected_trials"]) == len(before["runs"])
    assert not any(k.startswith("extend/") for k in before["study_tags"])


def _study_run(settled: dict[str, Any]) -> Any:
    from mlflow import MlflowClient

    out = settled["out"]
    return MlflowClient(tracking_uri=out.tracking_uri).get_run(out.parent_run_id)


def test_extend_adds_exactly_the_new_seeds_trials(settled: dict[str, Any]) -> None:
    spec, before, after = settled["spec"], settled["before"], settled["after"]
    assert after["code"] == 0
    verdict = after["verdict"]
    assert verdict["seeds_used"] == before["verdict"]["seeds_used"] + 2 == 5
    # the next integers above every seed any phase used (the tuning seeds 1000, 1001 included)
    new_seeds = [1002, 1003]
    assert after["spec"]["seeds"] == [0, 1, 2, *new_seeds]
    assert after["spec"]["sequential"]["max_seeds"] == 5 and after["spec"]["sequential"]["looks"] == [
        2,
        3,
        4,
        5,
    ]
    # the earlier looks stay looks (same seeds, same evidence; the former last look is no longer last)
    assert [look["n_seeds"] for look in verdict["looks"]] == [2, 3, 4, 5]
    for old_look, new_look in zip(before["verdict"]["looks"], verdict["looks"], strict=False):
        assert new_look["seeds"] == old_look["seeds"]
        for name, h in old_look["hypotheses"].items():
            assert new_look["hypotheses"][name]["p_value"] == pytest.approx(h["p_value"])
    assert verdict["looks"][-1]["hypotheses"]["corrected"]["decision"] in ("reject", "futile", "inconclusive")
    # the new seeds' trials and nothing else: no run duplicated, none re-run
    old = {r.info.run_id for r in before["runs"]}
    new = [r for r in after["runs"] if r.info.run_id not in old]
    assert len(new) == 2 * spec.trials_per_seed
    assert {int(r.data.params["seed"]) for r in new} == set(new_seeds)
    keys = [(r.data.tags["autonorm.phase"], r.info.run_name) for r in after["runs"]]
    assert len(keys) == len(set(keys))
    assert {r.info.run_id for r in after["runs"]} >= old
    # the study run records the extension and its count follows
    study = _study_run(settled)
    record = json.loads(study.data.tags["extend/1"])
    assert record["seeds_added"] == new_seeds and record["at"]
    assert int(study.data.tags["expected_trials"]) == len(after["runs"])


def test_status_and_report_see_the_extended_study(
    settled: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from studies import cli

    study_dir = settled["dir"]
    assert cli.main(["status", str(study_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["trials"] == status["expected_trials"] == len(settled["after"]["runs"])
    assert "confirm-epochs-look4" in status["phases"] and "tune-epochs-ext1" in status["phases"]
    assert "tune-epochs-refine" in status["phases"]
    assert cli.main(["report", str(study_dir)]) == 0
    report = json.loads((study_dir / "report" / "verdict.json").read_text())
    # the tuning replayed from the study directory: extensions and refinement read back, not run
    assert json.loads((study_dir / "report" / "lr_tuning.json").read_text()) == settled["before"]["lr"]
    assert report["looks"] == settled["after"]["verdict"]["looks"]
    assert report["verdict"] == settled["after"]["verdict"]["verdict"]
