"""HDF5 layout of the probe's per-rank files (one file `rank-<R>.h5` per rank).

Schema version 3 (version 2 plus a switchback run's fault columns; readers take 1, 2 and 3;
version 2 added the ``meta`` attribute):

File attributes: ``schema_version`` (int), ``rank``, ``world_size``, ``local_rank`` (int),
``host``, ``job_id`` (str), ``start_time`` (float, Unix seconds), ``mode`` ("train" or
"allreduce"), ``backend`` ("gloo", "nccl" or "mpi"), ``restart_step`` (int, the first step of this
run: 0 for a fresh start, >0 after resuming from a checkpoint), ``cpu_affinity`` (str, e.g. "0-3"),
``cpu_numa_nodes`` (str), ``numa_mismatch`` (bool), ``gpu_index`` (int, -1 without a GPU).

Further attributes written at start: ``job_name``, ``restart_count`` (SLURM_RESTART_COUNT),
``attempt`` (int, 0 for the first attempt, +1 per requeue that found an earlier file),
``rendezvous`` ("slurm", "mpi", "env", "single"), ``model_size``, ``seed``, ``steps_planned``,
``params`` (train: parameter count), ``torch_version``, ``mempolicy`` (get_mempolicy(2), e.g.
"default", "bind:0"), ``mems_allowed``, ``gpu_uuid``, ``gpu_pci_bus_id``, ``gpu_numa_node`` (-1 if
unknown), ``gpu_name``. Written when the rank closes the file (absent if it was killed):
``complete`` (True: closed by the probe, whatever the outcome), ``end_time``, ``exit_reason``
("done", "collective failed: ...", "stopped by signal SIGTERM", or
"<exception>: ..." when the GPU, the model or the file's storage failed), ``steps_completed``,
``param_checksum`` (train: sum of all weights, equal on every rank), and after a resume
``steps_lost`` (-1 if unknown) and ``recovery_time`` (s from the previous attempt's last step to
this attempt's start).

A run with a fault schedule (``--fault-schedule``, version 3) also has ``fault_schedule`` (str, the
schedule's JSON as :meth:`SwitchbackSchedule.dumps` writes it: the recorded assignment is what the
analysis trusts) and ``fault_first_step`` (int, the first step after the warm-up).

``meta`` (version 2): every attribute above, as one JSON object (str), rewritten with the closing
attributes. A reader reads one attribute instead of some thirty (per-attribute reads were most of
the cost of reading 1,000s of files) and takes it only when it holds exactly the file's other
attributes; otherwise (a version 1 file, or a writer killed between the two) it reads them one by
one. Non-scalar attributes are not in JSON's reach: a file with one has no ``meta``.

Group ``steps`` (resizable, one entry per step, appended and flushed as the run goes):
``step`` (int64), ``attempt`` (int64), ``t_start`` (float64 Unix seconds), and float64 seconds
``step_time``, ``compute_time`` (forward+backward), ``comm_time`` (gradient all_reduce, measured),
``optimizer_time``, ``data_time``, ``checkpoint_time`` (the training thread's share: copying the
state to host memory; the write itself runs in the background). In mode allreduce each step is one
timed all_reduce (``step_time`` = ``comm_time``).

With a fault schedule (version 3), two more, present only then: ``fault_state`` (int8, the step's
scheduled state, 0 off, 1 on, 2 not measured (warm-up, transition, after the last block), but 2
as well where this rank's node was unsure of the fault's state: its acknowledgement was late,
carried an error, or the node's control channel vanished) and ``fault_epoch`` (int64, the epoch of
the last acknowledgement the rank's node gave, 0 before any request; -1 on a node without a
channel, where the fault does not act). Physically the fault is off in the warm-up, as assigned in
each block, and on after the last block and through the hold (the held-on phase), except in a
placebo schedule, where nothing is ever requested (see :mod:`slurm_chaos.probe.switch`).

Requeued jobs: the earlier attempt's file is kept as ``rank-<R>.attempt-<A>.h5`` and its steps and
events are copied ahead of the new attempt's in ``rank-<R>.h5``, so steps re-run after a resume
appear twice (tell them apart by ``steps/attempt``). An earlier attempt without fault columns
(version 2, or no schedule) has them filled with 2 and -1 in the new file.

Group ``events``: ``time`` (float64), ``kind`` (fixed-length bytes, 32), ``detail`` (bytes, 512);
kinds listed in :data:`EVENT_KINDS`. A switchback run's ``fault_on``/``fault_off`` say its node's
fault was confirmed in that state, detail ``epoch=E ack_ms=MS step=S requested`` (the toggling
rank) or ``... observed`` (the node's other ranks), or ``epoch=E step=S late ack, found at this
step``; ``fault_error`` says a toggle failed (no ack in time, an error from the agent, the channel
gone), detail ``[epoch=E ]step=S want=on|off: why``.

Group ``telemetry`` (filled on GPU ranks with NVML): ``time`` plus one float64 dataset per NVML
sample field (:data:`TELEMETRY_FIELDS`; NaN where the GPU does not support a field).

Group ``allreduce`` (mode allreduce): ``size_bytes`` (int64), ``time`` (float64 s, median per
size), ``algbw`` and ``busbw`` (float64 GB/s, nccl-tests' definitions, :mod:`.bandwidth`), one row
per message size of the sweep, appended as each size is done. Attribute ``allreduce_iterations``
(int): timed all_reduces per size, so step ``s`` timed one all_reduce of
``size_bytes[s // allreduce_iterations]`` bytes; files written before it have ``steps_planned``,
which held the same number (and their rows only if the sweep finished).

The file is written in SWMR mode (libver "latest"): open it with ``reader.open_probe_file`` (or
h5py's ``swmr=True``) while it is being written or after its writer was killed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from slurm_chaos.schedule import SwitchbackSchedule


class ProbeMode(StrEnum):
    """What the probe runs (``--mode``, the ``mode`` attribute): a training loop or bare all-reduces.

    The same words as an experiment's ``mode`` (``experiment.Mode``; a unit test holds them equal):
    the probe runs in the site's own Python, which need not have what the experiment loader imports.
    """

    TRAIN = "train"
    ALLREDUCE = "allreduce"


SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
META_ATTR = "meta"

STEP_FIELDS = (
    "step_time",
    "compute_time",
    "comm_time",
    "optimizer_time",
    "data_time",
    "checkpoint_time",
)
STEP_INDEX_FIELDS = ("step", "t_start")
#: A switchback run's per-step fault columns (version 3) and their HDF5 types.
FAULT_FIELDS = {"fault_state": "i1", "fault_epoch": "i8"}
#: Their values where nothing was recorded: not measured, no channel.
FAULT_FILL = {"fault_state": 2, "fault_epoch": -1}

EVENT_KINDS = (
    "checkpoint_saved",
    "checkpoint_failed",
    "checkpoint_hang",
    "checkpoint_skipped",
    "resumed",
    "gpu_xid",
    "gpu_ecc",
    "gpu_throttle",
    "numa_mismatch",
    "telemetry_unavailable",
    "hold_started",
    "hold_ended",
    "fault_on",
    "fault_off",
    "fault_error",
)

TELEMETRY_FIELDS = (
    "gpu_temp_c",
    "gpu_power_w",
    "gpu_sm_clock_mhz",
    "gpu_throttle_reasons",
    "gpu_ecc_volatile_dbe",
    "gpu_ecc_volatile_sbe",
)

ALLREDUCE_FIELDS = ("size_bytes", "time", "algbw", "busbw")


def rank_file_name(rank: int) -> str:
    """Name of the file rank `rank` writes in the run directory."""
    return f"rank-{rank}.h5"


def schedule_attrs(schedule: SwitchbackSchedule | None) -> dict[str, Any]:
    """The file attributes of the schedule a run followed, as the analysis reads them back: its JSON
    (the recorded assignment is what the analysis trusts, not a regeneration from the seed) and the
    first step after the warm-up."""
    if schedule is None:
        return {}
    return {"fault_schedule": schedule.dumps(), "fault_first_step": schedule.warmup_steps}
