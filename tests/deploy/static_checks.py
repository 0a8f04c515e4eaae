"""Static checks that deploy/ actually runs: RayJob entrypoints KubeRay can submit, a reproducible image.

Like :mod:`tests.deploy.exposure`, each ``*_problems`` function returns human-readable findings
(empty = fine), so a test can assert both that the shipped files pass and that a known-bad variant
(the manifests and Dockerfile as they were before) is caught.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# --------------------------------------------------------------------------------------------------
# RayJob entrypoints
#
# KubeRay (>= 1.3, ray-operator/controllers/ray/common/job.go, BuildJobSubmitCommand) builds the
# submitter's command as words joined by spaces and runs it with `bash -c`:
#
#   until <health check> ; do ... ; done ; if ! ray job status ... ; then
#   ray job submit --address ... --no-wait -- <entrypoint> ; fi ; ray job logs --follow ...
#
# The entrypoint is pasted as it is, unquoted. Whatever bash reads as syntax in it therefore acts in
# the submitter pod, not in the Ray job: `cd /app && python x.py` submits `cd /app` and then runs the
# study in the submitter (1 CPU, no spec mount); `;`, `|`, `>` and newlines split or redirect the
# command likewise; `$VAR`, `$(...)`, backquotes, `~`, globs and braces expand in the submitter; quotes
# and backslashes are eaten by the submitter's bash and not seen by the job's shell; `#` comments out
# the rest of the line, including KubeRay's closing `fi`. An entrypoint is safe only when it is one
# command of plain words: the characters below and single spaces or tabs.

_PLAIN = re.compile(r"[A-Za-z0-9_\-./:=,@%+]")
_OPERATORS = ("&&", "||", "$(", ";", "|", "&", "`", ">", "<", "\n", "\r")
_OPERATOR = re.compile("|".join(re.escape(op) for op in _OPERATORS))  # longest first: `&&` before `&`
_NAMES = {
    "&&": "`&&` (and-list)",
    "||": "`||` (or-list)",
    "$(": "`$(` (command substitution)",
    ";": "`;` (command separator)",
    "|": "`|` (pipe)",
    "&": "`&` (background)",
    "`": "backquote (command substitution)",
    ">": "`>` (redirection)",
    "<": "`<` (redirection)",
    "\n": "a newline (command separator)",
    "\r": "a carriage return",
}


def entrypoint_problems(entrypoint: Any, where: str = "entrypoint") -> list[str]:
    """Why ``entrypoint`` would not reach the Ray job intact through KubeRay's ``bash -c`` (empty: fine)."""
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        return [f"{where}: must be a non-empty string, got {entrypoint!r}"]
    found = set(_OPERATOR.findall(entrypoint))
    problems = [
        f"{where}: contains {_NAMES[op]}; KubeRay pastes the entrypoint unquoted into `bash -c`, so it "
        "acts in the submitter pod, not in the job"
        for op in _OPERATORS
        if op in found
    ]
    covered = {c for op in found for c in op}
    other = sorted({c for c in entrypoint if not (_PLAIN.fullmatch(c) or c in " \t" or c in covered)})
    if other:
        problems.append(
            f"{where}: contains shell syntax {''.join(other)!r} (expansion, quoting or comment), which the "
            "submitter's bash would interpret; use one command of plain words (put values that need "
            "quoting in the spec)"
        )
    return problems


def rayjob_entrypoints(root: Path) -> Iterator[tuple[str, Any]]:
    """``(where, entrypoint)`` of every RayJob in every YAML file under ``root`` (parsed, all documents)."""
    for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") == "RayJob":
                name = (doc.get("metadata") or {}).get("name", f"#{i}")
                yield f"{path.relative_to(root)}:RayJob/{name}", (doc.get("spec") or {}).get("entrypoint")


# --------------------------------------------------------------------------------------------------
# Dockerfile


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # continuation lines joined, comments dropped
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]

    def arg_defaults(self) -> dict[str, str | None]:
        defaults: dict[str, str | None] = {}
        for text in self.args("ARG"):
            name, sep, value = text.partition("=")
            defaults[name.strip()] = _unquote(value.strip()) if sep else None
        return defaults


def _unquote(text: str) -> str:
    parts = shlex.split(text)
    return parts[0] if len(parts) == 1 else text


def parse_dockerfile(text: str) -> tuple[list[Instruction], list[Stage]]:
    """Instructions before the first FROM, and the build stages (shell-form, no heredocs)."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comment lines (parser directives included) vanish, even inside a continuation
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(p for p in pending if p)
        pending = []
        keyword, _, args = joined.partition(" ")
        if "<<" in args and keyword.upper() in ("RUN", "COPY"):
            raise ValueError(f"line {start}: heredocs are not supported by this checker")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        raise ValueError("the Dockerfile ends inside a line continuation")
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(ins)
        else:
            preamble.append(ins)
    return preamble, stages


def shell_commands(run: str) -> list[list[str]]:
    """The simple commands of a shell-form RUN line, split on `&&`, `||`, `;` and `|`."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


_PIP_VALUE_OPTIONS = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-e",
    "--editable",
    "-t",
    "--target",
    "--prefix",
    "--root",
}


@dataclass
class PipInstall:
    targets: list[str]
    options: dict[str, list[str]]
    order: int  # position among the stage's RUN commands
    line: int  # line of its RUN instruction

    def constraints(self) -> list[str]:
        return self.options.get("-c", []) + self.options.get("--constraint", [])


def pip_installs(stage: Stage) -> list[PipInstall]:
    """Every ``pip install`` (also ``python -m pip``, ``pip3``) in the stage's RUN lines, in order."""
    found: list[PipInstall] = []
    order = 0
    for ins in stage.instructions:
        if ins.keyword != "RUN":
            continue
        for command in shell_commands(ins.args):
            order += 1
            words = command
            if (
                len(words) >= 3
                and re.fullmatch(r"python3?(\.\d+)?", words[0])
                and words[1:3] == ["-m", "pip"]
            ):
                words = ["pip", *words[3:]]
            if len(words) < 2 or not re.fullmatch(r"pip3?", words[0]) or words[1] != "install":
                continue
            targets: list[str] = []
            options: dict[str, list[str]] = {}
            rest = iter(words[2:])
            for word in rest:
                if word in _PIP_VALUE_OPTIONS:
                    options.setdefault(word, []).append(next(rest, ""))
                elif word.startswith("--") and "=" in word:
                    key, _, value = word.partition("=")
                    options.setdefault(key, []).append(value)
                elif word.startswith("-"):
                    options.setdefault(word, [])
                else:
                    targets.append(word)
            found.append(PipInstall(targets, options, order, ins.line))
    return found


def _program(command: list[str]) -> list[str]:
    """The command without leading ``NAME=value`` assignments, ``env`` or ``sudo``, and apt-get's options."""
    words = list(command)
    while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] in ("env", "sudo")):
        words.pop(0)
    if words[:1] == ["apt-get"]:
        words = ["apt-get", *[w for w in words[1:] if not w.startswith("-")]]
    return words


def _substitute(text: str, args: dict[str, str | None]) -> str:
    def repl(match: re.Match[str]) -> str:
        value = args.get(match.group(1) or match.group(2))
        return value if value is not None else match.group(0)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, text)


def _key_values(text: str) -> dict[str, str]:
    """``KEY=value ...`` pairs of an ENV or LABEL line (legacy ``ENV KEY value`` included)."""
    words = shlex.split(text, posix=True)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


def read_constraints(text: str) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line of a pip constraints file."""
    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def _is_this_package(target: str) -> bool:
    return target == "." or target.startswith(".[") or target in ("./", "/home/ray/app")


def dockerfile_problems(text: str, *, pins: dict[str, str], data_dir: str) -> list[str]:
    """What keeps the study image from being reproducible, offline-capable and traceable (empty: fine).

    ``pins``: :func:`read_constraints` of the repository's constraints.txt; ``data_dir``: where
    autonorm_core.data reads Fashion-MNIST.
    """
    problems: list[str] = []
    preamble, stages = parse_dockerfile(text)
    if not stages:
        return ["no FROM"]
    final = stages[-1]
    args = {**Stage("", None, preamble).arg_defaults(), **final.arg_defaults()}

    # Dependencies: torch first and exactly, then the package with -c constraints.txt.
    installs = pip_installs(final)
    package = [p for p in installs if any(_is_this_package(t) for t in p.targets)]
    if not package:
        problems.append("the final stage never pip-installs the package (`pip install ... .`)")
    for p in package:
        if not any(Path(c).name == "constraints.txt" for c in p.constraints()):
            problems.append(
                "the package is installed without `-c constraints.txt` (the repo's pinned versions)"
            )
    copied = [
        ins.line
        for ins in final.instructions
        if ins.keyword in ("COPY", "ADD") and "constraints.txt" in ins.args.split()
    ]
    if not copied or (package and min(copied) > min(p.line for p in package)):
        problems.append("constraints.txt is not copied into the image before the package install")
    torch = [(p, _substitute(t, args)) for p in installs for t in p.targets if re.match(r"torch\b", t)]
    if "torch" in pins:
        if not torch:
            problems.append("torch is not installed first and exactly (`pip install torch==<pin>`)")
        for p, target in torch:
            if target != f"torch=={pins['torch']}":
                problems.append(f"torch installed as {target!r}, constraints.txt pins torch=={pins['torch']}")
            if package and p.order > min(q.order for q in package):
                problems.append(
                    "torch is installed after the package: the package's `torch` requirement comes first"
                )
    for p in installs:
        pinned_torch = [t for t in p.targets if re.match(r"torch\b", t)]
        if p.targets and not p.constraints() and pinned_torch != p.targets:
            problems.append(f"`pip install {' '.join(p.targets)}` is not constrained by constraints.txt")

    # Fashion-MNIST, offline.
    norm = data_dir.rstrip("/")

    def installs_fmnist(stage: Stage) -> bool:
        return any(
            _program(cmd)[:2] == ["apt-get", "install"]
            and any(w.split("=", 1)[0] == "dataset-fashion-mnist" for w in cmd)
            for run in stage.args("RUN")
            for cmd in shell_commands(run)
        )

    data_stages = {s.name for s in stages[:-1] if s.name and installs_fmnist(s)}
    copies_data = False
    for ins in final.instructions:
        if ins.keyword != "COPY":
            continue
        words = ins.args.split()
        source = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        paths = [w.rstrip("/") for w in words if not w.startswith("--")]
        if source in data_stages and len(paths) == 2 and paths == [norm, norm]:
            copies_data = True
    if not (copies_data or installs_fmnist(final)):
        problems.append(
            f"the image does not carry Fashion-MNIST: install Debian dataset-fashion-mnist, or copy "
            f"{norm}/ from a stage that does, to the same path"
        )

    # The commit the image was built from.
    if "GIT_COMMIT" not in final.arg_defaults():
        problems.append("no `ARG GIT_COMMIT` in the final stage")
    env: dict[str, str] = {}
    for line in final.args("ENV"):
        env.update(_key_values(line))
    labels: dict[str, str] = {}
    for line in final.args("LABEL"):
        labels.update(_key_values(line))
    if env.get("AUTONORM_GIT_COMMIT") not in ("${GIT_COMMIT}", "$GIT_COMMIT"):
        problems.append(
            "AUTONORM_GIT_COMMIT is not set from ${GIT_COMMIT} (ENV AUTONORM_GIT_COMMIT=${GIT_COMMIT})"
        )
    if labels.get("org.opencontainers.image.revision") not in ("${GIT_COMMIT}", "$GIT_COMMIT"):
        problems.append("no OCI label org.opencontainers.image.revision=${GIT_COMMIT}")
    return problems
