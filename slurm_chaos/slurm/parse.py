"""Pure parsers: Slurm command output (text) -> model records. No I/O here.

Handles both JSON dialects seen in the field: Slurm 22.05 (openapi v0.0.38: states as
strings, numbers as plain ints, exit codes as wait statuses) and 23.02+ data_parser
(v0.0.39..v0.0.42: states as lists of flags, numbers as {"set", "infinite", "number"},
exit codes as {"status", "return_code", "signal"}), plus the delimited text the CLI
backend asks for (`squeue -O ...:|`, `sacct --parsable2`) and `scontrol show` key=value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from slurm_chaos import hostlist
from slurm_chaos.errors import SlurmError
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

# Field lists the CLI backend requests; the parsers below depend on this exact order.
SQUEUE_FIELDS = (
    "JobID", "Name", "State", "Reason", "NodeList", "Partition", "Reservation",
    "SubmitTime", "StartTime", "EndTime", "exit_code", "RestartCnt",
)  # fmt: skip
#: `squeue -O` fields of JobRecord: none is free text a user writes, but the admin comment, last.
JOB_RECORD_FIELDS = (
    "JobID", "ArrayTaskID", "HetJobID", "UserId", "UserName", "Account", "Partition", "Reservation",
    "OverSubscribe", "NumNodes", "NodeList", "SubmitTime", "EndTime", "admin_comment",
)  # fmt: skip
#: `squeue -O` fields of the jobs on a set of nodes (who else holds a job's nodes).
NODE_JOB_FIELDS = ("JobID", "State")
SACCT_FIELDS = (
    "JobID", "JobIDRaw", "JobName", "State", "ExitCode", "NodeList", "ElapsedRaw",
    "Submit", "Start", "End", "Partition", "Reservation",
)  # fmt: skip

_EMPTY = frozenset({"", "(null)", "None", "none", "N/A", "Unknown", "None assigned", "NONE", "n/a"})

# ---------------------------------------------------------------- hostlists


def expand_hostlist(nodelist: str) -> list[str]:
    """`node[1-3,5],gpu[01-02],login` -> every hostname, in Slurm's order; `None assigned` -> []."""
    if nodelist.strip() in _EMPTY:
        return []
    try:
        return hostlist.expand_hostlist(nodelist.strip())
    except ValueError as exc:
        raise SlurmError(f"bad Slurm hostlist {nodelist!r}: {exc}") from exc


def compress_hostlist(hosts: Iterable[str]) -> str:
    """Inverse of expand_hostlist: [`node1`, `node2`, `node3`, `node5`] -> `node[1-3,5]`."""
    return hostlist.compress_hostlist(list(hosts))


# ---------------------------------------------------------------- GRES

# A node's GRES string (src/common/gres.c _build_node_gres_str): `name[:type]:count[KMGTP]`, then
# `(S:<sockets>)` when the GRES is bound to cores, the sockets written by bit_fmt (`0`, `0-1`, `0,2`).
_GRES = re.compile(r"^(?P<spec>[^()]+?)(?:\(S:(?P<sockets>[0-9,-]*)\))?$")
_GRES_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_GRES_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")


def _top_level_items(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses: `a:1(S:0,2),b:2` -> [`a:1(S:0,2)`, `b:2`]."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _socket_list(text: str) -> tuple[int, ...]:
    """bit_fmt's `0-1,3` -> (0, 1, 3)."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)


def _gres(item: str) -> Gres:
    m = _GRES.match(item)
    if not m:
        raise SlurmError(f"cannot read GRES {item!r}")
    parts = m.group("spec").split(":")
    count = _GRES_COUNT.match(parts[-1]) if len(parts) > 1 else None
    if count:
        parts.pop()
    number = int(count.group(1)) * _GRES_SUFFIX[count.group(2)] if count else 1
    return Gres(
        name=parts[0],
        type=":".join(parts[1:]),
        count=number,
        sockets=_socket_list(m.group("sockets") or ""),
    )


def parse_gres(text: str) -> tuple[Gres, ...]:
    """A node's `Gres=` (`gpu:h100:4(S:0),gpu:h100:4(S:1)`, `gpu:8(S:0-1)`, `mps:400`); `(null)` -> ()."""
    text = text.strip()
    if text in _EMPTY:
        return ()
    return tuple(_gres(item) for item in _top_level_items(text))


# ---------------------------------------------------------------- scalars


def parse_version(text: str) -> tuple[int, int, int]:
    """`slurm-wlm 22.05.8` / `slurm 24.11.5` -> (22, 5, 8)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise SlurmError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def parse_sbatch_parsable(stdout: str) -> str:
    """`sbatch --parsable` prints `123` or `123;cluster`; return the job id."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"sbatch did not print a job id: {stdout.strip()!r}")
    return job_id


#: Job states (squeue %T) after which nothing of the job runs on its nodes any more: the terminal
#: ones, and a job back in the queue (pending, requeued, special exit), whose processes are gone too.
ENDED_STATES = frozenset(
    {s for s in JobState if s.is_terminal} | {JobState.PENDING, JobState.REQUEUED, JobState.SPECIAL_EXIT}
)


def parse_job_running(stdout: str) -> bool:
    """`squeue -h -j J -o %T` -> whether the job still runs on its nodes (no line: it ended)."""
    state = stdout.strip().split("\n")[0].strip()
    return bool(state) and JobState.parse(state) not in ENDED_STATES


def parse_time_left(text: str) -> float | None:
    """squeue %L ('1-02:03:04', '05:00', 'UNLIMITED') in seconds; None when there is no limit."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


#: sbatch --time's formats (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes and days-hours:minutes:seconds.
_TIME_LIMIT_FORMATS = (
    (re.compile(r"(\d+)"), ("m",)),
    (re.compile(r"(\d+):(\d+)"), ("m", "s")),
    (re.compile(r"(\d+):(\d+):(\d+)"), ("h", "m", "s")),
    (re.compile(r"(\d+)-(\d+)"), ("d", "h")),
    (re.compile(r"(\d+)-(\d+):(\d+)"), ("d", "h", "m")),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), ("d", "h", "m", "s")),
)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_NO_LIMIT = frozenset({"UNLIMITED", "INFINITE"})


def parse_time_limit(text: str) -> float | None:
    """A time limit as sbatch's --time takes it, in seconds; None for UNLIMITED/INFINITE.

    A bare number is minutes, as Slurm reads it ('30' is 30 minutes, '1-02' one day and 2 hours).
    Anything else raises ValueError naming the formats.
    """
    value = text.strip()
    if value.upper() in _NO_LIMIT:
        return None
    for pattern, units in _TIME_LIMIT_FORMATS:
        m = pattern.fullmatch(value)
        if m:
            return float(sum(int(g) * _UNIT_S[u] for g, u in zip(m.groups(), units, strict=True)))
    raise ValueError(
        f"time limit {text!r}: expected one of Slurm's formats MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
        "D-HH:MM:SS, or UNLIMITED"
    )


def parse_time(text: str) -> datetime | None:
    """Slurm's ISO local time (`2026-11-30T04:49:06`) -> aware UTC datetime; `Unknown`/`None` -> None."""
    text = text.strip()
    if text in _EMPTY:
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        return None


def _epoch(value: Any) -> datetime | None:
    """A JSON timestamp (int or {"set","number"}); 0 and unset mean `not known`."""
    n = _number(value)
    return datetime.fromtimestamp(n, UTC) if n else None


def _number(value: Any) -> int | None:
    """A JSON number in either dialect; {"set": false} and {"infinite": true} -> None."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None


def _text(value: Any) -> str:
    """A string field; Slurm's placeholders for `nothing` become ''."""
    return value.strip() if isinstance(value, str) and value.strip() not in _EMPTY else ""


def _words(value: Any) -> tuple[str, ...]:
    """A list field, given either as a JSON list or as a comma-separated string."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return tuple(w for w in (str(i).strip() for i in items) if w and w not in _EMPTY)


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct/scontrol `3:0` (exit code:signal) -> (3, 0)."""
    code, _, sig = text.strip().partition(":")
    if not code.lstrip("-").isdigit():
        return None, None
    return int(code), int(sig) if sig.isdigit() else 0


def _wait_status(status: int) -> tuple[int, int]:
    """A raw wait(2) status (squeue `exit_code`, 22.05 JSON) -> (exit code, signal)."""
    return (status >> 8) & 0xFF, status & 0x7F


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    """Exit code in any JSON dialect: wait status int or {"return_code", "signal"} object."""
    if isinstance(value, dict):
        signal = value.get("signal") or {}
        sig = _number(signal.get("id", signal.get("signal_id"))) if isinstance(signal, dict) else None
        code = _number(value.get("return_code"))
        # Same convention as sacct's `0:15`: a signalled process has exit code 0.
        return (None, None) if code is None and sig is None else (code or 0, sig or 0)
    n = _number(value)
    return _wait_status(n) if n is not None else (None, None)


def _json_state(value: Any) -> tuple[JobState, tuple[str, ...]]:
    """`RUNNING` (22.05) or [`PENDING`, `REQUEUED`] (23.02+) -> (effective state, all words)."""
    words = _words(value) if isinstance(value, list) else (str(value or ""),)
    return JobState.from_flags(words), tuple(w.upper() for w in words if w)


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"{what} printed invalid JSON ({exc}); first bytes: {text[:120]!r}") from exc
    if not isinstance(data, dict):
        raise SlurmError(f"{what} printed JSON that is not an object")
    errors = [e for e in data.get("errors") or [] if isinstance(e, dict)]
    if errors:
        first = errors[0]
        raise SlurmError(f"{what}: {first.get('description') or first.get('error') or first}")
    return data


# ---------------------------------------------------------------- squeue


def _json_job_id(job: Mapping[str, Any]) -> str:
    """`12`, array task `8_1`, or a pending array's meta record `8_[1-2]` (as squeue %i prints)."""
    array_job = _number(job.get("array_job_id")) or 0
    task = _number(job.get("array_task_id"))
    if array_job and task is not None:
        return f"{array_job}_{task}"
    if array_job and _text(job.get("array_task_string")):
        return f"{array_job}_[{job['array_task_string']}]"
    return str(job.get("job_id"))


def _json_job(job: Mapping[str, Any]) -> JobInfo:
    state, flags = _json_state(job.get("job_state"))
    code, sig = _json_exit(job.get("exit_code"))
    return JobInfo(
        job_id=_json_job_id(job),
        name=str(job.get("name") or ""),
        state=state,
        reason=_text(job.get("state_reason")),
        nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
        exit_code=code,
        signal=sig,
        restarts=_number(job.get("restart_cnt")) or 0,
        submit_time=_epoch(job.get("submit_time")),
        start_time=_epoch(job.get("start_time")),
        end_time=_epoch(job.get("end_time")),
        partition=_text(job.get("partition")),
        reservation=_text(job.get("resv_name")),
        state_flags=flags,
    )


def parse_squeue_json(text: str) -> dict[str, JobInfo]:
    """`squeue --json` (22.05 or 24.11) -> jobs by id."""
    jobs = (_json_job(j) for j in _load(text, "squeue --json").get("jobs") or [])
    return {j.job_id: j for j in jobs}


def _delimited(text: str, fields: Sequence[str], name_at: int) -> Iterator[list[str]]:
    """Rows of `|`-separated output; a stray `|` in the free-text name field is put back."""
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if parts and parts[-1] == "" and len(parts) > len(fields):
            parts = parts[:-1]  # `-O Field:|` ends every line with the separator
        extra = len(parts) - len(fields)
        if extra < 0:
            raise SlurmError(f"expected {len(fields)} `|`-separated fields, got {len(parts)}: {line!r}")
        if extra:
            parts[name_at : name_at + extra + 1] = ["|".join(parts[name_at : name_at + extra + 1])]
        yield parts


def parse_squeue_fields(text: str) -> dict[str, JobInfo]:
    """`squeue -h -O <SQUEUE_FIELDS with :| suffix>` -> jobs by id."""
    jobs = {}
    for row in _delimited(text, SQUEUE_FIELDS, name_at=1):
        f = dict(zip(SQUEUE_FIELDS, row, strict=True))
        status = f["exit_code"].strip()
        code, sig = _wait_status(int(status)) if status.isdigit() else (None, None)
        job = JobInfo(
            job_id=f["JobID"].strip(),
            name=f["Name"],
            state=JobState.parse(f["State"]),
            reason=_text(f["Reason"]),
            nodes=tuple(expand_hostlist(f["NodeList"])),
            exit_code=code,
            signal=sig,
            restarts=int(f["RestartCnt"]) if f["RestartCnt"].strip().isdigit() else 0,
            submit_time=parse_time(f["SubmitTime"]),
            start_time=parse_time(f["StartTime"]),
            end_time=parse_time(f["EndTime"]),
            partition=_text(f["Partition"]),
            reservation=_text(f["Reservation"]),
            state_flags=(f["State"].strip(),),
        )
        jobs[job.job_id] = job
    return jobs


def parse_job_records(text: str, partition_oversubscribe: Mapping[str, str]) -> dict[str, JobRecord]:
    """`squeue -h -O <JOB_RECORD_FIELDS with :| suffix>` -> records by job id.

    `partition_oversubscribe`: each partition's OverSubscribe, by partition name.
    """
    records = {}
    for row in _delimited(text, JOB_RECORD_FIELDS, name_at=len(JOB_RECORD_FIELDS) - 1):
        f = dict(zip(JOB_RECORD_FIELDS, row, strict=True))
        uid, nodes = f["UserId"].strip(), f["NumNodes"].strip()
        partition = _text(f["Partition"])
        rec = JobRecord(
            job_id=f["JobID"].strip(),
            user_id=int(uid) if uid.isdigit() else None,
            user=_text(f["UserName"]),
            account=_text(f["Account"]),
            partition=partition,
            reservation=_text(f["Reservation"]),
            job_oversubscribe=_text(f["OverSubscribe"]),
            partition_oversubscribe=partition_oversubscribe.get(partition, ""),
            array=bool(_text(f["ArrayTaskID"])),
            het=bool(_text(f["HetJobID"])),
            num_nodes=int(nodes) if nodes.isdigit() else None,
            nodes=tuple(expand_hostlist(_text(f["NodeList"]))),
            admin_comment=_text(f["admin_comment"]),
            submit_time=parse_time(f["SubmitTime"]),
            end_time=parse_time(f["EndTime"]),
        )
        records[rec.job_id] = rec
    return records


def parse_node_jobs(text: str) -> dict[str, JobState]:
    """`squeue -h -t all -w NODES -O JobID:|,State:|` -> the state of each job listed, by id."""
    return {row[0].strip(): JobState.parse(row[1]) for row in _delimited(text, NODE_JOB_FIELDS, name_at=0)}


def holders(states: Mapping[str, JobState], job_id: str) -> tuple[str, ...]:
    """The jobs other than `job_id` that hold a node now: neither pending nor over (completing is not)."""
    return tuple(
        sorted(
            j
            for j, state in states.items()
            if j != job_id and state != JobState.PENDING and not state.is_terminal
        )
    )


# ---------------------------------------------------------------- sacct


# States a run can end in and still be followed by another run of the same job.
_REQUEUE_STATES = frozenset(
    {JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED, JobState.NODE_FAIL, JobState.PREEMPTED}
)


def _submit_order(records: Sequence[AcctRecord], positions: list[int]) -> list[int]:
    return sorted(positions, key=lambda i: (records[i].submit_time or _EPOCH0, i))


def _number_requeues(records: list[AcctRecord]) -> list[AcctRecord]:
    """Number the runs of each job (0 = first run) in submit order.

    A run follows a requeue only when the run before it ended REQUEUED (or NODE_FAIL/PREEMPTED);
    after any other end the count starts again, since then the id belongs to a new job (a
    controller whose state was wiped hands out ids that slurmdbd has seen before).
    Steps inherit the count of the run they belong to (the job record listed before them).
    """
    runs: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        if rec.step is None:
            runs.setdefault(rec.job_id, []).append(i)
    index: dict[int, int] = {}
    for positions in runs.values():
        count = 0
        for pos in _submit_order(records, positions):
            index[pos] = max(count, records[pos].requeues)
            count = index[pos] + 1 if records[pos].state in _REQUEUE_STATES else 0
    out, current = [], 0
    for i, rec in enumerate(records):
        current = index.get(i, current)
        out.append(replace(rec, requeues=current))
    return out


_EPOCH0 = datetime.fromtimestamp(0, UTC)


def _split_job_step(job_id: str) -> tuple[str, str | None]:
    """`6.batch` -> (`6`, `batch`); `8_1` -> (`8_1`, None)."""
    job, dot, step = job_id.partition(".")
    return job, (step if dot else None)


def parse_sacct_parsable(text: str) -> list[AcctRecord]:
    """`sacct -n -P -o <SACCT_FIELDS>` (with or without -X, usually -D) -> records in order."""
    records = []
    for row in _delimited(text, SACCT_FIELDS, name_at=2):
        f = dict(zip(SACCT_FIELDS, row, strict=True))
        job, step = _split_job_step(f["JobID"].strip())
        code, sig = parse_exit_code(f["ExitCode"])
        elapsed = f["ElapsedRaw"].strip()
        records.append(
            AcctRecord(
                job_id=job,
                step=step,
                name=f["JobName"],
                state=JobState.parse(f["State"]),
                exit_code=code,
                signal=sig,
                nodes=tuple(expand_hostlist(f["NodeList"])),
                elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
                submit_time=parse_time(f["Submit"]),
                start_time=parse_time(f["Start"]),
                end_time=parse_time(f["End"]),
                partition=_text(f["Partition"]),
                reservation=_text(f["Reservation"]),
            )
        )
    return _number_requeues(records)


def _sacct_job_id(job: Mapping[str, Any]) -> str:
    array = job.get("array") or {}
    array_job = _number(array.get("job_id")) or 0
    task = _number(array.get("task_id"))
    if array_job and task is not None:
        return f"{array_job}_{task}"
    return str(job.get("job_id"))


def _sacct_step(job_id: str, step: Mapping[str, Any], parent: AcctRecord) -> AcctRecord:
    ident = step.get("step") or {}
    step_name = str(ident.get("id") or "")
    if "." in step_name:  # 23.02+ prints `6.batch`, 22.05 prints `batch`
        step_name = step_name.split(".", 1)[1]
    state, _ = _json_state(step.get("state"))
    code, sig = _json_exit(step.get("exit_code"))
    nodes = step.get("nodes") or {}
    timing = step.get("time") or {}
    return AcctRecord(
        job_id=job_id,
        step=step_name,
        name=str(ident.get("name") or ""),
        state=state,
        exit_code=code,
        signal=sig,
        nodes=tuple(expand_hostlist(str(nodes.get("range") or ""))),
        elapsed_s=_number(timing.get("elapsed")) or 0,
        requeues=parent.requeues,
        start_time=_epoch(timing.get("start")),
        end_time=_epoch(timing.get("end")),
    )


def _sacct_job(job: Mapping[str, Any]) -> list[AcctRecord]:
    state_obj = job.get("state") or {}
    state, _ = _json_state(state_obj.get("current") if isinstance(state_obj, dict) else state_obj)
    code, sig = _json_exit(job.get("exit_code"))
    timing = job.get("time") or {}
    resv = job.get("reservation") or {}
    job_id = _sacct_job_id(job)
    record = AcctRecord(
        job_id=job_id,
        step=None,
        name=str(job.get("name") or ""),
        state=state,
        exit_code=code,
        signal=sig,
        nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
        elapsed_s=_number(timing.get("elapsed")) or 0,
        requeues=_number(job.get("restart_cnt")) or 0,
        submit_time=_epoch(timing.get("submission")),
        start_time=_epoch(timing.get("start")),
        end_time=_epoch(timing.get("end")),
        partition=_text(job.get("partition")),
        # 22.05 dumps the reservation name as a number (a known v0.0.38 bug): ignore non-strings.
        reservation=_text(resv.get("name")) if isinstance(resv, dict) else "",
    )
    return [record] + [_sacct_step(job_id, s, record) for s in job.get("steps") or []]


def parse_sacct_json(text: str) -> list[AcctRecord]:
    """`sacct --json` (22.05 or 24.11) -> job records, each followed by its steps."""
    records = [r for job in _load(text, "sacct --json").get("jobs") or [] for r in _sacct_job(job)]
    return _number_requeues(records)


def latest_runs(records: Iterable[AcctRecord]) -> dict[str, AcctRecord]:
    """The current (last submitted) run of each job among job-level records."""
    latest: dict[str, AcctRecord] = {}
    for rec in records:
        if rec.step is None:
            best = latest.get(rec.job_id)
            if best is None or (rec.submit_time or _EPOCH0) >= (best.submit_time or _EPOCH0):
                latest[rec.job_id] = rec
    return latest


def acct_to_job(rec: AcctRecord) -> JobInfo:
    """A finished job as poll() reports it, from its latest accounting record."""
    return JobInfo(
        job_id=rec.job_id,
        name=rec.name,
        state=rec.state,
        nodes=rec.nodes,
        exit_code=rec.exit_code,
        signal=rec.signal,
        restarts=rec.requeues,
        submit_time=rec.submit_time,
        start_time=rec.start_time,
        end_time=rec.end_time,
        partition=rec.partition,
        reservation=rec.reservation,
        state_flags=(rec.state.value,),
    )


# ---------------------------------------------------------------- scontrol key=value

_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_/:.]*)=")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)\s*\[([^\]@\s]*)@([^\]\s]*)\]")


def _pairs(line: str) -> dict[str, str]:
    """`A=1 B=two words C=x=y` -> {A: 1, B: `two words`, C: `x=y`}."""
    keys = list(_KEY.finditer(line))
    if not keys:
        return {}
    out = {}
    for k, nxt in zip(keys, [*keys[1:], None], strict=True):
        end = nxt.start() if nxt else len(line)
        out[k.group(1)] = line[k.end() : end].strip()
    return out


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """`scontrol show ...` records, multi-line or `-o` one-liners, as key -> value dicts.

    A node's `Reason=free text [user@time]` may contain anything, `=` included, so it is
    cut out by its bracketed suffix before the rest is split into pairs.
    """
    records: list[dict[str, str]] = []
    for block in _record_blocks(text):
        record: dict[str, str] = {}
        for line in block:
            m = _REASON.search(line)
            if m:
                record.update(Reason=m.group(1), ReasonUser=m.group(2), ReasonTime=m.group(3))
                line = line[: m.start()] + line[m.end() :]
            record.update(_pairs(line))
        records.append(record)
    return records


def _record_blocks(text: str) -> Iterator[list[str]]:
    """Group lines: a record starts at an unindented line; indented lines continue it."""
    block: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() and block:
            yield block
            block = []
        block.append(line.strip())
    if block:
        yield block


def _state_words(text: str) -> frozenset[str]:
    """`IDLE+DRAIN+MAINTENANCE` -> {IDLE, DRAIN, MAINTENANCE}; sinfo's `*~#$@` suffixes dropped."""
    return frozenset(w.strip("*~#!%$@^-").upper() for w in text.split("+") if w.strip("*~#!%$@^-"))


def _count(text: str) -> int:
    """A key=value count; `N/A` and the like -> 0."""
    text = text.strip()
    return int(text) if text.isdigit() else 0


def _scontrol_node(rec: Mapping[str, str]) -> NodeInfo:
    return NodeInfo(
        name=rec.get("NodeName", ""),
        state=_state_words(rec.get("State", "")),
        reason=_text(rec.get("Reason", "")),
        reason_user=_text(rec.get("ReasonUser", "")),
        reason_time=parse_time(rec.get("ReasonTime", "")),
        features=_words(rec.get("AvailableFeatures", "")),
        address=_text(rec.get("NodeAddr", "")),
        hostname=_text(rec.get("NodeHostName", "")),
        cpus=_count(rec.get("CPUTot", "")),
        sockets=_count(rec.get("Sockets", "")),
        cores_per_socket=_count(rec.get("CoresPerSocket", "")),
        threads_per_core=_count(rec.get("ThreadsPerCore", "")),
        gres=parse_gres(rec.get("Gres", "")),
        weight=int(rec["Weight"]) if rec.get("Weight", "").isdigit() else None,
    )


def parse_scontrol_nodes(text: str) -> dict[str, NodeInfo]:
    """`scontrol [-o] show node` -> nodes by name."""
    nodes = (_scontrol_node(r) for r in parse_scontrol(text) if "NodeName" in r)
    return {n.name: n for n in nodes}


def parse_scontrol_reservations(text: str) -> dict[str, ReservationInfo]:
    """`scontrol [-o] show reservation` -> reservations by name."""
    out = {}
    for rec in parse_scontrol(text):
        if "ReservationName" not in rec:
            continue
        resv = ReservationInfo(
            name=rec["ReservationName"],
            nodes=tuple(expand_hostlist(rec.get("Nodes", ""))),
            users=_words(rec.get("Users", "")),
            accounts=_words(rec.get("Accounts", "")),
            flags=frozenset(_words(rec.get("Flags", ""))),
            start=parse_time(rec.get("StartTime", "")),
            end=parse_time(rec.get("EndTime", "")),
            state=_text(rec.get("State", "")),
        )
        out[resv.name] = resv
    return out


def parse_scontrol_partitions(text: str) -> dict[str, PartitionInfo]:
    """`scontrol [-o] show partition` -> partitions by name, in Slurm's order."""
    out = {}
    for rec in parse_scontrol(text):
        if "PartitionName" not in rec:
            continue
        part = PartitionInfo(
            name=rec["PartitionName"],
            nodes=tuple(expand_hostlist(rec.get("Nodes", ""))),
            default=rec.get("Default", "").upper() == "YES",
            state=_text(rec.get("State", "")),
            oversubscribe=_text(rec.get("OverSubscribe", "")),
            preempt_mode=_text(rec.get("PreemptMode", "")),
        )
        out[part.name] = part
    return out


def parse_scontrol_topology(text: str) -> list[SwitchInfo]:
    """`scontrol [-o] show topology` (topology/tree) -> switches, leaves first as Slurm lists them.

    Without a topology plugin Slurm prints nothing on stdout (`No topology information available`
    goes to stderr): no switches.
    """
    switches = []
    for rec in parse_scontrol(text):
        if "SwitchName" not in rec:
            continue
        switches.append(
            SwitchInfo(
                name=rec["SwitchName"],
                level=_count(rec.get("Level", "")),
                nodes=tuple(expand_hostlist(rec.get("Nodes", ""))),
                switches=tuple(expand_hostlist(rec.get("Switches", ""))),
            )
        )
    return switches


def parse_scontrol_config(text: str) -> ClusterConfig:
    """`scontrol show config` (`Key = value` lines) -> the few settings slurm-chaos reads."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and " " not in key:
            values.setdefault(key, value.strip())
    return ClusterConfig(
        name=_text(values.get("ClusterName", "")),
        plugstack_conf=_text(values.get("PlugStackConfig", "")),
        topology_plugin=_text(values.get("TopologyPlugin", "")),
        slurm_conf=_text(values.get("SLURM_CONF", "")),
        # Slurm 24.11 takes several scripts and prints each as Prolog[0], Prolog[1], ...: the first.
        prolog=_text(values.get("Prolog", values.get("Prolog[0]", ""))),
        epilog=_text(values.get("Epilog", values.get("Epilog[0]", ""))),
        prolog_flags=_words(values.get("PrologFlags", "")),
        proctrack_type=_text(values.get("ProctrackType", "")),
        task_plugin=_words(values.get("TaskPlugin", "")),
        job_submit_plugins=_words(values.get("JobSubmitPlugins", "")),
        health_check_program=_text(values.get("HealthCheckProgram", "")),
        preempt_mode=_text(values.get("PreemptMode", "")),
        preempt_type=_text(values.get("PreemptType", "")),
    )


def parse_scontrol_jobs(text: str) -> dict[str, JobInfo]:
    """`scontrol [-o] show job` -> jobs by id."""
    out = {}
    for rec in parse_scontrol(text):
        if "JobId" not in rec:
            continue
        code, sig = parse_exit_code(rec.get("ExitCode", ""))
        restarts = rec.get("Restarts", "0")
        job = JobInfo(
            job_id=rec["JobId"],
            name=rec.get("JobName", ""),
            state=JobState.parse(rec.get("JobState", "")),
            reason=_text(rec.get("Reason", "")),
            nodes=tuple(expand_hostlist(rec.get("NodeList", ""))),
            exit_code=code,
            signal=sig,
            restarts=int(restarts) if restarts.isdigit() else 0,
            submit_time=parse_time(rec.get("SubmitTime", "")),
            start_time=parse_time(rec.get("StartTime", "")),
            end_time=parse_time(rec.get("EndTime", "")),
            partition=_text(rec.get("Partition", "")),
            reservation=_text(rec.get("Reservation", "")),
            state_flags=(rec.get("JobState", ""),),
        )
        out[job.job_id] = job
    return out


# ---------------------------------------------------------------- sinfo

# sinfo's long state names that stand for a base state plus the DRAIN flag.
_SINFO_WORDS = {
    "DRAINED": {"IDLE", "DRAIN"},
    "DRAINING": {"ALLOCATED", "DRAIN"},
    "MAINT": {"MAINTENANCE"},
    "ALLOC": {"ALLOCATED"},
    "MIX": {"MIXED"},
}


def parse_sinfo_fields(text: str) -> dict[str, NodeInfo]:
    """`sinfo -h -N -o '%N|%T|%E|%u|%H|%f|%o|%n'` -> nodes by name."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 8:
            continue
        name, state, reason, user, when, features, addr, host = parts[:8]
        words = set().union(*(_SINFO_WORDS.get(w, {w}) for w in _state_words(state)))
        out[name] = NodeInfo(
            name=name,
            state=frozenset(words),
            reason=_text(reason),
            reason_user=_text(user),
            reason_time=parse_time(when),
            features=_words(features),
            address=_text(addr),
            hostname=_text(host),
        )
    return out


def _json_node(node: Mapping[str, Any]) -> NodeInfo:
    """One node object: 22.05 sinfo (`state` + `state_flags`) or 23.02+ scontrol (`state` list)."""
    state = node.get("state")
    words = list(state) if isinstance(state, list) else [str(state or "")]
    words += list(node.get("state_flags") or [])
    return NodeInfo(
        name=str(node.get("name") or ""),
        state=frozenset(str(w).upper() for w in words if w),
        reason=_text(node.get("reason")),
        reason_user=_text(node.get("reason_set_by_user")),
        reason_time=_epoch(node.get("reason_changed_at")),
        features=_words(node.get("features")),
        address=_text(node.get("address")),
        hostname=_text(node.get("hostname")),
        cpus=_number(node.get("cpus")) or 0,
        sockets=_number(node.get("sockets")) or 0,
        cores_per_socket=_number(node.get("cores")) or 0,
        threads_per_core=_number(node.get("threads")) or 0,
        gres=parse_gres(str(node.get("gres") or "")),
        weight=_number(node.get("weight")),
    )


def _hosts(value: Any) -> list[str]:
    """A HOSTLIST field: a JSON list of names or a compressed hostlist string."""
    if isinstance(value, list):
        return [h for item in value for h in expand_hostlist(str(item))]
    return expand_hostlist(str(value or ""))


def _sinfo_group(entry: Mapping[str, Any]) -> Iterator[NodeInfo]:
    """One 23.02+ `sinfo --json` entry (nodes sharing a state/partition) -> one record per node."""
    nodes = entry.get("nodes") or {}
    names = _hosts(nodes.get("nodes"))
    addresses = _hosts(nodes.get("addresses"))
    hostnames = _hosts(nodes.get("hostnames"))
    reason = entry.get("reason") or {}
    features = entry.get("features") or {}
    state = frozenset(str(w).upper() for w in _words((entry.get("node") or {}).get("state")))
    for i, name in enumerate(names):
        yield NodeInfo(
            name=name,
            state=state,
            reason=_text(reason.get("description")),
            reason_user=_text(reason.get("user")),
            reason_time=_epoch(reason.get("time")),
            features=_words(features.get("total")),
            address=addresses[i] if len(addresses) == len(names) else "",
            hostname=hostnames[i] if len(hostnames) == len(names) else "",
        )


def parse_nodes_json(text: str) -> dict[str, NodeInfo]:
    """`sinfo --json` (22.05 `nodes`, 23.02+ `sinfo` groups) or `scontrol --json show nodes`."""
    data = _load(text, "sinfo --json")
    if "sinfo" in data:
        out: dict[str, NodeInfo] = {}
        for entry in data["sinfo"] or []:
            for node in _sinfo_group(entry):
                out.setdefault(node.name, node)  # a node in two partitions appears twice
        return out
    return {n.name: n for n in (_json_node(x) for x in data.get("nodes") or [])}
