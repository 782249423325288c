"""Who am I in the job, and where is rank 0: from Slurm, MPI (PMIx) or plain environment variables.

Sources, first match wins unless one is forced: ``env`` (RANK and WORLD_SIZE set, as torchrun and the
unit tests do), ``mpi`` (PMIX_RANK or OMPI_COMM_WORLD_RANK set: ``srun --mpi=pmix`` or mpirun; rank and
size come from ``MPI.COMM_WORLD`` and rank 0 broadcasts its address), ``slurm`` (SLURM_PROCID and
SLURM_NTASKS: rank 0 is the first host of SLURM_JOB_NODELIST, the port is derived from the job id),
and ``single`` (one process on loopback).
"""

from __future__ import annotations

import datetime
import re
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_chaos.errors import ChaosError, UsageError

SOURCES = ("auto", "env", "mpi", "slurm", "single")
# Ports below 29500 leave room for services; the range stays under the usual ephemeral ports.
_PORT_BASE = 29500
_PORT_SPAN = 2500


class RendezvousTimeout(ChaosError):
    """The process group could not be formed in time; the message names the host that never answered."""


@dataclass(frozen=True)
class Rendezvous:
    """This process's place in the job and the address every rank meets at."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str
    job_id: str = ""
    job_name: str = ""
    restart_count: int = 0
    hosts: tuple[str, ...] = ()


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist such as ``gpu[01-03,7],login1`` into host names, in order."""
    hosts: list[str] = []
    for item in _split_top_level(spec):
        hosts.extend(_expand_item(item))
    return hosts


def _split_top_level(spec: str) -> list[str]:
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in spec.strip():
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            raise UsageError(f"hostlist {spec!r}: unbalanced ']'")
        cur.append(ch)
    if depth != 0:
        raise UsageError(f"hostlist {spec!r}: unbalanced '['")
    items.append("".join(cur))
    return [i for i in items if i]


def _expand_item(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for suffix in _expand_item(rest) if rest else [""]:
        for r in ranges.split(","):
            out.extend(prefix + n + suffix for n in _expand_range(r, item))
    return out


def _expand_range(r: str, item: str) -> list[str]:
    lo, _, hi = r.partition("-")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        raise UsageError(f"hostlist item {item!r}: bad range {r!r}")
    if not hi:
        return [lo]
    if int(hi) < int(lo):
        raise UsageError(f"hostlist item {item!r}: range {r!r} runs backwards")
    width = len(lo)
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]


def port_for_job(job_id: str, step_id: str = "0") -> int:
    """A port every rank of one job step derives alike.

    A requeued job (same id, steps numbered from 0 again) gets the same port; two steps of one job
    running side by side get different ones.
    """
    key = job_id.split("_")[0] or "0"
    job = int(key) if key.isdigit() else zlib.crc32(key.encode())
    step = int(step_id) if step_id.isdigit() else 0
    return _PORT_BASE + (job * 16 + step % 16) % _PORT_SPAN


def detect_source(env: Mapping[str, str]) -> str:
    """The launcher that started this process, judged from its environment."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return "env"
    if "PMIX_RANK" in env or "OMPI_COMM_WORLD_RANK" in env:
        return "mpi"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return "slurm"
    return "single"


def resolve(env: Mapping[str, str], source: str = "auto") -> Rendezvous:
    """Work out rank, world size and rank 0's address from `env` (MPI is queried when it is the source)."""
    if source not in SOURCES:
        raise UsageError(f"--rendezvous {source!r}: choose one of {', '.join(SOURCES)}")
    chosen = detect_source(env) if source == "auto" else source
    if chosen == "env":
        return _from_env(env)
    if chosen == "slurm":
        return _from_slurm(env)
    if chosen == "mpi":
        return _from_mpi(env)
    return _make(env, 0, 1, 0, "127.0.0.1", _free_port(), "single")


def _int(env: Mapping[str, str], key: str) -> int:
    if key not in env:
        raise UsageError(f"environment variable {key} is not set")
    try:
        return int(env[key])
    except ValueError:
        raise UsageError(f"environment variable {key}={env[key]!r} is not an integer") from None


def _make(
    env: Mapping[str, str],
    rank: int,
    world: int,
    local: int,
    addr: str,
    port: int,
    source: str,
    hosts: tuple[str, ...] = (),
) -> Rendezvous:
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return Rendezvous(
        rank, world, local, addr, port, source,
        job_id=env.get("SLURM_JOB_ID", ""),
        job_name=env.get("SLURM_JOB_NAME", ""),
        restart_count=int(restarts) if restarts.isdigit() else 0,
        hosts=hosts,
    )  # fmt: skip


def _slurm_port(env: Mapping[str, str]) -> int:
    return port_for_job(env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0"))


def _from_env(env: Mapping[str, str]) -> Rendezvous:
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    _check_rank(rank, world)
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else _slurm_port(env)
    local = int(env.get("LOCAL_RANK", "0"))
    return _make(env, rank, world, local, addr, port, "env")


def _from_slurm(env: Mapping[str, str]) -> Rendezvous:
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    _check_rank(rank, world)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    hosts = tuple(expand_hostlist(nodelist)) if nodelist else ()
    if not hosts:
        raise UsageError("SLURM_JOB_NODELIST is empty: cannot tell which host runs rank 0")
    addr = env.get("MASTER_ADDR", hosts[0])
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else _slurm_port(env)
    local = int(env.get("SLURM_LOCALID", "0"))
    return _make(env, rank, world, local, addr, port, "slurm", hosts)


def _from_mpi(env: Mapping[str, str]) -> Rendezvous:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UsageError(f"launched under MPI/PMIx but mpi4py cannot be imported: {exc}") from exc
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    # Rank 0 picks a free port on its own host: no collision with another job step on the node.
    mine = (socket.gethostname(), _free_port()) if rank == 0 else None
    addr, port = comm.bcast(mine, root=0)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    hosts = tuple(dict.fromkeys(comm.allgather(socket.gethostname())))
    return _make(env, rank, world, local, addr, port, "mpi", hosts)


def _check_rank(rank: int, world: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"rank {rank} is outside a world of size {world}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_process_group(
    rv: Rendezvous, backend: str, timeout_s: float, collective_timeout_s: float | None = None
) -> None:
    """Form the torch.distributed group, or raise :class:`RendezvousTimeout` naming the silent host.

    `timeout_s` bounds the rendezvous; `collective_timeout_s` (default: the same) bounds how long a
    collective waits for a peer later on.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    collective = datetime.timedelta(seconds=collective_timeout_s or timeout_s)
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            rv.master_addr,
            rv.master_port,
            rv.world_size,
            rv.rank == 0,
            timeout=timeout,
            wait_for_workers=True,
        )
    except (RuntimeError, OSError) as exc:
        raise RendezvousTimeout(_timeout_message(rv, timeout_s, exc)) from exc
    dist.init_process_group(backend, store=store, rank=rv.rank, world_size=rv.world_size, timeout=collective)


def _timeout_message(rv: Rendezvous, timeout_s: float, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if rv.rank == 0:
        others = ", ".join(h for h in rv.hosts if h != rv.master_addr) or "the other ranks"
        who = f"not all {rv.world_size} ranks reached {rv.master_addr}:{rv.master_port} (waiting on {others})"
    else:
        who = f"rank 0's host {rv.master_addr}:{rv.master_port} is unreachable"
    return f"rendezvous timed out after {timeout_s:g} s: {who}: {first}"
