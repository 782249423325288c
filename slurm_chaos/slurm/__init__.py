"""Scheduler backend: one small interface to Slurm, over its CLI or pyslurm."""

from __future__ import annotations

from slurm_chaos.slurm.backend import Scheduler, make_scheduler
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.model import AcctRecord, JobInfo, JobRecord, JobState, NodeInfo, ReservationInfo

__all__ = [
    "AcctRecord",
    "JobInfo",
    "JobRecord",
    "JobState",
    "NodeInfo",
    "ReservationInfo",
    "Scheduler",
    "SlurmCLI",
    "make_scheduler",
]
