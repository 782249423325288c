"""The node-local control channel of a switchback job: the ranks ask for the fault on or off.

A switchback schedule (:mod:`slurm_chaos.schedule`) toggles a reversible fault inside one
job at step boundaries. The fault itself was authorised and applied as usual (SPANK plugin ->
prolog -> agent, journalled, ``control=switchback`` in its SPEC); the channel only says whether it
acts now. It can say nothing else: the root agent never takes a SPEC, a path or a rank from it.

Layout, per node and job, beside the job's journal::

    <journal root>/<node>/<job>.control/      root:root 0755, made by the agent at apply
        request                               root:<job's gid> 0620, a Unix datagram socket the
                                              agent binds; one rank per node sends to it
        ack                                   root 0644, replaced atomically by the agent

Nothing in the directory is the job's user's: ``request`` is a socket, not a file, so what the
user sends to it sits in the socket's bounded queue in kernel memory, never on the journal's
filesystem, and the user can neither own, grow, truncate nor hard-link it (the kernel's
``protected_hardlinks`` refuses links to a non-regular file one does not own; a socket holds no
data anyway). Root's journal writes on that filesystem cannot be made to fail by anything the job
sends. The agent takes a datagram only from the job's uid (or root), as the kernel vouches for
it (``SCM_CREDENTIALS``): a user in the job's group who may send too is ignored.

A request is one fixed-width datagram, :func:`format_request`: ``EPOCH STATE CRC\\n`` with a
zero-padded decimal epoch, ``on``/``off`` right-aligned to three characters and the CRC-32 of the
first two fields in hex; anything else (garbage, a SPEC, a truncated datagram) is dropped. The
epoch increases by one per request; the agent acts on the latest epoch above the last one it acted
on, so requests queued while it was busy collapse into the last.

``ack`` is one JSON object ``{"epoch": E, "state": "on"|"off", "time": T, "error": ""}``: the
agent's acknowledgement that the fault is in STATE since Unix time T (epoch 0 ``off`` when the
channel was opened, before the job's tasks start). A non-empty ``error`` says the change failed
(the fault stays as it was); the probe records it and drops the block.

Root side (the agent, :class:`ChannelOwner`): the directory is made under the journal's own
root-owned node directory and checked (owner root, not a link, no group/other write) before every
use; the socket is bound once and read without blocking, at most :data:`MAX_READ` datagrams per
poll. User side (the probe, :class:`ChannelClient`): sends requests, polls ``ack``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SUFFIX = ".control"
REQUEST = "request"
ACK = "ack"
#: ``EPOCH STATE CRC\n``: 10 digits, a space, 3 characters, a space, 8 hex digits, a newline.
REQUEST_SIZE = 24
MAX_EPOCH = 10**10 - 1
_REQUEST = re.compile(rb"\A([0-9]{10}) ( on|off) ([0-9a-f]{8})\n\Z")
#: How often the agent reads the request while a channel is open (the issue asks for <= 10 ms).
POLL_S = 0.005
#: Datagrams read per poll at most: a flood of them never holds the agent in one read.
MAX_READ = 64
#: How long a rank's send may wait for room in the agent's queue (it drains every POLL_S).
SEND_TIMEOUT_S = 0.5
#: Mode of the request socket: only root and the job's group may send (the agent keeps the job's
#: uid's datagrams only).
REQUEST_MODE = 0o620
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
#: A socket's address holds at most 107 bytes of path; a longer one is reached through its
#: directory's descriptor.
_SUN_PATH_MAX = 107


class State(StrEnum):
    """What a request asks for and an acknowledgement confirms."""

    OFF = "off"
    ON = "on"


class ChannelError(Exception):
    """The control directory or one of its files is not what the agent made: the channel is shut."""


def channel_dir(root: Path, node: str, job_id: str) -> Path:
    if not node or "/" in node or node in (".", "..") or not job_id.isdigit():
        raise ValueError(f"bad node {node!r} or job id {job_id!r} for a control channel")
    return root / node / f"{job_id}{SUFFIX}"


def _crc(epoch: int, state: State) -> str:
    return f"{zlib.crc32(f'{epoch:010d} {state.value:>3}'.encode()):08x}"


def format_request(epoch: int, state: State) -> bytes:
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {epoch} out of range 0..{MAX_EPOCH}")
    text = f"{epoch:010d} {state.value:>3} {_crc(epoch, state)}\n".encode()
    assert len(text) == REQUEST_SIZE
    return text


@dataclass(frozen=True)
class Request:
    epoch: int
    state: State


def parse_request(data: bytes) -> Request | None:
    """The request a record holds; None for anything else (empty, torn, garbage, too long)."""
    m = _REQUEST.match(data)
    if m is None:
        return None
    epoch, state = int(m.group(1)), State(m.group(2).decode().strip())
    if m.group(3).decode() != _crc(epoch, state):
        return None
    return Request(epoch, state)


@dataclass(frozen=True)
class Ack:
    epoch: int
    state: State
    time: float
    error: str = ""

    def to_json(self) -> str:
        data = {"epoch": self.epoch, "state": self.state.value, "time": self.time, "error": self.error}
        return json.dumps(data)


def parse_ack(text: str) -> Ack | None:
    try:
        data = json.loads(text)
        return Ack(int(data["epoch"]), State(data["state"]), float(data["time"]), str(data.get("error", "")))
    except (ValueError, KeyError, TypeError):
        return None


def _check_root_dir(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ChannelError(f"{path}: not a root-owned directory that only root writes")


@contextlib.contextmanager
def _address(directory: Path, name: str) -> Iterator[str]:
    """The socket address of `directory`/`name`: the path itself, or (too long for an address) the
    same name through an open descriptor of the directory."""
    path = str(directory / name)
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The uid the kernel vouches for in a datagram's SCM_CREDENTIALS, or None without them."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            return int(_UCRED.unpack_from(data)[1])
    return None


@dataclass
class ChannelOwner:
    """The agent's end: makes the channel, reads requests, writes acknowledgements."""

    path: Path
    sock: socket.socket
    uid: int
    last_epoch: int = 0
    #: Datagrams dropped: malformed, truncated, or from a uid other than the job's and root's.
    dropped: int = 0

    @classmethod
    def create(cls, root: Path, node: str, job_id: str, uid: int, gid: int) -> ChannelOwner:
        """Make the channel of a job afresh (an earlier one of the same job is removed first); the
        fault starts off."""
        path = channel_dir(root, node, job_id)
        _check_root_dir(path.parent)
        for d in (root, path.parent):
            if not os.stat(d).st_mode & stat.S_IXOTH:
                raise ChannelError(f"{d}: the job's user cannot reach its control channel (mode without o+x)")
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            # An earlier agent's (a requeued job's prolog, or one that died): started afresh, so
            # no request or acknowledgement of the earlier run is taken for this one's.
            remove_channel(root, node, job_id)
            os.mkdir(path, 0o755)
        _check_root_dir(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with _address(path, REQUEST) as address:
                sock.bind(address)
            # The directory is root's alone and was made just now: the name is the socket bound.
            os.chown(path / REQUEST, 0, gid, follow_symlinks=False)
            os.chmod(path / REQUEST, REQUEST_MODE)
        except OSError:
            sock.close()
            raise
        owner = cls(path, sock, uid)
        owner.acknowledge(Ack(0, State.OFF, time.time()))
        return owner

    def read(self) -> Request | None:
        """The latest new request (epoch above the last one acted on) of the job's user, or None."""
        latest: Request | None = None
        for _ in range(MAX_READ):
            try:
                data, ancillary, flags, _addr = self.sock.recvmsg(
                    REQUEST_SIZE + 1, socket.CMSG_SPACE(_UCRED.size), socket.MSG_DONTWAIT
                )
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return latest
            sender = _sender_uid(ancillary)
            req = None if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) else parse_request(data)
            if req is None or sender not in (self.uid, 0):
                self.dropped += 1
                continue
            if req.epoch > self.last_epoch and (latest is None or req.epoch > latest.epoch):
                latest = req
        return latest

    def acknowledge(self, ack: Ack) -> None:
        self.last_epoch = max(self.last_epoch, ack.epoch)
        _check_root_dir(self.path)
        tmp = self.path / f".{ACK}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (ack.to_json() + "\n").encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / ACK)

    def close(self) -> None:
        self.sock.close()


def remove_channel(root: Path, node: str, job_id: str) -> None:
    """The epilog's tidy-up: the channel's files and directory (never following a link)."""
    path = channel_dir(root, node, job_id)
    try:
        _check_root_dir(path)
    except FileNotFoundError:
        return
    for name in os.listdir(path):
        os.unlink(path / name)
    os.rmdir(path)


@dataclass
class ChannelClient:
    """The job's end (one rank per node): asks for a state and waits for the agent to confirm it."""

    path: Path
    epoch: int = 0

    @classmethod
    def find(cls, root: Path, node: str, job_id: str) -> ChannelClient | None:
        """The node's channel for this job, or None where the agent opened none (no fault here);
        OSError (EACCES) where one may be there but the job's user cannot reach it."""
        path = channel_dir(root, node, job_id)
        try:
            os.stat(path / REQUEST)
        except FileNotFoundError:
            return None  # PermissionError goes up: a channel the job cannot reach is an error
        return cls(path)

    def ack(self) -> Ack | None:
        try:
            return parse_ack((self.path / ACK).read_text())
        except OSError:
            return None

    def request(self, state: State) -> int:
        """Send a request for `state`; returns its epoch. OSError when the agent's socket is gone
        (ECONNREFUSED, ENOENT) or its queue stayed full for SEND_TIMEOUT_S."""
        self.epoch = max(self.epoch, (self.ack() or Ack(0, State.OFF, 0.0)).epoch) + 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(SEND_TIMEOUT_S)
            with _address(self.path, REQUEST) as address:
                sock.sendto(format_request(self.epoch, state), address)
        return self.epoch

    def is_open(self) -> bool:
        """Whether the agent's socket is still there (the agent removes it with the channel)."""
        try:
            return stat.S_ISSOCK(os.lstat(self.path / REQUEST).st_mode)
        except OSError:
            return False

    def wait(self, epoch: int, timeout: float, poll: float = 0.001) -> Ack | None:
        """The acknowledgement of `epoch` (or a later one), or None after `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            ack = self.ack()
            if ack is not None and ack.epoch >= epoch:
                return ack
            if time.monotonic() >= end:
                return None
            time.sleep(poll)
