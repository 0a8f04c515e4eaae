"""Fixtures of the workers tests: a local loopback Ray cluster and a pre-built MLflow database.

Creating MLflow's sqlite schema runs every migration (seconds on a busy machine); tests copy one
database built once per session instead. The copy is byte-identical to what
``ensure_sqlite_schema`` produces, so the code path under test is the same.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import embedded_ray
from workers.tracking import default_tracking_uri, ensure_sqlite_schema

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mlflow_template")
    ensure_sqlite_schema(default_tracking_uri(directory), artifact_root=str(directory))
    return directory / "mlflow.db"


@pytest.fixture
def tracking_dir(tmp_path: Path, mlflow_template: Path) -> Path:
    """A directory whose ``mlflow.db`` already has MLflow's schema."""
    shutil.copyfile(mlflow_template, tmp_path / "mlflow.db")
    return tmp_path


def ray_env() -> dict[str, str]:
    """What a local test cluster's workers need: the repo (for tests.workers.trials) on the path."""
    return {
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray cluster per test module, on loopback, with its own temp dir; stopped by PID."""
    with embedded_ray("rt_h5_", ray_env()):
        yield
