"""Command line of the probe: parse, run one rank, print the summary; no logic of its own."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from slurm_chaos.errors import ChaosError, UsageError
from slurm_chaos.probe.rendezvous import SOURCES
from slurm_chaos.probe.run import ProbeConfig, run_probe, summary_json
from slurm_chaos.probe.schema import ProbeMode
from slurm_chaos.probe.switch import ACK_TIMEOUT_S, load_schedule


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    from slurm_chaos.probe.workload import MODEL_SIZES

    p = argparse.ArgumentParser(
        prog="python -m slurm_chaos.probe",
        description="One rank of the slurm-chaos training probe: writes OUT/rank-<R>.h5.",
    )
    p.add_argument(
        "--steps",
        type=_positive_int,
        required=True,
        help="train: steps of the whole job (a resumed job continues to it); allreduce: iterations per size",
    )
    p.add_argument("--out", type=Path, required=True, help="run directory for rank-<R>.h5")
    # argparse checks the word against the choices and names them: ProbeMode(word) cannot fail.
    p.add_argument("--mode", choices=[m.value for m in ProbeMode], default=ProbeMode.TRAIN.value)
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="tiny")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--progress-every", type=_non_negative_int, default=10, help="rank 0 prints every N steps (0: never)"
    )
    p.add_argument(
        "--ckpt-dir", type=Path, help="checkpoint root; the job's files go to <root>/<job name>-<job id>"
    )
    p.add_argument("--ckpt-every", type=_positive_int, default=50)
    p.add_argument(
        "--ckpt-timeout", type=_positive_float, default=60.0, help="seconds before a write counts as hung"
    )
    p.add_argument("--rendezvous", choices=SOURCES, default="auto")
    p.add_argument("--rendezvous-timeout", type=_positive_float, default=60.0)
    p.add_argument(
        "--collective-timeout",
        type=_positive_float,
        default=600.0,
        help="seconds a collective may wait for a peer before the rank gives up",
    )
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--threads", type=_positive_int, default=1, help="torch CPU threads per rank")
    p.add_argument("--bucket-mb", type=_positive_float, default=25.0, help="gradient all_reduce bucket size")
    p.add_argument("--min-bytes", type=_positive_int, default=1024, help="allreduce: smallest message")
    p.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=None,
        help="allreduce: largest message (default 64 MiB on GPU, 4 MiB on CPU)",
    )
    p.add_argument(
        "--warmup", type=_non_negative_int, default=5, help="allreduce: untimed iterations per size"
    )
    p.add_argument("--telemetry-interval", type=_positive_float, default=1.0)
    p.add_argument(
        "--flush-every", type=_positive_int, default=50, help="flush the HDF5 file every N steps ..."
    )
    p.add_argument("--flush-interval", type=_positive_float, default=1.0, help="... or every S seconds")
    p.add_argument(
        "--hold-file",
        type=Path,
        help="train: after --steps, keep training until this file exists (the campaign's release)",
    )
    p.add_argument(
        "--hold-max-s",
        type=_positive_float,
        default=300.0,
        help="... or until the hold has lasted this long (the job then ends by itself)",
    )
    p.add_argument(
        "--fault-schedule",
        type=Path,
        help="train: the switchback schedule (JSON) to toggle the job's fault by, at step boundaries",
    )
    p.add_argument(
        "--fault-control",
        type=Path,
        help="... through the node's control channel under this journal root (needs --fault-schedule)",
    )
    p.add_argument(
        "--fault-ack-timeout",
        type=_positive_float,
        default=ACK_TIMEOUT_S,
        help="seconds a toggle waits for the agent's acknowledgement before the step is dropped",
    )
    return p


def parse(argv: Sequence[str] | None = None) -> ProbeConfig:
    """Parse the command line into a :class:`ProbeConfig`; argparse exits 2 on a bad option."""
    a = build_parser().parse_args(argv)
    if a.max_bytes is not None and a.max_bytes < a.min_bytes:
        raise UsageError(f"--max-bytes {a.max_bytes} is smaller than --min-bytes {a.min_bytes}")
    if a.hold_file is not None and ProbeMode(a.mode) is not ProbeMode.TRAIN:
        raise UsageError("--hold-file: only mode train holds (allreduce runs a fixed sweep)")
    if a.fault_control is not None and a.fault_schedule is None:
        raise UsageError("--fault-control: needs --fault-schedule (the schedule says when to toggle)")
    if a.fault_schedule is not None and ProbeMode(a.mode) is not ProbeMode.TRAIN:
        raise UsageError("--fault-schedule: only mode train follows a schedule (its steps are the blocks')")
    schedule = None if a.fault_schedule is None else load_schedule(a.fault_schedule, a.steps)
    return ProbeConfig(
        steps=a.steps,
        out=a.out,
        mode=ProbeMode(a.mode),
        model_size=a.model_size,
        seed=a.seed,
        progress_every=a.progress_every,
        ckpt_dir=a.ckpt_dir,
        ckpt_every=a.ckpt_every,
        ckpt_timeout=a.ckpt_timeout,
        rendezvous=a.rendezvous,
        rendezvous_timeout=a.rendezvous_timeout,
        collective_timeout=a.collective_timeout,
        backend=a.backend,
        threads=a.threads,
        bucket_mb=a.bucket_mb,
        min_bytes=a.min_bytes,
        max_bytes=a.max_bytes or 0,
        warmup=a.warmup,
        telemetry_interval=a.telemetry_interval,
        flush_every=a.flush_every,
        flush_interval=a.flush_interval,
        hold_file=a.hold_file,
        hold_max_s=a.hold_max_s,
        fault_schedule=schedule,
        fault_control=a.fault_control,
        fault_ack_timeout=a.fault_ack_timeout,
    )


def leave(code: int) -> NoReturn:
    """End the rank process with `code`, without the interpreter's finalisation.

    By now the rank has closed everything it wrote (rank file, heartbeat) and left its process
    group. Finalisation would still tear down torch's native state, and that can abort a rank whose
    work is done: a daemon thread that returns into torch's C++ code while the interpreter shuts
    down (the background checkpoint writer, held up by slow or hung storage past the final wait) is
    ended by pthread_exit, and the forced unwinding through C++ frames calls std::terminate
    ("terminate called without an active exception", exit 134). A failing rank may also hold an
    HDF5 file its storage refuses (ENOSPC, EIO), whose exit handlers would retry the write and can
    crash the process, hiding the exit code. MPI, where it launched the rank, is finalised first,
    as its launcher expects.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; rank 0 prints the JSON summary. Exit 0, or the failure's exit code."""
    try:
        summary = run_probe(parse(argv))
    except ChaosError as exc:
        print(f"probe: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    if summary.rank == 0:
        print(json.dumps(summary_json(summary)), flush=True)
    return 0
