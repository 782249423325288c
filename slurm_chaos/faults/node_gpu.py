"""GPU faults: an XID in the kernel log, DCGM field injection, and real throttling with nvidia-smi.

Each method reaches a different kind of detector. A kernel-log line (``NVRM: Xid (PCI:...): 79``
written to /dev/kmsg) is what dmesg-based checks (NHC ``check_gpu_xid``) see; it cannot be taken
back. ``dcgmi test --inject`` writes into DCGM's cache only (NVML and nvidia-smi never see it) and
needs a running nv-hostengine; the undo injects the healthy value back. Clock locks and power
caps really slow the GPU; the undo resets the clocks or restores the previous limit. On a node
without GPUs (or without DCGM) the fault says so in the log and changes nothing it cannot.

Each GPU fault records on every node whether its injection took (``faults/injection.py``): a DCGM
field is read back with ``dcgmi dmon`` after it is injected, a power cap with nvidia-smi (NVML);
where there was nowhere to inject (no GPU of the job's, no dcgmi, no host engine, no nvidia-smi)
the record says what was missing, and the verdict is NO EFFECT rather than a blind spot.

Every GPU fault acts only on the job's own GPUs: ``gpu=N`` must be one of the indices slurmd gave
the job on this node (``SLURM_JOB_GPUS`` in the prolog's environment, which slurmd sets and the
job cannot; never ``CUDA_VISIBLE_DEVICES``, which is the user's), and the noisy neighbour's GPU
burn runs on those GPUs only.
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
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.choices import EccKind, ThrottleMethod, XidMethod
from slurm_chaos.faults.injection import report
from slurm_chaos.faults.journal import Undo
from slurm_chaos.faults.node_base import ApplyFn, Controller, JobContext, applies, check, choice, num
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.resources import isolated_python
from slurm_chaos.runner import Runner

KMSG = Path("/dev/kmsg")

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


def pci_bus_id(runner: Runner, gpu: int) -> str:
    """The GPU's PCI bus id as NVRM prints it (0000:3b:00); made up from the index without GPUs."""
    if shutil.which("nvidia-smi"):
        res = runner(
            ["nvidia-smi", "-i", str(gpu), "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=10
        )
        if res.ok and res.stdout.strip():
            # nvidia-smi prints 00000000:3B:00.0; NVRM prints 0000:3b:00.
            domain, bus, dev = res.stdout.strip().split(":")[:3]
            return f"{domain[-4:]}:{bus}:{dev.split('.')[0]}".lower()
    return f"0000:{0x18 + gpu:02x}:00"


def xid_line(bus: str, xid: int, node: str, job_id: str) -> str:
    """A kernel-log XID line in the NVRM format dmesg-based detectors match."""
    what = XID_TEXT.get(xid, "Injected error.")
    tag = f"(slurm-chaos: injected, node {node} job {job_id})"
    return f"NVRM: Xid (PCI:{bus}): {xid}, pid=0, name=slurm-chaos, {what} {tag}"


def dcgm_missing(runner: Runner, node: str) -> str | None:
    """What keeps DCGM from taking an injection on this node, in words; None when it can."""
    if shutil.which("dcgmi") is None:
        return f"no DCGM host engine on {node} (dcgmi not found)"
    res = runner(["dcgmi", "discovery", "-l"], timeout=15)
    if not res.ok:
        why = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no answer"]
        return f"no DCGM host engine on {node} (dcgmi discovery -l: {why[0][:200]})"
    return None


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
    req: FaultRequest, ctx: JobContext, gpu: int, fields: Sequence[tuple[int, float, float]]
) -> None:
    """Inject each (field, value, healthy value), then read each back and record whether it took."""
    for field, value, healthy in fields:
        _inject(req, ctx, gpu, field, value, healthy)
    results = []
    for field, value, _ in fields:
        res = ctx.runner(dcgm_read_argv(gpu, field), timeout=20)
        got = parse_dmon(res.stdout, gpu) if res.ok else None
        results.append(read_back(value, got, f"DCGM field {field} of GPU {gpu}"))
    took = all(ok for ok, _ in results)
    report(ctx, req.name, took, f"{req.name} on {ctx.node}: " + "; ".join(words for _, words in results))


def _no_dcgm(req: FaultRequest, ctx: JobContext, missing: str) -> list[Controller]:
    report(ctx, req.name, False, f"{req.name}: {missing}: nothing was injected")
    return []


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
        line = xid_line(pci_bus_id(ctx.runner, gpu), xid, ctx.node, ctx.job_id)
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
        missing = dcgm_missing(ctx.runner, ctx.node)
        if missing:
            return _no_dcgm(req, ctx, missing)
        _inject_checked(req, ctx, gpu, [(FIELD_XID, xid, 0)])
    return []


@applies("gpu-ecc")
@recorded
def apply_gpu_ecc(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    gpu = job_gpu(req, ctx)
    missing = dcgm_missing(ctx.runner, ctx.node)
    if missing:
        return _no_dcgm(req, ctx, missing)
    field = FIELD_DBE_VOLATILE if choice(req, "kind", EccKind) is EccKind.DBE else FIELD_SBE_VOLATILE
    _inject_checked(req, ctx, gpu, [(field, int(num(req, "count")), 0)])
    return []


@applies("gpu-thermal")
@recorded
def apply_gpu_thermal(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    gpu = job_gpu(req, ctx)
    missing = dcgm_missing(ctx.runner, ctx.node)
    if missing:
        return _no_dcgm(req, ctx, missing)
    _inject_checked(req, ctx, gpu, [(FIELD_TEMP, num(req, "temp"), 40), (FIELD_THERMAL_VIOLATION, 1, 0)])
    return []


def _query(runner: Runner, gpu: int, what: str) -> str:
    res = runner(
        ["nvidia-smi", "-i", str(gpu), f"--query-gpu={what}", "--format=csv,noheader,nounits"], timeout=10
    )
    check(res.ok, f"nvidia-smi --query-gpu={what}", res.stderr or res.stdout)
    return res.stdout.strip()


@applies("gpu-throttle")
@recorded
def apply_gpu_throttle(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    gpu, method = str(job_gpu(req, ctx)), choice(req, "method", ThrottleMethod)
    if shutil.which("nvidia-smi") is None:
        report(
            ctx,
            req.name,
            False,
            f"gpu-throttle: no NVML on {ctx.node} (nvidia-smi not found): nothing was throttled",
        )
        return []
    if method is ThrottleMethod.POWER:
        before = _query(ctx.runner, int(gpu), "power.limit")
        argv = ["nvidia-smi", "-i", gpu, "-pl", str(int(num(req, "power")))]
        undo = Undo(argv=("nvidia-smi", "-i", gpu, "-pl", before))
    else:
        clock = str(int(num(req, "clock")))
        argv = ["nvidia-smi", "-i", gpu, "-lgc", f"{clock},{clock}"]
        undo = Undo(argv=("nvidia-smi", "-i", gpu, "-rgc"))
    ctx.journal.record(req.name, " ".join(argv), undo, ctx.deadline)
    res = ctx.runner(argv, timeout=20)
    check(res.ok, " ".join(argv), res.stderr or res.stdout)
    if method is ThrottleMethod.POWER:
        got = _number(_query(ctx.runner, int(gpu), "power.limit"))
        took, words = read_back(num(req, "power"), got, f"power limit of GPU {gpu} (NVML)")
    else:
        # NVML reports no locked-clock setting to read back: the command's success is the evidence.
        took, words = True, f"clocks of GPU {gpu} locked at {num(req, 'clock'):g} MHz (nvidia-smi -lgc)"
    report(ctx, req.name, took, f"gpu-throttle on {ctx.node}: {words}")
    return []


def _number(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def burn_env(gpus: Sequence[int]) -> dict[str, str]:
    """CUDA sees only these GPUs, numbered as nvidia-smi and Slurm number them (PCI bus order)."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}


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
        ",".join(map(str, ctx.gpus)),
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
    b.add_argument("--gpus", required=True, help="the job's GPU indices on this node (SLURM_JOB_GPUS)")
    args = p.parse_args(argv)
    gpus = parse_job_gpus(args.gpus)
    if not gpus:
        p.error(f"--gpus {args.gpus!r}: expected GPU indices such as 0,2 or 0-3")
    return burn(args.seconds, gpus)


if __name__ == "__main__":
    raise SystemExit(main())
