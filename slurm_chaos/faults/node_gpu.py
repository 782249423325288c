"""GPU faults: an XID in the kernel log, DCGM field injection, and real throttling with nvidia-smi.

Each method reaches a different kind of detector. A kernel-log line (``NVRM: Xid (PCI:...): 79``
written to /dev/kmsg) is what dmesg-based checks (NHC ``check_gpu_xid``) see; it cannot be taken
back. ``dcgmi test --inject`` writes into DCGM's cache only (NVML and nvidia-smi never see it) and
needs a running nv-hostengine; the undo injects the healthy value back. Clock locks and power
caps really slow the GPU; the undo resets the clocks or restores the previous limit. On a node
without GPUs (or without DCGM) the fault says so in the log and changes nothing it cannot.

Each GPU fault records on every node whether its injection took (``faults/injection.py``): a DCGM
field is read back with ``dcgmi dmon`` after it is injected, a power cap with nvidia-smi (NVML),
a clock lock by the SM clock under load (``gpu/readback.py``: the prolog's GPU is idle, so the
agent reads it again until the job's load shows it, or shows the clock above the lock);
where there was nowhere to inject (no GPU of the job's, no dcgmi, no host engine, no nvidia-smi)
the record says what was missing, and the verdict is NO EFFECT rather than a blind spot.

Every GPU fault acts only on the job's own GPUs: ``gpu=N`` must be one of the numbers slurmd gave
the job on this node (``SLURM_JOB_GPUS`` in the prolog's environment, which slurmd sets and the
job cannot; never ``CUDA_VISIBLE_DEVICES``, which is the user's), and the noisy neighbour's GPU
burn runs on those GPUs only. Slurm's number is the GPU's device minor, not NVML's or DCGM's
index: each is found through the GPU's bus id (``gpu/numbering.py``), and a number that does not
resolve is refused. On a node with a GPU in MIG mode no GPU fault is injected (``gpu/readback.py``
says why).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.choices import EccKind, ThrottleMethod, XidMethod
from slurm_chaos.faults.injection import report
from slurm_chaos.faults.journal import Undo
from slurm_chaos.faults.node_base import ApplyFn, Controller, JobContext, applies, check, choice, log, num
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.gpu import numbering, nvsmi, readback
from slurm_chaos.gpu.numbering import GpuAddress
from slurm_chaos.resources import isolated_python
from slurm_chaos.runner import Runner

KMSG = Path("/dev/kmsg")
PROC_GPUS = numbering.PROC_GPUS
#: How often the agent reads a locked GPU's clock until the job's load shows the lock.
CLOCK_READ_EVERY_S = 5.0

#: DCGM field ids (dcgm_fields.h).
FIELD_XID = 230
FIELD_TEMP = 150
FIELD_THERMAL_VIOLATION = 241
FIELD_SBE_VOLATILE = 310
FIELD_DBE_VOLATILE = 311

XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
    63: "Row remapping event.",
    64: "Row remapper failure.",
    13: "Graphics Engine Exception.",
    31: "MMU Fault.",
    74: "NVLink Error.",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
}


def parse_job_gpus(text: str | None) -> tuple[int, ...]:
    """The GPU indices of slurmd's ``SLURM_JOB_GPUS`` ('0,2' or '0-3'); () when unset or unreadable."""
    out: list[int] = []
    for part in (text or "").split(","):
        m = re.fullmatch(r"(\d{1,4})(?:-(\d{1,4}))?", part.strip())
        if not m:
            return ()
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first or last - first > 1024:
            return ()
        out += range(first, last + 1)
    return tuple(sorted(set(out)))


def job_gpu(req: FaultRequest, ctx: JobContext) -> int:
    """The request's ``gpu=N`` if it is one of the job's GPUs on this node; else ChaosError."""
    gpu = int(num(req, "gpu"))
    if gpu not in ctx.gpus:
        held = ",".join(map(str, ctx.gpus)) if ctx.gpus else "none"
        raise ChaosError(
            f"{req.name}: gpu={gpu} is not one of job {ctx.job_id}'s GPUs on {ctx.node} "
            f"(SLURM_JOB_GPUS: {held}); slurm-chaos acts only on the job's own GPUs"
        )
    return gpu


def node_readings(runner: Runner) -> tuple[nvsmi.GpuReading, ...] | None:
    """Every GPU of the node as NVML sees it (one nvidia-smi call); None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    res = runner(nvsmi.reading_argv(), timeout=15)
    check(res.ok, "nvidia-smi --query-gpu", res.stderr or res.stdout)
    return nvsmi.readings(res.stdout)


def refuse_mig(name: str, gpus: Sequence[nvsmi.GpuReading] | None) -> None:
    """ChaosError on a node where a GPU is in MIG mode (``readback.mig_refusal`` says why)."""
    for gpu in gpus or ():
        why = readback.mig_refusal(gpu)
        if why:
            raise ChaosError(f"{name}: {why}")


def locate(
    name: str,
    slurm: int,
    nvml: Sequence[nvsmi.GpuReading] | None = None,
    dcgm: dict[str, int] | None = None,
) -> GpuAddress:
    """Slurm's GPU ``slurm`` under NVML's and DCGM's numbers, through the driver's bus ids."""
    driver = numbering.read_driver(PROC_GPUS)
    if driver is None:
        raise ChaosError(
            f"{name}: no NVIDIA driver on this node ({PROC_GPUS} absent): cannot tell which GPU is "
            f"Slurm's GPU {slurm}"
        )
    try:
        return numbering.address(slurm, driver, nvml, dcgm)
    except numbering.NumberingError as exc:
        raise ChaosError(f"{name}: {exc}") from exc


def xid_bus_id(slurm: int) -> str:
    """The GPU's bus id as NVRM prints it (0000:3b:00), from the driver; made up from Slurm's number
    on a node without the NVIDIA driver (a test cluster's fake GPUs)."""
    driver = numbering.read_driver(PROC_GPUS)
    if driver is None:
        return f"0000:{0x18 + slurm:02x}:00"
    return nvsmi.nvrm_bus_id(numbering.address(slurm, driver).bus_id)


def xid_line(bus: str, xid: int, node: str, job_id: str) -> str:
    """A kernel-log XID line in the NVRM format dmesg-based detectors match."""
    what = XID_TEXT.get(xid, "Injected error.")
    tag = f"(slurm-chaos: injected, node {node} job {job_id})"
    return f"NVRM: Xid (PCI:{bus}): {xid}, pid=0, name=slurm-chaos, {what} {tag}"


def dcgm_gpus(runner: Runner, node: str) -> tuple[dict[str, int], str]:
    """DCGM's GPU ids by bus id, and what keeps DCGM from taking an injection ("" when it can)."""
    if shutil.which("dcgmi") is None:
        return {}, f"no DCGM host engine on {node} (dcgmi not found)"
    res = runner(["dcgmi", "discovery", "-l"], timeout=15)
    if not res.ok:
        why = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no answer"]
        return {}, f"no DCGM host engine on {node} (dcgmi discovery -l: {why[0][:200]})"
    return numbering.parse_dcgm_discovery(res.stdout), ""


def dcgm_inject_argv(gpu: int, field: int, value: float | int) -> list[str]:
    return ["dcgmi", "test", "--inject", "--gpuid", str(gpu), "-f", str(field), "-v", f"{value:g}"]


def dcgm_read_argv(gpu: int, field: int) -> list[str]:
    """One sample of one field of one GPU, as DCGM's cache holds it (where an injection lands)."""
    return ["dcgmi", "dmon", "-i", str(gpu), "-e", str(field), "-c", "1"]


def parse_dmon(text: str, gpu: int) -> float | None:
    """The value of ``dcgmi dmon``'s row ``GPU <gpu>`` (one field); None if absent, blank or N/A."""
    for line in text.splitlines():
        m = re.fullmatch(r"\s*GPU\s+(\d+)\s+(\S+)\s*", line)
        if m and int(m.group(1)) == gpu:
            try:
                return float(m.group(2))
            except ValueError:
                return None
    return None


def read_back(wanted: float, got: float | None, what: str) -> tuple[bool, str]:
    """Whether a read-back shows the injected value, and the words for the record."""
    if got is not None and abs(got - wanted) <= max(0.5, 0.01 * abs(wanted)):
        return True, f"{what}: read back {got:g}"
    seen = "nothing" if got is None else f"{got:g}"
    return False, f"{what}: read back {seen}, not {wanted:g}: the injection did not take"


def _inject(req: FaultRequest, ctx: JobContext, gpu: int, field: int, value: float, healthy: float) -> None:
    argv = dcgm_inject_argv(gpu, field, value)
    ctx.journal.record(
        req.name, " ".join(argv), Undo(argv=tuple(dcgm_inject_argv(gpu, field, healthy))), ctx.deadline
    )
    res = ctx.runner(argv, timeout=20)
    check(res.ok, " ".join(argv), res.stderr or res.stdout)


def _inject_checked(
    req: FaultRequest, ctx: JobContext, where: GpuAddress, fields: Sequence[tuple[int, float, float]]
) -> None:
    """Inject each (field, value, healthy value), then read each back and record whether it took."""
    gpu = where.dcgm if where.dcgm is not None else where.slurm
    for field, value, healthy in fields:
        _inject(req, ctx, gpu, field, value, healthy)
    results = []
    for field, value, _ in fields:
        res = ctx.runner(dcgm_read_argv(gpu, field), timeout=20)
        got = parse_dmon(res.stdout, gpu) if res.ok else None
        results.append(read_back(value, got, f"DCGM field {field} of GPU {gpu}"))
    took = all(ok for ok, _ in results)
    words = "; ".join(words for _, words in results)
    report(ctx, req.name, took, f"{req.name} on {ctx.node} ({where.describe()}): {words}")


def _no_dcgm(req: FaultRequest, ctx: JobContext, missing: str) -> list[Controller]:
    report(ctx, req.name, False, f"{req.name}: {missing}: nothing was injected")
    return []


def _dcgm_target(req: FaultRequest, ctx: JobContext, slurm: int) -> GpuAddress | str:
    """The job's GPU under DCGM's id, or what keeps DCGM from taking an injection."""
    ids, missing = dcgm_gpus(ctx.runner, ctx.node)
    if missing:
        return missing
    refuse_mig(req.name, node_readings(ctx.runner))
    return locate(req.name, slurm, dcgm=ids)


def recorded(fn: ApplyFn) -> ApplyFn:
    """A fault refused or failed on this node is recorded as such before the agent logs it."""

    @functools.wraps(fn)
    def apply(req: FaultRequest, ctx: JobContext) -> list[Controller]:
        try:
            return fn(req, ctx)
        except (ChaosError, OSError) as exc:
            report(ctx, req.name, False, f"{exc}: nothing was injected")
            raise

    return apply


@applies("gpu-xid")
@recorded
def apply_gpu_xid(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    gpu, xid, method = job_gpu(req, ctx), int(num(req, "xid")), choice(req, "method", XidMethod)
    if method in (XidMethod.KMSG, XidMethod.BOTH):
        gpus = node_readings(ctx.runner)
        refuse_mig(req.name, gpus)
        try:  # where NVML shows GPUs, the driver must name the job's: no made-up bus id then
            bus = nvsmi.nvrm_bus_id(locate(req.name, gpu).bus_id) if gpus else xid_bus_id(gpu)
        except numbering.NumberingError as exc:
            raise ChaosError(f"{req.name}: {exc}") from exc
        line = xid_line(bus, xid, ctx.node, ctx.job_id)
        ctx.journal.record(
            req.name,
            f"write to {KMSG}: {line}",
            Undo(action="none", data={"note": "a kernel log line stays"}),
            ctx.deadline,
        )
        try:
            KMSG.write_text(f"<3>{line}\n")
        except OSError as exc:
            raise ChaosError(f"gpu-xid: cannot write {KMSG}: {exc}") from exc
        report(ctx, req.name, True, f"gpu-xid on {ctx.node}: XID {xid} written to {KMSG}")
    if method in (XidMethod.DCGM, XidMethod.BOTH):
        where = _dcgm_target(req, ctx, gpu)
        if isinstance(where, str):
            return _no_dcgm(req, ctx, where)
        _inject_checked(req, ctx, where, [(FIELD_XID, xid, 0)])
    return []


@applies("gpu-ecc")
@recorded
def apply_gpu_ecc(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    where = _dcgm_target(req, ctx, job_gpu(req, ctx))
    if isinstance(where, str):
        return _no_dcgm(req, ctx, where)
    field = FIELD_DBE_VOLATILE if choice(req, "kind", EccKind) is EccKind.DBE else FIELD_SBE_VOLATILE
    _inject_checked(req, ctx, where, [(field, int(num(req, "count")), 0)])
    return []


@applies("gpu-thermal")
@recorded
def apply_gpu_thermal(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    where = _dcgm_target(req, ctx, job_gpu(req, ctx))
    if isinstance(where, str):
        return _no_dcgm(req, ctx, where)
    _inject_checked(req, ctx, where, [(FIELD_TEMP, num(req, "temp"), 40), (FIELD_THERMAL_VIOLATION, 1, 0)])
    return []


def read_gpu(runner: Runner, bus: str) -> nvsmi.GpuReading | None:
    """One GPU's reading now, by bus id; None where nvidia-smi does not answer for it."""
    res = runner(nvsmi.reading_argv(), timeout=15)
    if not res.ok:
        return None
    return next((r for r in nvsmi.readings(res.stdout) if r.bus_id == bus), None)


@dataclass
class ClockReadBack:
    """Reads a locked GPU's SM clock until the job's load shows whether the lock took, and records it.

    The prolog locks an idle GPU, which shows nothing (``gpu/readback.py``); the agent drives this
    while the job runs, and the fault job's collect step copies the record after the probe.
    """

    name: str
    ctx: JobContext
    where: GpuAddress
    lock_mhz: float
    next_at: float = 0.0
    last: str = ""
    done: bool = False

    def tick(self, now: float) -> float:
        if self.done:
            return float("inf")
        if now < self.next_at:
            return self.next_at
        self.next_at = now + CLOCK_READ_EVERY_S
        got = read_gpu(self.ctx.runner, self.where.bus_id)
        if got is None:
            return self.next_at
        seen = readback.clock_lock(self.lock_mhz, got)
        self.last = seen.words
        if seen.took is None:
            return self.next_at
        report(
            self.ctx,
            self.name,
            seen.took,
            f"{self.name} on {self.ctx.node} ({self.where.describe()}): {seen.words}",
        )
        self.done = True
        return float("inf")

    def stop(self) -> None:
        if not self.done:
            log.warning(
                "%s on %s: the clock lock was never seen under load, nothing recorded (last: %s)",
                self.name,
                self.ctx.node,
                self.last or "no reading",
            )


@applies("gpu-throttle")
@recorded
def apply_gpu_throttle(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    slurm, method = job_gpu(req, ctx), choice(req, "method", ThrottleMethod)
    gpus = node_readings(ctx.runner)
    if gpus is None:
        report(
            ctx,
            req.name,
            False,
            f"gpu-throttle: no NVML on {ctx.node} (nvidia-smi not found): nothing was throttled",
        )
        return []
    refuse_mig(req.name, gpus)
    where = locate(req.name, slurm, nvml=gpus)
    mine = next(g for g in gpus if g.bus_id == where.bus_id)
    gpu = str(where.nvml)
    if method is ThrottleMethod.POWER:
        power = num(req, "power")
        why = readback.power_refusal(power, mine)
        if why or mine.power_limit_w is None:
            raise ChaosError(f"{req.name}: {why or 'NVML reports no power limit to restore'}")
        argv = ["nvidia-smi", "-i", gpu, "-pl", f"{power:g}"]
        undo = Undo(argv=("nvidia-smi", "-i", gpu, "-pl", f"{mine.power_limit_w:g}"))
    else:
        clock = f"{num(req, 'clock'):g}"
        argv = ["nvidia-smi", "-i", gpu, "-lgc", f"{clock},{clock}"]
        undo = Undo(argv=("nvidia-smi", "-i", gpu, "-rgc"))
    ctx.journal.record(req.name, " ".join(argv), undo, ctx.deadline)
    res = ctx.runner(argv, timeout=20)
    check(res.ok, " ".join(argv), res.stderr or res.stdout)
    after = read_gpu(ctx.runner, where.bus_id)
    if after is None:
        unread = f"nvidia-smi gave no reading of GPU {where.bus_id} after {' '.join(argv)}"
        seen = readback.ReadBack(None if method is ThrottleMethod.CLOCKS else False, unread)
    elif method is ThrottleMethod.POWER:
        seen = readback.power_cap(num(req, "power"), after)
    else:
        seen = readback.clock_lock(num(req, "clock"), after)
    if seen.took is None:
        log.info("%s on %s: clocks locked, read back under load: %s", req.name, ctx.node, seen.words)
        return [ClockReadBack(req.name, ctx, where, num(req, "clock"), time.time() + CLOCK_READ_EVERY_S)]
    report(ctx, req.name, seen.took, f"gpu-throttle on {ctx.node} ({where.describe()}): {seen.words}")
    return []


def burn_env(gpus: Sequence[int]) -> dict[str, str]:
    """CUDA sees only these GPUs, given in PCI bus order (:func:`cuda_order`), as CUDA numbers them."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}


def cuda_order(slurm: Sequence[int]) -> tuple[int, ...]:
    """Slurm's GPU numbers (device minors) as CUDA numbers them in PCI bus order; unchanged on a
    node without the NVIDIA driver (where there is no CUDA device to burn either)."""
    driver = numbering.read_driver(PROC_GPUS)
    return tuple(slurm) if driver is None else tuple(numbering.pci_order(g, driver) for g in slurm)


def burn_argv(ctx: JobContext, seconds: float) -> list[str]:
    """The command of a GPU burn on the job's GPUs of this node; ChaosError when it has none."""
    if not ctx.gpus:
        raise ChaosError(
            f"GPU burn: job {ctx.job_id} holds no GPU on {ctx.node} (SLURM_JOB_GPUS unset): "
            "slurm-chaos burns only the job's own GPUs"
        )
    # Run by the root agent: isolated, on this slurm_chaos (a checkout is not on a bare sys.path).
    return [
        *isolated_python("slurm_chaos.faults.node_gpu"),
        "burn",
        "--seconds",
        f"{seconds:g}",
        "--gpus",
        ",".join(map(str, cuda_order(ctx.gpus))),
    ]


def burn(seconds: float, gpus: Sequence[int]) -> int:
    """A GPU matmul burn on `gpus` only (the noisy neighbour's GPU load) for `seconds`."""
    if not gpus:
        print("slurm-chaos: burn: no GPU given (--gpus): nothing burnt", file=sys.stderr)
        return 2
    os.environ.update(burn_env(gpus))  # before CUDA initialises: it reads them once
    import torch

    if not torch.cuda.is_available():
        print("slurm-chaos: burn: no CUDA device")
        return 1
    mats = []
    for i in range(torch.cuda.device_count()):
        a = torch.randn(4096, 4096, device=f"cuda:{i}", dtype=torch.float16)
        mats.append((a, a.clone()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for a, b in mats:
            torch.matmul(a, b)
        torch.cuda.synchronize()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_chaos.faults.node_gpu")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("burn", help="matmul load on the job's GPUs")
    b.add_argument("--seconds", type=float, required=True)
    b.add_argument(
        "--gpus", required=True, help="the job's GPUs on this node, in PCI bus order (CUDA's numbers)"
    )
    args = p.parse_args(argv)
    gpus = parse_job_gpus(args.gpus)
    if not gpus:
        p.error(f"--gpus {args.gpus!r}: expected GPU indices such as 0,2 or 0-3")
    return burn(args.seconds, gpus)


if __name__ == "__main__":
    raise SystemExit(main())
