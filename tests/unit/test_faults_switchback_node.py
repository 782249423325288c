"""The node side of a switchback job: the control channel, the agent's switch, faults turned on and off.

The channel is written by the job's user and read by root, so the tests that matter for safety run
the user's side as an unprivileged uid (setpriv), against the real files the agent makes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from waiting import wait_until

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import control, node_proc
from slurm_chaos.faults.agent import Switched, apply_all
from slurm_chaos.faults.control import Ack, ChannelClient, ChannelError, ChannelOwner, State
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import MARKER_ENV, JobContext, Switchable, popen_spawner
from slurm_chaos.faults.node_cpu import HOLD_STOPPED_S, DutyCycle, NoisyLoad, _kill_marked, marked
from slurm_chaos.faults.node_net import QdiscToggle
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the agent's end of the channel is root's: run as root")
NOBODY = 65534


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def journal_root() -> Iterator[Path]:
    """A journal root an unprivileged user can reach (pytest's tmp_path is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="chaos-control-", dir="/tmp"))
    base.chmod(0o755)
    (base / "node1").mkdir(mode=0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def ctx_for(root: Path, uid: int | None = NOBODY, gid: int | None = NOBODY) -> JobContext:
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    return JobContext(
        "77", "node1", ("node1",), uid, gid, time.time() + 60, Journal(root, "node1", "77"), runner
    )


@pytest.fixture(scope="module")
def user_pythonpath() -> Iterator[Path]:
    """This checkout's package where an unprivileged user can import it (a clone under /root, or a
    virtual environment there, is out of its reach)."""
    base = Path(tempfile.mkdtemp(prefix="chaos-userlib-", dir="/tmp"))
    base.chmod(0o755)
    src = Path(__file__).resolve().parents[2] / "slurm_chaos"
    shutil.copytree(src, base / "slurm_chaos", ignore=shutil.ignore_patterns("__pycache__"))
    for d in [base, *(p for p in base.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def as_nobody(code: str, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """Run Python code as an unprivileged user, with this checkout's package importable (the system's
    python3: the package's channel code needs nothing but the standard library)."""
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    src = str(pythonpath)
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", code]
    return subprocess.run(
        argv, capture_output=True, text=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}
    )


# --------------------------------------------------------------------------------- the records


def test_request_records_round_trip_and_anything_else_is_no_request() -> None:
    rec = control.format_request(7, State.ON)
    assert len(rec) == control.REQUEST_SIZE
    assert control.parse_request(rec) == control.Request(7, State.ON)
    assert control.parse_request(control.format_request(8, State.OFF)) == control.Request(8, State.OFF)
    torn = control.format_request(8, State.OFF)[:12] + rec[12:]  # new epoch, old state and CRC
    assert control.parse_request(torn) is None
    assert control.parse_request(b"") is None
    assert control.parse_request(rec + b"x") is None
    assert control.parse_request(rec.replace(b" on", b"bad")) is None
    assert control.parse_request(b"slow-rank:rank=0,percent=99\n") is None  # never a SPEC
    with pytest.raises(ValueError):
        control.format_request(-1, State.ON)


def test_channel_paths_refuse_names_that_leave_the_node_directory(tmp_path: Path) -> None:
    for node, job in (("..", "1"), ("a/b", "1"), ("node1", "../1"), ("node1", "1x"), ("", "1")):
        with pytest.raises(ValueError):
            control.channel_dir(tmp_path, node, job)


# --------------------------------------------------------------------------------- the channel


@needs_root
def test_the_agent_makes_the_channel_the_user_writes_only_the_request(
    journal_root: Path, user_pythonpath: Path
) -> None:
    owner = ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY)
    d = control.channel_dir(journal_root, "node1", "77")
    st = d.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    req = (d / control.REQUEST).lstat()
    assert stat.S_ISSOCK(req.st_mode)
    assert (req.st_uid, req.st_gid, stat.S_IMODE(req.st_mode)) == (0, NOBODY, control.REQUEST_MODE)
    assert all(p.lstat().st_uid == 0 for p in d.iterdir())  # nothing in it is the user's
    assert control.parse_ack((d / control.ACK).read_text()) is not None
    assert owner.read() is None  # nothing asked yet

    # The user's side, as the user: a request, then attempts to take the channel over.
    res = as_nobody(
        "import os, pathlib\n"
        "from slurm_chaos.faults.control import ChannelClient, State\n"
        f"c = ChannelClient.find(pathlib.Path({str(journal_root)!r}), 'node1', '77')\n"
        "print(c.request(State.ON))\n"
        "for attempt in (lambda: os.unlink(c.path / 'request'),\n"
        "                lambda: os.rename(c.path / 'request', c.path / 'x'),\n"
        "                lambda: open(c.path / 'ack', 'w'), lambda: open(c.path / 'new', 'w'),\n"
        "                lambda: os.symlink('/etc/shadow', c.path / 'link'),\n"
        "                lambda: open(c.path / 'request', 'r+b'),\n"
        "                lambda: os.truncate(c.path / 'request', 1 << 30)):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('allowed')\n"
        "    except OSError:\n"
        "        print('refused')\n",
        user_pythonpath,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split()
    assert lines == ["1"] + ["refused"] * 7
    assert owner.read() == control.Request(1, State.ON)
    owner.acknowledge(Ack(1, State.ON, 123.0))
    assert owner.read() is None  # acted on: the same epoch is not read twice
    owner.close()


@needs_root
def test_the_request_cannot_be_hard_linked_or_grown_on_the_journals_filesystem(
    journal_root: Path, user_pythonpath: Path
) -> None:
    """Finding 1 of issue #27: the request was the user's regular file on root's filesystem; a hard
    link kept it past the job and fallocate filled the filesystem the journal writes to."""
    ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY).close()
    d = control.channel_dir(journal_root, "node1", "77")
    keep = Path(tempfile.mkdtemp(prefix="chaos-home-", dir=journal_root.parent))
    os.chown(keep, NOBODY, NOBODY)
    try:
        res = as_nobody(
            "import os, sys\n"
            f"req, keep = {str(d / control.REQUEST)!r}, {str(keep / 'keep')!r}\n"
            "try:\n"
            "    os.link(req, keep)\n"
            "    print('linked')\n"
            "except OSError as exc:\n"
            "    print('link refused', exc.errno)\n"
            "for target in (req, keep):\n"
            "    try:\n"
            "        fd = os.open(target, os.O_WRONLY)\n"
            "        os.posix_fallocate(fd, 0, 1 << 30)\n"
            "        print('grown')\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n",
            user_pythonpath,
        )
        assert res.returncode == 0, res.stderr
        assert "grown" not in res.stdout, res.stdout
        if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1":
            assert "link refused" in res.stdout, res.stdout
        # Whatever the user did, nothing of theirs is left where the journal lives.
        assert [p for p in d.iterdir() if p.lstat().st_uid != 0] == []
        assert (d / control.REQUEST).lstat().st_blocks == 0
    finally:
        shutil.rmtree(keep, ignore_errors=True)


@needs_root
def test_requests_of_another_uid_or_malformed_ones_are_dropped(
    journal_root: Path, user_pythonpath: Path
) -> None:
    """The socket's group may send (the job's gid is often everyone's); the agent keeps the job's uid's."""
    owner = ChannelOwner.create(journal_root, "node1", "77", NOBODY - 1, NOBODY)
    res = as_nobody(
        "import pathlib\n"
        "from slurm_chaos.faults.control import ChannelClient, State\n"
        f"c = ChannelClient.find(pathlib.Path({str(journal_root)!r}), 'node1', '77')\n"
        "print(c.request(State.ON))\n",
        user_pythonpath,
    )
    assert res.returncode == 0 and res.stdout.split() == ["1"], res.stderr
    assert owner.read() is None and owner.dropped == 1
    client = ChannelClient.find(journal_root, "node1", "77")
    assert client is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for junk in (b"slow-rank:rank=0,percent=99\n", control.format_request(5, State.ON) + b"x" * 100):
            sock.sendto(junk, str(client.path / control.REQUEST))
    assert owner.read() is None and owner.dropped == 3
    owner.close()


@needs_root
def test_a_leftover_channel_is_made_afresh_and_a_foreign_directory_refused(journal_root: Path) -> None:
    d = control.channel_dir(journal_root, "node1", "77")
    d.mkdir(mode=0o755)
    passwd = Path("/etc/passwd").stat()
    (d / control.REQUEST).symlink_to("/etc/passwd")
    (d / control.ACK).write_text('{"epoch": 9, "state": "on", "time": 1}')
    ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY).close()
    req = (d / control.REQUEST).lstat()
    assert stat.S_ISSOCK(req.st_mode) and req.st_uid == 0  # the link is gone, not followed
    assert Path("/etc/passwd").stat() == passwd
    assert control.parse_ack((d / control.ACK).read_text()) == Ack(
        0, State.OFF, control.parse_ack((d / control.ACK).read_text()).time
    )  # type: ignore[union-attr]
    d.chmod(0o777)  # a directory others may write to is not ours any more: nothing in it is touched
    with pytest.raises(ChannelError):
        ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY)
    assert (d / control.REQUEST).exists()
    d.chmod(0o755)
    control.remove_channel(journal_root, "node1", "77")
    d.symlink_to(journal_root)
    with pytest.raises(ChannelError):
        ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY)


@needs_root
def test_an_old_or_torn_request_is_not_acted_on_and_queued_ones_collapse(journal_root: Path) -> None:
    owner = ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY)
    req = str(control.channel_dir(journal_root, "node1", "77") / control.REQUEST)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(control.format_request(3, State.ON)[:20] + b"zzzz", req)
        assert owner.read() is None
        sock.sendto(control.format_request(3, State.ON), req)
        assert owner.read() == control.Request(3, State.ON)
        owner.acknowledge(Ack(3, State.ON, time.time()))
        sock.sendto(control.format_request(2, State.OFF), req)  # an epoch already passed
        assert owner.read() is None
        for epoch, state in ((4, State.OFF), (6, State.OFF), (5, State.ON)):
            sock.sendto(control.format_request(epoch, state), req)
        assert owner.read() == control.Request(6, State.OFF)  # the latest of those queued
    owner.close()


@needs_root
def test_a_channel_under_a_long_path_is_reached_through_its_directory(user_pythonpath: Path) -> None:
    """A socket's address holds 107 bytes of path; a journal root may be deeper than that."""
    base = Path(tempfile.mkdtemp(prefix="chaos-control-", dir="/tmp"))
    try:
        root = base / ("x" * 60) / ("y" * 60)
        (root / "node1").mkdir(mode=0o755, parents=True)
        for p in (base, base / ("x" * 60), root, root / "node1"):
            p.chmod(0o755)
        owner = ChannelOwner.create(root, "node1", "77", 0, 0)
        assert len(str(owner.path / control.REQUEST)) > 107
        client = ChannelClient.find(root, "node1", "77")
        assert client is not None and client.is_open()
        epoch = client.request(State.ON)
        assert owner.read() == control.Request(epoch, State.ON)
        owner.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------- the switch


class Recorder:
    """A switchable fault that records what it was told (and fails when told to)."""

    name = "fake"

    def __init__(self, fail_on: bool = False) -> None:
        self.calls: list[bool] = []
        self.fail_on = fail_on

    def switch(self, on: bool, now: float) -> None:
        if on and self.fail_on:
            raise ChaosError("cannot switch on")
        self.calls.append(on)

    def tick(self, now: float) -> float:
        return now + 10

    def stop(self) -> None:
        self.calls.append(False)


@needs_root
def test_switched_follows_requests_and_acknowledges_each(journal_root: Path) -> None:
    owner = ChannelOwner.create(journal_root, "node1", "77", 0, 0)
    client = ChannelClient.find(journal_root, "node1", "77")
    assert client is not None
    fake = Recorder()
    assert isinstance(fake, Switchable)
    sw = Switched("fake", owner, [fake])
    epoch = client.request(State.ON)
    t0 = time.time()
    sw.tick(t0)
    ack = client.wait(epoch, 1.0)
    assert ack is not None and ack.state is State.ON and not ack.error and ack.time >= t0
    assert fake.calls == [True] and sw.on
    sw.tick(t0 + 0.001)  # before the next poll: not read again
    epoch = client.request(State.OFF)
    sw.tick(t0 + 1)
    assert client.wait(epoch, 1.0) == Ack(epoch, State.OFF, client.ack().time)  # type: ignore[union-attr]
    assert fake.calls == [True, False] and not sw.on
    sw.stop()


@needs_root
def test_a_failed_switch_is_acknowledged_as_an_error_and_leaves_the_state(journal_root: Path) -> None:
    owner = ChannelOwner.create(journal_root, "node1", "77", 0, 0)
    client = ChannelClient.find(journal_root, "node1", "77")
    assert client is not None
    good, bad = Recorder(), Recorder(fail_on=True)
    sw = Switched("fake", owner, [good, bad])
    epoch = client.request(State.ON)
    sw.tick(time.time())
    ack = client.wait(epoch, 1.0)
    assert ack is not None and ack.state is State.OFF and "cannot switch on" in ack.error
    assert good.calls == [True, False] and not sw.on  # switched back


@needs_root
def test_a_switchback_duty_cycle_starts_off_and_stops_its_rank_only_while_on(journal_root: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        target = node_proc.proc_id(child.pid)
        assert target is not None
        ctx = ctx_for(journal_root, uid=0, gid=0)
        (req,) = parse_spec("slow-rank:rank=0,percent=50,control=switchback")
        controllers, applied, failed = apply_all([req], ctx, time.time())
        assert failed == [] and applied == ["slow-rank (switchback, off)"]
        (sw,) = controllers
        assert isinstance(sw, Switched)
        (duty,) = sw.children
        assert isinstance(duty, DutyCycle) and not duty.active
        duty.find = lambda job, rank: [target]

        def drive(seconds: float) -> float:
            """Tick for a while; the share of samples with the process stopped."""
            stopped = samples = 0
            end = time.time() + seconds
            while time.time() < end:
                sw.tick(time.time())
                samples += 1
                stopped += proc_state(child.pid) == "T"
                time.sleep(0.002)
            return stopped / samples

        assert drive(0.3) == 0.0  # off: found and journalled, never stopped
        assert any(e.undo.action == "signal_process" for e in ctx.journal.read().entries)
        client = ChannelClient.find(journal_root, "node1", "77")
        assert client is not None
        epoch = client.request(State.ON)
        assert 0.2 < drive(0.6) < 0.8
        assert client.wait(epoch, 0) is not None
        epoch = client.request(State.OFF)
        drive(0.05)
        assert client.wait(epoch, 0) is not None
        assert drive(0.3) == 0.0
        # The journal removes the channel with everything else.
        sw.stop()
        revert(ctx.journal, UndoContext(ctx.runner), by="test")
        assert not control.channel_dir(journal_root, "node1", "77").exists()
    finally:
        child.kill()
        child.wait()


def test_without_the_jobs_uid_a_switchback_fault_is_not_applied(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, uid=None, gid=None)
    (req,) = parse_spec("slow-node:node=0,percent=30,control=switchback")
    controllers, applied, failed = apply_all([req], ctx, time.time())
    assert (controllers, applied, failed) == ([], [], ["slow-node"])
    assert ctx.journal.read().entries == ()


def test_every_fault_with_a_control_key_has_an_applier_that_can_switch() -> None:
    from slurm_chaos.faults.catalogue import load_catalogue

    reversible = sorted(f.name for f in load_catalogue().faults if f.key("control") is not None)
    assert reversible == ["netem", "noisy-neighbour", "slow-node", "slow-rank"]
    for cls in (DutyCycle, NoisyLoad, QdiscToggle):
        assert callable(getattr(cls, "switch", None)), cls


@needs_root
def test_a_switched_off_noisy_neighbour_is_stopped_and_still_killed_by_the_undo(journal_root: Path) -> None:
    marker = ctx_for(journal_root).marker("noisy-neighbour")

    def spawn(argv: Sequence[str], env: Mapping[str, str], log_file: Path | None) -> int:
        return popen_spawner(["sh", "-c", "sleep 60 & sleep 60"], {MARKER_ENV: marker}, None)

    ctx = dataclasses.replace(ctx_for(journal_root, uid=0, gid=0), spawner=spawn)

    class Fs:  # the extern step's cgroup, as far as the spawner (a fake here) is concerned
        def dir(self, controllers: str, path: str) -> Path:
            return journal_root

    load = NoisyLoad("noisy-neighbour", ctx, lambda s: ["sleep", "60"], fs=Fs(), active=False)  # type: ignore[arg-type]
    load.extern = lambda job, fs: {"": "/"}
    clock = [time.time()]

    def held() -> bool:
        """One more of the agent's ticks, each a hold later: a child forked (or caught mid-exec,
        when its environment cannot be read) after one SIGSTOP is stopped by a later one."""
        clock[0] += HOLD_STOPPED_S
        load.tick(clock[0])
        return all(still(p.pid) for p in marked(marker))

    def still(pid: int) -> bool:
        """Stopped, or a shell in vfork() waiting for a child stopped before its exec (state D,
        where no signal reaches it): neither runs until the load is switched on."""
        state = proc_state(pid)
        return state == "T" or (state == "D" and any(ppid(c.pid) == pid for c in marked(marker)))

    try:
        load.tick(clock[0])  # started and stopped at once: the shell may not have forked yet
        wait_until(held)
        load.switch(True, time.time())
        wait_until(lambda: len(marked(marker)) >= 2)  # running now, it forks
        wait_until(lambda: all(proc_state(p.pid) not in "TD" for p in marked(marker)))
        load.switch(False, time.time())
        wait_until(held)
    finally:
        result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert "stopped" in result.undone[0]
    assert marked(marker) == []


def test_workers_that_write_over_their_environment_are_the_loads_all_the_same(journal_root: Path) -> None:
    """stress-ng's workers rename themselves over the memory /proc/PID/environ shows: read there,
    they have no marker, and a switched-off noisy neighbour kept its whole load running (found on
    the sandbox: in-job effect +1% while the workers ran through every off block). Here the
    children start with an empty environment (env -i): marked by descent, stopped, killed."""
    marker = ctx_for(journal_root).marker("noisy-neighbour")
    shell = popen_spawner(
        ["sh", "-c", "env -i sleep 60 & env -i sleep 60 & wait"], {MARKER_ENV: marker}, None
    )
    try:
        wait_until(
            lambda: sorted(node_proc.cmdline(p.pid)[0] for p in marked(marker)) == ["sh", "sleep", "sleep"]
        )
        workers = [p for p in marked(marker) if p.pid != shell]
        assert all(node_proc.environ(p.pid).get(MARKER_ENV) is None for p in workers)
        for p in workers:
            node_proc.send(p, signal.SIGSTOP)
        wait_until(lambda: all(proc_state(p.pid) == "T" for p in workers))
    finally:
        result = _kill_marked({"marker": marker}, UndoContext(FakeRunner({})))
    assert result.startswith("stopped 3 processes"), result
    assert marked(marker) == [] and not any(node_proc.is_alive(p) for p in workers)


@needs_root
def test_a_switchback_netem_adds_its_qdisc_only_while_on(journal_root: Path) -> None:
    calls: list[tuple[str, ...]] = []

    def tc(argv: tuple[str, ...]) -> Completed:
        calls.append(argv)
        out = "qdisc noqueue 0: root refcnt 2\n" if argv[:3] == ("tc", "qdisc", "show") else ""
        return Completed(argv, 0, out, "")

    ctx = dataclasses.replace(
        ctx_for(journal_root), runner=FakeRunner(tc), job_interface="eth1", exclusive=True
    )
    (req,) = parse_spec("netem:delay=5ms,control=switchback")
    (sw,) = apply_all([req], ctx, time.time())[0]
    assert isinstance(sw, Switched)
    (toggle,) = sw.children
    assert isinstance(toggle, QdiscToggle)
    adds = [c for c in calls if c[:3] == ("tc", "qdisc", "add")]
    dels = [c for c in calls if c[:3] == ("tc", "qdisc", "del")]
    assert len(adds) == 1 and dels == [("tc", "qdisc", "del", "dev", "eth1", "root", "handle", "404d:")]
    calls.clear()
    toggle.switch(True, 0)
    toggle.switch(True, 0)  # already on: no second add
    toggle.switch(False, 0)
    assert [c[2] for c in calls] == ["add", "del"]
    assert "delay" in calls[0] and "eth1" in calls[0]
    sw.stop()


@needs_root
def test_a_journal_root_the_user_cannot_traverse_is_refused_at_apply(
    journal_root: Path, user_pythonpath: Path
) -> None:
    journal_root.chmod(0o700)
    with pytest.raises(ChannelError, match="cannot reach"):
        ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY)
    journal_root.chmod(0o755)
    ChannelOwner.create(journal_root, "node1", "77", NOBODY, NOBODY).close()
    res = as_nobody(
        "import pathlib\n"
        "from slurm_chaos.faults.control import ChannelClient\n"
        f"print(ChannelClient.find(pathlib.Path({str(journal_root)!r}), 'node1', '78'))\n",
        user_pythonpath,
    )
    assert res.stdout.strip() == "None", res.stderr  # no channel for a job that has none
