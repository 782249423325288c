"""``python -m slurm_chaos.probe``: one rank of the training probe."""

from __future__ import annotations

from slurm_chaos.probe.cli import leave, main

leave(main())
