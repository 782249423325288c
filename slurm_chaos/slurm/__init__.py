"""Scheduler backend: one small interface to Slurm, over its CLI or pyslurm."""

from __future__ import annotations

from slurm_chaos.slurm.backend import Scheduler, make_scheduler
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.model import (
    AcctRecord,
    ClusterConfig,
    Gres,
    JobInfo,
    JobRecord,
    JobState,
    NodeInfo,
    PartitionInfo,
    ReservationInfo,
    SwitchInfo,
)

__all__ = [
    "AcctRecord",
    "ClusterConfig",
    "Gres",
    "JobInfo",
    "JobRecord",
    "JobState",
    "NodeInfo",
    "PartitionInfo",
    "ReservationInfo",
    "Scheduler",
    "SlurmCLI",
    "SwitchInfo",
    "make_scheduler",
]
