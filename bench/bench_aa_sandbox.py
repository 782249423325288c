"""Benchmark: the A/A false-positive rate on the sandbox, at a calibrated threshold, on held-out runs.

Usage: python bench/bench_aa_sandbox.py --site site_configs/sandbox.yaml [--calibration-runs 10]
       [--held-out-runs 16] [--out DIR]

Runs the control job (no fault) --calibration-runs times and calibrates (`slurm-chaos calibrate`),
then runs it --held-out-runs times more and judges every pair of those at the recommended threshold.
Prints both sets' run-to-run spread, the false-positive rate at the campaigns' own 5% and at the
calibrated threshold, and the control verdicts (any but PASSED there is a false alarm a campaign
would report). The two sets are measured one after the other, so a machine whose noise changes
between them shows it as a higher held-out rate: that is the point of holding them out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def calibrate(site: str, runs: int, out: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "slurm_chaos", "calibrate", "--site", site, "--runs", str(runs)]
    res = subprocess.run([*argv, "--out", str(out), "-q", *extra], capture_output=True, text=True)
    if res.returncode not in (0, 1):
        raise SystemExit(f"calibrate failed ({res.returncode}):\n{res.stderr}")
    data: dict[str, Any] = json.loads((out / "calibration.json").read_text())
    return data


def line(name: str, data: dict[str, Any]) -> str:
    return (
        f"{name:<12} runs {len(data['runs']):>3}  pairs {data['pairs']:>4}  "
        f"spread {100 * float(data['run_spread']):5.1f}%  "
        f"min_effect {100 * float(data['min_effect']):5.1f}%  "
        f"false positives {data['false_positives']:>3} = {100 * data['false_positive_rate']:5.2f}% "
        f"(95% upper {100 * data['false_positive_rate_upper_95']:5.2f}%)  verdicts {data['verdicts']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True)
    parser.add_argument("--calibration-runs", type=int, default=10)
    parser.add_argument("--held-out-runs", type=int, default=16)
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        cal = calibrate(args.site, args.calibration_runs, root / "calibration")
        print(line("calibration", cal))
        print(f"recommended min_effect {100 * float(cal['recommended_min_effect']):.1f}%")
        held = calibrate(
            args.site,
            args.held_out_runs,
            root / "held-out",
            "--calibration",
            str(root / "calibration" / "calibration.json"),
        )
        print(line("held out", held))
    alarms = sum(n for v, n in held["verdicts"].items() if v != "PASSED")
    rate = float(held["false_positive_rate"])
    print(
        f"held-out A/A at the calibrated threshold: false-positive rate {100 * rate:.2f}% "
        f"(goal <= 1%), {alarms} control verdicts not PASSED (goal 0); took {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
