"""Regressions between windows, on hand-built windows: each rule found one way, listed the other."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.history.compare import SEVERITY, Change, compare_windows, margin
from slurm_chaos.history.records import ExperimentRecord, Firing, Window

BASE = ExperimentRecord(
    name="ckpt-full",
    verdict=Verdict.PASSED,
    detected_by="node_drained",
    time_to_detect_s=5.0,
    time_to_remediate_s=40.0,
    lost_steps=20,
    mde=0.03,
    detect_within_s=60.0,
    remediate_within_s=120.0,
    firings=(Firing("nhc", "checkpoint", 5.0), Firing("alerts", "checkpoint", 30.0)),
)


def win(run_id: str, *experiments: ExperimentRecord) -> Window:
    return Window("golden", run_id, f"/runs/{run_id}", float(len(run_id)), experiments=experiments)


def judge(before: ExperimentRecord, now: ExperimentRecord) -> list[Change]:
    return list(compare_windows(win("w2", now), [win("w1", before)]).changes)


def only(changes: list[Change]) -> Change:
    assert len(changes) == 1, changes
    return changes[0]


def test_the_same_window_again_is_no_change_and_exits_0() -> None:
    result = compare_windows(win("w2", BASE), [win("w1", BASE)])
    assert result.changes == () and result.exit_code == 0


def test_severity_order_is_stated_best_first() -> None:
    assert [v.value for v in SEVERITY] == [
        "PASSED",
        "INCONCLUSIVE",
        "NO EFFECT",
        "FALSE ALARM",
        "NOT RECOVERED",
        "BLIND SPOT",
    ]
    assert set(SEVERITY) == set(Verdict)


def test_a_worse_verdict_is_a_finding_a_better_one_an_improvement() -> None:
    worse = only(judge(BASE, replace(BASE, verdict=Verdict.NOT_RECOVERED)))
    assert (worse.what, worse.regression, worse.before, worse.now) == (
        "verdict",
        True,
        "PASSED",
        "NOT RECOVERED",
    )
    assert worse.before_window == "w1"
    better = only(
        judge(replace(BASE, verdict=Verdict.BLIND_SPOT), replace(BASE, verdict=Verdict.NOT_RECOVERED))
    )
    assert (better.what, better.regression) == ("verdict", False)


def test_a_detector_that_stopped_firing_is_named_with_both_windows() -> None:
    now = replace(BASE, firings=(Firing("alerts", "checkpoint", 30.0),))
    c = only(judge(BASE, now))
    assert (c.what, c.detector, c.regression) == ("detector nhc", "nhc", True)
    assert (c.before, c.now) == ("fired after 5 s", "did not fire")
    back = only(judge(now, BASE))
    assert (back.detector, back.regression, back.reason) == ("nhc", False, "fires now, and reaches people")


def test_a_detector_now_silenced_is_a_finding() -> None:
    now = replace(
        BASE, firings=(Firing("nhc", "checkpoint", 5.0), Firing("alerts", "checkpoint", 30.0, True))
    )
    c = only(judge(BASE, now))
    assert (c.detector, c.regression, c.now) == ("alerts", True, "fired after 30 s (silenced)")
    assert "nobody is told" in c.reason
    assert only(judge(now, BASE)).reason == "no longer silenced"


def test_an_a_a_control_whose_detector_starts_firing_is_a_finding() -> None:
    quiet = ExperimentRecord("control-aa", Verdict.PASSED, expect_regression=False)
    loud = replace(quiet, firings=(Firing("nhc", "straggler", 12.0),))
    c = only(judge(quiet, loud))
    assert (c.detector, c.regression) == ("nhc", True) and "A/A control" in c.reason
    assert only(judge(loud, quiet)).regression is False


def test_detected_before_and_not_now() -> None:
    now = replace(BASE, detected_by=None, time_to_detect_s=None, firings=())
    changes = judge(BASE, now)
    assert {(c.what, c.regression) for c in changes} == {
        ("detection", True),
        ("detector nhc", True),
        ("detector alerts", True),
    }


def test_a_time_to_detect_past_its_deadline_is_a_finding() -> None:
    # 5 s -> 65 s: past the 60 s deadline; the spread rule alone would have caught it too, so the
    # deadline's reason is the one given.
    c = judge(BASE, replace(BASE, time_to_detect_s=65.0))
    assert [(x.what, x.reason, x.before, x.now) for x in c] == [
        ("time to detect", "past its deadline of 60 s", "5 s", "65 s")
    ]


def test_a_time_to_detect_beyond_the_spread_names_the_detector_and_both_times() -> None:
    slow = replace(
        BASE, time_to_detect_s=40.0, firings=(Firing("nhc", "checkpoint", 240.0), *BASE.firings[1:])
    )
    changes = judge(BASE, slow)
    by_detector = next(c for c in changes if c.detector == "nhc")
    assert (by_detector.what, by_detector.before, by_detector.now) == (
        "time to detect by nhc",
        "5 s",
        "240 s",
    )
    assert "above 15 s (max 5 s + 10 s)" in by_detector.reason
    overall = next(c for c in changes if c.what == "time to detect")
    assert overall.regression and "spread" in overall.reason
    # Within the floor: 5 s -> 14 s is jitter of a health check's period, not a regression.
    jitter = (Firing("nhc", "checkpoint", 14.0), *BASE.firings[1:])
    assert judge(BASE, replace(BASE, time_to_detect_s=14.0, firings=jitter)) == []
    # Faster beyond the spread: an improvement.
    fast = only(judge(replace(BASE, time_to_remediate_s=100.0), BASE))
    assert (fast.what, fast.regression) == ("time to remediate", False)


def test_the_spread_of_several_earlier_windows_is_the_rule() -> None:
    times = [30.0, 50.0, 70.0, 90.0]
    # median 60, MAD 20: margin max(3 x 20, 10, 30) = 60; a regression above 90 + 60 = 150 s.
    assert margin(times, 10.0) == 60.0
    earlier = [
        win(f"w{i}", replace(BASE, time_to_remediate_s=t, remediate_within_s=None))
        for i, t in enumerate(times)
    ]
    within = replace(BASE, time_to_remediate_s=149.0, remediate_within_s=None)
    assert compare_windows(win("now", within), earlier).changes == ()
    past = compare_windows(win("now", replace(within, time_to_remediate_s=151.0)), earlier)
    assert [(c.what, c.before_window, c.before, c.now) for c in past.findings] == [
        ("time to remediate", "w3", "90 s", "151 s")
    ]
    assert past.exit_code == 1


def test_more_lost_steps_is_a_finding_fewer_an_improvement() -> None:
    c = only(judge(BASE, replace(BASE, lost_steps=300)))
    assert (c.what, c.before, c.now, c.regression) == ("lost steps", "20 steps", "300 steps", True)
    assert judge(BASE, replace(BASE, lost_steps=30)) == []  # within the floor of 10 steps
    assert only(judge(replace(BASE, lost_steps=300), BASE)).regression is False


def test_an_mde_that_grew_beyond_the_factor_is_a_finding() -> None:
    c = only(judge(BASE, replace(BASE, mde=0.06)))
    assert (c.what, c.before, c.now, c.regression) == ("mde", "3.0%", "6.0%", True)
    assert "noisier" in c.reason
    assert judge(BASE, replace(BASE, mde=0.044)) == []  # under 1.5 x
    assert only(judge(replace(BASE, mde=0.06), BASE)).regression is False


def test_experiments_new_or_not_run_are_listed_not_judged() -> None:
    other = ExperimentRecord("rack-loss", Verdict.BLIND_SPOT)
    result = compare_windows(win("w2", BASE, other), [win("w1", BASE, replace(BASE, name="gone"))])
    assert (result.new, result.not_run, result.changes) == (("rack-loss",), ("gone",), ())


@pytest.mark.parametrize("earlier", [[], ["w0"]])
def test_the_last_window_that_ran_the_experiment_is_the_reference(earlier: list[str]) -> None:
    windows = [win(r, BASE) for r in earlier] + [
        win("w1", replace(BASE, verdict=Verdict.NOT_RECOVERED)),
        win("skip"),
    ]
    c = only(list(compare_windows(win("w3", replace(BASE, verdict=Verdict.BLIND_SPOT)), windows).changes))
    assert (c.before_window, c.before, c.now) == ("w1", "NOT RECOVERED", "BLIND SPOT")
