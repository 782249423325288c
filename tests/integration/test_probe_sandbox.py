"""The probe under real Slurm on the sandbox: multi-node gloo runs, PMIx/mpi4py launch, requeue resume."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurm_chaos.probe.reader import RunData, read_rank, read_run
from slurm_chaos.runner import SubprocessRunner

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
RUN = SubprocessRunner()


def _job_dir(sandbox: Any, label: str) -> Path:
    d = Path(sandbox.shared_dir) / f"probe-{label}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    return d


def _script(d: Path, nodes: int, srun_args: str, probe_args: str, extra_sbatch: str = "") -> Path:
    """A batch script that stamps the wall time around one srun of the probe."""
    path = d / "job.sbatch"
    path.write_text(
        f"""#!/bin/bash
#SBATCH --nodes={nodes} --ntasks-per-node=1 --output={d}/slurm-%j.out --open-mode=append
#SBATCH --job-name=probe-{d.name} {extra_sbatch}
export PYTHONPATH={REPO}
echo "srun_start $(date +%s.%N) restart ${{SLURM_RESTART_COUNT:-0}}"
srun {srun_args} {sys.executable} -m slurm_chaos.probe --out {d}/run {probe_args}
rc=$?
echo "srun_end $(date +%s.%N) rc $rc"
exit $rc
"""
    )
    return path


def _sbatch_wait(sandbox: Any, script: Path, timeout: float = 600) -> str:
    res = RUN(["sbatch", "--parsable", "--wait", str(script)], env=sandbox.env, timeout=timeout)
    out = (
        (script.parent / "slurm-{}.out".format(res.stdout.strip().split(";")[0])).read_text()
        if res.stdout
        else ""
    )
    assert res.ok, f"sbatch failed ({res.returncode}): {res.stderr}\n{out}"
    return res.stdout.strip().split(";")[0]


def _stamps(d: Path, job_id: str, key: str) -> list[float]:
    lines = (d / f"slurm-{job_id}.out").read_text().splitlines()
    return [float(line.split()[1]) for line in lines if line.startswith(key + " ")]


def _window(run: RunData) -> tuple[float, float]:
    first = min(float(r.t_start[0]) for r in run.ranks)
    last = max(float(r.t_start[-1] + r.step_time[-1]) for r in run.ranks)
    return first, last


@pytest.mark.parametrize("nodes", [2, 4])
def test_multi_node_gloo_run_agrees_with_wall_time(sandbox: Any, nodes: int) -> None:
    steps = 30
    d = _job_dir(sandbox, f"n{nodes}")
    job_id = _sbatch_wait(sandbox, _script(d, nodes, "", f"--steps {steps} --progress-every 10"))
    run = read_run(d / "run")
    assert run.world_size == nodes
    assert sorted(run.hosts) == [f"node{i}" for i in range(1, nodes + 1)]
    (start,), (end,) = _stamps(d, job_id, "srun_start"), _stamps(d, job_id, "srun_end")
    first, last = _window(run)
    assert start < first < last < end
    # Start-up (imports, rendezvous) and shutdown are outside the steps, bounded all the same.
    assert (end - start) - (last - first) < 90
    for rk in run.ranks:
        assert rk.job_id == job_id and rk.attrs["rendezvous"] == "slurm" and rk.attrs["backend"] == "gloo"
        assert rk.step.tolist() == list(range(steps))
        total = float(rk.step_time.sum())
        # Steps are back to back: their sum fills the window but for the per-step bookkeeping.
        assert 0.9 * (last - first) < total <= (last - first) + 1e-3
        assert np.all(rk.comm_time > 0) and np.all(rk.comm_time < rk.step_time)
    # All ranks finish each step together (the all_reduce is a barrier), so their clocks line up.
    m = np.stack([r.t_start for r in run.ranks])
    assert float(np.max(np.ptp(m, axis=0))) < 5.0
    summary = (d / f"slurm-{job_id}.out").read_text()
    assert f'"world_size": {nodes}' in summary and f'"steps": {steps}' in summary


def test_pmix_launch_with_mpi4py(sandbox: Any) -> None:
    d = _job_dir(sandbox, "pmix")
    job_id = _sbatch_wait(sandbox, _script(d, 2, "--mpi=pmix", "--steps 10 --progress-every 0"))
    run = read_run(d / "run")
    assert [r.attrs["rendezvous"] for r in run.ranks] == ["mpi", "mpi"]
    assert sorted(run.hosts) == ["node1", "node2"]
    assert all(len(r.step) == 10 and r.job_id == job_id for r in run.ranks)


def _wait_for_steps(path: Path, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = len(read_rank(path).step)
            if n >= at_least:
                return n
        except Exception:  # the file does not exist yet, or has no flush yet
            pass
        time.sleep(1)
    raise AssertionError(f"{path}: fewer than {at_least} steps after {timeout} s")


def _squeue_state(sandbox: Any, job_id: str) -> str:
    return RUN(["squeue", "-h", "-j", job_id, "-o", "%T"], env=sandbox.env, timeout=30).stdout.strip()


def test_requeued_job_resumes_from_checkpoint_and_records_lost_steps(sandbox: Any) -> None:
    d = _job_dir(sandbox, "requeue")
    probe_args = f"--steps 200 --ckpt-dir {d}/ckpt --ckpt-every 20 --progress-every 0 --flush-interval 0.5"
    res = RUN(
        ["sbatch", "--parsable", str(_script(d, 2, "", probe_args, "--requeue"))], env=sandbox.env, timeout=30
    )
    assert res.ok, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    _wait_for_steps(d / "run" / "rank-0.h5", 50, timeout=180)
    assert RUN(["scontrol", "requeue", job_id], env=sandbox.env, timeout=30).ok
    deadline = time.monotonic() + 400
    while _squeue_state(sandbox, job_id) and time.monotonic() < deadline:
        time.sleep(2)
    assert not _squeue_state(sandbox, job_id), "requeued job did not finish in time"
    out = (d / f"slurm-{job_id}.out").read_text()
    assert "restart 1" in out and "rc 0" in out, out[-3000:]
    run = read_run(d / "run")
    for rk in run.ranks:
        first = read_rank(d / "run" / f"rank-{rk.rank}.attempt-0.h5")
        last_before = int(first.step[-1])
        restart = int(str(rk.attrs["restart_step"]))
        assert restart > 0 and restart % 20 == 0 and restart <= last_before + 1
        assert rk.attrs["restart_count"] == 1 and rk.attrs["attempt"] == 1
        assert rk.attrs["steps_lost"] == last_before + 1 - restart
        (resumed,) = [e for e in rk.events if e.kind == "resumed"]
        assert f"steps_lost={last_before + 1 - restart}" in resumed.detail
        assert float(str(rk.attrs["recovery_time"])) > 0
        assert rk.step.tolist() == list(range(last_before + 1)) + list(range(restart, 200))
    assert len({float(str(r.attrs["param_checksum"])) for r in run.ranks}) == 1
