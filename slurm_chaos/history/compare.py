"""Regressions between windows, judged by stated rules: :func:`compare_windows` is pure.

This window is compared, experiment by experiment, with the earlier windows that ran the same
experiment (the last one, or the last N). The rules (``RULES`` says them in words, and every
output prints them):

1. A verdict that got worse than in the last window that ran the experiment, in the order of
   ``SEVERITY``, best first: PASSED, INCONCLUSIVE (nothing could be judged), NO EFFECT (the fault
   did not take: the test, not the monitoring, failed), FALSE ALARM (monitoring acted on a
   healthy job), NOT RECOVERED (seen, but not put right), BLIND SPOT (a fault nobody was told of).
2. A detector that fired and reached people in the last window and did not fire now, or fired
   only silenced (nobody was told); for an A/A control, a detector that fires now and did not.
   An experiment that was detected and now is not at all is a finding too.
3. A time to detect (the experiment's, and each detector's) or to remediate that is past the
   deadline it was judged against while the last window was within it, or that lies beyond what
   the earlier windows' spread explains: above ``max + max(K_MAD x MAD, floor, FLOOR_FRACTION x
   median)`` of the earlier windows' times. A single earlier window has no spread (MAD 0): the
   floor, an absolute one (``FLOOR_S``: a health check's period of jitter) and a relative one,
   then decides.
4. More lost steps, by the same spread rule (floor ``LOST_FLOOR_STEPS``).
5. An MDE beyond ``MDE_FACTOR`` times the largest earlier one: the cluster got noisier, and the
   same campaign now sees less.

The mirror image of each rule is an improvement; improvements are listed, never findings.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.history.records import ExperimentRecord, Firing, Window

#: Verdicts from best to worst: a verdict further right than the last window's is a regression.
SEVERITY: tuple[Verdict, ...] = (
    Verdict.PASSED,
    Verdict.INCONCLUSIVE,
    Verdict.NO_EFFECT,
    Verdict.FALSE_ALARM,
    Verdict.NOT_RECOVERED,
    Verdict.BLIND_SPOT,
)
K_MAD = 3.0
FLOOR_S = 10.0
FLOOR_FRACTION = 0.5
LOST_FLOOR_STEPS = 10.0
MDE_FACTOR = 1.5

RULES: tuple[str, ...] = (
    "verdict: worse than in the last window, in the order " + " < ".join(v.value for v in SEVERITY),
    "detector: fired and reached people in the last window, and now did not fire or fired only "
    "silenced; in an A/A control, fires now and did not; an experiment detected before and not now",
    f"time to detect or remediate: past its deadline while the last window was within it, or above "
    f"max + max({K_MAD:g} x MAD, {FLOOR_S:g} s, {FLOOR_FRACTION:g} x median) of the earlier windows' times",
    f"lost steps: above max + max({K_MAD:g} x MAD, {LOST_FLOOR_STEPS:g} steps, {FLOOR_FRACTION:g} x median) "
    "of the earlier windows'",
    f"MDE: above {MDE_FACTOR:g} x the largest of the earlier windows' (the cluster got noisier)",
    "an improvement: the mirror image of a rule; listed, never a finding",
)


@dataclass(frozen=True)
class Change:
    """One judged change of one experiment: ``before`` is the last earlier window's value
    (``before_window`` its run id), ``now`` this window's; ``regression`` False: an improvement."""

    experiment: str
    what: str
    reason: str
    before_window: str
    before: str
    now: str
    regression: bool
    detector: str | None = None


@dataclass(frozen=True)
class HistoryComparison:
    site: str
    window: Window
    earlier: tuple[Window, ...]
    changes: tuple[Change, ...] = ()
    # Experiments this window ran and no earlier one did, and the other way round.
    new: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()
    rules: tuple[str, ...] = field(default=RULES)

    @property
    def findings(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.regression)

    @property
    def improvements(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if not c.regression)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0


def severity(v: Verdict) -> int:
    return SEVERITY.index(v)


def margin(earlier: Sequence[float], floor: float) -> float:
    """How far past the earlier windows' range a value must lie to be more than their spread."""
    med = statistics.median(earlier)
    mad = statistics.median(abs(x - med) for x in earlier)
    return max(K_MAD * mad, floor, FLOOR_FRACTION * abs(med))


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} s"


def _steps(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} steps"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


@dataclass(frozen=True)
class _Pair:
    """One experiment now, and in the earlier windows that ran it (oldest first)."""

    now: ExperimentRecord
    earlier: tuple[tuple[Window, ExperimentRecord], ...]

    @property
    def last_window(self) -> Window:
        return self.earlier[-1][0]

    @property
    def last(self) -> ExperimentRecord:
        return self.earlier[-1][1]

    def change(
        self, what: str, reason: str, before: str, now: str, regression: bool, detector: str | None = None
    ) -> Change:
        return Change(self.now.name, what, reason, self.last_window.run_id, before, now, regression, detector)


def _verdict(p: _Pair) -> list[Change]:
    was, now = severity(p.last.verdict), severity(p.now.verdict)
    if was == now:
        return []
    word = "worse" if now > was else "better"
    return [
        p.change(
            "verdict", f"{word} than in the last window", p.last.verdict.value, p.now.verdict.value, now > was
        )
    ]


def _firing_text(f: Firing | None) -> str:
    if f is None:
        return "did not fire"
    return f"fired after {secs(f.time_to_detect_s)}{' (silenced)' if f.silenced else ''}"


def _detector(p: _Pair, detector: str) -> list[Change]:
    was, now = p.last.first_firing(detector), p.now.first_firing(detector)
    before, after = _firing_text(was), _firing_text(now)
    what = f"detector {detector}"

    def change(reason: str, regression: bool) -> list[Change]:
        return [p.change(what, reason, before, after, regression, detector)]

    if not p.now.expect_regression:  # an A/A control: its detectors must stay quiet
        if was is None and now is not None:
            return change("fires in an A/A control (a false alarm) and did not in the last window", True)
        if was is not None and now is None:
            return change("no longer fires in an A/A control", False)
        return []
    if was is not None and not was.silenced:
        if now is None:
            return change("fired in the last window, not now", True)
        if now.silenced:
            return change("now silenced: it fires, but nobody is told", True)
    if now is not None and not now.silenced and (was is None or was.silenced):
        return change("fires now, and reaches people" if was is None else "no longer silenced", False)
    return []


def _detected(p: _Pair) -> list[Change]:
    """The experiment as a whole: detected (by any signal it waits for) or not."""
    if not p.now.expect_regression:
        return []
    was, now = p.last.time_to_detect_s, p.now.time_to_detect_s
    if (was is None) == (now is None):
        return []
    before = f"by {p.last.detected_by} after {secs(was)}" if was is not None else "not detected"
    after = f"by {p.now.detected_by} after {secs(now)}" if now is not None else "not detected"
    reason = "detected in the last window, not now" if now is None else "detected now, not in the last window"
    return [p.change("detection", reason, before, after, now is None)]


def _time(
    p: _Pair,
    what: str,
    value: Callable[[ExperimentRecord], float | None],
    deadline: float | None,
    detector: str | None = None,
) -> list[Change]:
    """Rule 3 for one time (seconds), against the earlier windows that have it."""
    now = value(p.now)
    earlier = [t for t in (value(e) for _, e in p.earlier) if t is not None]
    last = value(p.last)
    if now is None or not earlier:
        return []
    before = secs(last) if last is not None else f"- (earlier: {', '.join(secs(t) for t in earlier)})"
    after = secs(now)
    if deadline is not None and now > deadline and last is not None and last <= deadline:
        return [p.change(what, f"past its deadline of {secs(deadline)}", before, after, True, detector)]
    m = margin(earlier, FLOOR_S)
    if now > max(earlier) + m:
        reason = (
            f"beyond the earlier windows' spread: above {secs(max(earlier) + m)} "
            f"(max {secs(max(earlier))} + {m:.0f} s)"
        )
        return [p.change(what, reason, before, after, True, detector)]
    if now < min(earlier) - m:
        reason = f"faster than the earlier windows' spread: below {secs(min(earlier) - m)}"
        return [p.change(what, reason, before, after, False, detector)]
    return []


def _detector_time(detector: str) -> Callable[[ExperimentRecord], float | None]:
    def value(e: ExperimentRecord) -> float | None:
        f = e.first_firing(detector)
        return None if f is None else f.time_to_detect_s

    return value


def _lost(p: _Pair) -> list[Change]:
    earlier = [float(e.lost_steps) for _, e in p.earlier]
    now = float(p.now.lost_steps)
    m = margin(earlier, LOST_FLOOR_STEPS)
    before, after = _steps(p.last.lost_steps), _steps(now)
    if now > max(earlier) + m:
        reason = (
            f"more lost steps than the earlier windows' spread explains: above {_steps(max(earlier) + m)}"
        )
        return [p.change("lost steps", reason, before, after, True)]
    if now < min(earlier) - m:
        return [
            p.change(
                "lost steps", f"fewer lost steps: below {_steps(min(earlier) - m)}", before, after, False
            )
        ]
    return []


def _mde(p: _Pair) -> list[Change]:
    earlier = [e.mde for _, e in p.earlier if e.mde is not None]
    now = p.now.mde
    if now is None or not earlier:
        return []
    before, after = _pct(p.last.mde), _pct(now)
    if now > MDE_FACTOR * max(earlier):
        reason = (
            f"MDE above {MDE_FACTOR:g} x the earlier windows' largest ({_pct(max(earlier))}): "
            "the cluster got noisier, the campaign sees less"
        )
        return [p.change("mde", reason, before, after, True)]
    if now < min(earlier) / MDE_FACTOR:
        return [
            p.change("mde", f"MDE below the earlier windows' smallest / {MDE_FACTOR:g}", before, after, False)
        ]
    return []


def _judge(p: _Pair) -> list[Change]:
    changes = _verdict(p) + _detected(p)
    detectors = sorted(set(p.now.detectors) | set(p.last.detectors))
    for d in detectors:
        changes += _detector(p, d)
    changes += _time(p, "time to detect", lambda e: e.time_to_detect_s, p.now.detect_within_s)
    for d in detectors:
        changes += _time(p, f"time to detect by {d}", _detector_time(d), None, d)
    changes += _time(p, "time to remediate", lambda e: e.time_to_remediate_s, p.now.remediate_within_s)
    return changes + _lost(p) + _mde(p)


def compare_windows(window: Window, earlier: Sequence[Window]) -> HistoryComparison:
    """Judge ``window`` against ``earlier`` (oldest first), experiment by experiment."""
    changes: list[Change] = []
    new: list[str] = []
    for now in window.experiments:
        runs = tuple((w, e) for w in earlier if (e := w.experiment(now.name)) is not None)
        if not runs:
            new.append(now.name)
            continue
        changes += _judge(_Pair(now, runs))
    ran = {e.name for e in window.experiments}
    not_run = sorted({e.name for w in earlier for e in w.experiments} - ran)
    return HistoryComparison(window.site, window, tuple(earlier), tuple(changes), tuple(new), tuple(not_run))
