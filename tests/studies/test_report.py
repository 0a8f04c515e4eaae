"""Tests of ``studies.kinds.batchsize.report``: the files it writes, what they contain, and that plots are real images."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.kinds.batchsize.analysis import batchsize_trend
from studies.kinds.batchsize.report import (
    VERDICT_COLORS,
    cell_summary,
    render_html,
    render_markdown,
    verdict_table,
    write_batchsize_report,
)
from studies.reporting import CAPTIONS, COLORS, legend_handles, plot_gate_entropy

ARGS: dict[str, Any] = {
    "control": "linear",
    "controls": ["linear", "linear_layernorm"],
    "metric": "test_accuracy",
    "chance_metric": 0.1,
    "chance_loss": math.log(10),
    "n_boot": 200,
    "n_perm": 499,
}


def _table(*, seeds: int = 6, budgets: tuple[str, ...] = ()) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for budget in budgets or ("",):
        for arm, slope in (("linear", 0.0), ("corrected", -0.03), ("linear_layernorm", 0.0)):
            for b in (8, 32, 128, 512):
                for s in range(seeds):
                    acc = 0.9 + slope * math.log2(b) + rng.normal(0, 0.005)
                    row = {
                        "arm": arm,
                        "batch_size": b,
                        "seed": s,
                        "test_accuracy": acc,
                        "status": "completed",
                        "train_loss": 0.3,
                        "lr": 0.1,
                        "updates": 1000,
                    }
                    if budget:
                        row["budget"] = budget
                    rows.append(row)
    df = pd.DataFrame(rows)
    df.loc[(df["arm"] == "corrected") & (df["batch_size"] == 512) & (df["seed"] == 0), "status"] = "diverged"
    return df


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, pd.DataFrame, dict[str, Path]]:
    df = _table()
    result = batchsize_trend(df, **ARGS)
    out = tmp_path_factory.mktemp("report")
    paths = write_batchsize_report(
        result,
        df,
        out,
        protocol={"arms": ["linear", "corrected"], "optimizer": "sgd", "note": "<script>alert(1)</script>"},
        wall_time_s=90.0,
        cpu_hours=0.05,
        gpu_hours=0.0,
    )
    return result, df, paths


def _assert_real_png(data: bytes) -> None:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.shape[0] >= 300 and img.shape[1] >= 500
    assert float(img[..., :3].std()) > 0.02  # not a blank canvas


def test_every_output_is_written_and_trials_keep_every_column(written) -> None:
    _, df, paths = written
    assert set(paths) == {"verdict", "trials", "markdown", "html", "plot_metric", "plot_forest"}
    for p in paths.values():
        assert p.is_file() and p.stat().st_size > 0
    _assert_real_png(paths["plot_metric"].read_bytes())
    _assert_real_png(paths["plot_forest"].read_bytes())
    back = pd.read_csv(paths["trials"])
    assert list(back.columns) == list(df.columns)
    assert len(back) == len(df) and (back["status"] == "diverged").sum() == 1


def test_verdict_json_is_the_analysis_result(written) -> None:
    result, _, paths = written
    assert json.loads(paths["verdict"].read_text()) == json.loads(json.dumps(result))


def test_study_verdict_is_the_first_line(written) -> None:
    result, _, paths = written
    md = paths["markdown"].read_text()
    assert md.splitlines()[0] == f"**Study verdict: {result['study_verdict']}**"
    page = paths["html"].read_text()
    body = page.split("<body>", 1)[1].lstrip()
    assert body.startswith('<p class="study" id="study-verdict">Study verdict: ' + result["study_verdict"])
    assert result["study_verdict"] == "supported"
    assert "Exploratory" not in md and 'id="exploratory"' not in page


def test_the_report_shows_before_it_tells(written) -> None:
    """Verdict, then the plots with captions saying what they show, then the tables, the protocol last."""
    _, _, paths = written
    md = paths["markdown"].read_text()
    at = {name: md.index(f"## {name}") for name in ("Plots", "Method", "Protocol")}
    first_table = md.index("\n| ")
    assert md.index("Study verdict") < at["Plots"] < first_table < at["Method"] < at["Protocol"]
    assert md.rstrip().endswith("```")  # the protocol's YAML block closes the report
    for stem in ("metric_vs_batch_size", "forest"):
        assert f"*{CAPTIONS[stem]}*" in md[at["Plots"] : first_table]
    page = paths["html"].read_text()
    assert page.index('id="plots"') < page.index("<table>") < page.index('id="protocol"')
    captions = [html.unescape(c) for c in re.findall(r"<figcaption>([^<]*)</figcaption>", page)]
    assert captions == [CAPTIONS["metric_vs_batch_size"], CAPTIONS["forest"]]


def test_one_colour_per_label_and_legends_list_only_labels_that_occur() -> None:
    assert len(set(COLORS.values())) == len(COLORS)  # refuted and declines no longer share orange
    handles = legend_handles(["declines", "supported", "declines", "no-such-label"])
    assert [h.get_label() for h in handles] == ["supported", "declines"]
    assert [h.get_color() for h in handles] == [COLORS["supported"], COLORS["declines"]]


def test_images_are_embedded_as_data_uris(written) -> None:
    _, _, paths = written
    page = paths["html"].read_text()
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(srcs) == 2
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        _assert_real_png(base64.b64decode(src.split(",", 1)[1]))


def test_protocol_values_are_escaped(written) -> None:
    _, _, paths = written
    page = paths["html"].read_text()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_tables_carry_verdicts_reasons_and_counts(written) -> None:
    result, _, paths = written
    md = paths["markdown"].read_text()
    rows = {r["arm"]: r for r in verdict_table(result)}
    assert list(rows) == ["linear (control)", "linear_layernorm", "corrected"]
    assert rows["corrected"]["verdict"] == "supported" and rows["corrected"]["failed"] == "1"
    assert rows["linear (control)"]["verdict"] == "stable"
    assert rows["linear (control)"]["interaction CI"] == "–"
    line = next(ln for ln in md.splitlines() if ln.startswith("| corrected | fix | supported |"))
    assert "| 24 | 1 |" in line  # n (failures scored at chance) and n_failed
    assert "## control labels" in md and "| linear_layernorm | stable |" in md
    assert "## sensitivity (failed trials dropped)" in md
    assert "| corrected | supported | supported | 23 |" in md
    assert "optimizer: sgd" in md
    assert "wall time: 1.5 min" in md and "CPU hours: 0.05" in md
    assert "![forest](forest.png)" in md


def test_exploratory_banner_when_underpowered(tmp_path: Path) -> None:
    df = _table(seeds=2)
    result = batchsize_trend(df, **ARGS)
    assert result["exploratory"] is True
    paths = write_batchsize_report(result, df, tmp_path)
    md = paths["markdown"].read_text().splitlines()
    assert md[0].startswith("**Study verdict: inconclusive") and "underpowered" in md[0]
    assert "Exploratory — underpowered" in md[2]
    assert 'id="exploratory">Exploratory — underpowered' in paths["html"].read_text()


def test_budget_sections(tmp_path: Path) -> None:
    df = _table(budgets=("epochs", "updates"))
    result = batchsize_trend(df, **ARGS)
    paths = write_batchsize_report(result, df, tmp_path)
    md = paths["markdown"].read_text()
    assert "## Verdicts across budgets" in md
    assert "## Budget epochs: per-arm results" in md and "## Budget updates: per-arm results" in md
    assert "| corrected | fix | supported | – | supported | supported |" in md
    _assert_real_png(paths["plot_metric"].read_bytes())
    assert pd.read_csv(paths["trials"])["budget"].tolist() == df["budget"].tolist()


def test_bands_are_clipped_to_the_accuracy_range() -> None:
    rng = np.random.default_rng(1)
    rows = [
        {
            "arm": arm,
            "batch_size": b,
            "seed": s,
            "status": "completed",
            "test_accuracy": float(np.clip(0.97 + rng.normal(0, 0.08), 0, 1)),
        }
        for arm in ("linear", "corrected")
        for b in (8, 64)
        for s in range(4)
    ]
    df = pd.DataFrame(rows)
    raw = cell_summary(df, metric="test_accuracy", control="linear")
    assert (raw.loc[raw["kind"] == "metric", "hi"] > 1).any()  # the unclipped t-band leaves [0, 1]
    clipped = cell_summary(df, metric="test_accuracy", control="linear", clip=(0.0, 1.0))
    metric_rows = clipped[clipped["kind"] == "metric"]
    assert (metric_rows["lo"] >= 0).all() and (metric_rows["hi"] <= 1).all()


def test_cell_summary_t_intervals_and_small_cells() -> None:
    df = _table()
    summary = cell_summary(df, metric="test_accuracy", control="linear")
    row = summary[
        (summary["kind"] == "metric") & (summary["arm"] == "corrected") & (summary["batch_size"] == 32)
    ]
    vals = df[(df["arm"] == "corrected") & (df["batch_size"] == 32)]["test_accuracy"].to_numpy()
    lo, hi = stats.t.interval(0.95, vals.size - 1, loc=vals.mean(), scale=stats.sem(vals))
    assert (row["lo"].item(), row["hi"].item()) == (pytest.approx(lo), pytest.approx(hi))
    diff = summary[summary["kind"] == "difference"].set_index(["arm", "batch_size"])["n"]
    assert diff[("corrected", 512)] == 5  # the diverged trial has no paired difference
    small = cell_summary(df[df["seed"] < 2], metric="test_accuracy")
    assert small["lo"].isna().all() and small["hi"].isna().all()  # n < 3: points, no band


def test_supported_is_not_red() -> None:
    def rgb(color: str) -> tuple[int, int, int]:
        return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)

    r, g, b = rgb(VERDICT_COLORS["supported"])
    assert b > r and b > g


def test_render_markdown_states_the_sign_convention_for_a_loss() -> None:
    df = _table().assign(test_accuracy=lambda d: -d["test_accuracy"])
    result = batchsize_trend(df, **(ARGS | {"higher_is_better": False, "chance_metric": -0.1}))
    md = render_markdown(result)
    assert "higher is worse" in md and "positive slope" in md
    assert "higher is worse" in render_html(result)


def test_plot_gate_entropy_reads_per_layer_keys(tmp_path: Path) -> None:
    history = {
        f"trial_{t}": [
            {
                "epoch": e,
                "gate_entropy/0": 0.69 * math.exp(-e / (t + 1)),
                "gate_entropy_layer_1": 0.3,
                "gate_entropy_mean": 0.5,
            }
            for e in range(1, 6)
        ]
        for t in range(4)
    }
    history["trial_0"][2]["gate_entropy/0"] = float("nan")
    history["trial_1"][0]["epoch"] = float("nan")
    path = plot_gate_entropy(history, tmp_path / "gate.png")
    _assert_real_png(path.read_bytes())
    with pytest.raises(ValueError, match="no gate-entropy"):
        plot_gate_entropy({"t": [{"epoch": 1, "val_accuracy": 0.5}]}, tmp_path / "none.png")
