#!/usr/bin/env bash
# GPU smoke benchmark: one prepared script, under 10 minutes on one GPU, writes bench/results/gpu_smoke.json.
#
#   bash bench/gpu_smoke.sh          # on a CUDA machine (exits 2 when there is no GPU)
#   bash bench/gpu_smoke.sh --cpu    # the same steps on CPU with tiny sizes (seconds of work; for tests)
#
# Steps (each under its own `timeout`; on GPU the budgets below, total < 10 min):
#   1. norms  (150 s): bench/norms.py --core --bf16 on the device: AutoNorm fwd+bwd over (LayerNorm + DyT),
#                      eager and torch.compile'd, and the frozen-hard path over its one branch.
#   2. step   (170 s): bench/step.py --compile --bf16: one full ViT-Lite `paper` training step (batch 64,
#                      data resident on the device), AutoNorm over FrozenLN.
#   3. packed (100 s): bench/study_scaling.py --trials-only: 8 trials at 0.125 GPU each, all at once, each
#                      training with --precision bf16 --compile off: bf16 autocast, eager. Compiling costs
#                      each fresh worker tens of seconds of CPU (8 at once here), which would not fit the
#                      step's budget and would measure Inductor, not packing; step 2 measures the compiled
#                      step, and real studies compile (training.compile: auto = on for CUDA).
#   4. whole  ( 60 s): the same with 1 GPU per trial, 2 trials one after the other (also bf16, eager).
#   5. stacking (120 s): bench/stacking.py --device cuda: K = 1, 4, 16 members of the MLP, CNN and ViT-Lite
#                      `tiny` presets trained stacked (fit_stacked) against K separate fits, B = 8 and 64, fp32 eager.
#   (--cpu keeps the trials' defaults: fp32, compile auto = eager on CPU.)
# GPU utilisation is sampled with nvidia-smi every 500 ms during steps 3 and 4.
#
# Keys of gpu_smoke.json: examples_per_s_per_trial_{packed,whole}; trials_per_gpu_hour_{packed,whole} (slots x
# 3600 / median trial time); packing_gain = packed / whole (goal >= 4); gpu_util_percent_{packed,whole}
# (mean of the samples; null on CPU); autonorm_over_branches{,_compiled}, frozen_hard_over_branch (norms,
# bf16); autonorm_over_frozen_ln (step, compiled, bf16); stacking_gain ({model: {B: {K: stacked / separate
# examples/s}}}, bench/stacking.py); plus the mode, device and each step's exit status.
# Environment: PYTHON (interpreter), SMOKE_DATASET (default fashion_mnist, falls back to digits when it is not
# in the data cache), GPU_SMOKE_OUT (output path).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
PY="${PYTHON:-.venv/bin/python}"
if [[ ! -x "$PY" ]]; then PY="$(command -v python3)"; fi
OUT="${GPU_SMOKE_OUT:-bench/results/gpu_smoke.json}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 OMP_NUM_THREADS=1

if [[ "$MODE" == gpu ]]; then
  if ! command -v nvidia-smi >/dev/null || ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_smoke: no CUDA GPU here; run with --cpu for the CPU variant" >&2
    exit 2
  fi
  DEVICE=cuda
  NORMS_ARGS=(--device cuda --core --bf16 --repeats 11 --inner 5)
  STEP_ARGS=(--device cuda --compile --bf16 --repeats 11 --inner 5 --cases frozen_ln,autonorm,autonorm_s_frozen)
  DATASET="${SMOKE_DATASET:-fashion_mnist}"
  TRIAL_ARGS=(--preset paper --epochs 2 --subset 10000)
  PACKED=(--trials 8 --slots 8 --cpus 8 --gpu-fraction 0.125 --precision bf16 --compile off)
  WHOLE=(--trials 2 --slots 1 --cpus 8 --gpu-fraction 1 --precision bf16 --compile off)
  STACKING_ARGS=(--device cuda --repeats 2 --updates 30)
  T_NORMS=150 T_STEP=170 T_PACKED=100 T_WHOLE=60 T_STACKING=120
else
  DEVICE=cpu
  NORMS_ARGS=(--device cpu --quick)
  STEP_ARGS=(--device cpu --quick)
  DATASET="${SMOKE_DATASET:-digits}"
  TRIAL_ARGS=(--preset tiny --epochs 1 --subset 200)
  PACKED=(--trials 2 --slots 2 --cpus 2)
  WHOLE=(--trials 1 --slots 1 --cpus 2)
  # Seconds of work, but a Ray start on a loaded shared CPU machine can take minutes: generous limits.
  STACKING_ARGS=(--device cpu --quick)
  T_NORMS=300 T_STEP=300 T_PACKED=600 T_WHOLE=600 T_STACKING=300
fi
if ! "$PY" -c "from autonorm_core.data import load_dataset as l; l('$DATASET', seed=0, subset=100)" 2>/dev/null; then
  echo "gpu_smoke: data set $DATASET is not in the data cache; using digits" >&2
  DATASET=digits
fi

sample_gpu() {  # sample_gpu FILE: nvidia-smi utilisation every 500 ms into FILE until killed
  if [[ "$MODE" == gpu ]]; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 >"$1" 2>/dev/null &
    echo $!
  else
    echo ""
  fi
}

timeout "$T_NORMS" "$PY" bench/norms.py "${NORMS_ARGS[@]}" --out "$TMP/norms.json"
NORMS_RC=$?
timeout "$T_STEP" "$PY" bench/step.py "${STEP_ARGS[@]}" --out "$TMP/step.json"
STEP_RC=$?
SAMPLER=$(sample_gpu "$TMP/util_packed.csv")
timeout "$T_PACKED" "$PY" bench/study_scaling.py --trials-only --dataset "$DATASET" "${TRIAL_ARGS[@]}" "${PACKED[@]}" \
  --out "$TMP/packed.json"
PACKED_RC=$?
[[ -n "$SAMPLER" ]] && kill "$SAMPLER" 2>/dev/null
SAMPLER=$(sample_gpu "$TMP/util_whole.csv")
timeout "$T_WHOLE" "$PY" bench/study_scaling.py --trials-only --dataset "$DATASET" "${TRIAL_ARGS[@]}" "${WHOLE[@]}" \
  --out "$TMP/whole.json"
WHOLE_RC=$?
[[ -n "$SAMPLER" ]] && kill "$SAMPLER" 2>/dev/null
timeout "$T_STACKING" "$PY" bench/stacking.py "${STACKING_ARGS[@]}" --output "$TMP/stacking.json"
STACKING_RC=$?

"$PY" - "$TMP" "$OUT" "$MODE" "$DEVICE" "$DATASET" "$NORMS_RC" "$STEP_RC" "$PACKED_RC" "$WHOLE_RC" "$STACKING_RC" <<'EOF'
import json, os, statistics, sys
from pathlib import Path

tmp, out, mode, device, dataset = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:6]
rcs = dict(zip(("norms", "step", "packed", "whole", "stacking"), map(int, sys.argv[6:11])))


def load(name):
    path = tmp / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def util(name):
    path = tmp / f"util_{name}.csv"
    values = [float(v) for v in path.read_text().split()] if path.exists() else []
    return statistics.mean(values) if values else None


norms, step, packed, whole = load("norms"), load("step"), load("packed"), load("whole")
stacking = load("stacking")


def per_hour(r):
    slots = r.get("setup", {}).get("slots")
    return slots * 3600.0 / r["trial_s_median"] if slots and r.get("trial_s_median") else None


device_name = "cpu"
if device == "cuda":
    import torch

    device_name = torch.cuda.get_device_name(0)
packed_h, whole_h = per_hour(packed), per_hour(whole)
result = {
    "mode": mode,
    "device": device_name,
    "dataset": dataset,
    "examples_per_s_per_trial_packed": packed.get("examples_per_s_per_trial"),
    "examples_per_s_per_trial_whole": whole.get("examples_per_s_per_trial"),
    "trials_per_gpu_hour_packed": packed_h,
    "trials_per_gpu_hour_whole": whole_h,
    "packing_gain": packed_h / whole_h if packed_h and whole_h else None,
    "goal_packing_gain": 4.0,
    "gpu_util_percent_packed": util("packed"),
    "gpu_util_percent_whole": util("whole"),
    "autonorm_over_branches": norms.get("autonorm_over_branches"),
    "autonorm_over_branches_compiled": norms.get("autonorm_over_branches_compiled"),
    "frozen_hard_over_branch": norms.get("frozen_hard_over_branch"),
    "autonorm_over_frozen_ln": step.get("autonorm_over_frozen_ln"),
    "autonorm_s_frozen_over_frozen_ln": step.get("autonorm_s_frozen_over_frozen_ln"),
    "stacking_gain": stacking.get("gain"),
    "trial_devices": sorted(set(packed.get("trial_devices", []) + whole.get("trial_devices", []))),
    "exit_status": rcs,
    "load_avg_1m": os.getloadavg()[0],
}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
sys.exit(0 if all(rc == 0 for rc in rcs.values()) else 1)
EOF
