"""GPU faults on the sandbox, whose nodes have no GPU: nothing to inject, so NO EFFECT, never BLIND SPOT.

Written with #12 item 1 and not yet run (the sandbox was busy); the parser, decision and verdict
parts are covered by tests/unit/test_faults_node_gpu.py and tests/unit/test_analysis_injection.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_chaos.rundir import load_injections

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


@pytest.mark.parametrize("experiment", ["gpu-ecc", "gpu-xid"])
def test_a_gpu_fault_without_gpus_is_no_effect_and_says_why(  # type: ignore[no-untyped-def]
    sandbox, chaos_site: Path, tmp_path: Path, experiment: str
) -> None:
    out = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_chaos",
            "run",
            "--site",
            str(chaos_site),
            experiment,
            "--out",
            str(out),
            "-q",
        ],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 1, res.stderr
    (entry,) = json.loads((out / "report.json").read_text())["experiments"]
    assert entry["verdict"] == "NO EFFECT", entry["reason"]
    assert "nothing was injected" in entry["reason"] and "SLURM_JOB_GPUS" in entry["reason"]
    # Every node of the fault job copied its record into the run directory.
    records = load_injections(out / "experiments" / experiment / "fault")
    assert len({r.node for r in records}) == 2 and not any(r.took for r in records), records
