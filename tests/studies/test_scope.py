"""A verdict's scope (studies.scope): what it was decided on, from the trials' configs and table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from studies.kinds import kind_for, load_study
from studies.reporting import Document, render_html, render_markdown
from studies.scope import SCOPE_TAGS, scope_line, scope_tags, study_scope

ROOT = Path(__file__).resolve().parents[2]


def _confirm_configs(preset: str) -> list[dict[str, Any]]:
    spec = load_study(ROOT / "studies/specs/batchsize_correlation.yaml", preset=preset)
    return [c for p in kind_for(spec).phases(spec) if p.name.startswith("confirm") for c in p.configs]


def test_scope_of_the_local_batchsize_design_counts_rows_params_and_budgets() -> None:
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model
    from studies.provenance import data_files, data_fingerprint

    configs = _confirm_configs("local")
    table = pd.DataFrame(
        {"arm": ["linear", "linear", "corrected"], "seed": [0, 1, 0], "test_accuracy": [0.90, 0.92, 0.5]}
    )
    scope = study_scope(configs, table, metric="test_accuracy")
    first = configs[0]
    splits = load_dataset(
        "digits", seed=int(first["seed"]), val_fraction=float(first["data"]["val_fraction"])
    )
    rows = scope["data"]["rows"]
    assert rows == {"train": len(splits.train[1]), "val": len(splits.val[1]), "test": len(splits.test[1])}
    assert sum(rows.values()) == 1797  # every digit of scikit-learn's set, once
    assert scope["data"]["fingerprint"] == data_fingerprint(data_files(first["data"]))
    models = {str(c["model"]) for c in configs}
    assert len(models) > 1  # the arms differ: the range spans them
    counts = []
    for c in configs:
        section = dict(c["model"])
        name, preset = section.pop("type"), section.pop("preset")
        counts.append(
            sum(p.numel() for p in create_model(name, splits, preset=preset, **section).parameters())
        )
    assert scope["model"]["params_range"] == [min(counts), max(counts)]
    assert scope["model"]["name"] == "MLP 64×64"
    # Both budgets of the local design: epochs for one, max_updates for the other.
    assert scope["budget"]["epochs"] == first["training"]["epochs"]
    assert scope["budget"]["updates"] == next(
        c["training"]["max_updates"] for c in configs if c["training"]["budget"] == "updates"
    )
    assert scope["batch_sizes"] == sorted({c["training"]["batch_size"] for c in configs})
    assert scope["seeds"] == 2  # used (the table's), not planned (the configs')
    assert scope["arms"] == pytest.approx({"corrected": 0.5, "linear": 0.91})
    assert (scope["device"], scope["precision"]) == ("CPU", "fp32")
    assert study_scope(configs, table, metric="test_accuracy", gpu_hours=0.5)["device"] == "GPU"


def test_scope_line_and_tags_say_the_scope_in_words() -> None:
    scope = {
        "data": {
            "name": "digits",
            "rows": {"train": 1150, "val": 288, "test": 359},
            "fingerprint": "ab" * 32,
        },
        "model": {
            "type": "mlp",
            "preset": "tiny",
            "params": 5200,
            "params_range": [5200, 5200],
            "name": "MLP 64×64",
        },
        "budget": {"epochs": 5, "updates": None},
        "batch_sizes": [8, 16],
        "seeds": 10,
        "device": "CPU",
        "precision": "fp32",
        "metric": "test_accuracy",
        "arms": {"a": 0.912, "b": 0.957},
    }
    line = scope_line(scope)
    assert line == (
        "on digits, 1,150 train rows, MLP 64×64 (5.2 k params), 5 epochs, batch sizes 8/16, 10 seeds, "
        "CPU fp32; mean test_accuracy per arm 0.91–0.96"
    )
    # one seed, one arm: the nouns in the singular, and the number named as the arm's mean
    single = scope_line(scope | {"seeds": 1, "arms": {"a": 0.912}})
    assert ", 1 seed, " in single and single.endswith("; mean test_accuracy of the one arm 0.91")
    tags = scope_tags(scope)
    assert set(tags) == set(SCOPE_TAGS)
    assert tags["autonorm.scope.data"] == "digits, 1,150 train rows (sha256 abababababab)"
    assert tags["autonorm.scope.budget"] == "5 epochs"
    assert scope_line(None) == "" and scope_tags({}) == {}


def test_a_data_set_not_here_leaves_rows_and_params_unknown_not_an_error(tmp_path: Path) -> None:
    config = {
        "data": {"type": "table", "path": str(tmp_path / "missing.csv"), "target": "y"},
        "model": {"type": "mlp", "preset": "tiny"},
        "training": {"epochs": 3, "batch_size": 16, "budget": "epochs"},
        "seed": 0,
    }
    scope = study_scope([config], [{"arm": "x", "seed": 0, "test_accuracy": 0.5}], metric="test_accuracy")
    assert scope["data"] == {"name": "table", "rows": None, "fingerprint": None}
    assert scope["model"]["params"] is None and scope["model"]["name"] == "MLP"
    assert scope["budget"] == {"epochs": 3, "updates": None} and scope["arms"] == {"x": 0.5}
    assert scope_line(scope).startswith("on table, MLP, 3 epochs")


def test_the_report_opens_with_the_verdict_then_the_scope() -> None:
    doc = Document(headline="Study verdict: refuted", title="t", scope="on digits, 1,150 train rows")
    md = render_markdown(doc).splitlines()
    assert md[:2] == ["**Study verdict: refuted**\\", "*Scope: on digits, 1,150 train rows*"]
    html = render_html(doc)
    assert html.index('id="study-verdict"') < html.index('id="scope"') < html.index("<h1>")
    assert render_markdown(Document(headline="h", title="t")).splitlines()[0] == "**h**"


def test_the_scope_does_not_depend_on_the_order_the_trials_were_read_in() -> None:
    # The text encoder's vocabulary (so its parameter count) follows the seed's split: the scope takes
    # the smallest seed's data, however the configs arrive (a stored text study recomputed +128).
    from studies.scope import _seed_first

    configs = [{"seed": s, "model": {"type": "mlp"}} for s in (101, 100, 99, "x")]
    assert min(configs, key=_seed_first)["seed"] == 99
    assert min(reversed(configs), key=_seed_first)["seed"] == 99


def test_the_execution_record_lists_the_arms_that_fall_back_and_the_report_says_so() -> None:
    # Issue #38: an arm whose members cannot train stacked is listed, with its reason, in the verdict's
    # `execution` and the report (as in `plan`); the shipped arms all stack.
    from studies.reporting import study_document
    from studies.scope import execution_lines, execution_record

    spec = load_study(ROOT / "studies/specs/batchsize_correlation.yaml", preset="local")
    configs = {arm: spec.base_config(arm=arm) for arm in spec.arm_names}
    assert execution_record(spec.execution.stack, configs) == {"stack": "auto", "not_stacked": {}}
    linear = configs["linear"]
    half = {**configs, "linear": {**linear, "training": {**linear["training"], "precision": "bf16"}}}
    record = execution_record(4, half)
    assert list(record["not_stacked"]) == ["linear"] and "bf16" in record["not_stacked"]["linear"]
    # nothing is stacked under `off`: no arm is listed as falling back
    assert execution_record("off", half) == {"stack": "off", "not_stacked": {}}
    verdict = {"study_verdict": "refuted", "execution": record}
    doc = study_document(verdict, banner="", protocol=None, spent=(60.0, 0.1, 0.0), headline="h", title="t")
    md = render_markdown(doc)
    assert "- training: each cell's members stacked in one process (execution.stack: 4)" in md
    assert f"- not stacked: linear: {record['not_stacked']['linear']}" in md
    assert execution_lines({"stack": "off", "not_stacked": {}}) == [
        "training: one process per trial (execution.stack: off)"
    ]
    assert execution_lines(None) == []  # a verdict written before `execution` existed
