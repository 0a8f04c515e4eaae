"""A lab's shared service (issue #40): four studies submitted at once to one Ray cluster and one
MLflow server, as four researchers would.

One ``ray start --head`` (2 CPUs: two trial slots), one ``mlflow server`` on PostgreSQL with S3
artifacts, and four ``autonorm-study submit ... --wait`` at the same time: a search study, a compare
study and two batch-size studies (small: every phase kept, a few trials each). The MLflow server is
stopped once while they run and started again on its port.

What must hold:

* all four jobs succeed and write their verdicts; nothing they print reads as a failure;
* every MLflow run of a study's experiment carries that study's ``autonorm.study_key`` and no other's;
  each study has exactly its planned number of trial runs (``autonorm-study plan --json``), one per
  Tune trial, each FINISHED with every epoch its trial reported, none attributed to another study;
* each study's Optuna storage and Tune state are its own (separate files under its own directory);
* the slots are shared: every study has a trial running within a minute of its job's start, trials of
  two studies run side by side for at least 15 % of the span (0 when queued), and the span from the first
  trial's start to the last trial's end, over Σ trial time / slots (a trial's time measured inside
  its worker: ``wall_started`` → last ``wall_reported`` in Tune's result rows, as
  ``bench/study_scaling.py`` measures it), is recorded. The issue's 1.25 is not asserted at this
  size: see the comment at the end of ``test_the_slots_are_shared_fairly`` and docs/reliability.md.

Each study runs with ``max_concurrent: 1``, its share of the two slots: Tune keeps a study's trial
actors for the study's next trials until the phase ends, so a study allowed every slot holds them all
while the others wait (measured: first trials up to 57 s after their job's start, phases queued).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import short_tmp_dir
from tests.integration.faults import alarming_lines, record_figures
from tests.integration.test_jobs import _assert_readable
from tests.services import (
    MlflowServer,
    PostgresServer,
    RayNode,
    S3Server,
    create_database,
    free_port,
    start_mlflow_server,
)

pytestmark = [pytest.mark.ray, pytest.mark.services, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
SLOTS = 2  # the head's CPUs; every trial asks for one
OUTAGE_S = 5.0
# Trials of two or more studies at once, as a share of the span from the first trial to the last:
# 0 for studies queued one after another. Measured 38 % alone on a quiet machine and 22 % in a full
# suite on a slower one (the fault chain running beside it: first trials 26-49 s after their jobs'
# start, against 18-27 s alone), so the share moves with load; 15 % keeps sharing apart from queueing.
SHARED_FRACTION = 0.15
FIRST_TRIAL_S = 60.0

# Batch-size studies: 2 arms x 2 batch sizes x 2 seeds (8 confirmatory trials) after a 3-point rate grid
# on the preset's 2 tuning seeds (12 tuning trials); batch 8 and 32 on digits, 2 epochs: seconds a trial.
_BATCHSIZE = [
    "arms=[linear,corrected]",
    "batch_sizes=[8,32]",
    "seeds=[0,1]",
    "training.epochs=8",
    "lr_tuning.points=3",
    "lr_tuning.max_extensions=0",
    "analysis.n_boot=100",
    "analysis.n_perm=99",
    "max_concurrent=1",
    "analysis.adequacy.check=false",  # the phases measured here: tuning, then the confirmatory grid
]
STUDIES: dict[str, tuple[str, list[str]]] = {
    "search": (
        "studies/specs/autonorm_search.yaml",
        [
            "search.num_samples=4",
            "search.max_concurrent=1",
            "training.epochs=4",
            "search.space.0.high=4",
            "confirm=null",
        ],
    ),
    "compare": (
        "studies/specs/affine_divergence_table.yaml",
        [
            "arms=[corrected,linear_batchnorm]",
            "seeds=[0,1]",
            "training.epochs=8",
            "training.batch_size=8",
            "lr_tuning.points=3",
            "lr_tuning.max_extensions=0",
            "max_concurrent=1",
            "analysis.adequacy.check=false",
        ],
    ),
    "batchsize_a": ("studies/specs/batchsize_correlation.yaml", _BATCHSIZE),
    # A lab runs both modes: one batch-size study stacked (a phase is then one Tune trial per slot),
    # the other one trial per process. With both stacked, the four studies had 10 Tune trials of 1-4 s
    # between phase starts of 2-5 s, too few for the "side by side" share of the span to say
    # anything (measured 12-22 %, with or without sharing the slots fairly).
    "batchsize_b": ("studies/specs/batchsize_correlation.yaml", [*_BATCHSIZE, "execution.stack=off"]),
}


@dataclass
class Submitted:
    label: str
    name: str
    job_id: str
    planned_trials: int
    proc: subprocess.Popen[str]
    log: Path
    rc: int | None = None
    output: str = ""


@dataclass
class Lab:
    storage: Path
    uri: str
    ray: RayNode
    studies: dict[str, Submitted] = field(default_factory=dict)
    job_start: dict[str, float] = field(default_factory=dict)  # seconds since the epoch
    outage_at: float = 0.0
    secrets: tuple[str, str] = field(
        default_factory=lambda: (f"sekrit-{uuid.uuid4().hex}", f"sekrit-{uuid.uuid4().hex}")
    )


def _args(label: str, name: str) -> list[str]:
    spec, sets = STUDIES[label]
    out = [spec, "--preset", "smoke", "--set", f"name={name}"]
    for item in sets:
        out += ["--set", item]
    return out


def _planned_trials(label: str, name: str, storage: Path) -> int:
    proc = subprocess.run(
        [str(BIN / "autonorm-study"), "plan", *_args(label, name), "--storage-path", str(storage), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert plan["trials"] == plan["trials_max"], plan  # no sequential looks or extensions: exact counts
    return int(plan["trials"])


def _job_env(ray: RayNode, uri: str) -> dict[str, str]:
    env = ray.client_env()
    for key in list(env):  # a developer shell's MLflow / S3 settings must not leak into the jobs
        if key.startswith(("MLFLOW_", "AWS_")):
            del env[key]
    env["MLFLOW_TRACKING_URI"] = uri
    return env


def _job_start(ray: RayNode, job_id: str) -> float | None:
    from ray.job_submission import JobSubmissionClient

    try:
        info = JobSubmissionClient(ray.dashboard_url, headers=ray.auth_headers()).get_job_info(job_id)
    except Exception:
        return None
    return info.start_time / 1000.0 if info.start_time else None


def _all_running(uri: str, names: list[str]) -> bool:
    """Every study is past its start (its study run exists) and some trial run exists: the moment
    to take the tracking server away. (A study whose start finds MLflow away is refused before
    anything runs, by design; that is tested in test_mlflow_faults.py.)"""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        experiments = [e.experiment_id for e in client.search_experiments() if e.name in names]
        if len(experiments) < len(names):
            return False
        studies = client.search_runs(experiments, "tags.`autonorm.role` = 'study'", max_results=100)
        trials = client.search_runs(experiments, "tags.`autonorm.role` = 'trial'", max_results=1)
    except Exception:
        return False
    return len({r.info.experiment_id for r in studies}) == len(names) and bool(trials)


@pytest.fixture(scope="module")
def lab(postgres_server: PostgresServer, s3_server: S3Server, ray_head: RayNode) -> Iterator[Lab]:
    work = short_tmp_dir("an_lab_")
    port = free_port()
    backend = create_database(postgres_server, f"lab_{uuid.uuid4().hex[:8]}")
    artifacts = f"s3://{s3_server.bucket}/lab-artifacts"

    def start() -> MlflowServer:
        return start_mlflow_server(backend, artifacts, s3_server.env(), directory=work / "mlflow", port=port)

    server: MlflowServer | None = start()
    result = Lab(storage=work / "runs", uri=f"http://127.0.0.1:{port}", ray=ray_head)
    env = _job_env(ray_head, result.uri)
    # Credentials in the submitting shell must not reach the job table (readable via the job API).
    env["AWS_SECRET_ACCESS_KEY"] = result.secrets[0]
    env["MLFLOW_TRACKING_PASSWORD"] = result.secrets[1]
    mark = uuid.uuid4().hex[:6]
    try:
        # Planned first (a plan takes seconds): the four submissions then go out together.
        planned = {label: _planned_trials(label, f"lab_{label}_{mark}", result.storage) for label in STUDIES}
        for label in STUDIES:
            name = f"lab_{label}_{mark}"
            job_id = f"lab-{label.replace('_', '-')}-{mark}"
            log = work / f"{label}.log"
            proc = subprocess.Popen(
                [
                    str(BIN / "autonorm-study"),
                    "submit",
                    *_args(label, name),
                    "--storage-path",
                    str(result.storage),
                    "--address",
                    ray_head.dashboard_url,
                    "--job-id",
                    job_id,
                    "--wait",
                    "--timeout",
                    "840",
                ],
                cwd=ROOT,
                env=env,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
                text=True,
            )
            result.studies[label] = Submitted(label, name, job_id, planned[label], proc, log)
        names = [s.name for s in result.studies.values()]
        deadline = time.monotonic() + 900
        outage_done = False
        while time.monotonic() < deadline and any(s.proc.poll() is None for s in result.studies.values()):
            for s in result.studies.values():
                if s.label not in result.job_start:
                    started = _job_start(ray_head, s.job_id)
                    if started is not None:
                        result.job_start[s.label] = started
            if not outage_done and server is not None and _all_running(result.uri, names):
                # The tracking server goes away once, mid-study, and comes back on its port.
                result.outage_at = time.time()
                server.handle.stop()
                server = None
                time.sleep(OUTAGE_S)
                server = start()
                outage_done = True
            time.sleep(1.0)
        for s in result.studies.values():
            try:
                s.rc = s.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.rc = s.proc.wait()
            s.output = s.log.read_text(errors="replace")
        assert outage_done, "no trial run appeared in MLflow"
        yield result
    finally:
        for s in result.studies.values():
            if s.proc.poll() is None:
                s.proc.kill()
        if server is not None:
            server.handle.stop()
        if not os.environ.get("AUTONORM_KEEP_FAULT_WORK"):  # kept to read the real logs
            shutil.rmtree(work, ignore_errors=True)


def _trial_rows(study_dir: Path, *, members: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Every trial of a study (all phases): its result rows, by trial id. A Tune trial that trained a
    stacked group (``execution.stack``) is its members, each with its own rows (``members=False``: the
    Tune trials themselves, as the slots saw them)."""
    from workers.members import member_history, member_id

    out: dict[str, list[dict[str, Any]]] = {}
    for path in glob.glob(f"{study_dir}/**/result.json", recursive=True):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        if rows:
            trial_id = str(rows[0]["trial_id"])
            assert trial_id not in out, f"trial {trial_id} has two result folders"
            size = int(rows[0].get("members") or 0)
            if members and size:
                for k in range(size):
                    out[member_id(trial_id, k)] = member_history(rows, k)
            else:
                out[trial_id] = rows
    return out


def test_four_studies_at_once_all_finish_and_print_no_failure(lab: Lab) -> None:
    failed = {s.label: s.output[-3000:] for s in lab.studies.values() if s.rc != 0}
    assert not failed, failed
    for s in lab.studies.values():
        assert f"job {s.job_id}: SUCCEEDED" in s.output, s.output[-4000:]
        assert (lab.storage / s.name / "verdict.json").is_file() or (
            s.label == "search" and (lab.storage / s.name / "search").is_dir()
        ), sorted(p.name for p in (lab.storage / s.name).iterdir())
        # The MLflow restart is a fault the studies survived: nothing reads as a failure.
        assert alarming_lines(s.output) == [], (s.label, alarming_lines(s.output)[:10])


def test_each_study_keeps_to_its_own_runs_and_state(lab: Lab) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=lab.uri)
    experiments = {e.name: e.experiment_id for e in client.search_experiments()}
    keys: dict[str, str] = {}
    for s in lab.studies.values():
        assert s.name in experiments, (s.name, sorted(experiments))
        runs = client.search_runs([experiments[s.name]], max_results=5000)
        study_keys = {r.data.tags.get("autonorm.study_key") for r in runs}
        assert len(study_keys) == 1 and None not in study_keys, (s.label, study_keys)
        keys[s.label] = study_keys.pop()  # type: ignore[assignment]
        trial_runs = [r for r in runs if r.data.tags.get("autonorm.role") == "trial"]
        tune_trials = _trial_rows(lab.storage / s.name)
        assert len(tune_trials) == s.planned_trials, (s.label, len(tune_trials), s.planned_trials)
        by_trial: dict[str, Any] = {}
        for run in trial_runs:
            trial_id = str(run.data.tags.get("ray.trial_id"))
            assert trial_id not in by_trial, f"{s.label}: two runs for trial {trial_id}"
            by_trial[trial_id] = run
        assert set(by_trial) == set(tune_trials), (s.label, sorted(set(by_trial) ^ set(tune_trials)))
        for trial_id, run in by_trial.items():
            assert run.info.status == "FINISHED", (s.label, trial_id, run.info.status)
            steps = sorted(int(m.step) for m in client.get_metric_history(run.info.run_id, "epoch"))
            reported = sorted({int(r["epoch"]) for r in tune_trials[trial_id] if "epoch" in r})
            assert steps == reported, (s.label, trial_id, steps, reported)  # every epoch, once
        # Tune's and Optuna's state live in the study's own folder, and nowhere else.
        state_files = glob.glob(f"{lab.storage / s.name}/**/experiment_state-*.json", recursive=True)
        assert state_files, s.label
    assert len(set(keys.values())) == len(keys), keys  # four studies, four keys: nothing shared
    search_db = lab.storage / lab.studies["search"].name / "search" / "optuna.db"
    assert search_db.is_file()
    all_trials = [t for s in lab.studies.values() for t in _trial_rows(lab.storage / s.name)]
    assert len(all_trials) == len(set(all_trials)) == sum(s.planned_trials for s in lab.studies.values())


def _overlap_s(spans: list[tuple[float, float, str]]) -> float:
    """Seconds during which trials of two or more different studies ran at the same time."""
    events = sorted([(b, 1, label) for b, _, label in spans] + [(e, -1, label) for _, e, label in spans])
    running: dict[str, int] = {}
    shared, last = 0.0, events[0][0]
    for t, step, label in events:
        if sum(1 for n in running.values() if n > 0) >= 2:
            shared += t - last
        last = t
        running[label] = running.get(label, 0) + step
    return shared


def test_the_slots_are_shared_fairly(lab: Lab) -> None:
    starts: dict[str, float] = {}
    spans: list[tuple[float, float, str]] = []
    for s in lab.studies.values():
        for rows in _trial_rows(lab.storage / s.name, members=False).values():
            begun = min(float(r["wall_started"]) for r in rows)
            ended = max(float(r["wall_reported"]) for r in rows)
            spans.append((begun, ended, s.label))
            starts[s.label] = min(starts.get(s.label, begun), begun)
    waits = {label: starts[label] - lab.job_start[label] for label in lab.studies}
    total = sum(end - begin for begin, end, _ in spans)
    ideal = total / SLOTS
    span = max(end for _, end, _ in spans) - min(begin for begin, _, _ in spans)
    shared = _overlap_s(spans)
    figures = {
        "studies": len(lab.studies),
        "trials": len(spans),
        "trial_s_sum": round(total, 1),
        "ideal_s": round(ideal, 1),
        "span_s": round(span, 1),
        "span_over_ideal": round(span / ideal, 3),
        "shared_s": round(shared, 1),
        "first_trial_wait_s": {k: round(v, 1) for k, v in waits.items()},
    }
    record_figures("concurrent_studies", figures)
    print(json.dumps(figures))
    # No study starves: each has a trial running within a minute of its job's start.
    for label, wait in waits.items():
        assert 0 <= wait <= FIRST_TRIAL_S, (label, figures)
    # The studies ran side by side, not one after another: two studies' trials shared the cluster
    # for a good part of the span (one after another gives 0).
    assert shared >= SHARED_FRACTION * span, figures
    # span / ideal is recorded (AUTONORM_FAULT_FIGURES), not asserted: with trials of ~1 s, each
    # phase's new trial actors (a worker process, Ray Tune and torch imported) leave slots idle for
    # 5-11 s under load, a fixed cost per phase that these small studies cannot amortise; measured
    # 1.61-1.74 at load 9 on 2 cores, against 1.95-2.08 for the same studies queued one after
    # another (docs/reliability.md). What separates sharing from queueing is asserted above.


def test_a_submitted_study_carries_no_credentials_and_tags_its_verdict_and_commit(lab: Lab) -> None:
    # (Moved here from test_jobs.py, which submitted one batch-size study alone.)
    from mlflow import MlflowClient
    from ray.job_submission import JobSubmissionClient

    s = lab.studies["batchsize_a"]
    info = JobSubmissionClient(lab.ray.dashboard_url, headers=lab.ray.auth_headers()).get_job_info(s.job_id)
    env_vars = (info.runtime_env or {}).get("env_vars", {})
    assert env_vars["MLFLOW_TRACKING_URI"] == lab.uri
    assert "AWS_SECRET_ACCESS_KEY" not in env_vars and "MLFLOW_TRACKING_PASSWORD" not in env_vars
    assert "RAY_AUTH_TOKEN" not in env_vars
    for secret in (*lab.secrets, lab.ray.env["RAY_AUTH_TOKEN"]):
        assert secret not in json.dumps(info.runtime_env) and secret not in s.output
    verdict = json.loads((lab.storage / s.name / "verdict.json").read_text())
    arms = {"linear", "corrected"}
    assert set(verdict["verdict"]) | set(verdict["controls"]) == arms  # fix arms + controls
    assert set(verdict["verdict"].values()) <= {"supported", "refuted", "inconclusive"}
    assert set(verdict["controls"].values()) <= {"stable", "declines", "unclear"}
    client = MlflowClient(tracking_uri=lab.uri)
    experiment = client.get_experiment_by_name(s.name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    tagged = [r for r in runs if any(k.startswith("verdict/") for k in r.data.tags)]
    assert len(tagged) == 1
    assert f"results: {lab.storage / s.name}" in s.output
    assert f"/#/experiments/{experiment.experiment_id}/runs/{tagged[0].info.run_id}" in s.output
    _assert_readable([r for r in runs if r.data.tags.get("autonorm.role") == "trial"])
    commits = {r.data.tags.get("mlflow.source.git.commit") for r in runs}
    assert len(commits) == 1 and None not in commits  # carried into the job by `submit`
    assert {
        k.removeprefix("verdict/"): v for k, v in tagged[0].data.tags.items() if k.startswith("verdict/")
    } == {**{k: str(v) for k, v in verdict["verdict"].items()}, "study": verdict["study_verdict"]}
