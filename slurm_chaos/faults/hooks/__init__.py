"""Prolog and epilog hooks of node-level fault injection (installed by ``install_hooks``).

A hook that leaves an undo undone (a fault of this job or a stale one of an earlier job still in
place) must take the node out of service: it drains the node with a reason starting
:data:`UNDO_FAILED`, says the same on stderr (slurmd logs it), and exits :data:`EXIT_UNDO_FAILED`,
which the shell hook turns into a non-zero exit so that slurmd reports the hook failed (an Epilog
or Prolog error drains the node too where the site's dispatcher passes it on). Every other
failure of a hook's own is logged and exits 0: it must never drain the node.
"""

#: The drain reason's start, and the first words of the line on stderr.
UNDO_FAILED = "slurm-chaos: undo failed"
#: The Python hook's exit status when an undo is left undone (the shell hook then exits 1).
EXIT_UNDO_FAILED = 3
#: At most this much of a reason reaches slurmctld (one line, printable ASCII).
MAX_REASON = 240


def undo_failed_reason(what: str, more: int = 0) -> str:
    """The drain reason for an undo that failed: one line of printable ASCII, bounded (a failure's
    text may hold paths the job chose)."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in " ".join(what.split()))
    tail = f" (and {more} more)" if more else ""
    reason = f"{UNDO_FAILED}: {clean}"
    if len(reason) + len(tail) > MAX_REASON:
        reason = reason[: MAX_REASON - len(tail) - 3] + "..."
    return reason + tail
