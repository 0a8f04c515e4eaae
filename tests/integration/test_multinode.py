"""A study on a real two-node Ray cluster (one machine, loopback), with S3 storage and MLflow server.

The head and the worker node are separate ``ray start`` process trees (``tests/services.py``); the
study driver is a separate process too, as with ``ray job submit``. Trial state lives in the
SeaweedFS bucket (``storage_path=s3://...`` with an endpoint override), never on a node's disk, so
a trial whose node dies resumes elsewhere from its last checkpoint. MLflow is the PostgreSQL-backed
server with S3 artifacts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import short_tmp_dir
from tests.services import (
    MlflowServer,
    RayNode,
    S3Server,
    list_nodes,
    start_ray_head,
    start_ray_worker,
    wait_for,
)

pytestmark = [pytest.mark.services, pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

# The study driver, run as its own process like a submitted job. Trial functions defined in
# __main__ travel to the workers by value (cloudpickle), so the nodes need nothing but `workers`.
DRIVER = textwrap.dedent(
    """
    import json, sys, time

    from workers import ParamDef, SamplerConfig, StorageConfig, StudyPlan, TrackingConfig, run_study


    def trial(config, session):
        epochs = int(config["training"]["epochs"])
        state = session.resume_state
        start = int(state["epoch"]) + 1 if state else 1

        def log(**event):
            with open(config["log_file"], "a") as fh:
                fh.write(json.dumps({"trial": session.trial_id, "node": session.node_id, "t": time.time(), **event}) + "\\n")

        log(event="start", start=start)
        for epoch in range(start, epochs + 1):
            time.sleep(float(config["sleep_s"]))
            session.report(
                {"epoch": epoch, "val_accuracy": float(config["x"]) * epoch / epochs, "train_loss": 1.0 / epoch},
                state={"epoch": epoch},
                status="completed" if epoch == epochs else "running",
            )
            log(event="epoch", epoch=epoch)


    args = json.load(open(sys.argv[1]))
    plan = StudyPlan(
        name=args["name"],
        base_config={
            "model": {"type": "probe"}, "data": {"type": "probe"}, "training": {"epochs": args["epochs"]},
            "seed": 0, "x": 0.5, "sleep_s": args["sleep_s"], "log_file": args["log_file"],
        },
        space=(ParamDef(name="x", type="float", low=0.0, high=1.0),),
        sampler=SamplerConfig(type="random", seed=7),
        metric="val_accuracy",
        mode="max",
        num_samples=args["num_samples"],
        max_concurrent=2,
        resources=(("cpu", 1.0),),
        retries=0,  # no application retries: a lost node must not need any (node_failures covers it)
        storage=StorageConfig(path=args["storage_path"], endpoint_override=args["endpoint"]),
        tracking=TrackingConfig(uri=args["tracking_uri"], experiment=args["name"]),
    )
    result = run_study(plan, trainable=trial, progress=False)
    json.dump(
        {
            "restored": result.restored,
            "parent_run_id": result.parent_run_id,
            "experiment_path": result.experiment_path,
            "trials": [
                {"trial_id": t.trial_id, "status": t.status, "node_id": t.node_id, "run_id": t.mlflow_run_id,
                 "epoch": t.metrics.get("epoch")}
                for t in result.trials
            ],
        },
        open(args["result_file"], "w"),
    )
    """
)


@pytest.fixture(scope="module")
def node_env(s3_server: S3Server) -> dict[str, str]:
    """What every node of the cluster has, as on a real cluster: S3 credentials for trial storage."""
    return {
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_DEFAULT_REGION": s3_server.region,
    }


@pytest.fixture(scope="module")
def head(node_env: dict[str, str]) -> Iterator[RayNode]:
    root = short_tmp_dir("rt_mn_")
    # One CPU: two concurrent one-CPU trials only fit if the worker node takes one.
    node = start_ray_head(root, num_cpus=1, resources={"head_node": 1}, env=node_env)
    try:
        yield node
    finally:
        node.handle.stop()
        shutil.rmtree(root, ignore_errors=True)


class Study:
    """One study of the driver script: arguments, a log of trial events, and how to run it."""

    def __init__(
        self,
        tmp: Path,
        head: RayNode,
        s3: S3Server,
        mlflow: MlflowServer,
        node_env: dict[str, str],
        **kw: Any,
    ) -> None:
        self.name = f"mn_{uuid.uuid4().hex[:8]}"
        self.tmp = tmp
        self.log_file = tmp / "events.jsonl"
        self.result_file = tmp / "result.json"
        self.prefix = f"studies-{self.name}"
        self.args = {
            "name": self.name,
            "epochs": kw.get("epochs", 3),
            "sleep_s": kw.get("sleep_s", 0.5),
            "num_samples": kw.get("num_samples", 4),
            "storage_path": f"s3://{s3.bucket}/{self.prefix}",
            "endpoint": s3.endpoint,
            "tracking_uri": mlflow.tracking_uri,
            "log_file": str(self.log_file),
            "result_file": str(self.result_file),
        }
        (tmp / "args.json").write_text(json.dumps(self.args))
        (tmp / "driver.py").write_text(DRIVER)
        self.env = head.client_env()
        self.env.update(node_env)
        self.env["PYTHONPATH"] = str(ROOT)
        self.env.pop("MLFLOW_TRACKING_URI", None)

    def start(self) -> subprocess.Popen[str]:
        self.result_file.unlink(missing_ok=True)
        return subprocess.Popen(
            [sys.executable, str(self.tmp / "driver.py"), str(self.tmp / "args.json")],
            env=self.env,
            cwd=self.tmp,
            stdout=open(self.tmp / "driver.log", "a"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def finish(self, proc: subprocess.Popen[str], timeout: float = 900) -> dict[str, Any]:
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log = (self.tmp / "driver.log").read_text()
        assert rc == 0, log[-5000:]
        return dict(json.loads(self.result_file.read_text()))

    def run(self) -> dict[str, Any]:
        return self.finish(self.start())

    def events(self) -> list[dict[str, Any]]:
        if not self.log_file.exists():
            return []
        return [json.loads(line) for line in self.log_file.read_text().splitlines() if line.strip()]


def _mlflow_trial_runs(mlflow: MlflowServer, experiment: str) -> tuple[list[Any], list[Any]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow.tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("autonorm.role") == "study"]
    children = [r for r in runs if r.data.tags.get("autonorm.role") == "trial"]
    return parents, children


@pytest.fixture
def worker(head: RayNode, node_env: dict[str, str]) -> Iterator[RayNode]:
    root = short_tmp_dir("rt_mnw_")
    node = start_ray_worker(head, root, num_cpus=1, resources={"worker_node": 1}, env=node_env)
    try:
        yield node
    finally:
        node.handle.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_multinode_trials_land_on_both_nodes(
    tmp_path: Path,
    head: RayNode,
    worker: RayNode,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
    node_env: dict[str, str],
) -> None:
    study = Study(tmp_path, head, s3_server, mlflow_server, node_env)
    result = study.run()

    trials = result["trials"]
    assert len(trials) == 4 and {t["status"] for t in trials} == {"completed"}
    assert {t["node_id"] for t in trials} == {head.node_id, worker.node_id}
    # Each trial's every epoch ran on the node it reported from (the events come from the workers).
    by_trial = {t["trial_id"]: t["node_id"] for t in trials}
    assert all(e["node"] == by_trial[e["trial"]] for e in study.events())

    # Trial results and checkpoints are objects in the bucket, not files on a node.
    keys = s3_server.list_keys(f"{study.prefix}/{study.name}/")
    assert any(k.endswith("experiment_state.json") or "experiment_state" in k for k in keys), keys[:20]
    # (trial folders are named after the trials' readable names: one folder of checkpoints per trial)
    with_checkpoints = {k.split("/checkpoint_")[0] for k in keys if "/checkpoint_" in k}
    assert len(with_checkpoints) == len(by_trial), sorted(with_checkpoints)

    parents, children = _mlflow_trial_runs(mlflow_server, study.name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["ray.trial_id"] for r in children) == sorted(by_trial)


def test_multinode_worker_killed_mid_study_resumes_every_trial(
    tmp_path: Path,
    head: RayNode,
    worker: RayNode,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
    node_env: dict[str, str],
) -> None:
    # 4 trials of 4 epochs on 2 one-CPU slots: the kill lands at the victim's epoch 2, with 2 epochs of it
    # still to run and 2 trials not yet started (1 s per epoch leaves the victim 2 s to spare).
    study = Study(tmp_path, head, s3_server, mlflow_server, node_env, epochs=4, sleep_s=1.0, num_samples=4)
    driver = study.start()

    def worker_trial_progressed() -> bool:
        done = [e for e in study.events() if e["node"] == worker.node_id and e["event"] == "epoch"]
        return any(e["epoch"] >= 2 for e in done) and driver.poll() is None

    assert wait_for(worker_trial_progressed, timeout=600, interval=0.2), (
        tmp_path / "driver.log"
    ).read_text()[-3000:]
    before = study.events()
    victim = next(
        e["trial"] for e in reversed(before) if e["node"] == worker.node_id and e["event"] == "epoch"
    )
    reached = max(e["epoch"] for e in before if e["trial"] == victim and e["event"] == "epoch")
    killed_at = time.time()
    pids = worker.handle.pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10)

    result = study.finish(driver)
    trials = result["trials"]
    assert len(trials) == 4
    assert len({t["trial_id"] for t in trials}) == 4
    assert {t["status"] for t in trials} == {"completed"}
    assert all(t["epoch"] == 4 for t in trials)

    # The victim resumed after the kill, on the surviving node, from its last checkpoint.
    resumed = [
        e for e in study.events() if e["trial"] == victim and e["event"] == "start" and e["t"] > killed_at
    ]
    assert resumed, "the interrupted trial never restarted"
    assert resumed[0]["node"] == head.node_id
    assert resumed[0]["start"] >= reached + 1
    assert next(t for t in trials if t["trial_id"] == victim)["node_id"] == head.node_id
    # Epochs before the checkpoint were not trained twice.
    victim_epochs = [e["epoch"] for e in study.events() if e["trial"] == victim and e["event"] == "epoch"]
    assert sorted(set(victim_epochs)) == list(range(1, 5))
    assert len(victim_epochs) - len(set(victim_epochs)) <= 1  # at most the epoch in flight at the kill

    # MLflow: one child per trial, none left RUNNING, steps not duplicated.
    from mlflow import MlflowClient

    parents, children = _mlflow_trial_runs(mlflow_server, study.name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["ray.trial_id"] for r in children) == sorted(t["trial_id"] for t in trials)
    assert {r.info.status for r in children} == {"FINISHED"}
    victim_run = next(r for r in children if r.data.tags["ray.trial_id"] == victim)
    history = MlflowClient(tracking_uri=mlflow_server.tracking_uri).get_metric_history(
        victim_run.info.run_id, "epoch"
    )
    steps = [m.step for m in history]
    assert sorted(steps) == list(range(1, 5)), steps

    # Ray saw the worker node die.
    assert wait_for(lambda: worker.node_id in _dead_node_ids(head), timeout=120)

    # The same command again restores the finished study from S3: nothing re-runs, nothing duplicates.
    starts_before = len([e for e in study.events() if e["event"] == "start"])
    again = study.run()
    assert again["restored"] is True
    assert sorted(t["trial_id"] for t in again["trials"]) == sorted(t["trial_id"] for t in trials)
    assert len([e for e in study.events() if e["event"] == "start"]) == starts_before
    _, children_after = _mlflow_trial_runs(mlflow_server, study.name)
    assert len(children_after) == 4


def _dead_node_ids(head: RayNode) -> set[str]:
    return {str(n["node_id"]) for n in list_nodes(head) if n.get("state") == "DEAD"}
