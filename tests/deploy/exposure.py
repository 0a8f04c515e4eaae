"""Static checks that a deployment file exposes nothing publicly and carries no secret.

Each ``*_problems`` function returns human-readable findings (empty = fine), so a test can assert
both that the shipped files are clean and that a deliberately bad variant is caught.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE)
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")
_URI_WITH_PASSWORD = re.compile(r"://[^/:@\s]+:([^@/\s]+)@")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose-style ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` with ``env`` or defaults."""
    env = env or {}

    def repl(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if name in env:
            return env[name]
        if op in (":-", "-"):
            return arg or ""
        return f"<{name}>"

    return _INTERPOLATION.sub(repl, text)


def compose_variables(text: str) -> set[str]:
    """Names of every ``${VAR...}`` a compose file reads (``$${...}`` escapes excluded)."""
    return {m.group(1) for m in _INTERPOLATION.finditer(text.replace("$$", ""))}


def _command_tokens(command: Any) -> list[str]:
    if command is None:
        return []
    if isinstance(command, str):
        return command.split()
    return [str(part) for part in command]


def _flag_values(tokens: list[str], flag: str) -> list[str]:
    values = []
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            values.append(tokens[i + 1])
        elif token.startswith(flag + "="):
            values.append(token.split("=", 1)[1])
    return values


def mlflow_server_problems(where: str, tokens: list[str]) -> list[str]:
    """An ``mlflow server`` command line must require a login and pin the accepted Host headers."""
    problems: list[str] = []
    if "server" not in tokens:
        return problems
    if _flag_values(tokens, "--app-name") != ["basic-auth"]:
        problems.append(f"{where}: mlflow server without --app-name basic-auth (anyone could read and write)")
    hosts = _flag_values(tokens, "--allowed-hosts")
    if not hosts:
        problems.append(f"{where}: mlflow server without --allowed-hosts")
    elif any(h.strip() == "*" for value in hosts for h in interpolate(value).split(",")):
        problems.append(f"{where}: --allowed-hosts accepts any host ('*')")
    if "--disable-security-middleware" in tokens:
        problems.append(f"{where}: --disable-security-middleware")
    return problems


def _literal_secret(name: str, value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float):
        return False
    text = str(value)
    if _SECRET_NAME.search(name) and text and not _INTERPOLATION.fullmatch(text.strip()):
        return True
    match = _URI_WITH_PASSWORD.search(text)
    return bool(match and not _INTERPOLATION.fullmatch(match.group(1)))


def _compose_ports(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(host_ip, description)`` of every published port; host_ip '' means all interfaces."""
    for entry in service.get("ports", []) or []:
        if isinstance(entry, dict):
            if entry.get("published") is None:
                continue
            yield str(entry.get("host_ip", "")), str(entry)
            continue
        text = interpolate(str(entry)).split("/", 1)[0]
        if text.startswith("["):  # [::1]:8080:80
            host = text[1:].partition("]:")[0]
            yield host, str(entry)
            continue
        parts = text.split(":")
        if (
            len(parts) == 1 or len(parts) == 2
        ):  # container port only: docker publishes it on a random port, all interfaces
            yield "", str(entry)
        else:
            yield parts[0], str(entry)


def compose_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in (doc.get("services") or {}).items():
        where = f"services.{name}"
        for host_ip, desc in _compose_ports(service):
            if host_ip not in LOOPBACK:
                problems.append(f"{where}: port {desc} is published on all interfaces, not 127.0.0.1")
        if service.get("network_mode") == "host":
            problems.append(f"{where}: network_mode host bypasses the loopback-only port bindings")
        tokens = _command_tokens(service.get("command"))
        image = f"{service.get('image', '')} {service.get('build', '')}"
        if "mlflow" in image or (tokens[:1] == ["mlflow"]):
            problems += mlflow_server_problems(where, tokens[1:] if tokens[:1] == ["mlflow"] else tokens)
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) if "=" in item else (item, None) for item in environment)
        for key, value in environment.items():
            if _literal_secret(key, value):
                problems.append(f"{where}.environment.{key}: a literal secret; take it from the env file")
    return problems


# --------------------------------------------------------------------------------------------------
# Kubernetes


def pod_templates(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, PodTemplateSpec)`` of every pod a manifest creates (workloads and KubeRay CRs)."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield "spec.template", spec.get("template") or {}
    elif kind == "CronJob":
        yield "spec.jobTemplate.spec.template", spec["jobTemplate"]["spec"]["template"]
    elif kind == "Pod":
        yield "", {"metadata": doc.get("metadata", {}), "spec": spec}
    elif kind in ("RayCluster", "RayJob"):
        cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec") or {}
        prefix = "spec" if kind == "RayCluster" else "spec.rayClusterSpec"
        if "headGroupSpec" in cluster:
            yield f"{prefix}.headGroupSpec.template", cluster["headGroupSpec"].get("template") or {}
        for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
            yield f"{prefix}.workerGroupSpecs[{i}].template", group.get("template") or {}
        if kind == "RayJob" and spec.get("submitterPodTemplate"):
            yield "spec.submitterPodTemplate", spec["submitterPodTemplate"]


def _env_has(container: dict[str, Any], name: str, value: str) -> bool:
    return any(e.get("name") == name and e.get("value") == value for e in container.get("env") or [])


def k8s_problems(doc: dict[str, Any]) -> list[str]:
    kind = doc.get("kind", "")
    name = (doc.get("metadata") or {}).get("name", "?")
    where = f"{kind}/{name}"
    spec = doc.get("spec") or {}
    problems = []
    if kind in ("Ingress", "Gateway", "HTTPRoute", "Route"):
        problems.append(f"{where}: exposes a service outside the cluster; use kubectl port-forward")
    if kind == "Service":
        if spec.get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"{where}: Service type {spec.get('type')} is reachable from outside the cluster")
        if spec.get("externalIPs"):
            problems.append(f"{where}: externalIPs")
    if kind == "Secret" and (doc.get("data") or doc.get("stringData")):
        problems.append(f"{where}: secret values committed to the repository")
    for path, template in pod_templates(doc):
        pod = template.get("spec") or {}
        if pod.get("hostNetwork"):
            problems.append(f"{where} {path}: hostNetwork exposes every port on the node")
        for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
            cwhere = f"{where} {path} container {container.get('name')}"
            for port in container.get("ports") or []:
                if "hostPort" in port:
                    problems.append(f"{cwhere}: hostPort {port['hostPort']} publishes on the node")
            for env in container.get("env") or []:
                if "value" in env and _literal_secret(str(env.get("name")), env["value"]):
                    problems.append(f"{cwhere}: env {env.get('name')} is a literal secret; use secretKeyRef")
            tokens = [str(t) for t in (container.get("command") or []) + (container.get("args") or [])]
            problems += mlflow_server_problems(cwhere, tokens)
    if kind in ("RayCluster", "RayJob"):
        problems += _ray_problems(where, doc)
    return problems


def _ray_problems(where: str, doc: dict[str, Any]) -> list[str]:
    spec = doc.get("spec") or {}
    cluster = spec if doc["kind"] == "RayCluster" else spec.get("rayClusterSpec")
    if cluster is None:  # a RayJob on an existing cluster (clusterSelector)
        return []
    problems = []
    head = cluster.get("headGroupSpec") or {}
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        problems.append(f"{where}: head service type {head.get('serviceType')} exposes the dashboard")
    if head.get("enableIngress"):
        problems.append(f"{where}: enableIngress exposes the dashboard")
    auth_by_operator = (cluster.get("authOptions") or {}).get("mode") == "token"
    if not auth_by_operator:
        for path, template in pod_templates(doc):
            for container in (template.get("spec") or {}).get("containers") or []:
                if not _env_has(container, "RAY_AUTH_MODE", "token"):
                    problems.append(
                        f"{where} {path}: container {container.get('name')} without RAY_AUTH_MODE=token"
                    )
        autoscaler = cluster.get("autoscalerOptions") or {}
        if cluster.get("enableInTreeAutoscaling") and not _env_has(autoscaler, "RAY_AUTH_MODE", "token"):
            problems.append(f"{where}: autoscaler without RAY_AUTH_MODE=token")
    return problems


# --------------------------------------------------------------------------------------------------
# Ray cluster launcher


def launcher_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in doc.get(key) or [] if "ray start" in c]
        if not starts:
            problems.append(f"{key}: no `ray start` command")
        for command in starts:
            if "RAY_AUTH_MODE=token" not in command:
                problems.append(f"{key}: `ray start` without RAY_AUTH_MODE=token")
            if "--head" in command:
                hosts = _flag_values(command.split(), "--dashboard-host")
                if hosts != ["127.0.0.1"] and hosts != ["localhost"]:
                    problems.append(f"{key}: dashboard not bound to 127.0.0.1 ({hosts or 'default'})")
    for option in (doc.get("docker") or {}).get("run_options") or []:
        if re.search(r"(^|\s)(-p|--publish)(\s|=)", option):
            problems.append(f"docker.run_options: {option!r} publishes a port")
    for local in (doc.get("file_mounts") or {}).values():
        if not str(local).startswith("~"):
            problems.append(
                f"file_mounts: {local!r} is not in the user's home (secrets must stay out of the repo)"
            )
    return problems
