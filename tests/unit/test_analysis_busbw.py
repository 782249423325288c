"""Bus bandwidth of an allreduce sweep from its rank files: per step bytes (the reader), nccl-tests'
busbw over the steps (the analysis), for files of this version and of the versions before it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.analysis.busbw import run_busbw
from slurm_chaos.analysis.model import BusBandwidth, BusbwResult, ExperimentResult, Verdict
from slurm_chaos.probe.reader import read_run
from slurm_chaos.probe.writer import RankWriter, StepRecord

SIZES = (1 << 20, 1 << 22)  # 1 MiB, 4 MiB
ITERS = 3


def write_sweep(
    run: Path,
    world: int,
    seconds: list[list[float]],
    sizes: tuple[int, ...] = SIZES,
    attrs: dict[str, object] | None = None,
    mode: str = "allreduce",
) -> None:
    """One rank file per rank; `seconds[rank]` its step times, ITERS steps per size."""
    run.mkdir(exist_ok=True)
    for rank in range(world):
        base = {"rank": rank, "world_size": world, "host": f"node{rank}", "job_id": "7", "mode": mode}
        w = RankWriter(
            run / f"rank-{rank}.h5", base | (attrs or {"allreduce_iterations": ITERS}), allreduce=True
        )
        for step, dt in enumerate(seconds[rank]):
            w.append_step(StepRecord(step, 1000.0 + step, dt, comm_time=dt))
        w.allreduce_rows([(size, 0.0, 0.0, 0.0) for size in sizes])
        w.close()


def test_allreduce_bytes_per_step_from_the_iterations_attribute(tmp_path: Path) -> None:
    write_sweep(tmp_path / "run", 1, [[0.01] * 6])
    (rank,) = read_run(tmp_path / "run").ranks
    assert rank.allreduce_bytes() == pytest.approx([SIZES[0]] * 3 + [SIZES[1]] * 3)


def test_a_file_from_before_the_attribute_uses_steps_planned(tmp_path: Path) -> None:
    write_sweep(tmp_path / "run", 1, [[0.01] * 6], attrs={"steps_planned": ITERS})
    (rank,) = read_run(tmp_path / "run").ranks
    assert rank.allreduce_bytes() == pytest.approx([SIZES[0]] * 3 + [SIZES[1]] * 3)


def test_steps_of_a_size_without_its_row_have_no_bytes(tmp_path: Path) -> None:
    # Killed in the second size: its row was never written.
    write_sweep(tmp_path / "run", 1, [[0.01] * 5], sizes=SIZES[:1])
    (rank,) = read_run(tmp_path / "run").ranks
    got = rank.allreduce_bytes()
    assert got is not None and got[:3].tolist() == [SIZES[0]] * 3 and np.isnan(got[3:]).all()


def test_a_training_run_has_no_allreduce_bytes_and_no_busbw(tmp_path: Path) -> None:
    write_sweep(tmp_path / "run", 2, [[0.01] * 6] * 2, mode="train")
    run = read_run(tmp_path / "run")
    assert run.ranks[0].allreduce_bytes() is None and run_busbw(run) is None


def test_busbw_is_nccl_tests_over_the_slowest_ranks_step_time(tmp_path: Path) -> None:
    # Four ranks: 2(n-1)/n = 1.5. Rank 3 is the slowest on every step: its time is the step's.
    fast = [0.001] * 3 + [0.002] * 3
    slow = [0.002, 0.002, 0.004, 0.004, 0.008, 0.004]
    write_sweep(tmp_path / "run", 4, [fast, fast, fast, slow])
    got = run_busbw(read_run(tmp_path / "run"))
    algbw = [SIZES[0] / t / 1e9 for t in slow[:3]] + [SIZES[1] / t / 1e9 for t in slow[3:]]
    busbw = [a * 1.5 for a in algbw]
    assert got is not None and got.steps == 6
    assert got.mean_gbps == pytest.approx(float(np.mean(busbw)))
    assert got.median_gbps == pytest.approx(float(np.median(busbw)))
    # By hand, one step: 1 MiB in 2 ms is 0.524 GB/s algbw, 0.786 GB/s busbw.
    assert busbw[0] == pytest.approx(1.048576 / 2 * 1.5)


def test_busbw_reaches_report_json() -> None:
    result = ExperimentResult(
        "nccl-degrade",
        "nccl-degrade:ib=off",
        Verdict.BLIND_SPOT,
        "median busbw 3.00 GB/s, below ...",
        None,
        busbw=BusbwResult(BusBandwidth(70, 21.123456, 20.0), BusBandwidth(70, 3.3, 3.0), 10.0),
    )
    assert result.to_json()["busbw"] == {
        "baseline": {"steps": 70, "mean_gbps": 21.1235, "median_gbps": 20.0},
        "fault_run": {"steps": 70, "mean_gbps": 3.3, "median_gbps": 3.0},
        "min_gbps": 10.0,
    }
    assert ExperimentResult("x", "f", Verdict.PASSED, "", None).to_json()["busbw"] is None


def test_an_experiment_whose_fault_run_is_below_the_floor_is_judged_on_it(tmp_path: Path) -> None:
    from slurm_chaos.analysis.experiment import analyse_experiment
    from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog, write_observations

    exp = tmp_path / "nccl-degrade"
    exp.mkdir()
    rng = np.random.default_rng(1)
    attrs = {"allreduce_iterations": 30}
    # 4 MiB in ~0.4 ms (10.5 GB/s busbw at two ranks) against ~4 ms (1 GB/s) under the fault.
    write_sweep(exp / "baseline", 2, [list(0.0004 * (1 + 0.01 * rng.random(60)))] * 2, attrs=attrs)
    write_sweep(exp / "fault", 2, [list(0.004 * (1 + 0.01 * rng.random(60)))] * 2, attrs=attrs)
    floor = Expectation(expect_regression=True, min_busbw_gbps=5.0)
    write_observations(exp / "observations.json", ObservationLog(FaultWindow(0.0), (), floor))
    result = analyse_experiment(exp, "nccl-degrade").result
    assert result.busbw is not None and result.busbw.min_gbps == 5.0
    assert result.busbw.baseline is not None and result.busbw.baseline.median_gbps > 5.0
    assert result.busbw.fault is not None and result.busbw.fault.median_gbps < 5.0
    assert result.verdict is Verdict.BLIND_SPOT
    assert f"median busbw {result.busbw.fault.median_gbps:.2f} GB/s, below the hypothesis' " in result.reason
    assert "min_busbw_gbps 5 GB/s" in result.reason
    assert result.to_json()["busbw"]["min_gbps"] == 5.0
