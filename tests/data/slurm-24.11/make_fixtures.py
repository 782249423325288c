"""Writes the Slurm 24.11 JSON fixtures in this folder (see README.md for where each shape comes from).

The scenario mirrors the real 22.05 recording in ../slurm-22.05 (same jobs, nodes, times); only
the layout is 24.11's data_parser v0.0.42. Run: python tests/data/slurm-24.11/make_fixtures.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
T0 = 1796014146  # 2026-11-30T04:49:06Z, the submit time of the recorded 22.05 jobs


def num(n: int | None, infinite: bool = False) -> dict[str, Any]:
    """UINT32_NO_VAL / TIMESTAMP_NO_VAL as v0.0.42 dumps them."""
    return {"set": n is not None, "infinite": infinite, "number": n or 0}


def exit_code(status: str, rc: int | None = None, sig: int | None = None, name: str = "") -> dict[str, Any]:
    """PROCESS_EXIT_CODE_VERBOSE: status is a single flag string (add_parse_bit_flag_string)."""
    return {"status": status, "return_code": num(rc), "signal": {"id": num(sig), "name": name}}


def meta(command: list[str]) -> dict[str, Any]:
    return {
        "plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.42", "accounting_storage": ""},
        "client": {"source": "/dev/pts/0", "user": "root", "group": "root"},
        "command": command,
        "slurm": {
            "version": {"major": "24", "micro": "5", "minor": "11"},
            "release": "24.11.5",
            "cluster": "testcluster",
        },
    }


def squeue_job(
    job_id: int, name: str, state: list[str], reason: str, nodes: str, **kw: Any
) -> dict[str, Any]:
    job = {
        "account": "root",
        "accrue_time": num(T0),
        "array_job_id": num(0),
        "array_task_id": num(None),
        "array_max_tasks": num(0),
        "array_task_string": "",
        "batch_flag": True,
        "batch_host": "",
        "cluster": "testcluster",
        "cpus": num(1),
        "current_working_directory": "/tmp/jobs",
        "eligible_time": num(T0),
        "end_time": num(kw.get("end")),
        "exit_code": kw.get("exit", exit_code("SUCCESS", 0)),
        "flags": [],
        "job_id": job_id,
        "job_state": state,
        "name": name,
        "node_count": num(len(nodes.split(",")) if nodes else 1),
        "nodes": nodes,
        "partition": "debug",
        "priority": num(4294901759 - job_id),
        "required_switches": kw.get("switches", 0),
        "requeue": True,
        "restart_cnt": kw.get("restarts", 0),
        "resv_name": kw.get("resv", ""),
        "start_time": num(kw.get("start")),
        "state_description": "",
        "state_reason": reason,
        "submit_time": num(kw.get("submit", T0)),
        "time_limit": num(None, infinite=True),
        "user_name": "root",
    }
    job.update(kw.get("extra", {}))
    return job


def squeue() -> dict[str, Any]:
    jobs = [
        squeue_job(1, "two-node", ["RUNNING"], "None", "node[1-2]", start=T0),
        squeue_job(2, "leaf switch", ["RUNNING"], "None", "node[1-2]", start=T0, switches=1),
        squeue_job(3, "failing", ["PENDING"], "Resources", ""),
        squeue_job(4, "ok", ["COMPLETED", "COMPLETING"], "None", "node2", start=T0 + 40, end=T0 + 40),
        squeue_job(5, "cancelled", ["CANCELLED"], "Priority", "", end=T0 + 3),
        squeue_job(6, "requeued", ["PENDING"], "BeginTime", "", restarts=1, resv="maint", submit=T0 + 3),
        squeue_job(
            8, "arr", ["PENDING"], "Priority", "", extra={"array_job_id": num(8), "array_task_string": "1-2"}
        ),
        squeue_job(
            10,
            "timeout",
            ["TIMEOUT"],
            "TimeLimit",
            "node1",
            start=T0 + 66,
            end=T0 + 127,
            exit=exit_code("SIGNALED", sig=15, name="TERM"),
        ),
        squeue_job(
            11,
            "oom-ish",
            ["FAILED"],
            "NonZeroExitCode",
            "node1",
            start=T0 + 66,
            end=T0 + 67,
            exit=exit_code("ERROR", 137),
        ),
    ]
    return {
        "jobs": jobs,
        "last_backfill": num(T0 + 60),
        "last_update": num(T0 + 61),
        "meta": meta(["squeue", "--json"]),
        "errors": [],
        "warnings": [],
    }


def step(
    job_id: int, name: str, state: str, nodes: str, start: int, end: int | None, ec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "time": {
            "elapsed": (end or start + 99) - start,
            "end": num(end),
            "start": num(start),
            "suspended": 0,
            "system": {"seconds": 0, "microseconds": 0},
            "total": {"seconds": 0, "microseconds": 0},
            "user": {"seconds": 0, "microseconds": 0},
        },
        "exit_code": ec,
        "nodes": {"count": len(nodes.split(",")), "range": nodes, "list": [nodes]},
        "tasks": {"count": 1},
        "kill_request_user": "",
        "state": [state],
        "step": {"id": f"{job_id}.{name}", "name": name},
        "task": {"distribution": "Unknown"},
    }


def acct_job(
    job_id: int,
    name: str,
    state: list[str],
    nodes: str,
    submit: int,
    start: int,
    end: int,
    ec: dict[str, Any],
    steps: list[dict[str, Any]],
    restarts: int = 0,
    resv: str = "",
) -> dict[str, Any]:
    return {
        "account": "root",
        "allocation_nodes": 1,
        "array": {
            "job_id": 0,
            "limits": {"max": {"running": {"tasks": 0}}},
            "task_id": num(None),
            "task": "",
        },
        "association": {
            "account": "root",
            "cluster": "testcluster",
            "partition": "",
            "user": "root",
            "id": 2,
        },
        "cluster": "testcluster",
        "derived_exit_code": ec,
        "exit_code": ec,
        "flags": ["STARTED_ON_SCHEDULE"],
        "group": "root",
        "job_id": job_id,
        "name": name,
        "nodes": nodes,
        "partition": "debug",
        "qos": "normal",
        "restart_cnt": restarts,
        "reservation": {"id": 1 if resv else 0, "name": resv},
        "state": {"current": state, "reason": "None"},
        "steps": steps,
        "time": {
            "elapsed": max(0, (end or start + 99) - start),
            "eligible": submit,
            "end": end,
            "planned": num(0),
            "start": start,
            "submission": submit,
            "suspended": 0,
            "limit": num(None, infinite=True),
            "system": {"seconds": 0, "microseconds": 0},
            "total": {"seconds": 0, "microseconds": 0},
            "user": {"seconds": 0, "microseconds": 0},
        },
        "user": "root",
        "working_directory": "/tmp/jobs",
    }


def sacct() -> dict[str, Any]:
    ok = exit_code("SUCCESS", 0)
    term = exit_code("SIGNALED", sig=15, name="TERM")
    jobs = [
        acct_job(
            1,
            "two-node",
            ["CANCELLED"],
            "node[1-2]",
            T0,
            T0,
            T0 + 40,
            term,
            [
                step(1, "batch", "CANCELLED", "node1", T0, T0 + 40, term),
                step(1, "0", "COMPLETED", "node[1-2]", T0, T0, ok),
            ],
        ),
        acct_job(
            3,
            "failing",
            ["FAILED"],
            "node2",
            T0,
            T0 + 40,
            T0 + 40,
            exit_code("ERROR", 3),
            [step(3, "batch", "FAILED", "node2", T0 + 40, T0 + 40, exit_code("ERROR", 3))],
        ),
        acct_job(
            6,
            "requeued",
            ["REQUEUED"],
            "node3",
            T0,
            T0,
            T0 + 3,
            ok,
            [step(6, "batch", "CANCELLED", "node3", T0, T0 + 3, term)],
        ),
        acct_job(
            6,
            "requeued",
            ["RUNNING"],
            "node3",
            T0 + 3,
            T0 + 126,
            0,
            ok,
            [step(6, "batch", "RUNNING", "node3", T0 + 126, None, ok)],
            restarts=1,
            resv="maint",
        ),
        acct_job(
            10,
            "timeout",
            ["TIMEOUT"],
            "node1",
            T0 + 40,
            T0 + 66,
            T0 + 127,
            ok,
            [step(10, "batch", "CANCELLED", "node1", T0 + 66, T0 + 127, term)],
        ),
    ]
    return {"jobs": jobs, "meta": meta(["sacct", "--json", "-D"]), "errors": [], "warnings": []}


def node(
    name: str,
    addr: str,
    state: list[str],
    features: list[str],
    reason: str = "",
    user: str = "",
    when: int | None = None,
) -> dict[str, Any]:
    return {
        "architecture": "x86_64",
        "boards": 1,
        "boot_time": num(T0 - 282),
        "cores": 1,
        "cpu_load": 42,
        "cpus": 2,
        "effective_cpus": 2,
        "features": features,
        "active_features": features,
        "gres": "",
        "hostname": name,
        "address": addr,
        "last_busy": num(T0 - 23),
        "name": name,
        "next_state_after_reboot": ["INVALID"],
        "operating_system": "Linux 6.1.0",
        "owner": "",
        "partitions": ["debug"],
        "port": 16818,
        "real_memory": 4000,
        "reason": reason,
        "reason_changed_at": num(when),
        "reason_set_by_user": user,
        "resume_after": num(None),
        "reservation": "maint" if "RESERVED" in state else "",
        "sockets": 2,
        "state": state,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": "cpu=2,mem=4000M,billing=2",
        "version": "24.11.5",
    }


def scontrol_nodes() -> dict[str, Any]:
    nodes = [
        node("node1", "10.200.0.11", ["ALLOCATED"], ["gpu", "rack1"]),
        node("node2", "10.200.0.12", ["ALLOCATED"], ["gpu", "rack1"]),
        node("node3", "10.200.0.13", ["IDLE", "RESERVED", "MAINTENANCE", "PLANNED"], ["gpu", "rack2"]),
        node(
            "node4",
            "10.200.0.14",
            ["IDLE", "DRAIN", "RESERVED", "MAINTENANCE"],
            ["gpu", "rack2"],
            "h-slurm: disk check failed",
            "root",
            T0,
        ),
    ]
    return {
        "nodes": nodes,
        "last_update": num(T0 + 61),
        "meta": meta(["scontrol", "--json", "show", "nodes"]),
        "errors": [],
        "warnings": [],
    }


def sinfo_group(
    names: list[str],
    addrs: list[str],
    state: list[str],
    features: str,
    reason: str = "",
    user: str = "",
    when: int = 0,
) -> dict[str, Any]:
    return {
        "port": 16818,
        "node": {"state": state},
        "nodes": {
            "allocated": 0,
            "idle": 0,
            "other": 0,
            "total": len(names),
            "hostnames": names,
            "addresses": addrs,
            "nodes": names,
        },
        "cpus": {"allocated": 0, "idle": 0, "other": 0, "total": 2 * len(names)},
        "features": {"total": features, "active": features},
        "reason": {"description": reason, "time": when, "user": user},
        "partition": {"name": "debug", "nodes": {"configured": "node[1-4]", "total": 4}},
        "cluster": "testcluster",
        "comment": "",
        "extra": "",
        "reservation": "",
    }


def sinfo() -> dict[str, Any]:
    groups = [
        sinfo_group(["node1", "node2"], ["10.200.0.11", "10.200.0.12"], ["ALLOCATED"], "gpu,rack1"),
        sinfo_group(["node3"], ["10.200.0.13"], ["IDLE", "RESERVED", "MAINTENANCE", "PLANNED"], "gpu,rack2"),
        sinfo_group(
            ["node4"],
            ["10.200.0.14"],
            ["IDLE", "DRAIN", "RESERVED", "MAINTENANCE"],
            "gpu,rack2",
            "h-slurm: disk check failed",
            "root",
            T0,
        ),
    ]
    return {"sinfo": groups, "meta": meta(["sinfo", "--json"]), "errors": [], "warnings": []}


def main() -> None:
    for name, data in [
        ("squeue.json", squeue()),
        ("sacct.json", sacct()),
        ("scontrol_show_nodes.json", scontrol_nodes()),
        ("sinfo.json", sinfo()),
    ]:
        (HERE / name).write_text(json.dumps(data, indent=2) + "\n")
    (HERE / "sinfo_version.txt").write_text("slurm-wlm 24.11.5\n")


if __name__ == "__main__":
    main()
