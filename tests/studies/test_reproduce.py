"""``autonorm-study reproduce``: a verdict recomputed from its MLflow record alone, and a rerun.

One tiny batch-size study (the kind's contract ``tiny`` design: 20 one-epoch trials, real training
on digits) runs once per module on the shared local Ray against a real MLflow server (PostgreSQL,
artifacts in S3); its study directory is deleted right after, so everything below reads MLflow only.
The tests that change the record (a metric overwritten) come last.

The checkout's cleanliness is pinned (``AUTONORM_GIT_DIRTY=false``, what ``submit`` jobs use) for
the in-process study and its rerun, so these tests do not depend on whether the developer's working
tree has edits; the real ``git status`` check is exercised in a temporary clone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from studies.cli import main
from studies.kinds import KINDS, StudyOutcome, load_study
from studies.provenance import data_files, data_fingerprint, git_dirty
from studies.reproduce import Difference, _parse_target, compare_verdicts
from studies.running import run_study_spec
from tests.services import MlflowServer
from workers.tracking.replay import read_trial_params

ROOT = Path(__file__).resolve().parents[2]
VERSIONED = ("torch", "ray", "optuna", "mlflow", "numpy", "pydantic", "autonorm-studies")


# ---- without services --------------------------------------------------------------------------


def test_verdicts_compare_to_1e_9_and_name_the_hypothesis() -> None:
    logged = {
        "study_verdict": "inconclusive",
        "hypotheses": {
            "corrected": {"verdict": "inconclusive", "reasons": ["underpowered"], "estimate": 0.1}
        },
        "arms": {"corrected": {"slope_ci": [-0.5, 0.25]}},
    }
    same = json.loads(json.dumps(logged))
    same["hypotheses"]["corrected"]["estimate"] = 0.1 + 1e-12
    assert compare_verdicts(logged, same) == []
    other = json.loads(json.dumps(logged))
    other["hypotheses"]["corrected"]["estimate"] = 0.1 + 1e-6
    other["hypotheses"]["corrected"]["reasons"] = []
    other["arms"]["corrected"]["slope_ci"][1] = 0.3
    other["study_verdict"] = "supported"
    diffs = compare_verdicts(logged, other)
    assert Difference("corrected", "estimate", 0.1, 0.1 + 1e-6) in diffs
    assert Difference("corrected", "reasons", ["underpowered"], []) in diffs
    assert Difference("corrected", "arms.corrected.slope_ci.1", 0.25, 0.3) in diffs
    assert Difference("study", "study_verdict", "inconclusive", "supported") in diffs
    assert len(diffs) == 4
    assert any(d.line().startswith("corrected: estimate: logged 0.1, recomputed 0.100001") for d in diffs)
    # what the run cost is not what it found: a re-analysis has no wall time of its own
    spent = json.loads(json.dumps(logged)) | {"resources": {"wall_time_s": 25.0, "cpu_hours": 0.01}}
    assert compare_verdicts(spent, logged | {"resources": {"wall_time_s": None}}) == []


def test_run_argument_forms(tmp_path: Path) -> None:
    rid = "0123456789abcdef0123456789abcdef"
    assert _parse_target(rid, "http://x:1") == ("http://x:1", rid, None)
    assert _parse_target(f"http://127.0.0.1:5000/#/experiments/3/runs/{rid}", None) == (
        "http://127.0.0.1:5000",
        rid,
        None,
    )
    assert _parse_target(str(tmp_path), None) == (None, None, tmp_path)
    assert main(["reproduce", "not-a-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2


def test_data_fingerprint_follows_the_file_contents(tmp_path: Path) -> None:
    table = tmp_path / "data.csv"
    table.write_text("a,b,y\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(40)), encoding="utf-8")
    files = data_files({"type": "table", "path": str(table), "target": "y"})
    assert [f["file"] for f in files] == [str(table.resolve())]
    assert files[0]["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    before = data_fingerprint(files)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(table, moved / "data.csv")
    assert (
        data_fingerprint(data_files({"type": "table", "path": str(moved / "data.csv"), "target": "y"}))
        == before
    )
    table.write_text(table.read_text(encoding="utf-8") + "40,80,0\n", encoding="utf-8")
    assert data_fingerprint(data_files({"type": "table", "path": str(table), "target": "y"})) != before
    digits = data_files({"type": "digits"})  # a shipped set: the loader's own file is found
    assert any(f["name"] == "digits.csv.gz" for f in digits)
    assert not any(f["file"].endswith((".py", ".css")) for f in digits)
    from autonorm_core.data import load_dataset

    load_dataset("digits", seed=3)  # parsed once per process: provenance still sees the file it reads
    assert data_files({"type": "digits"}) == digits


# ---- one tiny study against a real MLflow server ----------------------------------------------------


@dataclass
class Smoke:
    server: MlflowServer
    spec: Any
    outcome: StudyOutcome
    root: Path

    @property
    def uri(self) -> str:
        return self.server.tracking_uri

    @property
    def run_id(self) -> str:
        assert self.outcome.parent_run_id is not None
        return self.outcome.parent_run_id

    def client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def trial_runs(self, run_id: str | None = None) -> list[Any]:
        from workers.tracking.replay import TrackedTrials

        tracked = TrackedTrials(self.client(), run_id or self.run_id)
        return [r for runs in tracked.runs.values() for r in runs]


@pytest.fixture(scope="module")
def smoke(
    mlflow_server: MlflowServer, local_ray: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Smoke]:
    root = tmp_path_factory.mktemp("reproduce")
    kind = KINDS["batchsize"]
    path, preset = kind.example
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUTONORM_GIT_DIRTY", "false")
        env.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        spec = load_study(
            ROOT / path,
            [
                *kind.tiny,
                f"storage_path={root / 'runs'}",
                f"tracking.uri={mlflow_server.tracking_uri}",
                f"tracking.experiment=reproduce-{root.name}",
            ],
            preset=preset,
        )
        outcome = run_study_spec(spec, progress=False)
        shutil.rmtree(outcome.study_dir)  # MLflow's store and artifacts are all that is left
        yield Smoke(mlflow_server, spec, outcome, root)


@pytest.mark.services
@pytest.mark.ray
@pytest.mark.slow
def test_study_run_carries_provenance(smoke: Smoke) -> None:
    client = smoke.client()
    run = client.get_run(smoke.run_id)
    tags = run.data.tags
    for pkg in VERSIONED:
        assert tags.get(f"autonorm.version.{pkg}"), pkg
    assert tags["autonorm.git_dirty"] == "false"
    assert tags["mlflow.source.git.commit"] == tags["autonorm.git_commit"]
    assert int(tags["autonorm.machine.cpu_count"]) == os.cpu_count()
    assert tags["autonorm.machine.cpu_model"] and "autonorm.machine.gpu_count" in tags
    assert tags["autonorm.seeds.confirm-epochs"] == ",".join(str(s) for s in smoke.spec.seeds)
    assert tags["autonorm.seeds.tune-epochs"] == ",".join(str(s) for s in smoke.spec.lr_tuning.seeds)
    local = client.download_artifacts(smoke.run_id, "provenance.json", str(smoke.root))
    record = json.loads(Path(local).read_text(encoding="utf-8"))
    assert (
        tags["autonorm.data_fingerprint"]
        == record["data_fingerprint"]
        == data_fingerprint(record["data_files"])
    )
    digits = [f for f in record["data_files"] if f["name"] == "digits.csv.gz"]
    assert digits and digits[0]["sha256"] == hashlib.sha256(Path(digits[0]["file"]).read_bytes()).hexdigest()

    # Every trial run carries what re-analysis needs.
    trials = smoke.trial_runs()
    assert len(trials) == KINDS["batchsize"].total_trials(smoke.spec)
    for t in trials:
        params = t.data.params
        assert {"seed", "training.batch_size", "training.lr", "model.layer.type", "training.budget"} <= set(
            params
        )
        assert t.data.tags["autonorm.trial_status"] == "completed"
        assert t.data.tags["autonorm.phase"] in ("tune-epochs", "confirm-epochs")
        assert read_trial_params(t.data.tags["autonorm.trial_params"])  # Tune's own parameters
        assert {"test_accuracy", "val_accuracy", "train_loss", "epoch"} <= set(t.data.metrics)
        steps = [m.step for m in client.get_metric_history(t.info.run_id, "test_accuracy")]
        assert steps == [1]  # one epoch, one step per epoch


@pytest.mark.services
@pytest.mark.ray
@pytest.mark.slow
def test_reproduce_from_mlflow_alone(smoke: Smoke, capsys: pytest.CaptureFixture[str]) -> None:
    assert not Path(smoke.outcome.study_dir).exists()
    assert main(["reproduce", smoke.run_id, "--tracking-uri", smoke.uri]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "reproduced"
    # The UI link works as well (the server's address is the tracking URI).
    exp = smoke.client().get_run(smoke.run_id).info.experiment_id
    assert main(["reproduce", f"{smoke.uri}/#/experiments/{exp}/runs/{smoke.run_id}"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced"


@pytest.mark.services
@pytest.mark.ray
@pytest.mark.slow
def test_rerun_on_cpu_gives_the_same_trials(
    smoke: Smoke, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTONORM_GIT_DIRTY", "false")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    storage = smoke.root / "rerun"
    code = main(
        ["reproduce", smoke.run_id, "--tracking-uri", smoke.uri, "--rerun", "--storage-path", str(storage)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "reproduced"
    client = smoke.client()
    again = client.search_runs(
        [client.get_run(smoke.run_id).info.experiment_id],
        filter_string=f"tags.`autonorm.reproduces` = '{smoke.run_id}'",
    )
    assert len(again) == 1 and again[0].data.tags["autonorm.role"] == "study"
    assert (storage / again[0].info.run_name / "verdict.json").is_file()  # a new study directory
    # The same trials with the same final metrics, read here without the code under test.
    before = {(r.data.tags["autonorm.phase"], r.info.run_name): r.data.metrics for r in smoke.trial_runs()}
    after = {
        (r.data.tags["autonorm.phase"], r.info.run_name): r.data.metrics
        for r in smoke.trial_runs(again[0].info.run_id)
    }
    assert set(before) == set(after) and len(before) == KINDS["batchsize"].total_trials(smoke.spec)
    for key, metrics in before.items():
        for name in ("test_accuracy", "val_accuracy", "train_loss"):
            assert after[key][name] == metrics[name], (key, name)


@pytest.mark.services
@pytest.mark.ray
@pytest.mark.slow
def test_rerun_refused_for_modified_code(smoke: Smoke, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    head = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    logged = smoke.client().get_run(smoke.run_id).data.tags["mlflow.source.git.commit"]
    assert head == logged  # the clone is the study's commit: only the modification differs
    assert git_dirty({}, clone) == "false"
    with (clone / "README.md").open("a", encoding="utf-8") as f:
        f.write("\nlocal edit\n")
    assert git_dirty({}, clone) == "true"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTONORM_GIT", "MLFLOW_"))}
    env["PYTHONPATH"] = str(clone)

    def reproduce(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "studies.cli",
                "reproduce",
                smoke.run_id,
                "--tracking-uri",
                smoke.uri,
                *extra,
            ],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    dirty = reproduce("--rerun", "--storage-path", str(tmp_path / "never"))
    assert dirty.returncode == 2, dirty.stdout + dirty.stderr
    assert "modified tracked files" in dirty.stderr and "Traceback" not in dirty.stderr
    assert not (tmp_path / "never").exists()
    subprocess.run(
        ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "edit"],
        check=True,
    )
    moved = reproduce("--rerun", "--storage-path", str(tmp_path / "never"))
    assert moved.returncode == 2 and f"the study ran at commit {logged}" in moved.stderr, moved.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.services
@pytest.mark.ray
@pytest.mark.slow
def test_an_overwritten_metric_is_named(smoke: Smoke, capsys: pytest.CaptureFixture[str]) -> None:
    """Last in the module: it changes the record."""
    client = smoke.client()
    confirm = sorted(
        (r for r in smoke.trial_runs() if r.data.tags["autonorm.phase"] == "confirm-epochs"),
        key=lambda r: r.info.run_name,
    )
    victim = confirm[0]
    old = victim.data.metrics["test_accuracy"]
    client.log_metric(victim.info.run_id, "test_accuracy", 1.0 - old, step=100)  # a later step wins
    assert main(["reproduce", smoke.run_id, "--tracking-uri", smoke.uri]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("not reproduced:")
    named = [ln for ln in lines if ln.startswith(f"{victim.info.run_name}: test_accuracy: logged {old!r}")]
    assert named, lines
    arm = victim.data.params["model.layer.type"]
    # The verdict's numbers moved too: the recomputed analysis saw the new value.
    assert any(ln.startswith(f"{arm}: ") or ln.startswith("linear: ") for ln in lines if ln not in named), (
        lines
    )
