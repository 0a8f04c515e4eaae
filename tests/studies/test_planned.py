"""studies.planned: the results page's rows for adequate-size presets priced but not stored (issue #50)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from studies.planned import NOT_RUN, NOT_TESTABLE, PlannedError, planned_lines, read_planned, status
from studies.results import ResultsError, write_page

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def _write(folder: Path, planned: list[dict[str, object]], budget: float = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"budget_cpu_hours": budget, "machine": "x86_64 x2 CPUs", "planned": planned}
    (folder / "planned.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return folder


def _entry(study: str, cpu_hours: float, claims: list[str], **extra: object) -> dict[str, object]:
    return {
        "study": study,
        "spec": "studies/specs/autonorm_search.yaml",
        "preset": study.rsplit("_", 1)[-1],
        "claims": claims,
        "cpu_hours": cpu_hours,
        "wall_h": cpu_hours / 2,
        **extra,
    }


def test_over_the_budget_is_not_testable_and_under_it_not_run_yet(tmp_path: Path) -> None:
    folder = _write(
        tmp_path,
        [
            _entry("big_text", 24.8, ["(b)", "(c)"], gpu_hours=0.35, calibration="h100.json"),
            _entry("small_cnn", 3.1, ["main table, CNN"]),
        ],
    )
    big, small = read_planned([folder])
    assert status(big).startswith(f"{NOT_TESTABLE}: plan 24.8 CPU-h, 12.4 h wall on x86_64 x2 CPUs")
    assert "0.35 GPU-h with --calibration h100.json" in status(big) and "budget 4 CPU-h" in status(big)
    assert status(small) == f"{NOT_RUN}: plan 3.1 CPU-h, 1.6 h wall on x86_64 x2 CPUs"
    lines = planned_lines([big, small], stored=())
    assert len(lines) == 2 + 3  # header, rule, one row per claim
    rows = [line.split(" | ") for line in lines[2:]]
    assert [r[0].lstrip("| ") for r in rows] == ["(b)", "(c)", "main table, CNN"]
    assert all(r[-1].rstrip(" |") == "—" for r in rows)  # no verdict on a study not run
    assert NOT_TESTABLE in lines[2] and NOT_RUN in lines[4] and NOT_TESTABLE not in lines[4]


def test_a_stored_planned_study_has_no_row(tmp_path: Path) -> None:
    planned = read_planned(
        [_write(tmp_path, [_entry("big_text", 24.8, ["(c)"]), _entry("cnn", 3.0, ["(a)"])])]
    )
    lines = planned_lines(planned, stored={"cnn"})
    assert len(lines) == 3 and "big_text" in lines[2]
    assert planned_lines(planned, stored={"cnn", "big_text"}) == []


@pytest.mark.parametrize(
    "broken",
    [
        {"budget_cpu_hours": 4, "planned": [{"study": "x", "spec": "s", "preset": "p", "claims": ["(a)"]}]},
        {"budget_cpu_hours": 4, "planned": [_entry("x", -1.0, ["(a)"])]},
        {"budget_cpu_hours": "four", "planned": []},
        {"planned": {"study": "x"}},
    ],
)
def test_a_malformed_file_is_refused_naming_it(tmp_path: Path, broken: dict[str, object]) -> None:
    (tmp_path / "planned.yaml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    with pytest.raises(PlannedError, match=r"planned\.yaml"):
        read_planned([tmp_path])


def test_the_page_shows_the_planned_rows_beside_the_stored_studies(tmp_path: Path, clean_env: None) -> None:
    stored = tmp_path / "results"
    shutil.copytree(RESULTS / "autonorm_claims_text", stored / "autonorm_claims_text")
    _write(
        stored,
        [
            _entry("autonorm_claims_text_oanc", 24.8, ["(b)", "(c)"]),
            _entry("autonorm_claims_text", 1.0, ["(c)"]),  # stored: its own section, no planned row
        ],
    )
    rows, text = write_page([stored], tmp_path / "page.md")
    assert {r.study for r in rows} == {"autonorm_claims_text"}
    section = text.split("## Planned at an adequate size", 1)[1].split("## Per study", 1)[0]
    planned_rows = [line for line in section.splitlines() if line.startswith("| (")]
    assert len(planned_rows) == 2 and all("`autonorm_claims_text_oanc`" in r for r in planned_rows)
    assert all(f"{NOT_TESTABLE}: plan 24.8 CPU-h" in r for r in planned_rows)
    (stored / "planned.yaml").write_text("planned: 3\n", encoding="utf-8")
    with pytest.raises(ResultsError, match=r"planned\.yaml"):
        write_page([stored], tmp_path / "page.md")
    (stored / "planned.yaml").unlink()
    _, without = write_page([stored], tmp_path / "page.md")
    assert "## Planned at an adequate size" not in without
