"""slurm-chaos's GPU faults on a real GPU, one check per command: applied as the prolog applies them,
read back as the agent reads them, undone from the journal as the epilog undoes them, and the node
compared with itself before. Run by check_gpu.sh (as root for the faults); prints one line:

    CHECK <name>: PASS|FAIL|SKIP <what it measured>

and exits 0 (pass), 1 (fail) or 77 (skip: what it needs is not here).

    python tests/gpu/gpu_faults.py {parsers,clock-lock,power-cap,xid-kmsg,dcgm}
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_chaos.faults import injection, node_gpu
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import APPLIERS, Controller, JobContext
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.gpu import numbering, nvsmi
from slurm_chaos.observe.checks import parse_kmsg, read_kmsg
from slurm_chaos.rundir.injections import read_record_file
from slurm_chaos.runner import SubprocessRunner

SKIP = 77
RUNNER = SubprocessRunner()
NODE, JOB = "gpucheck", "424242"


class Skip(Exception):
    """What the check needs is not on this machine."""


def say(name: str, ok: bool | None, what: str) -> int:
    word = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    print(f"CHECK {name}: {word} {what}", flush=True)
    return SKIP if ok is None else 0 if ok else 1


def readings() -> tuple[nvsmi.GpuReading, ...]:
    res = RUNNER(nvsmi.reading_argv(), timeout=30)
    if not res.ok:
        raise Skip(f"nvidia-smi --query-gpu failed: {res.stderr.strip()[:200]}")
    return nvsmi.readings(res.stdout)


def first_gpu() -> tuple[int, nvsmi.GpuReading]:
    """Slurm's number (device minor) and NVML's reading of the lowest-minor GPU not in MIG mode."""
    if shutil.which("nvidia-smi") is None:
        raise Skip("needs nvidia-smi")
    driver = numbering.read_driver(node_gpu.PROC_GPUS)
    if not driver:
        raise Skip("needs the NVIDIA driver's /proc/driver/nvidia/gpus")
    by_bus = {r.bus_id: r for r in readings()}
    for gpu in driver:
        r = by_bus.get(gpu.bus_id)
        if r is not None and not r.mig:
            return gpu.minor, r
    raise Skip("every GPU is in MIG mode (the faults refuse MIG GPUs)")


def needs_root() -> None:
    if os.geteuid() != 0:
        raise Skip("needs root (nvidia-smi -lgc/-pl, /dev/kmsg)")


def job(tmp: Path, minor: int) -> JobContext:
    journal = Journal(tmp, NODE, JOB)
    journal.write_header(time.time() + 600, os.getpid())
    return JobContext(JOB, NODE, (NODE,), None, None, time.time() + 600, journal, RUNNER, gpus=(minor,))


def records(ctx: JobContext) -> list[tuple[bool, str]]:
    path = injection.record_path(ctx.journal.root, ctx.node, ctx.job_id)
    return [(r.took, r.detail) for r in read_record_file(path)] if path.exists() else []


@contextmanager
def undone(ctx: JobContext) -> Iterator[None]:
    """Whatever happens in the check, the journal is replayed at the end, as the epilog would."""
    try:
        yield
    finally:
        revert(ctx.journal, UndoContext(RUNNER), by="check_gpu")


def burn(ctx: JobContext, seconds: float) -> subprocess.Popen[bytes]:
    """The noisy neighbour's GPU burn on the job's GPU, as the agent starts it."""
    argv = node_gpu.burn_argv(ctx, seconds)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def loaded_sm_clock(ctx: JobContext, bus: str, seconds: float = 8.0) -> float | None:
    """The SM clock under the burn (the highest of a few readings once it has started)."""
    proc = burn(ctx, seconds)
    seen: list[float] = []
    try:
        time.sleep(3)
        for _ in range(4):
            r = node_gpu.read_gpu(RUNNER, bus)
            if r is not None and r.sm_clock_mhz is not None and (r.utilization_pct or 0) >= 50:
                seen.append(r.sm_clock_mhz)
            time.sleep(0.5)
    finally:
        proc.wait(timeout=seconds + 30)
    return max(seen) if seen else None


def check_parsers() -> int:
    """The live nvidia-smi output through slurm-chaos's parsers, and the node's GPU numbering."""
    if shutil.which("nvidia-smi") is None:
        raise Skip("needs nvidia-smi")
    listed = nvsmi.parse_list(RUNNER(["nvidia-smi", "-L"], timeout=30).stdout)
    topo = nvsmi.parse_topo(RUNNER(["nvidia-smi", "topo", "-m"], timeout=30).stdout)
    seen = readings()
    driver = numbering.read_driver(node_gpu.PROC_GPUS) or ()
    table = []
    for gpu in driver:
        where = numbering.address(gpu.minor, driver, seen)
        table.append(f"{where.slurm}->{where.bus_id}->{where.nvml}")
    numa = {g.index: g.numa_node for g in topo}
    ok = len(listed) == len(seen) == len(driver) and bool(seen) and all(g.index in numa for g in listed)
    mig = sum(len(g.mig) for g in listed)
    return say(
        "parsers",
        ok,
        f"{len(listed)} GPUs (-L), {len(seen)} (--query-gpu), {len(driver)} (driver), {mig} MIG devices; "
        f"Slurm->bus->NVML {' '.join(table)}; NUMA {numa}",
    )


def _drive(controllers: list[Controller], seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        if all(c.tick(time.time()) == float("inf") for c in controllers):
            return
        time.sleep(0.5)


def check_clock(tmp: Path) -> int:
    """Lock the SM clock at half its maximum; the agent's read-back under the burn must show it,
    and after the undo the loaded clock is back above the lock."""
    needs_root()
    minor, r = first_gpu()
    if r.sm_clock_max_mhz is None:
        raise Skip("NVML reports no maximum SM clock")
    ctx = job(tmp, minor)
    before = loaded_sm_clock(ctx, r.bus_id)
    lock = round(r.sm_clock_max_mhz / 2 / 15) * 15
    with undone(ctx):
        controllers = APPLIERS["gpu-throttle"](parse_spec(f"gpu-throttle:clock={lock},gpu={minor}")[0], ctx)
        proc = burn(ctx, 15)
        try:
            for c in controllers:
                if isinstance(c, node_gpu.ClockReadBack):
                    c.next_at = 0.0  # read at once: the burn is on
            _drive(controllers, 12)
        finally:
            proc.wait(timeout=60)
    after = loaded_sm_clock(ctx, r.bus_id)
    got = records(ctx)
    took = bool(got) and all(t for t, _ in got)
    restored = after is not None and after > lock + 50
    return say(
        "clock-lock",
        took and restored,
        f"GPU {minor} ({r.bus_id}) lock {lock} MHz: loaded SM clock {before} MHz before, read-back "
        f"{got[-1][1] if got else 'none (never seen under load)'}; after -rgc {after} MHz under load",
    )


def check_power(tmp: Path) -> int:
    """Cap the power limit halfway into its range, read it back, undo it: the limit as before."""
    needs_root()
    minor, r = first_gpu()
    if r.power_min_w is None or r.power_max_w is None or r.power_limit_w is None:
        raise Skip("GPU reports no power limit range")
    target = round((r.power_min_w + r.power_max_w) / 2)
    ctx = job(tmp, minor)
    with undone(ctx):
        APPLIERS["gpu-throttle"](parse_spec(f"gpu-throttle:method=power,power={target},gpu={minor}")[0], ctx)
    after = node_gpu.read_gpu(RUNNER, r.bus_id)
    got = records(ctx)
    back = after is not None and after.power_limit_w == r.power_limit_w
    return say(
        "power-cap",
        bool(got) and got[-1][0] and back,
        f"GPU {minor} cap {target} W: {got[-1][1] if got else 'no record'}; limit {r.power_limit_w} W "
        f"before, {after.power_limit_w if after else None} W after the undo",
    )


def check_xid(tmp: Path) -> int:
    """An XID line written to the kernel log on this GPU's bus, read back by the health check's parser."""
    needs_root()
    minor, r = first_gpu()
    ctx = job(tmp, minor)
    APPLIERS["gpu-xid"](parse_spec(f"gpu-xid:xid=13,gpu={minor}")[0], ctx)
    mine = [(bus, x) for _, bus, x in parse_kmsg(read_kmsg()) if nvsmi.bus_id(bus) == r.bus_id and x == 13]
    return say("xid-kmsg", bool(mine), f"GPU {minor} ({r.bus_id}): {len(mine)} Xid 13 line(s) in /dev/kmsg")


def check_dcgm(tmp: Path) -> int:
    """A DCGM thermal injection on DCGM's id of this GPU, read back with dcgmi dmon, then undone."""
    if shutil.which("dcgmi") is None:
        raise Skip("needs DCGM (dcgmi and a running nv-hostengine)")
    minor, _ = first_gpu()
    ctx = job(tmp, minor)
    with undone(ctx):
        APPLIERS["gpu-thermal"](parse_spec(f"gpu-thermal:temp=97,gpu={minor}")[0], ctx)
    got = records(ctx)
    return say("dcgm", bool(got) and got[-1][0], got[-1][1] if got else "no record")


CHECKS: dict[str, Callable[[Path], int]] = {
    "parsers": lambda tmp: check_parsers(),
    "clock-lock": check_clock,
    "power-cap": check_power,
    "xid-kmsg": check_xid,
    "dcgm": check_dcgm,
}


def run(name: str, tmp: Path) -> int:
    """One check, its line printed; a missing need is SKIP, an exception a FAIL naming it."""
    try:
        return CHECKS[name](tmp)
    except Skip as exc:
        return say(name, None, str(exc))
    except Exception as exc:  # a check that breaks is a failed check, with what broke it
        return say(name, False, f"{type(exc).__name__}: {exc}")


def main() -> int:
    p = argparse.ArgumentParser(prog="gpu_faults.py")
    p.add_argument("check", choices=sorted(CHECKS))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-faults.") as tmp:
        return run(args.check, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
