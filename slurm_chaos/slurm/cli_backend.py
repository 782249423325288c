"""Scheduler over the Slurm command-line tools: argv lists, one query per question."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm_chaos.errors import SlurmError, SlurmUnreachable
from slurm_chaos.runner import Completed, Runner
from slurm_chaos.slurm import parse
from slurm_chaos.slurm.model import (
    AcctRecord,
    ClusterConfig,
    JobInfo,
    JobRecord,
    NodeInfo,
    PartitionInfo,
    ReservationInfo,
    SwitchInfo,
)

log = logging.getLogger(__name__)

# Before 23.02, `squeue --json` ignores -j/-t and `sacct --json` (openapi v0.0.38) reports every
# exit code as 0 and reservation names as numbers (see tests/data/slurm-22.05/sacct_terminal.json),
# so those versions get the delimited text formats instead.
JSON_JOBS_SINCE = (23, 2)
# `sinfo --json` exists from 21.08; from 23.02 `scontrol --json show nodes` gives one record per node.
JSON_SINFO_SINCE = (21, 8)
JSON_SCONTROL_SINCE = (23, 2)

# Slurm's own words for "the controller (or slurmdbd) did not answer".
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Connection timed out"
    r"|Zero Bytes were transmitted|Problem talking to the database|Unable to connect to database"
    r"|slurmdbd: Connection refused|Communication connection failure",
    re.IGNORECASE,
)
_INVALID_JOB = re.compile(r"Invalid job id specified", re.IGNORECASE)
# What the node-side hooks have always taken for "the controller no longer knows the job: it ended".
_ENDED_JOB = re.compile(r"Invalid job id")
_NO_TOPOLOGY = re.compile(r"No topology information available", re.IGNORECASE)
_TIMED_OUT = 124
_NOT_FOUND = 127


class SlurmCLI:
    """Implements Scheduler with squeue/sacct/sinfo/scontrol/sbatch/scancel.

    `timeout` bounds each command (not Slurm's MessageTimeout): a controller that does not
    answer becomes SlurmUnreachable after that long. The default keeps the whole call under
    10 s (a refused connection makes the Slurm tools retry for about 9 s on their own).
    """

    def __init__(self, env: Mapping[str, str], runner: Runner, timeout: float = 8.0) -> None:
        self.env = dict(env)
        self.runner = runner
        self.timeout = timeout
        self._version: tuple[int, int, int] | None = None

    # ------------------------------------------------------------ running

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Completed:
        """Run one Slurm command; map a silent or unreachable controller to SlurmUnreachable."""
        done = self.runner(argv, timeout=self.timeout, env={**self.env, **(env or {})})
        if done.returncode == _TIMED_OUT:
            raise SlurmUnreachable(
                f"{argv[0]}: no answer from Slurm within {self.timeout:g} s "
                f"(SLURM_CONF={self.env.get('SLURM_CONF', '<default>')}); is slurmctld up?"
            )
        if done.returncode == _NOT_FOUND:
            raise SlurmError(f"{argv[0]}: command not found (install the Slurm client tools)")
        message = (done.stderr.strip() or done.stdout.strip()).splitlines()
        if not done.ok and _UNREACHABLE.search(done.stderr):
            raise SlurmUnreachable(
                f"{' '.join(message)} (SLURM_CONF={self.env.get('SLURM_CONF', '<default>')})"
            )
        return done

    def _check(self, done: Completed) -> Completed:
        """Raise Slurm's own message when a command failed."""
        if not done.ok:
            text = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
            raise SlurmError(text)
        return done

    def _version_tuple(self) -> tuple[int, int, int]:
        if self._version is None:
            self._version = parse.parse_version(self._check(self._run(["sinfo", "--version"])).stdout)
        return self._version

    # ------------------------------------------------------------ Scheduler

    def version(self) -> str:
        major, minor, micro = self._version_tuple()
        return f"{major}.{minor:02d}.{micro}"

    def submit(self, script: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        done = self._check(self._run(["sbatch", "--parsable", *args, str(script)], env=env))
        job_id = parse.parse_sbatch_parsable(done.stdout)
        log.info("submitted %s as job %s", script, job_id)
        return job_id

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        jobs = self._squeue(ids)
        # While slurmctld remembers a job (MinJobAge after its end) its view is the complete one;
        # slurmdbd may still hold a placeholder record then. Accounting answers for the rest.
        gone = [j for j in ids if j not in jobs]
        if gone:
            jobs.update(self._finished(gone))
        return {j: jobs[j] for j in ids if j in jobs}

    def job_record(self, job_id: str) -> JobRecord:
        # squeue -O, not `scontrol show job`: there a job name or comment the user wrote could hold
        # " AdminComment=..." and be read as the real field. -j of an array's id lists its tasks too.
        # --states=all, as _squeue: Slurm 24.11 lists a job given by id only in the states of
        # squeue's default, not one that ended while slurmctld still remembers it (Debian 13 sandbox).
        fmt = ",".join(f"{field}:|" for field in parse.JOB_RECORD_FIELDS)
        argv = ["squeue", "--noheader", f"--jobs={job_id}", "--states=all", f"--Format={fmt}"]
        done = self._check(self._run(argv))
        oversubscribe = {name: part.oversubscribe for name, part in self.partitions().items()}
        records = parse.parse_job_records(done.stdout, oversubscribe)
        if job_id not in records:
            raise SlurmError(f"job {job_id}: not known to the controller")
        record = records[job_id]
        if not record.nodes:
            return record
        return replace(record, other_jobs=self._holders(job_id, record.nodes))

    def _holders(self, job_id: str, nodes: Sequence[str]) -> tuple[str, ...]:
        """The other jobs slurmctld has on any of `nodes` now (suspended and completing ones too)."""
        fmt = ",".join(f"{field}:|" for field in parse.NODE_JOB_FIELDS)
        argv = ["squeue", "--noheader", "--states=all", f"--nodelist={','.join(nodes)}", f"--Format={fmt}"]
        return parse.holders(parse.parse_node_jobs(self._check(self._run(argv)).stdout), job_id)

    def job_running(self, job_id: str) -> bool | None:
        # Not through _run: its unreachable mapping would hide an "Invalid job id" that follows a
        # retried timeout in stderr, and every other failure (no answer, no squeue) is "cannot tell".
        argv = ["squeue", "-h", "-j", job_id, "-o", "%T"]
        done = self.runner(argv, timeout=self.timeout, env=dict(self.env))
        if done.ok:
            return parse.parse_job_running(done.stdout)
        return False if _ENDED_JOB.search(done.stderr) else None

    def time_left(self, job_id: str) -> float | None:
        done = self._check(self._run(["squeue", "-h", "-j", job_id, "-o", "%L"]))
        return parse.parse_time_left(done.stdout)

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = [str(j) for j in job_ids]
        if ids:
            self._check(self._run(["scancel", *ids]))

    def requeue(self, job_ids: Iterable[str]) -> None:
        ids = [str(j) for j in job_ids]
        if ids:
            self._check(self._run(["scontrol", "requeue", ",".join(ids)]))

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        version = self._version_tuple()[:2]
        if version >= JSON_SCONTROL_SINCE:
            found = parse.parse_nodes_json(
                self._check(self._run(["scontrol", "--json", "show", "nodes"])).stdout
            )
        elif version >= JSON_SINFO_SINCE:
            # 22.05's sinfo --json ignores -n: ask for all nodes and filter here.
            found = parse.parse_nodes_json(self._check(self._run(["sinfo", "--json"])).stdout)
        else:
            found = parse.parse_scontrol_nodes(
                self._check(self._run(["scontrol", "-o", "show", "nodes"])).stdout
            )
        if names is None:
            return found
        wanted = [n for name in names for n in parse.expand_hostlist(name)]
        missing = [n for n in wanted if n not in found]
        if missing:
            raise SlurmError(f"unknown node(s): {parse.compress_hostlist(missing)}")
        return {n: found[n] for n in wanted}

    def node(self, name: str) -> NodeInfo:
        # One node's text record in every version: no version query, no other node's record.
        done = self._check(self._run(["scontrol", "-o", "show", "node", name]))
        found = parse.parse_scontrol_nodes(done.stdout)
        if name not in found:
            raise SlurmError(f"node {name}: not found")
        return found[name]

    def drain(self, node: str, reason: str) -> None:
        if not reason.strip():
            raise SlurmError(f"drain {node}: Slurm requires a reason")
        self._check(self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]))

    def resume(self, node: str) -> None:
        self._check(self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"]))

    def mark_down(self, node: str, reason: str) -> None:
        if not reason.strip():
            raise SlurmError(f"down {node}: Slurm requires a reason")
        self._check(self._run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"]))

    def update_node(
        self, node: str, *, weight: int | None = None, features: Sequence[str] | None = None
    ) -> None:
        argv = ["scontrol", "update", f"NodeName={node}"]
        if weight is not None:
            argv.append(f"Weight={weight}")
        if features is not None:
            feats = ",".join(features) or "(null)"
            argv += [f"AvailableFeatures={feats}", f"ActiveFeatures={feats}"]
        if len(argv) > 3:
            self._check(self._run(argv))

    def submit_wrap(
        self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> str:
        done = self._check(self._run(["sbatch", "--parsable", *args, "--wrap", command], env=env))
        job_id = parse.parse_sbatch_parsable(done.stdout)
        log.info("submitted `%s` as job %s", command, job_id)
        return job_id

    def reservation(self, name: str) -> ReservationInfo:
        done = self._check(self._run(["scontrol", "-o", "show", "reservation", name]))
        found = parse.parse_scontrol_reservations(done.stdout)
        if name not in found:
            raise SlurmError(f"Reservation {name} not found")
        return found[name]

    def reservations(self) -> dict[str, ReservationInfo]:
        done = self._check(self._run(["scontrol", "-o", "show", "reservation"]))
        return parse.parse_scontrol_reservations(done.stdout)

    def partitions(self) -> dict[str, PartitionInfo]:
        # Text in every version: 24.11's `scontrol --json show partitions` leaves out the flags
        # (data_parser v0.0.42 skips partition_info_t.flags), and with them which one is the default.
        done = self._check(self._run(["scontrol", "-o", "show", "partition"]))
        return parse.parse_scontrol_partitions(done.stdout)

    def topology(self) -> list[SwitchInfo]:
        # No JSON form up to 24.11. Without a topology plugin scontrol prints nothing on stdout.
        done = self._run(["scontrol", "-o", "show", "topology"])
        if not done.ok and not _NO_TOPOLOGY.search(done.stderr):
            self._check(done)
        return parse.parse_scontrol_topology(done.stdout)

    def cluster_config(self) -> ClusterConfig:
        return parse.parse_scontrol_config(self._check(self._run(["scontrol", "show", "config"])).stdout)

    def accounting(self, job_ids: Iterable[str]) -> list[AcctRecord]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        return self._sacct(ids, allocations_only=False) if ids else []

    def hostnames(self, nodelist: str) -> list[str]:
        return parse.expand_hostlist(nodelist)

    # ------------------------------------------------------------ queries

    def _squeue(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        """Jobs the controller still knows (pending, running, or finished less than MinJobAge ago)."""
        selection = ["--states=all", f"--jobs={','.join(ids)}"]
        if self._version_tuple()[:2] >= JSON_JOBS_SINCE:
            done = self._run(["squeue", "--json", *selection])
            jobs = parse.parse_squeue_json(done.stdout) if done.ok else {}
        else:
            fmt = ",".join(f"{field}:|" for field in parse.SQUEUE_FIELDS)
            done = self._run(["squeue", "--noheader", *selection, f"--Format={fmt}"])
            jobs = parse.parse_squeue_fields(done.stdout) if done.ok else {}
        # squeue fails with `Invalid job id` when none of the ids is still known: not an error here.
        if not done.ok and not _INVALID_JOB.search(done.stderr):
            self._check(done)
        return {j: info for j, info in jobs.items() if j in ids}

    def _finished(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        """Latest accounting run of jobs the controller no longer reports."""
        runs = parse.latest_runs(self._sacct(ids, allocations_only=True))
        return {j: parse.acct_to_job(rec) for j, rec in runs.items() if j in ids}

    def _sacct(self, ids: Sequence[str], allocations_only: bool) -> list[AcctRecord]:
        selection = ["--duplicates", f"--jobs={','.join(ids)}"] + (
            ["--allocations"] if allocations_only else []
        )
        if self._version_tuple()[:2] >= JSON_JOBS_SINCE:
            done = self._check(self._run(["sacct", "--json", *selection]))
            return parse.parse_sacct_json(done.stdout)
        fields = ",".join(parse.SACCT_FIELDS)
        done = self._check(
            self._run(["sacct", "--noheader", "--parsable2", *selection, f"--format={fields}"])
        )
        return parse.parse_sacct_parsable(done.stdout)
