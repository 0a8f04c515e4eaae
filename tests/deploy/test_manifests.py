"""deploy/ is valid and safe: every manifest against its schema, nothing public, no secret committed.

Kubernetes built-ins are validated with kubernetes-validate (the API's own OpenAPI schemas, strict:
unknown fields are errors); the KubeRay CRs with the trimmed CRD schema vendored in deploy/schemas,
and their pod templates again with kubernetes-validate as core/v1 PodTemplates; the cluster
launcher with the schema Ray itself ships (ray/autoscaler/ray-schema.json).
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import ray
import yaml

from tests.deploy.exposure import (
    compose_problems,
    compose_variables,
    k8s_problems,
    launcher_problems,
    pod_templates,
)
from tests.deploy.static_checks import entrypoint_problems, parse_dockerfile, rayjob_entrypoints

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"
K8S_FILES = sorted((DEPLOY / "kuberay").glob("*.yaml"))
CRD_SCHEMAS = {
    "RayCluster": DEPLOY / "schemas" / "raycluster-v1.schema.json",
    "RayJob": DEPLOY / "schemas" / "rayjob-v1.schema.json",
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _all_k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.name}:{d['kind']}/{d['metadata']['name']}", d) for p in K8S_FILES for d in _docs(p)]


def _crd_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads(CRD_SCHEMAS[kind].read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_k8s(doc: dict[str, Any]) -> None:
    """Raise if ``doc`` does not match its schema (CRD schema + core/v1 pods, or the k8s API)."""
    if doc["kind"] in CRD_SCHEMAS:
        _crd_validator(doc["kind"]).validate(doc)
        for path, template in pod_templates(doc):
            wrapped = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "t"},
                "template": template,
            }
            try:
                kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                raise AssertionError(f"{path}: {err.message} at {list(err.path)}") from err
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_deploy_manifest_is_covered() -> None:
    kinds = sorted(d["kind"] for _, d in _all_k8s_docs())
    assert {"RayCluster", "RayJob", "Deployment", "Service"} <= set(kinds)
    assert (DEPLOY / "compose.yaml").exists() and (DEPLOY / "cluster-launcher" / "aws-gpu.yaml").exists()


@pytest.mark.parametrize(("label", "doc"), _all_k8s_docs(), ids=[label for label, _ in _all_k8s_docs()])
def test_k8s_manifest_matches_its_schema(label: str, doc: dict[str, Any]) -> None:
    validate_k8s(doc)


@pytest.mark.parametrize(("label", "doc"), _all_k8s_docs(), ids=[label for label, _ in _all_k8s_docs()])
def test_k8s_manifest_exposes_nothing(label: str, doc: dict[str, Any]) -> None:
    assert k8s_problems(doc) == []


def _raycluster() -> dict[str, Any]:
    return next(d for _, d in _all_k8s_docs() if d["kind"] == "RayCluster")


def _rayjob() -> dict[str, Any]:
    return next(d for _, d in _all_k8s_docs() if d["kind"] == "RayJob")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"].pop("headGroupSpec"),
        lambda d: d["spec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda d: d["spec"]["workerGroupSpecs"][0].__setitem__("minReplica", 0),  # typo: pruned by the API
        lambda d: d["spec"]["workerGroupSpecs"][0].__setitem__("maxReplicas", -1),
        lambda d: d["spec"]["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 0),  # must be a string
        lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].__setitem__(
            "resources", "lots"
        ),
        lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].__setitem__("port", 8265),
        lambda d: d.__setitem__("apiVersion", "ray.io/v1alpha1"),
    ],
    ids=[
        "no-head",
        "no-group-name",
        "unknown-field",
        "negative-max",
        "int-start-param",
        "pod-wrong-type",
        "pod-unknown-field",
        "old-api",
    ],
)
def test_schema_validation_rejects_broken_raycluster(mutate: Any) -> None:
    doc = copy.deepcopy(_raycluster())
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, AssertionError, kubernetes_validate.ValidationError)):
        validate_k8s(doc)


def test_kubernetes_validate_rejects_broken_builtin() -> None:
    deployment = next(d for _, d in _all_k8s_docs() if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(broken)


def test_raycluster_has_cpu_head_and_autoscaling_gpu_workers() -> None:
    for cluster in (_raycluster()["spec"], _rayjob()["spec"]["rayClusterSpec"]):
        assert cluster["enableInTreeAutoscaling"] is True
        assert cluster["rayVersion"] == ray.__version__
        head = cluster["headGroupSpec"]
        assert head["rayStartParams"]["num-cpus"] == "0"
        head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in head_limits
        (gpu,) = cluster["workerGroupSpecs"]
        assert (
            gpu["minReplicas"] <= gpu["replicas"] <= gpu["maxReplicas"]
            and gpu["maxReplicas"] > gpu["minReplicas"]
        )
        container = gpu["template"]["spec"]["containers"][0]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) >= 1 and gpu["rayStartParams"]["num-gpus"] == gpus
        assert (
            container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        )  # extended resources: requests == limits


def _image_app_dir() -> str:
    """Where deploy/Dockerfile puts the checkout (the final WORKDIR)."""
    _, stages = parse_dockerfile((DEPLOY / "Dockerfile").read_text())
    return stages[-1].args("WORKDIR")[-1]


def _local_command(entrypoint: str) -> list[str]:
    """The entrypoint's words, image paths mapped to this checkout and python to the venv's."""
    app = _image_app_dir().rstrip("/") + "/"
    words = [str(ROOT / w[len(app) :]) if w.startswith(app) else w for w in shlex.split(entrypoint)]
    assert words[0] == "python"
    return [str(ROOT / ".venv" / "bin" / "python"), *words[1:]]


def test_rayjob_runs_the_study_with_spec_from_configmap_and_secrets() -> None:
    job = _rayjob()["spec"]
    entrypoint = job["entrypoint"]
    words = shlex.split(entrypoint)
    # The study script by absolute path inside the image's checkout, which the image really holds.
    app = _image_app_dir()
    assert words[:2] == ["python", f"{app}/studies/batchsize_correlation.py"]
    assert (ROOT / "studies" / "batchsize_correlation.py").exists()
    final_stage = parse_dockerfile((DEPLOY / "Dockerfile").read_text())[1][-1]
    assert ["studies/", "studies/"] in [c.split()[-2:] for c in final_stage.args("COPY")]
    # The driver runs on the head (where the spec is mounted) only if it reserves no resources.
    assert not {"entrypointNumCpus", "entrypointNumGpus", "entrypointResources"} & set(job)
    spec_path = re.search(r"--spec\s+(\S+)", entrypoint)
    assert spec_path is not None
    head_pod = job["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head_pod["volumes"]}
    mounts = head_pod["containers"][0]["volumeMounts"]
    mount = next(m for m in mounts if spec_path.group(1).startswith(m["mountPath"] + "/"))
    config_map = volumes[mount["name"]]["configMap"]
    assert spec_path.group(1) == f"{mount['mountPath']}/{config_map['items'][0]['path']}"
    # Credentials: only references to Secrets, never values.
    env = {e["name"]: e for e in head_pod["containers"][0]["env"]}
    for name in ("RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME"):
        assert "secretKeyRef" in env[name]["valueFrom"]
    assert {"secretRef": {"name": "autonorm-s3"}} in head_pod["containers"][0]["envFrom"]
    # The study is resumable after a retry only if results live off the pod.
    assert "storage_path=s3://" in entrypoint
    # The README's ConfigMap command points at a spec file that exists.
    readme = (DEPLOY / "README.md").read_text()
    created = re.search(r"create configmap[^\n]*\n?[^\n]*--from-file=study\.yaml=(\S+)", readme)
    assert created is not None and (ROOT / created.group(1)).exists()


def test_rayjob_entrypoint_parses_with_the_shipped_spec(tmp_path: Path) -> None:
    """The exact entrypoint (image paths mapped to this checkout) is accepted by the study's CLI,
    from a working directory that is not the checkout (the job's driver starts wherever Ray puts it)."""
    command = _local_command(_rayjob()["spec"]["entrypoint"])
    command[command.index("--spec") + 1] = str(ROOT / "studies" / "specs" / "batchsize_correlation.yaml")
    result = subprocess.run(
        [*command, "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "s3://autonorm-runs/batchsize_correlation" in result.stdout + result.stderr


# --------------------------------------------------------------------------------------------------
# RayJob entrypoints as KubeRay submits them

OLD_ENTRYPOINT = (
    "cd /home/ray/app && python studies/batchsize_correlation.py --spec /home/ray/spec/study.yaml "
    "--set storage_path=s3://autonorm-runs/batchsize_correlation"
)
"""The entrypoint before the fix: KubeRay submitted only `cd /home/ray/app`."""

_RAYJOB_ENTRYPOINTS = list(rayjob_entrypoints(DEPLOY))


def test_every_rayjob_in_deploy_is_checked() -> None:
    assert [where for where, _ in _RAYJOB_ENTRYPOINTS] == ["kuberay/rayjob.yaml:RayJob/batchsize-correlation"]


@pytest.mark.parametrize(
    ("where", "entrypoint"), _RAYJOB_ENTRYPOINTS, ids=[w for w, _ in _RAYJOB_ENTRYPOINTS]
)
def test_rayjob_entrypoint_is_one_plain_command(where: str, entrypoint: Any) -> None:
    assert entrypoint_problems(entrypoint, where) == []


def test_entrypoint_check_rejects_the_old_entrypoint() -> None:
    problems = entrypoint_problems(OLD_ENTRYPOINT)
    assert len(problems) == 1 and "`&&`" in problems[0], problems


@pytest.mark.parametrize(
    ("operator", "named"),
    [
        (" && ", "`&&`"),
        (" || ", "`||`"),
        (" ; ", "`;`"),
        ("; ", "`;`"),
        (" | tee log", "`|`"),
        (" &", "`&`"),
        (" `hostname`", "backquote"),
        (" $(hostname)", "`$(`"),
        (" > log", "`>`"),
        (" 2>&1", "`>`"),
        (" < /dev/null", "`<`"),
        ("\n", "newline"),
        (" $HOME", "shell syntax"),
        (" --set 'seeds=[0,1]'", "shell syntax"),
        (" # comment", "shell syntax"),
    ],
)
def test_entrypoint_check_rejects_every_shell_operator(operator: str, named: str) -> None:
    entrypoint = _rayjob()["spec"]["entrypoint"] + operator + " echo done"
    problems = entrypoint_problems(entrypoint)
    assert any(named in p for p in problems), problems


def test_entrypoint_check_reads_the_parsed_yaml_not_the_text(tmp_path: Path) -> None:
    """The old command, as a folded YAML block in a second document of a nested .yml, is found and rejected."""
    doc = copy.deepcopy(_rayjob())
    doc["spec"]["entrypoint"] = OLD_ENTRYPOINT
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    text = yaml.safe_dump({"kind": "ConfigMap", "metadata": {"name": "x"}})
    body = yaml.safe_dump(doc, width=10_000).replace(
        f"entrypoint: {OLD_ENTRYPOINT}\n",
        "entrypoint: >-\n    cd /home/ray/app &&\n    " + OLD_ENTRYPOINT[20:] + "\n",
    )
    assert "entrypoint: >-" in body
    (nested / "job.yml").write_text(f"{text}---\n{body}")
    found = list(rayjob_entrypoints(tmp_path))
    assert found == [("a/b/job.yml:RayJob/batchsize-correlation", OLD_ENTRYPOINT)]
    assert entrypoint_problems(found[0][1], found[0][0])


def _kuberay_submit(entrypoint: str, tmp_path: Path) -> tuple[list[str] | None, list[str]]:
    """Run KubeRay's K8sJobMode submitter command (job.go, BuildJobSubmitCommand) under bash.

    ``ray`` and every external program are stubs. Returns the words that reached
    ``ray job submit ... --`` (None if it was never called) and the programs bash ran in the submitter.
    """
    address = "http://batchsize-correlation-head-svc.autonorm.svc.cluster.local:8265"
    job_id = "batchsize-correlation-abcde"
    words = [
        *[
            "until",
            "true",
            ">/dev/null",
            "2>&1",
            ";",
            "do",
            "echo",
            "waiting",
            ";",
            "sleep",
            "2",
            ";",
            "done",
            ";",
        ],
        *["if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";", "then"],
        *["ray", "job", "submit", "--address", address, "--no-wait", "--submission-id", job_id],
        *["--", entrypoint.strip(), ";", "fi", ";"],
        *["ray", "job", "logs", "--address", address, "--follow", job_id],
    ]
    stubs = r"""
ray() {
  case "$2" in
    status) return 1 ;;
    submit) shift 2; while [ "$1" != "--" ]; do shift; done; shift; printf '%s\0' "$@" > "$OUT/submitted" ;;
  esac
  return 0
}
command_not_found_handle() { printf '%s\n' "$1" >> "$OUT/ran"; return 0; }
"""
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run(
        ["/bin/bash", "-c", stubs + " ".join(words)],
        env={"PATH": str(empty), "OUT": str(tmp_path), "HOME": "/home/submitter"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "syntax error" not in result.stderr, result.stderr
    submitted = tmp_path / "submitted"
    ran = tmp_path / "ran"
    return (
        submitted.read_text().split("\0")[:-1] if submitted.exists() else None,
        ran.read_text().split() if ran.exists() else [],
    )


def test_kuberay_submits_the_whole_entrypoint(tmp_path: Path) -> None:
    entrypoint = _rayjob()["spec"]["entrypoint"]
    submitted, ran_in_submitter = _kuberay_submit(entrypoint, tmp_path)
    assert submitted == shlex.split(entrypoint) == entrypoint.split()
    assert ran_in_submitter == []


def test_kuberay_submitter_would_run_the_old_entrypoint_itself(tmp_path: Path) -> None:
    """The failure the static check prevents, reproduced: only `cd` is submitted, python runs locally."""
    submitted, ran_in_submitter = _kuberay_submit(OLD_ENTRYPOINT, tmp_path)
    assert submitted == ["cd", "/home/ray/app"]
    assert ran_in_submitter == ["python"]


# --------------------------------------------------------------------------------------------------
# compose


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_file_parses_and_wires_mlflow_to_postgres_and_s3() -> None:
    services = _compose()["services"]
    assert {"postgres", "s3", "mlflow"} <= set(services)
    mlflow = services["mlflow"]
    env = mlflow["environment"]
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://")
    assert "@postgres:5432/" in env["MLFLOW_BACKEND_STORE_URI"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://s3:8333"
    assert "--serve-artifacts" in mlflow["command"]
    assert set(mlflow["depends_on"]) >= {"postgres", "create-bucket"}
    assert "ports" not in services["postgres"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, volume)
    assert (DEPLOY / "mlflow" / "Dockerfile").exists()


def test_compose_exposes_nothing_and_holds_no_secret() -> None:
    assert compose_problems(_compose()) == []


def test_compose_secrets_come_from_an_uncommitted_env_file() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    example = (DEPLOY / ".env.example").read_text()
    documented = {
        line.split("=", 1)[0] for line in example.splitlines() if "=" in line and not line.startswith("#")
    }
    assert compose_variables(text) <= documented
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, "deploy/.env must be git-ignored"
    not_ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env.example"], cwd=ROOT, check=False)
    assert not_ignored.returncode == 1


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["services"]["mlflow"].__setitem__("ports", ["5000:5000"]), "all interfaces"),
        (lambda d: d["services"]["mlflow"].__setitem__("ports", ["0.0.0.0:5000:5000"]), "all interfaces"),
        (lambda d: d["services"]["mlflow"].__setitem__("ports", ["5000"]), "all interfaces"),
        (
            lambda d: d["services"]["mlflow"].__setitem__("ports", [{"target": 5000, "published": 5000}]),
            "all interfaces",
        ),
        (lambda d: d["services"]["s3"].__setitem__("ports", ["${S3_PORT:-8333}:8333"]), "all interfaces"),
        (lambda d: d["services"]["mlflow"]["command"].remove("--app-name=basic-auth"), "basic-auth"),
        (
            lambda d: d["services"]["mlflow"].__setitem__(
                "command",
                [
                    c if not c.startswith("--allowed-hosts") else "--allowed-hosts=*"
                    for c in d["services"]["mlflow"]["command"]
                ],
            ),
            "any host",
        ),
        (
            lambda d: d["services"]["mlflow"]["command"].append("--disable-security-middleware"),
            "security-middleware",
        ),
        (lambda d: d["services"]["mlflow"].__setitem__("network_mode", "host"), "network_mode"),
        (
            lambda d: d["services"]["postgres"]["environment"].__setitem__("POSTGRES_PASSWORD", "hunter2"),
            "literal secret",
        ),
        (
            lambda d: d["services"]["mlflow"]["environment"].__setitem__(
                "MLFLOW_BACKEND_STORE_URI", "postgresql+psycopg2://mlflow:hunter2@postgres:5432/mlflow"
            ),
            "literal secret",
        ),
    ],
)
def test_compose_check_catches_a_bad_file(mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(_compose())
    mutate(doc)
    problems = compose_problems(doc)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["spec"]["headGroupSpec"].__setitem__("serviceType", "LoadBalancer"),
            "exposes the dashboard",
        ),
        (
            lambda d: d["spec"]["headGroupSpec"].__setitem__("serviceType", "NodePort"),
            "exposes the dashboard",
        ),
        (lambda d: d["spec"]["headGroupSpec"].__setitem__("enableIngress", True), "enableIngress"),
        (
            lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].pop("env"),
            "RAY_AUTH_MODE",
        ),
        (lambda d: d["spec"]["autoscalerOptions"].pop("env"), "autoscaler"),
        (
            lambda d: d["spec"]["headGroupSpec"]["template"]["spec"].__setitem__("hostNetwork", True),
            "hostNetwork",
        ),
        (
            lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][1].__setitem__(
                "hostPort", 8265
            ),
            "hostPort",
        ),
        (
            lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"].append(
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "abc123"}
            ),
            "literal secret",
        ),
    ],
)
def test_k8s_check_catches_a_bad_raycluster(mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(_raycluster())
    mutate(doc)
    problems = k8s_problems(doc)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "dash"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]},
            },
            "reachable from outside",
        ),
        (
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": "mlflow"},
                "spec": {
                    "defaultBackend": {"service": {"name": "autonorm-mlflow", "port": {"number": 5000}}}
                },
            },
            "port-forward",
        ),
        (
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s3"},
                "stringData": {"AWS_SECRET_ACCESS_KEY": "x"},
            },
            "committed",
        ),
    ],
    ids=["loadbalancer", "ingress", "secret"],
)
def test_k8s_check_catches_exposing_objects(doc: dict[str, Any], expected: str) -> None:
    validate_k8s(doc)  # valid Kubernetes, yet unsafe
    assert any(expected in p for p in k8s_problems(doc))


def test_k8s_check_catches_mlflow_without_auth() -> None:
    deployment = copy.deepcopy(next(d for _, d in _all_k8s_docs() if d["kind"] == "Deployment"))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    args.remove("--app-name=basic-auth")
    assert any("basic-auth" in p for p in k8s_problems(deployment))


# --------------------------------------------------------------------------------------------------
# cluster launcher


def _ray_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        (Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text()
    )
    return schema


def _launcher() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "cluster-launcher" / "aws-gpu.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_cluster_launcher_matches_rays_schema() -> None:
    jsonschema.validate(_launcher(), _ray_schema())


def test_cluster_launcher_has_cpu_head_and_autoscaling_gpus() -> None:
    doc = _launcher()
    head = doc["available_node_types"][doc["head_node_type"]]
    assert head["resources"] == {"CPU": 0}
    workers = [t for name, t in doc["available_node_types"].items() if name != doc["head_node_type"]]
    assert any(
        t["node_config"]["InstanceType"].startswith(("g", "p")) and t["max_workers"] > t.get("min_workers", 0)
        for t in workers
    )
    assert doc["docker"]["image"].endswith("-gpu")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("provider"),
        lambda d: d.__setitem__("max_workers", "eight"),
        lambda d: d.__setitem__("bogus", 1),
    ],
    ids=["no-provider", "string-max-workers", "unknown-key"],
)
def test_rays_schema_rejects_a_broken_launcher(mutate: Any) -> None:
    doc = copy.deepcopy(_launcher())
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _ray_schema())


def test_cluster_launcher_exposes_nothing() -> None:
    assert launcher_problems(_launcher()) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d.__setitem__(
                "head_start_ray_commands",
                [
                    c.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0")
                    for c in d["head_start_ray_commands"]
                ],
            ),
            "dashboard",
        ),
        (
            lambda d: d.__setitem__(
                "worker_start_ray_commands",
                [c.replace("RAY_AUTH_MODE=token ", "") for c in d["worker_start_ray_commands"]],
            ),
            "RAY_AUTH_MODE",
        ),
        (lambda d: d["docker"]["run_options"].append("-p 8265:8265"), "publishes"),
        (lambda d: d["file_mounts"].__setitem__("/home/ray/creds", "deploy/creds.env"), "home"),
    ],
    ids=["public-dashboard", "no-token", "published-port", "secret-in-repo"],
)
def test_launcher_check_catches_a_bad_config(mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(_launcher())
    mutate(doc)
    assert any(expected in p for p in launcher_problems(doc))


# --------------------------------------------------------------------------------------------------
# image


def test_dockerfile_builds_from_the_matching_ray_image_as_non_root() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^ARG RAY_IMAGE=(\S+)", text, re.MULTILINE)
    assert base is not None
    image, tag = base.group(1).split(":")
    assert image == "rayproject/ray"
    assert tag.startswith(ray.__version__ + "-py311")
    assert re.search(r"^FROM \$\{RAY_IMAGE\}", text, re.MULTILINE)
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"pip install [^\n]*\s\.\s*\\?$", text, re.MULTILINE)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert "**/.env" in ignore
    # Images named in the manifests are this image (CPU for head, -gpu for GPU workers).
    for _, doc in _all_k8s_docs():
        for _, template in pod_templates(doc):
            for container in template["spec"]["containers"]:
                if container["name"].startswith("ray"):
                    assert "autonorm-studies" in container["image"]
