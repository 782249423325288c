"""The node-local control channel of a switchback job: the ranks ask for the fault on or off.

A switchback schedule (:mod:`slurm_chaos.schedule`) toggles a reversible fault inside one
job at step boundaries. The fault itself was authorised and applied as usual (SPANK plugin ->
prolog -> agent, journalled, ``control=switchback`` in its SPEC); the channel only says whether it
acts now. It can say nothing else: the root agent never takes a SPEC, a path or a rank from it.

Layout, per node and job, beside the job's journal::

    <journal root>/<node>/<job>.control/      root:root 0755, made by the agent at apply
        request                               the job's uid, 0600; made (O_EXCL) by the agent,
                                              written in place by one rank per node
        ack                                   root 0644, replaced atomically by the agent

``request`` holds one fixed-width record, :func:`format_request`: ``EPOCH STATE CRC\\n`` with a
zero-padded decimal epoch, ``on``/``off`` right-aligned to three characters and the CRC-32 of the
first two fields in hex. The CRC is there because an in-place write of a regular file is not atomic
for a reader: a torn record fails it and is read again at the next poll. The epoch increases by one
per request; the agent ignores a record whose epoch is not above the last one it acted on.

``ack`` is one JSON object ``{"epoch": E, "state": "on"|"off", "time": T, "error": ""}``: the
agent's acknowledgement that the fault is in STATE since Unix time T (epoch 0 ``off`` when the
channel was opened, before the job's tasks start). A non-empty ``error`` says the change failed
(the fault stays as it was); the probe records it and drops the block.

Root side (the agent, :class:`ChannelOwner`): the directory is made under the journal's own
root-owned node directory and checked (owner root, not a link, no group/other write) before every
use; ``request`` is opened once with ``O_NOFOLLOW`` and read with ``pread`` of at most
:data:`REQUEST_SIZE` bytes, so the job's user can change its bytes but not what it is. User side
(the probe, :class:`ChannelClient`): writes requests, polls ``ack``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import zlib
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


@dataclass
class ChannelOwner:
    """The agent's end: makes the channel, reads requests, writes acknowledgements."""

    path: Path
    fd: int
    last_epoch: int = 0

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
        req = path / REQUEST
        fd = os.open(req, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchown(fd, uid, gid)
        except OSError:
            os.close(fd)
            raise
        owner = cls(path, fd)
        owner.acknowledge(Ack(0, State.OFF, time.time()))
        return owner

    def read(self) -> Request | None:
        """A new request (epoch above the last one acted on), or None."""
        try:
            data = os.pread(self.fd, REQUEST_SIZE + 1, 0)
        except OSError:
            return None
        req = parse_request(data)
        if req is None or req.epoch <= self.last_epoch:
            return None
        return req

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
        try:
            os.close(self.fd)
        except OSError:
            pass


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
        self.epoch = max(self.epoch, (self.ack() or Ack(0, State.OFF, 0.0)).epoch) + 1
        fd = os.open(self.path / REQUEST, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(fd, format_request(self.epoch, state), 0)
            os.ftruncate(fd, REQUEST_SIZE)  # whatever was there before, only the record is left
        finally:
            os.close(fd)
        return self.epoch

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
