"""Fixtures of the workers tests: a pre-built MLflow database (the shared Ray cluster, ``local_ray``, is
in tests/conftest.py).

Creating MLflow's sqlite schema runs every migration (seconds on a busy machine); tests copy one
database built once per session instead. The copy is byte-identical to what
``ensure_sqlite_schema`` produces, so the code path under test is the same.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.services import REPO_ROOT, ray_env
from workers.tracking import default_tracking_uri, ensure_sqlite_schema

__all__ = ["REPO_ROOT", "mlflow_template", "ray_env", "tracking_dir"]


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
