"""``autonorm-study results`` and ``reproduce DIR`` without a tracking store (issue #39 item 5).

The stored study is the committed finished compare study (``fixtures/study_before_37.tar.gz``,
written by commit 49c576e): only its small files are taken (``verdict.json``, ``study_spec.yaml``,
``trials.csv``, ``lr_tuning.json``), as ``results/<study>/`` holds them, and its spec's tracking store
is pointed at a path that does not exist, so every check below also checks that none is created.
No Ray, no MLflow server: seconds. The export from a real study directory (Tune state, MLflow run)
is tested per kind in ``test_kinds_contract.py`` (``test_results_export_reproduces_offline``).
"""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from studies.cli import main
from studies.results import Row, result_rows, scope_short, study_dirs, write_page

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "study_before_37.tar.gz"
SMALL = ("verdict.json", "study_spec.yaml", "trials.csv", "lr_tuning.json")
RUN_ID = "0123456789abcdef0123456789abcdef"


def _stored(root: Path, name: str = "before_37", *, provenance: dict[str, Any] | None = None) -> Path:
    """The fixture study's small files in ``root/name``, its tracking store moved to a path that
    does not exist (``root/../store/mlflow.db``)."""
    out = root / name
    out.mkdir(parents=True)
    with tarfile.open(FIXTURE) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if parts[-2:-1] == ("before_37",) and parts[-1] in SMALL:
                data = tar.extractfile(member)
                assert data is not None
                (out / parts[-1]).write_bytes(data.read())
    spec = out / "study_spec.yaml"
    store = root.parent / "store" / "mlflow.db"
    text = spec.read_text(encoding="utf-8").replace(
        "sqlite:////tmp/autonorm-study-before-37/mlflow.db", f"sqlite:///{store}"
    )
    spec.write_text(text.replace("name: before_37\n", f"name: {name}\n"), encoding="utf-8")
    assert f"sqlite:///{store}" in spec.read_text(encoding="utf-8")
    if provenance is not None:
        (out / "provenance.json").write_text(json.dumps(provenance), encoding="utf-8")
    return out


def _stores(where: Path) -> list[Path]:
    return [p for p in where.rglob("*") if p.name == "mlruns" or p.suffix == ".db"]


@pytest.fixture
def stored(tmp_path: Path, clean_env: None) -> Path:
    return _stored(tmp_path / "results")


def _edit_verdict(study: Path, edit: Any) -> None:
    path = study / "verdict.json"
    verdict = json.loads(path.read_text(encoding="utf-8"))
    edit(verdict)
    path.write_text(json.dumps(verdict, indent=2), encoding="utf-8")


# ---- reproduce DIR from its own tables ------------------------------------------------------------


def test_reproduce_without_a_store_reanalyses_the_tables(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mlruns_before = (Path.cwd() / "mlruns").exists()
    assert main(["reproduce", str(stored)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "reproduced", out
    assert "no tracking store at" in out[0] and "(trials.csv, lr_tuning.json)" in out[0], out
    assert main(["reproduce", str(stored), "--offline"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "reproduced"
    # Looking for the run created no store: not where the spec names it, nor MLflow's ./mlruns.
    assert _stores(tmp_path) == []
    assert (Path.cwd() / "mlruns").exists() == mlruns_before


def test_a_changed_number_in_the_verdict_is_named(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = json.loads((stored / "verdict.json").read_text(encoding="utf-8"))
    estimate = logged["hypotheses"]["corrected_vs_plain"]["estimate"]

    def tamper(verdict: dict[str, Any]) -> None:
        verdict["hypotheses"]["corrected_vs_plain"]["estimate"] = estimate + 0.01
        verdict["study_verdict"] = "supported"

    _edit_verdict(stored, tamper)
    assert main(["reproduce", str(stored)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "not reproduced: 2 difference(s)", out
    assert any(
        line.startswith(f"corrected_vs_plain: estimate: logged {estimate + 0.01!r}, recomputed {estimate!r}")
        for line in out
    ), out
    assert "study: study_verdict: logged supported, recomputed inconclusive" in out
    assert _stores(tmp_path) == []


def test_a_changed_trial_is_found_through_the_verdict(
    stored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table is what is re-analysed: a test accuracy changed in trials.csv changes the arm's
    mean and the contrast, which no longer match the stored verdict."""
    path = stored / "trials.csv"
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    rows[0]["test_accuracy"] = str(float(rows[0]["test_accuracy"]) + 0.05)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["reproduce", str(stored)]) == 1
    out = capsys.readouterr().out
    assert "corrected_vs_plain: estimate: logged" in out and f"arms.{rows[0]['arm']}.mean" in out, out


def test_a_directory_without_its_table_cannot_be_reanalysed(
    stored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (stored / "trials.csv").unlink()
    assert main(["reproduce", str(stored)]) == 2
    assert "no trials.csv in" in capsys.readouterr().err


# ---- the results page -----------------------------------------------------------------------------


def _by_hypothesis(rows: list[Row]) -> dict[str, Row]:
    return {r.hypothesis: r for r in rows}


def test_rows_say_claim_verdict_estimate_seeds_cost_run_and_what_would_decide(
    tmp_path: Path, clean_env: None
) -> None:
    provenance = {"study_run": {"run_id": RUN_ID, "actual": {"cpu_hours": 0.5, "gpu_hours": 0.25}}}
    study = _stored(tmp_path / "results", provenance=provenance)
    rows = _by_hypothesis(result_rows(study))
    assert list(rows) == ["(study)", "corrected_vs_plain"]  # the study's verdict, then its one contrast
    h = rows["corrected_vs_plain"]
    assert (h.study, h.kind, h.verdict) == ("before_37", "compare", "inconclusive")
    assert h.claim == "corrected better than linear on test_accuracy"
    assert h.estimate == "difference -0.231 [-0.302, -0.16]"  # every estimate named
    assert h.seeds == "2"
    assert h.scope == "—"  # written before verdicts carried a scope
    assert h.cost == "0.5 CPU-h, 0.25 GPU-h"
    assert h.mlflow_run == RUN_ID
    assert h.reproduce == f"autonorm-study reproduce {study}"
    # Inconclusive, and its difference points against the claim (corrected worse than linear):
    # not a power count for |effect| but the seeds at which the claim would be given up (the
    # t-interval of this fixed design excluding every difference of the margin or more in the
    # predicted direction: not reproduced; raised to the design's minimum), priced at this study's
    # cost per seed (0.5 CPU-h / 2 seeds), and each other reason's remedy.
    assert h.to_decide.startswith("difference -0.231 on the wrong side of the claim: not reproduced at ≈")
    assert "seeds for 80% power" not in h.to_decide
    seeds = int(h.to_decide.split("not reproduced at ≈")[1].split(" seeds")[0])
    assert seeds >= 5
    assert f"≈{seeds * 0.25:.2g} CPU-h, {seeds * 0.125:.2g} GPU-h" in h.to_decide
    assert "lr-at-range-edge: a wider η grid" in h.to_decide
    assert "optimisation-limited: longer training" in h.to_decide
    study_row = rows["(study)"]
    assert study_row.verdict == "inconclusive" and study_row.estimate == "—"
    assert study_row.claim.startswith("The divergence-corrected layer")


def test_a_decided_row_has_nothing_to_decide_and_a_scope_is_shown(tmp_path: Path, clean_env: None) -> None:
    study = _stored(tmp_path / "results")

    def decide(verdict: dict[str, Any]) -> None:
        verdict["hypotheses"]["corrected_vs_plain"]["verdict"] = "refuted"
        verdict["scope"] = {
            "data": {"name": "digits", "rows": {"train": 1150, "val": 288, "test": 359}},
            "model": {"name": "MLP 32", "type": "mlp"},
            "budget": {"epochs": 1, "updates": None},
            "seeds": 2,
            "device": "CPU",
            "precision": "fp32",
        }

    _edit_verdict(study, decide)
    rows = _by_hypothesis(result_rows(study))
    assert rows["corrected_vs_plain"].to_decide == "—"
    assert rows["corrected_vs_plain"].scope == "digits (1,150 train), MLP 32, 1 epoch, 2 seeds, CPU fp32"
    assert rows["corrected_vs_plain"].cost == "—"  # neither a study run nor resources recorded
    assert scope_short(None) == "—"


def test_an_equivalent_contrast_says_it_is_decided_inside_the_margin(tmp_path: Path, clean_env: None) -> None:
    # A predicted-better contrast whose interval lies inside ±margin: its hypothesis is neither
    # supported nor refuted by the rule, and more seeds would not tell a direction.
    study = _stored(tmp_path / "results")

    def equivalent(verdict: dict[str, Any]) -> None:
        verdict["hypotheses"]["corrected_vs_plain"].update(verdict="inconclusive", reasons=[])
        verdict["contrasts"]["corrected_vs_plain"]["verdict"] = "equivalent"
        verdict["margin"] = 0.005

    _edit_verdict(study, equivalent)
    text = _by_hypothesis(result_rows(study))["corrected_vs_plain"].to_decide
    assert text.startswith("equivalent: the interval lies inside ±0.005"), text
    assert "seeds for 80% power" not in text and "no reason recorded" not in text


def test_the_page_is_the_same_bytes_for_the_same_directories(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "results"
    first = _stored(root, "before_37")
    second = _stored(root, "another", provenance={"study_run": {"run_id": RUN_ID, "actual": {}}})
    (root / "README.md").write_text("not a study\n", encoding="utf-8")
    rows, text = write_page([root], tmp_path / "a.md")
    assert [d.name for d in study_dirs([root])] == ["another", "before_37"]
    assert [r.study for r in rows] == ["another"] * 2 + ["before_37"] * 2
    # The same studies named the other way round, one of them twice: the same page.
    write_page([first, second, root], tmp_path / "b.md")
    assert (tmp_path / "a.md").read_bytes() == (tmp_path / "b.md").read_bytes()
    # One section per study, in name order, its run and reproduce command once, then its hypotheses.
    sections = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(sections) == 2 and "another" in sections[0] and "before_37" in sections[1]
    assert text.count(f"`autonorm-study reproduce {second}`") == 1 and text.count(RUN_ID) == 1
    hypothesis = next(r.hypothesis for r in rows if r.hypothesis != "(study)")
    assert text.count(f"\n| {hypothesis} |") == 2  # one hypothesis row per study
    if (tmp_path / "a.png").exists():  # the claims figure: the same bytes too
        assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    # The command prints the rows (a header, its rule, one line per row) and writes the same page.
    assert main(["results", str(root), "--output", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| study | hypothesis | claim | kind | verdict |")
    assert sum(line.startswith(("| before_37 |", "| another |")) for line in out) == 4
    assert out[-1] == f"4 row(s) from 2 studies -> {tmp_path / 'c.md'}"
    assert (tmp_path / "c.md").read_bytes() == (tmp_path / "a.md").read_bytes()
    assert _stores(tmp_path) == []


def test_results_refuses_what_is_no_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", str(tmp_path / "absent"), "--output", str(tmp_path / "p.md")]) == 2
    assert "neither a study directory nor a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["results", str(tmp_path / "empty"), "--output", str(tmp_path / "p.md")]) == 0
    assert "No study is stored yet." in (tmp_path / "p.md").read_text(encoding="utf-8")


def test_to_decide_past_the_planning_count_and_without_one() -> None:
    from studies.results import to_decide

    # The planning t-test needs 18, the study used 24 and its sequential test did not decide.
    past = to_decide("inconclusive", ["CI includes 0"], 18, seeds_used=24, cost=(1.0, 0.0))
    assert past.startswith("more than the 24 seeds used: a fixed-design test would need 18"), past
    assert "48 seeds (≈2 CPU-h, 0 GPU-h" in past and past.endswith("; CI includes 0")
    below = to_decide("inconclusive", [], 30, seeds_used=24, cost=(1.0, 0.0))
    assert below.startswith("≥30 seeds for 80% power (≈1.2 CPU-h"), below
    # No count reaches the power (an effect of ~0): said, not left out.
    none = to_decide(
        "inconclusive", ["CI includes 0"], None, "no practical seed count", seeds_used=24, cost=None
    )
    assert none == "no practical seed count; CI includes 0"
    assert to_decide("inconclusive", ["not applicable to text"], None, "x", seeds_used=0, cost=None) == (
        "not applicable to text"
    )
