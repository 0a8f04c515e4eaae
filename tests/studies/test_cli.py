"""``autonorm-study`` and the study entry points: exit codes, error output, submit wiring."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from studies import cli, entrypoints
from studies.kinds import kind_for, kind_of, load_study
from studies.running import run_study_spec
from studies.study_dir import SPEC_FILE, StudyDir
from tests.studies.broken_cases import load_cases

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "studies" / "specs" / "autonorm_search.yaml"
CASES = {c.id: c for c in load_cases()}
# A spread of failure kinds for the real-process check (the corpus runs in-process in test_spec.py).
SUBPROCESS_SAMPLE = [
    "malformed_yaml",
    "duplicate_nested_key",
    "top_level_list",
    "python_object_tag",
    "negative_lr",
    "eps_h_above_ln2",
    "negative_gpu",
    "unknown_norm_field",
    "search_beta_without_condition",
    "override_bad_tau",
]


def _run(
    args: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow  # one CLI subprocess per case: CI runs them, the quick loop does not
@pytest.mark.parametrize("case_id", SUBPROCESS_SAMPLE)
def test_validate_broken_spec_exits_2_without_traceback(case_id: str) -> None:
    case = CASES[case_id]
    proc = _run([sys.executable, "-m", "studies.cli", "validate", *case.cli_args()])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    path = case.expect_path
    assert f"{path}: " in proc.stderr
    assert case.expect_message in proc.stderr
    if case.expect_line is not None:
        assert f":{case.expect_line}: {path}" in proc.stderr


@pytest.mark.slow  # one CLI-sized subprocess
def test_validate_never_imports_the_statistics_stack() -> None:
    # validate is the command people and tests run most: SciPy/pandas (or torch, Ray) would triple its cost
    code = (
        "import sys\n"
        "from studies import cli\n"
        "for spec in sys.argv[1:]:\n"
        "    assert cli.main(['validate', spec]) == 0, spec\n"
        "heavy = sorted(m for m in ('scipy', 'pandas', 'torch', 'ray', 'mlflow') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    specs = sorted(str(p) for p in (ROOT / "studies" / "specs").glob("*.yaml"))
    assert len(specs) >= 3  # one per study kind
    proc = _run([sys.executable, "-c", code, *specs])
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout[-2000:]


def test_validate_ok_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(SHIPPED), "--preset", "smoke"]) == 0
    out = capsys.readouterr().out
    smoke = load_study(SHIPPED, preset="smoke")
    total = kind_for(smoke).total_trials(smoke)
    assert "ok: autonorm_search" in out and f" {total} trials (2 at a time)" in out


def test_validate_print_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["validate", str(SHIPPED), "--preset", "smoke", "--set", "training.lr=0.002", "--print"])
        == 0
    )
    text = capsys.readouterr().out
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(text.rsplit("ok: ", 1)[0])
    spec = load_study(resolved)
    assert spec.training.lr == 0.002
    assert spec == load_study(SHIPPED, ["training.lr=0.002"], preset="smoke")


@pytest.mark.parametrize("command", ["validate", "run", "resume", "submit", "status", "report"])
def test_every_subcommand_reports_spec_errors_with_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {type: vit_lite}\ndata: {type: digits}\nretries: -2\n")
    assert cli.main([command, str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:4: retries: Input should be greater than or equal to 0 (got -2)" in err


@pytest.mark.slow  # a subprocess of the entry script
def test_entry_script_runs_from_another_cwd_and_fails_cleanly(tmp_path: Path) -> None:
    script = ROOT / "studies" / "autonorm_search.py"
    env = {"PYTHONPATH": ""}  # the script must find the repo itself (a Ray job's working dir)
    ok = _run([sys.executable, str(script), "--preset", "smoke", "--dry-run"], cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    assert (
        "name: autonorm_search" in ok.stdout
        and f"study directory {tmp_path}/runs/autonorm_search" in ok.stdout
    )
    bad = _run(
        [sys.executable, str(script), "--preset", "smoke", "--set", "training.lr=-1"], cwd=tmp_path, env=env
    )
    assert bad.returncode == 2
    assert "training.lr" in bad.stderr and "Traceback" not in bad.stderr


def test_study_main_plans_from_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import studies.running
    from studies.kinds import StudyOutcome

    captured: dict[str, Any] = {}

    def fake_run(spec: Any, *, allow_changed_spec: bool = False, **_: Any) -> StudyOutcome:
        captured["spec"], captured["plan"] = spec, spec.to_plan()
        return StudyOutcome(
            kind=spec.kind,
            name=spec.name,
            study_dir=str(tmp_path / "runs" / spec.name),
            tracking_uri="http://127.0.0.1:5999",
            parent_run_id="run123",
            summary={"best_metric": 0.9, "parent_run_id": "run123", "trials": {"completed": 4}},
        )

    monkeypatch.setattr(studies.running, "run_study_spec", fake_run)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    argv = ["--preset", "smoke", "--storage-path", str(tmp_path / "runs"), "--set", "search.num_samples=5"]
    # The study prints its own lines; its summary as JSON only when asked (issue #48: a quiet console).
    assert entrypoints.study_main(argv, prog="t", description="t", default_spec=SHIPPED) == 0
    out = capsys.readouterr().out
    assert '"best_metric"' not in out and "{" not in out and f"results: {tmp_path / 'runs'}" in out
    code = entrypoints.study_main([*argv, "--json"], prog="t", description="t", default_spec=SHIPPED)
    assert code == 0
    plan = captured["plan"]
    assert plan.tracking.uri == "http://127.0.0.1:5999"  # the environment wins over the sqlite default
    assert plan.storage.path == str(tmp_path / "runs")
    assert plan.num_samples == 5
    assert load_spec_text(tmp_path, captured["spec"].to_yaml()).search.num_samples == 5
    out = capsys.readouterr().out
    assert '"best_metric": 0.9' in out and '"parent_run_id": "run123"' in out and '"completed": 4' in out


def load_spec_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "resolved.yaml"
    path.write_text(text)
    return load_study(path)


def test_resume_refuses_a_study_that_never_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["resume", str(SHIPPED), "--preset", "smoke", "--storage-path", str(tmp_path)])
    assert code == 1
    assert "nothing to resume" in capsys.readouterr().err


def test_study_directory_is_a_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_study(SHIPPED, [f"storage_path={tmp_path}"], preset="smoke")
    written = StudyDir.of(spec).write_text(SPEC_FILE, spec.to_yaml())
    study_dir = tmp_path / "autonorm_search"
    assert written == f"{study_dir}/{SPEC_FILE}"
    assert cli.main(["validate", str(study_dir)]) == 0
    assert cli.main(["status", str(study_dir)]) == 0
    out = capsys.readouterr().out
    total = kind_for(spec).total_trials(spec)
    assert f"trials run: 0 of {total} planned (none yet)" in out
    assert cli.main(["validate", str(tmp_path)]) == 2  # a directory without study_spec.yaml
    assert "not a study directory" in capsys.readouterr().err


def test_extend_prints_a_summary_line_and_json_only_with_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``extend`` ends like ``run``: a line for a person (the seeds added, the verdict, the trials
    run) and where the outputs are; the summary as JSON only with ``--json``."""
    import json

    import studies.running
    from studies.kinds import StudyOutcome

    spec = load_study(SHIPPED, [f"storage_path={tmp_path}"], preset="smoke")
    StudyDir.of(spec).write_text(SPEC_FILE, spec.to_yaml())
    outcome = StudyOutcome(
        "search",
        spec.name,
        str(tmp_path / spec.name),
        f"sqlite:///{tmp_path}/mlflow.db",
        None,
        summary={"study": spec.name, "study_verdict": "supported", "trials": 46, "wall_s": 12.5},
    )
    asked: list[int] = []
    monkeypatch.setattr(studies.running, "extend_study", lambda s, seeds: asked.append(seeds) or outcome)
    target = str(tmp_path / spec.name)
    assert cli.main(["extend", target, "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "{" not in text, text
    lines = text.splitlines()
    assert lines[0] == f"[{spec.name}] extended by 2 seeds: study verdict supported, trials run: 46"
    assert lines[1] == f"[{spec.name}] results: {outcome.study_dir}"
    assert cli.main(["extend", target, "--seeds", "1", "--json"]) == 0
    text = capsys.readouterr().out
    assert json.loads(text[: text.rindex("}") + 1]) == outcome.summary
    assert "extended by" not in text and asked == [2, 1]


def test_moved_study_directory_is_found_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_study(SHIPPED, preset="smoke")  # storage_path: runs (relative)
    StudyDir.of(spec).write_text(SPEC_FILE, spec.to_yaml())
    moved = tmp_path / "archive" / "autonorm_search"
    moved.parent.mkdir()
    (tmp_path / "runs" / "autonorm_search").rename(moved)
    monkeypatch.chdir(ROOT)
    assert cli.main(["status", str(moved), "--json"]) == 0
    assert f'"directory": "{moved}"' in capsys.readouterr().out


# ---- submit -------------------------------------------------------------------------------------------


def test_job_entrypoint_quotes_overrides() -> None:
    cmd = _entry_cmd = cli.job_entrypoint(
        "studies/specs/autonorm_search.yaml", preset="smoke", overrides=["model.norm={type: layernorm}"]
    )
    assert shlex.split(_entry_cmd) == [
        "python",
        "-m",
        "studies.cli",
        "run",
        "studies/specs/autonorm_search.yaml",
        "--preset",
        "smoke",
        "--set",
        "model.norm={type: layernorm}",
    ]
    script = cli.job_entrypoint("s.yaml", preset=None, overrides=[], script="studies/autonorm_search.py")
    assert shlex.split(script) == ["python", "studies/autonorm_search.py", "--spec", "s.yaml"]
    assert cmd != script


_SECRETS = {
    "MLFLOW_TRACKING_USERNAME": "mlflow-user-secret",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pw-secret",
    "MLFLOW_TRACKING_TOKEN": "mlflow-token-secret",
    "AWS_ACCESS_KEY_ID": "aws-key-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-secret",
    "AWS_SESSION_TOKEN": "aws-session-secret",
    "RAY_AUTH_TOKEN": "ray-token-secret",
}


def test_carried_env_takes_settings_but_no_credentials() -> None:
    settings = {
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "MLFLOW_EXPERIMENT_NAME": "exp",
        "MLFLOW_S3_ENDPOINT_URL": "http://s3:8333",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://s3:8333",
        "AWS_ENDPOINT_URL_S3": "http://s3:8333",
        "AUTONORM_GIT_COMMIT": "deadbeef",
    }
    environ = {**settings, **_SECRETS, "HOME": "/root", "MLFLOW_OTHER": "x"}
    warnings: list[str] = []
    assert cli.carried_env(environ, warn=warnings.append) == settings
    assert warnings == []


def test_carried_env_carries_named_credentials_with_a_warning_without_the_value() -> None:
    environ = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", **_SECRETS, "EXTRA": "x"}
    warnings: list[str] = []
    env = cli.carried_env(
        environ, ["AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "OTHER=1"], warn=warnings.append
    )
    assert env["AWS_SECRET_ACCESS_KEY"] == "aws-secret-secret"
    assert env["MLFLOW_TRACKING_TOKEN"] == "mlflow-token-secret"
    assert env["OTHER"] == "1"
    assert "AWS_ACCESS_KEY_ID" not in env and "MLFLOW_TRACKING_PASSWORD" not in env and "EXTRA" not in env
    named = [w for w in warnings if "job API" in w]
    assert len(named) == 3  # one per explicitly named non-setting
    assert any("AWS_SECRET_ACCESS_KEY" in w for w in named)
    assert any("MLFLOW_TRACKING_TOKEN" in w for w in named)
    for secret in _SECRETS.values():
        assert all(secret not in w for w in warnings)
    with pytest.raises(SystemExit, match="never carried"):
        cli.carried_env(environ, ["RAY_AUTH_TOKEN"])
    with pytest.raises(SystemExit, match="not set"):
        cli.carried_env(environ, ["MISSING"])


def test_carried_env_refuses_a_uri_with_userinfo_unless_named() -> None:
    environ = {"MLFLOW_TRACKING_URI": "http://user:pw-secret@mlflow:5000"}
    with pytest.raises(SystemExit) as exc:
        cli.carried_env(environ)
    message = str(exc.value.code)
    assert "MLFLOW_TRACKING_URI embeds credentials" in message and "--env MLFLOW_TRACKING_URI" in message
    assert "pw-secret" not in message
    warnings: list[str] = []
    env = cli.carried_env(environ, ["MLFLOW_TRACKING_URI"], warn=warnings.append)
    assert env["MLFLOW_TRACKING_URI"] == "http://user:pw-secret@mlflow:5000"
    assert len(warnings) == 1 and "MLFLOW_TRACKING_URI" in warnings[0] and "pw-secret" not in warnings[0]
    # A named plain setting needs no warning.
    warnings.clear()
    cli.carried_env({"AWS_REGION": "eu"}, ["AWS_REGION"], warn=warnings.append)
    assert warnings == []


def test_ray_auth_headers_from_env_or_file(tmp_path: Path) -> None:
    assert cli.ray_auth_headers({}) == {}
    assert cli.ray_auth_headers({"RAY_AUTH_TOKEN": " abc \n"}) == {"Authorization": "Bearer abc"}
    token_file = tmp_path / "token"
    token_file.write_text("fromfile\n")
    assert cli.ray_auth_headers({"RAY_AUTH_TOKEN_PATH": str(token_file)}) == {
        "Authorization": "Bearer fromfile"
    }


def test_ray_job_client_does_not_send_the_token_by_itself() -> None:
    # Why submit sets the header: with RAY_AUTH_TOKEN but without RAY_AUTH_MODE=token, Ray 2.60's
    # job client attaches nothing. Pinned so that we notice when Ray changes this.
    code = (
        "from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled as g;"
        "print(g({}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["RAY_AUTH_TOKEN"] = "abc"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{}"


class _FakeJobClient:
    instances: ClassVar[list[_FakeJobClient]] = []

    def __init__(self, address: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.address, self.headers = address, headers
        self.submitted: dict[str, Any] = {}
        _FakeJobClient.instances.append(self)

    def submit_job(self, **kwargs: Any) -> str:
        self.submitted = kwargs
        return "raysubmit_123"

    status = "SUCCEEDED"

    def get_job_status(self, job_id: str) -> str:
        return f"JobStatus.{self.status}"

    def get_job_logs(self, job_id: str) -> str:
        raise AssertionError("submit --wait follows the log tail; it never downloads the whole log")

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        for chunk in ("[study] trials 1/2 done\n", "study done\n"):
            yield chunk


def test_submit_wires_working_dir_env_and_auth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _FakeJobClient)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "sekrit-token")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "sekrit-mlflow")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sekrit-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-aws")
    code = cli.main(
        [
            "submit",
            "studies/specs/autonorm_search.yaml",
            "--preset",
            "smoke",
            "--address",
            "http://127.0.0.1:8265",
            "--env",
            "AWS_SECRET_ACCESS_KEY",
            "--wait",
        ]
    )
    assert code == 0
    client = _FakeJobClient.instances[-1]
    assert client.address == "http://127.0.0.1:8265"
    assert client.headers == {"Authorization": "Bearer sekrit-token"}
    job = client.submitted
    runtime_env = job["runtime_env"]
    assert runtime_env["working_dir"] == str(ROOT)
    for pattern in (".venv", ".git", "runs", "mlruns", "*.db"):
        assert pattern in runtime_env["excludes"]
    env_vars = runtime_env["env_vars"]
    assert env_vars["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert env_vars["AWS_SECRET_ACCESS_KEY"] == "sekrit-aws"  # named with --env
    for absent in ("RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_ACCESS_KEY_ID"):
        assert absent not in env_vars
    args = shlex.split(job["entrypoint"])
    # Every kind runs through its script: the same function as `autonorm-study run`.
    assert args[:4] == [
        "python",
        "studies/autonorm_search.py",
        "--spec",
        "studies/specs/autonorm_search.yaml",
    ]
    assert f"storage_path={ROOT / 'runs'}" in [
        a.replace('"', "") for a in args
    ]  # absolute, not the job's tmp copy
    # The same names as the MLflow tags: the study's name and its kind, never one key for both.
    assert job["metadata"]["autonorm.study_name"] == "autonorm_search"
    assert job["metadata"]["autonorm.kind"] == "search"
    assert "autonorm.study" not in job["metadata"]
    captured = capsys.readouterr()
    assert "raysubmit_123" in captured.out and "job raysubmit_123: SUCCEEDED" in captured.out
    assert "[study] trials 1/2 done\nstudy done\n" in captured.out  # the streamed log, in order
    assert "warning: --env AWS_SECRET_ACCESS_KEY" in captured.err and "job API" in captured.err
    for secret in ("sekrit-token", "sekrit-aws", "sekrit-mlflow", "sekrit-key-id"):
        assert secret not in captured.out and secret not in captured.err


def test_submit_refuses_a_tracking_uri_with_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray.job_submission

    _FakeJobClient.instances.clear()
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _FakeJobClient)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:sekrit-pw@mlflow:5000")
    with pytest.raises(SystemExit) as exc:
        cli.main(["submit", "studies/specs/autonorm_search.yaml", "--preset", "smoke"])
    assert "embeds credentials" in str(exc.value.code) and "sekrit-pw" not in str(exc.value.code)
    assert _FakeJobClient.instances == []  # nothing was submitted
    captured = capsys.readouterr()
    assert "sekrit-pw" not in captured.out + captured.err


def test_unreachable_cluster_is_a_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray.job_submission
    from ray.exceptions import AuthenticationError

    class Refusing(_FakeJobClient):
        def submit_job(self, **kwargs: Any) -> str:
            raise AuthenticationError("Authentication required: Unauthorized: Missing authentication token")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Refusing)
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    assert cli.main(["submit", "studies/specs/autonorm_search.yaml", "--preset", "smoke"]) == 1
    assert "submit failed: AuthenticationError: Authentication required" in capsys.readouterr().err


def test_submit_rejects_a_spec_outside_the_working_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "spec.yaml"
    outside.write_text(SHIPPED.read_text())
    code = cli.main(["submit", str(outside), "--working-dir", str(ROOT / "studies")])
    assert code == 2
    assert "inside the uploaded working directory" in capsys.readouterr().err


# ---- status / report / the gate-entropy hook against a real (tiny) Ray Tune study ---------------------


def tiny_trial(config: dict[str, Any], session: Any) -> None:
    """Cheap stand-in for training: accuracy peaks at lr = 1e-3, gate entropy falls per layer."""
    import math

    epochs = int(config["training"]["epochs"])
    lr = float(config["training"]["lr"])
    for epoch in range(1, epochs + 1):
        quality = 1.0 - abs(math.log10(lr) + 3.0) / 3.0
        metrics = {
            "epoch": epoch,
            "val_accuracy": quality * epoch / epochs,
            "train_loss": 1.0 / epoch,
            "gate_entropy/0": math.log(2) / epoch,
            "gate_entropy/1": math.log(2) / (2 * epoch),
            "gate_entropy_mean": 0.75 * math.log(2) / epoch,
        }
        session.report(metrics, state={"epoch": epoch}, status="completed" if epoch == epochs else "running")


@pytest.fixture(scope="module")
def tiny_study(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from workers.results import read_trials

    storage = tmp_path_factory.mktemp("study")
    spec = load_study(
        SHIPPED,
        [
            f"storage_path={storage}",
            "search.num_samples=3",
            "search.max_concurrent=1",
            "training.epochs=3",
            "confirm=null",
        ],
        preset="smoke",
    )
    import dataclasses

    from studies.kinds.search.plans import search_plan

    plan = search_plan(spec)  # the search phase: <study>/search/
    plan = dataclasses.replace(plan, storage=dataclasses.replace(plan.storage, path=str(storage / spec.name)))
    outcome = run_study_spec(spec, trainable=tiny_trial, progress=False)
    return spec, plan, outcome, read_trials(plan), storage / spec.name


@pytest.mark.ray
@pytest.mark.slow
def test_read_histories_gives_the_trials_asked_for_what_read_trials_gives_them(tiny_study: Any) -> None:
    """The gate-entropy plot reads only the trials it shows (issue #40): their rows are the rows
    ``read_trials`` reads for them, but for the NaN its data frames put where a row lacks a key."""
    import math

    from workers.results import read_histories

    _, plan, _, trials, _ = tiny_study
    asked = [trials[-1].trial_id, trials[0].trial_id, "no-such-trial"]
    got = read_histories(plan, asked)
    assert list(got) == asked[:2]
    for trial in (trials[-1], trials[0]):
        rows = got[trial.trial_id]
        assert len(rows) == len(trial.history) == trial.metrics["training_iteration"]
        for raw, framed in zip(rows, trial.history, strict=True):
            numbers = {k: v for k, v in framed.items() if isinstance(v, int | float) and k in raw}
            assert numbers and all(
                raw[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(raw[k]))
                for k, v in numbers.items()
            )
            assert any(k.startswith("gate_entropy") for k in raw)


@pytest.mark.ray
@pytest.mark.slow
def test_status_reads_the_study_directory(tiny_study: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from studies.kinds.search.readback import trial_name
    from workers.records import best_trial

    _, plan, outcome, trials, study_dir = tiny_study
    assert cli.main(["status", str(study_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["trials"] == status["expected_trials"] == 3
    assert status["by_status"] == {"completed": 3}
    best = best_trial(trials, plan.metric, plan.mode)
    assert best is not None and outcome.summary["best_trial_id"] == best.trial_id
    assert status["best_trial"] == trial_name(best, plan)  # its MLflow run's name, not Tune's id
    assert status["best_val_accuracy"] == pytest.approx(best.metrics["val_accuracy"])
    assert {row["training.lr"] for row in status["rows"]} == {t.params["training.lr"] for t in trials}


@pytest.mark.ray
@pytest.mark.slow
def test_report_regenerates_from_the_directory(tiny_study: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from studies.kinds.search.readback import trial_name
    from workers.records import best_trial

    _, plan, _, trials, study_dir = tiny_study
    assert cli.main(["report", str(study_dir)]) == 0
    report = (study_dir / "report" / "report.md").read_text()
    best = best_trial(trials, plan.metric, plan.mode)
    assert best is not None
    name = trial_name(best, plan)
    assert f"## Best completed trial `{name}`" in report
    table = [line for line in report.splitlines() if line.startswith("| ") and "status" not in line]
    assert len(table) == 3
    assert name in table[0]  # sorted best first
    assert (study_dir / "report" / "gate_entropy_per_layer.png").stat().st_size > 1000


@pytest.mark.ray
@pytest.mark.slow
def test_gate_entropy_plot_is_logged_on_the_parent_run(tiny_study: Any) -> None:
    from mlflow import MlflowClient

    _, _, outcome, _, _ = tiny_study
    names = [
        a.path
        for a in MlflowClient(tracking_uri=outcome.tracking_uri).list_artifacts(
            outcome.parent_run_id, "plots"
        )
    ]
    assert names == ["plots/gate_entropy_per_layer.png"]


# ---- other study kinds ----------------------------------------------------------------------------------

BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"


def test_kind_is_read_from_the_spec(tmp_path: Path) -> None:
    from studies.schema import SpecError, parse_yaml

    assert kind_of(parse_yaml(SHIPPED.read_text())[0]).name == "search"
    assert kind_of(parse_yaml(BATCHSIZE.read_text())[0]).name == "batchsize"
    assert kind_of({"name": "x"}).name == "search"  # absent = search
    with pytest.raises(SpecError, match="unknown study kind 'sweep'"):
        kind_of({"kind": "sweep"})
    bad = tmp_path / "bad.yaml"
    bad.write_text(BATCHSIZE.read_text().replace("kind: batchsize", "kind: sweep"))
    assert cli.main(["validate", str(bad)]) == 2


def test_validate_checks_every_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(BATCHSIZE)]) == 0
    out = capsys.readouterr().out
    assert "(kind batchsize)" in out and "preset smoke" in out and "preset local" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text(BATCHSIZE.read_text().replace("seeds: [0, 1]\n", "seeds: [0]\n"))
    assert cli.main(["validate", str(broken)]) == 2  # only the smoke preset is broken
    err = capsys.readouterr().err
    assert "[preset smoke]" in err and "seeds" in err and "Traceback" not in err
    assert cli.main(["--kind", "search", "validate", str(BATCHSIZE)]) == 2
    assert "arms: unknown field" in capsys.readouterr().err


def test_validate_takes_several_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``validate studies/specs/*.yaml``: every file checked (each with its presets), every error
    printed, exit 2 when any file is invalid."""
    shipped = sorted((ROOT / "studies" / "specs").glob("*.yaml"))
    assert len(shipped) >= 3
    assert cli.main(["validate", *map(str, shipped)]) == 0
    out = capsys.readouterr().out
    for path in shipped:
        spec = load_study(path)
        assert f"ok: {spec.name} (kind {spec.kind})" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nmodel: {type: vit_lite}\ndata: {type: digits}\nretries: -2\n")
    also = tmp_path / "also.yaml"
    also.write_text(BATCHSIZE.read_text().replace("seeds: [0, 1]\n", "seeds: [0]\n"))
    assert cli.main(["validate", str(broken), str(BATCHSIZE), "--spec", str(also)]) == 2
    captured = capsys.readouterr()
    assert "(kind batchsize)" in captured.out  # the valid file in between is still checked
    assert "broken.yaml:4: retries" in captured.err and "[preset smoke]" in captured.err
    assert "2 of 3 specs invalid" in captured.err and "Traceback" not in captured.err
    assert cli.main(["validate", str(SHIPPED), str(BATCHSIZE), "--print"]) == 2  # --print: one spec
    assert cli.main(["validate"]) == 2


def test_submit_of_another_kind_runs_its_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _FakeJobClient)
    monkeypatch.chdir(ROOT)
    assert cli.main(["submit", "studies/specs/batchsize_correlation.yaml", "--preset", "smoke"]) == 0
    args = shlex.split(_FakeJobClient.instances[-1].submitted["entrypoint"])
    assert args[:4] == [
        "python",
        "studies/batchsize_correlation.py",
        "--spec",
        "studies/specs/batchsize_correlation.yaml",
    ]


# ---- submit to a cluster on another machine ---------------------------------------------------------


def _submit(monkeypatch: pytest.MonkeyPatch, *extra: str, status: str = "SUCCEEDED") -> tuple[int, Any]:
    import ray.job_submission

    class Client(_FakeJobClient):
        pass

    Client.status = status
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.chdir(ROOT)
    code = cli.main(["submit", "studies/specs/autonorm_search.yaml", "--preset", "smoke", *extra])
    return code, _FakeJobClient.instances[-1] if _FakeJobClient.instances else None


def test_submit_to_a_remote_cluster_drops_a_loopback_tracking_uri(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    code, client = _submit(
        monkeypatch, "--address", "http://ray-head.internal:8265", "--storage-path", "/shared/runs"
    )
    assert code == 0
    env_vars = client.submitted["runtime_env"]["env_vars"]
    assert "MLFLOW_TRACKING_URI" not in env_vars
    err = capsys.readouterr().err
    assert "not carrying MLFLOW_TRACKING_URI" in err and "needs its own" in err
    # The same URI to a local cluster is carried: there it names the right machine.
    code, client = _submit(monkeypatch, "--address", "http://127.0.0.1:8265")
    assert (
        code == 0
        and client.submitted["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == "http://localhost:5000"
    )


def test_submit_to_a_remote_cluster_requires_durable_storage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _FakeJobClient.instances.clear()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, client = _submit(
        monkeypatch, "--address", "ray-head.internal:8265"
    )  # the spec's storage_path: runs
    assert code == 2 and client is None  # nothing submitted
    err = capsys.readouterr().err
    assert "storage_path" in err and "s3://" in err and "absolute path" in err
    code, client = _submit(
        monkeypatch, "--address", "ray-head.internal:8265", "--storage-path", "s3://bucket/runs"
    )
    assert code == 0 and "storage_path=s3://bucket/runs" in client.submitted["entrypoint"].replace('"', "")


@pytest.mark.parametrize(("status", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 1)])
def test_submit_wait_exits_0_only_on_success(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], status: str, code: int
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    got, _ = _submit(monkeypatch, "--address", "http://127.0.0.1:8265", "--wait", status=status)
    assert got == code
    assert f"job raysubmit_123: {status}" in capsys.readouterr().out


# ---- a study driver inside a Ray job's working-dir package ----------------------------------------


def _fake_run(tmp_path: Path, captured: dict[str, Any]) -> Any:
    from studies.kinds import StudyOutcome

    def fake_run(spec: Any, *, allow_changed_spec: bool = False, **_: Any) -> StudyOutcome:
        captured["storage_path"] = spec.storage_path
        return StudyOutcome(
            kind=spec.kind,
            name=spec.name,
            study_dir=f"{spec.storage_path}/{spec.name}",
            tracking_uri="http://127.0.0.1:1",
            parent_run_id=None,
        )

    return fake_run


def test_relative_storage_inside_a_ray_job_package_goes_to_autonorm_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import studies.running

    package = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    package.mkdir(parents=True)
    monkeypatch.chdir(package)
    monkeypatch.setenv("AUTONORM_HOME", str(tmp_path / "home"))
    captured: dict[str, Any] = {}
    monkeypatch.setattr(studies.running, "run_study_spec", _fake_run(tmp_path, captured))
    monkeypatch.setattr(cli, "run_study_spec", _fake_run(tmp_path, captured))
    code = entrypoints.study_main(["--preset", "smoke"], prog="t", description="t", default_spec=SHIPPED)
    assert code == 0
    assert captured["storage_path"] == str(tmp_path / "home" / "runs")  # not inside the package
    out = capsys.readouterr().out
    assert f"-> {tmp_path / 'home' / 'runs'}" in out
    assert f"results: {tmp_path / 'home' / 'runs'}/autonorm_search" in out
    # `autonorm-study run` takes the same path; an absolute storage path is kept as given.
    assert cli.main(["run", str(SHIPPED), "--preset", "smoke"]) == 0
    assert captured["storage_path"] == str(tmp_path / "home" / "runs")
    assert cli.main(["run", str(SHIPPED), "--preset", "smoke", "--storage-path", str(tmp_path / "abs")]) == 0
    assert captured["storage_path"] == str(tmp_path / "abs")


def test_relative_storage_outside_a_job_package_stays_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import studies.running

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTONORM_HOME", str(tmp_path / "home"))
    captured: dict[str, Any] = {}
    monkeypatch.setattr(studies.running, "run_study_spec", _fake_run(tmp_path, captured))
    monkeypatch.setattr(cli, "run_study_spec", _fake_run(tmp_path, captured))
    assert cli.main(["run", str(SHIPPED), "--preset", "smoke"]) == 0
    assert captured["storage_path"] == "runs"  # as given: resolved against this directory when it runs
    assert entrypoints.durable_storage_path("runs", cwd=tmp_path / "_ray_pkg_1", environ={}) == str(
        Path("~/autonorm").expanduser().resolve() / "runs"
    )
    assert entrypoints.durable_storage_path("s3://b/runs", cwd=tmp_path / "_ray_pkg_1", environ={}) is None


def test_end_of_study_prints_direct_mlflow_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    from studies.kinds import StudyOutcome
    from workers.tracking import default_tracking_uri, ensure_sqlite_schema

    uri = default_tracking_uri(tmp_path)
    ensure_sqlite_schema(uri, artifact_root=str(tmp_path))
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("links", artifact_location=f"file://{tmp_path}/a")
    run_id = client.create_run(experiment_id).info.run_id
    outcome = StudyOutcome(
        kind="search", name="s", study_dir=str(tmp_path / "s"), tracking_uri=uri, parent_run_id=run_id
    )
    entrypoints.print_where(outcome)
    out = capsys.readouterr().out
    assert f"results: {tmp_path / 's'}" in out
    # The runs table of MLflow's training view ("Model training"), not the GenAI overview.
    assert f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs?workflowType=machine_learning\n" in out
    assert (
        f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
        in out
    )
    assert f"mlflow ui --backend-store-uri {uri}" in out


def test_plan_json_counts_what_run_will_run(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from studies.kinds import kind_for, load_study

    assert cli.main(["plan", str(BATCHSIZE), "--preset", "smoke", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    spec = load_study(BATCHSIZE, preset="smoke")
    # 24 tuning + 18 confirmatory + 18 training-adequacy (3 arms x 3 B on one tuning seed, at the
    # budget and at twice it)
    assert spec.adequacy_trials == 18
    assert plan["trials"] == kind_for(spec).total_trials(spec) == 42 + 18
    assert plan["wall_s"] > 0 and plan["cpu_hours"] > 0 and plan["gpu_hours"] == 0
    assert sum(p["trials"] for p in plan["phases"] if not p["optional"]) == plan["trials"]
    # every range extension firing: 3 rounds x 3 arms x 2 tuning seeds
    assert plan["trials_max"] == plan["trials"] + spec.extension_trials_max == 60 + 18
    assert plan["wall_s_max"] > plan["wall_s"] and "trials_expected" not in plan  # a fixed design


def test_plan_json_counts_the_learning_rate_refinement(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from studies.kinds import load_study

    plans = {}
    for refine in (0, 2):
        args = ["plan", str(BATCHSIZE), "--preset", "smoke", "--set", f"lr_tuning.refine={refine}", "--json"]
        assert cli.main(args) == 0
        plans[refine] = json.loads(capsys.readouterr().out)
    spec = load_study(BATCHSIZE, preset="smoke")
    assert spec.lr_tuning.refine == 0  # the smoke preset's own, to stay quick
    # 2 more rates per arm and budget, each on every tuning seed
    added = 2 * len(spec.arms) * len(spec.budgets) * len(spec.lr_tuning.seeds)
    assert added == 12
    assert plans[2]["trials"] == plans[0]["trials"] + added == 60 + 12  # 60: with the adequacy check
    assert plans[2]["trials_max"] == plans[0]["trials_max"] + added
    refined = [p for p in plans[2]["phases"] if p["refine"]]
    assert [(p["name"], p["trials"], p["optional"]) for p in refined] == [("tune-epochs-refine", added, True)]
    assert not any(p["refine"] for p in plans[0]["phases"])


def test_plan_pilot_gives_seeds_needed_from_the_pilots_per_seed_slopes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import math

    import numpy as np

    from studies.stats import seeds_needed

    # A pilot of the smoke design: corrected declines with a per-seed interaction slope of known spread.
    rng = np.random.default_rng(0)
    slopes = {s: -0.02 + 0.01 * rng.standard_normal() for s in range(4)}
    rows = ["arm,batch_size,seed,budget,status,test_accuracy,train_loss"]
    for seed, slope in slopes.items():
        for b in (8, 32, 128):
            for arm, acc in (
                ("linear", 0.8),
                ("linear_batchnorm", 0.8),
                ("corrected", 0.8 + slope * math.log2(b)),
            ):
                rows.append(f"{arm},{b},{seed},epochs,completed,{acc},0.3")
    pilot = tmp_path / "pilot"
    pilot.mkdir()
    (pilot / "trials.csv").write_text("\n".join(rows) + "\n")
    assert (
        cli.main(
            ["plan", str(BATCHSIZE), "--preset", "smoke", "--pilot", str(pilot), "--power", "0.8", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    expected = seeds_needed(list(slopes.values()), alpha=0.05, family_size=1, power=0.8, alternative="less")
    assert out["seeds_needed"]["corrected"] == expected
