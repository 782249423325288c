"""``plugin install --root DIR``: everything a node needs, written into a node image's tree.

Each file lands at DIR + its path; every path written into a file is the booted node's; nothing
outside DIR changes; a symlink in the image is followed as the node would follow it (an absolute
target from DIR) and one that climbs out of DIR refuses the install before anything is written.
``plugin check --root DIR`` then audits the image as it audits a node.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from slurm_chaos import plugin_check as pc
from slurm_chaos.cli import main
from slurm_chaos.errors import UsageError
from slurm_chaos.faults.install_hooks import HOOK_NAME
from slurm_chaos.faults.install_root import InstallRoot
from slurm_chaos.faults.policy import parse_policy
from slurm_chaos.install import Installed, install_site, written_paths
from slurm_chaos.observe.healthcheck import CONFIG_NAME, HEARTBEAT_HOOK_NAME
from slurm_chaos.resources import import_root
from slurm_chaos.runner import Completed, FakeRunner, Runner, SubprocessRunner
from slurm_chaos.site import load_site

REPO = Path(__file__).resolve().parents[2]
#: A real cluster's site: /etc/slurm, plugstack.conf.d/slurm-chaos.conf, the default journal.
SITE = REPO / "site_configs" / "h100-ib-example.yaml"
PLUGSTACK = "/etc/slurm/plugstack.conf.d/slurm-chaos.conf"
LIBDIR = "/usr/local/lib/slurm-chaos"
POLICY = "/etc/slurm/slurm-chaos-policy.toml"
JOURNAL = "/var/lib/slurm-chaos/journal"

#: (node path, mode) of every file the install writes for SITE.
FILES = {
    POLICY: 0o644,
    "/etc/slurm/job_submit.lua": 0o644,
    PLUGSTACK: 0o644,
    f"{LIBDIR}/slurm_chaos.so": 0o755,
    f"{LIBDIR}/libslurm_chaos_io.so": 0o755,
    f"/etc/slurm/{CONFIG_NAME}": 0o644,
    f"/etc/slurm/healthcheck.d/{HOOK_NAME}": 0o755,
    **{
        f"/etc/slurm/{kind}.d/{name}": 0o755
        for kind in ("prolog", "epilog")
        for name in (HOOK_NAME, HEARTBEAT_HOOK_NAME)
    },
}


def _fake_make(argv: list[str]) -> Completed:
    """``make install`` as the Makefiles do it: the library at DESTDIR + PREFIX/lib/slurm-chaos."""
    words = dict(w.split("=", 1) for w in argv if "=" in w)
    lib = "slurm_chaos.so" if Path(argv[2]).name == "spank_plugin" else "libslurm_chaos_io.so"
    out = Path(words["DESTDIR"] + words["PREFIX"]) / "lib" / "slurm-chaos" / lib
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"\x7fELF fake " + lib.encode())
    return Completed(argv, 0, "", "")


def _image(tmp_path: Path) -> Path:
    image = tmp_path / "image"
    image.mkdir(mode=0o755)
    image.chmod(0o755)
    return image


def _host_state(paths: list[str]) -> dict[str, tuple[bool, float]]:
    """Whether each path exists on this machine, and when it last changed."""
    return {p: (os.path.lexists(p), os.lstat(p).st_mtime if os.path.lexists(p) else 0.0) for p in paths}


def _tree(top: Path) -> dict[str, int]:
    """Every entry under `top` (node paths) with its mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out["/" + str(p.relative_to(top))] = p.lstat().st_mode
    return out


def _install(image: Path, monkeypatch: pytest.MonkeyPatch, runner: Runner | None = None) -> Installed:
    monkeypatch.delenv("SLURM_CHAOS_HEARTBEAT_DIR", raising=False)
    return install_site(SITE, "/usr/local", image, runner or FakeRunner(_fake_make))


def test_a_missing_root_or_a_file_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    for bad, why in ((tmp_path / "nope", "does not exist"), (tmp_path / "file", "is not a directory")):
        assert main(["plugin", "install", "--site", str(SITE), "--root", str(bad)]) == 2
        assert f"--root: {bad} {why}" in capsys.readouterr().err
        assert main(["plugin", "check", "--site", str(SITE), "--root", str(bad)]) == 2
        assert f"--root: {bad} {why}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_every_file_lands_under_the_root_with_its_mode_and_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    before = _host_state([*FILES, JOURNAL, "/etc/slurm", LIBDIR])
    umask = os.umask(0o002)  # a lax umask: root still gets directories only it may write
    try:
        done = _install(image, monkeypatch)
    finally:
        os.umask(umask)
    tree = _tree(image)
    files = {p: m for p, m in tree.items() if stat.S_ISREG(m)}
    assert sorted(files) == sorted(FILES)
    for path, mode in FILES.items():
        assert stat.S_IMODE(files[path]) == mode, path
        if os.geteuid() == 0:
            assert (image / path.lstrip("/")).stat().st_uid == 0, path
    assert stat.S_ISDIR(tree[JOURNAL])
    assert all(stat.S_IMODE(m) & 0o022 == 0 for m in tree.values())  # no directory others may write
    # Nothing outside the image: this machine's /etc/slurm and /usr/local are as they were.
    assert _host_state([*FILES, JOURNAL, "/etc/slurm", LIBDIR]) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image"]
    # What the command prints names the node's paths.
    assert done.lines()[0] == f"into image {image} (paths are the node's)"
    assert (
        f"{PLUGSTACK}: required {LIBDIR}/slurm_chaos.so policy={POLICY} journal_dir={JOURNAL}" in done.lines()
    )
    assert str(tmp_path) not in "\n".join(done.lines()[1:])


def test_every_path_written_into_a_file_is_the_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image = _image(tmp_path)
    _install(image, monkeypatch)
    for path in FILES:
        text = (image / path.lstrip("/")).read_bytes().decode("utf-8", "replace")
        assert str(tmp_path) not in text and str(image) not in text, path
    plugstack = (image / PLUGSTACK.lstrip("/")).read_text()
    assert plugstack == f"required {LIBDIR}/slurm_chaos.so policy={POLICY} journal_dir={JOURNAL}\n"
    assert f'local POLICY_PATH = "{POLICY}"' in (image / "etc/slurm/job_submit.lua").read_text()
    assert parse_policy((image / POLICY.lstrip("/")).read_text()).allow_users == ("sre-bot",)
    for kind in ("prolog", "epilog"):
        for name in (HOOK_NAME, HEARTBEAT_HOOK_NAME):
            text = (image / f"etc/slurm/{kind}.d/{name}").read_text()
            assert pc.hook_content_problems(text) == []
            assert pc.python_of(text) == sys.executable and pc.import_root_of(text) == str(import_root())
        options = pc.hook_options((image / f"etc/slurm/{kind}.d/{HOOK_NAME}").read_text())
        assert options["--policy"] == POLICY and options["--journal-root"] == JOURNAL


def test_the_notes_name_what_the_image_lacks_and_its_own_copy_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    notes = _install(image, monkeypatch).notes
    assert any(f"the image has no {sys.executable}" in n for n in notes)
    assert any(f"the image has no {import_root()}" in n for n in notes)
    # Run from a copy inside the image, the hooks name that copy as the node sees it.
    monkeypatch.setattr(sys, "executable", str(image / "opt/venv/bin/python3"))
    inside = image / "opt/venv/lib/site-packages"
    monkeypatch.setattr("slurm_chaos.faults.install_hooks.import_root", lambda: inside)
    (inside / "slurm_chaos").mkdir(parents=True)
    (image / "opt/venv/bin").mkdir(parents=True)
    (image / "opt/venv/bin/python3").write_text("#!/bin/sh\n")
    again = _install(image, monkeypatch)
    assert not any("the image has no" in n for n in again.notes)
    hook = (image / f"etc/slurm/prolog.d/{HOOK_NAME}").read_text()
    assert pc.python_of(hook) == "/opt/venv/bin/python3"
    assert pc.import_root_of(hook) == "/opt/venv/lib/site-packages"


def test_a_symlink_that_climbs_out_of_the_image_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (image / "etc").mkdir()
    (image / "etc/slurm").symlink_to("../../outside")  # from DIR/etc: up to tmp_path, out of DIR
    runner = FakeRunner(_fake_make)
    with pytest.raises(
        UsageError, match=r"the symlink /etc/slurm -> \.\./\.\./outside climbs out of the image"
    ):
        _install(image, monkeypatch, runner)
    assert runner.calls == [] and list(outside.iterdir()) == []
    assert set(_tree(image)) == {"/etc", "/etc/slurm"}
    assert main(["plugin", "install", "--site", str(SITE), "--root", str(image)]) == 2


def test_an_absolute_symlink_is_followed_from_the_images_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    (image / "etc").mkdir()
    (image / "etc/slurm").symlink_to("/srv/slurm-etc")  # on this machine: nothing there
    (image / "srv/slurm-etc").mkdir(parents=True)
    # A link where a file goes is replaced, never written through (here: to the image's passwd).
    (image / "srv/slurm-etc/job_submit.lua").symlink_to("/etc/passwd")
    _install(image, monkeypatch)
    assert not os.path.lexists("/srv/slurm-etc")
    assert (image / "etc/slurm").is_symlink()
    assert (image / "srv/slurm-etc" / "slurm-chaos-policy.toml").is_file()
    assert not (image / "srv/slurm-etc/job_submit.lua").is_symlink() and not (image / "etc/passwd").exists()
    assert (image / "srv/slurm-etc" / PLUGSTACK.removeprefix("/etc/slurm/")).is_file()
    root = InstallRoot.at(image)
    assert root.host(POLICY) == image / "srv/slurm-etc/slurm-chaos-policy.toml"


def test_written_paths_are_every_file_the_install_writes() -> None:
    site = load_site(SITE)
    paths = {str(p) for p in written_paths(site, "/usr/local")}
    assert set(FILES) | {JOURNAL} <= paths


def _complete(image: Path) -> None:
    """What the image holds besides our files: its slurm.conf and Prolog/Epilog dispatchers, and the
    interpreter and slurm_chaos the hooks run, root's."""
    etc = image / "etc/slurm"
    (etc / "slurm.conf").write_text(
        "ClusterName=h100-prod  # the site's\nProlog=/etc/slurm/prolog\nEpilog=/etc/slurm/epilog\n"
    )
    for kind in ("prolog", "epilog"):
        (etc / kind).write_text(f'#!/bin/sh\nfor hook in /etc/slurm/{kind}.d/*; do "$hook"; done\n')
        (etc / kind).chmod(0o755)
    python = image / sys.executable.lstrip("/")
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    package = image / str(import_root()).lstrip("/") / "slurm_chaos"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")


@pytest.mark.skipif(os.geteuid() != 0, reason="the audit wants root's files")
def test_plugin_check_root_audits_the_image_as_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    image = _image(tmp_path)
    _install(image, monkeypatch)
    _complete(image)
    report = pc.check_image(SITE, image)
    assert report.problems() == [] and {f.host for f in report.findings} == {pc.IMAGE}
    items = {f.item for f in report.findings}
    assert {"policy file", "plugstack.conf line", "plugin", "I/O shim", "prolog hook content"} <= items
    assert main(["plugin", "check", "--site", str(SITE), "--root", str(image)]) == 0
    capsys.readouterr()
    # A hook others may write, and a link out of the image where the plugin should be.
    (image / f"etc/slurm/prolog.d/{HOOK_NAME}").chmod(0o777)
    so = image / LIBDIR.lstrip("/") / "slurm_chaos.so"
    so.unlink()
    so.symlink_to(tmp_path / "elsewhere.so")  # absolute: read from the image's root, not this machine
    (tmp_path / "elsewhere.so").write_text("ELF")
    problems = {f.item: f for f in pc.check_image(SITE, image).problems()}
    assert (
        problems["prolog hook"].status is pc.Status.UNSAFE
        and "writable by others" in problems["prolog hook"].detail
    )
    assert problems["plugin"].status is pc.Status.MISSING
    assert f"--root {image}" in problems["plugin"].fix
    assert main(["plugin", "check", "--site", str(SITE), "--root", str(image), "--json"]) == 1


def test_check_root_and_nodes_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plugin", "check", "--site", str(SITE), "--root", "/", "--nodes", "n1"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.spawns
def test_the_plugin_is_built_here_and_copied_into_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    before = _host_state([f"{LIBDIR}/slurm_chaos.so", f"{LIBDIR}/libslurm_chaos_io.so"])
    done = _install(image, monkeypatch, SubprocessRunner())
    for lib in ("slurm_chaos.so", "libslurm_chaos_io.so"):
        built = image / LIBDIR.lstrip("/") / lib
        assert built.read_bytes()[:4] == b"\x7fELF" and stat.S_IMODE(built.stat().st_mode) == 0o755
    assert done.plugin.plugin_path == Path(LIBDIR) / "slurm_chaos.so"
    assert _host_state([f"{LIBDIR}/slurm_chaos.so", f"{LIBDIR}/libslurm_chaos_io.so"]) == before


# --------------------------------------------------------------------------------- whose tree (#27 6)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="ownership: only root can give a tree to a user")
USER = 4242  # no one's: a user who built the image


@root_only
def test_a_tree_not_roots_refuses_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rootless or CI-built image: its owner could swap any directory while root writes."""
    image = _image(tmp_path)
    os.chown(image, USER, USER)
    runner = FakeRunner(_fake_make)
    why = rf"--root: {image}: {image} is owned by uid {USER}, not root: refused"
    with pytest.raises(UsageError, match=why):
        _install(image, monkeypatch, runner)
    assert runner.calls == [] and _tree(image) == {}
    assert main(["plugin", "install", "--site", str(SITE), "--root", str(image)]) == 2
    assert f"is owned by uid {USER}, not root" in capsys.readouterr().err
    # plugin check --root audits it all the same, and names it.
    found = {f.item: f for f in pc.check_image(SITE, image).problems()}["image root"]
    assert found.status is pc.Status.UNSAFE and f"{image} is owned by uid {USER}, not root" in found.detail
    # Root's, but a directory above it is the user's: they may rename the image away and put
    # their own tree (or a link to this machine's /etc) in its place.
    os.chown(image, 0, 0)
    os.chown(tmp_path, USER, USER)
    with pytest.raises(UsageError, match=rf"{tmp_path} is owned by uid {USER}, not root"):
        _install(image, monkeypatch, runner)
    assert _tree(image) == {}


@root_only
def test_a_directory_written_that_others_may_write_refuses_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    (image / "etc/slurm").mkdir(parents=True)
    (image / "etc/slurm").chmod(0o777)
    with pytest.raises(UsageError, match=r"/etc/slurm is writable by group or others \(mode 777\): refused"):
        _install(image, monkeypatch)
    assert list((image / "etc/slurm").iterdir()) == []
    (image / "etc/slurm").chmod(0o755)
    os.chown(image / "etc/slurm", USER, USER)
    with pytest.raises(UsageError, match=rf"/etc/slurm is owned by uid {USER}, not root: refused"):
        _install(image, monkeypatch)
    assert list((image / "etc/slurm").iterdir()) == []


@root_only
def test_a_link_swapped_into_a_user_writable_image_tree_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user who may write etc/slurm swaps epilog.d for a link to this machine's directory
    between the install's look at it and its write: root's write stays inside the image."""
    from slurm_chaos.faults import install_hooks as hooks_module

    image = _image(tmp_path)
    outside = tmp_path / "host-etc"  # stands for the build host's /etc
    outside.mkdir()
    (image / "etc/slurm/epilog.d").mkdir(parents=True)
    (image / "etc/slurm").chmod(0o777)  # a rootless-built subtree, only passed through
    render = hooks_module.render_hook

    def render_then_swap(kind: str, *args: object, **kwargs: object) -> str:
        text = render(kind, *args, **kwargs)  # type: ignore[arg-type]
        if kind == "epilog":
            (image / "etc/slurm/epilog.d").rename(image / "etc/slurm/old-epilog.d")
            (image / "etc/slurm/epilog.d").symlink_to(outside)
        return text

    monkeypatch.setattr(hooks_module, "render_hook", render_then_swap)
    hooks_module.install_hooks(
        Path("/etc/slurm"), "/usr/bin/python3", journal_root=Path(JOURNAL), root=InstallRoot.at(image)
    )
    assert list(outside.iterdir()) == [], "root wrote through the link onto this machine"
    # Followed as the booted node would: from the image's root, into the image.
    landed = image / str(outside).lstrip("/") / HOOK_NAME
    assert landed.is_file() and stat.S_IMODE(landed.stat().st_mode) == 0o755
