"""The verdict of one experiment, from the comparison, the expectation and what was observed.

Order of the checks (the first that applies wins):

1. training crashed, or lost more steps than allowed -> NOT RECOVERED;
   nothing was injected (an A/A control: no SPEC), nothing was expected, and monitoring reported a
   detection all the same (a drain, an alert, a site detector) -> FALSE ALARM: it would have woken
   someone, or drained a node, for a healthy job;
   the fault's injection took on no node (its node-side records say what was missing: no GPU,
   no NVML, no DCGM host engine, or a read-back that did not show it) -> NO EFFECT: there was
   nothing for monitoring to see, so silence is no blind spot;
   the hypothesis sets ``min_busbw_gbps`` and the baseline's median busbw is below it ->
   INCONCLUSIVE: the steady state did not hold before the fault, so nothing after it can be judged;
2. a detection signal was expected and none came in time (an alert Alertmanager silenced or inhibited
   fired all the same: it counts, and is said to be silenced):
   a significant slowdown -> BLIND SPOT; too noisy to tell -> INCONCLUSIVE; no slowdown although one
   was expected -> NO EFFECT (the injection itself is suspect); no slowdown expected -> BLIND SPOT;
3. detected (or nothing to detect), but an expected remediation step is missing or late -> NOT RECOVERED;
4. nothing to detect was declared, yet the job slowed down significantly and no signal at all was
   seen -> BLIND SPOT, or INCONCLUSIVE where no slowdown was expected (an A/A control: the
   comparison itself is too noisy to trust);
5. a slowdown was expected and neither it nor any detection happened -> NO EFFECT / INCONCLUSIVE;
6. otherwise PASSED.

A fault run whose median busbw is below the hypothesis' ``min_busbw_gbps`` has left the steady
state: that counts as a significant slowdown in rules 2 to 5, whatever ``expect.regression`` says
(the floor is absolute, not a comparison that noise can fake), and its reason names the measured
and the required busbw. Undetected, it is a BLIND SPOT; detected, PASSED, the breach stated.

A slowdown is the fault's sign only where the experiment expects one (``expect.regression``). For a
fault judged on events (a drain, a requeue, a full volume) a step-time change between the baseline
and the fault run is as likely the machine's run-to-run noise: it is stated beside the verdict,
never the reason for it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from slurm_chaos.analysis.model import BusbwResult, Comparison, Detection, Verdict
from slurm_chaos.faults.injection import RECORDED
from slurm_chaos.faults.spec import SpecError, parse_spec
from slurm_chaos.rundir import Expectation, InjectionRecord, Observation, ObservationLog, Signal
from slurm_chaos.site import SIGNAL_KIND

# Short remediation names an experiment may use, and the signals that show each happened.
REMEDIATION_SIGNALS: dict[str, tuple[str, ...]] = {
    "drain": (Signal.NODE_DRAINED, Signal.HEALTHCHECK_DRAIN),
    "requeue": (Signal.JOB_REQUEUED,),
    "resume": (Signal.RESUMED_FROM_CHECKPOINT,),
}
# Signals that show monitoring noticed, used when the experiment named none (rule 4). The probe's own
# events (gpu_xid, numa_mismatch, ...) are not monitoring: they count only where an experiment names them.
DETECTION_SIGNALS = (Signal.NODE_DRAINED, Signal.HEALTHCHECK_DRAIN, Signal.ALERT_FIRING, Signal.DETECTOR)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str
    detected_by: str | None
    time_to_detect_s: float | None
    time_to_remediate_s: float | None
    detections: tuple[Detection, ...] = ()


def signal_matches(observed: str, wanted: str) -> bool:
    """Exact name, a family ("alert_firing" matches "alert_firing:GpuHot"), or a glob pattern."""
    return observed == wanted or observed.startswith(wanted + ":") or fnmatch.fnmatchcase(observed, wanted)


def matches(o: Observation, wanted: str) -> bool:
    """``signal:<kind>``: a site detector that covers ``kind`` fired; else :func:`signal_matches`."""
    if wanted.startswith(SIGNAL_KIND):
        return o.detector is not None and wanted[len(SIGNAL_KIND) :] in o.covers
    return signal_matches(o.signal, wanted)


def first_match(log: ObservationLog, wanted: tuple[str, ...]) -> Observation | None:
    """Earliest observation at or after the fault's start (:meth:`Observation.since`: a time in
    Slurm's whole seconds may read up to a second before it) that matches any of ``wanted``."""
    for o in log.observations:  # sorted by time
        if o.since(log.fault_window.start) and any(matches(o, w) for w in wanted):
            return o
    return None


def detections(log: ObservationLog) -> tuple[Detection, ...]:
    """Each site detector's first firing since the fault began, once per signal kind it covers."""
    first: dict[tuple[str, str], Detection] = {}
    for o in log.observations:  # sorted by time
        if o.detector is None or not o.since(log.fault_window.start):
            continue
        for kind in o.covers:
            key = (o.detector, kind)
            if key not in first:
                first[key] = Detection(o.detector, kind, o.after(log.fault_window.start), o.silenced)
    return tuple(first.values())


def reference_seen(log: ObservationLog) -> str:
    """What slurm-chaos's reference checks (``reference:<check>``, see campaign/observe.py) saw
    during the fault, for a BLIND SPOT's reason: which check, how long after the fault began, and
    what of slurm-chaos's would have caught it; "" when they saw nothing."""
    prefix = f"{Signal.REFERENCE}:"
    seen = [o for o in log.observations if o.signal.startswith(prefix) and o.since(log.fault_window.start)]
    if not seen:
        return ""
    first = seen[0]  # sorted by time
    after = first.after(log.fault_window.start)
    return f"; the reference check {first.signal[len(prefix) :]} saw it after {after:.0f} s: {first.detail}"


def _remediation(log: ObservationLog, e: Expectation) -> tuple[float | None, str]:
    """Time from fault start until the last expected remediation step, or why it is missing."""
    last = log.fault_window.start
    for step in e.remediation:
        o = first_match(log, REMEDIATION_SIGNALS.get(step, (step,)))
        if o is None:
            return None, f"expected remediation step {step!r} never happened"
        last = max(last, o.time)
    elapsed = last - log.fault_window.start
    if e.remediate_within_s is not None and elapsed > e.remediate_within_s:
        return elapsed, f"remediation took {elapsed:.0f} s, deadline {e.remediate_within_s:.0f} s"
    return elapsed, ""


def _pct(c: Comparison) -> str:
    return f"{100 * c.regression:+.1f}% [{100 * c.ci_low:+.1f}%, {100 * c.ci_high:+.1f}%]"


def not_injected(injections: tuple[InjectionRecord, ...], spec: str = "") -> str:
    """Why nothing was injected, when the records say so on every node; "" when something took
    (or no fault kept a record: judged as before). ``spec``: the SPEC the job got, where known; a
    fault of it that keeps no record (a slow rank beside a GPU fault) may have taken all the same,
    so the records then speak for part of the SPEC only and decide nothing."""
    if not injections or any(r.took for r in injections):
        return ""
    if spec and not _all_recorded(spec):
        return ""
    return "; ".join(dict.fromkeys(r.detail for r in injections))


def _all_recorded(spec: str) -> bool:
    """Every fault of ``spec`` records on each node whether its injection took."""
    try:
        faults = parse_spec(spec)
    except SpecError:  # not a SPEC we can read: the records alone decide, as before
        return True
    return all(f.name in RECORDED for f in faults)


def judge(
    c: Comparison | None,
    log: ObservationLog,
    lost_steps: int = 0,
    injections: tuple[InjectionRecord, ...] = (),
    busbw: BusbwResult | None = None,
) -> Judgement:
    """Apply the rules in the module docstring; ``injections``: the fault job's node-side records;
    ``busbw``: an allreduce run's bus bandwidth, judged against ``min_busbw_gbps``."""
    e = log.expectation
    start = log.fault_window.start
    wanted = e.detect_signals or DETECTION_SIGNALS
    hit = first_match(log, wanted)
    ttd = None if hit is None else hit.after(start)
    # A site detector by its name; anything else (a generic signal) by the signal, as before detectors.
    detected_by = None if hit is None else hit.detector or hit.signal
    ttr, missing = _remediation(log, e) if e.remediation else (None, "")
    found = detections(log)

    def verdict(v: Verdict, reason: str) -> Judgement:
        if v is Verdict.BLIND_SPOT:
            reason += reference_seen(log)
        return Judgement(v, reason, detected_by, ttd, ttr, found)

    if log.crashed:
        return verdict(Verdict.NOT_RECOVERED, "training crashed and did not finish")
    if e.max_lost_steps is not None and lost_steps > e.max_lost_steps:
        return verdict(Verdict.NOT_RECOVERED, f"lost {lost_steps} steps, at most {e.max_lost_steps} allowed")
    if hit is not None and not log.fault and not e.detect_signals and not e.expect_regression:
        return verdict(
            Verdict.FALSE_ALARM,
            f"nothing was injected, yet {detected_by} after {ttd:.0f} s"
            + (f" ({hit.detail})" if hit.detail else ""),
        )
    nothing = not_injected(injections, log.fault)
    if nothing:
        return verdict(Verdict.NO_EFFECT, nothing)
    floor = e.min_busbw_gbps
    if floor is not None and busbw is not None and busbw.baseline is not None:
        if busbw.baseline.median_gbps < floor:
            return verdict(
                Verdict.INCONCLUSIVE,
                f"the baseline's median busbw {busbw.baseline.median_gbps:.2f} GB/s is below the "
                f"hypothesis' min_busbw_gbps {floor:g} GB/s: the steady state did not hold before the fault",
            )
    below = _busbw_below(busbw, floor)
    steps_slowed = c is not None and c.significant and c.regression > 0
    slowed = steps_slowed or bool(below)
    noisy = c is None or bool(c.inconclusive_reason)
    aside = _unexpected_change(c) if steps_slowed and not e.expect_regression else ""
    effect = below or ("" if c is None else f"step time {_pct(c)}")
    if e.detect_signals and (ttd is None or (e.detect_within_s is not None and ttd > e.detect_within_s)):
        late = "" if ttd is None else f" (first seen after {ttd:.0f} s, deadline {e.detect_within_s:.0f} s)"
        if (steps_slowed and e.expect_regression) or below:
            return verdict(Verdict.BLIND_SPOT, f"{effect} but no {'/'.join(e.detect_signals)} in time{late}")
        if e.expect_regression and noisy:
            return verdict(
                Verdict.INCONCLUSIVE, _noisy_reason(c) + f"; no {'/'.join(e.detect_signals)}{late}"
            )
        if e.expect_regression:
            return verdict(Verdict.NO_EFFECT, _no_effect_reason(c, "detection"))
        return verdict(
            Verdict.BLIND_SPOT, f"expected {'/'.join(e.detect_signals)} in time, none seen{late}{aside}"
        )
    if missing:
        return verdict(Verdict.NOT_RECOVERED, missing + aside)
    if not e.detect_signals and slowed and hit is None:
        if below:
            return verdict(Verdict.BLIND_SPOT, f"{below} and no monitoring signal at all")
        assert c is not None
        if not e.expect_regression:
            return verdict(
                Verdict.INCONCLUSIVE,
                f"step time {_pct(c)} {c.between} although no slowdown was expected: "
                + (
                    "a placebo schedule found an effect (1 run in 100 does at alpha 0.01; more often, "
                    "the job's speed moves with something in step with the blocks)"
                    if c.within_job
                    else "the comparison is too noisy to trust here "
                    "(calibrate the cluster's run-to-run noise)"
                ),
            )
        return verdict(Verdict.BLIND_SPOT, f"step time {_pct(c)} and no monitoring signal at all")
    if e.expect_regression and not slowed and hit is None:
        if noisy:
            return verdict(Verdict.INCONCLUSIVE, _noisy_reason(c))
        return verdict(Verdict.NO_EFFECT, _no_effect_reason(c, "signal"))
    quiet = hit is not None and hit.silenced
    breach = f"; {below}" if below else ""
    # Detected, but the slowdown the hypothesis expects did not show: said, so that nobody reads
    # the signal as a measured effect (a straggler check can drain on noise).
    unmeasured = (
        ", not significant: the expected slowdown was not measured"
        if e.expect_regression and not slowed and c is not None and c.regression == c.regression
        else ""
    )
    return verdict(
        Verdict.PASSED, _passed_reason(c, detected_by, ttd, ttr, quiet) + unmeasured + breach + aside
    )


def _busbw_below(busbw: BusbwResult | None, floor: float | None) -> str:
    """The fault run's breach of the busbw floor, as a reason naming both values; "" if none."""
    if floor is None or busbw is None or busbw.fault is None or busbw.fault.median_gbps >= floor:
        return ""
    return (
        f"median busbw {busbw.fault.median_gbps:.2f} GB/s, below the hypothesis' "
        f"min_busbw_gbps {floor:g} GB/s"
    )


def _unexpected_change(c: Comparison | None) -> str:
    """A between-run slowdown where the fault is not expected to slow the job: stated, not judged."""
    assert c is not None
    return f" (step time {_pct(c)} {c.between}, where this fault is not expected to slow the job)"


def _no_effect_reason(c: Comparison | None, missing: str) -> str:
    reason = f"no significant slowdown and no {missing}: did the fault take?"
    if c is not None and c.significant and c.regression < 0:
        # A fault run faster than its baseline points at the baseline (a busier machine then).
        faster = 100 * -c.regression
        reason += f" (the fault run was {faster:.0f}% faster than its baseline: was the baseline disturbed?)"
    return reason


def _noisy_reason(c: Comparison | None) -> str:
    if c is None:
        return "no comparison possible"
    return c.inconclusive_reason or "no significant change"


def _passed_reason(
    c: Comparison | None, by: str | None, ttd: float | None, ttr: float | None, silenced: bool = False
) -> str:
    parts = []
    if by is not None and ttd is not None:
        # Silenced or inhibited: it fired, but the people on call were not told.
        parts.append(f"detected by {by} after {ttd:.0f} s{' (silenced)' if silenced else ''}")
    if ttr is not None:
        parts.append(f"remediated after {ttr:.0f} s")
    if c is not None and c.regression == c.regression:  # not NaN
        parts.append(f"step time {_pct(c)}")
    return "; ".join(parts) or "as expected"
