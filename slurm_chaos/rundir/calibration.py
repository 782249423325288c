"""``calibration.json``: the result of an A/A calibration (`slurm-chaos calibrate`), and its one
number a campaign uses, ``recommended_min_effect`` (``campaign --calibration FILE``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_chaos.errors import DataError

CALIBRATION_FILE = "calibration.json"


def write_calibration(run_dir: Path, record: Mapping[str, Any]) -> Path:
    """Write the calibration's JSON record into the run directory (atomically)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CALIBRATION_FILE
    tmp = run_dir / (CALIBRATION_FILE + ".tmp")
    tmp.write_text(json.dumps(dict(record), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_recommended_min_effect(path: Path) -> float:
    """The ``recommended_min_effect`` of a calibration.json written by `slurm-chaos calibrate`."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(
            f"{path}: no such calibration file (write one with 'slurm-chaos calibrate')"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not a calibration file ({exc})") from exc
    value = data.get("recommended_min_effect") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 10:
        raise DataError(f"{path}: recommended_min_effect: expected a fraction such as 0.2, got {value!r}")
    return float(value)
