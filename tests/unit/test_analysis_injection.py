"""A fault whose injection took nowhere is NO EFFECT, naming what was missing; never a blind spot."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.analysis.experiment import analyse_experiment
from slurm_chaos.analysis.model import Comparison, Stats, Verdict
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_experiment
from slurm_chaos.analysis.verdict import judge, not_injected
from slurm_chaos.errors import DataError
from slurm_chaos.rundir import (
    INJECTIONS,
    Expectation,
    FaultWindow,
    InjectionRecord,
    ObservationLog,
    load_injections,
)
from slurm_chaos.rundir.injections import write_record_file

T0 = 1_700_000_000.0
STATS = Stats(500, 0.1, 0.11, 0.12)
FLAT = Comparison(STATS, STATS, 0.001, -0.009, 0.011, 0.5, False, 50, 50, 4)
# gpu-ecc as the library has it: no slowdown expected, a drain within 60 s.
ECC = Expectation(
    expect_regression=False,
    detect_signals=("healthcheck_drain", "signal:gpu_ecc"),
    detect_within_s=60.0,
    remediation=("node_drained",),
)
NO_DCGM = "gpu-ecc: no DCGM host engine on node2 (dcgmi not found): nothing was injected"


def record(node: str, took: bool, detail: str = NO_DCGM, fault: str = "gpu-ecc") -> InjectionRecord:
    return InjectionRecord(fault, node, took, detail, T0)


def quiet(e: Expectation = ECC, crashed: bool = False) -> ObservationLog:
    return ObservationLog(FaultWindow(T0, T0 + 300), (), e, crashed=crashed)


def test_nothing_injected_anywhere_is_no_effect_with_the_reason() -> None:
    other = NO_DCGM.replace("node2", "node1")
    j = judge(FLAT, quiet(), injections=(record("node1", False, other), record("node2", False)))
    assert j.verdict is Verdict.NO_EFFECT
    assert j.reason == f"{other}; {NO_DCGM}"
    # The same silence with no record (a fault that keeps none, an older run) stays a blind spot.
    assert judge(FLAT, quiet()).verdict is Verdict.BLIND_SPOT


def test_an_injection_that_took_on_one_node_is_judged_as_before() -> None:
    took = record("node1", True, "gpu-ecc on node1: DCGM field 311 of GPU 0: read back 1")
    j = judge(FLAT, quiet(), injections=(took, record("node2", False)))
    assert j.verdict is Verdict.BLIND_SPOT
    assert not_injected((took, record("node2", False))) == ""


def test_identical_reasons_are_given_once_and_a_crash_still_comes_first() -> None:
    same = (record("node2", False), record("node2", False))
    assert not_injected(same) == NO_DCGM
    assert judge(FLAT, quiet(crashed=True), injections=same).verdict is Verdict.NOT_RECOVERED


def test_the_analysis_reads_the_records_from_the_fault_jobs_directory(tmp_path: Path) -> None:
    base = JobModel(ranks=4, steps=200, warmup_steps=10, ranks_per_host=2, seed=1)
    exp_dir = tmp_path / "gpu-ecc"
    write_experiment(exp_dir, SyntheticExperiment("gpu-ecc", base, base, ECC, fault_name="gpu-ecc"))
    assert analyse_experiment(exp_dir, "gpu-ecc").result.verdict is Verdict.BLIND_SPOT
    records = exp_dir / "fault" / INJECTIONS
    records.mkdir()
    write_record_file(records / "node2.json", "node2", (record("node2", False),))
    result = analyse_experiment(exp_dir, "gpu-ecc").result
    assert (result.verdict, result.reason) == (Verdict.NO_EFFECT, NO_DCGM)
    (records / "node3.json").write_text(
        '{"node": "node3", "injections": [{"fault": "gpu-ecc", "took": "no"}]}'
    )
    with pytest.raises(DataError, match=r"node3.json: injections\[0\].took: expected true or false"):
        load_injections(exp_dir / "fault")


def test_records_of_a_gpu_fault_decide_nothing_beside_a_fault_that_keeps_none() -> None:
    nowhere = (record("node1", False, NO_DCGM.replace("node2", "node1")), record("node2", False))
    gpu_only = ObservationLog(FaultWindow(T0, T0 + 300), (), ECC, fault="gpu-ecc")
    assert judge(FLAT, gpu_only, injections=nowhere).verdict is Verdict.NO_EFFECT
    # slow-rank keeps no record: it may have taken where the GPU fault did not.
    mixed = ObservationLog(FaultWindow(T0, T0 + 300), (), ECC, fault="gpu-ecc+slow-rank:rank=1,percent=30")
    assert not_injected(nowhere, mixed.fault) == ""
    assert judge(FLAT, mixed, injections=nowhere).verdict is Verdict.BLIND_SPOT
