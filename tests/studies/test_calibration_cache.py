"""studies.calibration_cache: step times measured by one `run` on this machine are reused by the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from studies.calibration import timing_key
from studies.calibration_cache import MAX_AGE_S, CalibrationCache
from studies.kinds import KINDS, kind_for, load_study
from studies.planning import phases_of, plan_study

ROOT = Path(__file__).resolve().parents[2]


def _tiny(name: str, *extra: str) -> object:
    kind = KINDS[name]
    path, preset = kind.example
    return load_study(ROOT / path, [*kind.tiny, *extra], preset=preset)


def _keys(spec: object) -> set[str]:
    return {timing_key(c) for ph in phases_of(spec, kind_for(spec)) for c in ph.configs}


def test_a_second_estimate_reuses_what_the_first_measured(tmp_path: Path) -> None:
    spec = _tiny("batchsize")
    path = tmp_path / "cal.json"
    first = plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path))
    assert set(first["calibration"]["measured"]) == _keys(spec) and first["calibration"]["cached"] == []
    assert first["calibration_s"] > 0
    second = plan_study(
        spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path)
    )  # a new process's view
    cal = second["calibration"]
    assert cal["measured"] == [] and set(cal["cached"]) == _keys(spec)
    for field in ("step_s", "eval_s", "setup_s"):
        assert cal[field] == first["calibration"][field]
    assert cal["data"] == first["calibration"]["data"]
    # nothing was timed this time, so the run does not repeat a measurement: only that part differs
    assert second["calibration_s"] == 0.0
    assert second["wall_s"] == pytest.approx(first["wall_s"] - first["calibration_s"])
    assert second["trials"] == first["trials"]
    # plan (no cache) measures afresh, as it is asked to
    assert set(
        plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1)["calibration"]["measured"]
    ) == _keys(spec)


def test_old_unknown_or_unreadable_entries_are_measured_again(tmp_path: Path) -> None:
    spec = _tiny("compare")
    path = tmp_path / "cal.json"
    t0 = 1_000_000.0
    plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path, now=t0))
    young = plan_study(
        spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path, now=t0 + MAX_AGE_S - 1)
    )
    assert young["calibration"]["measured"] == []
    old = plan_study(
        spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path, now=t0 + MAX_AGE_S + 1)
    )
    assert set(old["calibration"]["measured"]) == _keys(spec)
    # another batch size is another key: only it is measured
    other = _tiny("compare", "training.batch_size=48")
    mixed = plan_study(
        other,
        kind_for(other),
        cpus=2,
        steps=3,
        warmup=1,
        cache=CalibrationCache(path, now=t0 + MAX_AGE_S + 2),
    )
    assert mixed["calibration"]["cached"] == [] and set(mixed["calibration"]["measured"]) == _keys(other)
    # one thread or two time differently: not the same entry
    cache = CalibrationCache(path, now=t0 + MAX_AGE_S + 3)
    config = next(c for ph in phases_of(spec, kind_for(spec)) for c in ph.configs)
    assert cache.get(config, threads=1, device="cpu") is not None
    assert cache.get(config, threads=2, device="cpu") is None
    path.write_text("{not json")
    broken = plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path))
    assert set(broken["calibration"]["measured"]) == _keys(spec)
    assert json.loads(path.read_text())["entries"]  # rewritten whole


def test_a_changed_data_file_is_measured_again(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def write(n: int) -> Path:
        f = tmp_path / "mine.npz"
        np.savez(f, x_train=rng.normal(size=(n, 6)).astype(np.float32), y_train=rng.integers(0, 3, size=n))
        return f

    data = write(120)
    spec = _tiny("compare", f"data={{type: arrays, path: {data}, val_fraction: 0.2}}")
    path = tmp_path / "cal.json"
    first = plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path))
    assert first["calibration"]["measured"]
    assert (
        plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path))[
            "calibration"
        ]["measured"]
        == []
    )
    write(200)
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    again = plan_study(spec, kind_for(spec), cpus=2, steps=3, warmup=1, cache=CalibrationCache(path))
    assert again["calibration"]["measured"] and again["calibration"]["cached"] == []
    sizes = next(iter(again["calibration"]["data"].values()))
    assert sum(sizes.values()) == 200


def test_the_runs_estimate_needs_no_torch_once_cached_and_the_cache_can_be_turned_off(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path\n"
        "from studies.kinds import KINDS, load_study\nfrom studies.running import _estimate\n"
        "k = KINDS['compare']; p, preset = k.example\n"
        f"spec = load_study(Path({str(ROOT)!r}) / p, [*k.tiny, 'storage_path={tmp_path}/runs'], preset=preset)\n"
        "est = _estimate(spec, k)\n"
        "print(est is not None and est['trials'] > 0, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "AUTONORM_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    env.pop("AUTONORM_CALIBRATION_CACHE", None)

    def estimate(**extra: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[-2:]

    assert estimate() == ["True", "True"]  # measured: torch imported to time the steps
    assert list((tmp_path / "data" / "calibration").glob("*.json"))
    assert estimate() == ["True", "False"]  # cached: no torch at all
    assert estimate(AUTONORM_CALIBRATION_CACHE="off") == ["True", "True"]
    assert not CalibrationCache.enabled({"AUTONORM_CALIBRATION_CACHE": "off"})
    assert CalibrationCache.enabled({})
