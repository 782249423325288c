"""`plugin check` on the real sandbox: clean after `plugin install`, and every problem of a
deliberately unsafe installation named, read on each node through its own mount namespace.

The unsafe installation is a copy of the sandbox's etc directory (its paths rewritten to the
copy): the policy and job_submit.lua world-writable, our plugstack.conf line removed, the prolog
hook's import root moved into an unprivileged user's tree, and the Slurm settings as slurmctld
would report them from a slurm.conf whose PrologFlags lack Contain.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sandbox_cli import cli

from slurm_chaos import plugin_check as pc
from slurm_chaos.faults.install_hooks import HOOK_NAME
from slurm_chaos.faults.plugin_install import update_plugstack
from slurm_chaos.runner import SubprocessRunner
from slurm_chaos.sandbox.layout import site_placeholders
from slurm_chaos.site import load_site
from slurm_chaos.slurm.backend import make_scheduler

if TYPE_CHECKING:
    from tests.conftest import SandboxHandle, SandboxUser

pytestmark = pytest.mark.sandbox

CGROUP_ITEMS = {"slurm.conf PrologFlags", "slurm.conf ProctrackType", "slurm.conf TaskPlugin"}


def _has_cgroup_plugins(slurm_conf: Path) -> bool:
    """Whether the sandbox runs Slurm's cgroup plugins: until it does, a fresh install is (rightly)
    UNSAFE on ProctrackType, TaskPlugin and PrologFlags."""
    return re.search(r"(?m)^ProctrackType=proctrack/cgroup\s*$", slurm_conf.read_text()) is not None


@pytest.fixture(autouse=True, scope="module")
def _installed(sandbox: SandboxHandle, chaos_site: Path) -> None:
    """`plugin install` again: modules before this one remove the node hooks they installed."""
    from slurm_chaos.cli import main

    prefix = sandbox.shared_dir.parent / "prefix"
    assert main(["plugin", "install", "--site", str(chaos_site), "--prefix", str(prefix)]) == 0


def test_a_fresh_install_has_no_problem_but_the_cgroup_settings(
    sandbox: SandboxHandle, chaos_site: Path
) -> None:
    """Everything `plugin install` sets up is clean; only the cgroup settings of a sandbox brought
    up without Slurm's cgroup plugins (proctrack/cgroup, task/cgroup, Contain) may be reported."""
    report = pc.check_site(chaos_site)
    print(report.table())
    hosts = {f.host for f in report.findings}
    assert hosts == {"controller", *sandbox.nodes}
    allowed = set() if _has_cgroup_plugins(sandbox.slurm_conf) else CGROUP_ITEMS
    other = [f for f in report.problems() if f.item not in allowed]
    assert other == [], report.table()
    for node in sandbox.nodes:  # each node was really read (its namespace), item by item
        items = {f.item for f in report.findings if f.host == node}
        assert {"policy file", "plugstack.conf line", "plugin", "prolog hook import root"} <= items


def test_a_fresh_install_is_clean(sandbox: SandboxHandle, chaos_site: Path) -> None:
    if not _has_cgroup_plugins(sandbox.slurm_conf):
        pytest.skip(
            "sandbox brought up with SLURM_CHAOS_SANDBOX_CGROUPS=0: its cgroup settings are "
            "reported unsafe (the test above checks that they are the only problems)"
        )
    done = cli("plugin", "check", "--site", str(chaos_site), env=sandbox.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("all OK")
    done = cli(
        "plugin", "check", "--site", str(chaos_site), "--json", "--nodes", sandbox.nodes[0], env=sandbox.env
    )
    assert done.returncode == 0 and '"ok": true' in done.stdout


@pytest.fixture
def unsafe_copy(sandbox: SandboxHandle, chaos_site: Path) -> Iterator[Path]:
    """A relocated copy of the installation: <sandbox root>/unsafe/{etc,journal,log}."""
    root = sandbox.slurm_conf.parent.parent
    copy = root / "unsafe"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root / "etc", copy / "etc", symlinks=True)
    for sub in ("journal", "log"):
        (copy / sub).mkdir(mode=0o755)
    for path in (copy / "etc").rglob("*"):
        if path.is_file() and not path.is_symlink():
            text = path.read_text(errors="surrogateescape")
            if str(root) in text:
                path.write_text(text.replace(f"{root}/", f"{copy}/"), errors="surrogateescape")
    yield copy
    shutil.rmtree(copy, ignore_errors=True)


def test_an_unsafe_install_names_each_problem(
    sandbox: SandboxHandle,
    chaos_site: Path,
    sandbox_users: dict[str, SandboxUser],
    unsafe_copy: Path,
) -> None:
    etc = unsafe_copy / "etc"
    user = sandbox_users["chaosok"]
    # 1. the policy and job_submit.lua writable by anyone
    (etc / "slurm-chaos-policy.toml").chmod(0o666)
    (etc / "job_submit.lua").chmod(0o666)
    # 2. our plugstack.conf line gone
    assert update_plugstack(etc / "plugstack.conf", None)
    # 3. the prolog hook runs code from a tree the user owns
    user_src = user.home / "src"
    (user_src / "slurm_chaos").mkdir(parents=True, exist_ok=True)
    os.chown(user_src, user.uid, user.gid)
    hook = etc / "prolog.d" / HOOK_NAME
    text = hook.read_text()
    import_root = pc.import_root_of(text)
    assert import_root, text
    # The import root alone, not paths below it (the interpreter may be a venv in the checkout).
    hook.write_text(re.sub(re.escape(import_root) + r"(?![\w./-])", str(user_src), text))
    assert pc.import_root_of(hook.read_text()) == str(user_src)
    assert pc.python_of(hook.read_text()) == pc.python_of(text)
    # 4. PrologFlags without Contain, as slurmctld reports a slurm.conf that has only Alloc
    site = load_site(chaos_site, site_placeholders)
    site = dataclasses.replace(
        site,
        slurm=dataclasses.replace(
            site.slurm,
            conf=str(etc / "slurm.conf"),
            plugstack_conf=str(etc / "plugstack.conf"),
            hooks_dir=str(etc),
        ),
    )
    runner = SubprocessRunner(base_env=site.slurm_env())
    live = make_scheduler(sandbox.env, runner).cluster_config()
    config = dataclasses.replace(
        live,
        slurm_conf=str(etc / "slurm.conf"),
        plugstack_conf=str(etc / "plugstack.conf"),
        prolog=str(etc / "prolog"),
        epilog=str(etc / "epilog"),
        prolog_flags=("Alloc",),
    )
    exp = pc.expected(site, config)
    assert exp.policy == str(etc / "slurm-chaos-policy.toml") and exp.journal_root == str(
        unsafe_copy / "journal"
    )
    nodes = {n: pc.node_access(site, n, runner) for n in sandbox.nodes}
    report = pc.audit(exp, pc.LocalFiles(), nodes)

    assert report.exit_code == 1
    named = {(f.host, f.item): f for f in report.problems()}
    expected = {
        ("controller", "slurm.conf PrologFlags"),
        ("controller", "policy file"),
        ("controller", "job_submit.lua"),
    }
    if not _has_cgroup_plugins(sandbox.slurm_conf):
        expected |= {("controller", "slurm.conf ProctrackType"), ("controller", "slurm.conf TaskPlugin")}
    for node in sandbox.nodes:
        expected |= {(node, "policy file"), (node, "plugstack.conf line"), (node, "prolog hook import root")}
    assert set(named) == expected, report.table()
    assert "Contain" in named[("controller", "slurm.conf PrologFlags")].detail
    node = sandbox.nodes[-1]
    assert "writable by others (mode 666)" in named[(node, "policy file")].detail
    assert named[(node, "plugstack.conf line")].status is pc.Status.MISSING
    # the first directory on the way that the user owns: their home
    assert (
        named[(node, "prolog hook import root")].detail == f"{user.home} is owned by uid {user.uid}, not root"
    )
    assert "writable by others (mode 666)" in named[("controller", "job_submit.lua")].detail
