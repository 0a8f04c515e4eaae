"""Tests of ``studies.kinds.search.report``: the files written for the AutoNorm claims study and their content."""

from __future__ import annotations

import base64
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

from studies.kinds.search.claims import ARMS, CONFIRM_COLUMNS, autonorm_claims
from studies.kinds.search.report import write_claims_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLAIM_IDS = ("a", "b", "c", "c_attn", "c_mlp", "d", "e")
PLOTS = {
    "plot_forest": "claims_forest.png",
    "plot_gate_entropy": "gate_entropy.png",
    "plot_dyt_depth": "dyt_weight_vs_depth.png",
}
PROTOCOL = {"kind": "search", "confirm": {"seeds": [1, 2]}, "note": "<script>alert(1)</script>"}
# random_selector clearly below autonorm (claim a refuted), autonorm_s clearly above it (claim b).
OFFSETS = {
    "frozen_ln": 0.0,
    "frozen_dyt": -0.01,
    "random_selector": -0.03,
    "autonorm": 0.0,
    "autonorm_s": 0.03,
}


def _table(n_seeds: int, *, failed: tuple[str, int] | None = None) -> pd.DataFrame:
    """5 arms × n_seeds confirmatory trials, rows shuffled (the report must sort them)."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(100, 100 + n_seeds):
        level = 0.8 + rng.normal(0, 0.02)
        for arm in ARMS:
            acc = level + OFFSETS[arm] + rng.normal(0, 0.004)
            rows.append(
                {
                    "arm": arm,
                    "seed": s,
                    "status": "completed",
                    "test_accuracy": acc,
                    "val_accuracy": acc + 0.01,
                    "train_loss": 0.3,
                    "lr": 1e-3 if arm != "autonorm_s" else 3e-3,
                    "trial_id": f"{arm}_{s}",
                    "mlflow_run_id": f"run-{arm}-{s}",
                    "test_loss": 0.5,
                }
            )
    df = pd.DataFrame(rows)
    if failed is not None:
        arm, seed = failed
        mask = (df["arm"] == arm) & (df["seed"] == seed)
        df.loc[mask, "status"] = "diverged"
        df.loc[mask, "test_accuracy"] = math.nan
    return df.sample(frac=1.0, random_state=1).reset_index(drop=True)


def _gate_logs(
    n_seeds: int, *, blocks: int = 4, epochs: int = 3
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """autonorm and autonorm_s histories: 2·blocks gate layers, entropy falling, DyT weight rising with depth."""
    rng = np.random.default_rng(2)
    logs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for arm in ("autonorm", "autonorm_s"):
        for s in range(100, 100 + n_seeds):
            rows = []
            for epoch in range(1, epochs + 1):
                row: dict[str, Any] = {"epoch": epoch, "test_accuracy": 0.8}
                for layer in range(2 * blocks):
                    block = layer // 2
                    row[f"gate_entropy/layer_{layer}"] = max(0.0, 0.69 / epoch**2 + rng.normal(0, 0.01))
                    row[f"dyt_weight/layer_{layer}"] = float(
                        np.clip(0.2 + 0.1 * block + rng.normal(0, 0.02), 0, 1)
                    )
                rows.append(row)
            logs[(arm, s)] = rows
    return logs


def _write(out: Path, n_seeds: int, *, data_kind: str = "vision", logs: bool = True, **kw: Any) -> tuple:
    table = _table(n_seeds, failed=kw.pop("failed", None))
    gate_logs = _gate_logs(n_seeds) if logs else {}
    claims = autonorm_claims(table, gate_logs, data_kind=data_kind, chance=0.1)  # type: ignore[arg-type]
    paths = write_claims_report(
        claims,
        table,
        gate_logs,
        out,
        title="AutoNorm claims <b>test</b>",
        protocol=PROTOCOL,
        data_kind=data_kind,
        **kw,
    )
    return claims, table, paths


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    return _write(
        tmp_path_factory.mktemp("claims"),
        6,
        failed=("frozen_dyt", 101),
        best_config={"training": {"lr": 1e-3, "weight_decay": math.nan}, "model": {"depth": 4}},
        tuned_lr={
            "autonorm": {"lr": 1e-3, "at_range_edge": False, "scores": {"0.0003": 0.7, "0.001": 0.8}},
            "autonorm_s": {"scores": {}, "reason": "no tuning trial completed"},
        },
        wall_time_s=5400.0,
        cpu_hours=1.25,
        gpu_hours=math.nan,
    )


def _normalized(obj: Any) -> Any:
    """What JSON makes of the claims: string keys, lists for tuples, null for NaN/inf."""
    if isinstance(obj, dict):
        return {str(k): _normalized(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_normalized(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _first_line(md: str) -> str:
    return md.splitlines()[0].strip("* ")


def _verdict_pairs(line: str) -> dict[str, str]:
    return dict(re.findall(r"\b(c_attn|c_mlp|[a-e]) (supported|refuted|inconclusive)\b", line))


# --------------------------------------------------------------------------------------------------


def test_every_file_exists_and_plots_are_real_pngs(written: tuple) -> None:
    _, _, paths = written
    assert set(paths) == {"verdict", "confirm_trials", "markdown", "html", *PLOTS}
    for key, name in PLOTS.items():
        assert paths[key].name == name
    for path in paths.values():
        assert path.is_file() and path.stat().st_size > 0, path
    for key in PLOTS:
        data = paths[key].read_bytes()
        assert data.startswith(PNG_MAGIC), key
        pixels = mpimg.imread(io.BytesIO(data))
        assert pixels.ndim == 3 and float(pixels[..., :3].std()) > 0.01, key  # something is drawn


def test_every_html_image_is_an_embedded_png_data_uri(written: tuple) -> None:
    _, _, paths = written
    html = paths["html"].read_text()
    imgs = re.findall(r"<img\b[^>]*>", html)
    assert len(imgs) == len(PLOTS)
    for tag in imgs:
        m = re.search(r'src="([^"]*)"', tag)
        assert m is not None and m.group(1).startswith("data:image/png;base64,"), tag[:80]
        assert base64.b64decode(m.group(1).split(",", 1)[1]).startswith(PNG_MAGIC)


def test_markdown_links_the_plots_by_relative_name(written: tuple) -> None:
    _, _, paths = written
    md = paths["markdown"].read_text()
    for name in PLOTS.values():
        assert f"]({name})" in md
    assert "data:image" not in md


def test_protocol_and_title_are_escaped_in_html(written: tuple) -> None:
    _, _, paths = written
    html = paths["html"].read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>test</b>" not in html and "&lt;b&gt;test&lt;/b&gt;" in html
    assert "<script>alert(1)</script>" in paths["markdown"].read_text()  # inside the fenced protocol


def test_first_markdown_line_lists_every_claim_with_its_verdict(written: tuple) -> None:
    claims, _, paths = written
    md = paths["markdown"].read_text()
    line = _first_line(md)
    assert line.startswith("Claims: ")
    assert _verdict_pairs(line) == {cid: c["verdict"] for cid, c in claims.items()}
    assert list(_verdict_pairs(line)) == list(CLAIM_IDS)
    # The HTML page opens with the same summary.
    body = paths["html"].read_text().split("<body>", 1)[1]
    first = re.sub(r"<[^>]+>", "", body.strip().splitlines()[0])
    assert first == line


def test_refuted_paper_claim_reads_not_reproduced(written: tuple) -> None:
    claims, _, paths = written
    assert claims["a"]["verdict"] == "refuted"  # random_selector planted below autonorm
    md = paths["markdown"].read_text()
    assert "a refuted (not reproduced)" in _first_line(md)
    row = next(r for r in md.splitlines() if r.startswith("| a |"))
    assert "not reproduced" in row
    assert claims["e"]["verdict"] != "refuted"  # e is no paper claim: never "not reproduced"
    assert "e refuted (not reproduced)" not in md


def test_verdict_json_round_trips_to_the_claims_given(written: tuple) -> None:
    claims, table, paths = written

    def no_nan(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(paths["verdict"].read_text(), parse_constant=no_nan)
    assert doc["claims"] == _normalized(claims)
    assert doc["data_kind"] == "vision"
    assert doc["study_verdict_line"] == _first_line(paths["markdown"].read_text())
    assert doc["arms"] == sorted(ARMS)
    assert doc["seeds"] == sorted(table["seed"].unique().tolist()) == list(range(100, 106))
    assert doc["best_config"] == {"training": {"lr": 1e-3, "weight_decay": None}, "model": {"depth": 4}}
    assert doc["tuned_lr"]["autonorm"]["lr"] == 1e-3
    assert doc["tuned_lr"]["autonorm_s"]["reason"] == "no tuning trial completed"


def test_confirm_trials_csv_has_one_sorted_row_per_trial(written: tuple) -> None:
    _, table, paths = written
    csv = pd.read_csv(paths["confirm_trials"])
    assert list(csv.columns[: len(CONFIRM_COLUMNS)]) == list(CONFIRM_COLUMNS)
    assert "test_loss" in csv.columns  # extra columns are kept
    assert len(csv) == len(table) == 5 * 6
    keys = list(zip(csv["arm"], csv["seed"]))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert set(csv["trial_id"]) == set(table["trial_id"])
    failed = csv[(csv["arm"] == "frozen_dyt") & (csv["seed"] == 101)]
    assert failed["status"].tolist() == ["diverged"] and failed["test_accuracy"].isna().all()


def test_markdown_per_arm_summary_tuned_lr_config_and_resources(written: tuple) -> None:
    _, table, paths = written
    md = paths["markdown"].read_text()
    acc = table.loc[table["arm"] == "autonorm", "test_accuracy"]
    row = next(r for r in md.splitlines() if r.startswith("| autonorm | 6 |"))
    assert f"{acc.mean():.4f} ± {acc.std(ddof=1):.4f}" in row
    dyt = next(r for r in md.splitlines() if r.startswith("| frozen_dyt | 6 |"))
    assert "| 5 | 1 (1 diverged) |" in dyt  # the failure is counted, not dropped
    assert "0.0003: 0.7, 0.001: 0.8" in md and "no tuning trial completed" in md
    assert "## Best searched configuration" in md and "depth: 4" in md
    assert "wall time: 90.0 min" in md and "CPU hours: 1.25" in md and "GPU hours: –" in md


@pytest.mark.parametrize(("n_seeds", "underpowered"), [(3, True), (12, False)])
def test_banner_appears_iff_some_claim_is_underpowered(
    tmp_path: Path, n_seeds: int, underpowered: bool
) -> None:
    claims, _, paths = _write(tmp_path, n_seeds)
    has_reason = any("underpowered" in c["reasons"] for c in claims.values())
    assert has_reason is underpowered  # the synthetic design does what the case says
    md = paths["markdown"].read_text()
    html = paths["html"].read_text()
    assert ("Exploratory — underpowered" in md) is underpowered
    assert ('id="exploratory"' in html) is underpowered
    if underpowered:
        assert md.splitlines()[2].startswith("> **Exploratory — underpowered")  # right after the summary


def test_without_gate_logs_no_gate_plots_and_stale_ones_are_removed(tmp_path: Path) -> None:
    _write(tmp_path, 6)  # an earlier run that drew every plot
    assert (tmp_path / "gate_entropy.png").is_file()
    claims, _, paths = _write(tmp_path, 6, logs=False)
    assert "plot_gate_entropy" not in paths and "plot_dyt_depth" not in paths
    assert (
        not (tmp_path / "gate_entropy.png").exists() and not (tmp_path / "dyt_weight_vs_depth.png").exists()
    )
    assert paths["plot_forest"].read_bytes().startswith(PNG_MAGIC)
    md = paths["markdown"].read_text()
    html = paths["html"].read_text()
    assert "gate_entropy.png" not in md and "dyt_weight_vs_depth.png" not in md
    assert len(re.findall(r"<img\b", html)) == 1
    assert claims["d"]["verdict"] == "inconclusive"
    assert _verdict_pairs(_first_line(md))["d"] == "inconclusive"


def test_empty_confirm_table_and_no_logs_write_a_report_without_plots(tmp_path: Path) -> None:
    table = pd.DataFrame(columns=list(CONFIRM_COLUMNS))
    claims = autonorm_claims(table, {}, data_kind="text")
    paths = write_claims_report(claims, table, {}, tmp_path, title="t", protocol=None, data_kind="text")
    assert set(paths) == {"verdict", "confirm_trials", "markdown", "html"}
    doc = json.loads(paths["verdict"].read_text())
    assert doc["arms"] == [] and doc["seeds"] == [] and doc["best_config"] is None
    assert list(pd.read_csv(paths["confirm_trials"]).columns) == list(CONFIRM_COLUMNS)
    assert "<img" not in paths["html"].read_text()
    assert set(_verdict_pairs(_first_line(paths["markdown"].read_text()))) == set(CLAIM_IDS)


def test_text_study_reports_the_depth_claims(tmp_path: Path) -> None:
    claims, _, paths = _write(tmp_path, 6, data_kind="text")
    assert claims["c_attn"]["estimate"] is not None and claims["c_attn"]["estimate"] > 0  # planted slope 0.1
    assert {"plot_gate_entropy", "plot_dyt_depth"} <= set(paths)
    md = paths["markdown"].read_text()
    assert _verdict_pairs(_first_line(md)) == {cid: c["verdict"] for cid, c in claims.items()}
    row = next(r for r in md.splitlines() if r.startswith("| c_attn |"))
    assert f"{claims['c_attn']['estimate']:.3g}" in row
    assert "not applicable to text" in next(r for r in md.splitlines() if r.startswith("| a |"))
