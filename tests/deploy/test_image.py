"""deploy/Dockerfile builds a reproducible, offline-capable, traceable image (checked by parsing it).

No Docker engine here: :func:`tests.deploy.static_checks.dockerfile_problems` reads the Dockerfile's
instructions and the shell commands of its RUN lines. Each check is also shown to catch the
Dockerfile as it was before (no constraints, no data, no commit) and targeted breakages.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autonorm_core import data
from studies.cli import CARRIED_NAMES
from studies.schema import git_commit
from tests.deploy.static_checks import (
    dockerfile_problems,
    parse_dockerfile,
    pip_installs,
    read_constraints,
    shell_commands,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DATA_DIR = str(data._FASHION_MNIST_DIR)

# The study image's Dockerfile before this check existed (comments dropped): installs without
# constraints, no data set, no commit.
OLD_DOCKERFILE = """\
# syntax=docker/dockerfile:1.7
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu
FROM ${RAY_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PYTHONDONTWRITEBYTECODE=1 \\
    PYTHONUNBUFFERED=1 \\
    AUTONORM_APP=/home/ray/app
USER ray
WORKDIR /home/ray/app
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users autonorm_core/ autonorm_core/
COPY --chown=ray:users workers/ workers/
COPY --chown=ray:users studies/ studies/
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" . \\
    && python -c "import ray, autonorm_core, workers, studies"
USER ray
"""


def _pins() -> dict[str, str]:
    return read_constraints((ROOT / "constraints.txt").read_text())


def _problems(text: str) -> list[str]:
    return dockerfile_problems(text, pins=_pins(), data_dir=DATA_DIR)


def test_the_study_image_is_pinned_offline_capable_and_traceable() -> None:
    assert _problems(DOCKERFILE.read_text()) == []


def test_the_check_catches_the_old_dockerfile() -> None:
    problems = _problems(OLD_DOCKERFILE)
    for expected in (
        "-c constraints.txt",
        "Fashion-MNIST",
        "ARG GIT_COMMIT",
        "AUTONORM_GIT_COMMIT",
        "revision",
    ):
        assert any(expected in p for p in problems), (expected, problems)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("pip install -c constraints.txt ", "pip install ", "-c constraints.txt"),
        ("COPY --chown=ray:users constraints.txt ./\n", "", "constraints.txt is not copied"),
        ("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0", "constraints.txt pins torch=="),
        ('"torch==${TORCH_VERSION}"', "torch", "constraints.txt pins torch=="),
        (
            'RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"\n',
            'RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" numpy\n',
            "not constrained",
        ),
        (
            "/usr/share/datasets/fashion-mnist/ /usr/share/datasets/fashion-mnist/",
            "/usr/share/datasets/fashion-mnist/ /home/ray/fashion-mnist/",
            "Fashion-MNIST",
        ),
        ('"dataset-fashion-mnist=${FASHION_MNIST_DEB}"', "dataset-mnist", "Fashion-MNIST"),
        ("ARG GIT_COMMIT=unknown\n", "", "ARG GIT_COMMIT"),
        ("ENV AUTONORM_GIT_COMMIT=${GIT_COMMIT}", "ENV AUTONORM_GIT_COMMIT=unknown", "AUTONORM_GIT_COMMIT"),
        (
            'org.opencontainers.image.revision="${GIT_COMMIT}"',
            'org.opencontainers.image.version="0.1"',
            "revision",
        ),
    ],
    ids=[
        "no-constraints",
        "constraints-not-copied",
        "torch-version-drift",
        "torch-unpinned",
        "extra-unconstrained-install",
        "data-elsewhere",
        "no-data-package",
        "no-commit-arg",
        "commit-env-literal",
        "no-revision-label",
    ],
)
def test_the_check_catches_a_broken_dockerfile(old: str, new: str, expected: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    problems = _problems(text.replace(old, new))
    assert any(expected in p for p in problems), problems


def test_torch_is_installed_before_the_package() -> None:
    text = DOCKERFILE.read_text()
    torch_run = 'RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"\n'
    assert torch_run in text
    moved = text.replace(torch_run, "").replace("\nARG GIT_COMMIT", "\n" + torch_run + "ARG GIT_COMMIT")
    assert any("installed after the package" in p for p in _problems(moved))


def test_parser_reads_stages_continuations_and_shell_commands() -> None:
    preamble, stages = parse_dockerfile(DOCKERFILE.read_text())
    assert [i.args for i in preamble] == ["RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu"]
    assert [(s.base, s.name) for s in stages] == [
        ("debian:bookworm-slim", "fashion-mnist"),
        ("${RAY_IMAGE}", None),
    ]
    final = stages[-1]
    installs = pip_installs(final)
    assert [p.targets for p in installs] == [["torch==${TORCH_VERSION}"], ["."]]
    assert installs[1].constraints() == ["constraints.txt"]
    assert shell_commands('a "b && c" && d; e | f') == [["a", "b && c"], ["d"], ["e"], ["f"]]


def test_torch_pin_matches_setup_and_constraints() -> None:
    """The image installs torch exactly like scripts/setup.sh: the constraints.txt version, first."""
    _, stages = parse_dockerfile(DOCKERFILE.read_text())
    version = stages[-1].arg_defaults()["TORCH_VERSION"]
    assert version == _pins()["torch"]
    assert re.search(
        rf"pip\" install [^\n]*torch=={re.escape(str(version))}\n",
        (ROOT / "scripts" / "setup.sh").read_text(),
    )


def test_data_set_lands_where_autonorm_core_reads_it() -> None:
    assert DATA_DIR == "/usr/share/datasets/fashion-mnist"
    assert "/usr/share/datasets/fashion-mnist" in (ROOT / "scripts" / "fetch_data.sh").read_text()


def test_commit_reaches_the_study() -> None:
    """The ENV name the image sets is the one the study records (and `autonorm-study submit` carries)."""
    assert git_commit({"AUTONORM_GIT_COMMIT": "0123abc"}) == "0123abc"
    assert "AUTONORM_GIT_COMMIT" in CARRIED_NAMES


def test_build_commands_pass_the_commit_and_context_admits_constraints() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text().replace("\\\n", " ")
    builds = [line for line in readme.splitlines() if "docker build -f deploy/Dockerfile" in line]
    assert len(builds) >= 2
    for line in builds:
        assert "--build-arg GIT_COMMIT=$(git rev-parse HEAD)" in line, line
    ignore = [
        line.strip()
        for line in (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Last match wins: constraints.txt is re-included after the catch-all and not excluded again.
    assert ignore[0] == "**"
    assert "!constraints.txt" in ignore
    later = ignore[ignore.index("!constraints.txt") + 1 :]
    assert not any(
        p.lstrip("!") in ("constraints.txt", "*.txt", "**/*.txt") and not p.startswith("!") for p in later
    )
