"""Build the slurm-chaos SPANK plugin and register it in the site's plugstack.conf.

``slurm-chaos plugin install --site SITE`` calls :func:`install_plugin`: ``make install`` of
the shipped ``spank_plugin/`` (and of the ``preload/`` I/O shim) under a prefix, then one
``required .../slurm_chaos.so ARGS`` line in the PlugStackConfig file the site names
(``slurm.plugstack_conf``), with the site's safety rules as the plugin's arguments. slurmstepd
reads plugstack.conf at every step start, so no daemon restart is needed for steps; srun/sbatch
read it at each invocation.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError, ConfigError
from slurm_chaos.faults.catalogue import CATALOGUE_PATH
from slurm_chaos.faults.journal import DEFAULT_ROOT
from slurm_chaos.resources import shipped
from slurm_chaos.runner import Runner
from slurm_chaos.site import Safety, load_site

PLUGIN_FILE = "slurm_chaos.so"
# The rollback journal's root: the prolog agent and the plugin write the same per-node files.
DEFAULT_JOURNAL_DIR = str(DEFAULT_ROOT)  # also the plugin's own default (parse.h)

# What the C argument parser accepts (parse.c parse_list): no separators, under 128 bytes.
_NAME_RE = re.compile(r"[A-Za-z0-9_.@*+-]{1,127}")
_MAX_ENTRIES = 64


@dataclass(frozen=True)
class PluginArgs:
    """The plugstack.conf arguments of the plugin: who may inject, and where it journals."""

    allow_users: tuple[str, ...] = ()
    allow_accounts: tuple[str, ...] = ()
    allow_partitions: tuple[str, ...] = ()
    allow_reservations: tuple[str, ...] = ()
    require_exclusive: bool = True
    journal_dir: str = DEFAULT_JOURNAL_DIR

    @classmethod
    def from_safety(cls, safety: Safety, journal_dir: str = DEFAULT_JOURNAL_DIR) -> PluginArgs:
        return cls(
            allow_users=safety.allowed_users,
            allow_accounts=safety.allowed_accounts,
            allow_partitions=safety.allowed_partitions,
            allow_reservations=safety.allowed_reservations,
            require_exclusive=safety.require_exclusive,
            journal_dir=journal_dir,
        )

    def render(self) -> list[str]:
        """The arguments as plugstack.conf words; ValueError names an entry the plugin would refuse."""
        words: list[str] = []
        for arg, names in (
            ("allow_users", self.allow_users),
            ("allow_accounts", self.allow_accounts),
            ("allow_partitions", self.allow_partitions),
            ("allow_reservations", self.allow_reservations),
        ):
            if not names:
                continue  # unset: no restriction (users: only root)
            if len(names) > _MAX_ENTRIES:
                raise ValueError(f"{arg}: more than {_MAX_ENTRIES} entries")
            for name in names:
                if not _NAME_RE.fullmatch(name):
                    raise ValueError(f"{arg}: {name!r} is not a plain name")
            words.append(f"{arg}={','.join(names)}")
        words.append(f"require_exclusive={1 if self.require_exclusive else 0}")
        if not self.journal_dir.startswith("/") or any(c.isspace() for c in self.journal_dir):
            raise ValueError(f"journal_dir: {self.journal_dir!r} must be an absolute path without spaces")
        words.append(f"journal_dir={self.journal_dir}")
        return words


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install_plugin` did."""

    plugin_path: Path
    plugstack_path: Path
    line: str
    replaced: bool  # an earlier slurm_chaos.so line was replaced


def plugstack_line(plugin_path: Path | str, args: PluginArgs) -> str:
    """The ``required PATH ARGS`` line for plugstack.conf."""
    return " ".join(["required", str(plugin_path), *args.render()])


def _is_our_line(line: str) -> bool:
    words = line.split()
    return len(words) >= 2 and not words[0].startswith("#") and Path(words[1]).name == PLUGIN_FILE


def update_plugstack(path: Path, line: str | None) -> bool:
    """Replace (or, with ``line=None``, remove) our line in plugstack.conf; other lines stay.

    Written to a temporary file and renamed, so slurmstepd never reads half a file.
    Returns whether an earlier slurm_chaos line was there.
    """
    old = path.read_text().splitlines() if path.exists() else []
    kept = [entry for entry in old if not _is_our_line(entry)]
    new = kept + ([line] if line else [])
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plugstack.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(new) + "\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(kept) != len(old)


def build_plugin(prefix: Path | str, runner: Runner, *, timeout: float = 300) -> Path:
    """``make install`` the plugin under prefix; returns the installed .so path.

    The sources are read where they ship (site-packages may be read-only); objects go to a
    temporary build directory of ours, so every install is a clean build of these sources.
    """
    prefix = Path(prefix)
    with tempfile.TemporaryDirectory(prefix="slurm-chaos-build.") as tmp:
        # The checkpoint I/O shim goes beside the plugin, which preloads it for ckpt-* faults.
        for name in ("spank_plugin", "preload"):
            build = Path(tmp) / name
            # CATALOGUE: the Makefile's default (../slurm_chaos/...) holds in a checkout only.
            make = ["make", "-C", str(shipped(name)), "install", f"PREFIX={prefix}", f"B={build}"]
            result = runner([*make, f"CATALOGUE={CATALOGUE_PATH}"], timeout=timeout)
            if not result.ok:
                tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
                raise ChaosError(f"building {name} failed (make install):\n" + "\n".join(tail))
    return prefix / "lib" / "slurm-chaos" / PLUGIN_FILE


def install_plugin(
    site_conf_path: Path | str,
    prefix: Path | str,
    runner: Runner,
    *,
    journal_dir: str | None = None,
) -> InstallResult:
    """Build and install the plugin, then write its line into the site's plugstack.conf.

    The journal directory defaults to the one the site's prolog/epilog hooks and ``cleanup``
    use (``site_journal_root``): the plugin appends to the same per-node journal files.
    """
    from slurm_chaos.faults.install_hooks import site_journal_root

    site = load_site(site_conf_path)
    if not site.slurm.plugstack_conf:
        raise ConfigError(str(site_conf_path), "slurm.plugstack_conf", "needed to install the SPANK plugin")
    try:
        args = PluginArgs.from_safety(site.safety, journal_dir or str(site_journal_root(site)))
        args.render()
    except ValueError as exc:
        raise ConfigError(str(site_conf_path), "safety", str(exc)) from exc
    plugin = build_plugin(prefix, runner)
    line = plugstack_line(plugin, args)
    plugstack = Path(site.slurm.plugstack_conf)
    replaced = update_plugstack(plugstack, line)
    return InstallResult(plugin, plugstack, line, replaced)


def uninstall_plugin(site_conf_path: Path | str) -> bool:
    """Remove the plugin's line from the site's plugstack.conf; True if there was one."""
    site = load_site(site_conf_path)
    if not site.slurm.plugstack_conf:
        raise ConfigError(
            str(site_conf_path), "slurm.plugstack_conf", "no plugstack.conf to remove the plugin from"
        )
    path = Path(site.slurm.plugstack_conf)
    return update_plugstack(path, None) if path.exists() else False
