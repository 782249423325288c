"""Choose the Scheduler implementation: pyslurm only when it was built for this Slurm release."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import ModuleType

from slurm_chaos.errors import SlurmError
from slurm_chaos.runner import Runner
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.parse import parse_version
from slurm_chaos.slurm.protocol import Scheduler
from slurm_chaos.slurm.pyslurm_backend import PyslurmScheduler, load_pyslurm

log = logging.getLogger(__name__)


def same_release(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm X.Y only works with Slurm X.Y: `22.5.1` matches `22.05.8`, `24.11.0` not `24.05.3`."""
    try:
        return parse_version(pyslurm_version)[:2] == parse_version(slurm_version)[:2]
    except SlurmError:
        return False


def choose(pyslurm: ModuleType | None, slurm_version: str) -> str:
    """`pyslurm` or `cli`, with the reason logged."""
    if pyslurm is None:
        log.info("pyslurm not importable: using the Slurm CLI")
        return "cli"
    version = str(getattr(pyslurm, "__version__", ""))
    if not same_release(version, slurm_version):
        log.info("pyslurm %s does not match Slurm %s: using the Slurm CLI", version, slurm_version)
        return "cli"
    return "pyslurm"


def select_scheduler(env: Mapping[str, str], runner: Runner, timeout: float = 8.0) -> Scheduler:
    """The Scheduler for this machine; the CLI backend is always the fallback."""
    cli = SlurmCLI(env, runner, timeout)
    pyslurm = load_pyslurm()
    if pyslurm is not None and choose(pyslurm, cli.version()) == "pyslurm":
        return PyslurmScheduler(pyslurm, cli)
    return cli
