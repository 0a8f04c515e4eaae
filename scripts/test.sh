#!/usr/bin/env bash
# Set up from nothing, then lint, type-check and run the whole test suite. The tests start the real services
# they need themselves (PostgreSQL, SeaweedFS S3, MLflow server, Ray head/worker nodes) on loopback, and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # keep every Ray listener on 127.0.0.1
echo "[test] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] pytest"
.venv/bin/python -m pytest "$@"
