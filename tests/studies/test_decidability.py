"""Designs that can never decide are refused up front (no Ray): the floors agree with the analyses, the
CLI exits 2 naming each hypothesis, exploratory designs run, every shipped preset and README example
passes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from studies import cli
from studies.decidability import check_decidable, sequential_floor, undecidable
from studies.kinds import kind_for, load_study
from studies.kinds.batchsize.analysis import batchsize_trend
from studies.kinds.search.claims import autonorm_claims
from studies.schema import SpecError
from tests.studies.test_analysis import ARGS, make_table
from tests.studies.test_claims import _gate_logs, _table

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"
BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
FIVE_SEEDS = "confirm.seeds=[100,101,102,103,104]"
FIXED = (
    "--set",
    "sequential=null",
)  # the vision/text presets are sequential (6-12 seeds): a fixed design here


def test_the_readme_example_with_five_seeds_is_refused_naming_claims_and_seeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["validate", str(SEARCH), "--set", FIVE_SEEDS, *FIXED]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # claim e is reported (tested alone at alpha, outside Holm): a and b are the Holm family of 2, so
    # 1/2^5 x 2 = 0.0625 for a and b, and e's two-sided 2/2^5 = 0.0625 alone; 6 seeds decide all three
    for claim, needed in (("a", 6), ("b", 6), ("e", 6)):
        line = next(ln for ln in err.splitlines() if f"'claim {claim}'" in ln)
        assert "alpha 0.05" in line and f"at least {needed} seeds" in line, line
        assert "smallest attainable p 0.0625" in line, line
    assert cli.main(["validate", str(SEARCH), "--set", FIVE_SEEDS, *FIXED, "--allow-exploratory"]) == 0
    assert cli.main(["plan", str(SEARCH), "--set", FIVE_SEEDS, *FIXED, "--no-calibrate"]) == 2


def test_every_shipped_preset_and_readme_example_validates(capsys: pytest.CaptureFixture[str]) -> None:
    # `validate FILE` checks the file and every preset in it.
    assert cli.main(["validate", str(SEARCH)]) == 0
    assert cli.main(["validate", "--spec", str(BATCHSIZE)]) == 0
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    examples = re.findall(r"^\.venv/bin/autonorm-study (validate|plan|run) (\S+)(.*?)(?:#.*)?$", readme, re.M)
    assert any("confirm.seeds" in rest for _, _, rest in examples)
    for _, spec, rest in examples:
        # (a shell glob, `validate studies/specs/*.yaml`, as the shell would expand it)
        specs = sorted(str(p) for p in ROOT.glob(spec)) if "*" in spec else [spec]
        assert specs, spec
        assert cli.main(["validate", *specs, *rest.split()]) == 0, (spec, rest, capsys.readouterr().err)


def test_refused_exactly_where_the_batchsize_analysis_is_underpowered() -> None:
    smoke = load_study(BATCHSIZE, ["exploratory=false"], preset="smoke")  # 2 seeds x 3 batch sizes
    (issue,) = undecidable(smoke, kind_for(smoke))  # one fix arm (corrected) under one budget
    assert issue.hypothesis == "corrected (epochs)" and issue.seeds_needed is None  # needs batch sizes
    assert issue.attainable_p == pytest.approx(1 / 36)  # exact: (3!)^2 arrangements
    with pytest.raises(SpecError) as err:
        check_decidable(smoke, kind_for(smoke))
    assert [i.path for i in err.value.issues] == ["batch_sizes"]
    res = batchsize_trend(
        make_table(batch_sizes=(8, 32, 128), seeds=2, slopes={"linear": 0.0, "corrected": -0.05}),
        control="linear",
        controls=["linear"],
        **{k: ARGS[k] for k in ("metric", "chance_metric", "chance_loss")},
    )
    assert "underpowered" in res["arms"]["corrected"]["reasons"]
    # Five seeds and five batch sizes: decidable here, and not underpowered there.
    ok = load_study(
        BATCHSIZE, ["exploratory=false", "seeds=[0,1,2,3,4]", "batch_sizes=[8,16,32,64,128]"], preset="smoke"
    )
    assert undecidable(ok, kind_for(ok)) == [] and check_decidable(ok, kind_for(ok)) is ok
    res = batchsize_trend(
        make_table(seeds=5, slopes={"linear": 0.0, "corrected": -0.05}),
        control="linear",
        controls=["linear"],
        **{k: ARGS[k] for k in ("metric", "chance_metric", "chance_loss")},
    )
    assert "underpowered" not in res["arms"]["corrected"]["reasons"]


@pytest.mark.parametrize("n_seeds", [5, 6, 7])
def test_refused_exactly_where_the_claims_are_underpowered(n_seeds: int) -> None:
    spec = load_study(SEARCH, [f"confirm.seeds={list(range(100, 100 + n_seeds))}"])
    refused = {u.hypothesis.removeprefix("claim ") for u in undecidable(spec, kind_for(spec))}
    res = autonorm_claims(
        _table(n_seeds, 0.05), _gate_logs(n_seeds), data_kind="vision", min_seeds=spec.confirm.min_seeds
    )
    underpowered = {c for c in ("a", "b", "e", "d") if "underpowered" in res[c]["reasons"]}
    assert refused == underpowered
    assert refused == {5: {"a", "b", "e", "d"}, 6: set(), 7: set()}[n_seeds]  # e alone: 2/2^6 < 0.05


def test_exploratory_runs_anyway_and_is_recorded() -> None:
    spec = load_study(SEARCH, [FIVE_SEEDS])
    marked = check_decidable(spec, kind_for(spec), allow_exploratory=True)
    assert marked.exploratory is True and spec.exploratory is False
    assert load_study(SEARCH, [FIVE_SEEDS, "exploratory=true"]).exploratory is True
    explored = load_study(SEARCH, [FIVE_SEEDS, "exploratory=true"])
    assert check_decidable(explored, kind_for(explored)).exploratory is True


def test_sequential_floor_is_the_mixture_bound() -> None:
    # g = 1: nothing can be rejected before 5 seeds alone, 6 with a family of 3 (docs/science.md §4).
    assert (
        sequential_floor(4, prior_scale=1.0, family=1)
        >= 0.05
        > sequential_floor(5, prior_scale=1.0, family=1)
    )
    assert (
        sequential_floor(5, prior_scale=1.0, family=3)
        >= 0.05
        > sequential_floor(6, prior_scale=1.0, family=3)
    )
