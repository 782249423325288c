"""HDF5 layout of the probe's per-rank files (one file `rank-<R>.h5` per rank).

Schema version 1:

File attributes: ``schema_version`` (int), ``rank``, ``world_size``, ``local_rank`` (int),
``host``, ``job_id`` (str), ``start_time`` (float, Unix seconds), ``mode`` ("train" or
"allreduce"), ``backend`` ("gloo", "nccl" or "mpi"), ``restart_step`` (int, the first step of this
run: 0 for a fresh start, >0 after resuming from a checkpoint), ``cpu_affinity`` (str, e.g. "0-3"),
``cpu_numa_nodes`` (str), ``numa_mismatch`` (bool), ``gpu_index`` (int, -1 without a GPU).

Group ``steps`` (resizable, one entry per step, appended and flushed as the run goes):
``step`` (int64), ``t_start`` (float64 Unix seconds), and float64 seconds ``step_time``,
``compute_time``, ``comm_time``, ``optimizer_time``, ``data_time``, ``checkpoint_time``.

Group ``events``: ``time`` (float64), ``kind`` (str), ``detail`` (str); kinds listed in
:data:`EVENT_KINDS`.

Group ``telemetry`` (GPU ranks only): ``time`` plus one float64 dataset per NVML sample field.

Group ``allreduce`` (mode allreduce): ``size_bytes`` (int64), ``time`` (float64 s, median per
size), ``algbw`` and ``busbw`` (float64 GB/s, nccl-tests' definitions).
"""

from __future__ import annotations

SCHEMA_VERSION = 1

STEP_FIELDS = (
    "step_time",
    "compute_time",
    "comm_time",
    "optimizer_time",
    "data_time",
    "checkpoint_time",
)
STEP_INDEX_FIELDS = ("step", "t_start")

EVENT_KINDS = (
    "checkpoint_saved",
    "checkpoint_failed",
    "checkpoint_hang",
    "checkpoint_skipped",
    "resumed",
    "gpu_xid",
    "gpu_ecc",
    "gpu_throttle",
    "numa_mismatch",
    "telemetry_unavailable",
)

TELEMETRY_FIELDS = (
    "gpu_temp_c",
    "gpu_power_w",
    "gpu_sm_clock_mhz",
    "gpu_throttle_reasons",
    "gpu_ecc_volatile_dbe",
    "gpu_ecc_volatile_sbe",
)

ALLREDUCE_FIELDS = ("size_bytes", "time", "algbw", "busbw")


def rank_file_name(rank: int) -> str:
    """Name of the file rank `rank` writes in the run directory."""
    return f"rank-{rank}.h5"
