#!/usr/bin/env bash
# Set up autonorm-studies from nothing: a virtualenv in .venv, the CPU torch wheel, the package with its dev
# extras (versions pinned by constraints.txt) and the offline data sets. Idempotent: a second run only checks.
#
#   bash scripts/setup.sh             the above (what the README's first command runs)
#   bash scripts/setup.sh --browser   and the tests' browser (Debian chromium + chromedriver): scripts/test.sh
#
# Quiet: one line per step on the terminal; what pip, apt and the data fetch print goes to $VENV/setup.log
# (appended, one header per run). A step that fails prints the log's path and its last lines.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
SETUP_LOG=${AUTONORM_SETUP_LOG:-$VENV/setup.log}

# step "what it does" COMMAND [ARGS...]: one line, the command's output into the log; on failure the log's
# path and its tail, then exit 1.
step() {
  local what=$1
  shift
  echo "[setup] $what"
  local rc=0
  # In a subshell with errexit: a function's first failing command ends the step (`cmd || ...` would
  # switch errexit off inside the function).
  set +e
  (set -e; "$@") >>"$SETUP_LOG" 2>&1
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    {
      echo "[setup] failed: $what (exit $rc); the last lines of $SETUP_LOG:"
      tail -n "${AUTONORM_SETUP_TAIL:-25}" "$SETUP_LOG" | sed 's/^/    /'
    } >&2
    exit 1
  fi
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "need root (or sudo) to run: $*" >&2; return 1
  fi
}

create_venv() {
  "$PY" -m venv "$VENV"
  install_dependencies
}

install_dependencies() {
  # torch first and exactly: a bare `torch` requirement would pull a multi-GB CUDA build.
  # Byte-compiled once, after the installs, on every core (pip's own compile is one file at a time: ~50 s
  # of a fresh setup here, against ~30 s). Never skipped: where PYTHONDONTWRITEBYTECODE is set (this
  # machine and CI set it) Python never writes a .pyc itself, so every process - each Ray worker, each
  # CLI a test starts - would compile torch, Ray and MLflow from source again: measured 8.3-9.6 s to
  # import them against 3.6-5.3 s, and a CI run of 2005 s against ~900 s.
  "$VENV/bin/pip" install --disable-pip-version-check --no-compile torch==2.13.0
  "$VENV/bin/pip" install --disable-pip-version-check --no-compile -c constraints.txt -e ".[dev]"
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # A few files in the dependencies are not Python 3 (templates, fixtures): compileall reports them and
  # exits 1, as pip ignores them; whether the packages import is checked below.
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
  "$VENV/bin/python" -c 'import torch, ray, mlflow, optuna, pydantic, boto3' || {
    echo "the installed packages do not import" >&2
    return 1
  }
}

# A browser for tests/integration/test_browser.py: Debian's chromium and its chromedriver, driven headless by
# Selenium with the driver path given explicitly (Selenium Manager never downloads a browser or a driver).
install_browser() {
  local candidate
  candidate="$(apt-cache policy chromium-driver 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    as_root apt-get update
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { echo "chromium missing after install" >&2; return 1; }
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  local browser=0
  for arg in "$@"; do
    case "$arg" in
      --browser) browser=1 ;;
      *) echo "usage: bash scripts/setup.sh [--browser]" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$(dirname "$SETUP_LOG")"
  echo "--- $(date -u '+%Y-%m-%d %H:%M:%S') scripts/setup.sh $*" >>"$SETUP_LOG"

  # Reinstall only when the dependency declaration changed.
  local stamp="$VENV/.autonorm-deps" want
  want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
  if [ ! -x "$VENV/bin/python" ]; then
    step "creating $VENV with $($PY --version 2>&1) and installing the dependencies (a few minutes; output -> $SETUP_LOG)" \
      create_venv
    echo "$want" >"$stamp"
  elif [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    step "installing the dependencies (they changed; output -> $SETUP_LOG)" install_dependencies
    echo "$want" >"$stamp"
  fi
  # The project's own modules too (a second, cheap run only checks timestamps).
  "$VENV/bin/python" -m compileall -q -j 0 autonorm_core workers studies bench >>"$SETUP_LOG" 2>&1

  step "offline data sets (Fashion-MNIST, Pattern corpora; digits and diabetes ship with scikit-learn)" \
    bash scripts/fetch_data.sh
  if [ "$browser" = 1 ]; then
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
      echo "[setup] test browser present: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
    else
      step "installing the test browser (Debian chromium, chromium-driver; about a minute)" install_browser
    fi
  fi
  echo "[setup] ready: $VENV/bin/python (set-up log: $SETUP_LOG)"
}

# Sourced (tests/test_setup_script.py runs `step` alone): define the functions, run nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
