"""Node-level faults on the real sandbox: the effect seen from inside a job, and the node as before after it.

The prolog/epilog hooks are installed into the sandbox's prolog.d/epilog.d for this module, with a
policy that lets root inject on shared nodes (netem, node-wide, acts only for a job that holds its
node alone: its jobs are submitted with --exclusive). Jobs get their SPEC as an administrator gives
one (``sbatch --hold``, ``scontrol update JobId=J AdminComment=slurm-chaos=SPEC``, ``scontrol
release``), so these tests do not depend on the SPANK plugin.
Each node is a slurmd in its own network and mount namespaces; its state is read by entering them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from nodecgroups import leftover_cgroups
from waiting import wait_until

from slurm_chaos.faults import node_proc
from slurm_chaos.faults.authz import SPEC_MARK
from slurm_chaos.faults.cleanup import cleanup
from slurm_chaos.faults.install_hooks import HOOK_NAME, install_hooks, uninstall_hooks
from slurm_chaos.faults.journal import Journal, Undo, any_failed
from slurm_chaos.faults.node_base import MARKER_ENV
from slurm_chaos.faults.node_net import qdisc_handle
from slurm_chaos.faults.policy import POLICY_NAME, Policy, write_policy
from slurm_chaos.runner import Completed, SubprocessRunner

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120

# Runs inside job steps: a TCP sink/echo server and the clients that time it.
NETPROBE = r"""
import socket, statistics, sys, time
mode = sys.argv[1]
if mode == "serve":
    srv = socket.create_server(("0.0.0.0", int(sys.argv[2])))
    srv.settimeout(60)
    while True:
        conn, _ = srv.accept()
        kind = conn.recv(1)
        if kind == b"Q":
            break
        while True:
            data = conn.recv(65536)
            if not data:
                break
            if kind == b"E":
                conn.sendall(data)
        conn.close()
elif mode == "send":
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
    s.sendall(b"S")
    t = time.monotonic()
    s.sendall(b"x" * int(sys.argv[4]))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print(f"SEND_S={time.monotonic() - t:.3f}")
elif mode == "rtt":
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"E")
    rtts = []
    for _ in range(int(sys.argv[4])):
        t = time.monotonic()
        s.sendall(b"p")
        s.recv(1)
        rtts.append(time.monotonic() - t)
    print(f"RTT_MS={statistics.median(rtts) * 1000:.2f}")
    s.close()
    q = socket.create_connection((sys.argv[2], int(sys.argv[3])))
    q.sendall(b"Q")
"""

# Runs as each task: fixed CPU work, timed in wall-clock seconds.
# With WAIT_CAPPED_RANK set, that rank first waits (up to a minute) until the agent moved it into
# the slow-rank cgroup, so that its work is timed under the cap, however late the agent's scan was.
BUSY = r"""
import os, signal, time
rank = os.environ["SLURM_PROCID"]
continued = []  # a duty cycle has stopped and continued this task
signal.signal(signal.SIGCONT, lambda *_: continued.append(1))
def cpu_cgroup():
    lines = open("/proc/self/cgroup").read().split()
    cgroup = [line for line in lines if ":cpu," in line or ":cpu:" in line]
    return lines, cgroup[0].strip() if cgroup else ""
deadline = time.monotonic() + 60
while os.environ.get("WAIT_CAPPED_RANK") == rank and "slurm-chaos" not in cpu_cgroup()[1]:
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
while os.environ.get("WAIT_STOPPED_RANK") == rank and not continued and time.monotonic() < deadline:
    time.sleep(0.01)
t, c = time.monotonic(), time.process_time()
x = 0
for i in range(int(os.environ.get("WORK", "30000000"))):
    x += i * i
wall, cpu = time.monotonic() - t, time.process_time() - c
lines, where = cpu_cgroup()
# How often the cpu controller held this task back (its cgroup's quota), seen from inside the node.
try:
    stat = open("/sys/fs/cgroup/cpu" + where.split(":", 2)[2].rstrip("/") + "/cpu.stat").read().split()
    throttled = stat[stat.index("nr_throttled") + 1]
except (OSError, IndexError, ValueError):
    throttled = "n/a"
cgroups = ";".join(lines)
print(f"RANK={rank} WALL_S={wall:.3f} CPU_S={cpu:.3f} THROTTLED={throttled}",
      f"CGROUP={where} CGROUPS={cgroups}", flush=True)
"""


@dataclass(frozen=True)
class Cluster:
    """The sandbox with the hooks installed."""

    env: dict[str, str]
    root: Path
    shared: Path
    journal_root: Path
    log_file: Path
    nodes: tuple[str, ...]

    @property
    def checkpoints(self) -> Path:
        """The site's checkpoint path: the one root under which ckpt-full may act."""
        return self.shared / "checkpoints"

    def run(self, argv: Sequence[str], timeout: float = TIMEOUT) -> Completed:
        return SubprocessRunner()(argv, timeout=timeout, env=self.env)

    def slurmd_pid(self, node: str) -> int:
        return int((self.root / "run" / f"slurmd.{node}.pid").read_text().split()[0])

    def in_node(self, node: str, argv: Sequence[str]) -> Completed:
        return self.run(["nsenter", "-t", str(self.slurmd_pid(node)), "-n", "-m", "--", *argv], timeout=20)

    def submit(self, script: str, spec: str | None, *sbatch: str, user: SandboxUser | None = None) -> str:
        """Submit held, give the job its SPEC as an administrator would (AdminComment), release.

        With `user`, the job is that user's: submitted as them, from their own directory."""
        name = uuid.uuid4().hex[:8]
        where = user.home if user else self.shared
        path = where / f"job-{name}.sh"
        path.write_text("#!/bin/bash\n" + script)
        out = where / f"job-{name}.out"
        argv = ["sbatch", "--parsable", "--hold", "-o", str(out), "-D", str(where), *sbatch, str(path)]
        if user:
            os.chown(path, user.uid, user.gid)
            keep = ("SLURM_CONF", "SBATCH_RESERVATION", "PATH")
            argv = user.argv(*argv, env={k: self.env[k] for k in keep if k in self.env})
        res = self.run(argv)
        assert res.ok, res.stderr
        job = res.stdout.strip().split(";")[0]
        if spec:
            marked = self.run(["scontrol", "update", f"JobId={job}", f"AdminComment={SPEC_MARK}{spec}"])
            assert marked.ok, marked.stderr
        assert self.run(["scontrol", "release", job]).ok
        return job

    def output(self, job: str) -> str:
        res = self.run(["scontrol", "show", "job", job])
        m = re.search(r"StdOut=(\S+)", res.stdout)
        assert m, res.stdout
        return Path(m.group(1)).read_text()

    def state(self, job: str) -> str:
        res = self.run(["squeue", "-h", "-j", job, "-o", "%T"])
        return res.stdout.strip() if res.ok else ""

    def wait_state(self, job: str, states: set[str], timeout: float = TIMEOUT) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.state(job)
            if state in states or (not state and "" in states):
                return state
            time.sleep(0.3)
        raise AssertionError(f"job {job} never reached {states} (last {state!r})")

    def wait_done(self, job: str, nodes: Sequence[str], timeout: float = TIMEOUT) -> None:
        """Until the job left the queue and every node's journal of it is closed and fully undone."""
        self.wait_state(job, {"", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"}, timeout)
        self.wait_reverted(job, nodes, timeout)

    def wait_reverted(self, job: str, nodes: Sequence[str], timeout: float = TIMEOUT) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = [Journal(self.journal_root, n, job).read() for n in nodes]
            if all(s.closed and not s.pending() for s in states):
                return
            time.sleep(0.3)
        raise AssertionError(f"job {job}: journals not reverted: {[self.journal(n, job) for n in nodes]}")

    def journal(self, node: str, job: str) -> str:
        path = self.journal_root / node / f"{job}.jsonl"
        return path.read_text() if path.exists() else "(none)"

    def wait_agent(self, job: str, node: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(e.fault == "agent" for e in Journal(self.journal_root, node, job).read().entries):
                return
            time.sleep(0.2)
        raise AssertionError(f"no agent for job {job} on {node}: {self.journal(node, job)}")

    def wait_log(self, text: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.log_file.exists() and text in self.log_file.read_text():
                return
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never logged in {self.log_file}")

    def snapshot(self, node: str) -> dict[str, object]:
        """What a fault may change on a node, read from inside its namespaces."""
        pid = self.slurmd_pid(node)
        qdisc = self.qdisc(node)
        mounts = sorted(
            " ".join(line.split()[3:5]) for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        )
        net = node_proc.ns_inode(pid, "net")
        stopped, marked, tasks = [], [], []
        for p in node_proc.pids():
            if node_proc.ns_inode(p, "net") != net:
                continue
            env = node_proc.environ(p)
            if MARKER_ENV in env:
                marked.append(p)
            if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env:
                tasks.append(p)
            stat = Path(f"/proc/{p}/stat")
            if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
                stopped.append(p)
        cgroups = self.cgroups(node)
        # A node stays "mixed"/"completing" for a few seconds after its last job, while the epilog runs.
        deadline = time.monotonic() + 60
        while True:
            state = self.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()
            if state.rstrip("*") not in ("mixed", "completing", "allocated") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {
            "qdisc": qdisc,
            "mounts": mounts,
            "stopped": stopped,
            "marked": marked,
            "tasks": tasks,
            "cgroups": cgroups,
            # "reserved" is "idle" inside the maintenance reservation (shown once the reservation has
            # been evaluated, so a sandbox just brought up may show either): not a change of the node.
            "state": "idle" if state.rstrip("*") == "reserved" else state,
        }

    def qdisc(self, node: str) -> str:
        return self.in_node(node, ["tc", "qdisc", "show", "dev", "eth0"]).stdout

    def marked(self, node: str) -> list[int]:
        """The node's processes started by a fault (MARKER_ENV in their environment)."""
        net = node_proc.ns_inode(self.slurmd_pid(node), "net")
        return [
            p
            for p in node_proc.pids()
            if node_proc.ns_inode(p, "net") == net and MARKER_ENV in node_proc.environ(p)
        ]

    def cgroups(self, node: str) -> list[str]:
        return leftover_cgroups(self.root.name, node)

    def snapshots(self, nodes: Sequence[str]) -> dict[str, dict[str, object]]:
        return {n: self.snapshot(n) for n in nodes}


@pytest.fixture(scope="module")
def cluster(sandbox) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    root = Path(sandbox.slurm_conf).parent.parent
    etc = Path(sandbox.slurm_conf).parent
    journal_root = root / "journal"
    log_file = root / "log" / "slurm-chaos-agent.log"
    policy = etc / POLICY_NAME
    saved_policy = policy.read_text() if policy.exists() else None
    # The hooks an earlier install put there (the session's `chaos_site`), put back afterwards: the
    # tests after these ones run jobs whose faults need the prolog's grant.
    hooks = [etc / f"{kind}.d" / HOOK_NAME for kind in ("prolog", "epilog")]
    saved_hooks = {h: (h.read_bytes(), h.stat().st_mode) for h in hooks if h.exists()}
    # These tests measure faults on nodes that jobs share (several jobs per node, no --exclusive).
    # netem shapes the interface the site names for job traffic: the sandbox nodes' eth0.
    write_policy(
        policy, Policy(allow_users=("root", "chaosok"), require_exclusive=False, job_interface="eth0")
    )
    checkpoints = Path(sandbox.shared_dir) / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    install_hooks(
        etc,
        sys.executable,
        journal_root=journal_root,
        log_file=log_file,
        audit_log=root / "log" / "slurm-chaos-audit.log",
        deadline_s=600,
        ckpt_roots=(str(checkpoints),),
    )
    (Path(sandbox.shared_dir) / "netprobe.py").write_text(NETPROBE)
    (Path(sandbox.shared_dir) / "busy.py").write_text(BUSY)
    c = Cluster(
        dict(sandbox.env),
        root,
        Path(sandbox.shared_dir),
        journal_root,
        log_file,
        tuple(sandbox.nodes),
    )
    # Leftovers of an earlier, interrupted run would spoil the before/after comparisons.
    cleanup(journal_root, None, SubprocessRunner(base_env=c.env))
    try:
        yield c
    finally:
        uninstall_hooks(etc)
        for hook, (data, mode) in saved_hooks.items():
            hook.write_bytes(data)
            hook.chmod(mode)
        if saved_policy is None:
            policy.unlink(missing_ok=True)
        else:
            policy.write_text(saved_policy)


def kernel_has_netem(c: Cluster) -> bool:
    ns = f"sc-netem-probe-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        res = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
        )
        return res.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def values(text: str, key: str) -> list[float]:
    return [float(v) for v in re.findall(rf"{key}=([0-9.]+)", text)]


NET_JOB = """
PY={py}
srun --overlap -N1 -n1 -w node2 $PY netprobe.py serve 9{port} &
sleep 1.5
echo "QDISC=$(srun --overlap -N1 -n1 -w node1 tc qdisc show dev eth0)"
srun --overlap -N1 -n1 -w node1 $PY netprobe.py send node2 9{port} {nbytes}
srun --overlap -N1 -n1 -w node1 $PY netprobe.py rtt node2 9{port} 20
wait
"""


def test_network_degradation_is_measured_inside_the_job_and_reverted(cluster: Cluster) -> None:
    nodes = ["node1", "node2"]
    before = cluster.snapshots(nodes)
    script = NET_JOB.format(py=sys.executable, port=101, nbytes=1 << 20)
    base = cluster.submit(script, None, "-N2", "-w", "node[1-2]")
    cluster.wait_state(base, {"", "COMPLETED"})
    netem = kernel_has_netem(cluster)
    spec = "netem:rate=256K" + (",delay=40ms" if netem else "")
    job = cluster.submit(script.replace("9101", "9102"), spec, "-N2", "-w", "node[1-2]", "--exclusive")
    cluster.wait_done(job, nodes)
    plain, shaped = cluster.output(base), cluster.output(job)
    (send0,), (send1,) = values(plain, "SEND_S"), values(shaped, "SEND_S")
    # 1 MiB at 256 KiB/s takes at least ~3.5 s (the first 32 KiB burst goes at once); unshaped, < 1 s.
    assert send0 < 1.0 and send1 > 3.0, (plain, shaped)
    assert f"{qdisc_handle(job)} root" in shaped and ("netem" in shaped if netem else "tbf" in shaped)
    if netem:
        (rtt0,), (rtt1,) = values(plain, "RTT_MS"), values(shaped, "RTT_MS")
        assert rtt1 - rtt0 > 35, (rtt0, rtt1)
    assert cluster.snapshots(nodes) == before


@pytest.mark.parametrize("existing", [False, True])
def test_full_checkpoint_volume_only_on_the_checkpoint_path(cluster: Cluster, existing: bool) -> None:
    ckpt = cluster.checkpoints / f"ckpt-full-{uuid.uuid4().hex[:6]}"
    if existing:  # an earlier checkpoint stays readable: a restart works, new checkpoints do not fit
        ckpt.mkdir()
        (ckpt / "old.pt").write_text("old checkpoint")
    script = f"""
{sys.executable} - <<'EOF'
import errno, os
st = os.statvfs("{ckpt}")
print("FREE", st.f_bavail * st.f_frsize)
if os.path.exists("{ckpt}/old.pt"):
    print("OLD", open("{ckpt}/old.pt").read())
try:
    with open("{ckpt}/ckpt.pt", "wb") as f:
        f.write(b"x" * 100000)
    print("CKPT written")
except OSError as e:
    print("CKPT", errno.errorcode[e.errno])
with open("{cluster.shared}/elsewhere-{ckpt.name}", "wb") as f:
    f.write(b"x" * 100000)
print("ELSEWHERE ok")
EOF
"""
    before = cluster.snapshot("node3")
    job = cluster.submit(script, f"ckpt-full:path={ckpt}", "-N1", "-w", "node3")
    cluster.wait_done(job, ["node3"])
    out = cluster.output(job)
    assert "FREE 0" in out and "CKPT ENOSPC" in out and "ELSEWHERE ok" in out, out
    assert cluster.snapshot("node3") == before
    assert not list(Path("/run/slurm-chaos").glob(f"ckpt-node3-{job}"))
    if existing:
        assert "OLD old checkpoint" in out, out
        assert sorted(p.name for p in ckpt.iterdir()) == ["old.pt"]
    else:
        assert not ckpt.exists()  # the directory the fault created is gone again


# Runs as the job's user (who cannot run root's interpreter): what the job sees of its checkpoint path.
USER_PY = "/usr/bin/python3"
CKPT_PROBE = """
{py} - <<'EOF'
import errno, os
p = "{ckpt}"
st = os.statvfs(p) if os.path.isdir(p) else None
print("FREE", st.f_bavail * st.f_frsize if st else "none")
print("OWNER", os.stat(p).st_uid if os.path.isdir(p) else "none")
try:
    with open(p + "/ckpt.pt", "wb") as f:
        f.write(b"x" * 100000)
    print("CKPT written")
except OSError as e:
    print("CKPT", errno.errorcode[e.errno])
EOF
"""


def owners(paths: Sequence[Path]) -> dict[str, tuple[int, int, int]]:
    """Owner, group and mode of each path (the link itself where one is a symlink)."""
    return {str(p): (st.st_uid, st.st_gid, st.st_mode & 0o7777) for p in paths for st in [os.lstat(p)]}


def unmount_under(cluster: Cluster, node: str, prefix: Path) -> list[str]:
    """Mounts left under `prefix` in the node's namespace, unmounted (so a failure spoils no other test)."""
    info = Path(f"/proc/{cluster.slurmd_pid(node)}/mountinfo").read_text()
    points = [line.split()[4] for line in info.splitlines() if line.split()[4].startswith(f"{prefix}/")]
    for point in reversed(points):
        cluster.in_node(node, ["umount", "-l", point])
    return points


def test_ckpt_full_traversal_is_refused_and_nothing_chowned(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """'..' in the path: once root chowned every level it walked (here: a root-owned 'etc')."""
    user = sandbox_users["chaosok"]
    base = cluster.checkpoints / f"sec-{uuid.uuid4().hex[:6]}"
    home = base / "home" / user.name
    home.mkdir(parents=True)
    os.chown(home, user.uid, user.gid)
    (base / "etc").mkdir()
    touched = [cluster.checkpoints, base, base / "home", home, base / "etc"]
    path = f"{home}/x/../../../etc"
    ours = owners(touched)
    before = cluster.snapshot("node3")
    try:
        script = CKPT_PROBE.format(py=USER_PY, ckpt=path)
        job = cluster.submit(script, f"ckpt-full:path={path}", "-N1", "-w", "node3", user=user)
        cluster.wait_done(job, ["node3"])
        out = cluster.output(job)
        assert owners(touched) == ours
        assert not (home / "x").exists()
        assert "FREE 0" not in out, out
        assert cluster.snapshot("node3") == before
        assert f"ckpt-full: not applied on node3 for job {job}" in cluster.log_file.read_text()
    finally:
        left = unmount_under(cluster, "node3", base)
        shutil.rmtree(base)
    assert not left


def test_ckpt_full_through_a_symlink_is_refused_and_leaves_no_mount(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """A symlink in the path: once mounted on its target, and never unmounted (the undo compared
    the literal path with findmnt's canonical one)."""
    user = sandbox_users["chaosok"]
    mine = cluster.checkpoints / f"{user.name}-{uuid.uuid4().hex[:6]}"
    assert cluster.run(user.argv("mkdir", "-p", str(mine / "real"))).ok
    assert cluster.run(user.argv("ln", "-s", "real", str(mine / "link"))).ok
    ours = owners([mine, mine / "real", mine / "link"])
    before = cluster.snapshot("node3")
    try:
        script = CKPT_PROBE.format(py=USER_PY, ckpt=mine / "link")
        job = cluster.submit(script, f"ckpt-full:path={mine / 'link'}", "-N1", "-w", "node3", user=user)
        cluster.wait_done(job, ["node3"])
        out = cluster.output(job)
        assert "FREE 0" not in out and "CKPT written" in out, out
        assert cluster.snapshot("node3") == before
        assert owners([mine, mine / "real", mine / "link"]) == ours
    finally:
        left = unmount_under(cluster, "node3", mine)
        shutil.rmtree(mine)
    assert not left


def test_ckpt_full_made_as_the_user_and_undone_by_its_mount_after_the_job_moved_it(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """The directories are the user's own making; the job renames the one above its full volume,
    and the epilog still unmounts it (found by what it is, not by the path it was mounted on)."""
    user = sandbox_users["chaosok"]
    mine = cluster.checkpoints / f"{user.name}-{uuid.uuid4().hex[:6]}"
    assert cluster.run(user.argv("mkdir", str(mine))).ok
    path = mine / "a" / "ckpt"
    script = CKPT_PROBE.format(py=USER_PY, ckpt=path) + f"mv {mine}/a {mine}/b && echo MOVED\n"
    before = cluster.snapshot("node3")
    try:
        job = cluster.submit(script, f"ckpt-full:path={path}", "-N1", "-w", "node3", user=user)
        cluster.wait_done(job, ["node3"])
        out = cluster.output(job)
        assert "FREE 0" in out and "CKPT ENOSPC" in out and "MOVED" in out, out
        assert f"OWNER {user.uid}" in out, out
        assert cluster.snapshot("node3") == before
        assert os.lstat(mine).st_uid == user.uid
    finally:
        left = unmount_under(cluster, "node3", mine)
        shutil.rmtree(mine, ignore_errors=True)
    assert not left


def build_shim() -> Path:
    res = subprocess.run(["make", "-C", str(REPO / "preload")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return REPO / "preload" / "build" / "libslurm_chaos_io.so"


def test_checkpoint_io_errors_and_hang_only_on_the_checkpoint_path(cluster: Cluster) -> None:
    shim = build_shim()
    ckpt = cluster.shared / f"ckpt-io-{uuid.uuid4().hex[:6]}"
    writer = f"""import errno, os, sys
os.makedirs("{ckpt}", exist_ok=True)
with open("{cluster.shared}/probe-{ckpt.name}.h5", "wb") as f:
    f.write(b"x" * 65536)
try:
    with open("{ckpt}/ckpt.pt", "wb", buffering=0) as f:
        f.write(b"x" * 8192)
        f.write(b"x" * 8192)
    print(sys.argv[1], "written", flush=True)
except OSError as e:
    print(sys.argv[1], errno.errorcode[e.errno], flush=True)
"""
    (cluster.shared / f"{ckpt.name}.py").write_text(writer)
    py = f"{sys.executable} {cluster.shared}/{ckpt.name}.py"
    script = f"""
export SLURM_CHAOS_CKPT_DIR={ckpt} LD_PRELOAD={shim}
SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=8192 {py} enospc
SLURM_CHAOS_IO_FAULT=eio {py} eio
SLURM_CHAOS_IO_FAULT=hang SLURM_CHAOS_IO_AFTER_BYTES=8192 timeout 3 {py} hang
echo "HANG_RC=$?"
SLURM_CHAOS_IO_FAULT=hang SLURM_CHAOS_IO_HOLD_S=1 SLURM_CHAOS_IO_AFTER_BYTES=8192 {py} hold
"""
    job = cluster.submit(script, None, "-N1", "-w", "node4")
    cluster.wait_state(job, {"", "COMPLETED"})
    out = cluster.output(job)
    assert "enospc ENOSPC" in out and "eio EIO" in out and "hold written" in out, out
    assert "HANG_RC=124" in out and "hang written" not in out, out
    assert (cluster.shared / f"probe-{ckpt.name}.h5").stat().st_size == 65536
    assert (ckpt / "ckpt.pt").stat().st_size == 16384  # the last run (hold) got through after its hang


def _assert_capped(out: str, rank: int, percent: int) -> None:
    """The rank's CPU time over its wall time stays under its cap ((100 - percent)% of each of its
    CPUs, at most the node's two), whatever else loads the machine: the quota is an upper bound."""
    wall, cpu = map(float, re.findall(rf"RANK={rank} WALL_S=([0-9.]+) CPU_S=([0-9.]+)", out)[0])
    assert cpu / wall < 2 * (100 - percent) / 100 + 0.05, (cpu, wall, out)


@pytest.mark.parametrize("method", ["duty-cycle", "cgroup"])
def test_slow_rank_is_measurably_slower_and_left_running(cluster: Cluster, method: str) -> None:
    before = cluster.snapshot("node1")
    script = f"srun -n2 -N1 {sys.executable} {cluster.shared}/busy.py\n"
    # The cgroup cap is absolute and this machine is shared (on a loaded machine a rank may get a
    # fifth of a CPU or less): a deep cut keeps it binding.
    percent = 60 if method == "duty-cycle" else 95
    # Rank 1's work is timed from when the fault holds it (the first scan comes up to a second after
    # the task starts: a short work of rank 1's would be half done by then).
    if method == "cgroup":
        script = "export WORK=5000000 WAIT_CAPPED_RANK=1\n" + script
    else:
        script = "export WAIT_STOPPED_RANK=1\n" + script
    job = cluster.submit(
        script, f"slow-rank:rank=1,percent={percent},method={method}", "-N1", "-n2", "-w", "node1"
    )
    cluster.wait_done(job, ["node1"])
    out = cluster.output(job)
    walls = {int(r): float(w) for r, w in re.findall(r"RANK=(\d+) WALL_S=([0-9.]+)", out)}
    assert set(walls) == {0, 1}, out
    # Losing 60% of its time makes rank 1 about 2.5x slower; under a 5% cap, 10x or more. (Timed from
    # the start of the task, a 2 s work gave 1.55x on a loaded fresh root.)
    assert walls[1] / walls[0] > 1.6, walls
    if method == "cgroup":
        _assert_capped(out, rank=1, percent=percent)
    journal = cluster.journal("node1", job)
    if method == "duty-cycle":
        assert "signal_process" in journal
    else:  # seen from inside the job: rank 1 ran in our cgroup inside the job's, rank 0 did not
        assert "cgroup_move" in journal
        assert int(re.findall(r"RANK=1 .*THROTTLED=(\d+)", out)[0]) > 0, out  # held back by the quota
        assert re.search(
            rf"RANK=1 .*CGROUP=\d+:cpu:/slurm[^/]*/uid_0/job_{job}/slurm-chaos-slow-rank ", out
        ), out
        assert not re.search(r"RANK=0 .*slurm-chaos", out), out
    assert cluster.snapshot("node1") == before


# Runs as the job's user: the task's cgroups, and the stress-ng processes of this node (their
# cgroup paths lie inside the node's cgroup namespace, another node's start with "/..").
LOAD_PROBE = """
{py} - <<'EOF'
import os, time
job = os.environ["SLURM_JOB_ID"]
def status(pid, key):
    return open(f"/proc/{{pid}}/status").read().split(key + ":")[1].split()[0]
print("JOB_CPUS", status("self", "Cpus_allowed_list"), flush=True)
end = time.time() + 40
seen = {{}}
while time.time() < end and len(seen) < 2:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{{pid}}/cmdline", "rb").read()
            cg = open(f"/proc/{{pid}}/cgroup").read().split()
            if cmd.startswith(b"stress-ng") and not any(":/.." in line for line in cg):
                seen[pid] = (status(pid, "Cpus_allowed_list"), ";".join(cg))
        except (OSError, IndexError):
            continue
    time.sleep(0.3)
for pid, (cpus, cg) in seen.items():
    print("STRESS", pid, "CPUS", cpus, "CGROUPS", cg, flush=True)
EOF
"""

#: The hierarchies in which Slurm 22.05 makes a job's cgroup on v1 (proctrack/cgroup, task/cgroup).
SLURM_HIERARCHIES = ("freezer", "cpuset", "memory")
#: Slurm's cgroup root: /slurm, or /slurm_<node> where it is built for several slurmds per host (Debian).
SLURM_ROOT = "/slurm(?:_node\\d+)?"


def cgroup_paths(line: str) -> dict[str, str]:
    """'9:freezer:/a;4:memory:/b' -> {'freezer': '/a', 'memory': '/b'}."""
    return {h: path for _, h, path in (item.split(":", 2) for item in line.split(";") if item)}


def test_noisy_neighbour_runs_inside_the_job_on_its_cpus_only(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """As an unprivileged user's job: the load runs in the job's extern step cgroups (its cpuset,
    its memory limit, killed with it), on the job's one core, not on every CPU of the node."""
    user = sandbox_users["chaosok"]
    before = cluster.snapshot("node2")
    job = cluster.submit(
        LOAD_PROBE.format(py=USER_PY), "noisy-neighbour:cpus=1", "-N1", "-n1", "-w", "node2", user=user
    )
    cluster.wait_done(job, ["node2"])
    out = cluster.output(job)
    (job_cpus,) = re.findall(r"JOB_CPUS (\S+)", out)
    loads = re.findall(r"STRESS (\d+) CPUS (\S+) CGROUPS (\S+)", out)
    assert loads, out
    assert job_cpus in ("0", "1"), out  # one core of the node's two
    for _, cpus, line in loads:
        assert cpus == job_cpus, out
        paths = cgroup_paths(line)
        for hier in SLURM_HIERARCHIES:
            assert re.fullmatch(rf"{SLURM_ROOT}/uid_{user.uid}/job_{job}/step_extern(/.*)?", paths[hier]), out
    assert re.search(
        rf"freezer:{SLURM_ROOT}/uid_{user.uid}/job_{job}/step_extern", cluster.journal("node2", job)
    )
    assert cluster.snapshot("node2") == before
    assert not any(node_proc.cmdline(int(pid)) for pid, _, _ in loads)  # nothing it started is alive


def test_slow_rank_cgroup_keeps_an_unprivileged_users_tasks_inside_the_job(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """The throttled rank's cgroup in every hierarchy stays under the job's (the cpu hierarchy's
    group is a child of the job's path there), it is measurably slower, and after the job nothing
    it started is alive and no cgroup of ours or of the job's is left."""
    user = sandbox_users["chaosok"]
    before = cluster.snapshot("node1")
    script = f"export WORK=5000000 WAIT_CAPPED_RANK=1\nsrun -n2 -N1 {USER_PY} {cluster.shared}/busy.py\n"
    spec = "slow-rank:rank=1,percent=95,method=cgroup"
    job = cluster.submit(script, spec, "-N1", "-n2", "-w", "node1", user=user)
    cluster.wait_done(job, ["node1"])
    out = cluster.output(job)
    found = re.findall(r"RANK=(\d+) WALL_S=([0-9.]+) .*CGROUPS=(\S+)", out)
    ranks = {int(r): (float(w), cgroup_paths(c)) for r, w, c in found}
    assert set(ranks) == {0, 1}, out
    assert ranks[1][0] / ranks[0][0] > 1.6, ranks
    _assert_capped(out, rank=1, percent=95)
    assert int(re.findall(r"RANK=1 .*THROTTLED=(\d+)", out)[0]) > 0, out  # held back by the quota
    job_cg = f"{SLURM_ROOT}/uid_{user.uid}/job_{job}"
    for rank, (_, paths) in ranks.items():
        for hier in SLURM_HIERARCHIES:
            assert re.fullmatch(rf"{job_cg}/step_0(/.*)?", paths[hier]), (rank, hier, paths)
    assert re.fullmatch(rf"{job_cg}/slurm-chaos-slow-rank", ranks[1][1]["cpu"]), ranks
    assert ranks[0][1]["cpu"] == "/", ranks
    journal = cluster.journal("node1", job)
    assert "cgroup_move" in journal and "cgroup_prune" in journal
    assert cluster.snapshot("node1") == before
    assert not any(f"job_{job}" in cg for cg in cluster.cgroups("node1"))


def test_gpu_faults_on_a_node_where_the_job_holds_no_gpu_are_refused(cluster: Cluster) -> None:
    """The sandbox nodes have no GPUs, so no job holds one (slurmd sets no SLURM_JOB_GPUS): an XID
    line for "GPU 0" would blame a GPU that is not the job's, and nothing reaches the kernel log."""
    before = cluster.snapshot("node3")
    job = cluster.submit("sleep 1\n", "gpu-xid:xid=79+gpu-ecc", "-N1", "-w", "node3")
    cluster.wait_done(job, ["node3"])
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True)
    if dmesg.returncode == 0:
        assert not re.search(rf"NVRM: Xid .*node node3 job {job}\)", dmesg.stdout)
    log = cluster.log_file.read_text()
    for fault in ("gpu-xid", "gpu-ecc"):
        assert f"{fault}: gpu=0 is not one of job {job}'s GPUs on node3 (SLURM_JOB_GPUS: none)" in log
    assert cluster.snapshot("node3") == before


def test_stale_leftovers_are_reverted_in_the_epilog_of_a_job_without_faults(cluster: Cluster) -> None:
    """A journal whose deadline passed and an expired grant (a node that lost an epilog) are undone
    by the next job's epilog on the node, whatever that job is."""
    lost = 900_000_000 + uuid.uuid4().int % 50_000_000  # job ids no sandbox reaches
    stale = Journal(cluster.journal_root, "node2", str(lost))
    marker = cluster.shared / f"undone-{uuid.uuid4().hex[:6]}"
    stale.record("netem", "a change left behind", Undo(argv=("touch", str(marker))), time.time() - 1)
    grant = cluster.journal_root / "node2" / f"{lost + 1}.grant"
    grant.write_text(f"job={lost + 1}\nuid=0\nspec=netem:rate=1M\nuntil=1\n")
    grant.chmod(0o600)
    job = cluster.submit("true\n", None, "-N1", "-w", "node2")
    cluster.wait_state(job, {"", "COMPLETED"})
    wait_until(lambda: not stale.read().pending() and not grant.exists(), timeout=60)
    assert marker.exists()
    assert "cleanup (deadline passed)" in cluster.journal("node2", str(lost))


SLEEP_SPEC = "netem:rate=1M+slow-rank:rank=0,percent=50+noisy-neighbour:cpus=1+ckpt-full:path={ckpt}"


def test_scancel_mid_fault_leaves_nothing_behind(cluster: Cluster) -> None:
    nodes = ["node1", "node2"]
    ckpt = cluster.checkpoints / f"ckpt-cancel-{uuid.uuid4().hex[:6]}"
    before = cluster.snapshots(nodes)
    spec = SLEEP_SPEC.format(ckpt=ckpt)
    job = cluster.submit("srun -N2 -n2 sleep 300\n", spec, "-N2", "-w", "node[1-2]", "--exclusive")
    cluster.wait_state(job, {"RUNNING"})
    cluster.wait_agent(job, "node1")

    def faults_on() -> bool:  # the qdisc, the noisy neighbour, and the duty cycle caught rank 0
        return (
            "duty cycle" in cluster.journal("node1", job)
            and qdisc_handle(job) in cluster.qdisc("node1")
            and bool(cluster.marked("node1"))
        )

    wait_until(faults_on, timeout=30, interval=0.2)
    assert cluster.run(["scancel", job]).ok
    cluster.wait_done(job, nodes)
    assert cluster.snapshots(nodes) == before


def _disable_epilog(cluster: Cluster) -> Path:
    hook = Path(cluster.env["SLURM_CONF"]).parent / "epilog.d" / HOOK_NAME
    hook.chmod(0o644)  # the dispatcher only runs executables
    return hook


def test_missed_epilog_is_reverted_by_the_watchdog(cluster: Cluster) -> None:
    before = cluster.snapshot("node3")
    hook = _disable_epilog(cluster)
    try:
        spec = "netem:rate=1M+noisy-neighbour:cpus=1"
        job = cluster.submit("sleep 2\n", spec, "-N1", "-w", "node3", "--exclusive")
        cluster.wait_state(job, {"", "COMPLETED"})
        assert Journal(cluster.journal_root, "node3", job).read().pending()  # no epilog ran
        cluster.wait_reverted(job, ["node3"], timeout=60)  # the agent sees the job gone within ~15 s
    finally:
        hook.chmod(0o755)
    assert "agent watchdog (job ended)" in cluster.journal("node3", job)
    assert cluster.snapshot("node3") == before


def test_dead_agent_and_missed_epilog_are_reverted_by_cleanup(cluster: Cluster) -> None:
    before = cluster.snapshot("node4")
    hook = _disable_epilog(cluster)
    # ckpt-full too: its undo helper runs in node4's mount namespace, entered from the host.
    ckpt = cluster.checkpoints / f"ckpt-cleanup-{uuid.uuid4().hex[:6]}"
    try:
        spec = f"netem:rate=1M+noisy-neighbour:cpus=1+ckpt-full:path={ckpt}"
        job = cluster.submit("sleep 4\n", spec, "-N1", "-w", "node4", "--exclusive")
        cluster.wait_agent(job, "node4")
        cluster.wait_log(f"prolog: job {job} on node4")  # the prolog is done: the agent detached
        agent_entry = next(
            e for e in Journal(cluster.journal_root, "node4", job).read().entries if e.fault == "agent"
        )
        os.kill(int(str(agent_entry.undo.data["pid"])), 9)
        cluster.wait_state(job, {"", "COMPLETED"})
        assert qdisc_handle(job) in str(cluster.snapshot("node4")["qdisc"])  # left behind
        # From the sandbox host: cleanup enters node4's namespaces to revert.
        reverted = cleanup(cluster.journal_root, ["node4"], SubprocessRunner(base_env=cluster.env))
    finally:
        hook.chmod(0o755)
    assert any("job no longer running" in o.what and "netem" in o.what for o in reverted), reverted
    assert any(f"umount {ckpt} (slurm-chaos-ckpt-{job}-overlay-" in o.what for o in reverted), reverted
    assert not ckpt.exists()
    assert not any_failed(reverted), reverted
    assert cluster.snapshot("node4") == before
    assert cleanup(cluster.journal_root, ["node4"], SubprocessRunner(base_env=cluster.env)) == []


def test_journal_is_json_lines_written_before_the_change(cluster: Cluster) -> None:
    job = cluster.submit("sleep 1\n", "netem:rate=2M", "-N1", "-w", "node1", "--exclusive")
    cluster.wait_done(job, ["node1"])
    records = [json.loads(line) for line in cluster.journal("node1", job).splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "header" and "closed" in kinds
    change = next(r for r in records if r["kind"] == "change" and r["fault"] == "netem")
    assert change["undo"]["action"] == "tc_restore" and change["deadline"] > change["time"]


def test_spank_plugin_and_the_prolog_act_on_one_granted_spec(cluster: Cluster) -> None:
    """End to end: --chaos on sbatch, job_submit.lua's AdminComment, the prolog's grant, the epilog."""
    from slurm_chaos.faults.plugin_install import PluginArgs, build_plugin, plugstack_line, update_plugstack

    etc = Path(cluster.env["SLURM_CONF"]).parent
    plugstack = etc / "plugstack.conf"
    saved = plugstack.read_text() if plugstack.exists() else None
    try:
        so = build_plugin(cluster.shared / "plugin-prefix", SubprocessRunner())
    except Exception as exc:  # the plugin is another module's; its build is tested there
        pytest.skip(f"SPANK plugin not buildable here: {exc}")
    args = PluginArgs(policy=str(etc / POLICY_NAME), journal_dir=str(cluster.journal_root))
    before = cluster.snapshot("node2")
    try:
        update_plugstack(plugstack, plugstack_line(so, args))
        res = cluster.run(
            [
                "sbatch",
                "--parsable",
                "--exclusive",
                "-N1",
                "-w",
                "node2",
                "-o",
                str(cluster.shared / "plugin-%j.out"),
                "--chaos=netem:rate=512K+nccl-degrade:ib=off",
                "--wrap",
                "tc qdisc show dev eth0; echo NCCL_IB_DISABLE=$NCCL_IB_DISABLE",
            ]
        )
        assert res.ok, res.stderr
        job = res.stdout.strip()
        cluster.wait_done(job, ["node2"])
    finally:
        if saved is None:
            plugstack.unlink(missing_ok=True)
        else:
            plugstack.write_text(saved)
    out = (cluster.shared / f"plugin-{job}.out").read_text()
    assert f"tbf {qdisc_handle(job)}" in out or f"netem {qdisc_handle(job)}" in out, out  # the prolog's
    assert "NCCL_IB_DISABLE=1" in out, out  # the plugin's, in the same job
    faults = {json.loads(line).get("fault") for line in cluster.journal("node2", job).splitlines()}
    assert {"netem", "agent", "nccl-degrade"} <= faults  # one journal holds both sides' changes
    assert cluster.snapshot("node2") == before


# Runs as each task of a switchback job: fixed chunks of CPU work, each timed, for `SECONDS` seconds.
CHUNKS = r"""
import os, time
end = time.time() + float(os.environ["SECONDS_"])
rank = os.environ["SLURM_PROCID"]
while time.time() < end:
    t = time.time()
    x = 0
    for i in range(300000):
        x += i * i
    print(f"CHUNK rank={rank} t={t:.4f} wall={time.time() - t:.4f}", flush=True)
"""

# Runs in the batch step as the job's user: the rank's side of the control channel. A SPEC sent to
# the request socket first (dropped), then off -> on -> off, each acknowledged.
TOGGLE = r"""
import os, sys, time
from pathlib import Path
from slurm_chaos.faults.control import ChannelClient, State
c = ChannelClient.find(Path(sys.argv[1]), os.environ["SLURMD_NODENAME"], os.environ["SLURM_JOB_ID"])
assert c is not None, "no control channel"
import socket
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(b"slow-rank:rank=0,percent=99,control=static\n", str(c.path / "request"))
time.sleep(2.0)
for state, hold in ((State.ON, 3.0), (State.OFF, 3.0)):
    t = time.time()
    e = c.request(state)
    ack = c.wait(e, 2.0)
    print(f"ACK state={state.value} epoch={e} asked={t:.4f} at={ack.time:.4f} error={ack.error!r}",
          flush=True)
    time.sleep(hold)
"""


def test_a_switchback_slow_rank_acts_only_between_the_users_on_and_off(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> None:
    """As an unprivileged user's job: the fault starts off, the job's on/off requests are
    acknowledged within milliseconds, rank 1 is slow only while on, rank 0 never, a SPEC written
    into the channel changes nothing, and after the job the channel and the fault are gone."""
    user = sandbox_users["chaosok"]
    before = cluster.snapshot("node1")
    (cluster.shared / "chunks.py").write_text(CHUNKS)
    (cluster.shared / "toggle.py").write_text(TOGGLE)
    # The package where the job's user can import it (a clone under /root is out of its reach).
    lib = cluster.shared / "userlib"
    shutil.rmtree(lib, ignore_errors=True)
    shutil.copytree(REPO / "slurm_chaos", lib / "slurm_chaos", ignore=shutil.ignore_patterns("__pycache__"))
    for d in [lib, *(p for p in lib.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    script = (
        f"SECONDS_=9 srun -n2 -N1 {USER_PY} {cluster.shared}/chunks.py &\n"
        f"PYTHONPATH={lib} {USER_PY} {cluster.shared}/toggle.py {cluster.journal_root}\n"
        "wait\n"
    )
    spec = "slow-rank:rank=1,percent=60,control=switchback"
    job = cluster.submit(script, spec, "-N1", "-n2", "-w", "node1", user=user)
    cluster.wait_done(job, ["node1"])
    out = cluster.output(job)
    acks = {
        s: (float(asked), float(at), err)
        for s, asked, at, err in re.findall(
            r"ACK state=(\w+) epoch=\d+ asked=([0-9.]+) at=([0-9.]+) error='(.*)'", out
        )
    }
    assert set(acks) == {"on", "off"} and acks["on"][2] == acks["off"][2] == "", out
    for asked, at, _ in acks.values():
        assert 0 <= at - asked < 0.25, acks  # the agent polls every 5 ms: well within a probe step
    on_from, on_to = acks["on"][1], acks["off"][1]
    chunks = [
        (int(r), float(t), float(w))
        for r, t, w in re.findall(r"CHUNK rank=(\d) t=([0-9.]+) wall=([0-9.]+)", out)
    ]

    def median(rank: int, on: bool) -> float:
        walls = sorted(
            w
            for r, t, w in chunks
            if r == rank and (on_from + 0.2 < t < on_to - 0.2 if on else t > on_to + 0.2 or t + w < on_from)
        )
        assert len(walls) >= 3, (rank, on, out)
        return walls[len(walls) // 2]

    assert median(1, True) / median(1, False) > 1.6, out  # 60% of its time lost while on
    assert median(0, True) / median(0, False) < 1.3, out  # never the other rank (nor by the SPEC written)
    assert "control_remove" in cluster.journal("node1", job)
    assert not (cluster.journal_root / "node1" / f"{job}.control").exists()
    assert cluster.snapshot("node1") == before
