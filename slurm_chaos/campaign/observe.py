"""What monitoring and Slurm did while a fault job ran: node drains and their reasons, requeues, alerts.

The watcher turns each change it sees into one `Observation` (first time seen); the probe's own
events (NUMA mismatch, checkpoint failures, resume from checkpoint) are read from its HDF5 files by
the analysis and merged there.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from slurm_chaos.campaign.controller import REASON_PREFIX
from slurm_chaos.clock import Clock, SystemClock
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.rundir import Observation
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobInfo, JobState

log = logging.getLogger(__name__)

#: Alert labels that name the job, and those that name the node, an alert is about.
JOB_LABELS = ("job_id", "jobid", "slurm_job_id")
NODE_LABELS = ("node", "host", "hostname", "Hostname")


def fetch_alerts(alertmanager: str, timeout: float = 3.0) -> list[dict[str, object]]:
    """Active alerts from Alertmanager's v2 API; an unreachable Alertmanager yields none (logged)."""
    url = alertmanager.rstrip("/") + "/api/v2/alerts?active=true&silenced=false&inhibited=false"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - site-configured URL
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        log.debug("alertmanager %s: %s", alertmanager, exc)
        return []
    return data if isinstance(data, list) else []


@dataclass
class Watcher:
    """Polls Slurm (and Alertmanager) while one job runs; one query of each kind per tick."""

    scheduler: Scheduler
    job_id: str
    alertmanager: str | None = None
    clock: Clock = field(default_factory=SystemClock)
    alerts: Callable[[str], list[dict[str, object]]] = fetch_alerts
    observations: list[Observation] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    restarts: int = 0
    nodes_seen: set[str] = field(default_factory=set)
    last: JobInfo | None = None

    def _add(self, key: str, signal: str, detail: str, when: float | None = None) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        self.observations.append(Observation(signal, when if when is not None else self.clock.time(), detail))
        log.info("observed %s: %s", signal, detail)

    def tick(self) -> JobInfo | None:
        """One poll of the job, one query of its nodes, one of Alertmanager."""
        info = self.scheduler.poll([self.job_id]).get(self.job_id)
        if info is None:
            return self.last
        self.last = info
        self.nodes_seen.update(info.nodes)
        if info.restarts > self.restarts:
            self.restarts = info.restarts
            self._add(
                f"requeue{info.restarts}", "job_requeued", f"job {self.job_id} requeued ({info.restarts})"
            )
        if self.restarts and info.state == JobState.RUNNING and info.nodes:
            self._add(f"rescheduled{self.restarts}", "job_rescheduled", ",".join(info.nodes))
        if self.nodes_seen:
            for name, node in self.scheduler.nodes(sorted(self.nodes_seen)).items():
                if node.drain and node.reason and not node.reason.startswith(REASON_PREFIX):
                    # Our own injected drain is the fault, not a detection of it.
                    if node.reason.startswith(HEALTHCHECK_PREFIX):
                        self._add(f"hc-{name}", "healthcheck_drain", f"{name}: {node.reason}")
                    self._add(f"drain-{name}", "node_drained", f"{name}: {node.reason}")
                if "DOWN" in node.state:
                    self._add(f"down-{name}", "node_down", f"{name}: {node.reason or 'not responding'}")
        if self.alertmanager:
            for alert in self.alerts(self.alertmanager):
                labels = alert.get("labels")
                if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
                    continue
                if not self.concerns_job(labels):
                    continue
                detail = json.dumps(labels, sort_keys=True)
                # One observation per alert (its labels), at the time Alertmanager says it began: an
                # alert of the same name about an earlier job neither hides this one nor counts.
                self._add(f"alert-{detail}", f"alert_firing:{labels['alertname']}", detail, starts_at(alert))
        return info

    def concerns_job(self, labels: dict[str, object]) -> bool:
        """An alert that names a job counts only for this job; one that names a node only for this
        job's nodes; one that names neither (cluster-wide) for every job."""
        jobs = {str(labels[k]) for k in JOB_LABELS if k in labels}
        if jobs:
            return self.job_id in jobs
        nodes = {str(labels[k]) for k in NODE_LABELS if k in labels}
        return not nodes or bool(nodes & self.nodes_seen)


def starts_at(alert: dict[str, object]) -> float | None:
    """Alertmanager's ``startsAt`` (RFC 3339, nanoseconds) as Unix seconds; None if absent or malformed."""
    text = alert.get("startsAt")
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if m is None:
        return None
    fraction = (m.group(2) or ".0")[:7]  # microseconds at most
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        when = datetime.fromisoformat(m.group(1) + fraction + zone).timestamp()
    except ValueError:
        return None
    return when if when > 0 else None  # Alertmanager's zero time: unknown
