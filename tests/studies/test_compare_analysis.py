"""The compare kind's statistics on synthetic tables with known truth (no Ray), and its spec rules."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.kinds import kind_for
from studies.kinds.compare.analysis import compare_arms, hypothesis_verdict
from studies.kinds.compare.decidability import undecidable
from studies.kinds.compare.spec import CompareStudySpec
from studies.kinds.compare.workflow import analyse
from studies.reporting import json_safe
from studies.schema import SpecError
from studies.stats import holm, paired_contrast

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = ROOT / "studies" / "specs" / "affine_divergence_table.yaml"
SEEDS = list(range(8))
TWO = {
    "corrected_vs_batchnorm": {"arm": "corrected", "reference": "linear_batchnorm", "predicted": "better"},
    "batchnorm_vs_plain": {"arm": "linear_batchnorm", "reference": "linear", "predicted": "better"},
}


def _table(
    means: dict[str, float],
    *,
    seeds: list[int] = SEEDS,
    noise: float = 0.002,
    seed: int = 0,
    per_seed: dict[str, list[float]] | None = None,
) -> pd.DataFrame:
    """One completed trial per arm x seed: a shared seed effect + the arm's mean + noise."""
    rng = np.random.default_rng(seed)
    seed_effect = rng.normal(0.0, 0.02, len(seeds))  # common to every arm: pairing removes it
    rows = []
    for arm, mean in means.items():
        values = (per_seed or {}).get(arm)
        for j, s in enumerate(seeds):
            v = values[j] if values is not None else mean + seed_effect[j] + rng.normal(0.0, noise)
            rows.append(
                {
                    "arm": arm,
                    "seed": s,
                    "status": "completed",
                    "test_accuracy": float(v),
                    "train_loss": 0.3,
                    "lr": 0.1,
                    "lr_at_edge": False,
                }
            )
    return pd.DataFrame(rows)


def _run(table: pd.DataFrame, contrasts: dict[str, Any] = TWO, **kw: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {"failed_value": 0.1, "chance_loss": math.log(10), "min_seeds": 5}
    opts.update(kw)
    return compare_arms(table, contrasts=contrasts, **opts)


# ---- verdict rules -------------------------------------------------------------------------------------


def test_planted_improvements_are_better_and_the_study_supported() -> None:
    res = _run(_table({"corrected": 0.90, "linear_batchnorm": 0.85, "linear": 0.80}))
    for name in TWO:
        c = res["contrasts"][name]
        assert c["verdict"] == "better" and c["hypothesis"] == "supported" and c["reasons"] == []
        assert c["estimate"] == pytest.approx(0.05, abs=0.005)
        assert c["ci"][0] > 0 and c["p_value_holm"] <= 0.05
        assert c["n_seeds"] == 8
    assert res["study_verdict"] == "supported"


def test_an_opposite_outcome_refutes_the_study_even_when_another_contrast_is_supported() -> None:
    res = _run(_table({"corrected": 0.80, "linear_batchnorm": 0.85, "linear": 0.80}))
    assert res["contrasts"]["corrected_vs_batchnorm"]["verdict"] == "worse"
    assert res["contrasts"]["corrected_vs_batchnorm"]["hypothesis"] == "refuted"
    assert res["contrasts"]["batchnorm_vs_plain"]["hypothesis"] == "supported"
    assert res["study_verdict"] == "refuted"


def test_predicted_worse_is_supported_by_a_worse_outcome() -> None:
    contrasts = {"plain_vs_bn": {"arm": "linear", "reference": "linear_batchnorm", "predicted": "worse"}}
    res = _run(_table({"linear_batchnorm": 0.85, "linear": 0.80}), contrasts)
    assert res["contrasts"]["plain_vs_bn"]["verdict"] == "worse"
    assert res["study_verdict"] == "supported"


def test_lower_is_better_flips_the_direction() -> None:
    table = _table({"corrected": 0.20, "linear_batchnorm": 0.25, "linear": 0.30})  # e.g. an error rate
    res = _run(table, higher_is_better=False)
    assert all(c["verdict"] == "better" for c in res["contrasts"].values())
    assert res["contrasts"]["corrected_vs_batchnorm"]["estimate"] < 0  # arm − reference, raw units


def test_interval_inside_the_margin_is_equivalent_even_when_significant() -> None:
    # Every seed's difference is +0.002: the sign-flip p is the smallest there is, yet the difference
    # is far inside a margin of 0.01, so it does not matter.
    base = [0.80 + 0.01 * j for j in range(8)]
    per_seed = {
        "corrected": [b + 0.002 + 0.0001 * (j % 3) for j, b in enumerate(base)],
        "linear_batchnorm": base,
        "linear": [b - 0.05 for b in base],
    }
    table = _table({a: 0.0 for a in per_seed}, per_seed=per_seed)
    res = _run(table, margin=0.01)
    c = res["contrasts"]["corrected_vs_batchnorm"]
    assert c["p_value_holm"] <= 0.05 and c["ci"][0] > -0.01 and c["ci"][1] < 0.01
    assert c["verdict"] == "equivalent" and c["hypothesis"] == "inconclusive"
    # Every contrast is decided (the other one supported) and a predicted difference is absent: the
    # study is decided too, as `equivalent` (not reproduced, not refuted), not left `inconclusive`.
    assert res["contrasts"]["batchnorm_vs_plain"]["hypothesis"] == "supported"
    assert res["study_verdict"] == "equivalent"
    # Without a margin the same data is a (small) improvement.
    assert _run(table, margin=0.0)["contrasts"]["corrected_vs_batchnorm"]["verdict"] == "better"


def test_an_equivalent_contrast_beside_an_undecided_one_leaves_the_study_inconclusive() -> None:
    base = [0.80 + 0.01 * j for j in range(8)]
    d = [0.03, -0.02, 0.01, -0.03, 0.02, -0.01, 0.04, -0.02]  # BN vs plain: wide, not significant
    per_seed = {
        "corrected": [b + 0.002 + 0.0001 * (j % 3) for j, b in enumerate(base)],  # equivalent to BN
        "linear_batchnorm": base,
        "linear": [b - x for b, x in zip(base, d, strict=True)],
    }
    res = _run(_table({a: 0.0 for a in per_seed}, per_seed=per_seed), margin=0.01)
    assert res["contrasts"]["corrected_vs_batchnorm"]["verdict"] == "equivalent"
    assert res["contrasts"]["batchnorm_vs_plain"]["verdict"] == "inconclusive"
    assert res["study_verdict"] == "inconclusive"


def test_a_wide_interval_that_is_not_significant_is_inconclusive_with_a_reason() -> None:
    base = [0.80 + 0.01 * j for j in range(8)]
    d = [0.03, -0.02, 0.01, -0.03, 0.02, -0.01, 0.04, -0.02]  # mean 0.0025, spread far beyond the margin
    per_seed = {
        "corrected": [b + x for b, x in zip(base, d)],
        "linear_batchnorm": base,
        "linear": [b - 0.05 for b in base],
    }
    res = _run(_table({a: 0.0 for a in per_seed}, per_seed=per_seed))
    c = res["contrasts"]["corrected_vs_batchnorm"]
    assert c["differences"] == pytest.approx(d)
    assert c["verdict"] == "inconclusive"
    assert c["ci"][0] < -0.01 or c["ci"][1] > 0.01
    assert c["reasons"] and c["reasons"][0].startswith("undecided")


def test_hypothesis_verdict_table() -> None:
    assert hypothesis_verdict("better", "better") == "supported"
    assert hypothesis_verdict("worse", "better") == "refuted"
    assert hypothesis_verdict("better", "worse") == "refuted"
    assert hypothesis_verdict("equivalent", "better") == "inconclusive"
    assert hypothesis_verdict("inconclusive", "worse") == "inconclusive"


# ---- the Holm family ------------------------------------------------------------------------------------


def test_holm_runs_over_the_contrasts_only_and_table_only_arms_change_nothing() -> None:
    table = _table({"corrected": 0.86, "linear_batchnorm": 0.85, "linear": 0.80}, noise=0.01)
    extra = _table({"prenorm_l2": 0.5}, seed=7)
    without = _run(table)
    with_arm = _run(pd.concat([table, extra], ignore_index=True))
    assert with_arm["contrasts"] == without["contrasts"]
    assert with_arm["family_size"] == without["family_size"] == 2
    assert with_arm["arms"]["prenorm_l2"]["role"] == "table only"
    assert with_arm["arms"]["corrected"]["role"] == "contrast"
    raw = {n: c["p_value"] for n, c in without["contrasts"].items()}
    assert {n: c["p_value_holm"] for n, c in without["contrasts"].items()} == holm(raw)
    # And the raw p is the shared exact two-sided sign-flip p of the paired differences.
    t = table.sort_values(["arm", "seed"])
    a = t[t.arm == "corrected"]["test_accuracy"].to_numpy()
    b = t[t.arm == "linear_batchnorm"]["test_accuracy"].to_numpy()
    ref = paired_contrast(a, b, alternative="two-sided")
    assert raw["corrected_vs_batchnorm"] == pytest.approx(ref["p_value"])
    assert without["contrasts"]["corrected_vs_batchnorm"]["ci"] == pytest.approx(ref["ci"])


def test_a_larger_family_raises_the_holm_p() -> None:
    table = _table({"corrected": 0.86, "linear_batchnorm": 0.85, "linear": 0.80}, noise=0.004)
    one = _run(table, {"c": TWO["corrected_vs_batchnorm"]})["contrasts"]["c"]
    two = _run(table)["contrasts"]["corrected_vs_batchnorm"]
    assert one["p_value"] == two["p_value"]
    assert two["p_value_holm"] >= one["p_value_holm"] == one["p_value"]


# ---- gates ------------------------------------------------------------------------------------------------


def _strong() -> pd.DataFrame:
    return _table({"corrected": 0.90, "linear_batchnorm": 0.85, "linear": 0.80})


def test_lr_at_range_edge_of_either_arm_makes_the_contrast_inconclusive() -> None:
    table = _strong()
    table.loc[table.arm == "linear_batchnorm", "lr_at_edge"] = True
    res = _run(table)
    for name in TWO:  # linear_batchnorm is in both contrasts
        c = res["contrasts"][name]
        assert c["verdict"] == "inconclusive" and "lr-at-range-edge" in c["reasons"]
        assert c["gate_arms"]["lr-at-range-edge"] == ["linear_batchnorm"]
    assert res["study_verdict"] == "inconclusive"


def test_failures_are_scored_at_chance_and_gate_above_20_percent() -> None:
    table = _strong()
    rows = table.index[(table.arm == "corrected")]
    table.loc[rows[:2], "status"] = "diverged"  # 2 of 8 = 25 % > 20 %
    res = _run(table)
    c = res["contrasts"]["corrected_vs_batchnorm"]
    assert c["verdict"] == "inconclusive" and c["reasons"] == ["failures"]
    assert res["arms"]["corrected"]["n_failed"] == 2
    bn = table[(table.arm == "linear_batchnorm")].sort_values("seed")["test_accuracy"].to_numpy()
    assert c["differences"][:2] == pytest.approx(list(0.1 - bn[:2]))  # chance (0.1) minus the reference
    assert res["contrasts"]["batchnorm_vs_plain"]["verdict"] == "better"  # not contaminated
    # One failure in 8 (12.5 %) is scored, not gated.
    table.loc[rows[1], "status"] = "completed"
    assert "failures" not in _run(table)["contrasts"]["corrected_vs_batchnorm"]["reasons"]


def test_failed_seeds_leave_the_pair_without_a_chance_level() -> None:
    table = _strong()
    table.loc[table.index[table.arm == "corrected"][:1], "status"] = "error"
    c = _run(table, failed_value=None)["contrasts"]["corrected_vs_batchnorm"]
    assert c["n_seeds"] == 7 and "0" not in c["seeds"]


def test_train_loss_near_chance_is_optimisation_limited() -> None:
    table = _strong()
    table.loc[table.arm == "linear", "train_loss"] = 0.95 * math.log(10)
    res = _run(table)
    assert res["contrasts"]["batchnorm_vs_plain"]["reasons"] == ["optimisation-limited"]
    assert res["contrasts"]["corrected_vs_batchnorm"]["verdict"] == "better"


def test_too_few_seeds_for_the_family_is_underpowered_whatever_the_data() -> None:
    four = {
        **TWO,
        "corrected_vs_layernorm": {"arm": "corrected", "reference": "linear_layernorm"},
        "layernorm_vs_plain": {"arm": "linear_layernorm", "reference": "linear"},
    }
    means = {"corrected": 0.95, "linear_batchnorm": 0.85, "linear_layernorm": 0.85, "linear": 0.75}
    seven = _run(_table(means, seeds=SEEDS[:7]), four)  # 2/2^7 x 4 = 0.0625 >= 0.05
    assert all(c["reasons"] == ["underpowered"] for c in seven["contrasts"].values())
    assert seven["exploratory"] is True and seven["study_verdict"] == "inconclusive"
    eight = _run(_table(means), four)  # 2/2^8 x 4 = 0.031 < 0.05
    assert all(c["verdict"] == "better" for c in eight["contrasts"].values())
    assert eight["exploratory"] is False
    few = _run(_table(means, seeds=SEEDS[:4]), {"c": TWO["corrected_vs_batchnorm"]})  # < min_seeds
    assert few["contrasts"]["c"]["reasons"] == ["underpowered"]


# ---- order and inputs ------------------------------------------------------------------------------------


def test_result_does_not_depend_on_row_order() -> None:
    table = _table(
        {"corrected": 0.86, "linear_batchnorm": 0.85, "linear": 0.80, "prenorm_l2": 0.7}, noise=0.01
    )
    table.loc[table.index[3], "status"] = "diverged"
    first = json.dumps(json_safe(_run(table)), sort_keys=True)
    for k in range(3):
        shuffled = table.sample(frac=1.0, random_state=k).reset_index(drop=True)
        assert json.dumps(json_safe(_run(shuffled)), sort_keys=True) == first


def test_missing_metric_column_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="test_accuracy"):
        _run(_strong().drop(columns=["test_accuracy"]))


# ---- the kind's analyse: shared fields ---------------------------------------------------------------------


def _spec(*overrides: str, preset: str | None = None) -> CompareStudySpec:
    from studies.kinds import load_study

    spec = load_study(SPEC_FILE, list(overrides), preset=preset)
    assert isinstance(spec, CompareStudySpec)
    return spec


def test_analyse_adds_the_shared_fields_one_hypothesis_per_contrast() -> None:
    spec = _spec()  # 5 arms, the paper's 4 contrasts, prenorm_l2 table only
    means = {
        "corrected": 0.9,
        "linear_batchnorm": 0.85,
        "linear_layernorm": 0.85,
        "linear": 0.8,
        "prenorm_l2": 0.8,
    }
    v = analyse(_table(means), spec)
    assert v["kind"] == "compare" and v["study_verdict"] == "supported"
    assert set(v["hypotheses"]) == set(v["contrasts"]) == set(spec.contrast_specs)
    assert "prenorm_l2" not in v["hypotheses"] and v["table_only_arms"] == ["prenorm_l2"]
    for name, h in v["hypotheses"].items():
        c = v["contrasts"][name]
        assert h["verdict"] == c["hypothesis"] and h["estimate"] == c["estimate"] and h["ci"] == c["ci"]
        assert h["p_value_holm"] == c["p_value_holm"] and h["reasons"] == c["reasons"]
        assert set(c) >= {
            "arm",
            "reference",
            "estimate",
            "ci",
            "p_value",
            "p_value_holm",
            "verdict",
            "reasons",
        }


# ---- spec and decidability ---------------------------------------------------------------------------------


def test_minimal_spec_validates_with_the_papers_table(tmp_path: Path) -> None:
    from studies.kinds import load_study

    path = tmp_path / "s.yaml"
    path.write_text("kind: compare\nname: t\n")
    spec = load_study(path)
    assert spec.arm_names == ("corrected", "linear_batchnorm", "linear_layernorm", "linear", "prenorm_l2")
    assert set(spec.contrast_specs) == {
        "corrected_vs_batchnorm",
        "corrected_vs_layernorm",
        "batchnorm_vs_plain",
        "layernorm_vs_plain",
    }
    cnn = load_study(path, ["model={type: cnn, preset: tiny}"])
    assert cnn.arm_names == ("patchnorm", "conv_batchnorm", "conv_layernorm", "conv")
    assert cnn.contrast_specs["patchnorm_vs_batchnorm"].reference == "conv_batchnorm"
    # The resolved document loads again to the same spec.
    again = CompareStudySpec.model_validate(spec.to_document())
    assert again.to_document() == spec.to_document()


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("contrasts={x: {arm: patchnorm, reference: linear}}", "contrasts.x.arm"),
        ("contrasts={x: {arm: corrected, reference: conv}}", "contrasts.x.reference"),
        ("contrasts={x: {arm: corrected, reference: corrected}}", "contrasts.x"),
        ("contrasts={x: {arm: corrected, reference: linear, predicted: sideways}}", "contrasts.x.predicted"),
        ("arms=[corrected, conv]", "arms.1"),
        ("training.lr=0.1", "training.lr"),
        ("training.budget=updates", "training.budget"),
        ("lr_tuning.seeds=[0, 1]", "lr_tuning.seeds"),
        ("analysis.margin=-0.1", "analysis.margin"),
        ("model.layer={type: corrected}", "model.layer"),
    ],
)
def test_invalid_specs_name_the_field(override: str, path: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(override, preset="smoke")
    assert path in {i.path for i in err.value.issues}, err.value.format()


def test_arms_in_no_default_contrast_leave_no_contrast_and_are_refused() -> None:
    with pytest.raises(SpecError) as err:
        _spec("arms=[corrected, prenorm_l2]", preset="smoke")
    assert "contrasts" in {i.path for i in err.value.issues}


def test_undecidable_designs_are_the_ones_the_analysis_calls_underpowered() -> None:
    smoke = _spec(preset="smoke")
    assert {u.hypothesis for u in undecidable(smoke)} == set(smoke.contrast_specs)
    assert all(u.seeds_needed == 7 for u in undecidable(smoke))  # 2 contrasts: 2/2^7 x 2 < 0.05 <= 2/2^6 x 2
    means = {"corrected": 0.95, "linear_batchnorm": 0.85, "linear": 0.75}
    six = _run(_table(means, seeds=SEEDS[:6]))
    seven = _run(_table(means, seeds=SEEDS[:7]))
    assert all(c["reasons"] == ["underpowered"] for c in six["contrasts"].values())
    assert all(c["verdict"] == "better" for c in seven["contrasts"].values())
    for preset in ("local", "local_cnn", None):
        assert undecidable(_spec(preset=preset)) == []
    from studies.decidability import check_decidable

    seven_seeds = _spec("seeds=[0, 1, 2, 3, 4, 5, 6]")  # the paper's 4 contrasts need 8
    assert {u.hypothesis for u in undecidable(seven_seeds)} == set(seven_seeds.contrast_specs)
    with pytest.raises(SpecError) as err:  # validate/plan/run refuse it unless exploratory
        check_decidable(seven_seeds, kind_for(seven_seeds))
    assert {i.path for i in err.value.issues} == {"seeds"} and "at least 8 seeds" in err.value.format()


def test_pilot_plans_seeds_per_contrast_never_below_the_sign_flip_floor(tmp_path: Path) -> None:
    from studies.kinds import KINDS

    spec = _spec(preset="local")  # 4 contrasts: 2/2^K x 4 < 0.05 needs K >= 8
    means = {
        "corrected": 0.9,
        "linear_batchnorm": 0.85,
        "linear_layernorm": 0.86,
        "linear": 0.8,
        "prenorm_l2": 0.8,
    }
    _table(means, seeds=SEEDS[:3], noise=0.01).to_csv(tmp_path / "trials.csv", index=False)
    out = KINDS["compare"].power(spec, tmp_path, power=0.8, min_effect=None, alpha=0.05)
    assert set(out["seeds_needed"]) == set(spec.contrast_specs) and out["family_size"] == 4
    assert out["min_seeds"] == 8
    assert all(len(v) == 3 for v in out["per_seed"].values())
    diff = out["per_seed"]["corrected_vs_batchnorm"]
    assert np.mean(diff) == pytest.approx(0.05, abs=0.02)
    with pytest.raises(ValueError, match=r"trials\.csv"):
        KINDS["compare"].power(spec, tmp_path / "missing", power=0.8, min_effect=None, alpha=0.05)


def test_report_shows_every_contrast_every_arm_and_the_tuned_rates(tmp_path: Path) -> None:
    from studies.kinds.compare.report import write_compare_report

    spec = _spec()
    means = {
        "corrected": 0.8,
        "linear_batchnorm": 0.85,
        "linear_layernorm": 0.85,
        "linear": 0.8,
        "prenorm_l2": 0.7,
    }
    table = _table(means)
    lr_record = {
        arm: {"lr": 0.1 * (i + 1), "at_range_edge": arm == "linear", "grid": [0.01, 1.0]}
        for i, arm in enumerate(means)
    }
    verdict = analyse(table, spec, lr_tuning=lr_record)
    files = write_compare_report(verdict, table, tmp_path, protocol=spec.to_document(), lr_record=lr_record)
    md = files["markdown"].read_text()
    assert (
        md.splitlines()[0] == f"**Study verdict: {verdict['study_verdict']}**" == "**Study verdict: refuted**"
    )
    contrasts = md.split("## Contrasts")[1].split("## Arms")[0]
    arms = md.split("## Arms")[1].split("## Tuned learning rates")[0]
    rates = md.split("## Tuned learning rates")[1].split("## Method")[0]
    for name, c in verdict["contrasts"].items():
        row = next(line for line in contrasts.splitlines() if line.startswith(f"| {name} |"))
        assert f"| {c['verdict']} |" in row and f"| {c['hypothesis']} |" in row
    assert "prenorm_l2" not in contrasts and "| prenorm_l2 | table only |" in arms
    assert all(f"| {arm} |" in rates for arm in means)
    assert "| linear | 0.4 |" in rates and "| yes |" in rates  # linear's rate, on the edge
    assert json.loads(files["verdict"].read_text())["contrasts"].keys() == verdict["contrasts"].keys()
    assert files["plot_forest"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'src="data:image/png;base64,' in files["html"].read_text()
    assert len(pd.read_csv(files["trials"])) == len(table)


def test_the_analysis_section_passes_each_of_its_settings_to_compare_arms() -> None:
    # analyse() forwards spec.analysis as compare_arms' keyword arguments: a field added to the
    # section without a parameter of that name would fail every run; a changed setting must reach it.
    import inspect

    from studies.kinds.compare.spec import CompareAnalysisSpec

    params = inspect.signature(compare_arms).parameters
    assert set(CompareAnalysisSpec.model_fields) <= {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    rng = np.random.default_rng(0)
    rows = [
        {
            "arm": arm,
            "seed": s,
            "status": "completed",
            "test_accuracy": 0.8 + shift + 0.05 * rng.standard_normal(),
        }
        for arm, shift in (("corrected", 0.03), ("linear_batchnorm", 0.0), ("linear", 0.0))
        for s in SEEDS
    ]
    doc = {"contrasts": TWO, "arms": ["corrected", "linear_batchnorm", "linear"]}
    default = analyse(pd.DataFrame(rows), CompareStudySpec.model_validate(doc))
    wide = analyse(pd.DataFrame(rows), CompareStudySpec.model_validate({**doc, "analysis": {"margin": 0.5}}))
    # A margin of 0.5 accuracy puts the noisy no-difference interval inside ±margin; 0.01 does not.
    assert (default["margin"], wide["margin"]) == (0.01, 0.5)
    assert default["contrasts"]["batchnorm_vs_plain"]["verdict"] != "equivalent"
    assert wide["contrasts"]["batchnorm_vs_plain"]["verdict"] == "equivalent"
