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
  # Byte-compiled once, after the installs, on every core (pip's own compile is one file at a time: ~50 s
  # of a fresh setup here, against ~30 s). Never skipped: where PYTHONDONTWRITEBYTECODE is set (this
  # machine and CI set it) Python never writes a .pyc itself, so every process - each Ray worker, each
  # CLI a test starts - would compile torch, Ray and MLflow from source again: measured 8.3-9.6 s to
  # import them against 3.6-5.3 s, and a CI run of 2005 s against ~900 s.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile -c constraints.txt -e ".[dev]"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # A few files in the dependencies are not Python 3 (templates, fixtures): compileall reports them and
  # exits 1, as pip ignores them; whether the packages import is checked below.
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
  "$VENV/bin/python" -c 'import torch, ray, mlflow, optuna, pydantic, boto3' || {
    echo "[setup] the installed packages do not import" >&2
    exit 1
  }
  echo "$want" > "$stamp"
else
  echo "[setup] dependencies up to date"
fi

# The project's own modules too (a second, cheap run only checks timestamps).
"$VENV/bin/python" -m compileall -q -j 0 autonorm_core workers studies bench >/dev/null

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
