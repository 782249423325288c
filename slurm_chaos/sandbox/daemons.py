"""Starting, finding and stopping the sandbox's daemons by PID, never by name alone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from slurm_chaos.faults import node_proc


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def is_ours(
    pid: int | None, program: str, marker: tuple[str, str] | None = None, arg: str | None = None
) -> bool:
    """True when `pid` runs `program` and carries our marker (an environment entry or an argument)."""
    if not alive(pid):
        return False
    assert pid is not None
    argv = node_proc.cmdline(pid)
    # The file it executes, links resolved (`python3.11` for a process started as `python`): the
    # same program started under another name is still the same.
    if not argv or program not in {Path(argv[0]).name, node_proc.exe_name(pid)}:
        return False
    if arg is not None and not any(arg in a for a in argv):
        return False
    if marker is not None and node_proc.environ(pid).get(marker[0]) != marker[1]:
        return False
    return True


def terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for_pidfile(pidfile: Path, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = read_pid(pidfile)
        if alive(pid):
            return pid
        time.sleep(0.05)
    return None
