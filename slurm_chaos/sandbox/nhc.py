"""LBNL NHC as the sandbox nodes' health check (`slurm-chaos sandbox up --health nhc`).

A site runs NHC as Slurm's ``HealthCheckProgram``; slurm-chaos must judge the site's monitoring,
so the sandbox can run the real thing instead of slurm-chaos's own health check. NHC is not
packaged by Debian and is not shipped with slurm-chaos: a copy (BSD licence) is taken from
``../shared/thirdparty/lbnl-nhc`` beside the checkout (or $SLURM_CHAOS_NHC_DIR) and installed into
the sandbox's own directory (``<root>/nhc``), never system-wide.

The sandbox's ``HealthCheckProgram`` (``etc/healthcheck``) becomes a two-line wrapper that execs
NHC with the sandbox's config directory, helpers, log and per-node result file (slurmd runs a
program without arguments); ``--health slurm-chaos`` puts the hook dispatcher back. Nothing else
changes: slurm.conf, the interval and slurm-chaos's exporter stay as they are.

The config (``nhc.conf``) holds the checks a site typically enables: filesystems mounted and with
space free (the checkpoint volume included), processes, load and memory. Sandbox nodes share one
kernel, so some inputs are the same on every node; where a node has its own, the config uses it:

- the checkpoint volume: ``check_fs_free`` on every filesystem mounted at or below the checkpoint
  root in the node's own mount namespace (``check_fs_free_below``, a site-local NHC check in
  ``scripts/sandbox_site.nhc``: NHC's own ``check_fs_free`` on each mount point it finds). A fault
  that fills a job's checkpoint volume mounts it there, on that node only;
- the node's own TmpFS directory (``<root>/tmp/<node>``), one config line per node (NHC's host
  match);
- the load average and free memory are the machine's (``/proc`` is shared): their limits are set
  for the whole machine, so that a busy machine does not drain every node at once.

On a failed check NHC drains the node through ``scontrol`` with a reason starting ``NHC:`` and
resumes only nodes it drained itself (its helpers ``node-mark-offline``/``node-mark-online``).
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from slurm_chaos.errors import UsageError
from slurm_chaos.sandbox.layout import Layout

HEALTH_MODES = ("slurm-chaos", "nhc")
#: The first line of the wrapper after the shebang: how `health_mode` tells the mode.
WRAPPER_MARK = "# slurm-chaos sandbox: LBNL NHC as the HealthCheckProgram"
#: What NHC may take before its watchdog kills it; well inside the sandbox's check interval.
NHC_TIMEOUT_S = 20
#: Minimum free space on the checkpoint volume(s), as a site would set it.
CHECKPOINT_MIN_FREE = "10%"
#: The 1-minute load average limit per CPU of the machine (the sandbox nodes share its kernel).
LOAD_PER_CPU = 16

SITE_CHECKS = r"""# sandbox_site.nhc - a site-local NHC check of the slurm-chaos sandbox (by slurm-chaos).
#
# check_fs_free_below ROOT MIN_FREE
#   NHC's own check_fs_free on every filesystem mounted at ROOT or below it (in this node's mount
#   namespace): a site whose checkpoint volumes are mounted per job under one root checks them all.

function check_fs_free_below() {
    local ROOT="${1%/}" MIN_FREE="$2" i

    if [[ ${#DF_DEV[*]} -eq 0 ]]; then
        nhc_fs_df_gather_data
    fi
    for ((i=0; i < ${#DF_DEV[*]}; i++)); do
        if [[ "${DF_MNTPT[$i]}" == "$ROOT" || "${DF_MNTPT[$i]}" == "$ROOT/"* ]]; then
            check_fs_free "${DF_MNTPT[$i]}" "$MIN_FREE" || return 1
        fi
    done
    return 0
}
"""


def nhc_source() -> Path | None:
    """The LBNL NHC tree to install from: $SLURM_CHAOS_NHC_DIR, else ``../shared/thirdparty/lbnl-nhc``
    beside the checkout; None when neither holds NHC's driver."""
    env = os.environ.get("SLURM_CHAOS_NHC_DIR")
    repo = Path(__file__).resolve().parents[2]
    for candidate in ([Path(env)] if env else []) + [repo.parent / "shared" / "thirdparty" / "lbnl-nhc"]:
        if (candidate / "nhc").is_file() and (candidate / "scripts").is_dir():
            return candidate
    return None


def nhc_dir(layout: Layout) -> Path:
    return layout.root / "nhc"


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (its nearest existing ancestor's)."""
    p = path
    while not p.exists():
        p = p.parent
    p = p.resolve()
    while not os.path.ismount(p):
        p = p.parent
    return p


#: Daemons every node needs (munged is the machine's, shared by the sandbox nodes).
SERVICES = ("munged",)


def nhc_conf(
    layout: Layout, checkpoint_root: Path, cpus: int | None = None, services: tuple[str, ...] = SERVICES
) -> str:
    """The sandbox's nhc.conf: the checks a site typically enables, per-node inputs where nodes have them."""
    cpus = cpus or os.cpu_count() or 1
    shared = _mount_point(layout.shared_dir)
    lines = [
        f'# NHC config of the slurm-chaos sandbox "{layout.name}" (written by `slurm-chaos sandbox up`',
        "# --health nhc; edits are overwritten). Lines: HOSTMASK || CHECK.",
        f"* || export TIMEOUT={NHC_TIMEOUT_S}",
        "### Filesystems",
        "* || check_fs_mount_rw -f /",
        # The shared filesystem (job output, checkpoints): the host's, so a low bar.
        f"* || check_fs_free {shlex.quote(str(shared))} 1%",
        "# The checkpoint volume(s): every filesystem mounted under the checkpoint root on this node.",
        f"* || check_fs_free_below {shlex.quote(str(checkpoint_root))} {CHECKPOINT_MIN_FREE}",
        "### Processes",
        # No owner (-u): the machine's munged may run under another name for munge's uid.
        *(f"* || check_ps_service {svc}" for svc in services),
        "### Load and memory: the machine's (sandbox nodes share one kernel), limits for all of it",
        f"* || check_ps_loadavg {LOAD_PER_CPU * cpus}",
        "* || check_hw_mem_free 1mb",
        "### Per node: each node's own TmpFS directory",
    ]
    for node in layout.node_names():
        lines.append(f"{node} || check_file_test -d -w {shlex.quote(str(layout.root / 'tmp' / node))}")
    return "\n".join(lines) + "\n"


def wrapper(layout: Layout, slurm_conf: Path | None = None) -> str:
    """etc/healthcheck in NHC mode: exec the installed NHC with the sandbox's paths (per-node result file)."""
    from slurm_chaos.faults.install_hooks import SYSTEM_PATH

    d = nhc_dir(layout)
    conf = slurm_conf or layout.slurm_conf
    args = [
        str(d / "sbin" / "nhc"),
        "-D",
        str(d / "etc"),
        "NHC_RM=slurm",
        f"HELPERDIR={d / 'helpers'}",
        f"LOGFILE={layout.log_dir / 'nhc.log'}",
    ]
    return (
        "#!/bin/bash\n"
        f"{WRAPPER_MARK} (written by `slurm-chaos sandbox up --health nhc`).\n"
        "# NHC drains with reason 'NHC: ...'; slurm-chaos's health check hooks "
        f"({layout.etc / 'healthcheck.d'}) do not run.\n"
        "cd / || exit 0\n"
        f"export PATH={SYSTEM_PATH} SLURM_CONF={shlex.quote(str(conf))}\n"
        'node="$(cat /proc/sys/kernel/hostname)"\n'
        # slurmd passes no arguments; a test may add NHC variables (ONLINE_NODE=: ...).
        f'exec {shlex.join(args)} RESULTFILE={shlex.quote(str(d / "run"))}/"$node".status "$@"\n'
    )


def install_nhc(layout: Layout, checkpoint_root: Path | None = None) -> Path:
    """Copy NHC into ``<root>/nhc`` with the sandbox's nhc.conf; returns the wrapper's future text's
    program (``<root>/nhc/sbin/nhc``). UsageError when no NHC is at hand."""
    src = nhc_source()
    if src is None:
        raise UsageError(
            "--health nhc: LBNL NHC not found (put it at ../shared/thirdparty/lbnl-nhc beside the "
            "checkout or set SLURM_CHAOS_NHC_DIR; it is not shipped with slurm-chaos)"
        )
    d = nhc_dir(layout)
    for sub in ("sbin", "helpers", "etc/scripts", "run"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "nhc", d / "sbin" / "nhc")
    for helper in (src / "helpers").iterdir():
        shutil.copy2(helper, d / "helpers" / helper.name)
    for script in (src / "scripts").glob("*.nhc"):
        shutil.copy2(script, d / "etc" / "scripts" / script.name)
    for doc in ("LICENSE", "COPYING", "UPSTREAM"):
        if (src / doc).is_file():
            shutil.copy2(src / doc, d / doc)
    (d / "etc" / "scripts" / "sandbox_site.nhc").write_text(SITE_CHECKS)
    ckpt = checkpoint_root or layout.shared_dir / "checkpoints"
    (d / "etc" / "nhc.conf").write_text(nhc_conf(layout, ckpt))
    for prog in (d / "sbin" / "nhc", *(d / "helpers").iterdir()):
        prog.chmod(0o755)
    return d / "sbin" / "nhc"


def health_mode(layout: Layout) -> str:
    """Which health check the sandbox's HealthCheckProgram runs now: "nhc" or "slurm-chaos"."""
    try:
        head = (layout.etc / "healthcheck").read_text().splitlines()[:2]
    except OSError:
        return "slurm-chaos"
    return "nhc" if any(line.startswith(WRAPPER_MARK) for line in head) else "slurm-chaos"


def write_nhc_wrapper(layout: Layout) -> Path:
    """Point the sandbox's HealthCheckProgram at NHC (installed first); returns etc/healthcheck."""
    install_nhc(layout)
    hook = layout.etc / "healthcheck"
    tmp = hook.with_name(".healthcheck.tmp")
    tmp.write_text(wrapper(layout))
    tmp.chmod(0o755)
    tmp.replace(hook)
    return hook
