#!/usr/bin/env bash
# GPU check of the training probe, for a machine with NVIDIA GPUs: nccl, NVML telemetry, GPU NUMA
# locality. Runs in well under 10 minutes; exits non-zero if any check fails.
# Usage (repository root): bash tests/gpu/check_gpu.sh [OUTDIR]
# Needs: a CUDA build of torch, h5py, numpy, pytest, nvidia-ml-py (pip install nvidia-ml-py).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/probe-gpu-check.XXXX)}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
fail=0
step() { echo; echo "=== $*"; }

step "environment"
nvidia-smi -L || { echo "nvidia-smi failed: no usable GPU"; exit 1; }
nvidia-smi topo -m 2>/dev/null | head -20 || true
"$PY" - <<'PY'
import torch, h5py
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "h5py", h5py.__version__)
assert torch.cuda.is_available(), "torch sees no CUDA device (CPU-only torch build?)"
import pynvml; pynvml.nvmlInit(); print("NVML driver", pynvml.nvmlSystemGetDriverVersion())
PY

step "GPU tests (pytest tests/gpu)"
timeout 300 "$PY" -m pytest -q -rs tests/gpu -p no:cacheprovider || fail=1

step "probe: allreduce sweep 1 KiB .. 256 MiB (nccl)"
NG=$("$PY" -c 'import torch; print(min(torch.cuda.device_count(), 8))')
timeout 90 "$PY" - "$NG" "$OUT/allreduce" <<'PY' || fail=1
import sys
from slurm_chaos.probe.local import run_local
world, out = int(sys.argv[1]), sys.argv[2]
res = run_local(world, ["--mode", "allreduce", "--steps", "20", "--min-bytes", "1024",
                        "--max-bytes", str(256 * 2**20), "--out", out], timeout=85)
print(res[0].stdout)
bad = [r for r in res if r.returncode != 0]
for r in bad:
    print(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}")
sys.exit(1 if bad else 0)
PY

step "probe: train the medium model 100 steps (nccl), telemetry every 0.5 s"
timeout 150 "$PY" - "$NG" "$OUT/train" <<'PY' || fail=1
import sys
import numpy as np
from pathlib import Path
from slurm_chaos.probe.local import run_local
from slurm_chaos.probe.reader import read_run
world, out = int(sys.argv[1]), sys.argv[2]
res = run_local(world, ["--steps", "100", "--model-size", "medium", "--out", out, "--progress-every", "25",
                        "--telemetry-interval", "0.5"], timeout=140)
print(res[0].stdout)
if any(r.returncode for r in res):
    for r in res:
        print(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}")
    sys.exit(1)
for rk in read_run(Path(out)).ranks:
    tel = rk.telemetry
    print(f"rank {rk.rank} gpu {rk.attrs['gpu_index']} {rk.attrs['gpu_pci_bus_id']} numa {rk.attrs['gpu_numa_node']} "
          f"cpus {rk.attrs['cpu_affinity']} (nodes {rk.attrs['cpu_numa_nodes']}) mismatch {rk.attrs['numa_mismatch']} "
          f"step {1e3*np.median(rk.step_time):.1f} ms comm {1e3*np.median(rk.comm_time):.1f} ms "
          f"samples {len(tel.get('time', []))} temp max {np.nanmax(tel['gpu_temp_c']):.0f} C "
          f"power max {np.nanmax(tel['gpu_power_w']):.0f} W events {[e.kind for e in rk.events]}")
    assert len(tel.get("time", [])) >= 3, "no NVML samples"
PY

step "result"
if [ "$fail" = 0 ]; then echo "GPU CHECK PASSED (output in $OUT)"; else echo "GPU CHECK FAILED (output in $OUT)"; fi
exit "$fail"
