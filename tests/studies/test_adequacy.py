"""The training-adequacy gate (issue #47 item 2, studies/adequacy.py): the budget check's plan and
measurement, and what it does to the compare and batch-size verdicts (synthetic trials, no Ray)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies import adequacy
from studies.kinds import KINDS, load_study
from studies.kinds.batchsize.analysis import batchsize_trend
from studies.kinds.compare.analysis import compare_arms
from studies.kinds.compare.workflow import analyse as compare_analyse
from studies.verdict_diff import compare_verdicts
from workers.records import TrialRecord

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "studies" / "specs" / "affine_divergence_table.yaml"
BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
#: two arms, 1 epoch, tuning seeds 1000 and 1001 (the compare smoke, smaller)
SMALL = (
    "training.epochs=1",
    "arms=[corrected, linear_batchnorm]",
    "seeds=[0, 1]",
    "lr_tuning={low: 0.1, high: 1.0, points: 3, seeds: [1000, 1001], max_extensions: 0, refine: 0}",
)
LR = {"corrected": 1.0, "linear_batchnorm": 0.1}


def _trial(arm: str, lr: float, seed: int, epochs: int, val: float, status: str = "completed") -> TrialRecord:
    config = {"model": {"layer": {"type": arm}}, "training": {"lr": lr, "epochs": epochs}, "seed": seed}
    return TrialRecord(f"{arm}-{lr}-{seed}-{epochs}", {}, config, status, {"val_accuracy": val})  # type: ignore[arg-type]


def _compare(*extra: str) -> Any:
    return load_study(COMPARE, [*SMALL, *extra], preset="smoke")


# ---- the plan -----------------------------------------------------------------------------------


def test_the_check_runs_each_arm_at_its_tuned_eta_for_twice_the_budget_on_the_tuning_seeds() -> None:
    spec = _compare()
    plan = adequacy.adequacy_plan(spec, "", LR)
    cells, seeds = dict(plan.grid)["@"], dict(plan.grid)["seed"]
    assert plan.name == "tune-adequacy" and seeds == (1000, 1001)
    # the tuning ran the study's budget: its trials at the chosen eta are the 1x runs
    assert [(c["model"]["layer"]["type"], c["training"]) for c in cells] == [
        ("corrected", {"lr": 1.0, "epochs": 2}),
        ("linear_batchnorm", {"lr": 0.1, "epochs": 2}),
    ]
    assert spec.adequacy_trials == 4 and spec.total_trials == spec.tuning_trials + spec.expected_trials + 4
    names = [p.name for p in KINDS["compare"].phases(spec)]
    assert names == ["tune", "tune-adequacy", "confirm"]
    # a shorter tuning budget: the check runs the 1x budget itself
    short = load_study(COMPARE, ["training.epochs=4", "lr_tuning.epochs=2"], preset="smoke")
    epochs = sorted(
        c["training"]["epochs"]
        for c in dict(adequacy.adequacy_plan(short, "", dict.fromkeys(short.arm_names, 0.1)).grid)["@"]
    )
    assert epochs == [4] * len(short.arm_names) + [8] * len(short.arm_names)
    assert short.adequacy_trials == 2 * len(short.arm_names) * 2
    # switched off: no phase, no trials
    off = _compare("analysis.adequacy.check=false")
    assert off.adequacy_trials == 0 and "tune-adequacy" not in [p.name for p in KINDS["compare"].phases(off)]


def test_batchsize_checks_every_arm_and_batch_size_on_one_tuning_seed_with_the_update_budget_doubled() -> (
    None
):
    spec = load_study(BATCHSIZE, ["training.max_updates=40", "budgets=[updates]"], preset="smoke")
    plan = adequacy.adequacy_plan(spec, "updates", dict.fromkeys(spec.arms, 0.5))
    cells, seeds = dict(plan.grid)["@"], dict(plan.grid)["seed"]
    assert seeds == (spec.lr_tuning.seeds[0],)
    twice = [c for c in cells if c["training"]["max_updates"] == 80]
    once = [c for c in cells if c["training"]["max_updates"] == 40]
    keys = {adequacy.check_key(spec, c) for c in twice}
    assert keys == {f"{a}@{b}" for a in spec.arms for b in spec.batch_sizes}
    assert len(once) == len(twice)  # lr_policy constant: the tuning ran only the reference batch size
    assert (
        plan.run_name
        == "{model.layer.type}-B{training.batch_size}-lr{training.lr:g}-e{training.epochs}-s{seed}"
    )
    tuned = load_study(BATCHSIZE, ["lr_policy=tuned"], preset="smoke")
    assert adequacy.reuses_tuning(tuned, "epochs") and not adequacy.reuses_tuning(spec, "updates")


# ---- the measurement ----------------------------------------------------------------------------


def test_gain_is_the_paired_improvement_at_twice_the_budget_and_flags_above_max_gain() -> None:
    spec = _compare()  # no sequential section: max_gain 0.005
    assert adequacy.max_gain(spec) == 0.005
    tuning = [
        _trial("corrected", 1.0, 1000, 1, 0.70),
        _trial("corrected", 1.0, 1001, 1, 0.72),
        _trial("corrected", 0.1, 1000, 1, 0.99),  # another eta: not the chosen one's run
        _trial("linear_batchnorm", 0.1, 1000, 1, 0.90),
        _trial("linear_batchnorm", 0.1, 1001, 1, 0.92),
    ]
    checks = [
        _trial("corrected", 1.0, 1000, 2, 0.80),
        _trial("corrected", 1.0, 1001, 2, 0.84),
        _trial("linear_batchnorm", 0.1, 1000, 2, 0.902),
        _trial("linear_batchnorm", 0.1, 1001, 2, 0.924),
    ]
    out = adequacy.measure(spec, "", LR, checks, tuning)
    c, b = out["corrected"], out["linear_batchnorm"]
    assert c["reached"] == pytest.approx(0.71) and c["gain"] == pytest.approx(0.11)
    assert c["passed"] is False
    assert c["reason"] == "under-trained: corrected reached 0.71, +0.11 at twice the budget"
    assert b["gain"] == pytest.approx(0.003) and b["passed"] is True and b["reason"] is None
    # a larger tolerance passes corrected; a floor above what linear_batchnorm reached fails it
    loose = adequacy.measure(_compare("analysis.adequacy.max_gain=0.2"), "", LR, checks, tuning)
    assert loose["corrected"]["passed"] is True
    floored = adequacy.measure(_compare("analysis.adequacy.min_metric=0.95"), "", LR, checks, tuning)
    assert floored["linear_batchnorm"]["passed"] is False
    assert floored["linear_batchnorm"]["reason"].endswith("below min_metric 0.95")


def test_a_failed_long_run_measures_no_gain_and_an_unrun_check_is_not_measured() -> None:
    spec = _compare()
    tuning = [_trial("corrected", 1.0, s, 1, 0.7) for s in (1000, 1001)]
    checks = [_trial("corrected", 1.0, s, 2, math.nan, status="diverged") for s in (1000, 1001)]
    out = adequacy.measure(spec, "", LR, checks, tuning)
    assert out["corrected"]["gain"] is None and out["corrected"]["passed"] is True
    assert "no gain measured" in out["corrected"]["note"]
    assert out["linear_batchnorm"] == adequacy.NOT_MEASURED  # no 2x trial of it


def test_max_gain_defaults_to_the_sequential_min_effect() -> None:
    spec = load_study(BATCHSIZE, preset="local")
    assert spec.sequential is not None
    assert adequacy.max_gain(spec) == spec.sequential.min_effect == 0.005
    assert adequacy.max_gain(load_study(BATCHSIZE, ["sequential.min_effect=0.02"], preset="local")) == 0.02


# ---- the verdicts -------------------------------------------------------------------------------


def _compare_table(means: dict[str, float], seeds: int = 8) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        [
            {
                "arm": a,
                "seed": s,
                "status": "completed",
                "test_accuracy": m + rng.normal(0, 0.002),
                "train_loss": 0.3,
            }
            for a, m in means.items()
            for s in range(seeds)
        ]
    )


TWO = {
    "corrected_vs_batchnorm": {"arm": "corrected", "reference": "linear_batchnorm", "predicted": "better"},
    "batchnorm_vs_plain": {"arm": "linear_batchnorm", "reference": "linear", "predicted": "better"},
}


def _entry(passed: bool, arm: str) -> dict[str, Any]:
    return {
        "passed": passed,
        "reached": 0.7,
        "gain": 0.1 if not passed else 0.0,
        "reason": None if passed else adequacy.reason(arm, 0.7, 0.1),
    }


def test_a_contrast_resting_on_an_under_trained_arm_is_inconclusive_and_the_others_are_not() -> None:
    table = _compare_table({"corrected": 0.9, "linear_batchnorm": 0.85, "linear": 0.8, "prenorm_l2": 0.7})
    kw: dict[str, Any] = {"failed_value": 0.1, "chance_loss": math.log(10), "min_seeds": 5}
    plain = compare_arms(table, contrasts=TWO, **kw)
    assert {n: c["verdict"] for n, c in plain["contrasts"].items()} == {
        "corrected_vs_batchnorm": "better",
        "batchnorm_vs_plain": "better",
    }
    checks = {a: _entry(a != "corrected", a) for a in ("corrected", "linear_batchnorm", "linear")}
    gated = compare_arms(table, contrasts=TWO, adequacy=checks, **kw)
    c = gated["contrasts"]["corrected_vs_batchnorm"]
    assert c["verdict"] == "inconclusive" and c["hypothesis"] == "inconclusive"
    assert c["reasons"] == ["under-trained: corrected reached 0.7, +0.1 at twice the budget"]
    assert c["arms"] == ["corrected", "linear_batchnorm"]
    assert gated["contrasts"]["batchnorm_vs_plain"]["verdict"] == "better"  # its arms passed
    assert gated["study_verdict"] == "inconclusive"
    assert gated["study_reasons"][0].startswith("not testable at this budget: corrected")
    # a table-only arm that fails the check gates nothing and leaves the study testable
    only = compare_arms(table, contrasts=TWO, adequacy={"prenorm_l2": _entry(False, "prenorm_l2")}, **kw)
    assert only["study_verdict"] == "supported" and not only["study_reasons"][0].startswith("not testable")


def test_the_compare_verdict_records_adequacy_per_arm_or_not_measured() -> None:
    spec = _compare()
    table = _compare_table({"corrected": 0.9, "linear_batchnorm": 0.85}, seeds=2)
    entries = {"corrected": _entry(False, "corrected"), "linear_batchnorm": _entry(True, "linear_batchnorm")}
    verdict = compare_analyse(table, spec, lr_tuning={}, adequacy={"": entries})
    assert verdict["adequacy"] == entries
    assert verdict["hypotheses"]["corrected_vs_batchnorm"]["arms"] == ["corrected", "linear_batchnorm"]
    assert any(
        r.startswith("under-trained: corrected")
        for r in verdict["hypotheses"]["corrected_vs_batchnorm"]["reasons"]
    )
    off = compare_analyse(
        table, _compare("analysis.adequacy.check=false"), lr_tuning={}, adequacy={"": entries}
    )
    assert off["adequacy"] == "not measured"
    assert not any(
        r.startswith("under-trained") for r in off["hypotheses"]["corrected_vs_batchnorm"]["reasons"]
    )


def _bs_table(slopes: dict[str, float]) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for k, (arm, slope) in enumerate(slopes.items()):
        for b in (8, 16, 32, 64, 128):
            for s in range(8):
                acc = 0.85 - 0.01 * k + slope * math.log2(b) + rng.normal(0, 0.003)
                rows.append(
                    {
                        "arm": arm,
                        "batch_size": b,
                        "seed": s,
                        "status": "completed",
                        "test_accuracy": acc,
                        "train_loss": 0.3,
                    }
                )
    return pd.DataFrame(rows)


def test_a_declining_control_with_a_flagged_cell_is_unclear_and_its_fix_arm_inconclusive() -> None:
    table = _bs_table({"linear": -0.02, "linear_batchnorm": 0.0, "corrected": -0.05})
    args: dict[str, Any] = {
        "control": "linear",
        "controls": ["linear", "linear_batchnorm"],
        "chance_metric": 0.1,
        "chance_loss": math.log(10),
        "n_perm": 499,
    }
    plain = batchsize_trend(table, **args)
    assert plain["controls"]["linear"] == "declines"
    flagged = {
        "linear@128": _entry(False, "linear@128"),
        "linear_batchnorm@8": _entry(True, "linear_batchnorm@8"),
    }
    gated = batchsize_trend(table, adequacy={"": flagged}, **args)
    assert gated["controls"]["linear"] == "unclear"  # never "declines" while a cell is flagged
    assert gated["arms"]["linear"]["reasons"] == [adequacy.reason("linear@128", 0.7, 0.1)]
    assert gated["controls"]["linear_batchnorm"] == plain["controls"]["linear_batchnorm"]  # its cell passed
    assert gated["verdict"]["corrected"] == "inconclusive"
    assert f"control {adequacy.reason('linear@128', 0.7, 0.1)}" in gated["arms"]["corrected"]["reasons"]
    assert gated["study_reasons"][0].startswith("not testable at this budget: linear@128")


def test_a_fix_arm_on_an_under_trained_cell_or_control_takes_no_more_seeds() -> None:
    """Per-arm stopping counts a hypothesis the check made inconclusive as decided: its fix arm gets
    no seeds after the look, and a flagged control stops every fix arm (its interactions all rest on it)."""
    from studies.kinds.analysis_inputs import sequential_design
    from studies.kinds.batchsize.workflow import look_arms

    spec = load_study(BATCHSIZE, preset="local")
    assert spec.sequential is not None and len(spec.fix_arms) >= 2
    flagged_fix, *other_fix = spec.fix_arms
    # fix arms 0.004 per doubling below the controls: neither rejected nor futile at the first look
    table = _bs_table({arm: 0.0 if arm in spec.control_arms else -0.004 for arm in spec.arms})
    table = table[table["seed"] < spec.sequential.min_seeds]
    args: dict[str, Any] = {
        "control": spec.control,
        "controls": list(spec.control_arms),
        "chance_metric": 0.1,
        "chance_loss": math.log(10),
        "n_perm": 499,
        "sequential": sequential_design(spec.sequential, [str(s) for s in spec.seeds]),
    }
    plain = batchsize_trend(table, **args)
    assert set(look_arms(spec, plain, "") or []) == set(spec.arms)  # nothing decided after one look
    cell = f"{flagged_fix}@128"
    one = batchsize_trend(table, adequacy={"": {cell: _entry(False, cell)}}, **args)
    assert one["verdict"][flagged_fix] == "inconclusive"
    assert one["looks"][-1]["hypotheses"][flagged_fix]["decision"] == "continue"  # the test itself is open
    assert set(look_arms(spec, one, "") or []) == set(spec.arms) - {flagged_fix}
    cell = f"{spec.control}@8"
    control = batchsize_trend(table, adequacy={"": {cell: _entry(False, cell)}}, **args)
    assert all(control["verdict"][arm] == "inconclusive" for arm in [flagged_fix, *other_fix])
    assert look_arms(spec, control, "") == []


# ---- stored studies -----------------------------------------------------------------------------


@pytest.mark.parametrize("study", ["affine_divergence_table_local", "batchsize_correlation_local"])
def test_a_stored_study_from_before_the_check_runs_without_it(study: str) -> None:
    spec = load_study(ROOT / "results" / study / "study_spec.yaml", stored=True)
    assert spec.analysis.adequacy.check is False and spec.adequacy_trials == 0
    assert not any(p.name.endswith("-adequacy") for p in KINDS[spec.kind].phases(spec))


def test_reproduce_takes_the_adequacy_fields_a_logged_verdict_predates_as_no_difference() -> None:
    logged = {"study_verdict": "inconclusive", "hypotheses": {"h": {"verdict": "inconclusive"}}}
    recomputed = {
        **logged,
        "adequacy": "not measured",
        "hypotheses": {"h": {"verdict": "inconclusive", "arms": ["a", "b"]}},
    }
    assert compare_verdicts(logged, recomputed) == []
    changed = compare_verdicts({**logged, "adequacy": {"a": {"passed": True}}}, recomputed)
    assert [d.field for d in changed] == ["adequacy"]
    # any other field a logged verdict lacks is still a difference
    assert [d.field for d in compare_verdicts(logged, {**logged, "scope": {}})] == ["scope"]


def test_the_reports_table_every_cell_or_say_not_measured() -> None:
    entries = {"corrected": _entry(False, "corrected"), "linear": _entry(True, "linear")}
    rule = {"factor": 2, "seeds": [1000], "metric": "val_accuracy", "max_gain": 0.005, "min_metric": None}
    text, tables = adequacy.report_section({"adequacy": entries, "adequacy_rule": rule})
    assert [(r["cell"], r["gain"], r["verdict"]) for r in tables[0]] == [
        ("corrected", "+0.1", "under-trained"),
        ("linear", "+0", "passed"),
    ]
    assert "above 0.005" in text[0]
    text, tables = adequacy.report_section({"adequacy": "not measured"})
    assert tables == [] and "not measured" in text[0]


def test_an_offline_reanalysis_reads_the_checks_back_from_the_logged_verdict() -> None:
    # trials.csv holds the confirmatory trials only: the check's entries come from verdict.json,
    # split back per budget (several budgets: "<budget>/<cell>")
    spec = load_study(BATCHSIZE, ["budgets=[epochs, updates]"], preset="smoke")
    by_budget = {
        "epochs": {"linear@8": _entry(False, "linear@8")},
        "updates": {"linear@8": _entry(True, "linear@8")},
    }
    record = adequacy.adequacy_record(spec, by_budget)
    assert set(record) == {"epochs/linear@8", "updates/linear@8"}
    assert adequacy.logged_checks(spec, {"adequacy": record}) == by_budget
    assert adequacy.logged_checks(spec, {"adequacy": "not measured"}) is None


def test_resuming_a_study_stored_before_the_check_is_no_changed_spec_and_runs_no_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from studies.running import _check_unchanged
    from studies.study_dir import SPEC_FILE, StudyDir
    from tests.studies.test_stored_specs import _old_spec

    path = _old_spec(tmp_path)  # a compare study's study_spec.yaml from before the check
    here = f"storage_path={tmp_path / 'runs'}"
    where = StudyDir.of(load_study(path, [here]))
    where.write_text(SPEC_FILE, path.read_text(encoding="utf-8"))
    for stored in (False, True):  # `run SPEC` (today's default: check on) and `resume STUDY_DIR`
        resumed = _check_unchanged(load_study(path, [here], stored=stored), where, allow_changed=False)
        assert resumed.analysis.adequacy.check is False and resumed.adequacy_trials == 0
    assert "analysis.adequacy" in capsys.readouterr().out  # said once, for `run SPEC`


# ---- the claims (search) kind -------------------------------------------------------------------

SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"
STORED_CLAIMS = ["autonorm_claims_text", "autonorm_claims_vision"]


def _search_trial(arm: str, lr: float, seed: int, epochs: int, val: float) -> TrialRecord:
    config = {"model": {"norm": {"type": arm}}, "training": {"lr": lr, "epochs": epochs}, "seed": seed}
    return TrialRecord(f"{arm}-{lr}-{seed}-{epochs}", {}, config, "completed", {"val_accuracy": val})  # type: ignore[arg-type]


def test_the_claims_check_runs_each_arm_a_claim_rests_on_at_twice_the_budget_on_a_tuning_seed() -> None:
    from studies.kinds.search import adequacy as search_adequacy

    smoke = load_study(SEARCH, preset="smoke")  # digits: the image claims a, b, d (and e, reported)
    phases = {p.name: p for p in KINDS["search"].phases(smoke)}
    checked = [
        n.removeprefix("confirm-tune-").removesuffix("-adequacy") for n in phases if n.endswith("-adequacy")
    ]
    # a: random_selector, autonorm; b: autonorm_s, autonorm; e: autonorm_s, frozen_ln; d: autonorm
    assert checked == ["frozen_ln", "random_selector", "autonorm", "autonorm_s"]
    for arm in checked:
        names = list(phases)
        # after the arm's tuning, before its confirmation
        assert names.index(f"confirm-tune-{arm}") < names.index(f"confirm-tune-{arm}-adequacy")
        assert names.index(f"confirm-tune-{arm}-adequacy") < names.index(f"confirm-{arm}")
        (config,) = phases[f"confirm-tune-{arm}-adequacy"].configs  # the tuning trials hold the 1x run
        assert config["training"]["epochs"] == 2 * smoke.training.epochs and config["seed"] == 200
    assert search_adequacy.check_trials(smoke) == 4
    # text: no claim a, so no random_selector; a shorter tuning budget: the check runs the 1x too
    text = load_study(SEARCH, ["confirm.lr_tuning.epochs=2"], preset="text")
    assert search_adequacy.checked_arms(text) == ["frozen_ln", "autonorm", "autonorm_s"]
    (phase,) = [p for p in KINDS["search"].phases(text) if p.name == "confirm-tune-autonorm-adequacy"]
    assert sorted(c["training"]["epochs"] for c in phase.configs) == [6, 12]
    assert {c["seed"] for c in phase.configs} == {200}  # one tuning seed of [200, 201]
    assert search_adequacy.check_trials(text) == 3 * 2
    # the plan counts them; switched off there are none
    off = load_study(SEARCH, ["analysis.adequacy.check=false"], preset="smoke")
    assert KINDS["search"].total_trials(smoke) == KINDS["search"].total_trials(off) + 4
    assert not any(p.name.endswith("-adequacy") for p in KINDS["search"].phases(off))


def test_the_claims_check_measures_the_gain_over_the_tuning_run_at_the_confirmed_eta() -> None:
    from studies.kinds.search.adequacy import measure

    spec = load_study(SEARCH, preset="smoke")  # 3 epochs; max_gain 0.005 (no sequential min_effect)
    tuning = [
        _search_trial("autonorm", 0.01, 200, 3, 0.70),  # the confirmed eta: the 1x run
        _search_trial("autonorm", 0.001, 200, 3, 0.95),  # another eta: not the arm's budget run
    ]
    long = [_search_trial("autonorm", 0.01, 200, 6, 0.80)]
    entry = measure(spec, "autonorm", 0.01, long, tuning)
    assert isinstance(entry, dict) and entry["passed"] is False
    assert entry["reached"] == pytest.approx(0.70) and entry["gain"] == pytest.approx(0.10)
    assert entry["reason"] == "under-trained: autonorm reached 0.7, +0.1 at twice the budget"
    flat = measure(spec, "autonorm", 0.01, [_search_trial("autonorm", 0.01, 200, 6, 0.703)], tuning)
    assert isinstance(flat, dict) and flat["passed"] is True and flat["gain"] == pytest.approx(0.003)
    # a floor the arm misses fails it whatever its gain
    floored = load_study(SEARCH, ["analysis.adequacy.min_metric=0.9"], preset="smoke")
    low = measure(floored, "autonorm", 0.01, [_search_trial("autonorm", 0.01, 200, 6, 0.70)], tuning)
    assert isinstance(low, dict) and low["passed"] is False and "below min_metric 0.9" in low["reason"]
    # no run at twice the budget: not measured
    assert measure(spec, "autonorm", 0.01, [], tuning) == adequacy.NOT_MEASURED


def _claims_table(seeds: int = 8) -> tuple[pd.DataFrame, dict[Any, Any]]:
    levels = {
        "frozen_ln": 0.80,
        "frozen_dyt": 0.75,
        "random_selector": 0.83,
        "autonorm": 0.78,
        "autonorm_s": 0.84,
        "autonorm_s_searched": 0.79,
    }
    rows, logs = [], {}
    for arm, level in levels.items():
        for s in range(seeds):
            acc = level + 0.002 * ((s * 7 + len(arm)) % 5)
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
                    "selector_frozen": 1.0 if arm == "autonorm_s" else None,
                }
            )
            logs[(arm, 100 + s)] = [
                {"epoch": e, **{f"gate_entropy/layer_{j}": 0.5 for j in range(4)}} for e in (1, 2)
            ]
    return pd.DataFrame(rows), logs


def test_a_claim_resting_on_an_under_trained_arm_is_inconclusive_and_every_claim_lists_its_arms() -> None:
    from studies.kinds.search.workflow import analyse as claims_analyse

    spec = load_study(
        SEARCH, ["sequential=null", "confirm.seeds=[100,101,102,103,104,105,106,107]"], preset="vision"
    )
    table, logs = _claims_table()
    entries = {arm: _entry(True, arm) for arm in ("frozen_ln", "random_selector", "autonorm", "autonorm_s")}
    passed = claims_analyse(table, spec, gate_logs=logs, tuned={}, adequacy=entries)
    assert passed["claims"]["a"]["verdict"] == "supported" and passed["claims"]["b"]["verdict"] == "supported"
    # an entry for every confirmatory arm; the arms no claim rests on are not measured
    assert set(passed["adequacy"]) == set(spec.confirm.arms)
    assert passed["adequacy"]["frozen_dyt"] == passed["adequacy"]["autonorm_s_searched"] == "not measured"
    assert passed["adequacy_rule"]["arms"] == ["frozen_ln", "random_selector", "autonorm", "autonorm_s"]
    arms = {cid: h["arms"] for cid, h in passed["hypotheses"].items()}
    assert arms["a"] == ["random_selector", "autonorm"] and arms["b"] == ["autonorm_s", "autonorm"]
    assert arms["e"] == ["autonorm_s", "frozen_ln"] and arms["d"] == ["autonorm"]
    flagged = claims_analyse(
        table, spec, gate_logs=logs, tuned={}, adequacy={**entries, "autonorm_s": _entry(False, "autonorm_s")}
    )
    for cid in ("b", "e"):  # autonorm_s's claims: never supported or refuted
        claim = flagged["claims"][cid]
        assert claim["verdict"] == "inconclusive" and flagged["hypotheses"][cid]["verdict"] == "inconclusive"
        assert any(r.startswith("under-trained: autonorm_s") for r in claim["reasons"])
    assert flagged["claims"]["a"] == passed["claims"]["a"]  # resting on arms that passed: unchanged
    assert flagged["claims"]["d"]["verdict"] == passed["claims"]["d"]["verdict"]
    assert flagged["study_verdict"] != "supported" and passed["study_verdict"] == "supported"
    # without the check, nothing measured and nothing gated
    off = claims_analyse(table, spec, gate_logs=logs, tuned={})
    assert off["adequacy"] == "not measured" and off["claims"]["b"]["verdict"] == "supported"


def test_the_claims_report_tables_the_check_and_says_what_is_not_testable(tmp_path: Path) -> None:
    from studies.kinds.search.report import write_claims_report
    from studies.kinds.search.workflow import SHARED
    from studies.kinds.search.workflow import analyse as claims_analyse

    spec = load_study(
        SEARCH, ["sequential=null", "confirm.seeds=[100,101,102,103,104,105,106,107]"], preset="vision"
    )
    table, logs = _claims_table()
    entries = {"autonorm": _entry(True, "autonorm"), "autonorm_s": _entry(False, "autonorm_s")}
    verdict = claims_analyse(table, spec, gate_logs=logs, tuned={}, adequacy=entries)
    paths = write_claims_report(
        verdict["claims"],
        table,
        logs,
        tmp_path,
        title="t",
        protocol=None,
        data_kind="vision",
        shared={k: verdict[k] for k in SHARED if k in verdict},
    )
    written = json.loads(paths["verdict"].read_text())
    assert written["adequacy"]["autonorm_s"]["passed"] is False and written["adequacy_rule"]["factor"] == 2
    assert "not testable at this budget: autonorm_s under-trained" in written["study_verdict_line"]
    md = paths["markdown"].read_text()
    assert "## Training adequacy" in md and "| autonorm_s |" in md and "under-trained" in md


@pytest.mark.parametrize("study", STORED_CLAIMS)
def test_a_claims_study_stored_before_the_check_reads_not_measured_and_reproduces(
    study: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from studies.cli import main
    from studies.offline import reanalyse_tables

    directory = ROOT / "results" / study
    spec = load_study(directory / "study_spec.yaml", stored=True)
    assert spec.analysis.adequacy.check is False
    assert not any(p.name.endswith("-adequacy") for p in KINDS["search"].phases(spec))
    logged = json.loads((directory / "verdict.json").read_text(encoding="utf-8"))
    recomputed = reanalyse_tables(spec, KINDS["search"], directory, logged)
    assert recomputed["adequacy"] == "not measured"
    assert all(h["arms"] for h in recomputed["hypotheses"].values())
    assert main(["reproduce", str(directory)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced"


def test_resuming_a_claims_study_stored_before_the_check_is_no_changed_spec(tmp_path: Path) -> None:
    from studies.running import _check_unchanged
    from studies.study_dir import SPEC_FILE, StudyDir

    path = tmp_path / "study_spec.yaml"
    path.write_text((ROOT / "results" / "autonorm_claims_vision" / "study_spec.yaml").read_text("utf-8"))
    here = f"storage_path={tmp_path / 'runs'}"
    where = StudyDir.of(load_study(path, [here]))
    where.write_text(SPEC_FILE, path.read_text(encoding="utf-8"))
    for stored in (False, True):  # `run SPEC` (today's default: check on) and `resume STUDY_DIR`
        resumed = _check_unchanged(load_study(path, [here], stored=stored), where, allow_changed=False)
        assert resumed.analysis.adequacy.check is False
        assert not any(p.name.endswith("-adequacy") for p in KINDS["search"].phases(resumed))
