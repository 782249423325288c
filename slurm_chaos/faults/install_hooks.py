"""Write the prolog and epilog hooks of node-level faults into a site's hook directories.

The site's dispatchers (``Prolog=<etc>/prolog`` running every executable of ``<etc>/prolog.d/``,
and the same for the epilog) run ``prolog.d/50-slurm-chaos`` and ``epilog.d/50-slurm-chaos``.
Each hook is a few lines of shell that return at once for a job without chaos (no SPEC, no
journal), else run the Python hook bounded by ``timeout``; it exits 0 whatever happens.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_chaos.errors import ConfigError
from slurm_chaos.faults.agent import DEFAULT_DEADLINE_S
from slurm_chaos.faults.journal import DEFAULT_ROOT
from slurm_chaos.resources import import_root
from slurm_chaos.site import Site, load_site

HOOK_NAME = "50-slurm-chaos"
DEFAULT_LOG = Path("/var/log/slurm-chaos/agent.log")
#: Below the sandbox dispatcher's 60 s per hook, so our own timeout (and its log line) comes first.
DEFAULT_TIMEOUT_S = 45

_GUARD = {
    "prolog": 'if [ -z "${{SPANK_SLURM_CHAOS_SPEC:-}}${{SLURM_CHAOS_SPEC:-}}" ] && '
    '[ ! -e {spec_dir}/"${{SLURM_JOB_ID:-none}}" ]; then exit 0; fi',
    "epilog": '[ -e {journal_root}/"${{SLURMD_NODENAME:-none}}/${{SLURM_JOB_ID:-none}}.jsonl" ] || exit 0',
}

_TEMPLATE = """#!/bin/sh
# slurm-chaos {kind} hook, written by slurm_chaos.faults.install_hooks: {what}
# Time-bounded, idempotent, and it exits 0 whatever happens: its own failure never drains the node.
{guard}
PYTHONPATH={pythonpath}${{PYTHONPATH:+:$PYTHONPATH}} \\
  timeout -k 5 {timeout} {python} -m slurm_chaos.faults.hooks {kind} \\
  --journal-root {journal_root} --log-file {log_file} --deadline {deadline}{spec_arg}{roots_arg}
rc=$?
if [ "$rc" -ne 0 ]; then
  msg="slurm-chaos: {kind} hook exited $rc for job ${{SLURM_JOB_ID:-?}} on ${{SLURMD_NODENAME:-?}}"
  echo "$msg" >&2
  echo "$msg" >> {log_file} 2>/dev/null
  logger -t slurm-chaos "$msg" 2>/dev/null
fi
exit 0
"""

_WHAT = {
    "prolog": "applies the job's node-level faults (python -m slurm_chaos.faults.agent apply).",
    "epilog": "stops the job's agent and reverts its journal (python -m slurm_chaos.faults.agent undo).",
}


def render_hook(
    kind: str,
    python: str,
    journal_root: Path,
    log_file: Path,
    spec_dir: Path | None,
    deadline_s: float,
    timeout_s: int,
    ckpt_roots: Sequence[str] = (),
) -> str:
    """Text of one hook script (kind: prolog or epilog)."""
    q = shlex.quote
    no_spec_dir = Path("/nonexistent/slurm-chaos-spec")
    return _TEMPLATE.format(
        kind=kind,
        what=_WHAT[kind],
        guard=_GUARD[kind].format(
            spec_dir=q(str(spec_dir or no_spec_dir)), journal_root=q(str(journal_root))
        ),
        pythonpath=q(str(import_root())),
        timeout=int(timeout_s),
        python=q(python),
        journal_root=q(str(journal_root)),
        log_file=q(str(log_file)),
        deadline=f"{deadline_s:g}",
        spec_arg=f" --spec-dir {q(str(spec_dir))}" if spec_dir else "",
        roots_arg="".join(f" --ckpt-root {q(root)}" for root in ckpt_roots) if kind == "prolog" else "",
    )


def install_hooks(
    hooks_dir: Path,
    python: str,
    *,
    journal_root: Path = DEFAULT_ROOT,
    log_file: Path = DEFAULT_LOG,
    spec_dir: Path | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    ckpt_roots: Sequence[str] = (),
) -> list[Path]:
    """Write ``prolog.d/50-slurm-chaos`` and ``epilog.d/50-slurm-chaos`` under `hooks_dir`; returns them.

    `spec_dir`: where the fallback SPEC files ``<job id>`` are read from (None: only the SPANK
    plugin's variable). `deadline_s`: the watchdog's bound when the job's time limit is unknown.
    `ckpt_roots`: the site's allowed checkpoint roots (none: ckpt-full refuses every path).
    """
    written = []
    for kind in ("prolog", "epilog"):
        path = hooks_dir / f"{kind}.d" / HOOK_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{HOOK_NAME}.tmp"  # the dispatchers skip dotfiles
        text = render_hook(kind, python, journal_root, log_file, spec_dir, deadline_s, timeout_s, ckpt_roots)
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.rename(path)  # atomic: slurmd never runs a half-written hook
        written.append(path)
    journal_root.mkdir(parents=True, exist_ok=True)
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


def install_site_hooks(site_path: Path | str, python: str = sys.executable) -> list[Path]:
    """Install the hooks into the site's ``slurm.hooks_dir``, journalling under site_journal_root()."""
    site = load_site(site_path)
    if not site.slurm.hooks_dir:
        raise ConfigError(str(site_path), "slurm.hooks_dir", "needed to install the prolog/epilog hooks")
    hooks_dir = Path(site.slurm.hooks_dir)
    if site.sandbox:
        root = hooks_dir.parent
        return install_hooks(
            hooks_dir,
            python,
            journal_root=site_journal_root(site),
            log_file=root / "log" / "slurm-chaos-agent.log",
            spec_dir=root / "shared" / "chaos-spec",
            ckpt_roots=site.safety.allowed_checkpoint_roots,
        )
    return install_hooks(
        hooks_dir,
        python,
        journal_root=site_journal_root(site),
        ckpt_roots=site.safety.allowed_checkpoint_roots,
    )
