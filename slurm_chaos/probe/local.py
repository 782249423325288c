"""Start N probe ranks on this machine with plain-env rendezvous on loopback (tests, benchmarks)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_chaos.resources import import_root


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one local rank: ours minus any Slurm/MPI identity, plus RANK and friends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMIX_", "OMPI_"))}
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(import_root()), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def start_ranks(
    world: int,
    args: Sequence[str],
    *,
    port: int | None = None,
    extra_env: Mapping[str, str] | None = None,
    ranks: Sequence[int] | None = None,
) -> list[subprocess.Popen[str]]:
    """Start ranks (all by default) of ``python -m slurm_chaos.probe ARGS``; they meet on `port`."""
    port = port or free_port()
    argv = [sys.executable, "-m", "slurm_chaos.probe", *args]
    return [
        subprocess.Popen(
            argv,
            env=rank_env(r, world, port, extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (range(world) if ranks is None else ranks)
    ]


def wait_ranks(procs: Sequence[subprocess.Popen[str]], timeout: float = 300.0) -> list[RankResult]:
    """Wait for every rank; a rank still running after `timeout` is killed and reported as such."""
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += f"\n(killed after {timeout} s)"
        results.append(RankResult(rank, p.returncode, out, err))
    return results


def run_local(
    world: int, args: Sequence[str], *, timeout: float = 300.0, extra_env: Mapping[str, str] | None = None
) -> list[RankResult]:
    """Run a whole local job and return each rank's exit status and output."""
    return wait_ranks(start_ranks(world, args, extra_env=extra_env), timeout)
