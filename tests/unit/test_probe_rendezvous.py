"""Rendezvous: hostlists, sources, ports and the timeout message."""

from __future__ import annotations

import time

import pytest

from slurm_chaos.errors import UsageError
from slurm_chaos.probe.local import free_port
from slurm_chaos.probe.rendezvous import (
    Rendezvous,
    RendezvousTimeout,
    detect_source,
    expand_hostlist,
    init_process_group,
    port_for_job,
    resolve,
)


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,4],login", ["node1", "node2", "node4", "login"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack2-n1", "rack1-n2", "rack2-n2"]),
        ("a,b[3],c", ["a", "b3", "c"]),
    ],
)
def test_expand_hostlist(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["node[1-", "node1]", "node[3-1]", "node[a-b]"])
def test_expand_hostlist_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(UsageError, match="hostlist"):
        expand_hostlist(spec)


def test_port_for_job_is_stable_and_in_range() -> None:
    ports = {port_for_job(str(j)) for j in range(1, 5000)}
    assert all(29500 <= p < 32000 for p in ports)
    assert port_for_job("1234") == port_for_job("1234")
    assert port_for_job("1234") != port_for_job("1235")
    assert port_for_job("1234", "0") != port_for_job("1234", "1")  # two steps side by side


def test_detect_source_priority() -> None:
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    assert detect_source(slurm) == "slurm"
    assert detect_source(slurm | {"PMIX_RANK": "1"}) == "mpi"
    assert detect_source(slurm | {"RANK": "1", "WORLD_SIZE": "2"}) == "env"
    assert detect_source({}) == "single"


def test_resolve_from_slurm_env() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "node[3-4]",
        "SLURM_JOB_ID": "812",
        "SLURM_JOB_NAME": "probe",
        "SLURM_RESTART_COUNT": "2",
    }
    rv = resolve(env)
    assert rv == Rendezvous(
        3, 4, 1, "node3", port_for_job("812"), "slurm", "812", "probe", 2, ("node3", "node4")
    )


def test_resolve_prefers_step_nodelist() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "n[1-4]",
        "SLURM_STEP_NODELIST": "n[3-4]",
    }
    assert resolve(env).master_addr == "n3"


def test_resolve_from_plain_env() -> None:
    rv = resolve({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4000"})
    assert (rv.rank, rv.world_size, rv.master_addr, rv.master_port, rv.source) == (
        1,
        2,
        "10.0.0.1",
        4000,
        "env",
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside a world of size 2"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "SLURM_JOB_NODELIST is empty"),
    ],
)
def test_resolve_rejects_bad_env(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve(env)


def test_resolve_rejects_unknown_source() -> None:
    with pytest.raises(UsageError, match="--rendezvous 'pbs'"):
        resolve({}, "pbs")


def test_rendezvous_timeout_names_unreachable_host() -> None:
    rv = Rendezvous(1, 2, 0, "127.0.0.1", free_port(), "env")
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"rank 0's host 127\.0\.0\.1:\d+ is unreachable"):
        init_process_group(rv, "gloo", 1.0)
    assert time.monotonic() - t0 < 30


def test_rendezvous_timeout_on_rank0_names_missing_hosts() -> None:
    rv = Rendezvous(0, 2, 0, "127.0.0.1", free_port(), "env", hosts=("127.0.0.1", "node7"))
    with pytest.raises(RendezvousTimeout, match=r"not all 2 ranks .* \(waiting on node7\)"):
        init_process_group(rv, "gloo", 1.0)
