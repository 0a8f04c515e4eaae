"""What a study of many tiny trials costs the driver, Tune's state, MLflow and the inspection commands.

A **search** study and a **batch-size** study, each of ``--trials`` (1000) tiny trials (1-2 s of
training each: the specs' ``smoke`` presets), run through the real CLI as a user runs it:
``autonorm-study run <spec> --preset smoke --set ...`` as a subprocess on this machine (a local
loopback Ray, 2 trial slots), against a real ``mlflow server`` (sqlite, loopback, one worker) that
the driver and the trials reach through a counting HTTP proxy in this process
(``MLFLOW_TRACKING_URI`` = the proxy). Sizes come from ``autonorm-study plan --json`` with the same
overrides: the search kind is ``search.num_samples = N`` with ``confirm: null``; the batch-size kind
keeps the smoke's 3 arms x 3 batch sizes and its lr tuning at the minimum (3 points x 2 seeds, no
range extension, no refinement: 18 trials) and takes ``round((N - 18) / 9)`` confirmatory seeds (at
least 2), so its planned count is N rounded to that grid (36 at least), and trains 20 epochs a trial
instead of the smoke's 3 (0.2 s of training a trial; 20 give the 1-2 s the search kind's take).
``execution.stack: off`` is
set when the schema has that key (else it is left out: ``setup.kinds.<kind>.execution_stack_off`` says which).

    python bench/study_scale.py                          # 2 x 1000 trials (~45 min on 2 cores)
    python bench/study_scale.py --quick                  # 2 x 100 trials (the test suite runs --trials 12)
    python bench/study_scale.py --trials 200 --kinds search --keep /tmp/scale
    python bench/study_scale.py --trials 100 --profile   # the driver under cProfile (slower; for why)

What it found (docs/reliability.md has the figures): the driver's CPU per trial used to grow
linearly with the trials already in the study (search: 0.31 s for the first 100 to 0.72 s for the
last 100 of 200), because each snapshot Tune takes at every trial event rewrote every trial's state
and re-uploaded every trial's driver-side log folder. ``workers/tune_state.py`` writes finished trials
once; the cost per trial is now flat (0.18 -> 0.18 s at 300 trials). At 1,000 trials py-spy found
the searcher's pickle (Ray's ``OptunaSearch.save``: the whole in-memory Optuna study at every trial
start and end, 33% of the driver's samples at 850 trials): ``workers/optuna_state.py`` writes
finished Optuna trials once too (0.155 -> 0.267 s became 0.131 -> 0.158 s). With MLflow's requests
sent from a thread of their own, wall / ideal went from 1.43 to 1.35 (span / ideal 1.28 -> 1.17).

The study storage is kept (``--keep DIR``, else ``/tmp/study_scale_<timestamp>``) and printed.

Keys per kind (``search``, ``batchsize``) of ``bench/results/study_scale.json``:

* ``driver_cpu_per_trial_first100`` / ``driver_cpu_per_trial_last100``: CPU seconds (user + sys) of
  the driver process (the ``autonorm-study run`` process itself, psutil on its PID; Ray's raylet, GCS
  and workers are other processes) per finished trial, over a window of W = min(100, trials // 2)
  finished trials: the first window from the 1st finished trial to the (1 + W)-th, the last from
  the (trials - W)-th to the last. Startup (imports, the estimate, Ray's start) and the analysis
  after the last trial are outside both. Sampled every 0.5 s; a trial counts as finished when the
  last line of its Tune ``result.json`` has a terminal ``status`` (completed, diverged, error) or
  ``done: true``. With ``--quick`` (100 trials) the windows are the first and last 50.
  For the batch-size kind the first window holds the confirmatory phase's start (its lr tuning is
  18 trials). ``driver_cpu_per_trial_curve``: ``[finished trials, CPU s per trial]`` over ten equal
  windows of finished trials: where the cost per trial grows, if it does.
* ``driver_rss_peak_mb``: the driver's peak resident memory (``VmHWM``, else the largest sample).
* ``state_bytes``: bytes of Tune's experiment state at the end, over every phase directory: the
  snapshot files Tune rewrites at each save (``experiment_state-*.json``, ``*_state-*.json``,
  ``*-state-*.json``, ``*-state-*.pkl``) plus the ``finished-trials-*.jsonl`` files each finished
  trial is written to once (``workers/tune_state.py``; ``state_finished_bytes`` is their share);
  ``state_save_s``: seconds to save the snapshot files once, measured here as a json load + dump +
  write of each JSON file (a read + write of the bytes of each pickle: ``searcher-state-*.pkl`` and
  ``search_gen_state-*.json``, a pickle despite its name), not inside Tune. During a run only the
  current phase's state is saved.
* ``mlflow_calls_per_trial``: HTTP requests that reached the MLflow server during ``run`` (driver
  and trials, artifacts included) / ``trials``; ``mlflow_calls`` the total and
  ``mlflow_calls_by_endpoint`` the top ten.
* ``wall_over_ideal``: ``wall_s`` (the ``run`` subprocess's start to its exit) / ``ideal_s``
  (Σ trial times / 2 slots); a trial's time is measured in its worker: its last ``wall_reported``
  minus its first ``wall_started`` (every Tune result row carries both). ``span_over_ideal``: the
  first trial's start to the last trial's end / ``ideal_s``. ``trials``: trials with a result;
  ``trials_planned``: what ``plan`` said; ``trials_finished``: those with a terminal status.
* ``status_s``, ``report_s``, ``reproduce_s``, ``plan_history_s``: wall seconds of
  ``autonorm-study status <dir>``, ``report <dir>``, ``reproduce <dir>`` (the default mode:
  recompute the verdict from the study's MLflow record) and ``plan --history`` (actual / planned
  wall time of every study run in the tracking store, here this bench's one or two) on the finished
  study, each a fresh process (imports included); each must exit 0 (else the value is null, the
  output's tail is printed and the bench exits 1 after writing the JSON).
* ``driver_cpu_s`` (the driver's total CPU seconds) and ``study_dir``;
  ``mlflow_calls_by_command``: the MLflow requests of each inspection command above.

``setup``: requested trials, slots, machine, 1-minute load average before and after, date, the
MLflow server, the overrides of each kind.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from workers.tune_state import CHUNK_PREFIX as FINISHED_PREFIX
from workers.tune_state import CHUNK_SUFFIX as FINISHED_SUFFIX

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "study_scale.json"
SPECS = {
    "search": ROOT / "studies" / "specs" / "autonorm_search.yaml",
    "batchsize": ROOT / "studies" / "specs" / "batchsize_correlation.yaml",
}
SLOTS = 2  # the smoke presets' max_concurrent, and this machine's CPUs
WINDOW = 100
POLL_S = 0.5
TERMINAL = frozenset({"completed", "diverged", "error"})
#: The batch-size kind's lr tuning at its minimum: 3 arms x 3 points x 2 seeds.
BATCHSIZE_TUNE = {"arms": 3, "points": 3, "seeds": 2}
BATCHSIZE_CELLS = 9  # 3 arms x 3 batch sizes (the smoke's)


def log(msg: str) -> None:
    print(f"[study_scale] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli() -> list[str]:
    script = Path(sys.executable).parent / "autonorm-study"
    return [str(script)] if script.exists() else [sys.executable, "-m", "studies.cli"]


# --------------------------------------------------------------------------------------------------
# MLflow server behind a counting proxy


_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def _endpoint(method: str, path: str) -> str:
    path = path.split("?", 1)[0]
    marker = "mlflow-artifacts/artifacts/"
    if marker in path:
        path = path[: path.index(marker) + len(marker)] + "*"
    return f"{method} {path}"


class CountingProxy(ThreadingHTTPServer):
    """Forwards every request to ``upstream`` (host, port) and counts them by method and path."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.errors = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection(*self.upstream, timeout=300)
            self._local.conn = conn
        return conn


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingProxy

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        headers["Host"] = f"{self.server.upstream[0]}:{self.server.upstream[1]}"
        if body is not None:
            headers["Content-Length"] = str(len(body))
        self.server.count(_endpoint(self.command, self.path))
        for attempt in (0, 1):
            conn = self.server.connection(fresh=attempt > 0)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                if attempt:
                    self.server.errors += 1
                    self.send_error(502, "upstream MLflow server unreachable")
                    return
        self.send_response(resp.status, resp.reason)
        for key, value in resp.getheaders():
            if key.lower() not in _HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def mlflow_server(directory: Path) -> Iterator[tuple[CountingProxy, dict[str, Any]]]:
    """A real ``mlflow server`` (sqlite in ``directory``, loopback, one worker) behind a counting proxy;
    stopped (the server and the processes it started, by PID) on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no job workers (GBs, slow start)
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{directory / 'mlflow.db'}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(directory / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log_path = directory / "mlflow-server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=directory, env=env)
    proxy: CountingProxy | None = None
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}: {tail(log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy after 180 s: {tail(log_path)}")
            time.sleep(1)
        proxy = CountingProxy(("127.0.0.1", port))
        threading.Thread(target=proxy.serve_forever, name="mlflow-proxy", daemon=True).start()
        info = {"server": f"mlflow server sqlite, 127.0.0.1:{port}, 1 worker", "proxy": proxy.url}
        yield proxy, info
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        stop_tree(proc.pid)
        proc.wait(timeout=30)


def stop_tree(pid: int) -> None:
    """SIGTERM ``pid`` and the processes it started (each by PID), SIGKILL what is left after 15 s."""
    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=15)
    for p in alive:
        with suppress(psutil.NoSuchProcess):
            p.kill()


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------
# Sizing


def plan(kind: str, overrides: list[str], env: dict[str, str]) -> tuple[dict[str, Any] | None, str]:
    cmd = [*cli(), "plan", str(SPECS[kind]), "--preset", "smoke", *_sets(overrides), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout), ""


def _sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


BATCHSIZE_EPOCHS = 20


def overrides_for(kind: str, trials: int) -> list[str]:
    if kind == "search":
        return ["confirm=null", f"search.num_samples={trials}"]
    a, p, s = BATCHSIZE_TUNE["arms"], BATCHSIZE_TUNE["points"], BATCHSIZE_TUNE["seeds"]
    seeds = max(2, round((trials - a * p * s) / BATCHSIZE_CELLS))
    return [
        f"lr_tuning.points={p}",
        "lr_tuning.max_extensions=0",
        "lr_tuning.refine=0",
        f"seeds=[{', '.join(str(i) for i in range(seeds))}]",
        # The smoke's 3 epochs are 0.2 s of training a trial; 20 make the 1-2 s (1.3 s on average
        # over its batch sizes) that the search kind's trials take and issue #40 sizes the bench by.
        f"training.epochs={BATCHSIZE_EPOCHS}",
    ]


def sized(kind: str, trials: int, env: dict[str, str]) -> tuple[list[str], int, str, bool]:
    """The overrides, the planned trial count, the study's name, whether ``execution.stack=off`` is
    among the overrides."""
    base = overrides_for(kind, trials)
    for overrides, stack in ((["execution.stack=off", *base], True), (base, False)):
        planned, err = plan(kind, overrides, env)
        if planned is not None:
            if planned["trials"] != planned["trials_max"]:
                raise RuntimeError(f"{kind}: plan varies ({planned['trials']}..{planned['trials_max']})")
            return overrides, int(planned["trials"]), str(planned["study"]), stack
        if not stack or "execution" not in err:
            raise RuntimeError(f"{kind}: plan failed:\n{err}")
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------------
# Watching the driver


def _last_line(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                return None  # being written
            return row if isinstance(row, dict) else None
    return None


class TrialCounter:
    """Finished trials under a study directory (``<phase>/<trial>/result.json``); a finished one is
    not read again."""

    def __init__(self, study_dir: Path) -> None:
        self.study_dir = study_dir
        self.finished: set[Path] = set()

    def result_files(self) -> list[Path]:
        if not self.study_dir.is_dir():
            return []
        return sorted(self.study_dir.glob("*/*/result.json"))

    def count(self) -> int:
        for path in self.result_files():
            if path in self.finished:
                continue
            row = _last_line(path)
            if row is not None and (row.get("done") is True or row.get("status") in TERMINAL):
                self.finished.add(path)
        return len(self.finished)


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_driver(
    kind: str, overrides: list[str], storage: Path, study_dir: Path, env: dict[str, str], profile: bool
) -> dict[str, Any]:
    """``autonorm-study run`` as a subprocess, its CPU, memory and finished trials sampled every 0.5 s."""
    args = ["run", str(SPECS[kind]), "--preset", "smoke", *_sets(overrides), "--storage-path", str(storage)]
    if profile:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(storage / "driver.prof"), "-m", "studies.cli"]
    else:
        cmd = cli()
    log_path = storage / "run.log"
    counter = TrialCounter(study_dir)
    samples: list[tuple[float, float, int]] = []  # (time, driver cpu s, finished trials)
    rss_peak = 0.0
    hwm: float | None = None
    with open(log_path, "wb") as log_file:
        started = time.monotonic()
        proc = subprocess.Popen([*cmd, *args], cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        driver = psutil.Process(proc.pid)
        next_print = started + 10
        while proc.poll() is None:
            try:
                with driver.oneshot():
                    t = driver.cpu_times()
                    rss_peak = max(rss_peak, driver.memory_info().rss / 2**20)
                hwm = _hwm_mb(proc.pid) or hwm
            except psutil.NoSuchProcess:
                break
            now = time.monotonic()
            samples.append((now, t.user + t.system, counter.count()))
            if now >= next_print:
                log(
                    f"{kind}: {samples[-1][2]} trials finished, driver cpu {samples[-1][1]:.1f} s, "
                    f"rss {rss_peak:.0f} MB, {now - started:.0f} s"
                )
                next_print = now + 10
            time.sleep(POLL_S)
        rc = proc.wait()
        ended = time.monotonic()
    if rc != 0:
        raise RuntimeError(f"{kind}: run exited {rc}; {log_path}:\n{tail(log_path)}")
    samples.append((ended, samples[-1][1] if samples else 0.0, counter.count()))
    return {"wall_s": ended - started, "samples": samples, "rss_peak_mb": max(rss_peak, hwm or 0.0)}


def cpu_per_trial(samples: list[tuple[float, float, int]], start: int, end: int) -> float:
    """Driver CPU seconds per trial from just before the ``start``-th trial finished (the last sample
    with fewer finished) to the first sample with ``end`` finished. Several trials can finish between
    two samples: the window then widens to the samples around it rather than coming out empty."""
    before = [(cpu, done) for _, cpu, done in samples if done < start]
    after = [(cpu, done) for _, cpu, done in samples if done >= end]
    if not after:
        raise RuntimeError(f"never {end} finished trials (at most {samples[-1][2] if samples else 0})")
    cpu0, done0 = before[-1] if before else (samples[0][1], samples[0][2])
    cpu1, done1 = after[0]
    if done1 <= done0:
        raise RuntimeError(f"no trial finished between {start} and {end}")
    return (cpu1 - cpu0) / (done1 - done0)


def cpu_curve(samples: list[tuple[float, float, int]], n: int) -> list[list[float]]:
    """``[finished trials at the window's end, driver CPU s per trial]`` over ten equal windows of
    finished trials (from the 1st finished on): how the driver's cost per trial moves with the count."""
    edges = sorted({1 + round(i * (n - 1) / 10) for i in range(11)})
    return [[b, round(cpu_per_trial(samples, a, b), 4)] for a, b in itertools.pairwise(edges)]


# --------------------------------------------------------------------------------------------------
# After the run


def trial_times(counter: TrialCounter) -> list[tuple[float, float]]:
    """(first ``wall_started``, last ``wall_reported``) of every trial with a result."""
    spans = []
    for path in counter.result_files():
        started: float | None = None
        reported: float | None = None
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if started is None and "wall_started" in row:
                started = float(row["wall_started"])
            if "wall_reported" in row:
                reported = float(row["wall_reported"])
        if started is None or reported is None:
            raise RuntimeError(f"{path}: no wall_started / wall_reported (workers/trainable.py too old?)")
        spans.append((started, reported))
    return spans


def _state_file(name: str) -> bool:
    return name.endswith((".json", ".pkl")) and (
        name.startswith("experiment_state-") or "_state-" in name or "-state-" in name
    )


def _finished_file(name: str) -> bool:
    return name.startswith(FINISHED_PREFIX) and name.endswith(FINISHED_SUFFIX)


def tune_state(study_dir: Path) -> tuple[int, float, dict[str, int], int]:
    """Bytes of Tune's state over every phase directory (snapshot files and finished-trials files),
    seconds to save the snapshot files once (what each save rewrites), and the finished-trials
    files' bytes (each written once)."""
    total, save_s, by_phase, finished = 0, 0.0, {}, 0
    with tempfile.TemporaryDirectory(prefix="study_scale_state_") as tmp:
        for phase in sorted(p for p in study_dir.iterdir() if p.is_dir()):
            once = sum(f.stat().st_size for f in phase.iterdir() if f.is_file() and _finished_file(f.name))
            files = [f for f in phase.iterdir() if f.is_file() and _state_file(f.name)]
            if not files:
                continue
            finished += once
            by_phase[phase.name] = sum(f.stat().st_size for f in files) + once
            total += by_phase[phase.name]
            for f in files:
                out = Path(tmp) / f.name
                t0 = time.perf_counter()
                data = f.read_bytes()
                if data[:1] == b"\x80":  # a pickle (Tune's search_gen_state-*.json is one too)
                    out.write_bytes(data)
                else:
                    out.write_text(json.dumps(json.loads(data)))
                save_s += time.perf_counter() - t0
    return total, save_s, by_phase, finished


def timed_command(name: str, args: list[str], env: dict[str, str]) -> float | None:
    t0 = time.perf_counter()
    proc = subprocess.run([*cli(), *args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        log(f"{name} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return None
    log(f"{name}: {elapsed:.1f} s")
    return elapsed


def run_kind(
    kind: str, trials: int, root: Path, proxy: CountingProxy, env: dict[str, str], profile: bool
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """One kind end to end; returns its keys, its setup and whether every command exited 0."""
    overrides, planned, name, stack = sized(kind, trials, env)
    storage = root / kind
    storage.mkdir(parents=True, exist_ok=True)
    study_dir = storage / name
    log(f"{kind}: {planned} trials planned ({' '.join(overrides)[:160]}); study {study_dir}")
    before = proxy.snapshot()
    driven = run_driver(kind, overrides, storage, study_dir, env, profile)
    calls = proxy.snapshot() - before
    counter = TrialCounter(study_dir)
    finished = counter.count()
    spans = trial_times(counter)
    n = len(spans)
    log(f"{kind}: run exited 0 after {driven['wall_s']:.0f} s; {finished} of {n} trials finished")
    window = min(WINDOW, max(1, n // 2))
    samples = driven["samples"]
    ideal = sum(end - start for start, end in spans) / SLOTS
    state_bytes, state_save_s, state_phases, state_finished = tune_state(study_dir)
    total_calls = sum(calls.values())
    result: dict[str, Any] = {
        "driver_cpu_per_trial_first100": cpu_per_trial(samples, 1, 1 + window),
        "driver_cpu_per_trial_last100": cpu_per_trial(samples, n - window, n),
        "driver_cpu_per_trial_curve": cpu_curve(samples, n),
        "driver_cpu_s": samples[-1][1],
        "driver_rss_peak_mb": driven["rss_peak_mb"],
        "state_bytes": state_bytes,
        "state_save_s": state_save_s,
        "state_bytes_by_phase": state_phases,
        "state_finished_bytes": state_finished,
        "mlflow_calls_per_trial": total_calls / n,
        "mlflow_calls": total_calls,
        "mlflow_calls_by_endpoint": dict(calls.most_common(10)),
        "wall_over_ideal": driven["wall_s"] / ideal,
        "span_over_ideal": (max(e for _, e in spans) - min(s for s, _ in spans)) / ideal,
        "ideal_s": ideal,
        "wall_s": driven["wall_s"],
        "trials": n,
        "trials_planned": planned,
        "trials_finished": finished,
        "window": window,
    }
    ok = True
    uri = ["--tracking-uri", proxy.url]
    command_calls: dict[str, int] = {}
    for key, args in (
        ("status_s", ["status", str(study_dir)]),
        ("report_s", ["report", str(study_dir)]),
        ("reproduce_s", ["reproduce", str(study_dir), *uri]),
        ("plan_history_s", ["plan", "--history", *uri]),
    ):
        before_command = proxy.total()
        result[key] = timed_command(f"{kind} {key[:-2]}", args, env)
        command_calls[key[:-2]] = proxy.total() - before_command
        ok = ok and result[key] is not None
    result["mlflow_calls_by_command"] = command_calls
    result["study_dir"] = str(study_dir)
    setup = {"planned_trials": planned, "overrides": overrides, "execution_stack_off": stack}
    return result, setup, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="trials per study (default 1000)")
    parser.add_argument("--quick", action="store_true", help="100 trials per study")
    parser.add_argument("--kinds", default="search,batchsize", help="comma-separated: search,batchsize")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep", type=Path, default=None, help="study storage (default /tmp/study_scale_<time>)"
    )
    parser.add_argument("--profile", action="store_true", help="run the driver under cProfile (driver.prof)")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = 100
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(SPECS))
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown}; choose from {sorted(SPECS)}")
    if args.trials < 2:
        parser.error("--trials must be at least 2")
    root = (args.keep or Path(f"/tmp/study_scale_{time.strftime('%Y%m%d_%H%M%S')}")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    log(f"study storage: {root}")
    load_before = os.getloadavg()[0]
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # local Ray on loopback only
        "PYTHONUNBUFFERED": "1",
    }
    out: dict[str, Any] = {}
    kind_setup: dict[str, Any] = {}
    ok = True
    with mlflow_server(root / "mlflow") as (proxy, server):
        env["MLFLOW_TRACKING_URI"] = proxy.url
        log(f"MLflow server up; proxy {proxy.url}")
        for kind in kinds:
            out[kind], kind_setup[kind], kind_ok = run_kind(kind, args.trials, root, proxy, env, args.profile)
            ok = ok and kind_ok
        proxy_errors = proxy.errors
    out["setup"] = {
        "trials": args.trials,
        "slots": SLOTS,
        "kinds": kind_setup,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs",
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mlflow": {**server, "proxy_errors": proxy_errors},
        "storage": str(root),
        "profile": args.profile,
    }
    text = json.dumps(out, indent=2)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n")
    log(f"written {args.output}; studies kept under {root}")
    if args.profile:
        for kind in kinds:
            log(f"driver profile: {root / kind / 'driver.prof'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
