"""Install what a host needs: ``slurm-chaos plugin install --site S [--prefix P] [--root DIR]``.

On this machine (no ``--root``): the policy and job_submit.lua beside slurm.conf, the SPANK plugin
and I/O shim built and installed under the prefix, their plugstack.conf line, the prolog/epilog
hooks, the heartbeat hooks and the health check hook (``faults.plugin_install``,
``faults.install_hooks``, ``observe.healthcheck``). With ``--root DIR`` the same files land under
a node image's tree, naming the booted node's paths (``faults.install_root``): nothing outside DIR
is written, no daemon is told, no Slurm command runs. Every destination is resolved inside the
image before the first file is written, so a symlink that climbs out of it refuses the whole
install.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from slurm_chaos.faults.install_hooks import (
    HOOK_NAME,
    install_site_hooks,
    node_code_root,
    site_journal_root,
)
from slurm_chaos.faults.install_root import LIVE, InstallRoot
from slurm_chaos.faults.plugin_install import (
    JOB_SUBMIT_LUA,
    OWN_LUA,
    PLUGIN_FILE,
    SHIM_FILE,
    InstallResult,
    install_plugin,
    site_policy_path,
)
from slurm_chaos.observe.healthcheck import CONFIG_NAME, HEARTBEAT_HOOK_NAME, install_healthcheck
from slurm_chaos.observe.healthcheck import HOOK_NAME as HEALTH_HOOK_NAME
from slurm_chaos.runner import Runner, SubprocessRunner
from slurm_chaos.site import Site


@dataclass(frozen=True)
class Installed:
    """What :func:`install_site` did; every path is the node's."""

    root: InstallRoot
    plugin: InstallResult
    hooks: tuple[Path, ...]
    health_check: Path | None
    notes: tuple[str, ...]

    def lines(self) -> list[str]:
        """What the command prints: one line per thing installed, then the notes."""
        r = self.plugin
        head = [f"into image {self.root.path} (paths are the node's)"] if self.root.is_image else []
        return [
            *head,
            f"installed {r.plugin_path}",
            f"policy {r.policy_path}",
            f"job_submit/lua {r.job_submit}",
            f"{r.plugstack_path}: {r.line}",
            *(f"hook {path}" for path in self.hooks),
            *([f"health check {self.health_check}"] if self.health_check else []),
            *(f"NOTE: {note}" for note in self.notes),
        ]


def written_paths(site: Site, prefix: Path | str) -> list[PurePosixPath]:
    """Every path `plugin install` may write for this site (or read beside what it writes), as the
    node sees it: checked inside an image before anything is written."""
    etc = site_policy_path(site).parent
    libdir = PurePosixPath(prefix) / "lib" / "slurm-chaos"
    paths = [
        PurePosixPath(site_policy_path(site)),
        PurePosixPath(etc / JOB_SUBMIT_LUA),
        PurePosixPath(etc / OWN_LUA),
        PurePosixPath(etc / "slurm.conf"),
        libdir / PLUGIN_FILE,
        libdir / SHIM_FILE,
        PurePosixPath(site_journal_root(site)),
    ]
    if site.slurm.plugstack_conf:
        paths.append(PurePosixPath(site.slurm.plugstack_conf))
    if site.slurm.hooks_dir:
        hooks = PurePosixPath(site.slurm.hooks_dir)
        paths += [hooks / CONFIG_NAME, hooks / "healthcheck.d" / HEALTH_HOOK_NAME]
        for kind in ("prolog", "epilog"):
            paths += [hooks / f"{kind}.d" / HOOK_NAME, hooks / f"{kind}.d" / HEARTBEAT_HOOK_NAME]
    return paths


def image_notes(root: InstallRoot) -> tuple[str, ...]:
    """What an image lacks that its hooks will run: the interpreter and the slurm_chaos package."""
    if not root.is_image:
        return ()
    notes = []
    python, code = root.python(), node_code_root(root)
    if root.missing(python):
        notes.append(f"the image has no {python}, the interpreter the hooks run: install it there")
    if root.missing(code):
        notes.append(
            f"the image has no {code}, the slurm_chaos the hooks import: install slurm-chaos there "
            "(as root), or run plugin install --root with the slurm-chaos installed in the image"
        )
    notes.append(
        "the plugin was built against this machine's Slurm headers: the image must run the same Slurm release"
    )
    return tuple(notes)


def install_site(
    site_path: Path | str,
    prefix: Path | str = "/usr/local",
    root_dir: Path | str | None = None,
    runner: Runner | None = None,
) -> Installed:
    """Install everything for the site on this machine, or under the node image `root_dir`
    (UsageError naming --root for a directory that is not one, or a path that leaves it)."""
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    root = InstallRoot.at(root_dir) if root_dir is not None else LIVE
    site = load_site(site_path, site_placeholders)
    for path in written_paths(site, prefix):
        root.host(path)
    journal = str(site_journal_root(site))
    result = install_plugin(site, prefix, runner or SubprocessRunner(), journal_dir=journal, root=root)
    hooks = install_site_hooks(site, root.python(), root)
    health = None
    if site.slurm.hooks_dir:
        health = install_healthcheck(Path(site.slurm.hooks_dir), site, root=root)
    return Installed(root, result, tuple(hooks), health, result.notes + image_notes(root))
