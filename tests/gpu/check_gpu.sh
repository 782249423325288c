#!/usr/bin/env bash
# The GPU half of slurm-chaos on a machine with NVIDIA GPUs, in one run of under 10 minutes: the
# parsers on live nvidia-smi output and the node's GPU numbering, a clock lock and a power cap
# applied, read back and undone (the node as before), an XID through the kernel log, DCGM where
# installed, the NVML telemetry and the probe with NCCL on the GPUs. One line per check:
#
#   CHECK <name>: PASS|FAIL|SKIP <what it measured, or what it needs>
#
# Usage (repository root): bash tests/gpu/check_gpu.sh [--dry-run] [OUTDIR]
#   --dry-run  list every check, what it needs and its time limit; run nothing.
# Exit 0 when no check failed and one passed (a check whose needs are missing is SKIP, not a
# failure), 1 when one failed, 2 when every check skipped (no GPU here: use --dry-run).
set -uo pipefail
cd "$(dirname "$0")/../.."

# name | time limit (s) | what it needs | what it does
CHECKS=(
  "environment|30|nvidia-smi, a CUDA build of torch, h5py|GPUs, driver, torch/CUDA/NCCL versions"
  "parsers|30|nvidia-smi, /proc/driver/nvidia/gpus|nvidia-smi -L, topo -m, --query-gpu through slurm-chaos's parsers; Slurm's number -> bus id -> NVML index"
  "clock-lock|100|root, nvidia-smi, a GPU not in MIG mode, torch (the burn)|gpu-throttle clock=max/2 applied, read back under the GPU burn, undone (nvidia-smi -rgc): loaded clock back above the lock"
  "power-cap|30|root, nvidia-smi, a GPU with a power limit range|gpu-throttle method=power applied halfway into the range, read back, undone: power.limit as before"
  "xid-kmsg|30|root, /dev/kmsg, the NVIDIA driver|gpu-xid xid=13 written to the kernel log on the GPU's bus, read back by the health check's parser"
  "dcgm|45|dcgmi and a running nv-hostengine|gpu-thermal injected into DCGM's id of the GPU, read back with dcgmi dmon, undone"
  "telemetry|100|pytest, a CUDA build of torch, nvidia-ml-py|pytest tests/gpu: NVML sampler, GPU NUMA locality, nccl probe paths"
  "nccl-allreduce|75|a CUDA build of torch with NCCL|the probe's allreduce sweep 1 KiB .. 256 MiB over every GPU (up to 8)"
  "train|110|a CUDA build of torch, h5py, nvidia-ml-py|the probe trains the medium model 100 steps (nccl), NVML samples every 0.5 s"
  "node-as-before|10|nvidia-smi|the GPUs' settings (power limit, persistence, compute and MIG mode) equal to those at the start"
)
BUDGET_S=570  # stop starting checks after this: the whole run stays under 10 minutes

if [ "${1:-}" = "--dry-run" ]; then
  echo "check_gpu.sh: ${#CHECKS[@]} checks, at most ${BUDGET_S} s in all (each within its limit)"
  for c in "${CHECKS[@]}"; do
    IFS='|' read -r name limit needs what <<<"$c"
    printf 'CHECK %-15s limit %4ss  needs: %s\n      %-15s does: %s\n' "$name" "$limit" "$needs" "" "$what"
  done
  exit 0
fi

OUT=${1:-$(mktemp -d /tmp/gpu-check.XXXX)}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
START=$SECONDS
failed=0
passed=0
NG=1

limit_of() { for c in "${CHECKS[@]}"; do IFS='|' read -r n l _ <<<"$c"; [ "$n" = "$1" ] && echo "$l"; done; }

# run NAME CMD...: the command's last CHECK line, or one made from its exit status; its output in OUT.
run() {
  local name=$1; shift
  local limit; limit=$(limit_of "$name")
  if (( SECONDS - START > BUDGET_S - limit )); then
    echo "CHECK $name: SKIP no time left in the ${BUDGET_S} s budget"; return
  fi
  local t0=$SECONDS rc line
  if declare -F "$1" >/dev/null; then
    timeout "$limit" bash -c "$1" >"$OUT/$name.log" 2>&1; rc=$?  # a function of this script (exported)
  else
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; rc=$?
  fi
  line=$(grep '^CHECK ' "$OUT/$name.log" | tail -1)
  if [ -z "$line" ]; then
    case $rc in
      0) line="CHECK $name: PASS $(tail -1 "$OUT/$name.log")";;
      77) line="CHECK $name: SKIP $(tail -1 "$OUT/$name.log")";;
      124) line="CHECK $name: FAIL timed out after ${limit} s";;
      *) line="CHECK $name: FAIL exit $rc: $(tail -1 "$OUT/$name.log")";;
    esac
  fi
  echo "$line ($((SECONDS - t0)) s)"
  case $line in *": FAIL"*) failed=1;; *": PASS"*) passed=$((passed + 1));; esac
}

settings() {
  nvidia-smi --query-gpu=index,pci.bus_id,power.limit,persistence_mode,compute_mode,mig.mode.current \
    --format=csv,noheader 2>/dev/null
}

env_check() {
  command -v nvidia-smi >/dev/null || { echo "needs nvidia-smi"; exit 77; }
  nvidia-smi -L || exit 1
  "$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device (a CPU-only torch build?)"
print(f"CHECK environment: PASS {torch.cuda.device_count()} GPU(s), torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
PY
}

needs_cuda() {
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 77)' 2>/dev/null && return
  echo "needs a CUDA device visible to torch"; exit 77
}

telemetry() {
  needs_cuda
  exec "$PY" -m pytest -q -rs tests/gpu -p no:cacheprovider
}

allreduce() {
  needs_cuda
  "$PY" - "$NG" "$OUT/allreduce" <<'PY'
import sys
from slurm_chaos.probe.local import run_local
world, out = int(sys.argv[1]), sys.argv[2]
res = run_local(world, ["--mode", "allreduce", "--steps", "20", "--min-bytes", "1024",
                        "--max-bytes", str(256 * 2**20), "--out", out], timeout=70)
for r in res:
    if r.returncode:
        print(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}")
last = [l for l in res[0].stdout.splitlines() if l.strip()][-1:] or ["no output"]
word = "FAIL" if any(r.returncode for r in res) or '"backend": "nccl"' not in res[0].stdout else "PASS"
print(f"CHECK nccl-allreduce: {word} {world} rank(s): {last[0][:200]}")
sys.exit(word == "FAIL")
PY
}

train() {
  needs_cuda
  "$PY" - "$NG" "$OUT/train" <<'PY'
import sys
from pathlib import Path
import numpy as np
from slurm_chaos.probe.local import run_local
from slurm_chaos.probe.reader import read_run
world, out = int(sys.argv[1]), sys.argv[2]
res = run_local(world, ["--steps", "100", "--model-size", "medium", "--out", out, "--progress-every", "25",
                        "--telemetry-interval", "0.5"], timeout=100)
if any(r.returncode for r in res):
    for r in res:
        print(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}")
    print("CHECK train: FAIL a rank failed")
    sys.exit(1)
parts, ok = [], True
for rk in read_run(Path(out)).ranks:
    tel = rk.telemetry
    samples = len(tel.get("time", []))
    ok &= samples >= 3
    parts.append(f"rank {rk.rank} GPU {rk.attrs['gpu_index']} {rk.attrs['gpu_pci_bus_id']} NUMA "
                 f"{rk.attrs['gpu_numa_node']} step {1e3 * np.median(rk.step_time):.1f} ms, {samples} NVML "
                 f"samples, max {np.nanmax(tel['gpu_power_w']):.0f} W {np.nanmax(tel['gpu_sm_clock_mhz']):.0f} MHz")
print(f"CHECK train: {'PASS' if ok else 'FAIL'} " + "; ".join(parts))
sys.exit(not ok)
PY
}

node_as_before() {
  command -v nvidia-smi >/dev/null || { echo "needs nvidia-smi"; exit 77; }
  settings >"$OUT/settings.after"
  if diff -u "$OUT/settings.before" "$OUT/settings.after" >"$OUT/settings.diff"; then
    echo "CHECK node-as-before: PASS $(wc -l <"$OUT/settings.after") GPU(s): $(tr '\n' ';' <"$OUT/settings.after")"
  else
    echo "CHECK node-as-before: FAIL $(grep '^[-+][^-+]' "$OUT/settings.diff" | tr '\n' ' ')"
    exit 1
  fi
}

export -f settings env_check needs_cuda telemetry allreduce train node_as_before
export OUT PY
settings >"$OUT/settings.before"
run environment env_check
NG=$("$PY" -c 'import torch; print(max(1, min(torch.cuda.device_count(), 8)))' 2>/dev/null || echo 1)
export NG
for name in parsers clock-lock power-cap xid-kmsg dcgm; do
  run "$name" "$PY" tests/gpu/gpu_faults.py "$name"
done
run telemetry telemetry
run nccl-allreduce allreduce
run train train
run node-as-before node_as_before

if [ "$failed" != 0 ]; then echo "GPU CHECK FAILED in $((SECONDS - START)) s (output in $OUT)"; exit 1; fi
if [ "$passed" = 0 ]; then echo "GPU CHECK: NOTHING CHECKED, every check skipped (output in $OUT)"; exit 2; fi
echo "GPU CHECK PASSED: $passed checks in $((SECONDS - START)) s (output in $OUT)"
