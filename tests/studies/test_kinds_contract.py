"""The contract every study kind in ``studies.kinds.KINDS`` must pass (docs/extending.md).

Parametrized over the registry, the kind's name in each test id (``test_plan_matches_run[batchsize]``):
a new kind is tested by registering it. Each kind runs ONE tiny study (its ``example`` spec with its
``tiny`` overrides, the shared local Ray cluster, real trainable, sqlite MLflow) in a module-scoped fixture, with
``status`` polled while it runs; every assertion about a run reads that one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from studies.contract import STUDY_VERDICTS
from studies.kinds import (
    KINDS,
    SHARED_VERDICT_FIELDS,
    StudyKind,
    StudyOutcome,
    kind_for,
    load_study,
    presets_of,
)
from studies.kinds.pipeline import TunedDesignKind
from studies.planning import plan_study
from studies.schema import SpecError
from studies.scope import scope_line

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(KINDS)
#: A flat step time: plan's trial counts, not its clock, are under test (no calibration run).
CAL: dict[str, Any] = {"step_s": {"*": 0.01}, "eval_s": 0.1, "setup_s": 0.5}
HYPOTHESIS_FIELDS = {"verdict", "reasons", "estimate", "ci", "p_value", "p_value_holm"}


@dataclass
class Ran:
    """One kind's tiny study, run once, and what was observed along the way."""

    kind: StudyKind
    spec: Any
    outcome: StudyOutcome
    plan: dict[str, Any]
    during: list[dict[str, Any]] = field(default_factory=list)
    after: dict[str, Any] = field(default_factory=dict)


def _spec(kind: StudyKind, *extra: str) -> Any:
    path, preset = kind.example
    return load_study(ROOT / path, [*kind.tiny, *extra], preset=preset)


# ---- the registry ---------------------------------------------------------------------------------


def test_a_kind_from_another_package_comes_through_its_entry_point() -> None:
    # tests/kinds_plugin, installed by tests/conftest.py: a kind the repository does not ship.
    from studies.kinds import KIND_MODULES, KIND_SOURCES

    assert len(KINDS) == len(KIND_MODULES) + 1
    assert KIND_SOURCES["seedspread"].startswith(
        "entry point seedspread = autonorm_seedspread.kind:SeedSpreadKind"
    )
    assert "autonorm-seedspread" in KIND_SOURCES["seedspread"]
    assert all(KIND_SOURCES[k].startswith("studies.kinds.") for k in KINDS if k != "seedspread")


def test_two_kinds_of_one_name_are_refused_with_both_sources_named(tmp_path: Path) -> None:
    # A second package whose entry point registers a kind named like a shipped one.
    dist = tmp_path / "clashing_kind-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clashing-kind\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[autonorm_studies.kinds]\nsecond_compare = studies.kinds.compare.kind:CompareKind\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", "import studies.kinds"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "two study kinds are named 'compare'" in last, proc.stderr
    assert (
        "studies.kinds.compare.KIND" in last
        and "entry point second_compare" in last
        and "clashing-kind" in last
    )


# ---- without a run ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_presets_validate(name: str) -> None:
    kind = KINDS[name]
    path = ROOT / kind.example[0]
    presets = presets_of(path)
    assert kind.example[1] is None or kind.example[1] in presets
    for preset in [None, *presets]:
        spec = load_study(path, preset=preset)
        assert spec.kind == name and isinstance(spec, kind.spec_class())
        assert kind.total_trials(spec) > 0


@pytest.mark.parametrize("name", NAMES)
def test_invalid_input_gets_field_errors(name: str) -> None:
    kind = KINDS[name]
    cases = {
        "no_such_field": "no_such_field=1",  # unknown fields are refused
        "training.epochs": "training.epochs=0",  # a shared section's bound
        "name": "name=' bad name'",
    }
    for path, override in cases.items():
        with pytest.raises(SpecError) as err:
            _spec(kind, override)
        assert path in {i.path for i in err.value.issues}, err.value.format()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", ["{x: NAME}", "[NAME, NAME]", "NAME_not_a_kind"])
def test_malformed_kind_exits_2_without_traceback(name: str, bad: str, tmp_path: Path) -> None:
    text = (ROOT / KINDS[name].example[0]).read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("kind:")]
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join([f"kind: {bad.replace('NAME', name)}", *lines]) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "studies.cli", "validate", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "kind:" in proc.stderr and all(k in proc.stderr for k in KINDS), proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_phases_are_named_once(name: str) -> None:
    kind = KINDS[name]
    spec = _spec(kind)
    phases = kind.phases(spec)
    assert [p.name for p in phases] == [p.plan.name for p in phases]  # the folder is the phase's name
    assert len({p.name for p in phases}) == len(phases)
    assert all(p.name != spec.name for p in phases)  # no phase doubles as the study
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=2)
    assert [p["name"] for p in plan["phases"]] == [p.name for p in phases]
    assert plan["trials"] == kind.total_trials(spec) == sum(len(p.configs) for p in phases if not p.optional)


# ---- one tiny run per kind ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=NAMES)
def ran(request: pytest.FixtureRequest, local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    from studies.running import run_study_spec

    kind = KINDS[request.param]
    root = tmp_path_factory.mktemp(f"contract_{kind.name}")
    spec = _spec(kind, f"storage_path={root}", f"tracking.uri=sqlite:///{root}/mlflow.db")
    plan = plan_study(spec, kind_for(spec), calibration=CAL, calibrate=False, cpus=2)
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["outcome"] = run_study_spec(spec, progress=False)
        except BaseException as exc:  # re-raised in the test thread
            box["error"] = exc

    # Import Tune here first: the status reads below would otherwise import it in this thread while the
    # study's thread does (a circular import in ray.train seen half-initialised from the other thread).
    import ray.tune  # noqa: F401

    from workers.runner import run_study  # noqa: F401

    worker = threading.Thread(target=go, daemon=True)
    during: list[dict[str, Any]] = []
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.5)  # a small study (seedspread) runs in a few seconds
        if worker.is_alive():
            with contextlib.suppress(FileNotFoundError):  # the study directory does not exist yet
                during.append(kind.status(spec))
    if "error" in box:
        raise box["error"]
    return Ran(
        kind=kind, spec=spec, outcome=box["outcome"], plan=plan, during=during, after=kind.status(spec)
    )


def _mlflow(ran: Ran) -> tuple[Any, list[Any]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ran.outcome.tracking_uri)
    assert ran.outcome.parent_run_id is not None
    exp = client.get_run(ran.outcome.parent_run_id).info.experiment_id
    return client, client.search_runs([exp], max_results=5000)


def _verdict(ran: Ran) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(ran.outcome.study_dir) / "verdict.json").read_text())
    return data


@pytest.mark.ray
@pytest.mark.slow
def test_plan_matches_run(ran: Ran) -> None:
    _, runs = _mlflow(ran)
    trials = [r for r in runs if r.data.tags.get("autonorm.role") == "trial"]
    assert len(trials) == ran.plan["trials"] == ran.kind.total_trials(ran.spec)
    assert ran.after["trials"] == ran.after["expected_trials"] == ran.plan["trials"]
    assert sum(ran.after["by_status"].values()) == ran.plan["trials"]


@pytest.mark.ray
@pytest.mark.slow
def test_status_during_and_after(ran: Ran) -> None:
    assert ran.during, "status was never read while the study ran"
    planned = {p["name"] for p in ran.plan["phases"]}
    for snap in [*ran.during, ran.after]:
        assert snap["kind"] == ran.kind.name and snap["study"] == ran.spec.name
        assert 0 <= snap["trials"] <= snap["expected_trials"] == ran.plan["trials"]
        assert set(snap["phases"]) <= planned
    # Progress shows while the study runs (a read between two Tune state snapshots may count a
    # running phase's trials lower than the read before, so no monotonicity is asserted).
    assert max(s["trials"] for s in ran.during) > 0
    assert ran.after["study_verdict"] == _verdict(ran)["study_verdict"]


@pytest.mark.ray
@pytest.mark.slow
def test_verdict_has_the_shared_fields(ran: Ran) -> None:
    verdict = _verdict(ran)
    assert set(SHARED_VERDICT_FIELDS) <= set(verdict)
    assert verdict["kind"] == ran.kind.name
    assert verdict["study_verdict"] in STUDY_VERDICTS
    assert isinstance(verdict["hypotheses"], dict)
    for name, h in verdict["hypotheses"].items():
        # the shared fields, and (issue #47) the arms a tuned design's hypothesis rests on
        assert set(h) - {"arms"} == HYPOTHESIS_FIELDS, name
        if isinstance(ran.kind, TunedDesignKind):
            assert h["arms"] and set(h["arms"]) <= set(ran.spec.arm_names), name
        assert h["verdict"] in ("supported", "refuted", "inconclusive")
        assert isinstance(h["reasons"], list)
    if verdict["hypotheses"]:
        assert verdict["study_verdict"] != "none"
    assert (
        ran.outcome.verdict is not None and ran.outcome.verdict["study_verdict"] == verdict["study_verdict"]
    )


@pytest.mark.ray
@pytest.mark.slow
def test_verdict_names_its_scope(ran: Ran) -> None:
    """Issue #39: every kind's verdict says what it was decided on (data, model, budget, batch sizes,
    seeds used, device, precision, each arm's mean metric), on the study run too; a shipped kind's
    report opens with the verdict, then the scope."""
    scope = _verdict(ran)["scope"]
    configs = [c for p in ran.kind.phases(ran.spec) for c in p.configs]
    assert scope["data"]["name"] == str(configs[0]["data"]["type"])
    rows = scope["data"]["rows"]
    assert set(rows) == {"train", "val", "test"} and all(rows[k] > 0 for k in rows)
    assert len(scope["data"]["fingerprint"]) == 64
    assert scope["model"]["type"] == configs[0]["model"]["type"]
    assert scope["model"]["preset"] == configs[0]["model"].get("preset", "paper")
    low, high = scope["model"]["params_range"]
    assert 0 < low <= high == scope["model"]["params"]
    epochs = {c["training"]["epochs"] for c in configs if c["training"].get("budget", "epochs") == "epochs"}
    assert scope["budget"]["epochs"] in (*epochs, sorted(epochs))
    assert set(scope["batch_sizes"]) <= {int(c["training"]["batch_size"]) for c in configs}
    assert 2 <= scope["seeds"] <= len({c["seed"] for c in configs})
    assert (scope["device"], scope["precision"]) == ("CPU", "fp32")
    assert scope["arms"] and all(0.0 <= v <= 1.0 for v in scope["arms"].values())  # accuracies
    client, _ = _mlflow(ran)
    tags = client.get_run(ran.outcome.parent_run_id).data.tags  # type: ignore[arg-type]
    assert tags["autonorm.scope.data"].startswith(f"{scope['data']['name']}, {rows['train']:,} train rows")
    assert tags["autonorm.scope.model"].startswith(scope["model"]["name"])
    assert str(scope["budget"]["epochs"]) in tags["autonorm.scope.budget"]
    report = (Path(ran.outcome.study_dir) / "report.md").read_text(encoding="utf-8").splitlines()
    assert report[1] == f"*Scope: {scope_line(scope)}*", report[:3]
    from studies.kinds.pipeline import TunedDesignKind

    if isinstance(ran.kind, TunedDesignKind):  # how its trials ran, in its record and report
        execution = _verdict(ran)["execution"]
        assert execution == {"stack": str(ran.spec.execution.stack), "not_stacked": {}}, execution
        assert any(line.startswith("- training: ") for line in report), report
    assert report[0].startswith("**") and "Scope" not in report[0]


@pytest.mark.ray
@pytest.mark.slow
def test_report_regenerates_the_same_verdicts(ran: Ran, tmp_path: Path) -> None:
    md = ran.kind.report(ran.spec, tmp_path / "report")
    assert md.is_file() and md.stat().st_size > 0
    again = json.loads((tmp_path / "report" / "verdict.json").read_text())
    first = _verdict(ran)
    assert again["study_verdict"] == first["study_verdict"]
    assert {k: h["verdict"] for k, h in again["hypotheses"].items()} == {
        k: h["verdict"] for k, h in first["hypotheses"].items()
    }
    assert {k: h["p_value"] for k, h in again["hypotheses"].items()} == {
        k: h["p_value"] for k, h in first["hypotheses"].items()
    }


@pytest.mark.ray
@pytest.mark.slow
def test_phase_names_agree_everywhere(ran: Ran) -> None:
    study_dir = Path(ran.outcome.study_dir)
    folders = {p.name for p in study_dir.iterdir() if p.is_dir() and any(p.glob("experiment_state-*.json"))}
    ran_phases = {p["name"] for p in ran.plan["phases"] if not p["optional"]}
    assert folders == ran_phases
    assert set(ran.after["phases"]) == ran_phases
    client, runs = _mlflow(ran)
    phase_runs = [r for r in runs if r.data.tags.get("autonorm.role") == "phase"]
    assert {r.info.run_name for r in phase_runs} == ran_phases
    assert all(r.data.tags["autonorm.phase"] == r.info.run_name for r in phase_runs)
    assert {r.data.tags.get("mlflow.parentRunId") for r in phase_runs} == {ran.outcome.parent_run_id}
    by_id = {r.info.run_id: r.info.run_name for r in phase_runs}
    for t in (r for r in runs if r.data.tags.get("autonorm.role") == "trial"):
        assert t.data.tags["autonorm.phase"] == by_id[t.data.tags["mlflow.parentRunId"]]
    study = client.get_run(ran.outcome.parent_run_id)
    assert "autonorm.phase" not in study.data.tags
    assert study.data.tags.get("autonorm.role") == "study"


@pytest.mark.ray
@pytest.mark.slow
def test_reproduce_recomputes_the_verdict_from_mlflow_alone(
    ran: Ran, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``autonorm-study reproduce``: the kind's analysis on the trial runs in MLflow gives the logged
    verdict, with the study directory out of the way (moved, then put back for the other tests)."""
    from studies.cli import main

    study_dir = Path(ran.outcome.study_dir)
    away = tmp_path / "away"
    study_dir.rename(away)
    try:
        code = main(["reproduce", str(ran.outcome.parent_run_id), "--tracking-uri", ran.outcome.tracking_uri])
    finally:
        away.rename(study_dir)
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-1] == "reproduced", out
    # The study directory names the run too (its study_spec.yaml says where the tracking store is).
    assert main(["reproduce", str(study_dir)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced"


@pytest.mark.ray
@pytest.mark.slow
def test_results_export_reproduces_offline(
    ran: Ran, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue #39 item 5: ``results --export`` copies the study's verdict, spec, provenance and trial
    tables (kilobytes), and the run's report and plots, into ``results/<study>/``; ``reproduce`` on the copy, whose run no tracking
    store holds, re-analyses those tables to the stored verdict and creates no store; the page has
    the study's row and one per hypothesis, with the study run's id. A kind that keeps no trial table
    (the plug-in test kind) cannot be re-analysed offline, and says so (exit 2)."""
    from studies.cli import main
    from studies.offline import TABLE_FILES

    root, page = tmp_path / "results", tmp_path / "results.md"
    assert main(["results", "--export", ran.outcome.study_dir, "--to", str(root), "--output", str(page)]) == 0
    capsys.readouterr()
    stored = root / ran.spec.name
    files = {p.name for p in stored.iterdir()}
    tables = {name for name in TABLE_FILES if (Path(ran.outcome.study_dir) / name).is_file()}
    report = {
        p.name for p in Path(ran.outcome.study_dir).iterdir() if p.name == "report.md" or p.suffix == ".png"
    }
    assert files == {"verdict.json", "study_spec.yaml", "provenance.json", *tables, *report} | (
        {"gate_logs.json"} if "confirm_trials.csv" in tables else set()
    )
    assert sum(p.stat().st_size for p in stored.iterdir() if p.suffix != ".png") < 200_000
    provenance = json.loads((stored / "provenance.json").read_text(encoding="utf-8"))
    assert provenance["study_run"]["run_id"] == ran.outcome.parent_run_id
    assert len(provenance["data_fingerprint"]) == 64  # the run's own record, kept in its directory
    assert (Path(ran.outcome.study_dir) / "provenance.json").is_file()
    code = main(["reproduce", str(stored)])
    out, err = capsys.readouterr()
    if tables:
        assert code == 0 and out.strip().splitlines()[-1] == "reproduced", out
        assert "from its own tables" in out.splitlines()[0], out
    else:
        assert code == 2 and "nothing to re-analyse offline" in err, (out, err)
    assert not [p for p in tmp_path.rglob("*") if p.suffix == ".db" or p.name == "mlruns"]
    # The page's section of the study: its run id once, then one row per hypothesis.
    text = page.read_text(encoding="utf-8")
    section = text[
        text.index(f"### `{stored}`") if f"### `{stored}`" in text else text.index(f"/{ran.spec.name}`") :
    ]
    rows = [
        line
        for line in section.split("\n### ")[0].splitlines()[3:]
        if line.startswith("| ") and not line.startswith("| hypothesis |")
    ]
    assert len(rows) == len(_verdict(ran)["hypotheses"])
    assert text.count(str(ran.outcome.parent_run_id)) == 1
