"""Verdict rules and observations.json parsing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_chaos.analysis.model import BusBandwidth, BusbwResult, Comparison, Stats, Verdict
from slurm_chaos.analysis.verdict import judge, signal_matches
from slurm_chaos.errors import DataError
from slurm_chaos.rundir import (
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    load_observations,
    observations_from_json,
    observations_to_json,
    write_observations,
)

T0 = 1_700_000_000.0
STATS = Stats(500, 0.1, 0.11, 0.12)


def comparison(regression: float, significant: bool, reason: str = "") -> Comparison:
    return Comparison(
        STATS,
        STATS,
        regression,
        regression - 0.01,
        regression + 0.01,
        1e-9 if significant else 0.5,
        significant,
        50,
        50,
        4,
        inconclusive_reason=reason,
    )


SLOWED = comparison(0.2, True)
FLAT = comparison(0.001, False)
NOISY = comparison(0.03, False, "too noisy: ...")

DETECT = Expectation(detect_signals=("alert_firing:GpuSlow", "node_drained"), detect_within_s=60.0)
REMEDIATE = replace(
    DETECT, remediation=("drain", "requeue", "resume"), remediate_within_s=600.0, max_lost_steps=100
)


def log(expectation: Expectation, *observed: tuple[str, float], crashed: bool = False) -> ObservationLog:
    return ObservationLog(
        FaultWindow(T0, T0 + 300),
        tuple(Observation(s, T0 + dt, "") for s, dt in observed),
        expectation,
        crashed=crashed,
    )


def test_passed_when_detected_in_time() -> None:
    j = judge(SLOWED, log(DETECT, ("alert_firing:GpuSlow", 42.0)))
    assert j.verdict is Verdict.PASSED
    assert (j.detected_by, j.time_to_detect_s) == ("alert_firing:GpuSlow", 42.0)


def test_blind_spot_when_slowdown_goes_undetected() -> None:
    j = judge(SLOWED, log(DETECT, ("alert_firing:Other", 5.0)))
    assert j.verdict is Verdict.BLIND_SPOT
    assert "+20.0%" in j.reason


def test_late_detection_is_a_blind_spot() -> None:
    j = judge(SLOWED, log(DETECT, ("node_drained", 90.0)))
    assert j.verdict is Verdict.BLIND_SPOT
    assert "after 90 s, deadline 60 s" in j.reason
    assert j.time_to_detect_s == 90.0


def test_signals_before_the_fault_do_not_count() -> None:
    assert judge(SLOWED, log(DETECT, ("node_drained", -10.0))).verdict is Verdict.BLIND_SPOT


def test_no_effect_when_nothing_happened() -> None:
    assert judge(FLAT, log(DETECT)).verdict is Verdict.NO_EFFECT


def test_detection_proves_the_fault_took_even_without_slowdown() -> None:
    j = judge(FLAT, log(DETECT, ("node_drained", 3.0)))
    assert j.verdict is Verdict.PASSED
    # ... and the reason says the expected slowdown was not measured, not just the numbers.
    assert j.reason.endswith(
        "step time +0.1% [-0.9%, +1.1%], not significant: the expected slowdown was not measured"
    )
    assert "not measured" not in judge(SLOWED, log(DETECT, ("node_drained", 3.0))).reason


def test_inconclusive_when_too_noisy() -> None:
    j = judge(NOISY, log(DETECT))
    assert j.verdict is Verdict.INCONCLUSIVE
    assert j.reason.startswith("too noisy")


def test_crash_is_not_recovered() -> None:
    j = judge(SLOWED, log(DETECT, ("node_drained", 1.0), crashed=True))
    assert j.verdict is Verdict.NOT_RECOVERED


def test_remediation_in_time_passes_and_is_timed() -> None:
    j = judge(
        SLOWED,
        log(REMEDIATE, ("node_drained", 10.0), ("job_requeued", 30.0), ("resumed_from_checkpoint", 200.0)),
        lost_steps=20,
    )
    assert j.verdict is Verdict.PASSED
    assert j.time_to_remediate_s == 200.0


def test_missing_or_late_remediation_is_not_recovered() -> None:
    missing = judge(SLOWED, log(REMEDIATE, ("node_drained", 10.0), ("job_requeued", 30.0)))
    assert missing.verdict is Verdict.NOT_RECOVERED and "'resume'" in missing.reason
    late = judge(
        SLOWED,
        log(REMEDIATE, ("node_drained", 10.0), ("job_requeued", 30.0), ("resumed_from_checkpoint", 900.0)),
    )
    assert late.verdict is Verdict.NOT_RECOVERED and "deadline 600 s" in late.reason


def test_too_many_lost_steps_is_not_recovered() -> None:
    j = judge(
        SLOWED,
        log(REMEDIATE, ("node_drained", 10.0), ("job_requeued", 30.0), ("resumed_from_checkpoint", 60.0)),
        lost_steps=101,
    )
    assert j.verdict is Verdict.NOT_RECOVERED and "lost 101 steps" in j.reason


def test_undeclared_detection_and_a_slowdown_nobody_saw_is_a_blind_spot() -> None:
    assert judge(SLOWED, log(Expectation())).verdict is Verdict.BLIND_SPOT
    assert judge(SLOWED, log(Expectation(), ("alert_firing:Any", 5.0))).verdict is Verdict.PASSED


def test_aa_experiment_passes() -> None:
    assert judge(FLAT, log(Expectation(expect_regression=False))).verdict is Verdict.PASSED


def test_a_control_that_draws_a_detection_is_a_false_alarm() -> None:
    """Nothing injected and nothing expected: a drain, an alert or a detector is monitoring crying
    wolf, a finding (exit 1, a JUnit failure), not a PASSED detection."""
    control = Expectation(expect_regression=False)
    drained = ObservationLog(
        FaultWindow(T0, None),
        (Observation("healthcheck_drain", T0 + 4.0, "node1: straggler: job 11 rank 0"),),
        control,
    )
    j = judge(FLAT, drained)
    assert j.verdict is Verdict.FALSE_ALARM
    assert j.reason == (
        "nothing was injected, yet healthcheck_drain after 4 s (node1: straggler: job 11 rank 0)"
    )
    assert judge(SLOWED, log(control, ("alert_firing:Any", 5.0))).verdict is Verdict.FALSE_ALARM
    # A signal from before the job's start is not the job's.
    assert judge(FLAT, log(control, ("node_drained", -30.0))).verdict is Verdict.PASSED
    # A probe event is not monitoring; a fault (any SPEC) is expected to be seen.
    assert judge(FLAT, log(control, ("gpu_xid", 2.0))).verdict is Verdict.PASSED
    faulted = replace(drained, fault="slow-rank:rank=1,percent=10")
    assert judge(FLAT, faulted).verdict is Verdict.PASSED
    # A crashed control is NOT RECOVERED first.
    assert judge(FLAT, replace(drained, crashed=True)).verdict is Verdict.NOT_RECOVERED


def test_expected_signal_without_slowdown_missing_is_a_blind_spot() -> None:
    xid = Expectation(expect_regression=False, detect_signals=("gpu_xid",), detect_within_s=30.0)
    assert judge(FLAT, log(xid)).verdict is Verdict.BLIND_SPOT
    assert judge(FLAT, log(xid, ("gpu_xid", 2.0))).verdict is Verdict.PASSED


def test_verdict_values_are_the_printed_words() -> None:
    assert [v.value for v in Verdict] == [
        "PASSED",
        "BLIND SPOT",
        "NOT RECOVERED",
        "NO EFFECT",
        "INCONCLUSIVE",
        "FALSE ALARM",
    ]


@pytest.mark.parametrize(
    ("observed", "wanted", "match"),
    [
        ("node_drained", "node_drained", True),
        ("alert_firing:GpuHot", "alert_firing", True),
        ("alert_firing:GpuHot", "alert_firing:Gpu*", True),
        ("alert_firing_x", "alert_firing", False),
        ("job_requeued", "node_drained", False),
    ],
)
def test_signal_matching(observed: str, wanted: str, match: bool) -> None:
    assert signal_matches(observed, wanted) is match


def _busbw(baseline: float | None, fault: float | None, floor: float | None = 10.0) -> BusbwResult:
    def run(median: float | None) -> BusBandwidth | None:
        return None if median is None else BusBandwidth(70, median * 1.1, median)

    return BusbwResult(run(baseline), run(fault), floor)


FLOOR = replace(DETECT, min_busbw_gbps=10.0)


def test_a_baseline_below_the_busbw_floor_is_inconclusive() -> None:
    j = judge(SLOWED, log(FLOOR, ("node_drained", 5.0)), busbw=_busbw(8.5, 3.0))
    assert j.verdict is Verdict.INCONCLUSIVE
    assert "baseline's median busbw 8.50 GB/s is below the hypothesis' min_busbw_gbps 10 GB/s" in j.reason


def test_a_fault_run_below_the_busbw_floor_must_be_detected() -> None:
    # Step time is too noisy to tell, and no detection: the floor alone makes it a blind spot.
    blind = judge(NOISY, log(FLOOR), busbw=_busbw(20.0, 3.25))
    assert blind.verdict is Verdict.BLIND_SPOT
    assert blind.reason.startswith("median busbw 3.25 GB/s, below the hypothesis' min_busbw_gbps 10 GB/s")
    assert "but no alert_firing:GpuSlow/node_drained in time" in blind.reason
    # Nothing declared, no slowdown expected: an absolute floor is no noise, still a blind spot.
    quiet = Expectation(expect_regression=False, min_busbw_gbps=10.0)
    j = judge(FLAT, log(quiet), busbw=_busbw(20.0, 3.25))
    assert j.verdict is Verdict.BLIND_SPOT and "and no monitoring signal at all" in j.reason
    # Detected in time: PASSED, the breach stated.
    seen = judge(FLAT, log(FLOOR, ("node_drained", 5.0)), busbw=_busbw(20.0, 3.25))
    assert seen.verdict is Verdict.PASSED
    assert "median busbw 3.25 GB/s, below the hypothesis' min_busbw_gbps 10 GB/s" in seen.reason


def test_busbw_at_or_above_the_floor_or_no_floor_changes_nothing() -> None:
    for busbw in (_busbw(20.0, 10.0), _busbw(20.0, 3.0, floor=None), None):
        expectation = FLOOR if busbw is None or busbw.min_gbps is not None else DETECT
        assert judge(NOISY, log(expectation), busbw=busbw) == judge(NOISY, log(DETECT))
    assert judge(NOISY, log(DETECT)).verdict is Verdict.INCONCLUSIVE


def test_observations_round_trip(tmp_path: Path) -> None:
    original = replace(log(REMEDIATE, ("node_drained", 10.0), ("job_requeued", 3.0)), fault="gpu-xid")
    original = replace(original, expectation=replace(original.expectation, min_busbw_gbps=12.5))
    write_observations(tmp_path / "observations.json", original)
    back = load_observations(tmp_path / "observations.json")
    assert back.expectation == original.expectation
    assert back.fault_window == original.fault_window and back.fault == "gpu-xid"
    assert [o.signal for o in back.observations] == ["job_requeued", "node_drained"]  # sorted by time


def test_a_time_in_whole_seconds_is_written_with_its_resolution_and_older_files_read_without() -> None:
    rounded = Observation("node_drained", T0 - 0.4, "node1: NHC", resolution_s=1.0)
    raw = observations_to_json(replace(log(DETECT), observations=(rounded, Observation("job_requeued", T0))))
    assert [o.get("resolution_s") for o in raw["observations"]] == [1.0, None]
    assert observations_from_json(raw).observations == (rounded, Observation("job_requeued", T0))
    raw["observations"][0]["resolution_s"] = -1
    with pytest.raises(DataError, match=r"observations\[0\]\.resolution_s"):
        observations_from_json(raw)


def test_a_drain_slurm_timed_a_fraction_of_a_second_early_is_detected_in_the_window() -> None:
    early = replace(log(DETECT), observations=(Observation("node_drained", T0 - 0.6, "", resolution_s=1.0),))
    j = judge(FLAT, early)
    assert (j.verdict, j.detected_by, j.time_to_detect_s) == (Verdict.PASSED, "node_drained", 0.0)
    stale = replace(log(DETECT), observations=(Observation("node_drained", T0 - 2, "", resolution_s=1.0),))
    assert judge(FLAT, stale).detected_by is None


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"observations": []}, "fault_window"),
        ({"fault_window": {"start": "soon"}}, "fault_window.start"),
        ({"fault_window": {"start": 1.0}, "observations": [{"time": 2.0}]}, "observations[0].signal"),
        ({"fault_window": {"start": 1.0}, "expectation": {"detect_within": 5}}, "expectation.detect_within"),
        (
            {"fault_window": {"start": 1.0}, "expectation": {"max_lost_steps": -1}},
            "expectation.max_lost_steps",
        ),
        ({"fault_window": {"start": 1.0}, "crashed": "no"}, "crashed"),
    ],
)
def test_malformed_observations_name_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(DataError, match=key.replace("[", r"\[").replace("]", r"\]")):
        observations_from_json(raw)


def test_observations_file_missing_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_observations(tmp_path / "observations.json")
    (tmp_path / "observations.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_observations(tmp_path / "observations.json")


def test_window_end_may_be_null() -> None:
    parsed = observations_from_json(json.loads('{"fault_window": {"start": 5, "end": null}}'))
    assert parsed.fault_window == FaultWindow(5.0, None)
    assert parsed.fault_window.contains(1e12)


def test_a_faster_fault_run_points_at_the_baseline() -> None:
    j = judge(comparison(-0.25, True), log(DETECT))
    assert j.verdict is Verdict.NO_EFFECT
    assert "25% faster than its baseline" in j.reason


def test_a_between_run_slowdown_is_no_sign_of_a_fault_judged_on_events() -> None:
    """An event fault (a drain) detected in time passes even when its run was slower than the
    baseline; one that nothing saw is a blind spot for the missing detection, not the step time."""
    events = replace(DETECT, expect_regression=False)
    passed = judge(SLOWED, log(events, ("node_drained", 5.0)))
    assert passed.verdict is Verdict.PASSED
    assert "between runs, where this fault is not expected to slow the job" in passed.reason
    missed = judge(SLOWED, log(events))
    assert missed.verdict is Verdict.BLIND_SPOT
    assert missed.reason.startswith("expected alert_firing:GpuSlow/node_drained in time, none seen")
    assert "+20.0%" in missed.reason


def test_an_aa_control_that_slows_down_is_inconclusive_not_a_blind_spot() -> None:
    j = judge(SLOWED, log(Expectation(expect_regression=False)))
    assert j.verdict is Verdict.INCONCLUSIVE
    assert "no slowdown was expected" in j.reason and "+20.0%" in j.reason
