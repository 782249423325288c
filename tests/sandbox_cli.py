"""The command line as a sandbox test drives it: `python -m slurm_chaos` in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any


def cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `slurm-chaos ARGS` with the sandbox's environment; its output captured, never checked."""
    return subprocess.run(
        [sys.executable, "-m", "slurm_chaos", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def reinstall_plugin(sandbox: Any, chaos_site: Path) -> None:
    """Put the full health check back for whatever runs next (a run installs its own site's)."""
    prefix = str(sandbox.shared_dir.parent / "prefix")
    cli("plugin", "install", "--site", str(chaos_site), "--prefix", prefix, env=sandbox.env)
