"""``docs/results.md`` is what ``autonorm-study results`` makes of ``results/``, and every stored study
reproduces from its own tables (issue #39 item 5).

Runs over whatever ``results/`` holds (no study yet: the page says so); a study exported there
(``autonorm-study results --export runs/<study>``) is checked from then on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_reanalyse_rewrites_a_stored_verdict_under_todays_rules(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import shutil

    study = RESULTS / "autonorm_claims_text"
    if not study.is_dir():
        pytest.fail("results/autonorm_claims_text is the stored study this test re-analyses")
    copy = tmp_path / study.name
    shutil.copytree(study, copy)
    verdict_file = copy / "verdict.json"
    old = json.loads(verdict_file.read_text(encoding="utf-8"))
    # Roll the verdict back to a rule this code no longer applies: c_attn taken back to
    # inconclusive after a rejection at an earlier look, e inside the claims' Holm family.
    old["hypotheses"]["c_attn"]["verdict"] = "inconclusive"
    old["hypotheses"]["e"]["p_value_holm"] = 1.0
    old.pop("adequacy", None)
    verdict_file.write_text(json.dumps(old), encoding="utf-8")
    code = main(["results", "--reanalyse", str(copy), "--output", str(tmp_path / "page.md")])
    out = capsys.readouterr().out
    assert code == 0
    new = json.loads(verdict_file.read_text(encoding="utf-8"))
    decisions = [look["hypotheses"]["c_attn"]["decision"] for look in new["looks"]]
    assert "reject" in decisions
    # the verdict follows its looks: rejected once, rejected for good, and printed as a change
    assert decisions[decisions.index("reject") :] == ["reject"] * (len(decisions) - decisions.index("reject"))
    assert new["hypotheses"]["c_attn"]["verdict"] == "supported"
    assert f"{copy.name}: c_attn: inconclusive -> supported" in out.replace(str(copy), copy.name)
    assert new["hypotheses"]["e"]["p_value_holm"] == new["hypotheses"]["e"]["p_value"]
    assert new["resources"] == old["resources"]  # what only the run could record is kept
    assert new.get("adequacy") is not None  # measured, or said "not measured"
    assert main(["reproduce", str(copy)]) == 0  # the rewritten verdict reproduces from its tables
    # the stored study keeps its report and plots, written from the new verdict
    report = (copy / "report.md").read_text(encoding="utf-8")
    assert "c_attn" in report and (copy / "claims_forest.png").read_bytes()[:4] == b"\x89PNG"


def test_the_page_opens_with_one_row_per_claim_and_its_figure(tmp_path: Path, clean_env: None) -> None:
    from studies.claims_page import PAPER_CLAIMS

    rows, text = write_page([RESULTS], tmp_path / "results.md")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim |"))
    header = lines[start]
    assert header.count("|") - 1 <= 8  # at most eight columns
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append(line)
    assert len(body) == len(PAPER_CLAIMS)  # one row per claim of the two papers
    assert not any(
        line.startswith("| ") and "| study |" in line for line in lines[:start]
    )  # nothing before it
    assert (
        "![" in text
        and "](results.png)" in text
        and (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
    )
    # per study: the run id and the reproduce command once, never on a hypothesis row
    hypothesis_rows = [
        line for line in lines[start + 2 + len(body) :] if line.startswith("| ") and "---" not in line
    ]
    for r in rows:
        if r.mlflow_run != "—":
            assert text.count(r.mlflow_run) == 1
        assert not any(r.reproduce in line for line in hypothesis_rows)
    # a contrast decided inside its margin reads `equivalent`, not `inconclusive`
    import json

    for study in study_dirs([RESULTS]):
        verdict = json.loads((study / "verdict.json").read_text(encoding="utf-8"))
        for name, contrast in (verdict.get("contrasts") or {}).items():
            if contrast.get("verdict") == "equivalent":
                assert any(f"| {name} |" in line and "| equivalent |" in line for line in hypothesis_rows)


def test_the_claims_table_asks_each_kind_which_claims_it_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page names no kind (issue #47): a kind says which of the papers' claims its verdict tests
    (``paper_claims``) and, where its estimand is its own, what to show (``claim_estimates``)."""
    import json
    import re

    from studies import claims_page
    from studies.contract import StudyKind
    from studies.kinds import KINDS

    source = (ROOT / "studies" / "claims_page.py").read_text(encoding="utf-8")
    assert not re.search(r"""["'](search|compare|batchsize)["']""", source)
    assert '.get("kind") ==' not in source and '.get("kind") !=' not in source

    class Replication(StudyKind):  # a new kind: claim (b) on its own, and its own estimand for (d)
        name = "replication"
        example = ("", None)

        def paper_claims(self, verdict: Any) -> dict[str, list[tuple[str, str]]]:
            return {"(b)": [("b_again", "replicated")], "(d)": [("(study)", "study")]}

        def claim_estimates(self, label: str, study: str, verdict: Any) -> Any:
            if label != "(d)":
                return None
            return ["collapse share 0.9"], [claims_page.Point("(d): replicated", 0.9, 0.8, 1.0, "supported")]

        spec_class = phases = run = analyse = status = report = lambda self, *a, **k: None  # type: ignore[assignment]

    monkeypatch.setitem(KINDS, "replication", Replication())  # type: ignore[abstract]
    verdict = {
        "kind": "replication",
        "study_verdict": "supported",
        "hypotheses": {"b_again": {"verdict": "supported", "estimate": 0.02, "ci": [0.01, 0.03]}},
        "adequacy": {"autonorm_s": {"passed": True, "reached": 0.93}},
    }
    rows = {r.claim.split(" ")[0]: r for r in claims_page.claim_rows([("rep", verdict)], scope_text=str)}
    assert (
        rows["(b)"].verdict == "supported" and "replicated +0.0200 [+0.0100, +0.0300]" in rows["(b)"].estimate
    )
    assert rows["(d)"].estimate == "collapse share 0.9" and rows["(d)"].points[0].estimate == 0.9
    assert rows["(d)"].verdict == "supported"  # its own points' verdicts
    assert rows["(a)"].verdict == "not run"  # it tests neither (a) nor anything else
    # a verdict of a kind not installed here tests nothing
    assert all(
        r.verdict == "not run"
        for r in claims_page.claim_rows([("x", {**verdict, "kind": "gone"})], scope_text=str)
    )
    # a study without an adequacy check (stored before it existed) is marked; beside a checked study
    # testing the same claim, the claim's verdict and sentence are the checked study's
    small = {**verdict, "study_verdict": "refuted", "adequacy": {}}
    small["hypotheses"] = {"b_again": {"verdict": "refuted", "estimate": -0.01, "ci": [-0.02, -0.005]}}
    alone = {r.claim.split(" ")[0]: r for r in claims_page.claim_rows([("old", small)], scope_text=str)}
    assert alone["(b)"].verdict == "refuted (unchecked)" and alone["(b)"].reading.endswith(
        "(adequacy unchecked)"
    )
    both = {
        r.claim.split(" ")[0]: r
        for r in claims_page.claim_rows([("old", small), ("rep", verdict)], scope_text=str)
    }
    assert both["(b)"].verdict == "supported; refuted (unchecked)"
    assert both["(b)"].reading == "the stored studies support it at their scope"
    assert both["(b)"].estimate.split("<br>") == [
        "`old` (unchecked): replicated -0.0100 [-0.0200, -0.0050]",
        "`rep`: replicated +0.0200 [+0.0100, +0.0300]",
    ]
    # every shipped kind names only claims the page lists
    labels = {c.label for c in claims_page.PAPER_CLAIMS}
    for study in study_dirs([RESULTS]):
        stored = json.loads((study / "verdict.json").read_text(encoding="utf-8"))
        assert set(KINDS[stored["kind"]].paper_claims(stored)) <= labels


def test_a_study_decided_equivalent_reads_not_reproduced_and_its_rows_need_no_seeds() -> None:
    """A compare study whose every contrast is decided, with a predicted difference inside the margin,
    is `equivalent`: the claim's row says the difference is absent (not "open"), and a contrast decided
    inside the margin asks for no seeds even when it carries another reason (lr-tuning-noisy)."""
    from studies.claims_page import claim_rows
    from studies.decide import to_decide
    from studies.results import _equivalence_reason

    def compare(study_verdict: str, contrast_verdict: str) -> dict[str, Any]:
        names = ("corrected_vs_batchnorm", "corrected_vs_layernorm")
        return {
            "kind": "compare",
            "study_verdict": study_verdict,
            "margin": 0.005,
            "model": {"type": "mlp"},
            "scope": {"model": {"type": "mlp"}},
            "hypotheses": {
                n: {"verdict": "inconclusive", "estimate": -0.001, "ci": [-0.003, 0.001]} for n in names
            },
            "contrasts": {
                n: {"verdict": contrast_verdict, "estimate": -0.001, "ci": [-0.003, 0.001]} for n in names
            },
            "adequacy": {"corrected": {"passed": True, "reached": 0.9}},
        }

    def mlp_row(*verdicts: dict[str, Any]) -> str:
        rows = claim_rows([(f"s{i}", v) for i, v in enumerate(verdicts)], scope_text=str)
        return next(r.reading for r in rows if r.claim.startswith("main table, MLP"))

    assert mlp_row(compare("equivalent", "equivalent")).startswith(
        "not reproduced: the predicted differences are absent"
    )
    # beside a study that could not decide it, the decided one still says it
    assert mlp_row(compare("inconclusive", "inconclusive"), compare("equivalent", "equivalent")).startswith(
        "not reproduced: the predicted differences are absent"
    )
    assert mlp_row(compare("inconclusive", "inconclusive")).startswith("open")

    verdict = compare("equivalent", "equivalent")
    entry = verdict["contrasts"]["corrected_vs_batchnorm"]
    reasons = [*_equivalence_reason(verdict, entry, "inconclusive"), "lr-tuning-noisy (corrected)"]
    text = to_decide("inconclusive", reasons, 53, seeds_used=16, cost=(1.2, 0.0))
    assert text.startswith("equivalent:") and "seeds for" not in text and "lr-tuning-noisy" in text
