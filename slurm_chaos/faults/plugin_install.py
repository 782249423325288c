"""Build the slurm-chaos SPANK plugin, write the site's policy, register the plugin.

``slurm-chaos plugin install --site SITE`` calls :func:`install_plugin`:

- the policy file ``slurm-chaos-policy.toml`` beside slurm.conf, from the site's ``safety:``
  section (root-owned, mode 0644): the one set of rules the prolog hooks, the plugin and
  job_submit.lua share (:mod:`slurm_chaos.faults.policy`);
- ``job_submit.lua`` beside slurm.conf (slurmctld reloads it when it changes; slurm.conf needs
  ``JobSubmitPlugins=lua``), unless the site has its own, which is then left alone: the note
  says how to call ours from it;
- ``make install`` of the shipped ``spank_plugin/`` (and of the ``preload/`` I/O shim) under a
  prefix, then one ``required .../slurm_chaos.so policy=... journal_dir=...`` line in the
  PlugStackConfig file the site names (``slurm.plugstack_conf``). The line carries paths only:
  a user's own plugstack.conf grants nothing. slurmstepd reads plugstack.conf at every step
  start, so no daemon restart is needed.

With an :class:`InstallRoot` of a node image (``--root DIR``) every file lands under DIR while the
paths written into them are the booted node's; the plugin is built here, against this machine's
Slurm headers, and copied in.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from slurm_chaos.errors import ChaosError, ConfigError, UsageError
from slurm_chaos.faults.catalogue import CATALOGUE_PATH
from slurm_chaos.faults.install_root import LIVE, InstallRoot
from slurm_chaos.faults.journal import DEFAULT_ROOT
from slurm_chaos.faults.policy import POLICY_NAME, Policy
from slurm_chaos.resources import shipped
from slurm_chaos.runner import Runner
from slurm_chaos.site import Safety, Site

PLUGIN_FILE = "slurm_chaos.so"
#: The checkpoint I/O shim, installed beside the plugin (which preloads it for ckpt-* faults).
SHIM_FILE = "libslurm_chaos_io.so"
JOB_SUBMIT_LUA = "job_submit.lua"
#: Our script under its own name, for a site that already has a job_submit.lua.
OWN_LUA = "slurm-chaos-job_submit.lua"
LUA_MARK = "slurm-chaos job_submit/lua"
# The rollback journal's root: the prolog agent and the plugin write the same per-node files.
DEFAULT_JOURNAL_DIR = str(DEFAULT_ROOT)  # also the plugin's own default (parse.h)
DEFAULT_SLURM_ETC = Path("/etc/slurm")
# Paths the plugstack.conf parser, the hook scripts and the Lua script all take as they are.
_PATH_RE = re.compile(r"/[A-Za-z0-9_./-]{0,1000}")


def policy_from_safety(safety: Safety) -> Policy:
    """The policy a site's ``safety:`` section describes (empty lists: the key is left out)."""
    return Policy(
        allow_users=safety.allowed_users or None,
        allow_accounts=safety.allowed_accounts or None,
        allow_partitions=safety.allowed_partitions or None,
        allow_reservations=safety.allowed_reservations or None,
        require_exclusive=safety.require_exclusive,
        allow_arrays=safety.allow_arrays,
        allow_het_jobs=safety.allow_het_jobs,
        max_nodes=safety.max_nodes,
        job_interface=safety.job_interface,
    )


def slurm_etc(site: Site) -> Path:
    """The directory of the site's slurm.conf, where the policy and job_submit.lua go."""
    return Path(site.slurm.conf).parent if site.slurm.conf else DEFAULT_SLURM_ETC


def site_policy_path(site: Site) -> Path:
    return slurm_etc(site) / POLICY_NAME


@dataclass(frozen=True)
class PluginArgs:
    """The plugstack.conf arguments of the plugin: where the policy is, and where it journals."""

    policy: str = str(DEFAULT_SLURM_ETC / POLICY_NAME)
    journal_dir: str = DEFAULT_JOURNAL_DIR

    def render(self) -> list[str]:
        """The arguments as plugstack.conf words; ValueError names a path the plugin would refuse."""
        for name, path in (("policy", self.policy), ("journal_dir", self.journal_dir)):
            if not _PATH_RE.fullmatch(path):
                raise ValueError(f"{name}: {path!r} must be an absolute path of plain characters")
        return [f"policy={self.policy}", f"journal_dir={self.journal_dir}"]


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install_plugin` did."""

    plugin_path: Path
    plugstack_path: Path
    line: str
    replaced: bool  # an earlier slurm_chaos.so line was replaced
    policy_path: Path | None = None
    job_submit: Path | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def plugstack_line(plugin_path: Path | str, args: PluginArgs) -> str:
    """The ``required PATH ARGS`` line for plugstack.conf."""
    return " ".join(["required", str(plugin_path), *args.render()])


def _is_our_line(line: str) -> bool:
    words = line.split()
    return len(words) >= 2 and not words[0].startswith("#") and Path(words[1]).name == PLUGIN_FILE


def update_plugstack(path: Path, line: str | None, root: InstallRoot = LIVE) -> bool:
    """Replace (or, with ``line=None``, remove) our line in plugstack.conf; other lines stay.

    `path` is the node's; its present text is read inside `root` (a link there followed as the
    node would). The new file is root's, mode 0644, whatever the old one's mode was (slurmstepd
    loads what it names as root: nobody else may write it), written to a temporary file and
    renamed (:meth:`InstallRoot.write`), so slurmstepd never reads half a file. Returns whether
    an earlier slurm_chaos line was there.
    """
    old = (root.read_text(path) or "").splitlines()
    kept = [entry for entry in old if not _is_our_line(entry)]
    new = kept + ([line] if line else [])
    root.write(path, ("\n".join(new) + "\n").encode(), mode=0o644)
    return len(kept) != len(old)


def build_plugin(
    prefix: Path | str, runner: Runner, *, timeout: float = 300, root: InstallRoot = LIVE
) -> Path:
    """``make install`` the plugin under prefix; returns the installed .so path (the node's).

    The sources are read where they ship (site-packages may be read-only); objects go to a
    temporary build directory of ours, so every install is a clean build of these sources. Into
    an image, make installs into that directory too (DESTDIR), and the two libraries are copied
    under the image's root from there: ``install -d`` would follow a link the image holds.
    """
    prefix = Path(prefix)
    libdir = prefix / "lib" / "slurm-chaos"
    with tempfile.TemporaryDirectory(prefix="slurm-chaos-build.") as tmp:
        stage = Path(tmp) / "stage"
        # The checkpoint I/O shim goes beside the plugin, which preloads it for ckpt-* faults.
        for name in ("spank_plugin", "preload"):
            build = Path(tmp) / name
            # CATALOGUE: the Makefile's default (../slurm_chaos/...) holds in a checkout only.
            make = ["make", "-C", str(shipped(name)), "install", f"PREFIX={prefix}", f"B={build}"]
            destdir = [f"DESTDIR={stage}"] if root.is_image else []
            result = runner([*make, f"CATALOGUE={CATALOGUE_PATH}", *destdir], timeout=timeout)
            if not result.ok:
                tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
                raise ChaosError(f"building {name} failed (make install):\n" + "\n".join(tail))
        if root.is_image:
            for lib in (PLUGIN_FILE, SHIM_FILE):
                built = stage / libdir.relative_to("/") / lib
                root.write(libdir / lib, built.read_bytes(), mode=0o755)
    return libdir / PLUGIN_FILE


def render_job_submit(policy: Path) -> str:
    """The shipped job_submit.lua with the policy's path filled in."""
    if not _PATH_RE.fullmatch(str(policy)):
        raise ValueError(f"policy: {str(policy)!r} must be an absolute path of plain characters")
    text = (files("slurm_chaos.faults") / "job_submit.lua").read_text()
    return text.replace("@POLICY_PATH@", str(policy))


def install_job_submit(etc: Path, policy: Path, root: InstallRoot = LIVE) -> tuple[Path, tuple[str, ...]]:
    """Write our job_submit.lua into `etc` (slurmctld's directory); returns it and notes for the admin.

    A site's own job_submit.lua is kept: ours goes beside it under OWN_LUA, and the note says
    how to call it. slurm.conf needs ``JobSubmitPlugins=lua`` (noted when it is missing). Paths
    are the node's: under `root`, what is read and written is the image's.
    """
    text = render_job_submit(policy)
    target = etc / JOB_SUBMIT_LUA
    notes: list[str] = []
    existing = root.read_text(target)
    if existing is not None and LUA_MARK not in existing:
        target = etc / OWN_LUA
        notes.append(
            f"{etc / JOB_SUBMIT_LUA} is the site's own: ours is {target}; without it slurmctld cannot "
            f"refuse --chaos at submission and the prolog grants nothing. Rename your functions, "
            f"dofile('{target}') at the top, and call its slurm_job_submit from yours"
        )
    root.write(target, text.encode(), mode=0o644)
    conf = root.read_text(etc / "slurm.conf")
    if conf is not None and not re.search(r"(?im)^\s*JobSubmitPlugins\s*=.*\blua\b", conf):
        notes.append(
            f"{etc / 'slurm.conf'}: add JobSubmitPlugins=lua (and restart slurmctld) so that {target} runs"
        )
    return target, tuple(notes)


def install_plugin(
    site: Site,
    prefix: Path | str,
    runner: Runner,
    *,
    journal_dir: str | None = None,
    root: InstallRoot = LIVE,
) -> InstallResult:
    """Write the policy and job_submit.lua, build and install the plugin, register it in plugstack.conf.

    The site comes loaded (its placeholders filled in by the caller: the CLI, from the sandbox).
    Under an image's `root` the paths returned are the node's.

    The journal directory defaults to the one the site's prolog/epilog hooks and ``cleanup``
    use (``site_journal_root``): the plugin appends to the same per-node journal files, and
    reads the prolog's grant files there.
    """
    from slurm_chaos.faults.install_hooks import site_journal_root

    if not site.slurm.plugstack_conf:
        raise ConfigError(str(site.path), "slurm.plugstack_conf", "needed to install the SPANK plugin")
    policy_path = site_policy_path(site)
    try:
        policy = policy_from_safety(site.safety)
        policy.render()
        args = PluginArgs(str(policy_path), journal_dir or str(site_journal_root(site)))
        args.render()
        render_job_submit(policy_path)
    except ValueError as exc:
        raise ConfigError(str(site.path), "safety", str(exc)) from exc
    if root.is_image and not Path(prefix).is_absolute():
        raise UsageError(f"--prefix: {prefix} must be an absolute path (the node's) with --root")
    plugin = build_plugin(prefix, runner, root=root)
    root.write(policy_path, policy.render().encode(), mode=0o644)
    lua, notes = install_job_submit(policy_path.parent, policy_path, root)
    line = plugstack_line(plugin, args)
    plugstack = Path(site.slurm.plugstack_conf)
    replaced = update_plugstack(plugstack, line, root)
    return InstallResult(plugin, plugstack, line, replaced, policy_path, lua, notes)


def uninstall_plugin(site: Site) -> bool:
    """Remove the plugin's line from the site's plugstack.conf and the policy file (without it,
    job_submit.lua and the hooks refuse every fault); True if there was a plugstack line."""
    site_policy_path(site).unlink(missing_ok=True)
    if not site.slurm.plugstack_conf:
        raise ConfigError(
            str(site.path), "slurm.plugstack_conf", "no plugstack.conf to remove the plugin from"
        )
    path = Path(site.slurm.plugstack_conf)
    return update_plugstack(path, None) if path.exists() else False
