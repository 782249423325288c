"""When a held fault job may end: the expected detection and remediation seen, or their deadlines past.

A fault job that simply ran its steps and ended would be judged by the machine's speed: on a fast
machine it is over before a health check's next interval or an alert's ``for:``, and a drain
timed after its start finds no job left to drain. So a fault job whose experiment waits for
something trains on after its steps (the probe's hold) until the campaign releases it, here: once
every signal the verdict will look for has been seen since the fault began, or the deadline the
experiment gives for it has passed (plus a grace, so that a late signal is seen and called late).

Only what the watcher sees while the job runs can end a hold: detection signals, drains and
requeues. A resume from checkpoint happens in the requeued run itself, and the placement checks
run after the job; the hold does not wait for those.

Nor does a fault job wait for anything once its fault took nowhere: when every node of the job has
copied its injection record (``fault/injections/<node>.json``, before the probe) with an entry for
each fault of the SPEC that keeps one, and none took, the verdict is NO EFFECT whatever is seen.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.analysis.verdict import REMEDIATION_SIGNALS, matches
from slurm_chaos.errors import DataError
from slurm_chaos.rundir import RELEASE, Expectation, InjectionRecord, Observation, load_injections

#: A signal that comes this long after its deadline is still seen (and judged late) before release.
GRACE_S = 5.0
#: Remediation steps the watcher sees while the job runs.
WATCHED_REMEDIATION = ("drain", "requeue")


@dataclass(frozen=True)
class Hold:
    """What a held fault job waits for: the signals of ``expectation``, unless the faults of its
    SPEC that record whether their injection took (``recorded``) took nowhere."""

    expectation: Expectation
    recorded: frozenset[str] = frozenset()


def waits(e: Expectation) -> list[tuple[tuple[str, ...], float | None]]:
    """(signals any one of which settles it, deadline after the fault's start) for each wait."""
    out: list[tuple[tuple[str, ...], float | None]] = []
    if e.detect_signals:
        out.append((e.detect_signals, e.detect_within_s))
    for step in e.remediation:
        if step in WATCHED_REMEDIATION:
            out.append((REMEDIATION_SIGNALS[step], e.remediate_within_s or e.detect_within_s))
    return out


def release_due(
    e: Expectation, fault_start: float | None, observations: Sequence[Observation], now: float
) -> bool:
    """Whether a held fault job may end now (see the module docstring)."""
    if fault_start is None:  # the fault has not begun: nothing can have been seen yet
        return False
    for wanted, deadline in waits(e):
        seen = any(o.since(fault_start) and any(matches(o, w) for w in wanted) for o in observations)
        if not seen and (deadline is None or now < fault_start + deadline + GRACE_S):
            return False
    return True


def nothing_injected(
    records: Sequence[InjectionRecord], nodes: Sequence[str], recorded: Collection[str]
) -> bool:
    """Every one of ``nodes`` has a record of each fault in ``recorded``, and no record took."""
    if not nodes or not recorded or any(r.took for r in records):
        return False
    return all(set(recorded) <= {r.fault for r in records if r.node == node} for node in nodes)


def injected_nowhere(hold: Hold, job_dir: Path, nodes: Sequence[str]) -> str:
    """Why the job's fault took on none of its nodes, by their records in ``job_dir``; "" while
    a record is missing, still being written, or one took."""
    if not hold.recorded:
        return ""
    try:
        records = load_injections(job_dir)
    except DataError:  # a node's copy half written: read again at the next tick
        return ""
    if not nothing_injected(records, nodes, hold.recorded):
        return ""
    return "; ".join(dict.fromkeys(r.detail for r in records))


def release(job_dir: Path) -> Path:
    """Let the held probe end (it looks for this file at each step)."""
    path = job_dir / RELEASE
    path.touch()
    return path
