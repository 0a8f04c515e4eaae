"""Designs that can test their claim (issue #47 item 3): claim b's AutoNorm-S freezes at
``confirm.freeze`` (default ⌈epochs/3⌉, rule ``always``), a design leaving less than half of training
frozen is refused unless exploratory, the searched configuration is its own reported arm, tuning keeps
each rate's standard error and flags a pick within one SE of its runner-up (``lr-tuning-noisy``,
informational); a study stored before these fields reads, resumes and reproduces as it ran."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from studies import cli
from studies.decidability import check_decidable, undecidable
from studies.kinds import kind_for, load_study
from studies.kinds.search.design import design_fields, design_lines, gate_lr_noisy
from studies.kinds.search.plans import arm_config, phases
from studies.kinds.search.spec import ConfirmFreezeSpec, StudySpec
from studies.kinds.search.workflow import analyse
from studies.schema import SpecError, stored_defaults_missing
from studies.tuning import NOISY, LRGrid, noisy_reasons, select_lr, tune, tuning_noise

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"
STORED = [ROOT / "results" / name for name in ("autonorm_claims_vision", "autonorm_claims_text")]

BEST: dict[str, Any] = {
    "model": {"type": "vit_lite", "norm": {"type": "autonorm", "candidates": ["dyt", "layernorm"]}},
    "data": {"type": "digits"},
    "training": {
        "lr": 0.002,
        "epochs": 9,
        "freeze": {"t_freeze": 8, "eps_h": 0.3, "rule": "freeze_if_low", "sample_after_freeze": True},
    },
    "seed": 0,
}


# ---- the freeze of claim b ---------------------------------------------------------------------------


@pytest.mark.parametrize(("epochs", "t"), [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (20, 7)])
def test_the_default_freeze_is_at_a_third_of_the_epochs_rounded_up(epochs: int, t: int) -> None:
    freeze = ConfirmFreezeSpec()
    assert freeze.rule == "always" and freeze.epoch(epochs) == t
    assert freeze.frozen_share(epochs) == pytest.approx((epochs - t) / epochs)
    assert ConfirmFreezeSpec(t_freeze=4).epoch(epochs) == 4  # a set epoch is kept


def test_claim_bs_autonorm_s_freezes_at_confirm_freeze_and_the_searched_arm_is_as_found() -> None:
    freeze = ConfirmFreezeSpec()
    b = arm_config(BEST, "autonorm_s", freeze)
    assert b["training"]["freeze"] == {
        "t_freeze": 3,
        "eps_h": 0.1,
        "rule": "always",
        "sample_after_freeze": True,
    }
    assert b["model"] == BEST["model"] and b["training"]["lr"] == 0.002
    assert arm_config(BEST, "autonorm_s_searched", freeze) == BEST  # the searched configuration as found
    assert arm_config(BEST, "autonorm_s") == BEST  # no confirm.freeze: the stored design's autonorm_s
    assert BEST["training"]["freeze"]["t_freeze"] == 8  # not modified
    high = arm_config(BEST, "autonorm_s", ConfirmFreezeSpec(t_freeze=2, rule="freeze_if_high", eps_h=0.2))
    assert (
        high["training"]["freeze"]["t_freeze"] == 2 and high["training"]["freeze"]["rule"] == "freeze_if_high"
    )


def test_the_vision_presets_phases_run_both_autonorm_s_arms() -> None:
    spec = load_study(SEARCH, preset="vision")  # 5 epochs: claim b freezes after epoch 2
    assert spec.confirm is not None and spec.confirm.freeze is not None
    first = {p.name: p.plan.base_config["training"]["freeze"] for p in phases(spec) if "look" not in p.name}
    assert first["confirm-autonorm_s"]["t_freeze"] == 2 and first["confirm-autonorm_s"]["rule"] == "always"
    assert first["confirm-autonorm_s_searched"] == spec.training.freeze.model_dump()  # the base config's
    assert first["confirm-autonorm"] is None


def test_a_searched_arm_needs_a_freeze_and_the_freeze_must_happen() -> None:
    with pytest.raises(SpecError) as err:
        load_study(SEARCH, ["confirm.freeze=null"])  # the file lists autonorm_s_searched
    assert "autonorm_s_searched needs confirm.freeze" in err.value.format()
    with pytest.raises(SpecError) as err:
        load_study(SEARCH, ["confirm.freeze.t_freeze=21"])  # 20 epochs
    assert [i.path for i in err.value.issues] == ["confirm.freeze.t_freeze"]


def _refused(spec: Any) -> dict[str, str]:
    return {u.hypothesis: u.path for u in undecidable(spec, kind_for(spec))}


def test_validate_refuses_a_freeze_leaving_less_than_half_of_training_frozen(
    capsys: pytest.CaptureFixture[str],
) -> None:
    vision = [str(SEARCH), "--preset", "vision"]
    assert cli.main(["validate", *vision, "--set", "confirm.freeze.t_freeze=4"]) == 2  # 1 of 5 epochs frozen
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "'claim b'" in ln)
    assert "confirm.freeze.t_freeze" in line and "20%" in line and "freeze by epoch 2" in line
    assert cli.main(["validate", *vision, "--set", "confirm.freeze.t_freeze=2"]) == 0
    assert cli.main(["plan", *vision, "--set", "confirm.freeze.t_freeze=3", "--no-calibrate"]) == 2
    assert cli.main(["validate", *vision, "--set", "confirm.freeze.t_freeze=4", "--allow-exploratory"]) == 0


@pytest.mark.parametrize(
    ("epochs", "t_freeze", "refused"), [(4, 2, False), (4, 3, True), (20, 10, False), (20, 11, True)]
)
def test_half_of_training_frozen_is_the_boundary(epochs: int, t_freeze: int, refused: bool) -> None:
    for rule in ("always", "freeze_if_high"):
        spec = load_study(
            SEARCH,
            [
                f"training.epochs={epochs}",
                "training.freeze.t_freeze=1",  # the search's base point
                f"search.space.0.high={epochs}",
                f"confirm.freeze={{t_freeze: {t_freeze}, rule: {rule}}}",
            ],
        )
        assert ("claim b" in _refused(spec)) is refused
        if refused:
            with pytest.raises(SpecError):
                check_decidable(spec, kind_for(spec))
            assert check_decidable(spec, kind_for(spec), allow_exploratory=True).exploratory is True


def test_a_noise_flagging_tuning_on_one_seed_is_refused_unless_exploratory() -> None:
    one = load_study(SEARCH, ["confirm.lr_tuning.seeds=[200]"])
    assert _refused(one) == {"every claim (lr tuning)": "confirm.lr_tuning.seeds"}
    assert (
        _refused(load_study(SEARCH, ["confirm.lr_tuning.seeds=[200]", "confirm.lr_tuning.flag_noisy=false"]))
        == {}
    )
    assert _refused(load_study(SEARCH)) == {}


# ---- stored studies read as they ran ------------------------------------------------------------------


@pytest.mark.parametrize("directory", STORED, ids=lambda p: p.name)
def test_a_stored_claims_study_reads_and_reanalyses_as_it_ran(directory: Path) -> None:
    from studies.offline import reanalyse_tables

    spec = load_study(directory / "study_spec.yaml", stored=True)
    assert spec.confirm is not None and spec.confirm.freeze is None
    assert spec.confirm.lr_tuning is not None and spec.confirm.lr_tuning.flag_noisy is False
    assert "autonorm_s_searched" not in spec.confirm.arms
    assert undecidable(spec, kind_for(spec)) == []  # resumes and extends: not refused by the new rules
    logged = json.loads((directory / "verdict.json").read_text())
    recomputed = reanalyse_tables(spec, kind_for(spec), directory, logged)
    assert "freeze" not in recomputed and "reported_arms" not in recomputed
    assert NOISY not in json.dumps(recomputed)
    # today's spec file, read fresh, has the new design
    fresh = load_study(SEARCH, preset=directory.name.removeprefix("autonorm_claims_"))
    assert fresh.confirm is not None and fresh.confirm.freeze == ConfirmFreezeSpec()


def test_stored_defaults_fill_only_what_a_stored_spec_lacks() -> None:
    doc = load_study(SEARCH).to_document()
    assert stored_defaults_missing(doc, StudySpec) == {}
    del doc["confirm"]["freeze"], doc["confirm"]["lr_tuning"]["flag_noisy"]
    assert stored_defaults_missing(doc, StudySpec) == {
        "confirm.freeze": None,
        "confirm.lr_tuning.flag_noisy": False,
    }


# ---- tuning noise ------------------------------------------------------------------------------------


class _T:
    def __init__(self, lr: float, value: float, seed: int, status: str = "completed") -> None:
        self.status, self.config = status, {"training": {"lr": lr}, "seed": seed}
        self.metrics = {"val_accuracy": value}


def test_tuning_noise_is_the_lead_against_the_larger_standard_error() -> None:
    # 0.1: mean 0.85, sd 0.0707 -> SE 0.05; 1.0: mean 0.84, SE 0.02; 0.01: mean 0.5
    scores = {0.01: [0.5, 0.5], 0.1: [0.9, 0.8], 1.0: [0.86, 0.82]}
    rec = tuning_noise(scores, 0.1, "max")
    assert rec["runner_up"] == 1.0 and rec["lead"] == pytest.approx(0.01)
    assert rec["lead_se"] == pytest.approx(0.05) and rec["noisy"] is True
    assert rec["score_se"]["0.01"] == 0.0 and rec["score_se"]["1"] == pytest.approx(0.02)
    clear = tuning_noise({0.1: [0.9, 0.88], 1.0: [0.8, 0.82]}, 0.1, "max")  # lead 0.08, SE 0.01
    assert clear["noisy"] is False and clear["lead"] == pytest.approx(0.08)
    low = tuning_noise({0.1: [1.0, 1.2], 1.0: [1.05, 1.25]}, 0.1, "min")  # a loss: lower is better
    assert (
        low["lead"] == pytest.approx(0.05) and low["lead_se"] == pytest.approx(0.1) and low["noisy"] is True
    )
    one_seed = tuning_noise({0.1: [0.9], 1.0: [0.8]}, 0.1, "max")
    assert one_seed["noisy"] is None and one_seed["score_se"] == {"0.1": None, "1": None}
    failed = tuning_noise({0.1: [0.9, 0.8], 1.0: [0.85, -math.inf]}, 0.1, "max")
    assert failed["noisy"] is None  # a failed seed: the runner-up has no SE


def test_select_lr_records_the_noise_only_when_asked() -> None:
    grid = LRGrid.relative(0.1, 10.0, 3)
    trials = [
        _T(lr, v, s)
        for lr, vs in ((0.01, (0.5, 0.5)), (0.1, (0.9, 0.8)), (1.0, (0.86, 0.82)))
        for s, v in enumerate(vs)
    ]
    plain = select_lr(trials, grid, metric="val_accuracy", mode="max")
    assert not {"score_se", "runner_up", "lead", "lead_se", "noisy"} & set(plain)  # a stored design's record
    noisy = select_lr(trials, grid, metric="val_accuracy", mode="max", noise=True)
    assert noisy["lr"] == plain["lr"] == 0.1 and noisy["noisy"] is True
    assert {k: v for k, v in noisy.items() if k in plain} == plain
    records, _ = tune(
        {"x": grid},
        trials,
        cell_of=lambda t: "x",
        metric="val_accuracy",
        mode="max",
        max_extensions=0,
        noise=True,
    )
    assert records["x"]["noisy"] is True


def test_noisy_reasons_name_the_noisy_arms_once() -> None:
    assert noisy_reasons(("a", "b", "a"), {"a"}) == [f"{NOISY} (a)"]
    assert noisy_reasons(("a", "b"), set()) == []


# ---- the verdict: noisy reasons, the freeze record, the reported arm ---------------------------------


def test_a_noisy_tuned_arm_adds_a_reason_and_changes_no_verdict() -> None:
    claims = {
        "b": {"verdict": "supported", "reasons": []},
        "a": {"verdict": "refuted", "reasons": ["CI lies entirely in the opposite direction"]},
        "c": {"verdict": "inconclusive", "reasons": ["not applicable to vision"]},
        "e": {"verdict": "supported", "reasons": []},
    }
    gate_lr_noisy(claims, {"autonorm_s": {"noisy": True}, "autonorm": {"noisy": False}, "frozen_ln": {}})
    assert claims["b"] == {"verdict": "supported", "reasons": [f"{NOISY} (autonorm_s)"]}
    assert claims["e"]["reasons"] == [f"{NOISY} (autonorm_s)"] and claims["a"]["reasons"] == [
        "CI lies entirely in the opposite direction"
    ]
    assert claims["c"]["reasons"] == ["not applicable to vision"]


def _table(seeds: int, frozen: list[float | None]) -> tuple[pd.DataFrame, dict[Any, Any]]:
    rows, logs = [], {}
    levels = {
        "autonorm": 0.80,
        "autonorm_s": 0.82,
        "autonorm_s_searched": 0.79,
        "frozen_ln": 0.81,
        "random_selector": 0.8,
    }
    for arm, level in levels.items():
        for s in range(seeds):
            acc = level + 0.003 * ((s * 7 + len(arm)) % 5)
            rows.append(
                {
                    "arm": arm,
                    "seed": 100 + s,
                    "status": "completed",
                    "test_accuracy": acc,
                    "val_accuracy": acc,
                    "train_loss": 0.3,
                    "lr": 1e-3,
                    "trial_id": f"{arm}-{s}",
                    "mlflow_run_id": None,
                    "selector_frozen": frozen[s] if arm == "autonorm_s" else None,
                }
            )
            logs[(arm, 100 + s)] = [
                {"epoch": e, **{f"gate_entropy/layer_{j}": 0.5 for j in range(6)}} for e in (1, 2)
            ]
    return pd.DataFrame(rows), logs


def test_the_verdict_records_how_many_seeds_and_layers_froze_and_reports_the_searched_arm() -> None:
    spec = load_study(
        SEARCH,
        preset="vision",
        overrides=["sequential=null", "confirm.seeds=[100,101,102,103,104,105,106,107]"],
    )
    table, logs = _table(8, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    fields = design_fields(spec, table, logs)
    assert fields["freeze"] == {
        "arm": "autonorm_s",
        "t_freeze": 2,
        "rule": "always",
        "eps_h": 0.1,
        "epochs": 5,
        "frozen_share": pytest.approx(0.6),
        "seeds": 8,
        "seeds_frozen": 7,
        "layers": 6,
        "layers_frozen": 42,
    }
    wide = table.pivot(index="seed", columns="arm", values="test_accuracy")
    for other in ("autonorm", "autonorm_s"):
        got = fields["reported_arms"]["autonorm_s_searched"]["versus"][other]
        assert got["estimate"] == pytest.approx((wide["autonorm_s_searched"] - wide[other]).mean())
        assert (
            got["ci"][0] < got["estimate"] < got["ci"][1] and 0 < got["p_value"] <= 1 and got["n_seeds"] == 8
        )
    lines = design_lines(fields)
    assert "7 of 8 seeds froze, 42 of 48 gated layers" in lines[0] and "60% of training frozen" in lines[0]
    assert "reported, not a claim's arm" in lines[1]
    verdict = analyse(table, spec, gate_logs=logs, tuned={"autonorm_s": {"noisy": True}})
    assert verdict["freeze"] == fields["freeze"] and "autonorm_s_searched" not in json.dumps(
        verdict["claims"]
    )
    assert f"{NOISY} (autonorm_s)" in verdict["claims"]["b"]["reasons"]
    unknown = design_fields(spec, table.assign(selector_frozen=None), logs)["freeze"]
    assert (
        unknown["seeds_frozen"] is None and "not recorded" in design_lines(unknown and {"freeze": unknown})[0]
    )
    stored = spec.model_copy(
        update={"confirm": spec.confirm.model_copy(update={"freeze": None, "arms": spec.confirm.arms[:5]})}
    )
    assert design_fields(stored, table, logs) == {}


def test_the_claims_report_marks_the_searched_arm_reported_only(tmp_path: Path) -> None:
    from studies.kinds.search.report import write_claims_report

    spec = load_study(
        SEARCH,
        preset="vision",
        overrides=["sequential=null", "confirm.seeds=[100,101,102,103,104,105,106,107]"],
    )
    table, logs = _table(8, [1.0] * 8)
    verdict = analyse(table, spec, gate_logs=logs, tuned={})
    shared = {k: verdict[k] for k in ("kind", "study_verdict", "hypotheses", "freeze", "reported_arms")}
    tuned = {
        "autonorm_s": {
            "lr": 0.001,
            "at_range_edge": False,
            "scores": {"0.0001": 0.7, "0.001": 0.81},
            "score_se": {"0.0001": 0.03, "0.001": 0.0125},
            **tuning_noise({1e-4: [0.73, 0.67], 1e-3: [0.8225, 0.7975]}, 1e-3, "max"),
        }
    }
    paths = write_claims_report(
        verdict["claims"],
        table,
        logs,
        tmp_path,
        title="t",
        protocol=None,
        data_kind="vision",
        shared=shared,
        tuned_lr=tuned,
    )
    md = paths["markdown"].read_text()
    assert "autonorm_s_searched (reported only)" in md and "| autonorm_s |" in md
    assert "8 of 8 seeds froze" in md
    assert "0.001: 0.81 ± 0.013" in md and "lr-tuning-noisy" not in md  # lead 0.11 > SE 0.03
    written = json.loads(paths["verdict"].read_text())
    assert written["freeze"]["seeds_frozen"] == 8 and "autonorm_s_searched" in written["reported_arms"]


# ---- the grid kinds: the same informational reason ------------------------------------------------


def test_a_compare_contrast_resting_on_a_noisy_arm_carries_the_reason_and_keeps_its_verdict() -> None:
    from studies.kinds.compare.workflow import analyse as compare_analyse
    from tests.studies.test_compare_analysis import _spec
    from tests.studies.test_compare_analysis import _table as compare_table

    spec = _spec()
    table = compare_table(
        {
            "corrected": 0.9,
            "linear_batchnorm": 0.85,
            "linear_layernorm": 0.85,
            "linear": 0.8,
            "prenorm_l2": 0.8,
        }
    )
    plain = compare_analyse(table, spec, lr_tuning={"corrected": {"lr": 0.1, "noisy": False}})
    noisy = compare_analyse(table, spec, lr_tuning={"corrected": {"lr": 0.1, "noisy": True}})
    for name, c in noisy["contrasts"].items():
        before = plain["contrasts"][name]
        assert c["verdict"] == before["verdict"] and c["hypothesis"] == before["hypothesis"]
        rests = "corrected" in (c["arm"], c["reference"])
        assert c["reasons"] == before["reasons"] + ([f"{NOISY} (corrected)"] if rests else [])
        assert noisy["hypotheses"][name]["reasons"] == c["reasons"]
    assert any(NOISY in str(c["reasons"]) for c in noisy["contrasts"].values())
    assert noisy["study_verdict"] == plain["study_verdict"]


def test_a_batchsize_fix_arm_whose_control_tuned_noisily_carries_the_reason() -> None:
    from studies.kinds.batchsize.workflow import analyse as batchsize_analyse

    spec = load_study(ROOT / "studies" / "specs" / "batchsize_correlation.yaml", preset="smoke")
    from tests.studies.test_analysis import make_table

    arms = {arm: 0.0 for arm in spec.arm_names}
    table = make_table(slopes=arms, batch_sizes=tuple(spec.batch_sizes), seeds=len(spec.seeds))
    table["budget"] = spec.budget_names[0] if hasattr(spec, "budget_names") else ""
    plain = batchsize_analyse(table, spec)
    noisy = batchsize_analyse(table.assign(lr_noisy=table["arm"] == spec.control), spec)
    fix = [a for a, r in noisy["arms"].items() if r.get("role") == "fix"]
    assert fix
    for arm in fix:
        assert noisy["arms"][arm]["verdict"] == plain["arms"][arm]["verdict"]
        assert noisy["arms"][arm]["reasons"] == [*plain["arms"][arm]["reasons"], f"{NOISY} ({spec.control})"]
        assert noisy["hypotheses"][arm]["reasons"] == noisy["arms"][arm]["reasons"]
    for r in noisy["arms"].values():
        if r.get("role") != "fix":
            assert NOISY not in str(r["reasons"])  # a control's label rests on no tuning comparison


def test_the_grid_kinds_tuning_records_the_noise_as_their_spec_says() -> None:
    from studies.tuning import tuned_lines, tuned_rates
    from tests.studies.test_compare_analysis import _spec

    spec = _spec()
    grid = spec.lr_tuning.lr_grid()
    near, best = grid.points[4], grid.points[5]  # an interior pick, its runner-up one SE behind
    trials = [
        _T(lr, v, s) for lr, vs in ((near, (0.84, 0.80)), (best, (0.86, 0.80))) for s, v in enumerate(vs)
    ]
    _, record = tuned_rates(["corrected"], trials, cell_of=lambda t: "corrected", tuning=spec.lr_tuning)
    rec = record["corrected"]
    assert (
        spec.lr_tuning.flag_noisy and rec["lr"] == best and rec["runner_up"] == near and rec["noisy"] is True
    )
    assert NOISY in tuned_lines(record)[0]
    stored = spec.lr_tuning.model_copy(update={"flag_noisy": False})  # a study stored before the field
    _, before = tuned_rates(["corrected"], trials, cell_of=lambda t: "corrected", tuning=stored)
    assert "noisy" not in before["corrected"] and NOISY not in tuned_lines(before)[0]


def test_a_stored_compare_study_reads_flag_noisy_off_and_resumes_without_a_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from studies.running import _as_stored
    from tests.studies.test_stored_specs import _old_spec

    path = _old_spec(tmp_path)  # a compare study's study_spec.yaml written before flag_noisy existed
    stored, fresh = load_study(path, stored=True), load_study(path)
    assert stored.lr_tuning.flag_noisy is False and fresh.lr_tuning.flag_noisy is True
    import yaml

    doc = yaml.safe_load(path.read_text())
    resumed = _as_stored(fresh, doc)  # `run SPEC` again: the field left to its default takes the stored value
    assert resumed.lr_tuning.flag_noisy is False
    assert "lr_tuning.flag_noisy: False, as the study ran" in capsys.readouterr().out


def test_the_results_page_says_what_answers_a_noisy_tuning() -> None:
    from studies.decide import to_decide

    text = to_decide("inconclusive", [f"{NOISY} (autonorm_s)"], None, seeds_used=8, cost=None)
    assert (
        text
        == f"{NOISY} (autonorm_s): more tuning seeds or lr_tuning.refine (informational: the η pick led by < 1 SE)"
    )
    assert to_decide("supported", [f"{NOISY} (autonorm_s)"], None, seeds_used=8, cost=None) == "—"
