"""Whether a clock lock or a power cap shows on the GPU, and when slurm-chaos refuses to set one.

A clock lock (``nvidia-smi -lgc L,L``) is proved only under load: an idle GPU clocks itself down
(345 MHz on an H100, the ``gpu_idle`` reason) whether locked or not. So a reading decides:

- the SM clock above the lock (plus the GPU's clock step) -> did not take, loaded or not: a locked
  GPU never clocks above its lock;
- busy (no ``gpu_idle``, utilisation at least :data:`BUSY_PCT`) at or below the lock -> took,
  the active clock-event reasons named beside it;
- otherwise (idle, or too little load to tell) -> not yet known: read again later.

A power cap is a setting NVML reads back (``power.limit``, ``enforced.power.limit``): it took
when the enforced limit is the one asked for. A cap outside the GPU's range (``power.min_limit``
to ``power.max_limit``) is refused before nvidia-smi is asked.

On a GPU in MIG mode neither is set: its clocks and power limit are the whole GPU's, shared by
every MIG instance on it (other jobs' among them), and cannot be locked or capped per instance.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_chaos.gpu.nvsmi import CLOCK_EVENT_BITS, GpuReading

#: Utilisation (%) from which a GPU counts as loaded for the clock read-back.
BUSY_PCT = 50.0
#: A lock is rounded to one of the GPU's supported clocks (steps of 15 MHz on Hopper) and never
#: goes below its lowest: the read-back allows this much above the lock.
CLOCK_SLACK_MHZ = 50.0
CLOCK_SLACK_RATIO = 0.05


@dataclass(frozen=True)
class ReadBack:
    """Whether the fault shows on the GPU (None: cannot tell yet), in words for the record."""

    took: bool | None
    words: str


def _reasons(r: GpuReading) -> str:
    names = r.reasons()
    return ", ".join(names) if names else "none"


def busy(r: GpuReading) -> bool:
    idle = r.event_reasons is not None and bool(r.event_reasons & CLOCK_EVENT_BITS["gpu_idle"])
    return not idle and r.utilization_pct is not None and r.utilization_pct >= BUSY_PCT


def clock_lock(lock_mhz: float, r: GpuReading) -> ReadBack:
    """Whether the reading shows the SM clock locked at ``lock_mhz`` (see the module docstring)."""
    what = f"GPU {r.bus_id}"
    if r.sm_clock_mhz is None:
        return ReadBack(None, f"{what}: NVML reports no SM clock")
    sm, util = r.sm_clock_mhz, "n/a" if r.utilization_pct is None else f"{r.utilization_pct:g}%"
    seen = f"SM clock {sm:g} MHz at {util} utilisation, clock-event reasons: {_reasons(r)}"
    ceiling = lock_mhz + max(CLOCK_SLACK_MHZ, CLOCK_SLACK_RATIO * lock_mhz)
    if sm > ceiling:
        return ReadBack(False, f"{what}: {seen}: above the {lock_mhz:g} MHz lock, the lock did not take")
    if busy(r):
        return ReadBack(True, f"{what}: {seen}: at or below the {lock_mhz:g} MHz lock under load")
    return ReadBack(None, f"{what}: {seen}: not loaded, the lock cannot show yet")


def power_cap(limit_w: float, r: GpuReading) -> ReadBack:
    """Whether NVML's enforced power limit is the one asked for."""
    got = r.enforced_power_limit_w if r.enforced_power_limit_w is not None else r.power_limit_w
    what = f"power limit of GPU {r.bus_id} (NVML)"
    if got is not None and abs(got - limit_w) <= max(0.5, 0.01 * limit_w):
        return ReadBack(True, f"{what}: read back {got:g} W")
    seen = "nothing" if got is None else f"{got:g} W"
    return ReadBack(False, f"{what}: read back {seen}, not {limit_w:g} W: the cap did not take")


def mig_refusal(r: GpuReading) -> str:
    """Why no GPU fault acts on a GPU in MIG mode; "" when it is not in MIG mode."""
    if not r.mig:
        return ""
    return (
        f"GPU {r.bus_id} is in MIG mode: the job's GPU is a MIG instance, whose clocks and power "
        "limit are the whole GPU's, shared by every instance on it (other jobs' among them); "
        "nvidia-smi cannot lock or cap one instance, and Slurm's GPU numbers on a MIG node name "
        "instances, not GPUs: slurm-chaos injects no GPU fault there"
    )


def power_refusal(limit_w: float, r: GpuReading) -> str:
    """Why a power cap of ``limit_w`` is not asked of this GPU; "" when it is within its range."""
    lo, hi = r.power_min_w, r.power_max_w
    if lo is None or hi is None:
        return f"GPU {r.bus_id} reports no power limit range (power management not supported)"
    if not lo <= limit_w <= hi:
        return (
            f"power={limit_w:g} W is outside GPU {r.bus_id}'s power limit range "
            f"{lo:g}-{hi:g} W (nvidia-smi power.min_limit, power.max_limit)"
        )
    return ""
