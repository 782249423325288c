"""What monitoring and Slurm did while a fault job ran: node drains and their reasons, requeues, alerts.

The watcher turns each change it sees into one `Observation` (first time seen); the probe's own
events (NUMA mismatch, checkpoint failures, resume from checkpoint) are read from its HDF5 files by
the analysis and merged there.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_chaos.campaign.controller import REASON_PREFIX
from slurm_chaos.clock import Clock, SystemClock
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.rundir import Observation
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobInfo, JobState

log = logging.getLogger(__name__)


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
                alertname = labels.get("alertname") if isinstance(labels, dict) else None
                if isinstance(alertname, str):
                    self._add(
                        f"alert-{alertname}", f"alert_firing:{alertname}", json.dumps(labels, sort_keys=True)
                    )
        return info
