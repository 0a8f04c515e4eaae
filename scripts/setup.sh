#!/usr/bin/env bash
# Set up autonorm-studies from nothing: a virtualenv in .venv, the CPU torch wheel, the package with its dev
# extras (versions pinned by constraints.txt) and the offline data sets. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi

# Reinstall only when the dependency declaration changed.
stamp="$VENV/.autonorm-deps"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing dependencies (first run: a few minutes)"
  # torch first and exactly: a bare `torch` requirement would pull a multi-GB CUDA build.
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check -c constraints.txt -e ".[dev]"
  echo "$want" > "$stamp"
else
  echo "[setup] dependencies up to date"
fi

bash scripts/fetch_data.sh
echo "[setup] ready: $VENV/bin/python"
