from __future__ import annotations

import pytest

from slurm_chaos.hostlist import compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,5],login", ["node1", "node2", "node5", "login"]),
        ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]"])
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.parametrize("expr", ["node[1-3,5]", "gpu[001-064]", "login", "a1,node[2-4]"])
def test_round_trip(expr: str) -> None:
    assert expand_hostlist(compress_hostlist(expand_hostlist(expr))) == expand_hostlist(expr)
