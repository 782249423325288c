"""Write the prolog and epilog hooks of node-level faults into a site's hook directories.

The site's dispatchers (``Prolog=<etc>/prolog`` running every executable of ``<etc>/prolog.d/``,
and the same for the epilog) run ``prolog.d/50-slurm-chaos`` and ``epilog.d/50-slurm-chaos``.
Each hook is a few lines of shell run as root in slurmd's environment: it starts from ``/`` with
a fixed PATH and absolute tool paths, returns at once when there is nothing to do (the node holds
nothing of slurm-chaos newer than its last tidy state, and the prolog's job cannot be granted
anything: no policy file, or a user the policy does not name; the epilog's job has no journal and
no grant file), else runs the Python hook isolated (``python -I``: no PYTHON* variables, neither
the current directory nor user site-packages on sys.path) and bounded by ``timeout``. It exits 0
unless an undo was left undone (:mod:`slurm_chaos.faults.hooks`): then 1, with the node drained
(``slurm-chaos: undo failed: ...``), so that a node still holding a fault leaves service.

The Python code the hooks run as root is the installer's own (its import root), so that
directory and every directory above it must be root's and writable by nobody else. Into a node
image (an :class:`InstallRoot` of ``--root DIR``) the hooks name the interpreter and import root
as the booted node sees them: the image's own copy when this slurm-chaos runs from inside the
image's tree, else the same paths as here (the image must then hold them there too).
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_chaos.errors import ConfigError
from slurm_chaos.faults.agent import DEFAULT_DEADLINE_S
from slurm_chaos.faults.authz import DEFAULT_AUDIT_LOG, GRANT_SUFFIX
from slurm_chaos.faults.cleanup import TIDY_NAME
from slurm_chaos.faults.hooks import EXIT_UNDO_FAILED, UNDO_FAILED
from slurm_chaos.faults.install_root import LIVE, InstallRoot
from slurm_chaos.faults.journal import DEFAULT_ROOT
from slurm_chaos.faults.policy import POLICY_NAME
from slurm_chaos.resources import import_root
from slurm_chaos.site import Site

HOOK_NAME = "50-slurm-chaos"
DEFAULT_LOG = Path("/var/log/slurm-chaos/agent.log")
#: Below the sandbox dispatcher's 60 s per hook, so our own timeout (and its log line) comes first.
DEFAULT_TIMEOUT_S = 45
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# The hooks' shortcut (a few microseconds of shell for most jobs). SLURM_JOB_UID, SLURM_JOB_USER,
# SLURM_JOB_ID and SLURMD_NODENAME come from slurmd. The Python side decides; this only skips.
# Both run Python while the node holds a journal or grant newer than its last tidy state
# (cleanup.TIDY_NAME; or it was never tidied), so that stale leftovers are reverted in the prolog
# and epilog of whatever job runs next, not only of a chaos job. Besides, the prolog runs Python
# for a job whose user a root-owned policy may name (or "*", or root's job), else only to tidy
# (--tidy-only); the epilog for the job's own journal or grant.
_TIDY = r"""case "${{SLURM_JOB_ID:-x}}" in *[!0-9]*|"") exit 0 ;; esac
node_dir={journal_root}/"${{SLURMD_NODENAME:-none}}"
own="$node_dir/$SLURM_JOB_ID"
stale=
if [ -d "$node_dir" ]; then
  if [ ! -e "$node_dir/{tidy}" ] || [ -n "$({find_bin} "$node_dir" -maxdepth 1 -newer "$node_dir/{tidy}" \
    \( -name '*.jsonl' -o -name '*{grant}' \) -print -quit)" ]; then stale=1; fi
fi"""
_GUARD = {
    "prolog": _TIDY
    + """
tidy_only=
if [ ! -f {policy} ] || [ ! -O {policy} ]; then
  tidy_only=--tidy-only
elif [ "${{SLURM_JOB_UID:-x}}" != 0 ]; then
  grep -qF -e "\\"${{SLURM_JOB_USER:-/}}\\"" -e "\\"${{SLURM_JOB_UID:-/}}\\"" -e '"*"' {policy} ||
    tidy_only=--tidy-only
fi
[ -z "$tidy_only" ] || [ -n "$stale" ] || exit 0""",
    "epilog": _TIDY
    + """
tidy_only=
[ -e "$own.jsonl" ] || [ -e "$own{grant}" ] || [ -n "$stale" ] || exit 0""",
}

# Exit status: 0, except where the Python hook left an undo undone (it drained the node and said
# why) or the epilog of a job with a journal ran out of time (its undo may not have finished):
# then 1, so that slurmd reports the hook failed. Any other failure of the hook's own exits 0.
_TEMPLATE = """#!/bin/sh
# slurm-chaos {kind} hook, written by slurm_chaos.faults.install_hooks: {what}
# Time-bounded and idempotent. It fails (and the node is drained) only when an undo is left undone:
# its own failure otherwise never drains the node.
cd / || exit 0
PATH={path}
export PATH
{guard}
{timeout_bin} -k 5 {timeout} {python} -I -c {bootstrap} {kind} $tidy_only \\
  --journal-root {journal_root} --log-file {log_file} --deadline {deadline} \\
  --policy {policy} --audit-log {audit_log}{roots_arg}
rc=$?
[ "$rc" -eq 0 ] && exit 0
[ "$rc" -eq {undo_failed_rc} ] && exit 1
{timed_out}msg="slurm-chaos: {kind} hook exited $rc for job ${{SLURM_JOB_ID:-?}} on ${{SLURMD_NODENAME:-?}}"
echo "$msg" >&2
echo "$msg" >> {log_file} 2>/dev/null
exit 0
"""

# The epilog of a job with a journal that `timeout` stopped (124, or 137 after -k): its undo may
# not have finished, so the node is drained as for a failed undo.
_TIMED_OUT = {
    "prolog": "",
    "epilog": """if {{ [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }} && [ -e "$own.jsonl" ]; then
  msg="{undo_failed}: the epilog hook ran out of time ({timeout}s, exit $rc) for job $SLURM_JOB_ID"
  echo "$msg" >&2
  echo "$msg" >> {log_file} 2>/dev/null
  {scontrol_bin} update NodeName="${{SLURMD_NODENAME:-?}}" State=DRAIN Reason="$msg" >/dev/null 2>&1
  exit 1
fi
""",
}

_WHAT = {
    "prolog": "authorises the job from trusted facts, then applies its node-level faults.",
    "epilog": "undoes the job's faults and removes its grant; reverts this node's stale leftovers.",
}

# -I leaves the script's own directory off sys.path too; the import root is put first explicitly.
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from slurm_chaos.faults.hooks.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


def render_hook(
    kind: str,
    python: str,
    journal_root: Path,
    log_file: Path,
    policy: Path,
    audit_log: Path,
    deadline_s: float,
    timeout_s: int,
    ckpt_roots: Sequence[str] = (),
    code_root: Path | str | None = None,
) -> str:
    """Text of one hook script (kind: prolog or epilog); `code_root`: the import root the node runs
    (default: this slurm_chaos's)."""
    q = shlex.quote
    return _TEMPLATE.format(
        kind=kind,
        what=_WHAT[kind],
        path=SYSTEM_PATH,
        guard=_GUARD[kind].format(
            policy=q(str(policy)),
            journal_root=q(str(journal_root)),
            grant=GRANT_SUFFIX,
            tidy=TIDY_NAME,
            find_bin=q(shutil.which("find", path=SYSTEM_PATH) or "/usr/bin/find"),
        ),
        timeout_bin=q(shutil.which("timeout", path=SYSTEM_PATH) or "/usr/bin/timeout"),
        timed_out=_TIMED_OUT[kind].format(
            undo_failed=UNDO_FAILED,
            timeout=int(timeout_s),
            log_file=q(str(log_file)),
            scontrol_bin=q(shutil.which("scontrol", path=SYSTEM_PATH) or "/usr/bin/scontrol"),
        ),
        undo_failed_rc=EXIT_UNDO_FAILED,
        timeout=int(timeout_s),
        python=q(python),
        bootstrap=q(_BOOTSTRAP.format(root=str(code_root or import_root()))),
        journal_root=q(str(journal_root)),
        log_file=q(str(log_file)),
        deadline=f"{deadline_s:g}",
        policy=q(str(policy)),
        audit_log=q(str(audit_log)),
        roots_arg="".join(f" --ckpt-root {q(root)}" for root in ckpt_roots) if kind == "prolog" else "",
    )


def unsafe_for_root(path: Path) -> str | None:
    """Why root should not run code from `path`: it, or a directory above it, is not root's or is
    writable by others (a root-owned sticky directory such as /tmp is fine). None if safe."""
    for p in [path, *path.parents]:
        try:
            st = p.stat()
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0:
            return f"{p} is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not (sticky and p != path):
            return f"{p} is writable by group or others (mode {st.st_mode & 0o7777:o})"
    return None


def unsafe_code_for_root(root: Path) -> str | None:
    """Why root should not run the slurm_chaos package under import root `root`: `root`, the
    package directory itself (followed to where it really is) or anything in it is not root's or
    is writable by others, or links to something that is. None if safe."""
    why = unsafe_for_root(root)
    if why:
        return why
    package = (root / "slurm_chaos").resolve()
    why = unsafe_for_root(package)
    if why:
        return why
    for dirpath, dirnames, filenames in os.walk(package):
        for name in [*dirnames, *filenames]:
            entry = Path(dirpath) / name
            try:
                st = entry.lstat()
            except OSError as exc:
                return f"{entry}: {exc.strerror}"
            if stat.S_ISLNK(st.st_mode):
                why = unsafe_for_root(entry.resolve())
                if why:
                    return f"{entry} links to code that is not root's alone: {why}"
            elif st.st_uid != 0:
                return f"{entry} is owned by uid {st.st_uid}, not root"
            elif st.st_mode & 0o022:
                return f"{entry} is writable by group or others (mode {st.st_mode & 0o7777:o})"
    return None


def node_code_root(root: InstallRoot = LIVE) -> str:
    """The import root hooks written under `root` run, as the node sees it."""
    return root.node(import_root())


def refuse_unsafe_code(what: str, root: InstallRoot = LIVE) -> None:
    """ConfigError when, running as root, the code that hooks written now would run as root (this
    package, from its import root) is not root's alone. Under an image, its copy of that code is
    checked where it has one (``plugin check --root`` audits it either way)."""
    if os.geteuid() != 0:
        return
    node_root = node_code_root(root)
    if root.missing(node_root):
        return
    where = root.host(node_root)
    why = unsafe_code_for_root(where)
    if why:
        raise ConfigError(str(where), "", f"{what} would run this code as root, but {why}")


def install_hooks(
    hooks_dir: Path,
    python: str,
    *,
    journal_root: Path = DEFAULT_ROOT,
    log_file: Path = DEFAULT_LOG,
    policy: Path | None = None,
    audit_log: Path = DEFAULT_AUDIT_LOG,
    deadline_s: float = DEFAULT_DEADLINE_S,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    ckpt_roots: Sequence[str] = (),
    root: InstallRoot = LIVE,
) -> list[Path]:
    """Write ``prolog.d/50-slurm-chaos`` and ``epilog.d/50-slurm-chaos`` under `hooks_dir`; returns them.

    `policy`: the policy file (default: ``<hooks_dir>/slurm-chaos-policy.toml``, beside slurm.conf).
    `deadline_s`: the watchdog's bound when the job's time limit is unknown. `ckpt_roots`: the
    site's allowed checkpoint roots (none: ckpt-full refuses every path). ConfigError when the
    code the hooks would run as root is not root's alone. Every path is the node's: under an
    image's `root` the hooks and the journal directory are written into it (`python` as the node
    sees it, e.g. ``root.python()``); the paths returned are the node's.
    """
    refuse_unsafe_code("the hooks", root)
    policy = policy or hooks_dir / POLICY_NAME
    written = []
    for kind in ("prolog", "epilog"):
        path = hooks_dir / f"{kind}.d" / HOOK_NAME
        text = render_hook(
            kind,
            python,
            journal_root,
            log_file,
            policy,
            audit_log,
            deadline_s,
            timeout_s,
            ckpt_roots,
            node_code_root(root),
        )
        # Atomic, under a dotfile name the dispatchers skip: slurmd never runs a half-written hook.
        root.write(path, text.encode(), mode=0o755)
        written.append(path)
    root.made(journal_root)
    return written


def uninstall_hooks(hooks_dir: Path) -> list[Path]:
    """Remove the hooks install_hooks wrote; returns what was removed."""
    removed = []
    for kind in ("prolog", "epilog"):
        path = hooks_dir / f"{kind}.d" / HOOK_NAME
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def site_journal_root(site: Site) -> Path:
    """The journal root that a site's hooks, SPANK plugin and ``cleanup`` share.

    Each sandbox gets its own (``<sandbox root>/journal``, next to its etc): node names and job
    ids repeat from one sandbox to the next on the same machine. A real site uses DEFAULT_ROOT.
    """
    if site.sandbox and site.slurm.hooks_dir:
        return Path(site.slurm.hooks_dir).parent / "journal"
    return DEFAULT_ROOT


def site_audit_log(site: Site) -> Path:
    """Where the prolog appends its decisions: the sandbox's log directory, else DEFAULT_AUDIT_LOG."""
    if site.sandbox and site.slurm.hooks_dir:
        return Path(site.slurm.hooks_dir).parent / "log" / "slurm-chaos-audit.log"
    return DEFAULT_AUDIT_LOG


def site_agent_log(site: Site) -> Path:
    """Where the hooks log: the sandbox's log directory, else DEFAULT_LOG."""
    if site.sandbox and site.slurm.hooks_dir:
        return Path(site.slurm.hooks_dir).parent / "log" / "slurm-chaos-agent.log"
    return DEFAULT_LOG


def install_site_hooks(site: Site, python: str = sys.executable, root: InstallRoot = LIVE) -> list[Path]:
    """Install the hooks into the site's ``slurm.hooks_dir``, journalling under site_journal_root();
    `python`: the interpreter as the node sees it."""
    if not site.slurm.hooks_dir:
        raise ConfigError(str(site.path), "slurm.hooks_dir", "needed to install the prolog/epilog hooks")
    hooks_dir = Path(site.slurm.hooks_dir)
    from slurm_chaos.faults.plugin_install import site_policy_path

    return install_hooks(
        hooks_dir,
        python,
        journal_root=site_journal_root(site),
        log_file=site_agent_log(site),
        policy=site_policy_path(site),
        audit_log=site_audit_log(site),
        ckpt_roots=site.safety.allowed_checkpoint_roots,
        root=root,
    )
