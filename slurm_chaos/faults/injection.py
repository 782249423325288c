"""Whether a node fault's injection took, kept beside its journal and copied into the run directory.

A fault that finds nowhere to inject (a node without GPUs, without NVML, without a DCGM host
engine) changes nothing, and a detector that stays quiet then is no blind spot. So the GPU faults
record, per node, whether their injection took (read back from DCGM or NVML where it can be):
``<journal root>/<node>/<job>.injections.json``, written by the root agent (mode 0644: it holds
fault names and readings only). The fault job copies it into its own directory with one task per
node before the probe (what the prolog did: the campaign releases a held job whose fault took
nowhere) and after it (``collect``, as the job's user, so root never writes where the user could
have put a link); the analysis reads ``fault/injections/<node>.json`` (``rundir/injections.py``).
The epilog removes the node's record with the job's grant.

    python -m slurm_chaos.faults.injection collect --journal-root ROOT --out JOB_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_chaos.errors import DataError
from slurm_chaos.faults.node_base import JobContext, log
from slurm_chaos.rundir.injections import (
    InjectionRecord,
    read_record_file,
    records_to_json,
    write_record_file,
)
from slurm_chaos.rundir.layout import INJECTIONS

#: The faults that keep a record (the fault job collects records only where its SPEC has one).
RECORDED = frozenset({"gpu-xid", "gpu-ecc", "gpu-thermal", "gpu-throttle"})
SUFFIX = ".injections.json"


def record_path(root: Path, node: str, job_id: str) -> Path:
    return root / node / f"{job_id}{SUFFIX}"


def report(ctx: JobContext, fault: str, took: bool, detail: str) -> None:
    """Add one fault's outcome on this node to the job's record (rewritten whole, atomically)."""
    path = record_path(ctx.journal.root, ctx.node, ctx.job_id)
    entry = InjectionRecord(fault, ctx.node, took, detail, time.time())
    (log.info if took else log.warning)("%s", detail)
    with ctx.journal.lock():  # the prolog and a delayed fault in the agent may both report
        try:
            earlier = read_record_file(path) if path.is_file() else ()
        except DataError:
            earlier = ()
        text = json.dumps(records_to_json(ctx.node, (*earlier, entry)), indent=2, sort_keys=True) + "\n"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, 0o644)  # readable by the job's own collect step, whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, path)


def remove(root: Path, node: str, job_id: str) -> None:
    record_path(root, node, job_id).unlink(missing_ok=True)


def collect(root: Path, node: str, job_id: str, out: Path) -> Path | None:
    """Copy this node's record of the job to ``out/injections/<node>.json``; None if it kept none."""
    src = record_path(root, node, job_id)
    if not src.is_file():
        return None
    records = read_record_file(src)
    dest = out / INJECTIONS / f"{node}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_record_file(dest, node, records)
    return dest


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The fault job's collect step; always 0: a missing record must not fail the job."""
    p = argparse.ArgumentParser(prog="python -m slurm_chaos.faults.injection")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="copy this node's injection record into the job's directory")
    c.add_argument("--journal-root", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    environ = os.environ if env is None else env
    node, job = environ.get("SLURMD_NODENAME", ""), environ.get("SLURM_JOB_ID", "")
    if not node or not job.isdigit():
        print("slurm-chaos: injection collect: SLURMD_NODENAME or SLURM_JOB_ID not set", file=sys.stderr)
        return 0
    try:
        dest = collect(args.journal_root, node, job, args.out)
    except (OSError, DataError) as exc:
        print(f"slurm-chaos: injection collect on {node}: {exc}", file=sys.stderr)
        return 0
    if dest is not None:
        print(f"slurm-chaos: {node}: injection record -> {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
