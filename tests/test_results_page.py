"""``docs/results.md`` is what ``autonorm-study results`` makes of ``results/``, and every stored study
reproduces from its own tables (issue #39 item 5).

Runs over whatever ``results/`` holds (no study yet: the page says so); a study exported there
(``autonorm-study results --export runs/<study>``) is checked from then on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.cli import main
from studies.results import study_dirs, write_page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGE = ROOT / "docs" / "results.md"
REGENERATE = ".venv/bin/autonorm-study results"


def test_results_page_is_generated_from_the_stored_studies(tmp_path: Path, clean_env: None) -> None:
    assert RESULTS.is_dir() and PAGE.is_file()
    rows, text = write_page([RESULTS], tmp_path / "results.md")
    assert PAGE.read_text(encoding="utf-8") == text, (
        f"docs/results.md is stale: run `{REGENERATE}` and commit it"
    )
    assert {r.study for r in rows} == {d.name for d in study_dirs([RESULTS])}


def test_every_stored_study_reproduces_from_its_tables(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for study in study_dirs([RESULTS]):
        code = main(["reproduce", str(study)])
        out = capsys.readouterr().out.strip().splitlines()
        assert code == 0 and out[-1] == "reproduced", (study.name, out)


def test_the_readme_links_the_results_page() -> None:
    assert "](docs/results.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
