#!/usr/bin/env bash
# Set up from nothing, then lint, type-check and run the test suite. The tests start the real services
# they need themselves (PostgreSQL, SeaweedFS S3, MLflow server, Ray head/worker nodes) on loopback, and stop them.
#
#   bash scripts/test.sh [PYTEST ARGS]   everything (what CI runs, as `.ci/run`): lint, then every test in two
#                                        pytest-xdist workers with the type-check alongside, then the 25 slowest
#                                        tests and the time per test directory
#   bash scripts/test.sh --quick [ARGS]  the inner loop while coding (under 3 minutes): lint, type-check and the
#                                        tests not marked ray / services / slow, in two workers
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash scripts/setup.sh --browser   # the tests' browser too (tests/integration/test_browser.py)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # keep every Ray listener on 127.0.0.1
echo "[test] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$quick" = 1 ]; then
  echo "[test] mypy"
  .venv/bin/mypy
  echo "[test] pytest (quick: not ray, services or slow)"
  exec .venv/bin/python -m pytest -n "${AUTONORM_TEST_WORKERS:-2}" -m "not ray and not services and not slow" --durations=10 "$@"
fi
# mypy runs next to pytest: on a fresh clone its cache is cold (~30 s on one core, the other idle before; measured
# ~10 s less per run). Its verdict counts as before: a type error fails the run, its messages printed after
# the tests (on success nothing follows pytest's closing summary line).
echo "[test] mypy (alongside pytest; checked when the tests end)"
mypy_out="$(mktemp)"
.venv/bin/mypy >"$mypy_out" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_out"' EXIT
echo "[test] pytest"
# Two workers, whole files each (a module's shared study fixture runs once), the longest files first (tests/durations.json;
# xdist would otherwise order files by their number of tests); `--durations` and the
# per-directory times print before pytest's closing summary line, which stays the last line.
pytest_rc=0
.venv/bin/python -m pytest -n "${AUTONORM_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=25 "$@" ||
  pytest_rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
if [ "$mypy_rc" != 0 ]; then
  cat "$mypy_out"
  echo "[test] mypy failed (exit $mypy_rc)"
  exit 1
fi
exit "$pytest_rc"
