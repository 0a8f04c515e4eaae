"""Stacked trials (workers.members, workers.group_trial): a group of members trained in one process is,
to everything after Tune, the separate trials it replaces.

No Ray here: the group trial reports through an injected ``report_fn``. The Ray/MLflow side (one run
per member, trials.csv, the same verdicts) is tests/studies/test_stacked_study.py.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest

from studies.kinds import load_study
from studies.schema import ExecutionSpec, SpecError
from workers import members
from workers.dotted import ROOT, with_values
from workers.group_trial import autonorm_group_trial
from workers.members import (
    MEMBERS_KEY,
    MemberTrial,
    bundle_indices,
    bundle_points,
    grid_points,
    group_indices,
    group_points,
    member_history,
    member_params,
    member_stacks,
    pack,
    unpack,
    views,
)
from workers.trainable import TrialSession, autonorm_trial, resolve_trial_config

BASE: dict[str, Any] = {
    "model": {"type": "mlp", "preset": "tiny", "hidden": [16], "layer": {"type": "linear"}},
    "data": {"type": "digits", "subset": 300, "val_fraction": 0.2},
    "training": {"epochs": 3, "batch_size": 16, "lr": 0.1, "optimizer": "sgd", "momentum": 0.0},
    "seed": 0,
}


def test_grid_points_are_grouped_by_cell_in_near_equal_groups() -> None:
    cells = [
        {"model.layer.type": arm, "training.batch_size": b, "training.lr": lr}
        for arm in ("linear", "corrected")
        for b in (8, 32)
        for lr in (0.01, 0.1)
    ]
    points = grid_points(((ROOT, cells), ("seed", (0, 1, 2, 3, 4))))
    assert len(points) == 8 * 5
    groups = group_points(BASE, points, 4)
    # a cell: arm x batch size (lr and seed are member paths): 2 lrs x 5 seeds = 10 -> 4 + 3 + 3
    assert sorted(len(g) for g in groups) == [3] * 8 + [4] * 4
    assert sorted(map(repr, (p for g in groups for p in g))) == sorted(map(repr, points))
    for g in groups:
        cell = {(p[ROOT]["model.layer.type"], p[ROOT]["training.batch_size"]) for p in g}
        assert len(cell) == 1, g
    assert all(len(g) == 1 for g in group_points(BASE, points, 1))
    with pytest.raises(ValueError, match="at least 1"):
        group_points(BASE, points, 0)


def test_stacks_are_dealt_into_one_group_per_slot_of_near_equal_work() -> None:
    cells = [
        {"model.layer.type": arm, "training.batch_size": b}
        for arm in ("linear", "corrected", "linear_batchnorm")
        for b in (8, 16, 32, 64, 128)
    ]
    points = grid_points(((ROOT, cells), ("seed", (0, 1, 2, 3, 4, 5))))
    stacks = group_indices(BASE, points, 16)
    assert len(stacks) == 15  # one stack per cell: 6 seeds each
    groups = bundle_indices(BASE, points, 16, 2)
    assert len(groups) == 2  # 90 members: within the cap of 128 a group, one group per slot
    assert sorted(map(sorted, (s for g in groups for s in g))) == sorted(map(sorted, stacks))
    loads = [sum(members._stack_work(with_values(BASE, points[s[0]]), len(s)) for s in g) for g in groups]
    assert max(loads) / min(loads) < 1.2, loads  # dealt largest first: near-equal work
    for g in groups:
        assert g == sorted(g)  # each group keeps its stacks in grid order
    # more members than 2 x 128: two waves of two groups; a stack cap of 2 allows 16 members a group
    many = grid_points(((ROOT, cells), ("seed", tuple(range(20)))))
    assert len(bundle_indices(BASE, many, 16, 2)) == 4
    assert all(sum(map(len, g)) <= 16 for g in bundle_indices(BASE, many, 2, 2))
    assert len(bundle_indices(BASE, points[:6], 16, 4)) == 1  # never more groups than stacks
    # work is balanced within the cap: light stacks never pile more members into a group than it holds
    light = [
        {**p, "training.batch_size": 128} for p in grid_points(((ROOT, cells), ("seed", tuple(range(16)))))
    ]
    heavy = [{**p, "training.batch_size": 8, "training.epochs": 1000} for p in light[:16]]  # one long stack
    dealt = bundle_indices(BASE, heavy + light, 16, 2)
    assert all(sum(map(len, g)) <= 128 for g in dealt)
    assert sorted(i for g in dealt for s in g for i in s) == list(range(len(heavy + light)))
    # Tune's grid value of a group: one list of member params per stack, members numbered in order
    value = bundle_points(BASE, points, 16, 2)[0]
    config = {MEMBERS_KEY: value}
    assert member_params(config) == [p for stack in value for p in stack]
    flat = [0] + [len(s) for s in value]
    assert member_stacks(config) == [
        list(range(sum(flat[: i + 1]), sum(flat[: i + 2]))) for i in range(len(value))
    ]
    older = {MEMBERS_KEY: value[0]}  # a group as studies stored it before: one flat list, one stack
    assert member_stacks(older) == [list(range(len(value[0])))]
    assert member_params(older) == value[0]


def test_pack_unpack_and_a_members_history() -> None:
    rows = [
        pack(
            {"epoch": 1, "members": 2.0, "time_total_s": 4.0},
            {
                0: {"epoch": 1, "val_accuracy": 0.5, "status": "running"},
                1: {"epoch": 1, "val_accuracy": 0.4, "status": "running"},
            },
        ),
        pack(
            {"epoch": 2, "members": 2.0, "time_total_s": 8.0},
            {
                0: {"epoch": 2, "val_accuracy": 0.6, "status": "completed"},
                1: {"epoch": 1, "val_accuracy": 0.4, "status": "running"},
            },
        ),
        pack(
            {"epoch": 2, "members": 2.0, "time_total_s": 8.0},
            {
                0: {"epoch": 2, "val_accuracy": 0.6, "status": "completed"},
                1: {"epoch": 1, "train_loss": math.inf, "status": "diverged"},
            },
        ),
    ]
    last0, last1 = unpack(rows[-1], 0), unpack(rows[-1], 1)
    assert last0["val_accuracy"] == 0.6 and last0["status"] == "completed"
    assert last1["status"] == "diverged" and "val_accuracy" not in last1
    assert last0["time_total_s"] == 4.0  # its share of the group's 8 s
    assert [(r["epoch"], r["status"]) for r in member_history(rows, 0)] == [(1, "running"), (2, "completed")]
    # member 1: its epoch-1 row, then its divergence on that epoch replaces it (no repeated row)
    assert [(r["epoch"], r["status"]) for r in member_history(rows, 1)] == [(1, "diverged")]
    failed = [*rows[:1], {"epoch": 1, "status": "error", "attempts": 3.0}]
    assert member_history(failed, 1)[-1]["status"] == "error"
    # a report without member 1 (another stack's epoch, or its stack not started): the group's epoch
    # is not member 1's, so the MLflow callback queues nothing for it
    other = pack({"epoch": 3, "members": 2.0}, {0: {"epoch": 3, "val_accuracy": 0.7, "status": "running"}})
    assert "epoch" not in unpack(other, 1) and unpack(other, 0)["epoch"] == 3
    assert member_history([*rows[:1], other], 1) == member_history(rows[:1], 1)


class _Group:
    trial_id = "abc_00002"
    status = "TERMINATED"
    config: ClassVar[dict[str, Any]] = {MEMBERS_KEY: [{"seed": 3}, {"seed": 4}]}
    last_result: ClassVar[dict[str, Any]] = pack(
        {"epoch": 3, "node_id": "n1"}, {0: {"status": "completed"}, 1: {"status": "diverged"}}
    )
    path = "/somewhere/abc"


def test_a_group_trial_is_read_as_one_trial_per_member() -> None:
    members = views(_Group())
    assert [m.trial_id for m in members] == ["abc_00002-m0", "abc_00002-m1"]
    assert all(isinstance(m, MemberTrial) for m in members)
    assert [m.config for m in members] == [{"seed": 3}, {"seed": 4}]
    assert [m.last_result["status"] for m in members] == ["completed", "diverged"]
    assert members[1].last_result["node_id"] == "n1" and members[1].path == "/somewhere/abc"
    plain = type("T", (), {"config": {"seed": 1}, "trial_id": "x"})()
    assert views(plain) == [plain]


@pytest.mark.parametrize(("raw", "members"), [("auto", 16), ("off", 1), (False, 1), (4, 4)])
def test_execution_stack_values(raw: Any, members: int) -> None:
    assert ExecutionSpec(stack=raw).members() == members


def _spec(tmp_path: Path, execution: str) -> Path:
    text = Path("studies/specs/batchsize_correlation.yaml").read_text()
    path = tmp_path / "spec.yaml"
    path.write_text(text + execution)
    return path


def test_a_bad_stack_names_its_field_and_a_stored_spec_without_execution_runs_off(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"execution\.stack"):
        load_study(_spec(tmp_path, ""), ["execution.stack=0"], preset="smoke")
    with pytest.raises(SpecError, match=r"execution\.stack"):
        load_study(_spec(tmp_path, ""), ["execution.stack=fast"], preset="smoke")
    assert load_study(_spec(tmp_path, ""), ["execution.stack=off"], preset="smoke").execution.stack == "off"
    fresh = load_study(_spec(tmp_path, ""), preset="smoke")
    stored = load_study(_spec(tmp_path, ""), preset="smoke", stored=True)
    assert fresh.execution.members() == 16 and stored.execution.members() == 1


# ---- the group trial itself, against the separate trials it replaces ---------------------------------


def _run(
    fn: Any, config: Any, *, fail_after: int | None = None, resume: Any = None
) -> tuple[list[dict[str, Any]], Any]:
    reports: list[dict[str, Any]] = []

    def report(payload: dict[str, Any], checkpoint: Any = None) -> None:
        if fail_after is not None and len(reports) >= fail_after:
            raise KeyboardInterrupt  # the process dies here (nothing after is reported)
        reports.append(payload)

    session = TrialSession(report_fn=report)
    session.__dict__["device"] = "cpu"
    session.__dict__["node_id"] = "local"
    if resume is not None:
        session._resume_state, session._resume_loaded = resume, True
    states: list[Any] = []
    original = session.report

    def keep(metrics: Any, *, state: Any = None, status: str = "running") -> None:
        if state is not None:
            states.append(state)
        original(metrics, state=None, status=status)

    session.report = keep  # type: ignore[method-assign]
    with contextlib.suppress(KeyboardInterrupt):  # the process died
        fn(config, session)
    return reports, states


def _members(lrs: list[float], seeds: list[int]) -> list[dict[str, Any]]:
    return [
        resolve_trial_config(BASE, {"seed": s, "training.lr": lr}) for s, lr in zip(seeds, lrs, strict=True)
    ]


def test_members_end_where_their_separate_trials_end_and_a_diverged_one_stops_alone() -> None:
    configs = _members([0.1, 0.05, 1e6], [0, 1, 2])
    reports, _ = _run(autonorm_group_trial, configs)
    assert [r["status"] for r in reports] == ["running", "running", "running", "completed"]
    for k, config in enumerate(configs):
        alone, _ = _run(autonorm_trial, config)
        mine = member_history(reports, k)
        if k == 2:
            assert mine[-1]["status"] == "diverged" == alone[-1]["status"]
            continue
        assert [r["epoch"] for r in mine] == [r["epoch"] for r in alone] == [1, 2, 3]
        assert mine[-1]["status"] == "completed"
        for key in ("train_loss", "val_loss", "val_accuracy", "test_accuracy"):
            for a, b in zip(mine, alone, strict=True):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (k, key)


def test_a_group_reports_its_members_configs_first_and_last_only() -> None:
    # Tune keeps a trial's latest result in its snapshot and encodes it again at every result: the K
    # resolved configs ride on the first report (a reader of a running group) and the final one.
    import json

    from workers.trainable import CONFIG_RESULT_KEY

    configs = _members([0.1, 0.05], [0, 1])
    reports, _ = _run(autonorm_group_trial, configs)
    keys = [f"{CONFIG_RESULT_KEY}@m{k}" for k in range(2)]
    carried = [all(key in r for key in keys) for r in reports]
    assert carried == [True, False, False, True]
    for k, config in enumerate(configs):
        assert json.loads(reports[-1][keys[k]]) == json.loads(json.dumps(config, default=str))
        assert unpack(reports[-1], k)[CONFIG_RESULT_KEY] == reports[0][keys[k]]


def test_a_group_killed_mid_run_resumes_each_member_from_its_checkpoint() -> None:
    configs = _members([0.1, 0.05], [0, 1])
    whole, _ = _run(autonorm_group_trial, configs)
    first, states = _run(autonorm_group_trial, configs, fail_after=1)  # dies after epoch 1's report
    assert len(first) == 1
    rest, _ = _run(autonorm_group_trial, configs, resume=states[0])  # the checkpoint of the epoch reported
    assert [r["epoch"] for r in rest] == [2, 3, 3]  # epochs 2 and 3, then the final report
    for k in range(2):
        joined = member_history(first + rest, k)
        assert [r["epoch"] for r in joined] == [1, 2, 3]
        for a, b in zip(joined, member_history(whole, k), strict=True):
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6)


def _group_of_two_cells() -> tuple[list[dict[str, Any]], list[list[int]]]:
    # two cells: B = 16 for 3 epochs (two seeds) and B = 32 for 2 epochs (one seed, another arm)
    configs = _members([0.1, 0.05], [0, 1])
    other = resolve_trial_config(
        BASE, {"seed": 2, "training.batch_size": 32, "training.epochs": 2, "model.layer.type": "prenorm_l2"}
    )
    return [configs[0], other, configs[1]], [[0, 2], [1]]


def test_a_group_of_several_cells_trains_them_side_by_side_one_report_per_round() -> None:
    configs, stacks = _group_of_two_cells()
    reports, _ = _run(lambda c, s: autonorm_group_trial(c, s, stacks), configs)
    # rounds: epoch 1 of both cells, epoch 2 of both, epoch 3 of the first; then the final report
    assert [r["status"] for r in reports] == ["running", "running", "running", "completed"]
    assert [r["epoch"] for r in reports] == [1, 2, 3, 3]
    assert "epoch@m1" not in reports[2]  # the second cell ended at epoch 2: nothing new to report
    for k, config in enumerate(configs):
        alone, _ = _run(autonorm_trial, config)
        mine = member_history(reports, k)
        assert [r["epoch"] for r in mine] == [r["epoch"] for r in alone]
        assert mine[-1]["status"] == "completed"
        for a, b in zip(mine, alone, strict=True):
            for key in ("train_loss", "val_loss", "test_accuracy"):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (k, key)
        assert unpack(reports[-1], k)["epoch"] == alone[-1]["epoch"]


def test_members_of_a_group_with_one_seed_share_one_data_split() -> None:
    # A group holds every member's split at once: one copy per distinct seed, not per member.
    from workers.group_trial import _member_inputs

    configs = [
        resolve_trial_config(BASE, {"seed": 5, "model.layer.type": "linear"}),
        resolve_trial_config(BASE, {"seed": 5, "model.layer.type": "corrected"}),
        resolve_trial_config(BASE, {"seed": 6, "model.layer.type": "linear"}),
    ]
    splits, models, _ = _member_inputs(configs, "cpu")
    assert splits[0] is splits[1] and splits[2] is not splits[0]
    assert not splits[0].train[0].equal(splits[2].train[0])  # another seed, another split
    assert type(models[0]) is type(models[2])


def test_a_group_of_several_cells_killed_mid_run_resumes_every_member_once() -> None:
    configs, stacks = _group_of_two_cells()

    def train(c: Any, s: Any) -> None:
        autonorm_group_trial(c, s, stacks)

    whole, _ = _run(train, configs)
    for died_after in (1, 2):
        first, states = _run(train, configs, fail_after=died_after)
        assert len(first) == died_after
        checkpoint = states[died_after - 1]
        if died_after == 2:  # the second cell finished at epoch 2: its member is kept as finished
            assert 1 not in checkpoint["members"] and checkpoint["latest"][1]["status"] == "completed"
        rest, _ = _run(train, configs, resume=checkpoint)
        for k in range(3):
            joined = member_history(first + rest, k)
            assert [r["epoch"] for r in joined] == [r["epoch"] for r in member_history(whole, k)]
            for a, b in zip(joined, member_history(whole, k), strict=True):
                assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6)


def test_a_group_runs_only_through_group_entry_and_only_the_default_trial() -> None:
    from workers.group_trial import group_entry
    from workers.trainable import tune_entry

    group = {MEMBERS_KEY: [{"seed": 1}, {"seed": 2}]}
    with pytest.raises(ValueError, match="group_entry"):  # never resolved as one trial's config
        tune_entry(group, trial_fn=autonorm_trial, base_config=BASE)
    with pytest.raises(ValueError, match="default trial function"):
        group_entry(group, trial_fn=lambda config, session: None, base_config=BASE)
