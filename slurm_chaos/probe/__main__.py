"""``python -m slurm_chaos.probe``: one rank of the training probe."""

from __future__ import annotations

import os
import sys

from slurm_chaos.probe.cli import main

code = main()
if code != 0:
    # A failing rank may hold an HDF5 file its storage refuses (ENOSPC, EIO): the library's exit
    # handlers would retry the write and can crash the process, hiding the exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
raise SystemExit(code)
