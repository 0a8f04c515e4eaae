"""The batch-size study kind: its spec and plans (no Ray), LR selection, and the phases end to end on a
local Ray (the smoke preset with real training; a planted world with a cheap trial function)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from studies.adequacy import adequacy_plan
from studies.batchsize_correlation import DEFAULT_SPEC, main
from studies.kinds import StudyOutcome
from studies.kinds.batchsize.spec import BatchSizeStudySpec, cell_key
from studies.kinds.batchsize.workflow import select_learning_rates, trials_table
from studies.running import run_study_spec
from studies.schema import SpecError, load_spec
from workers.dotted import ROOT, with_values
from workers.members import MEMBERS_KEY
from workers.plan import expected_trials
from workers.records import TrialRecord
from workers.trainable import TrialSession

REPO_ROOT = Path(__file__).resolve().parents[2]


def smoke_spec(*overrides: str) -> BatchSizeStudySpec:
    spec: BatchSizeStudySpec = load_spec(
        DEFAULT_SPEC, list(overrides), preset="smoke", model=BatchSizeStudySpec
    )
    return spec


def _configs(plan: Any) -> list[dict[str, Any]]:
    """Every trial config a grid plan expands to (the product of its axes, applied like a trial)."""
    import itertools

    names = [name for name, _ in plan.grid]
    return [
        with_values(plan.base_config, dict(zip(names, values)))
        for values in itertools.product(*(v for _, v in plan.grid))
    ]


# ---- the spec and its plans ------------------------------------------------------------------------


@pytest.mark.parametrize("preset", [None, "smoke", "cnn", "local"])
def test_every_preset_plans_tuning_then_the_full_confirmatory_grid(preset: str | None) -> None:
    spec = load_spec(DEFAULT_SPEC, preset=preset, model=BatchSizeStudySpec)
    assert spec.kind == "batchsize"
    total = 0
    for budget in spec.budgets:
        tune = spec.tuning_plan(budget)
        configs = _configs(tune)
        assert len(configs) == expected_trials(tune)
        assert {c["seed"] for c in configs} == set(spec.lr_tuning.seeds)
        assert not set(spec.lr_tuning.seeds) & set(spec.seeds)  # tuning seeds are held out
        assert {c["training"]["batch_size"] for c in configs} == {spec.lr_tuning.reference_batch_size}
        assert {c["training"]["lr"] for c in configs} == set(spec.lr_tuning.grid())
        assert {c["model"]["layer"]["type"] for c in configs} == set(spec.arms)
        assert {c["training"]["budget"] for c in configs} == {budget}
        lr = {arm: 0.1 * (i + 1) for i, arm in enumerate(spec.arms)}
        # a sequential design runs its seeds in looks, each look its own plan; the fixed design one
        looks = spec.sequential.schedule() if spec.sequential else (len(spec.seeds),)
        configs, first = [], 0
        for j in range(1, len(looks) + 1):
            confirm = spec.confirmatory_plan(budget, lr, look=j)
            look_configs = _configs(confirm)
            assert len(look_configs) == expected_trials(confirm)
            assert {c["seed"] for c in look_configs} == set(
                spec.seeds[(looks[j - 2] if j > 1 else 0) : looks[j - 1]]
            )
            assert (confirm.sampler.type, confirm.scheduler.type) == ("grid", "fifo")
            configs += look_configs
            if j == 1:
                first = expected_trials(confirm)
        seeds = spec.seeds[: looks[-1]]
        assert len(configs) == len(spec.arms) * len(spec.batch_sizes) * len(seeds)
        cells = {(c["model"]["layer"]["type"], c["training"]["batch_size"], c["seed"]) for c in configs}
        assert cells == {(a, b, s) for a in spec.arms for b in spec.batch_sizes for s in seeds}
        assert all(c["training"]["lr"] == lr[c["model"]["layer"]["type"]] for c in configs)
        # the training-adequacy check: every (arm, B) cell at its η on one tuning seed for twice the
        # budget, and at the budget too where the tuning did not run that cell (lr_policy not tuned)
        check = adequacy_plan(spec, budget, lr)
        checked = _configs(check)
        assert check.name == f"tune-{budget}-adequacy"
        assert {c["seed"] for c in checked} == {spec.lr_tuning.seeds[0]}
        base = spec.base_config(budget=budget)["training"]
        doubled = [c for c in checked if c["training"]["epochs"] == 2 * base["epochs"]]
        assert {(c["model"]["layer"]["type"], c["training"]["batch_size"]) for c in doubled} == {
            (a, b) for a in spec.arms for b in spec.batch_sizes
        }
        assert all(c["training"]["lr"] == lr[c["model"]["layer"]["type"]] for c in checked)
        if base["max_updates"] is not None:
            assert {c["training"]["max_updates"] for c in doubled} == {2 * base["max_updates"]}
        assert len(checked) == len(doubled) * (1 if spec.lr_policy == "tuned" else 2)
        total += expected_trials(tune) + first + expected_trials(check)  # total_trials: a sequential
        # design's first look
    assert total == spec.total_trials


def test_default_spec_follows_the_protocol() -> None:
    spec = load_spec(DEFAULT_SPEC, model=BatchSizeStudySpec)
    training = spec.confirmatory_plan("epochs", dict.fromkeys(spec.arms, 0.1)).base_config["training"]
    assert (training["optimizer"], training["momentum"], training["weight_decay"]) == ("sgd", 0.0, 0.0)
    assert (training["schedule"], training["grad_clip"], training["label_smoothing"]) == (
        "constant",
        None,
        0.0,
    )
    assert training["lr_scaling"] == "constant"
    assert len(spec.seeds) == 8 and len(spec.batch_sizes) >= 4
    assert spec.budgets == ("epochs", "updates")
    assert spec.control_arms == ("linear", "linear_batchnorm", "linear_layernorm")
    assert spec.fix_arms == ("prenorm_l2", "prenorm_rms", "corrected")
    updates = spec.confirmatory_plan("updates", dict.fromkeys(spec.arms, 0.1)).base_config["training"]
    assert (updates["budget"], updates["max_updates"]) == ("updates", spec.training.max_updates)
    assert training["max_updates"] is None
    lo, hi = spec.lr_tuning.grid()[0], spec.lr_tuning.grid()[-1]
    assert (lo, hi) == (spec.lr_tuning.low, spec.lr_tuning.high) and hi >= 1e2  # wide enough for every arm
    cnn = load_spec(DEFAULT_SPEC, preset="cnn", model=BatchSizeStudySpec)
    assert cnn.control_arms == ("conv", "conv_batchnorm", "conv_layernorm") and cnn.fix_arms == ("patchnorm",)


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("control=prenorm_l2", "control"),
        ("arms=[linear,conv]", "arms.1"),
        ("budgets=[epochs,epochs]", "budgets"),
        ("batch_sizes=[1,8]", "batch_sizes"),
        ("batch_sizes=[8,8]", "batch_sizes"),
        ("model.layer={type: corrected}", "model.layer"),
        ("seeds=[0]", "seeds"),
        ("data.type=ptb_pos_sample", "data.type"),
        ("analysis.n_perm=10", "analysis.n_perm"),
        ("lr_tuning.metric=test_accuracy", "lr_tuning"),
        ("lr_tuning.seeds=[0,1000]", "lr_tuning.seeds"),
        ("lr_tuning.seeds=[1000]", "lr_tuning.seeds"),
        ("controls=[linear,prenorm_l2]", "controls.1"),
        ("controls=[linear_batchnorm]", "controls"),
        ("arms=[linear,linear_batchnorm]", "arms"),
    ],
)
def test_invalid_specs_name_the_field(override: str, path: str) -> None:
    with pytest.raises(SpecError) as err:
        smoke_spec(override)
    assert any(issue.path == path for issue in err.value.issues), err.value.format()


def test_updates_budget_without_max_updates_trains_epochs_at_the_reference_batch_size() -> None:
    spec = smoke_spec("budgets=[epochs,updates]")
    assert spec.training.max_updates is None
    training = spec.confirmatory_plan("updates", dict.fromkeys(spec.arms, 0.1)).base_config["training"]
    # None reaches the trial, which trains `epochs` epochs' worth of updates at the reference batch size.
    assert (training["budget"], training["max_updates"]) == ("updates", None)
    assert training["reference_batch_size"] == spec.lr_tuning.reference_batch_size
    assert smoke_spec("budgets=[epochs,updates]", "training.max_updates=90").training.max_updates == 90
    with pytest.raises(SpecError) as err:
        smoke_spec("training.max_updates=90")  # the smoke preset runs the epochs budget only
    assert [i.path for i in err.value.issues] == ["training.max_updates"]


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("training.reference_batch_size=64", "lr_tuning.reference_batch_size"),
        ("training.lr=0.3", "lr_tuning.low/high"),
        ("training.batch_size=32", "batch_sizes"),
        ("training.lr_scaling=sqrt", "lr_policy"),
        ("training.budget=updates", "budgets"),
    ],
)
def test_fields_the_study_sets_are_refused_naming_what_sets_them(override: str, instead: str) -> None:
    with pytest.raises(SpecError) as err:
        smoke_spec(override)
    (issue,) = err.value.issues
    assert issue.path == override.split("=")[0] and instead in issue.message


def test_minimal_spec_with_kind_and_name_validates(tmp_path: Path) -> None:
    path = tmp_path / "mini.yaml"
    path.write_text("kind: batchsize\nname: mini\n", encoding="utf-8")
    spec = load_spec(path, model=BatchSizeStudySpec)
    assert (spec.name, spec.model.type, spec.data.type, spec.budgets) == (
        "mini",
        "mlp",
        "fashion_mnist",
        ("epochs", "updates"),
    )
    # What a study writes next to its results loads again (no field the study sets is in it).
    again = tmp_path / "again.yaml"
    again.write_text(spec.to_yaml(), encoding="utf-8")
    assert load_spec(again, model=BatchSizeStudySpec).hash() == spec.hash()


def test_lr_policies() -> None:
    for policy in ("linear", "sqrt"):
        spec = smoke_spec(f"lr_policy={policy}")
        plan = spec.confirmatory_plan("epochs", dict.fromkeys(spec.arms, 0.1))
        assert plan.base_config["training"]["lr_scaling"] == policy
        assert plan.base_config["training"]["reference_batch_size"] == spec.lr_tuning.reference_batch_size
    spec = smoke_spec("lr_policy=tuned")
    tune = _configs(spec.tuning_plan("epochs"))
    assert {c["training"]["batch_size"] for c in tune} == set(spec.batch_sizes)  # every (arm, B) cell
    assert spec.tuning_trials == len(tune)
    table = {cell_key(a, b): 0.01 * b for a in spec.arms for b in spec.batch_sizes}
    confirm = spec.confirmatory_plan("epochs", table)
    assert confirm.base_config["training"]["lr_scaling"] == "constant"
    assert all(
        c["training"]["lr"] == pytest.approx(0.01 * c["training"]["batch_size"]) for c in _configs(confirm)
    )
    with pytest.raises(ValueError, match="no tuned learning rate"):
        spec.confirmatory_plan("epochs", dict.fromkeys(spec.arms, 0.1))


def _record(
    arm: str, b: int, seed: int, eta: float, status: str, value: float, **metrics: float
) -> TrialRecord:
    config = {"model": {"layer": {"type": arm}}, "training": {"batch_size": b, "lr": eta}, "seed": seed}
    return TrialRecord(
        f"t{arm}{b}{seed}{eta}",
        {},
        config,
        status,
        {"val_accuracy": value, "epoch": 3, **metrics},  # type: ignore[arg-type]
    )


def test_select_learning_rates_averages_seeds_penalises_failures_and_flags_edges() -> None:
    spec = smoke_spec()  # grid 0.01, 0.1, 1, 10
    grid = spec.lr_tuning.grid()
    trials = []
    for seed in spec.lr_tuning.seeds:
        for lr in grid:
            # linear: best at 0.1 on average, but one seed is better at 1 (means decide)
            v = {0.01: 0.5, 0.1: 0.8, 1.0: 0.9 if seed == 1000 else 0.6, 10.0: 0.1}[lr]
            trials.append(_record("linear", 32, seed, lr, "completed", v))
            # corrected: best at 10 (the edge); at 1 one seed diverged (worst), so 1 cannot win
            c = {0.01: 0.2, 0.1: 0.4, 1.0: 0.99, 10.0: 0.95}[lr]
            status = "diverged" if (lr == 1.0 and seed == 1001) else "completed"
            trials.append(_record("corrected", 32, seed, lr, status, c))
            trials.append(_record("linear_batchnorm", 32, seed, lr, "error", math.nan))
    table, record = select_learning_rates(spec, trials)
    assert table["linear"] == 0.1 and not record["linear"]["at_range_edge"]
    assert table["corrected"] == 10.0 and record["corrected"]["at_range_edge"]
    assert record["corrected"]["trials_failed"] == 1
    assert record["linear_batchnorm"]["no_learning_rate_trained"] is True
    assert record["linear"]["scores"]["0.1"] == pytest.approx(0.8)


def test_trials_table_reads_arm_batch_seed_status_loss_lr_and_updates() -> None:
    trials = [
        _record(
            "linear", 32, 1, 0.1, "completed", 0.8, test_accuracy=0.9, train_loss=0.3, lr=0.1, updates=90
        ),
        _record("linear", 8, 0, 0.1, "diverged", math.nan, train_loss=math.inf),
    ]
    df = trials_table(
        trials,
        metric="test_accuracy",
        budget="epochs",
        lr_record={"linear": {"at_range_edge": True}},
        lr_policy="constant",
    )
    assert list(df[["arm", "batch_size", "seed", "status", "budget"]].itertuples(index=False, name=None)) == [
        ("linear", 8, 0, "diverged", "epochs"),
        ("linear", 32, 1, "completed", "epochs"),
    ]
    assert math.isnan(df.loc[0, "test_accuracy"]) and df.loc[1, "test_accuracy"] == 0.9
    assert df.loc[1, "train_loss"] == 0.3 and df.loc[1, "updates"] == 90 and df.loc[1, "lr"] == 0.1
    assert df["lr_at_edge"].all()


def test_script_exits_2_on_a_bad_spec_and_dry_run_counts_every_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--preset", "smoke", "--set", "control=prenorm_l2"]) == 2
    err = capsys.readouterr().err
    assert "control" in err and "Traceback" not in err
    assert main(["--preset", "smoke", "--dry-run"]) == 0
    assert f"# kind batchsize: {smoke_spec().total_trials} trials in all," in capsys.readouterr().out


# ---- end to end on a local Ray -------------------------------------------------------------------


#: The end-to-end smoke below runs without the training-adequacy phase (its tests are about the two
#: phases, outputs, MLflow and stacking; the planted study and the compare smoke run the check).
NO_CHECK = ("analysis.adequacy.check=false",)
RUN_OUTPUT = "run_output.txt"  # beside the smoke's study directory: what its run printed


@pytest.fixture(scope="module")
def smoke(
    local_ray: None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[BatchSizeStudySpec, StudyOutcome]:
    storage = tmp_path_factory.mktemp("bs_smoke")
    # The smoke cut to 2 arms (the control and one fix arm) on its 3 batch sizes: 16 tuning + 12
    # confirmatory trials instead of 24 + 18.
    spec = smoke_spec(
        f"storage_path={storage}", "arms=[linear,corrected]", "max_concurrent=1", *NO_CHECK
    )  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
    printed = io.StringIO()  # what the run printed, kept for the test of its closing lines
    with contextlib.redirect_stdout(printed):
        out = run_study_spec(spec, progress=False)
    (storage / RUN_OUTPUT).write_text(printed.getvalue())
    print(printed.getvalue(), end="")
    return spec, out


@pytest.fixture(scope="module")
def smoke_off(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], tmp_path_factory: pytest.TempPathFactory
) -> tuple[BatchSizeStudySpec, StudyOutcome]:
    """The same smoke with one trial per process (``execution.stack: off``; the smoke itself stacks)."""
    spec = smoke[0]
    storage = tmp_path_factory.mktemp("bs_smoke_off")
    off = smoke_spec(
        f"storage_path={storage}",
        "arms=[linear,corrected]",
        "max_concurrent=1",
        "execution.stack=off",
        *NO_CHECK,
    )
    assert off.model_copy(update={"storage_path": spec.storage_path, "execution": spec.execution}) == spec
    return off, run_study_spec(off, progress=False)


@pytest.mark.ray
@pytest.mark.slow
def test_trials_run_and_wall_time_agree_in_the_run_status_ls_verdict_and_report(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], capsys: pytest.CaptureFixture[str]
) -> None:
    """One trial count and one wall time (issue 48): the run's closing lines and its summary,
    ``status``, ``ls``, ``verdict.json`` and ``report.md`` show the same numbers, the seconds equal
    where they are kept as seconds, the same minutes where they are printed. It runs first on the
    module's smoke (tests in a file run in order): a later test resumes the finished study, which
    rewrites its outputs with the resumed session's cost."""
    from studies import cli
    from workers.console import format_wall

    spec, out = smoke
    study_dir = Path(out.study_dir)
    resources = json.loads((study_dir / "verdict.json").read_text())["resources"]
    trials, wall = resources["trials"], resources["wall_time_s"]
    assert trials == spec.total_trials and wall > 0  # every phase's trials: tuning and confirmatory
    shown = format_wall(wall)
    # the run: its summary (--json) and its closing lines
    assert (out.summary["trials"], out.summary["wall_s"]) == (trials, wall)
    printed = (Path(spec.storage_path) / RUN_OUTPUT).read_text().splitlines()
    (closing,) = [ln for ln in printed if ln.startswith(f"[{spec.name}] trials run: ")]
    assert closing.split("trials run: ")[1].split()[0] == str(trials)
    walls = [ln for ln in printed if "wall time" in ln]
    assert closing in walls  # the runner's closing line (the one cost source)
    assert all(shown in ln for ln in walls), (shown, walls)
    # status
    assert cli.main(["status", str(study_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["trials"], status["wall_s"]) == (trials, wall)
    assert cli.main(["status", str(study_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"trials run: {trials} of {trials} planned" in lines and f"wall time: {shown}" in lines
    # ls
    assert cli.main(["ls", "--tracking-uri", out.tracking_uri, "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["study"] == spec.name]
    assert (row["trials"], row["wall_s"]) == (trials, wall)
    assert cli.main(["ls", "--tracking-uri", out.tracking_uri]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(spec.name)]
    assert line.split()[4] == str(trials) and shown in line
    # the report, and the one `report` regenerates from the study directory
    md = (study_dir / "report.md").read_text()
    assert f"- trials run: {trials}\n" in md and f"- wall time: {shown}\n" in md
    assert cli.main(["report", str(study_dir)]) == 0
    capsys.readouterr()
    again = json.loads((study_dir / "report" / "verdict.json").read_text())["resources"]
    assert (again["trials"], again["wall_time_s"]) == (trials, wall)
    md = (study_dir / "report" / "report.md").read_text()
    assert f"- trials run: {trials}\n" in md and f"- wall time: {shown}\n" in md


@pytest.mark.ray
@pytest.mark.slow
def test_the_smoke_stacked_and_off_gives_the_same_rows_accuracies_verdicts_and_labels(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], smoke_off: tuple[BatchSizeStudySpec, StudyOutcome]
) -> None:
    import pandas as pd

    (spec, stacked), (_, off) = smoke, smoke_off
    assert spec.execution.stack == "auto"
    keys = ["arm", "batch_size", "seed", "budget", "lr"]
    a = pd.read_csv(Path(stacked.study_dir) / "trials.csv").sort_values(keys).reset_index(drop=True)
    b = pd.read_csv(Path(off.study_dir) / "trials.csv").sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b) == 12 and a[keys].equals(b[keys])  # the same trials, the same tuned lr
    assert a["trial_id"].str.contains("-m").all() and not b["trial_id"].str.contains("-m").any()
    diff = (a["test_accuracy"] - b["test_accuracy"]).abs()
    assert diff.max() <= 0.05 and diff.mean() <= 0.01, diff.describe()
    assert (a["status"] == b["status"]).all()
    v, w = stacked.verdict, off.verdict
    assert v is not None and w is not None
    assert (v["study_verdict"], v["verdict"], v["controls"]) == (
        w["study_verdict"],
        w["verdict"],
        w["controls"],
    )
    assert {k: x.get("label") for k, x in v["arms"].items()} == {
        k: x.get("label") for k, x in w["arms"].items()
    }
    # fewer Tune trials: the confirmatory phase's 12 trials (6 cells of 2 seeds) ran as one group, one
    # per trial slot (max_concurrent: 1), its 6 stacks side by side
    confirm = Path(stacked.study_dir) / "confirm-epochs"
    groups = [json.loads(p.read_text()) for p in confirm.glob("*/params.json")]
    assert len(groups) == 1 and [len(s) for s in groups[0][MEMBERS_KEY]] == [2] * 6
    assert len(list((Path(off.study_dir) / "confirm-epochs").glob("*/params.json"))) == 12


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_writes_every_output_and_is_exploratory(smoke: tuple[BatchSizeStudySpec, StudyOutcome]) -> None:
    spec, out = smoke
    study_dir = Path(out.study_dir)
    assert study_dir == Path(spec.storage_path) / spec.name
    for name in (
        "verdict.json",
        "report.md",
        "report.html",
        "trials.csv",
        "study_spec.yaml",
        "lr_tuning.json",
    ):
        assert (study_dir / name).stat().st_size > 0, name
    for png in ("metric_vs_batch_size.png", "forest.png"):
        assert (study_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    verdict = json.loads((study_dir / "verdict.json").read_text())
    # 2 seeds x 3 batch sizes: underpowered by rule, whatever the data say.
    assert verdict["study_verdict"] == "inconclusive" and verdict["exploratory"] is True
    assert set(verdict["verdict"]) == set(spec.fix_arms)
    assert set(verdict["controls"]) == set(spec.control_arms)
    for arm in spec.fix_arms:
        assert verdict["verdict"][arm] == "inconclusive"
        assert "underpowered" in verdict["arms"][arm]["reasons"]
    md = (study_dir / "report.md").read_text()
    assert md.lstrip("# ").lower().startswith("study verdict") or "inconclusive" in md.splitlines()[0].lower()
    # The protocol (last) shows what each phase ran: batch sizes, seeds and the rates actually used.
    import pandas as pd
    import yaml

    assert md.index("## Plots") < md.index("## Protocol")
    block = md[md.index("## Protocol") :].split("```yaml\n", 1)[1].rsplit("```", 1)[0]
    protocol = yaml.safe_load(block)
    phases = protocol["phases"]
    assert list(phases) == ["tune-epochs", "confirm-epochs"]
    assert phases["tune-epochs"]["batch_sizes"] == [spec.lr_tuning.reference_batch_size]
    assert phases["tune-epochs"]["seeds"] == list(spec.lr_tuning.seeds)
    assert phases["confirm-epochs"]["batch_sizes"] == sorted(spec.batch_sizes)
    assert phases["confirm-epochs"]["seeds"] == sorted(spec.seeds)
    table = pd.read_csv(study_dir / "trials.csv")
    for row in table.itertuples():
        assert phases["confirm-epochs"]["lr"][row.arm][str(row.batch_size)] == pytest.approx(row.lr)
    lr_tuning = json.loads((study_dir / "lr_tuning.json").read_text())["epochs"]
    assert phases["tune-epochs"]["tuned_lr"] == {k: v["lr"] for k, v in lr_tuning.items()}
    assert "lr" not in protocol["training"] and "batch_size" not in protocol["training"]


@pytest.mark.ray
@pytest.mark.slow
def test_status_report_and_resume_work_on_the_study_directory(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd
    from mlflow import MlflowClient

    from studies import cli

    spec, out = smoke
    study_dir = out.study_dir
    assert cli.main(["status", study_dir, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["trials"] == status["expected_trials"] == spec.total_trials
    assert status["by_status"] == {"completed": spec.total_trials}
    assert status["study_verdict"] == out.verdict["study_verdict"]  # type: ignore[index]
    # The text view: aligned counts per status and per phase, no Python dict, and a tuning trial's
    # line shows its selection metric (validation), never the test set's.
    assert cli.main(["status", study_dir]) == 0
    text = capsys.readouterr().out
    assert "{" not in text and "}" not in text, text
    lines = text.splitlines()
    assert f"trials run: {spec.total_trials} of {spec.total_trials} planned" in lines
    phase_table = [
        ln.split() for ln in lines if ln.split()[:1] in (["phase"], ["tune-epochs"], ["confirm-epochs"])
    ]
    assert ["phase", "trials", "completed"] in phase_table
    assert ["tune-epochs", str(spec.tuning_trials), str(spec.tuning_trials)] in phase_table
    sections: dict[str, list[str]] = {}
    current = None
    for ln in lines:
        if ln.startswith("phase ") and ln.endswith(":"):
            current = ln.removeprefix("phase ").removesuffix(":")
            sections[current] = []
        elif current and ln.strip():
            sections[current].append(ln)
    assert set(sections) == {"tune-epochs", "confirm-epochs"}
    tune_header, *tune_rows = sections["tune-epochs"]
    assert "test_" not in "\n".join(sections["tune-epochs"]) and spec.lr_tuning.metric in tune_header.split()
    assert len(tune_rows) == spec.tuning_trials
    confirm_header = sections["confirm-epochs"][0].split()
    assert spec.analysis.metric in confirm_header
    # Columns line up: every row's cells start where the header's columns do.
    start = sections["confirm-epochs"][0].index(spec.analysis.metric)
    assert all(row[start - 1] == " " for row in sections["confirm-epochs"][1:])

    original = pd.read_csv(Path(study_dir) / "trials.csv")
    assert cli.main(["report", study_dir]) == 0
    printed = capsys.readouterr().out.splitlines()
    report = Path(study_dir) / "report"
    assert json.loads((report / "verdict.json").read_text())["verdict"] == out.verdict["verdict"]  # type: ignore[index]
    # The verdict and one line per hypothesis, before the paths.
    assert printed[0].startswith(f"study verdict: {out.verdict['study_verdict']}")  # type: ignore[index]
    hypotheses = out.verdict["hypotheses"]  # type: ignore[index]
    path_line = next(i for i, ln in enumerate(printed) if "report written to" in ln)
    for name, h in hypotheses.items():
        (row,) = [ln for ln in printed[:path_line] if ln.split()[:1] == [name]]
        assert row.split()[1] == h["verdict"]
    # A regenerated report keeps the run's MLflow run ids and wall time.
    again = pd.read_csv(report / "trials.csv")
    assert list(again.columns) == list(original.columns)
    assert again["mlflow_run_id"].notna().all()
    assert dict(zip(again["trial_id"], again["mlflow_run_id"])) == dict(
        zip(original["trial_id"], original["mlflow_run_id"])
    )
    md = (report / "report.md").read_text()
    assert "wall time: –" not in md and "wall time: " in md
    assert cli.main(["resume", study_dir]) == 0  # finished: restores every phase, runs nothing
    client = MlflowClient(tracking_uri=out.tracking_uri)
    exp = client.get_run(out.parent_run_id).info.experiment_id  # type: ignore[arg-type]
    trials = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'trial'")
    assert len(trials) == spec.total_trials  # nothing duplicated
    summaries = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'summary'")
    assert sorted(r.info.run_name for r in summaries) == sorted(spec.arms)  # none added by resume


@pytest.mark.ray
@pytest.mark.slow
def test_status_names_each_trial_by_its_mlflow_run_name(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], capsys: pytest.CaptureFixture[str]
) -> None:
    """``status`` rows carry the trial's MLflow run name (``corrected-B32-s0``), never Tune's id
    (``8883d_00000-m3``), one row per trial run."""
    from mlflow import MlflowClient

    from studies import cli

    _, out = smoke
    assert cli.main(["status", out.study_dir, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    client = MlflowClient(tracking_uri=out.tracking_uri)
    exp = client.get_run(out.parent_run_id).info.experiment_id  # type: ignore[arg-type]
    runs = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'trial'", max_results=5000)
    by_phase: dict[str, list[str]] = {}
    for run in runs:
        by_phase.setdefault(run.data.tags["autonorm.phase"], []).append(run.info.run_name)
    assert {p: sorted(n) for p, n in by_phase.items()} == {
        p: sorted(r["trial"] for r in rows if r["phase"] == p) for p in {r["phase"] for r in rows}
    }
    tune_ids = {r.data.tags["ray.trial_id"] for r in runs}
    assert not tune_ids & {r["trial"] for r in rows}
    confirm = [r for r in rows if r["phase"] == "confirm-epochs"]
    assert all(r["trial"] == f"{r['arm']}-B{r['batch_size']}-s{r['seed']}" for r in confirm), confirm


@pytest.mark.ray
@pytest.mark.slow
def test_extend_refuses_a_fixed_design_study_and_runs_nothing(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome], capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from studies import cli

    _, out = smoke
    client = MlflowClient(tracking_uri=out.tracking_uri)
    exp = client.get_run(out.parent_run_id).info.experiment_id  # type: ignore[arg-type]
    before = len(client.search_runs([exp], max_results=5000))
    spec_text = (Path(out.study_dir) / "study_spec.yaml").read_text()
    assert cli.main(["extend", out.study_dir, "--seeds", "2"]) == 2
    err = capsys.readouterr().err
    assert "fixed design" in err and "sequential" in err and "Traceback" not in err
    assert len(client.search_runs([exp], max_results=5000)) == before  # no run added
    assert (Path(out.study_dir) / "study_spec.yaml").read_text() == spec_text


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_trains_every_arm_with_its_own_tuned_lr_on_the_same_seeds(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome],
) -> None:
    import pandas as pd

    spec, out = smoke
    study_dir = Path(out.study_dir)
    table = pd.read_csv(study_dir / "trials.csv")
    assert len(table) == spec.expected_trials
    assert {"train_loss", "lr", "budget", "updates"} <= set(table.columns)
    cells = {arm: set(zip(g["batch_size"], g["seed"])) for arm, g in table.groupby("arm")}
    expected = {(b, s) for b in spec.batch_sizes for s in spec.seeds}
    assert all(c == expected for c in cells.values()), cells
    tuned = json.loads((study_dir / "lr_tuning.json").read_text())["epochs"]
    for arm, g in table.groupby("arm"):
        assert set(g["lr"]) == {tuned[arm]["lr"]}  # constant policy: one eta per arm, held across B
    # A corrected layer moves z by -eta*g where a plain one moves it by -eta*g*(|x|^2+1): its tuned
    # eta must be larger, or the comparison is between a trained and an untrained arm.
    assert tuned["corrected"]["lr"] > tuned["linear"]["lr"]
    # Every arm learned at B=8 (chance loss on digits is ln 10 = 2.30).
    small = table[table["batch_size"] == 8]
    assert (small.groupby("arm")["train_loss"].median() < 0.9 * math.log(10)).all()


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_mlflow_one_study_run_phases_nested_every_trial_a_leaf(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome],
) -> None:
    from mlflow import MlflowClient

    spec, out = smoke
    assert out.parent_run_id is not None
    client = MlflowClient(tracking_uri=out.tracking_uri)
    study = client.get_run(out.parent_run_id)
    exp = study.info.experiment_id
    assert study.info.status == "FINISHED"
    assert study.data.params["expected_trials"] == str(spec.total_trials)
    # The plan's estimate before launch and the actual cost, side by side on the study run.
    assert float(study.data.params["planned_trials"]) == spec.total_trials
    assert float(study.data.params["planned_wall_s"]) > 0
    assert study.data.metrics["actual_trials"] == spec.total_trials
    assert study.data.metrics["actual_wall_s"] > 0
    tops = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'study'")
    assert [r.info.run_id for r in tops] == [out.parent_run_id]
    phases = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{out.parent_run_id}'")
    # One name per phase: run name, phase tag (on the phase run and its trials) and folder agree.
    assert {r.data.tags["autonorm.phase"] for r in phases} == {"tune-epochs", "confirm-epochs"}
    assert {r.info.run_name for r in phases} == {"tune-epochs", "confirm-epochs"}
    assert "autonorm.phase" not in client.get_run(out.parent_run_id).data.tags
    trials = client.search_runs([exp], filter_string="tags.`autonorm.role` = 'trial'")
    assert len(trials) == spec.total_trials
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {p.info.run_id for p in phases}
    # Names a person reads in run lists and chart legends: arm, batch size (lr while tuning), seed.
    import re

    for r in trials:
        p = r.data.params
        assert re.fullmatch(r"[a-z_]+-B\d+(-lr[0-9.e+-]+)?-s\d+", r.info.run_name), r.info.run_name
        assert r.info.run_name.startswith(f"{p['model.layer.type']}-B{p['training.batch_size']}-")
        assert (
            r.info.run_name.endswith(f"-s{p['seed']}")
            and r.data.tags["autonorm.arm"] == p["model.layer.type"]
        )
        assert r.data.tags.get("mlflow.source.git.commit")
    tags = study.data.tags
    for arm, verdict in out.verdict["verdict"].items():  # type: ignore[index]
        assert tags[f"verdict/{arm}"] == verdict
    for arm, label in out.verdict["controls"].items():  # type: ignore[index]
        assert tags[f"control/{arm}"] == label
    assert tags["verdict/study"] == out.verdict["study_verdict"]  # type: ignore[index]
    artifacts = {a.path for a in client.list_artifacts(out.parent_run_id)}
    assert {"verdict.json", "report.md", "report.html", "lr_tuning.json", "forest.png"} <= artifacts


@pytest.mark.ray
@pytest.mark.slow
def test_smoke_mlflow_one_tag_selects_the_study_and_summary_runs_draw_arms_against_batch_size(
    smoke: tuple[BatchSizeStudySpec, StudyOutcome],
) -> None:
    """Issue 26's MLflow items on the smoke: one key/name on every run, phase tags = phase folders,
    no template in a tag, the training view, per-arm summary runs at step = B equal to trials.csv."""
    import pandas as pd
    from mlflow import MlflowClient

    spec, out = smoke
    client = MlflowClient(tracking_uri=out.tracking_uri)
    study = client.get_run(out.parent_run_id)  # type: ignore[arg-type]
    exp = client.get_experiment(study.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    by_role: dict[str, list[Any]] = {}
    for r in runs:
        by_role.setdefault(r.data.tags["autonorm.role"], []).append(r)
    assert {k: len(v) for k, v in by_role.items()} == {
        "study": 1,
        "phase": 2,
        "trial": spec.total_trials,
        "summary": len(spec.arms),  # one per arm under the one confirmatory phase; resume added none
    }
    key = study.data.tags["autonorm.study_key"]
    for r in runs:
        tags = r.data.tags
        assert tags["autonorm.study_key"] == key, (r.info.run_name, tags["autonorm.role"])
        assert tags["autonorm.study_name"] == spec.name
        assert tags["autonorm.kind"] == "batchsize"
        assert "autonorm.study" not in tags
        assert not [k for k, v in tags.items() if "{" in v], r.info.run_name
    assert len(client.search_runs([exp.experiment_id], f"tags.`autonorm.study_key` = '{key}'")) == len(runs)
    folders = {p.name for p in Path(out.study_dir).iterdir() if p.is_dir()}
    for r in by_role["phase"] + by_role["trial"] + by_role["summary"]:
        assert r.data.tags["autonorm.phase"] in folders
    assert "autonorm.phase" not in study.data.tags and "autonorm.budget" not in study.data.tags
    # Trial folders are named after the trials' readable names (the run names); a stacked member's
    # run names the folder of the group it trained in, itself named for the group (`<phase>-group<k>`).
    for r in by_role["trial"]:
        folder = Path(out.study_dir) / r.data.tags["autonorm.phase"] / _folder(r)
        assert (folder / "result.json").is_file(), folder
    trial_dirs = {p.parent.name for p in Path(out.study_dir).rglob("params.json")}
    assert trial_dirs == {_folder(r) for r in by_role["trial"]}

    (confirm,) = [r for r in by_role["phase"] if r.info.run_name == "confirm-epochs"]
    table = pd.read_csv(Path(out.study_dir) / "trials.csv")
    metric = spec.analysis.metric
    expected = table.groupby(["arm", "batch_size"])[metric].mean()
    assert {r.info.run_name for r in by_role["summary"]} == set(spec.arms)
    for r in by_role["summary"]:
        arm = r.info.run_name
        assert r.data.tags["autonorm.arm"] == arm and r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == confirm.info.run_id
        assert r.data.tags["autonorm.phase"] == "confirm-epochs"
        hist = {
            k: client.get_metric_history(r.info.run_id, f"{metric}_{k}")
            for k in ("mean", "ci_low", "ci_high")
        }
        mean = {m.step: m.value for m in hist["mean"]}
        assert len(hist["mean"]) == len(spec.batch_sizes)  # one point per batch size
        assert sorted(mean) == sorted(spec.batch_sizes)
        for b, value in mean.items():
            assert value == pytest.approx(expected[(arm, b)], abs=1e-9)
        low = {m.step: m.value for m in hist["ci_low"]}
        high = {m.step: m.value for m in hist["ci_high"]}
        assert sorted(low) == sorted(high) == sorted(spec.batch_sizes)
        assert all(low[b] <= mean[b] <= high[b] for b in mean)
    # The numbers the verdict rests on, once each; no duplicated cost metrics.
    metrics = study.data.metrics
    assert {"wall_time_s", "cpu_hours", "gpu_hours"}.isdisjoint(metrics)
    assert {"actual_wall_s", "actual_cpu_hours", "actual_trials"} <= set(metrics)
    arms = out.verdict["arms"]  # type: ignore[index]
    for arm in spec.fix_arms:
        res = arms[arm]
        assert metrics[f"slope/{arm}"] == pytest.approx(res["slope"])
        assert metrics[f"slope_ci_low/{arm}"] == pytest.approx(res["slope_ci"][0])
        assert metrics[f"slope_ci_high/{arm}"] == pytest.approx(res["slope_ci"][1])
        assert metrics[f"interaction_ci_low/{arm}"] == pytest.approx(res["interaction_ci"][0])
        assert metrics[f"spearman_rho/{arm}"] == pytest.approx(res["spearman_rho"])
        assert metrics[f"p_value_holm/{arm}"] == pytest.approx(res["p_value_holm"])


# ---- a planted world: the statistics see what was planted, through every phase ---------------------

#: Accuracy falls by 0.04 per doubling of B for `corrected` only; validation accuracy peaks at
#: lr = 0.1 for the controls and at lr = 10 for `corrected`, so tuning must find each arm's own eta.
_PLANTED_SLOPE = {"linear": 0.0, "linear_batchnorm": 0.0, "corrected": -0.04}
_BEST_LR = {"linear": 0.1, "linear_batchnorm": 0.1, "corrected": 10.0}


def planted_trial(config: dict[str, Any], session: TrialSession) -> None:
    arm = config["model"]["layer"]["type"]
    b = int(config["training"]["batch_size"])
    lr = float(config["training"]["lr"])
    seed = int(config["seed"])
    val = 0.95 - 0.1 * (math.log10(lr) - math.log10(_BEST_LR[arm])) ** 2
    noise = 0.004 * (((seed * 7 + b * 3) % 5) - 2)
    test = 0.8 + _PLANTED_SLOPE[arm] * math.log2(b) + noise
    session.report(
        {"epoch": 1, "val_accuracy": val, "test_accuracy": test, "train_loss": 0.3, "lr": lr, "updates": 1.0},
        status="completed",
    )


@pytest.mark.ray
@pytest.mark.slow
def test_planted_decline_is_supported_through_every_phase(local_ray: None, tmp_path: Path) -> None:
    spec = smoke_spec(
        f"storage_path={tmp_path}",
        "arms=[linear,corrected]",  # one control, one fix arm: 20 tuning + 40 confirmatory trials
        "batch_sizes=[8,16,32,64]",  # the fewest batch sizes and (below) seeds the analysis decides on
        "seeds=[0,1,2,3,4]",
        "lr_tuning.low=0.01",
        "lr_tuning.high=100.0",
        "lr_tuning.points=5",
        "analysis.n_boot=200",
        "analysis.n_perm=999",
        "max_concurrent=1",  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
    )
    out = run_study_spec(spec, trainable=planted_trial, progress=False)
    assert out.summary["tuned_lr"]["epochs"] == {arm: _BEST_LR[arm] for arm in spec.arms}
    verdict = out.verdict
    assert verdict is not None
    # The planted metric does not grow with training: twice the budget gains nothing, every (arm, B)
    # cell passes the training-adequacy check and nothing is gated by it.
    assert set(verdict["adequacy"]) == {f"{a}@{b}" for a in spec.arms for b in spec.batch_sizes}
    assert all(e["passed"] and e["gain"] == 0 for e in verdict["adequacy"].values())
    assert verdict["verdict"]["corrected"] == "supported", verdict["arms"]["corrected"]
    assert verdict["arms"]["corrected"]["slope"] == pytest.approx(-0.04, abs=0.005)
    assert verdict["controls"] == {"linear": "stable"}
    assert verdict["study_verdict"] == "supported"
    # A rerun of the finished study runs nothing and changes nothing.
    again = run_study_spec(spec, trainable=planted_trial, progress=False)
    assert again.parent_run_id == out.parent_run_id and again.summary["trials"] == out.summary["trials"]
    # An edited spec is refused, naming the field, and leaves the study as it was.
    with pytest.raises(SpecError) as err:
        run_study_spec(
            smoke_spec(*[f"storage_path={tmp_path}", "seeds=[0,1,2,3,5]"]), trainable=planted_trial
        )
    assert any(i.path.startswith("seeds") for i in err.value.issues)


def test_root_axis_is_the_grid_cell() -> None:
    assert ROOT == "@"


def _folder(run: Any) -> str:
    """A trial run's Tune folder: its own name, or its stacked group's (``autonorm.stack_group``)."""
    group = run.data.tags.get("autonorm.stack_group")
    if group is None:
        return str(run.info.run_name)
    # a group (several cells' stacks) is named for the group (`<phase>-group<k>`)
    assert re.fullmatch(rf"{re.escape(run.data.tags['autonorm.phase'])}-group\d{{2,}}", group), (
        group,
        run.info.run_name,
    )
    return str(group)


def test_a_decided_fix_arm_gets_no_more_seeds() -> None:
    from studies.kinds.batchsize.workflow import look_arms

    spec = load_spec(DEFAULT_SPEC, preset="local", model=BatchSizeStudySpec)
    assert spec.sequential is not None and len(spec.fix_arms) >= 2
    first, second, *rest = spec.fix_arms
    hypotheses = {first: {"decision": "reject"}, second: {"decision": "futile"}}
    hypotheses.update({arm: {"decision": "continue"} for arm in rest})
    verdict = {"budgets": {"epochs": {"looks": [{"n_seeds": 6, "hypotheses": hypotheses}]}}}
    arms = look_arms(spec, verdict, "epochs")
    assert arms is not None
    assert first not in arms and second not in arms  # decided: stopped
    assert set(rest) <= set(arms) and set(spec.control_arms) <= set(arms)  # open ones and controls go on
    assert look_arms(spec, {"budgets": {"epochs": {"looks": []}}}, "epochs") is None  # before a look
    done = {arm: {"decision": "reject"} for arm in spec.fix_arms}
    assert look_arms(spec, {"budgets": {"epochs": {"looks": [{"hypotheses": done}]}}}, "epochs") == []
    # the next look's plan holds just those arms, at every batch size
    lr = (
        {arm: 0.1 for arm in spec.arms}
        if spec.lr_policy != "tuned"
        else {cell_key(a, b): 0.1 for a in spec.arms for b in spec.batch_sizes}
    )
    plan = spec.confirmatory_plan(spec.budget_names[0], lr, look=2, arms=arms)
    planned = {c["model"]["layer"]["type"] for c in _configs(plan)}
    assert planned == set(arms)
