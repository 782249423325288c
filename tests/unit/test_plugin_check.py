"""`plugin check`: an installation in a temporary tree, each problem named, ownership faked.

Tests may run as root, so who owns a file is faked: the injected lstat reports uid 0 for every
path except those the test gives to a user; modes are the real ones (chmod in the tree).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from slurm_chaos import plugin_check as pc
from slurm_chaos.errors import UsageError
from slurm_chaos.faults import install_hooks
from slurm_chaos.faults.plugin_install import PluginArgs, plugstack_line, render_job_submit
from slurm_chaos.faults.policy import Policy, write_policy
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.site import load_site
from slurm_chaos.slurm.model import ClusterConfig
from slurm_chaos.slurm.step import StepRunner

DATA = Path(__file__).resolve().parents[1] / "data"
USER = 1000


@dataclass
class Install:
    """A complete, safe installation under `top`, and the ownership the fake lstat reports."""

    top: Path
    exp: pc.Expected
    owners: dict[str, int] = field(default_factory=dict)

    def p(self, rel: str) -> Path:
        return self.top / rel

    def give_to_user(self, rel: str) -> None:
        self.owners[str(self.p(rel))] = USER

    def files(self) -> pc.LocalFiles:
        def lstat(path: str) -> pc.Entry:
            st = os.lstat(path)
            return pc.Entry(self.owners.get(path, 0), st.st_gid, st.st_mode)

        return pc.LocalFiles(lstat)

    def run(self) -> pc.Report:
        files = self.files()
        return pc.audit(self.exp, files, {"node1": files})

    def problems(self) -> dict[tuple[str, str], pc.Finding]:
        return {(f.host, f.item): f for f in self.run().problems()}


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


GOOD = ClusterConfig(
    name="c",
    prolog_flags=("Alloc", "Contain"),
    proctrack_type="proctrack/cgroup",
    task_plugin=("task/cgroup", "task/affinity"),
    job_submit_plugins=("lua",),
)


@pytest.fixture
def inst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    top = tmp_path / "site"
    etc, src = top / "etc", top / "src"
    for d in (top, etc, src):
        d.mkdir(exist_ok=True)
        d.chmod(0o755)
    _write(src / "slurm_chaos" / "__init__.py", "")
    python = _write(top / "bin" / "python3", "#!/bin/sh\n", 0o755)
    monkeypatch.setattr(install_hooks, "import_root", lambda: src)
    policy = etc / "slurm-chaos-policy.toml"
    write_policy(policy, Policy(allow_users=("root", "alice")))
    journal, log = top / "journal", top / "log"
    journal.mkdir()
    log.mkdir()
    so = _write(top / "lib" / "slurm-chaos" / "slurm_chaos.so", "ELF", 0o755)
    _write(so.parent / pc.SHIM_FILE, "ELF", 0o755)
    line = plugstack_line(so, PluginArgs(str(policy), str(journal)))
    _write(etc / "plugstack.conf", f"# SPANK plugins\n{line}\n")
    _write(etc / "slurm.conf", "ClusterName=c\n")
    _write(etc / "job_submit.lua", render_job_submit(policy))
    for kind in ("prolog", "epilog"):
        _write(etc / kind, f'#!/bin/sh\nfor hook in {etc}/{kind}.d/*; do "$hook"; done\n', 0o755)
        text = install_hooks.render_hook(
            kind, str(python), journal, log / "agent.log", policy, log / "audit.log", 60, 45
        )
        _write(etc / f"{kind}.d" / install_hooks.HOOK_NAME, text, 0o755)
    config = replace(
        GOOD,
        slurm_conf=str(etc / "slurm.conf"),
        plugstack_conf=str(etc / "plugstack.conf"),
        prolog=str(etc / "prolog"),
        epilog=str(etc / "epilog"),
    )
    exp = pc.Expected(
        config=config,
        slurm_conf=str(etc / "slurm.conf"),
        policy=str(policy),
        plugstack=str(etc / "plugstack.conf"),
        hooks_dir=str(etc),
        journal_root=str(journal),
        audit_log=str(log / "audit.log"),
        agent_log=str(log / "agent.log"),
        heartbeat_dir=str(top / "heartbeat"),
        site_path="site.yaml",
    )
    return Install(top, exp)


def test_a_complete_installation_is_clean(inst: Install) -> None:
    report = inst.run()
    assert report.problems() == [] and report.ok and report.exit_code == 0
    items = {(f.host, f.item) for f in report.findings}
    for item in ("slurm.conf PrologFlags", "slurm.conf ProctrackType", "job_submit.lua content"):
        assert ("controller", item) in items
    for item in (
        "policy file",
        "policy parses",
        "plugstack.conf line",
        "plugin",
        "I/O shim",
        "slurm.conf Prolog",
        "prolog hook content",
        "prolog hook import root",
        "prolog hook interpreter",
        "epilog hook",
        "journal directory",
        "audit log directory",
        "heartbeat directory",
    ):
        assert ("node1", item) in items, item
    assert report.table().endswith("all OK")


def test_a_world_writable_policy_is_unsafe_on_every_host(inst: Install) -> None:
    inst.p("etc/slurm-chaos-policy.toml").chmod(0o666)
    bad = inst.problems()
    for host in ("controller", "node1"):
        f = bad[(host, "policy file")]
        assert f.status is pc.Status.UNSAFE and "writable by others (mode 666)" in f.detail
        assert f.path.endswith("slurm-chaos-policy.toml") and "chmod go-w" in f.fix
    assert inst.run().exit_code == 1


def test_a_policy_owned_by_a_user_or_in_a_users_directory_is_unsafe(inst: Install) -> None:
    inst.give_to_user("etc/slurm-chaos-policy.toml")
    f = inst.problems()[("node1", "policy file")]
    assert f"owned by uid {USER}, not root" in f.detail
    inst.owners.clear()
    inst.give_to_user("etc")
    f = inst.problems()[("node1", "policy file")]
    assert f.detail == f"{inst.p('etc')} is owned by uid {USER}, not root"


def test_a_group_writable_directory_above_the_policy_is_unsafe(inst: Install) -> None:
    inst.p("etc").chmod(0o775)
    f = inst.problems()[("node1", "policy file")]
    assert f.detail.startswith(f"{inst.p('etc')} is writable by group") and "775" in f.detail


def test_a_missing_or_malformed_policy_is_named(inst: Install) -> None:
    policy = inst.p("etc/slurm-chaos-policy.toml")
    policy.write_text("version = 1\nallow_users = root\n")
    f = inst.problems()[("node1", "policy parses")]
    assert "policy line 2" in f.detail and "every fault is refused" in f.detail
    policy.unlink()
    f = inst.problems()[("node1", "policy file")]
    assert f.status is pc.Status.MISSING and "plugin install --site site.yaml" in f.fix


def test_the_plugstack_line_removed_is_missing(inst: Install) -> None:
    _write(inst.p("etc/plugstack.conf"), "# nothing\n")
    f = inst.problems()[("node1", "plugstack.conf line")]
    assert f.status is pc.Status.MISSING and "no slurm_chaos.so line" in f.detail


def test_an_optional_line_or_extra_arguments_are_unsafe(inst: Install) -> None:
    conf = inst.p("etc/plugstack.conf")
    line = conf.read_text().splitlines()[1].replace("required", "optional") + " allow_users=*"
    _write(conf, line + "\n")
    f = inst.problems()[("node1", "plugstack.conf line")]
    assert "'optional' instead of 'required'" in f.detail
    assert "argument 'allow_users' is not one the plugin takes" in f.detail
    _write(conf, line.replace(f"policy={inst.exp.policy}", "policy=/tmp/mine.toml") + "\n")
    assert "expected policy=" in inst.problems()[("node1", "plugstack.conf line")].detail


def test_a_plugin_or_include_a_user_can_write_is_unsafe(inst: Install) -> None:
    inst.give_to_user("lib/slurm-chaos/slurm_chaos.so")
    assert "owned by uid 1000" in inst.problems()[("node1", "plugin")].detail
    inst.owners.clear()
    other = _write(inst.p("home/alice/plugstack.d/x.conf"), "optional /home/alice/x.so\n", 0o666)
    conf = inst.p("etc/plugstack.conf")
    conf.write_text(conf.read_text() + f"include {other.parent}/*.conf\n")
    f = inst.problems()[("node1", "plugstack include")]
    assert f.status is pc.Status.UNSAFE and str(other) in f.detail + f.path


def test_a_hook_running_code_from_a_user_writable_tree_is_unsafe(inst: Install) -> None:
    # The hook names an import root in a user's tree (as a checkout in a home directory would be).
    hook = inst.p("etc/prolog.d") / install_hooks.HOOK_NAME
    user_src = inst.p("home/alice/src")
    (user_src / "slurm_chaos").mkdir(parents=True)
    inst.give_to_user("home/alice")
    hook.write_text(hook.read_text().replace(str(inst.p("src")), str(user_src)))
    f = inst.problems()[("node1", "prolog hook import root")]
    assert f.detail == f"{inst.p('home/alice')} is owned by uid {USER}, not root"
    assert ("node1", "epilog hook import root") not in inst.problems()


def test_a_symlinked_import_root_is_followed_to_the_users_tree(inst: Install) -> None:
    user_src = inst.p("home/alice/src")
    (user_src / "slurm_chaos").mkdir(parents=True)
    inst.give_to_user("home/alice/src")
    src = inst.p("src")
    os.rename(src, inst.p("src.old"))
    src.symlink_to(user_src)
    f = inst.problems()[("node1", "prolog hook import root")]
    assert f.detail == f"{user_src} is owned by uid {USER}, not root"


def test_the_package_directory_itself_must_be_roots_alone(inst: Install) -> None:
    """A root-owned import root holding a package directory a user may change, or one that links
    into a user's tree, is root code from another user's hands."""
    inst.p("src/slurm_chaos").chmod(0o777)
    f = inst.problems()[("node1", "prolog hook import root")]
    assert f.status is pc.Status.UNSAFE and "slurm_chaos" in f.path + f.detail
    inst.p("src/slurm_chaos").chmod(0o755)
    user_pkg = inst.p("home/alice/slurm_chaos")
    user_pkg.mkdir(parents=True)
    (user_pkg / "__init__.py").write_text("")
    inst.give_to_user("home/alice")
    shutil.rmtree(inst.p("src/slurm_chaos"))
    inst.p("src/slurm_chaos").symlink_to(user_pkg)
    f = inst.problems()[("node1", "prolog hook import root")]
    assert f.status is pc.Status.UNSAFE and f"owned by uid {USER}" in f.detail


def test_a_file_inside_the_package_writable_by_others_is_unsafe(inst: Install) -> None:
    inst.p("src/slurm_chaos/__init__.py").chmod(0o666)
    f = inst.problems()[("node1", "prolog hook import root")]
    assert str(inst.p("src/slurm_chaos/__init__.py")) in f.detail and "chown -R root:root" in f.fix


def test_a_hook_without_python_I_or_absolute_tools_is_unsafe(inst: Install) -> None:
    hook = inst.p("etc/epilog.d") / install_hooks.HOOK_NAME
    text = hook.read_text().replace(" -I -c ", " -c ").replace("/usr/bin/timeout", "timeout")
    hook.write_text(text.replace("cd / || exit 0\n", "") + "export PYTHONPATH=/x\n")
    f = inst.problems()[("node1", "epilog hook content")]
    for why in ("python -I", "'timeout' without an absolute path", "cd /", "PYTHONPATH"):
        assert why in f.detail, why
    assert ("node1", "prolog hook content") not in inst.problems()


def test_a_hook_a_user_can_write_or_that_is_gone_is_named(inst: Install) -> None:
    hook = inst.p("etc/prolog.d") / install_hooks.HOOK_NAME
    hook.chmod(0o777)
    assert "writable by others" in inst.problems()[("node1", "prolog hook")].detail
    hook.unlink()
    assert inst.problems()[("node1", "prolog hook")].status is pc.Status.MISSING


def test_slurm_conf_prolog_must_run_our_hook(inst: Install) -> None:
    _write(inst.p("etc/prolog"), "#!/bin/sh\n/usr/local/sbin/site-prolog\n", 0o755)
    f = inst.problems()[("node1", "slurm.conf Prolog")]
    assert "our prolog hook never runs" in f.detail
    inst.exp = replace(inst.exp, config=replace(inst.exp.config, epilog=""))
    assert inst.problems()[("node1", "slurm.conf Epilog")].status is pc.Status.MISSING
    inst.exp = replace(inst.exp, config=replace(inst.exp.config, epilog=str(inst.p("etc/epilog"))))
    inst.p("etc/epilog").chmod(0o757)
    assert "writable by others" in inst.problems()[("node1", "slurm.conf Epilog")].detail


@pytest.mark.parametrize(
    ("change", "item", "words"),
    [
        ({"prolog_flags": ("Alloc",)}, "PrologFlags", "Contain"),
        ({"proctrack_type": "proctrack/linuxproc"}, "ProctrackType", "proctrack/cgroup"),
        ({"task_plugin": ("task/affinity",)}, "TaskPlugin", "task/cgroup"),
        ({"job_submit_plugins": ()}, "JobSubmitPlugins", "lua"),
    ],
)
def test_each_slurm_setting_the_trust_model_needs(inst: Install, change: dict, item: str, words: str) -> None:  # type: ignore[type-arg]
    inst.exp = replace(inst.exp, config=replace(inst.exp.config, **change))
    bad = inst.problems()
    assert list(bad) == [("controller", f"slurm.conf {item}")]
    f = bad[("controller", f"slurm.conf {item}")]
    assert words in f.detail and f.path == inst.exp.slurm_conf and "restart slurmctld" in f.fix


def test_job_submit_lua_must_be_ours_as_rendered(inst: Install) -> None:
    lua = inst.p("etc/job_submit.lua")
    lua.write_text(lua.read_text().replace("return slurm.SUCCESS", "return slurm.SUCCESS -- edited", 1))
    assert (
        "differs from what plugin install renders"
        in inst.problems()[("controller", "job_submit.lua content")].detail
    )
    lua.write_text("function slurm_job_submit(d, p, u) return slurm.SUCCESS end\n")
    f = inst.problems()[("controller", "job_submit.lua calls ours")]
    assert "does not load" in f.detail and "dofile(" in f.fix
    assert inst.problems()[("controller", "job_submit.lua")].status is pc.Status.MISSING  # ours beside it


def test_writable_journal_and_log_directories_are_unsafe(inst: Install) -> None:
    inst.p("journal").chmod(0o777)
    assert "writable by others" in inst.problems()[("node1", "journal directory")].detail
    inst.p("journal").chmod(0o755)
    inst.p("log").rmdir()  # root creates it on first use: fine while its parent is root's
    assert inst.run().ok
    inst.p("heartbeat").mkdir()
    inst.give_to_user("heartbeat")
    assert "owned by uid 1000" in inst.problems()[("node1", "heartbeat directory")].detail


def test_an_unreachable_node_is_missing_and_the_json_says_so(inst: Install) -> None:
    report = pc.audit(inst.exp, inst.files(), {"node2": "the slurmd of sandbox node node2 is not running"})
    data = json.loads(report.to_json())
    assert data["ok"] is False and report.exit_code == 1
    row = next(r for r in data["findings"] if r["host"] == "node2")
    assert row["status"] == "MISSING" and "not running" in row["detail"] and row["fix"]


def test_the_table_names_the_path_and_the_fix(inst: Install) -> None:
    inst.p("etc/slurm-chaos-policy.toml").chmod(0o646)
    table = inst.run().table()
    line = next(x for x in table.splitlines() if "UNSAFE" in x and x.startswith("node1"))
    assert "policy file" in line and str(inst.p("etc/slurm-chaos-policy.toml")) in line
    assert "fix: chown root:root" in table and table.endswith("items UNSAFE or MISSING")


# ------------------------------------------------------------------ reading another host's files


def test_runner_files_read_a_node_with_stat_readlink_cat_and_find() -> None:
    def answer(argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("stat", "-c", "%u %g %f %n"):
            known = {"/": "0 0 41ed /", "/etc": "0 0 41ed /etc", "/etc/p": "1000 0 81b6 /etc/p"}
            out = "".join(known[p] + "\n" for p in argv[4:] if p in known)
            return Completed(argv, 0 if len(out.splitlines()) == len(argv) - 4 else 1, out, "")
        if argv[0] == "cat":
            return Completed(argv, 0, "text", "")
        return Completed(argv, 1, "", "no")

    runner = FakeRunner(answer)
    files = pc.RunnerFiles(runner)
    found, _ = pc.check_root_path(files, "n", "x", "/etc/p", "fix")
    assert found.detail == "owned by uid 1000, not root" and found.path == "/etc/p"
    assert runner.calls[0] == ("stat", "-c", "%u %g %f %n", "--", "/", "/etc", "/etc/p")
    assert len([c for c in runner.calls if c[0] == "stat"]) == 1  # the walk asked once
    assert files.read("/etc/p") == "text" and files.readlink("/etc/p") is None
    missing, _ = pc.check_root_path(files, "n", "x", "/etc/q", "fix")
    assert missing.status is pc.Status.MISSING and missing.detail == "/etc/q does not exist"


def test_srun_runner_runs_each_command_as_one_task_on_the_node() -> None:
    runner = FakeRunner(lambda argv: Completed(argv, 0, "0\n", ""))
    files = pc.RunnerFiles(StepRunner(runner, "gpu7", ("--partition=p", "--reservation=maint")))
    assert files.reach() is None
    assert runner.calls[0] == (
        "srun",
        "--nodelist=gpu7",
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
        "--partition=p",
        "--reservation=maint",
        "--",
        "stat",
        "-c",
        "%u",
        "--",
        "/",
    )
    down = pc.RunnerFiles(FakeRunner(lambda argv: Completed(argv, 1, "", "srun: error: Unable to allocate")))
    assert down.reach() == "srun: error: Unable to allocate"


def test_parse_stat_keeps_names_with_spaces() -> None:
    entries = pc.parse_stat("0 0 41ed /a b\n1000 1000 a1ff /l\ngarbage\n")
    assert entries["/a b"].is_dir and entries["/l"].is_link and entries["/l"].uid == 1000


def test_nodes_default_to_the_sites_and_unknown_ones_are_refused() -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    every = pc.site_nodes(site, None)
    assert every and pc.site_nodes(site, [every[0]]) == [every[0]]
    with pytest.raises(UsageError, match="nodeX not in any partition"):
        pc.site_nodes(site, ["nodeX"])


def test_cli_unknown_node_exits_2(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(yaml.safe_load((DATA / "sites" / "golden.yaml").read_text())))
    done = subprocess.run(
        [sys.executable, "-m", "slurm_chaos", "plugin", "check", "--site", str(site), "--nodes", "nodeX"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--nodes: nodeX not in any partition" in done.stderr


def test_every_hook_plugin_install_writes_passes_the_content_check(tmp_path: Path) -> None:
    from slurm_chaos.observe import healthcheck as hc

    site = load_site(DATA.parent.parent / "site_configs" / "h100-ib-example.yaml")
    hc.install_healthcheck(tmp_path, site, heartbeats=tmp_path / "hb")
    install_hooks.install_hooks(tmp_path, sys.executable, journal_root=tmp_path / "j")
    hooks = [
        tmp_path / "healthcheck.d" / pc.HEALTHCHECK_HOOK,
        *(
            tmp_path / f"{kind}.d" / name
            for kind in ("prolog", "epilog")
            for name in (pc.HEARTBEAT_HOOK, install_hooks.HOOK_NAME)
        ),
    ]
    for hook in hooks:
        text = hook.read_text()
        assert pc.hook_content_problems(text) == [], hook
        assert pc.python_of(text) == sys.executable
        assert pc.import_root_of(text) == str(install_hooks.import_root())


def test_a_hook_pointing_at_another_policy_or_journal_is_unsafe(inst: Install) -> None:
    hook = inst.p("etc/prolog.d") / install_hooks.HOOK_NAME
    hook.write_text(hook.read_text().replace(inst.exp.policy, "/home/alice/policy.toml"))
    f = inst.problems()[("node1", "prolog hook content")]
    assert f"--policy /home/alice/policy.toml, expected {inst.exp.policy}" in f.detail


def test_check_site_reads_slurm_settings_from_scontrol_and_each_node_through_srun() -> None:
    """A real site (no sandbox): slurmctld's settings through the scheduler, a node through srun
    in the site's partition and reservation; a node srun cannot reach is MISSING, not skipped."""
    config = (DATA / "slurm-22.05" / "scontrol_show_config.txt").read_text()

    def answer(argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("scontrol", "show", "config"):
            return Completed(argv, 0, config, "")
        if "--nodelist=n02" in argv:
            return Completed(argv, 1, "", "srun: error: Unable to allocate resources: Invalid node name")
        if argv[-5:] == ("stat", "-c", "%u", "--", "/"):
            return Completed(argv, 0, "0\n", "")  # n01 is reachable, and has none of the files
        return Completed(argv, 1, "", "")

    runner = FakeRunner(answer)
    report = pc.check_site(DATA / "sites" / "golden.yaml", ["n01", "n02"], runner)
    assert report.exit_code == 1
    bad = {(f.host, f.item): f for f in report.problems()}
    assert "Contain" in bad[("controller", "slurm.conf PrologFlags")].detail  # PrologFlags=Alloc there
    assert "proctrack/linuxproc" in bad[("controller", "slurm.conf ProctrackType")].detail
    assert bad[("n02", "node reachable")].detail.endswith("Invalid node name")
    # PreemptMode read from the recorded config; the partitions were not listed, and it says so.
    preempt = next(f for f in report.findings if f.item == "slurm.conf PreemptMode")
    assert preempt.status is pc.Status.OK and preempt.detail.startswith(
        "PreemptMode=OFF, PreemptType=preempt/none"
    )
    assert "could not be listed" in preempt.detail
    assert bad[("n01", "policy file")].status is pc.Status.MISSING
    assert bad[("n01", "policy file")].path == "/etc/slurm/slurm-chaos-policy.toml"
    srun = [c for c in runner.calls if c[0] == "srun" and "--nodelist=n01" in c]
    assert srun and all("--partition=batch" in c and "--reservation=maint" in c for c in srun)


# ------------------------------------------------------------------------------ #27 acceptance


def test_a_world_writable_plugstack_conf_is_named(inst: Install) -> None:
    inst.p("etc/plugstack.conf").chmod(0o666)
    f = inst.problems()[("node1", "plugstack.conf")]
    assert (
        f.status is pc.Status.UNSAFE and "writable by others (mode 666)" in f.detail and "chmod go-w" in f.fix
    )


def test_a_root_owned_link_to_a_users_file_is_named_wherever_it_is(inst: Install) -> None:
    """Every link and its target, and the directories on the way, must be root's (#27 finding 15):
    for the files root reads, and for what is under the import root's package and an include glob."""
    # plugstack.conf itself: a root-owned link into a user's directory.
    mine = _write(inst.p("home/alice/plugstack.conf"), inst.p("etc/plugstack.conf").read_text())
    inst.give_to_user("home/alice")
    inst.p("etc/plugstack.conf").unlink()
    inst.p("etc/plugstack.conf").symlink_to(mine)
    f = inst.problems()[("node1", "plugstack.conf")]
    assert f.status is pc.Status.UNSAFE and f"{inst.p('home/alice')} is owned by uid {USER}" in f.detail
    inst.p("etc/plugstack.conf").unlink()
    _write(inst.p("etc/plugstack.conf"), mine.read_text())
    assert ("node1", "plugstack.conf") not in inst.problems()
    # A root-owned link inside the package, to a module the user writes: root imports it.
    evil = _write(inst.p("home/alice/evil.py"), "import os\n")
    (inst.p("src/slurm_chaos") / "faults.py").symlink_to(evil)
    f = inst.problems()[("node1", "prolog hook import root")]
    assert f.status is pc.Status.UNSAFE
    assert f"{inst.p('src/slurm_chaos/faults.py')} -> {evil}" in f.detail
    assert f"{inst.p('home/alice')} is owned by uid {USER}" in f.detail
    # A root-owned link to a root-owned file in a root-owned directory is fine.
    (inst.p("src/slurm_chaos") / "faults.py").unlink()
    (inst.p("src/slurm_chaos") / "faults.py").symlink_to(inst.p("src/slurm_chaos/__init__.py"))
    assert ("node1", "prolog hook import root") not in inst.problems()
    # An include glob whose directory holds a root-owned link to the user's file.
    conf = inst.p("etc/plugstack.conf")
    conf.write_text(conf.read_text() + f"include {inst.p('etc/plugstack.d')}/*.conf\n")
    inst.p("etc/plugstack.d").mkdir()
    (inst.p("etc/plugstack.d") / "site.conf").symlink_to(mine)
    f = inst.problems()[("node1", "plugstack include")]
    assert f.status is pc.Status.UNSAFE and f.path == str(inst.p("etc/plugstack.d/site.conf"))


def test_runner_files_list_links_for_their_chain_to_be_judged() -> None:
    seen: list[tuple[str, ...]] = []

    def answer(argv: tuple[str, ...]) -> Completed:
        seen.append(argv)
        return Completed(argv, 0, "/pkg/link.py\n", "")

    assert pc.RunnerFiles(FakeRunner(answer)).unsafe_below("/pkg") == ["/pkg/link.py"]
    assert seen[0] == (
        "find", "/pkg", "-mindepth", "1", "(", "!", "-uid", "0", "-o", "-type", "l", "-o",
        "-perm", "/022", ")", "-print",
    )  # fmt: skip


def test_a_partition_that_preempts_by_suspension_is_named_with_the_fix(inst: Install) -> None:
    """#27 finding 12: a suspended job runs no epilog while the preempting job gets the node."""
    item = ("controller", "slurm.conf PreemptMode")
    assert item not in inst.problems()
    suspending = replace(inst.exp.config, preempt_mode="SUSPEND,GANG", preempt_type="preempt/partition_prio")
    inst.exp = replace(inst.exp, config=suspending, partitions=(("debug", ""), ("batch", "REQUEUE")))
    f = inst.problems()[item]
    assert f.status is pc.Status.UNSAFE
    assert (
        f.detail.startswith("debug (PreemptMode=SUSPEND,GANG) preempt by suspension")
        and "batch" not in f.detail
    )
    assert "PreemptMode=REQUEUE" in f.fix and "allowed_partitions" in f.fix
    # The policy keeps to the partition that requeues: nothing to fear.
    inst.exp = replace(inst.exp, allowed_partitions=("batch",))
    assert item not in inst.problems()
    # Partitions not listed: the cluster-wide mode is judged, and it says so.
    inst.exp = replace(inst.exp, partitions=None, allowed_partitions=None)
    assert "(the partitions could not be listed: cluster-wide)" in inst.problems()[item].detail
    # PreemptMode=SUSPEND without a preemption plugin suspends nothing; GANG alone does (time-slicing).
    none = replace(suspending, preempt_mode="SUSPEND", preempt_type="preempt/none")
    inst.exp = replace(inst.exp, config=none, partitions=(("debug", ""),))
    assert item not in inst.problems()
    inst.exp = replace(inst.exp, partitions=(("debug", "GANG"),))
    assert "debug (PreemptMode=GANG)" in inst.problems()[item].detail


def test_partition_modes_are_read_from_an_images_slurm_conf() -> None:
    text = (
        "PreemptMode=SUSPEND,GANG\n"
        "PartitionName=DEFAULT PreemptMode=REQUEUE  # the site's default\n"
        "PartitionName=batch Nodes=n[1-4]\n"
        "partitionname=gpu Nodes=g1 PreemptMode=SUSPEND\n"
        "NodeName=n1 CPUs=4\n"
    )
    assert pc.partition_modes(text) == {"batch": "REQUEUE", "gpu": "SUSPEND"}


def test_partition_preempt_modes_are_read_from_recorded_scontrol_output() -> None:
    from slurm_chaos.slurm.parse import parse_scontrol_partitions

    parts = parse_scontrol_partitions(
        (DATA / "slurm-22.05" / "scontrol_show_partition_oneliner.txt").read_text()
    )
    assert parts and all(p.preempt_mode == "OFF" for p in parts.values())
