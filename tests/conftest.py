"""Shared fixtures; `sandbox` brings up (once per session) a real Slurm cluster on this machine."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SandboxHandle:
    """What a test needs to talk to the sandbox cluster."""

    name: str
    env: dict[str, str]
    nodes: tuple[str, ...]
    shared_dir: Path
    reservation: str
    slurm_conf: Path
    switches: dict[str, list[str]]


def _can_run_sandbox() -> str | None:
    if os.geteuid() != 0:
        return "the sandbox cluster needs root"
    if shutil.which("ip") is None:
        return "iproute2 is missing"
    return None


@pytest.fixture(autouse=True)
def _loggers_as_they_were() -> Iterator[None]:
    """Undo the handlers a test's agent or CLI installs (one bound to a captured stderr that pytest
    closes afterwards would make every later log line a 'Logging error')."""
    loggers = [logging.getLogger(), logging.getLogger("slurm_chaos.faults")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture(scope="session")
def sandbox() -> Iterator[SandboxHandle]:
    """The sandbox named by $SLURM_CHAOS_SANDBOX (default 'test'), brought up if it is not running.

    A sandbox this fixture started is taken down at the end of the session; one that was already up
    (a developer's) is left running.
    """
    reason = _can_run_sandbox()
    if reason:
        pytest.skip(reason)
    from slurm_chaos.sandbox.cluster import Sandbox

    name = os.environ.get("SLURM_CHAOS_SANDBOX", "test")
    sb = Sandbox(name)
    started = not sb.is_up()
    layout = sb.up(nodes=4, install=os.environ.get("SLURM_CHAOS_SANDBOX_INSTALL", "1") == "1")
    layout.shared_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield SandboxHandle(
            name=name,
            # The site file names its sandbox; the tests' own overrides it in every command they run.
            env={**os.environ, **layout.env(), "SLURM_CHAOS_SANDBOX": name},
            nodes=tuple(layout.node_names()),
            shared_dir=layout.shared_dir,
            reservation=layout.reservation,
            slurm_conf=layout.slurm_conf,
            switches=layout.switches(),
        )
    finally:
        if started and os.environ.get("SLURM_CHAOS_KEEP_SANDBOX") != "1":
            sb.down()


@pytest.fixture(scope="session")
def chaos_site(sandbox: SandboxHandle) -> Path:
    """The sandbox site config with the SPANK plugin and node hooks installed into the test sandbox."""
    from slurm_chaos.cli import main

    os.environ["SLURM_CHAOS_SANDBOX"] = sandbox.name
    site = REPO / "site_configs" / "sandbox.yaml"
    prefix = sandbox.shared_dir.parent / "prefix"
    assert main(["plugin", "install", "--site", str(site), "--prefix", str(prefix)]) == 0
    return site


@dataclass(frozen=True)
class SandboxUser:
    """An unprivileged user of the sandbox, with a directory of their own on its shared filesystem."""

    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, *command: str, env: dict[str, str] | None = None) -> list[str]:
        """`command` run as this user (with `env` set), for a runner that runs as root."""
        pairs = [f"{k}={v}" for k, v in (env or {}).items()]
        return ["runuser", "-u", self.name, "--", "env", *pairs, *command]


#: chaosok is on safety.allowed_users of site_configs/sandbox.yaml; chaosno is on no allowlist.
SANDBOX_USERS = ("chaosok", "chaosno")


def _ensure_user(name: str) -> None:
    import pwd
    import subprocess

    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    done = subprocess.run(
        ["useradd", "-M", "-s", "/bin/sh", name], capture_output=True, text=True, timeout=30
    )
    try:
        pwd.getpwnam(name)  # another session may have created it first
    except KeyError:
        pytest.skip(f"useradd {name} failed: {done.stderr.strip()}")


@pytest.fixture(scope="session")
def sandbox_users(sandbox: SandboxHandle) -> dict[str, SandboxUser]:
    """The test users (created once, idempotently, and left in place), allowed into the sandbox's
    reservation, each with ``<shared>/users/<name>`` of their own. The checkpoint root
    (``<shared>/checkpoints``) is world-writable and sticky, like a scratch filesystem."""
    import pwd
    import subprocess

    users = {}
    for name in SANDBOX_USERS:
        _ensure_user(name)
        pw = pwd.getpwnam(name)
        home = sandbox.shared_dir / "users" / name
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        users[name] = SandboxUser(name, pw.pw_uid, pw.pw_gid, home)
    show = subprocess.run(
        ["scontrol", "-o", "show", "reservation", sandbox.reservation],
        capture_output=True,
        text=True,
        timeout=30,
        env=sandbox.env,
    )
    listed = next((w.split("=", 1)[1].split(",") for w in show.stdout.split() if w.startswith("Users=")), [])
    missing = [n for n in SANDBOX_USERS if n not in listed]
    if missing:
        update = [
            "scontrol",
            "update",
            f"ReservationName={sandbox.reservation}",
            f"Users+={','.join(missing)}",
        ]
        done = subprocess.run(update, capture_output=True, text=True, timeout=30, env=sandbox.env)
        assert done.returncode == 0, done.stderr
    checkpoints = sandbox.shared_dir / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    checkpoints.chmod(0o1777)
    return users
