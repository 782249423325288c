"""The LD_PRELOAD checkpoint I/O shim, built and exercised by its own C and Python checks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRELOAD = Path(__file__).resolve().parents[2] / "preload"


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None, reason="needs cc and make")
def test_preload_shim_scenarios(tmp_path: Path) -> None:
    build = tmp_path / "build"
    res = subprocess.run(
        ["make", "-C", str(PRELOAD), f"B={build}", "test"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for scenario in (
        "enospc: ok",
        "eio: ok",
        "hang: ok",
        "stdio: ok",
        "after: ok",
        "passive: ok",
        "python: ok",
    ):
        assert scenario in res.stdout
    assert "now active under" in res.stderr  # the shim says in the job's log when it starts failing
