"""The search kind's confirm and claims phases: arms, trial counts, and the claims end to end on a
local Ray with a cheap planted trial function (the statistics see what was planted)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from studies.kinds import load_study
from studies.kinds.search.workflow import arm_config, total_trials
from studies.running import run_study_spec
from studies.schema import SpecError
from workers.trainable import TrialSession

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"

BEST = {
    "model": {
        "type": "vit_lite",
        "norm": {"type": "autonorm", "candidates": ["dyt", "layernorm"], "tau": 0.7},
    },
    "data": {"type": "digits"},
    "training": {"lr": 0.002, "epochs": 3, "freeze": {"t_freeze": 1, "eps_h": 0.2, "rule": "always"}},
    "seed": 0,
}


def test_arms_change_only_the_norm_and_the_freezing() -> None:
    s = arm_config(BEST, "autonorm_s")
    assert s["model"] == BEST["model"] and s["training"] == BEST["training"]
    a = arm_config(BEST, "autonorm")
    assert a["model"]["norm"] == BEST["model"]["norm"] and a["training"]["freeze"] is None
    assert arm_config(BEST, "frozen_ln")["model"]["norm"] == {"type": "layernorm"}
    assert arm_config(BEST, "frozen_dyt")["model"]["norm"] == {"type": "dyt"}
    r = arm_config(BEST, "random_selector")
    assert r["model"]["norm"] == {"type": "random_selector", "candidates": ["dyt", "layernorm"]}
    for arm in ("autonorm", "frozen_ln", "frozen_dyt", "random_selector"):
        cfg = arm_config(BEST, arm)
        assert cfg["training"]["lr"] == 0.002 and cfg["data"] == BEST["data"]
    assert BEST["training"]["freeze"] is not None  # the best config itself is not modified
    with pytest.raises(ValueError, match="valid"):
        arm_config(BEST, "batchnorm")


def test_trial_counts_and_confirm_validation() -> None:
    smoke = load_study(SEARCH, preset="smoke")
    assert smoke.confirm is not None
    # 4 search trials + 6 arms (claim b's AutoNorm-S and the searched one apart) x (2 lr points x 1
    # tuning seed + 3 confirmatory seeds) + the training-adequacy check: the 4 arms the image claims
    # rest on (a: random_selector, autonorm; b: autonorm_s, autonorm; e: autonorm_s, frozen_ln) at
    # twice the budget on 1 tuning seed (the tuning trials hold the 1x runs)
    assert total_trials(smoke) == 4 + 6 * (2 * 1 + 3) + 4
    assert total_trials(load_study(SEARCH, ["analysis.adequacy.check=false"], preset="smoke")) == 4 + 6 * 5
    assert total_trials(load_study(SEARCH, ["confirm=null"], preset="smoke")) == 4
    with pytest.raises(SpecError) as err:
        load_study(SEARCH, ["confirm.seeds=[0,1,2]"], preset="smoke")
    assert any(i.path == "confirm.seeds" for i in err.value.issues)
    with pytest.raises(SpecError) as err:
        load_study(
            SEARCH,
            ["model.norm={type: layernorm}", "training.freeze=null", "search.space=[]"],
            preset="smoke",
        )
    assert any(i.path == "confirm" for i in err.value.issues), err.value.format()


# ---- end to end with a planted world ---------------------------------------------------------------

#: Per-arm test accuracy: random_selector > autonorm (claim a), autonorm_s > autonorm (claim b).
_LEVEL = {
    "frozen_ln": 0.80,
    "frozen_dyt": 0.75,
    "random_selector": 0.82,
    "autonorm": 0.78,
    "autonorm_s": 0.83,
    "autonorm_s_searched": 0.79,  # reported only
}
#: ``confirm.freeze.eps_h`` of the end-to-end study: tells claim b's AutoNorm-S from the searched one.
_B_EPS_H = 0.0625


def planted_trial(config: dict[str, Any], session: TrialSession) -> None:
    norm = config["model"]["norm"]["type"]
    freeze = config["training"].get("freeze")
    arm = {
        "layernorm": "frozen_ln",
        "dyt": "frozen_dyt",
        "random_selector": "random_selector",
        "autonorm": "autonorm"
        if not freeze
        else "autonorm_s"
        if freeze["eps_h"] == _B_EPS_H
        else "autonorm_s_searched",
    }[norm]
    seed = int(config["seed"])
    lr = float(config["training"]["lr"])
    noise = 0.01 * math.sin(seed * 1.7 + len(arm))
    acc = _LEVEL[arm] + noise - 0.02 * abs(math.log10(lr / 2e-3))
    for epoch in (1, 2):
        row: dict[str, Any] = {
            "epoch": epoch,
            "val_accuracy": acc,
            "test_accuracy": acc,
            "train_loss": 0.5,
            "selector_frozen": 1.0 if freeze and epoch >= freeze["t_freeze"] else 0.0,
        }
        for layer in range(4):  # 2 blocks: attention / MLP norms; LN wins fast
            row[f"gate_entropy/layer_{layer}"] = 0.6 / epoch**3
            row[f"dyt_weight/layer_{layer}"] = 0.3 / epoch
        session.report(row, status="completed" if epoch == 2 else "running")


@pytest.mark.ray
@pytest.mark.slow
def test_claims_end_to_end(local_ray: None, tmp_path: Path) -> None:
    # The fewest seeds at which claims a and b can be supported: Holm over a, b, e needs the smallest
    # one-sided sign-flip p, 2**-n, below 0.05 / 3 (n = 6: 0.0156). (Fewer than min_seeds ->
    # inconclusive is covered by tests/studies/test_claims.py.)
    n_seeds = 6
    import pandas as pd
    from mlflow import MlflowClient

    seeds = list(range(100, 100 + n_seeds))
    spec = load_study(
        SEARCH,
        [
            f"storage_path={tmp_path}",
            "search.num_samples=2",
            "search.max_concurrent=1",  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
            f"confirm.seeds={seeds}",
            "confirm.lr_tuning.points=3",  # the centre (the searched lr) wins: no arm on an edge
            f"confirm.freeze.eps_h={_B_EPS_H}",
        ],
        preset="smoke",
    )
    out = run_study_spec(spec, trainable=planted_trial, progress=False)
    study_dir = Path(out.study_dir)
    verdict = json.loads((study_dir / "verdict.json").read_text())
    claims = verdict["claims"]
    assert {"a", "b", "c", "d", "e"} <= set(claims)
    table = pd.read_csv(study_dir / "confirm_trials.csv")
    assert set(table["arm"]) == set(_LEVEL) and len(table) == 6 * n_seeds
    # claim b's AutoNorm-S froze at the end of epoch ceil(3 / 3) = 1 on every seed, all 4 gated layers
    assert verdict["freeze"] == {
        "arm": "autonorm_s",
        "t_freeze": 1,
        "rule": "always",
        "eps_h": _B_EPS_H,
        "epochs": 3,
        "frozen_share": pytest.approx(2 / 3),
        "seeds": n_seeds,
        "seeds_frozen": n_seeds,
        "layers": 4,
        "layers_frozen": 4 * n_seeds,
    }
    searched = verdict["reported_arms"]["autonorm_s_searched"]["versus"]["autonorm"]
    d = (
        table[table["arm"] == "autonorm_s_searched"].set_index("seed")["test_accuracy"]
        - table[table["arm"] == "autonorm"].set_index("seed")["test_accuracy"]
    )
    assert searched["estimate"] == pytest.approx(d.mean()) and searched["n_seeds"] == n_seeds
    assert "autonorm_s_searched" not in json.dumps(claims)  # in no claim
    # the training-adequacy check: every arm the claims rest on, at its confirmed eta for twice the
    # budget on the tuning seed (the planted metric does not grow with training: zero gain, passed)
    assert set(verdict["adequacy"]) == set(_LEVEL)
    for arm in ("frozen_ln", "random_selector", "autonorm", "autonorm_s"):
        entry = verdict["adequacy"][arm]
        assert entry["passed"] is True and entry["gain"] == pytest.approx(0.0), (arm, entry)
        assert entry["reached"] == pytest.approx(entry["reached_twice"])
    assert verdict["adequacy"]["frozen_dyt"] == verdict["adequacy"]["autonorm_s_searched"] == "not measured"
    assert {cid: h["arms"] for cid, h in verdict["hypotheses"].items()}["b"] == ["autonorm_s", "autonorm"]
    assert "autonorm_s_searched (reported only)" in (study_dir / "report.md").read_text()
    assert {
        "arm",
        "seed",
        "status",
        "test_accuracy",
        "val_accuracy",
        "train_loss",
        "lr",
        "trial_id",
        "mlflow_run_id",
    } <= set(table.columns)
    # Every arm found its own lr: the planted optimum is the searched-lr centre of the grid.
    wide = table.pivot(index="seed", columns="arm", values="test_accuracy")
    for cid, (x, y) in {
        "a": ("random_selector", "autonorm"),
        "b": ("autonorm_s", "autonorm"),
        "e": ("autonorm_s", "frozen_ln"),
    }.items():
        d = (wide[x] - wide[y]).to_numpy()
        c = claims[cid]
        assert c["estimate"] == pytest.approx(d.mean())
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        assert c["ci"] == pytest.approx([d.mean() - half, d.mean() + half])
        alt = "two-sided" if cid == "e" else "greater"
        flips = np.array(np.meshgrid(*[[1, -1]] * len(d))).reshape(len(d), -1).T
        null = (flips * np.abs(d)).mean(axis=1)
        p = (
            np.mean(np.abs(null) >= abs(d.mean()) - 1e-12)
            if alt == "two-sided"
            else np.mean(null >= d.mean() - 1e-12)
        )
        assert c["p_value"] == pytest.approx(p)
        assert c["p_value_holm"] >= c["p_value"]
    if n_seeds < 5:
        assert all(c["verdict"] == "inconclusive" and c["reasons"] for c in claims.values())
        assert all(
            any("underpowered" in r or "not applicable" in r for r in c["reasons"]) for c in claims.values()
        )
    else:
        assert claims["a"]["verdict"] == "supported" and claims["b"]["verdict"] == "supported"
        assert claims["c"]["verdict"] == "inconclusive" and any(
            "not applicable" in r for r in claims["c"]["reasons"]
        )
    client = MlflowClient(tracking_uri=out.tracking_uri)
    assert out.parent_run_id is not None
    tags = client.get_run(out.parent_run_id).data.tags
    for cid in ("a", "b", "c", "d"):
        assert tags[f"claim/{cid}"] == claims[cid]["verdict"]
    exp = client.get_run(out.parent_run_id).info.experiment_id
    trials = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'trial'")
    # every arm's winner is the centre, interior: refined by 2 more rates on the 1 tuning seed, in its own
    # phase, the best of the 5 kept
    assert spec.confirm is not None and spec.confirm.lr_tuning is not None
    assert len(trials) == total_trials(spec) + len(_LEVEL) * 2 * len(spec.confirm.lr_tuning.seeds)
    refined = {
        t.data.tags["autonorm.phase"] for t in trials if t.data.tags["autonorm.phase"].endswith("-refine")
    }
    assert refined == {f"confirm-tune-{arm}-refine" for arm in _LEVEL}
    for arm, rec in verdict["tuned_lr"].items():
        low, high = rec["refine"]["points"]
        assert low < rec["refine"]["grid_lr"] < high and rec["refine"]["skipped"] is None, (arm, rec)
        rates = [*rec["grid"], low, high]  # the planted optimum is 2e-3: the nearest rate wins
        assert rec["lr"] == min(rates, key=lambda lr: abs(math.log10(lr / 2e-3)))
    names = {t.info.run_name for t in trials}
    assert {f"{arm}-s{seed}" for arm in _LEVEL for seed in seeds} <= names
    checks = {
        t.data.tags["autonorm.phase"] for t in trials if t.data.tags["autonorm.phase"].endswith("-adequacy")
    }
    assert checks == {
        f"confirm-tune-{arm}-adequacy" for arm in ("frozen_ln", "random_selector", "autonorm", "autonorm_s")
    }
    assert {"search-001", "search-002"} <= names
    # A regenerated report keeps the confirmatory trials' MLflow run ids.
    from studies.kinds import kind_for

    kind_for(spec).report(spec, tmp_path / "again")
    again = pd.read_csv(tmp_path / "again" / "claims" / "confirm_trials.csv")
    assert again["mlflow_run_id"].notna().all()
    assert dict(zip(again["trial_id"], again["mlflow_run_id"])) == dict(
        zip(table["trial_id"], table["mlflow_run_id"])
    )
    # ... and the run's wall time (kept in the run's verdict.json), not "–".
    assert verdict["resources"]["wall_time_s"] > 0
    md = (tmp_path / "again" / "claims" / "report.md").read_text()
    assert "wall time: – min" not in md and "wall time: " in md
    # The numbers each claim rests on, once each, on the study run.
    metrics = client.get_run(out.parent_run_id).data.metrics
    for cid in ("a", "b", "e"):
        assert metrics[f"estimate/{cid}"] == pytest.approx(claims[cid]["estimate"])
        assert metrics[f"ci_low/{cid}"] == pytest.approx(claims[cid]["ci"][0])
        assert metrics[f"ci_high/{cid}"] == pytest.approx(claims[cid]["ci"][1])
        assert metrics[f"p_value_holm/{cid}"] == pytest.approx(claims[cid]["p_value_holm"])
    # Per arm, under its confirmatory phase run: one summary run, test accuracy per epoch (mean over
    # seeds); never a trial (the trial count above is role=trial only).
    summaries = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'summary'")
    assert sorted(r.info.run_name for r in summaries) == sorted(_LEVEL)
    key = client.get_run(out.parent_run_id).data.tags["autonorm.study_key"]
    for r in summaries:
        assert r.data.tags["autonorm.study_key"] == key and r.data.tags["autonorm.kind"] == "search"
        assert r.data.tags["autonorm.phase"] == f"confirm-{r.info.run_name}"
        mean = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "test_accuracy_mean")}
        assert sorted(mean) == [1, 2]  # the planted trial reports 2 epochs
        final = table[table["arm"] == r.info.run_name]["test_accuracy"].mean()
        assert mean[2] == pytest.approx(final)


def test_a_claim_about_an_arm_tuned_at_the_edge_of_its_grid_is_inconclusive() -> None:
    from studies.kinds.search.workflow import gate_lr_edges

    claims = {
        "a": {"verdict": "refuted", "reasons": ["CI lies entirely in the opposite direction"]},
        "b": {"verdict": "supported", "reasons": []},
        "e": {"verdict": "supported", "reasons": []},
    }
    tuned = {
        "random_selector": {"at_range_edge": True},
        "autonorm": {"at_range_edge": False},
        "autonorm_s": {},
    }
    gate_lr_edges(claims, tuned)
    assert (
        claims["a"]["verdict"] == "inconclusive"
        and "lr-at-range-edge (random_selector)" in claims["a"]["reasons"]
    )
    assert claims["a"]["verdict_before_lr_gate"] == "refuted"
    assert claims["b"]["verdict"] == "supported" and claims["e"]["verdict"] == "supported"


def test_the_expected_cost_counts_only_the_claimed_hypotheses_never_the_reported_e() -> None:
    from studies.kinds.search.claims import REPORTED, claimed_sequential

    assert claimed_sequential("vision") == ("a", "b")
    assert claimed_sequential("text") == ("b", "c_attn", "c_mlp")
    assert not set(claimed_sequential("vision") + claimed_sequential("text")) & REPORTED
    vision = load_study(SEARCH, preset="vision")
    text = load_study(SEARCH, preset="text")
    assert vision.sequential_family == 2 and text.sequential_family == 3
    # plan's expected cost uses that family
    from studies.planning import _expected_cost

    assert vision.sequential is not None
    plan = dict.fromkeys(("trials", "wall_s", "cpu_hours", "gpu_hours"), 100.0)
    cost = _expected_cost(vision, vision.sequential, plan, dict.fromkeys(plan, 50.0))
    assert cost["expected"]["family"] == 2


def test_a_search_without_claims_has_a_family_of_one_and_no_adequacy_phase() -> None:
    from studies.kinds import KINDS

    bare = load_study(SEARCH, ["confirm=null"], preset="smoke")
    assert bare.sequential_family == 1
    assert [p.name for p in KINDS["search"].phases(bare)] == ["search"]
