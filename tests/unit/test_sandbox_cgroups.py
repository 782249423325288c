"""The sandbox's per-node cgroup subtrees: which hierarchies, how a node is started in them, removal."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_chaos.faults import cgroupfs
from slurm_chaos.sandbox.cgroups import JOIN_AND_EXEC, Hierarchy, SandboxCgroups, hierarchies, node_argv

# /proc/self/mountinfo of this project's Debian 12 host (v1, one controller per hierarchy) and of a
# typical systemd host in hybrid mode (cpu and cpuacct co-mounted).
MOUNTINFO = """\
30 23 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
34 30 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
36 23 0:31 / /srv/elsewhere/cpu rw,relatime - cgroup cgroup rw,cpu
"""


def test_hierarchies_are_read_from_the_mount_table() -> None:
    assert hierarchies(MOUNTINFO) == [
        Hierarchy("cpu", "cgroup", "cpu"),
        Hierarchy("memory", "cgroup", "memory"),
        Hierarchy("systemd", "cgroup", "none,name=systemd"),
        Hierarchy("unified", "cgroup2", ""),
        Hierarchy("cpu,cpuacct", "cgroup", "cpu,cpuacct"),
    ]


def test_node_joins_its_cgroups_then_gets_a_cgroup_namespace_of_its_own(tmp_path: Path) -> None:
    procs = [tmp_path / "cpu/x/node1/cgroup.procs", tmp_path / "memory/x/node1/cgroup.procs"]
    hs = hierarchies(MOUNTINFO)[:2]
    argv = node_argv("ns1", "node1", Path("/h"), Path("/s.conf"), procs, hs, [("cpuacct", "cpu,cpuacct")])
    assert argv[:5] == ["nsenter", "--net=/run/netns/ns1", "sh", "-c", JOIN_AND_EXEC]
    sep = argv.index("--")
    assert argv[6:sep] == [str(p) for p in procs]
    assert argv[sep + 1 : sep + 3] == ["unshare", "--cgroup"]
    assert argv[-3:] == ["cpu:cgroup:cpu", "memory:cgroup:memory", "link:cpuacct:cpu,cpuacct"]
    # Without cgroups: the node's namespaces as before, no cgroup namespace.
    plain = node_argv("ns1", "node1", Path("/h"), Path("/s.conf"), [], [], [])
    assert "--cgroup" not in plain and plain[2] == "unshare" and plain[-3:] == ["node1", "/h", "/s.conf"]


def test_join_and_exec_writes_its_own_pid_before_it_execs(tmp_path: Path) -> None:
    files = [tmp_path / "a", tmp_path / "b"]
    out = subprocess.run(
        ["sh", "-c", JOIN_AND_EXEC, "sh", *map(str, files), "--", "sh", "-c", "echo $$"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert [f.read_text().strip() for f in files] == [out, out]


def fake_rmdir(group: Path) -> None:
    if any(p.is_dir() for p in group.iterdir()):
        raise OSError(errno.ENOTEMPTY, "child cgroups", str(group))
    if (group / "cgroup.procs").exists() and (group / "cgroup.procs").read_text().split():
        raise OSError(errno.EBUSY, "processes", str(group))
    shutil.rmtree(group)


def test_remove_kills_what_is_left_and_removes_every_cgroup_deepest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroupfs, "rmdir", fake_rmdir)
    hs = [Hierarchy("cpu", "cgroup", "cpu"), Hierarchy("freezer", "cgroup", "freezer")]
    for h in hs:
        (tmp_path / h.name).mkdir()
    cg = SandboxCgroups("cgx", tmp_path)
    procs = cg.create_node("node1", hs)
    assert procs == [tmp_path / h.name / "slurm-chaos-sandbox-cgx/node1/cgroup.procs" for h in hs]
    job = tmp_path / "freezer/slurm-chaos-sandbox-cgx/node1/slurm/uid_0/job_5"
    job.mkdir(parents=True)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (job / "cgroup.procs").write_text(f"{leftover.pid}\n")
    # The fake kernel empties the cgroup when its process dies: here, once the kill was sent.
    real_kill = cgroupfs.os.kill

    def kill(pid: int, sig: int) -> None:
        real_kill(pid, sig)
        (job / "cgroup.procs").write_text("")

    monkeypatch.setattr("slurm_chaos.sandbox.cgroups.os.kill", kill)
    stopped = cg.remove()
    assert leftover.wait(timeout=10) == -9
    assert stopped == [f"process {leftover.pid} in the sandbox's cgroups"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu", "freezer"]
    assert not list(tmp_path.rglob("slurm-chaos-sandbox-*"))
    assert cg.remove() == []


def conf_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def test_cgroup_conf_and_slurm_conf_per_mode_and_version() -> None:
    from slurm_chaos.sandbox.cluster import _render
    from slurm_chaos.sandbox.layout import Layout

    old = conf_lines(_render("cgroup.conf.j2", cgroups=True, version=(22, 5)))
    assert {
        "CgroupPlugin=cgroup/v1",
        "CgroupAutomount=no",
        "ConstrainCores=yes",
        "ConstrainRAMSpace=yes",
    } <= old
    new = conf_lines(_render("cgroup.conf.j2", cgroups=True, version=(24, 11)))
    assert "CgroupPlugin=cgroup/v1" in new and not any(line.startswith("CgroupAutomount") for line in new)
    assert conf_lines(_render("cgroup.conf.j2", cgroups=False, version=(24, 11))) == {"CgroupPlugin=disabled"}
    for cgroups, expected in (
        (True, {"ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "PrologFlags=Alloc,Contain"}),
        (False, {"ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "PrologFlags=Alloc"}),
    ):
        layout = Layout("cgx", 5, 2, "host", cgroups)
        for version in ((22, 5), (24, 11)):
            text = _render("slurm.conf.j2", L=layout, features=["a", "b"], health_interval=5, version=version)
            assert expected <= conf_lines(text)


def _select_lines(text: str) -> set[str]:
    return {line for line in conf_lines(text) if line.startswith(("SelectTypeParameters=", "DefMemPer"))}


def test_memory_is_consumable_where_slurm_23_02_and_later_would_otherwise_skip_the_memory_cgroup() -> None:
    """Slurm >= 23.02's task/cgroup joins a job's memory cgroup only with CR_*_Memory (22.05: with
    ConstrainRAMSpace alone); DefMemPerCPU shares a node's memory by cores, and 22.05 keeps CR_Core."""
    from slurm_chaos.sandbox.cluster import _render
    from slurm_chaos.sandbox.layout import Layout

    def render(cgroups: bool, version: tuple[int, int]) -> str:
        layout = Layout("cgx", 5, 2, "host", cgroups)
        return _render("slurm.conf.j2", L=layout, features=["a", "b"], health_interval=5, version=version)

    assert _select_lines(render(True, (22, 5))) == {"SelectTypeParameters=CR_Core"}
    assert _select_lines(render(False, (24, 11))) == {"SelectTypeParameters=CR_Core"}  # no memory cgroup
    for version in ((23, 2), (24, 11)):
        text = render(True, version)
        assert _select_lines(text) == {"SelectTypeParameters=CR_Core_Memory", "DefMemPerCPU=1000"}
        nodes = [line for line in conf_lines(text) if line.startswith("NodeName=")]
        assert len(nodes) == 2
        for line in nodes:  # DefMemPerCPU x CPUs == RealMemory: memory never binds before the cores
            words = dict(w.split("=", 1) for w in line.split())
            assert (words["CPUs"], words["CoresPerSocket"], words["RealMemory"]) == ("2", "2", "2000")
        assert "ConstrainRAMSpace=yes" in conf_lines(_render("cgroup.conf.j2", cgroups=True, version=version))
