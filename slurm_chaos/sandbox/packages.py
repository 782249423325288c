"""Debian packages the sandbox needs, installed only when missing (Debian 12 and 13 names)."""

from __future__ import annotations

import logging
import shutil

from slurm_chaos.errors import ChaosError
from slurm_chaos.runner import Runner

log = logging.getLogger(__name__)

# Each entry lists alternatives: Debian 13 renamed libraries for the 64-bit time_t transition
# and split slurmdbd's MySQL plugin into its own package.
REQUIRED: tuple[tuple[str, ...], ...] = (
    ("slurm-wlm",),
    ("slurm-client",),
    ("slurmdbd",),
    ("slurm-wlm-mysql-plugin",),
    ("munge",),
    ("libslurm-dev",),
    ("slurm-wlm-basic-plugins-dev",),
    ("libpmix2t64", "libpmix2"),
    ("openmpi-bin",),
    ("libopenmpi-dev",),
    ("mariadb-server",),
    ("iproute2",),
    ("util-linux",),
    ("procps",),
    ("gcc",),
    ("make",),
    ("libc6-dev",),
    ("stress-ng",),
    ("numactl",),
    ("hwloc-nox", "hwloc"),
    ("fiu-utils",),
    ("libfiu-dev",),
    ("prometheus",),
    ("prometheus-alertmanager",),
    # Every node's node_exporter (sandbox/monitoring.py); without it the sandbox runs without them.
    ("prometheus-node-exporter",),
)

# Quick test that avoids asking apt at all when everything is already there.
COMMANDS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch", "ip", "nsenter", "unshare")


def _installed(runner: Runner, pkg: str) -> bool:
    res = runner(["dpkg-query", "-W", "-f=${Status}", pkg], timeout=30)
    return res.ok and "install ok installed" in res.stdout


def _has_candidate(runner: Runner, pkg: str) -> bool:
    res = runner(["apt-cache", "policy", pkg], timeout=60)
    return res.ok and "Candidate:" in res.stdout and "Candidate: (none)" not in res.stdout


def missing_packages(runner: Runner) -> list[tuple[str, ...]]:
    return [alts for alts in REQUIRED if not any(_installed(runner, p) for p in alts)]


def ensure_packages(runner: Runner) -> list[str]:
    """Install what is missing; returns the package names installed."""
    missing = missing_packages(runner)
    if not missing:
        return []
    if shutil.which("apt-get") is None:
        names = ", ".join(a[0] for a in missing)
        raise ChaosError(f"missing packages ({names}) and no apt-get to install them")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    update = runner(["apt-get", "update", "-qq"], timeout=600, env=env)
    if not update.ok:
        raise ChaosError(f"apt-get update failed: {update.stderr.strip()[-500:]}")
    chosen = []
    for alts in missing:
        pkg = next((p for p in alts if _has_candidate(runner, p)), None)
        if pkg is None:
            # Optional on releases that do not split it out (Debian 12 ships the plugin in slurmdbd).
            if alts == ("slurm-wlm-mysql-plugin",):
                continue
            raise ChaosError(f"no installable package among {', '.join(alts)}")
        chosen.append(pkg)
    if not chosen:
        return []
    log.info("installing %s", " ".join(chosen))
    res = runner(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *chosen], timeout=1800, env=env
    )
    if not res.ok:
        raise ChaosError(f"apt-get install failed: {res.stderr.strip()[-800:]}")
    return chosen
