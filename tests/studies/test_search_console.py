"""What the claims kind prints at its end (issue #48): the batch-size kind's form, every estimate
labelled, intervals and estimates signed to 4 decimals, p-values unsigned, no raw float; the claims
not applicable to the data in one line; the training-adequacy check of every arm in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from studies.kinds import load_study
from studies.kinds.search.workflow import _checks_line, _claim_lines

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"

#: a number with more than 4 significant decimals, or in exponent form: a float printed raw
RAW = re.compile(r"\d\.0*[1-9]\d{4,}|\de[-+]\d")


@pytest.mark.parametrize(
    ("name", "preset"), [("autonorm_claims_vision", "vision"), ("autonorm_claims_text", "text")]
)
def test_the_stored_claims_print_as_the_batchsize_kind_does(name: str, preset: str) -> None:
    verdict = json.loads((ROOT / "results" / name / "verdict.json").read_text())
    lines = _claim_lines(load_study(SEARCH, preset=preset), verdict)
    assert lines[0].startswith(f"STUDY VERDICT: {verdict['study_verdict']}")
    assert not any(RAW.search(line) or "None" in line for line in lines), lines
    shown = {cid for line in lines[1:] for cid in line.split(":")[0].strip().split(", ")}
    assert shown == set(verdict["claims"])  # every claim, once
    for line in lines[1:]:
        assert not re.search(r"p(_holm)?=[-+]", line), line  # a p-value is never signed
        numbers = line.split(" (")[0]
        assert not re.search(r"(?<![=\[ ,])[-+]\d", numbers), line  # every estimate after its label


def test_a_claims_numbers_are_labelled_signed_and_rounded() -> None:
    spec = load_study(SEARCH, preset="smoke")
    verdict = {
        "study_verdict": "inconclusive",
        "claims": {
            "a": {
                "verdict": "inconclusive",
                "estimate": -0.03621169916434538,
                "ci": [-0.17443067389684352, 0.10200727556815276],
                "p_value_holm": 1.0,
                "reasons": ["underpowered"],
            },
            "b": {
                "verdict": "inconclusive",
                "estimate": 3.700743415417188e-17,
                "ci": [-0.0276, 0.0276],
                "p_value_holm": 0.5,
            },
            "c": {
                "verdict": "inconclusive",
                "estimate": None,
                "ci": [None, None],
                "reasons": ["not applicable to vision"],
            },
            "c_attn": {"verdict": "inconclusive", "estimate": None, "reasons": ["not applicable to vision"]},
            "d": {
                "verdict": "inconclusive",
                "estimate": None,
                "ci": [None, None],
                "p_value": 0.25,
                "reasons": ["x"],
            },
        },
    }
    assert _claim_lines(spec, verdict) == [
        "STUDY VERDICT: inconclusive  (the paper's main claim: a and b)",
        "  a: inconclusive  difference=-0.0362 [-0.1744, +0.1020] p_holm=1 (underpowered)",
        "  b: inconclusive  difference=+0.0000 [-0.0276, +0.0276] p_holm=0.5",
        "  d: inconclusive  p=0.25 (x)",
        "  c, c_attn: inconclusive (not applicable to vision)",
    ]


def test_the_adequacy_check_is_one_line() -> None:
    checks = {
        "frozen_ln": {"passed": True},
        "autonorm": {"passed": True},
        "autonorm_s": {"passed": False, "reached": 0.875, "gain": 0.06019, "reason": "under-trained: ..."},
        "random_selector": {
            "passed": False,
            "reached": 0.41,
            "gain": None,
            "reason": "under-trained: random_selector reached 0.41, below min_metric 0.5",
        },
    }
    assert _checks_line(checks) == (
        "training adequacy (2x the budget): frozen_ln, autonorm passed; under-trained (gain at 2x): "
        "autonorm_s reached 0.8750, +0.0602; random_selector reached 0.41, below min_metric 0.5"
    )


def test_an_under_trained_arm_is_named_in_a_claims_line_its_numbers_in_the_adequacy_line() -> None:
    verdict = {
        "study_verdict": "inconclusive",
        "claims": {
            "b": {
                "verdict": "inconclusive",
                "estimate": 0.01,
                "ci": [0.0, 0.02],
                "p_value_holm": 0.19,
                "reasons": ["under-trained: autonorm_s reached 0.875, +0.06019 at twice the budget"],
            }
        },
    }
    lines = _claim_lines(load_study(SEARCH, preset="smoke"), verdict)
    assert (
        lines[1]
        == "  b: inconclusive  difference=+0.0100 [+0.0000, +0.0200] p_holm=0.19 (autonorm_s under-trained)"
    )
