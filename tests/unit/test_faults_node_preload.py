"""The LD_PRELOAD checkpoint I/O shim, built and exercised by its own C and Python checks.

``make -C preload test`` runs each C scenario twice (the program under LD_PRELOAD of the hardened
shim, and the same program linked with the shim's sources under ASan+UBSan), the fd-mark table's
unit test, an exported-symbol check, a Python program and, where a C++ compiler exists, an
``std::ofstream`` program under the shim. ``make fuzz-smoke`` fuzzes the path normaliser.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRELOAD = Path(__file__).resolve().parents[2] / "preload"

pytestmark = [
    pytest.mark.skipif(
        shutil.which("cc") is None or shutil.which("make") is None, reason="needs cc and make"
    ),
    pytest.mark.spawns,
]

# Each runs as "NAME: ok" (preloaded) and "san NAME: ok" (linked, ASan+UBSan).
SCENARIOS = (
    "enospc",
    "eio",
    "hang",
    "stdio",
    "stdio_fileno",
    "after",
    "passive",
    "socket_dirfd",  # openat on a socket or pipe dirfd: the normaliser's non-absolute base
    "fd_reuse",  # a close behind close()'s back: syscall(SYS_close), close_range, closefrom
    "dup_fds",  # dup, dup2, dup3, fcntl F_DUPFD/F_DUPFD_CLOEXEC, fcntl64
    "tmpfile",  # O_TMPFILE, linkat (AT_EMPTY_PATH, /proc/self/fd/N), link, rename* old paths
    "write_calls",  # ftruncate, truncate, fallocate, posix_fallocate, pwritev2, copy_file_range, sendfile,
    "read_calls",  # ... mmap; and from a checkpoint file: sendfile, copy_file_range, mmap, preadv
    "errno_kept",
    "errno_hang",
    "threads",
    "preinit",  # a wrapped call before libc is set up
    "reenter",  # a getenv that does I/O while the shim initialises
)


def _make(build: Path, *targets: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(PRELOAD), f"B={build}", *targets],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_preload_shim_scenarios(tmp_path: Path) -> None:
    res = _make(tmp_path / "build", "test")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    for scenario in SCENARIOS:
        assert f"\n{scenario}: ok" in res.stdout, scenario
        assert f"\nsan {scenario}: ok" in res.stdout, scenario
    assert "fdmark: 0 failures" in res.stdout
    assert "wrapped functions, nothing else" in res.stdout  # exports: the wrappers only
    assert "python: ok" in res.stdout
    # fds past 65536 need RLIMIT_NOFILE above that; else the scenario says it skipped.
    assert "high_fds: ok" in res.stdout or "high_fds: skipped" in res.stdout
    if shutil.which("c++"):
        assert "c++ ofstream: ok" in res.stdout
    assert "now active under" in res.stderr  # the shim says in the job's log when it starts failing


def test_path_normaliser_fuzz_smoke(tmp_path: Path) -> None:
    res = _make(tmp_path / "build", "fuzz-smoke", "FUZZ_SECONDS=2")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert ("Done" in out and "runs" in out) or "no failure" in out
