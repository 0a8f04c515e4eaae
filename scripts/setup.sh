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
  # --no-compile: pip would byte-compile every file of torch, Ray and MLflow (~50 of a fresh setup's
  # ~120 s here); Python compiles the modules that are imported, once, on first import.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile -c constraints.txt -e ".[dev]"
  echo "$want" > "$stamp"
else
  echo "[setup] dependencies up to date"
fi

bash scripts/fetch_data.sh

# A browser for tests/integration/test_browser.py: Debian's chromium and its chromedriver, driven headless by
# Selenium with the driver path given explicitly (Selenium Manager never downloads a browser or a driver).
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  echo "[setup] browser present: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
else
  as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else echo "[setup] need root (or sudo) to run: $*" >&2; return 1
    fi
  }
  candidate="$(apt-cache policy chromium-driver 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    echo "[setup] apt does not know chromium-driver yet: running apt-get update"
    as_root apt-get update -qq
  fi
  echo "[setup] installing chromium and chromium-driver with apt-get (first run: about a minute)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { echo "[setup] chromium missing after install" >&2; exit 1; }
fi
echo "[setup] ready: $VENV/bin/python"
