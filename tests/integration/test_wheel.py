"""slurm-chaos as a new admin installs it: an sdist, a wheel built from it, a clean venv, no checkout.

The sdist is built from a copy of this tree and the wheel from the sdist (what ``python -m build``
does), so a file missing from either fails here. The venv reuses the installed dependencies
(``--system-site-packages``) but slurm-chaos itself comes from the wheel, and every command runs
in a directory outside the checkout without PYTHONPATH. The shipped sandbox site config is used
by name against a sandbox layout written under a temporary sandboxes root: its placeholders
resolve as on a machine where the sandbox is up, and nothing touches a real cluster.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Top-level directories of the repository that the wheel carries as slurm_chaos/<dir>/.
MAPPED = ("sbatch_templates", "site_configs", "spank_plugin", "preload")
SANDBOX = "whl"


@dataclass(frozen=True)
class Installed:
    sdist: Path
    wheel: Path
    venv: Path
    package: Path  # slurm_chaos/ as the venv's python imports it
    env: dict[str, str]  # for the venv's commands: no PYTHONPATH, the temporary sandbox
    sandbox_root: Path
    cwd: Path  # outside the checkout

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(self.venv / "bin" / "slurm-chaos"), *args], cwd=self.cwd, env=self.env)


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"{result.args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _tracked(*dirs: str) -> list[str]:
    out = _ok(_run(["git", "-C", str(REPO), "ls-files", "--", *dirs])).stdout.split()
    assert out, dirs
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    junk = (".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "runs")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*junk, "*.o", "*.so"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    build_sdist = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = _ok(_run([sys.executable, "-c", build_sdist, str(work / "sdist")], cwd=src, env=env))
    sdist = work / "sdist" / name.stdout.split()[-1]
    wheel_dir = work / "wheel"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(wheel_dir), str(sdist)], cwd=work, env=env))  # fmt: skip
    (wheel,) = wheel_dir.glob("slurm_chaos-*.whl")
    venv = work / "venv"
    # No pip of its own: this interpreter's pip installs into it (--python). The installed
    # dependencies are reached through a .pth naming this environment's site directories, whether it
    # is the system's or a venv itself (--system-site-packages would see only the base interpreter's);
    # a directory named in a .pth has its own .pth files ignored, so no editable install leaks in.
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)]))
    python = str(venv / "bin" / "python")
    purelib = _ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]))
    purelib_dir = Path(purelib.stdout.strip())
    (purelib_dir / "_installed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _ok(_run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
              "--force-reinstall", "--no-index", str(wheel)], cwd=work, env=env))  # fmt: skip
    cwd = work / "admin"
    cwd.mkdir()
    where = _ok(_run([python, "-c", "import slurm_chaos; print(slurm_chaos.__file__)"], cwd=cwd, env=env))
    sandbox_root = work / "sandboxes"
    env = {**env, "SLURM_CHAOS_SANDBOX_ROOT": str(sandbox_root), "SLURM_CHAOS_SANDBOX": SANDBOX}
    save = f"from slurm_chaos.sandbox.layout import Layout; Layout({SANDBOX!r}, 9, 4, 'host').save()"
    _ok(_run([python, "-c", save], cwd=cwd, env=env))
    (sandbox_root / SANDBOX / "etc").mkdir()  # as `sandbox up` leaves it
    package = Path(where.stdout.strip()).parent
    return Installed(sdist, wheel, venv, package, env, sandbox_root, cwd)


def test_sdist_carries_the_sources_and_no_build_outputs(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as tar:
        top = installed.sdist.name.removesuffix(".tar.gz")
        names = {n.removeprefix(f"{top}/") for n in tar.getnames()}
    expected = _tracked(*MAPPED, "slurm_chaos", "setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in")
    assert not set(expected) - names
    assert {"spank_plugin/plugin.c", "spank_plugin/Makefile", "preload/slurm_chaos_io.c"} <= names
    assert not [n for n in names if n.endswith((".o", ".so", ".pyc")) or "/build/" in n]


def test_wheel_carries_the_shipped_directories_inside_the_package(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    shipped = [f for f in _tracked(*MAPPED) if not Path(f).name.startswith(".")]
    assert not {f"slurm_chaos/{f}" for f in shipped} - names
    data = _tracked("slurm_chaos/suites", "slurm_chaos/experiments", "slurm_chaos/schemas")
    assert not set(data) - names
    assert not [n for n in names if n.endswith((".o", ".so")) or "/build/" in n]
    assert not [n for n in names if n.split("/")[0] in MAPPED]  # only inside the package


def test_the_package_is_the_venvs_not_the_checkout(installed: Installed) -> None:
    assert installed.package.is_relative_to(installed.venv)
    assert not installed.package.is_relative_to(REPO)
    assert (installed.package / "spank_plugin" / "plugin.c").is_file()


def test_experiments_lists_the_library(installed: Installed) -> None:
    out = _ok(installed.cli("experiments")).stdout
    listed = {line.split()[0] for line in out.splitlines()}
    assert listed == {p.stem for p in (REPO / "slurm_chaos" / "experiments").glob("*.yaml")}


def test_campaign_dry_run_of_the_maintenance_suite_on_the_shipped_sandbox_site(installed: Installed) -> None:
    out = _ok(installed.cli("campaign", "--site", "sandbox", "--suite", "maintenance", "--dry-run")).stdout
    assert f"({installed.package / 'site_configs' / 'sandbox.yaml'})" in out.splitlines()[0]
    suite = yaml.safe_load((REPO / "slurm_chaos" / "suites" / "maintenance.yaml").read_text())
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(suite["experiments"]) <= rows
    assert not (installed.cwd / "runs").exists()  # a dry run submits and writes nothing


def test_render_writes_both_job_scripts(installed: Installed) -> None:
    out = installed.cwd / "render"
    _ok(installed.cli("render", "--site", "sandbox", "--experiment", "checkpoint-eio", "--out", str(out)))
    ckpt = installed.sandbox_root / SANDBOX / "shared" / "checkpoints" / "dry-run" / "checkpoint-eio"
    fault = (out / "fault.sbatch").read_text()
    assert f"#SBATCH --chaos=ckpt-eio:path={ckpt / 'fault'}\n" in fault
    assert "--chaos" not in (out / "baseline.sbatch").read_text()
    assert os.access(out / "fault.sbatch", os.X_OK) and (out / "baseline").is_dir()


@pytest.mark.skipif(
    shutil.which("make") is None
    or shutil.which("cc") is None
    or not Path("/usr/include/slurm/spank.h").exists(),
    reason="needs make, a C compiler and spank.h (libslurm-dev)",
)
def test_plugin_install_builds_from_the_shipped_sources(installed: Installed) -> None:
    prefix = installed.cwd / "prefix"
    _ok(installed.cli("plugin", "install", "--site", "sandbox", "--prefix", str(prefix)))
    lib = prefix / "lib" / "slurm-chaos"
    assert (lib / "slurm_chaos.so").is_file() and (lib / "libslurm_chaos_io.so").is_file()
    root = installed.sandbox_root / SANDBOX
    (line,) = (root / "etc" / "plugstack.conf").read_text().splitlines()
    policy = root / "etc" / "slurm-chaos-policy.toml"
    assert line == f"required {lib / 'slurm_chaos.so'} policy={policy} journal_dir={root / 'journal'}"
    assert 'allow_users = ["root"' in policy.read_text()  # the shipped sandbox.yaml's safety section
    assert f'local POLICY_PATH = "{policy}"' in (root / "etc" / "job_submit.lua").read_text()
    prolog = (root / "etc" / "prolog.d" / "50-slurm-chaos").read_text()
    assert f"{installed.venv / 'bin' / 'python'} -I -c " in prolog
    assert "sys.path.insert(0, " in prolog and str(installed.package.parent) in prolog
    assert str(REPO) not in prolog
    assert (root / "etc" / "epilog.d" / "50-slurm-chaos").is_file()
    assert (root / "etc" / "healthcheck.d" / "50-slurm-chaos").is_file()
    # Built out of tree: the installed sources stay as shipped.
    for d in ("spank_plugin", "preload"):
        assert not (installed.package / d / "build").exists()
