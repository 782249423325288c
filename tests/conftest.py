"""Shared fixtures; `sandbox` brings up (once per session) a real Slurm cluster on this machine."""

from __future__ import annotations

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
            env={**os.environ, **layout.env()},
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
