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
from pathlib import Path

from slurm_chaos.campaign.controller import REASON_PREFIX
from slurm_chaos.clock import Clock, SystemClock
from slurm_chaos.observe.checks import CRITICAL, Thresholds, check_checkpoint, check_straggler
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.probe.heartbeat import Beat, scan_heartbeats
from slurm_chaos.rundir import Observation, Signal, alert_signal, detector_signal, reference_signal
from slurm_chaos.site import NODE_LABELS, Detector
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobInfo, JobState, NodeInfo

log = logging.getLogger(__name__)

#: Alert labels that name the job an alert is about (those that name the node: the site's).
JOB_LABELS = ("job_id", "jobid", "slurm_job_id")
#: Node states whose Reason says why (a drain, slurmd not responding, a failed node).
REASON_STATES = ("DRAIN", "DOWN", "FAIL", "FAILING")
#: The jobs a health-check drain reason names (its findings say ``job <id> ...``).
REASON_JOB_RE = re.compile(r"\bjob ([A-Za-z0-9_]+)\b")
#: Slurm's reason time is a time_t: whole seconds, truncated (``Observation.resolution_s``).
REASON_TIME_RESOLUTION_S = 1.0
#: What would have caught each finding of the reference checks: slurm-chaos's own check, metric
#: and alert rule (site_configs/alerts/slurm-chaos.rules.yml), named in a BLIND SPOT's reason.
REFERENCE_CATCHERS = {
    "straggler": "health check 'straggler', metric slurm_chaos_probe_straggler_ratio, alert ChaosStraggler",
    "checkpoint": (
        "health check 'checkpoint', metric slurm_chaos_probe_checkpoint_failures_total, "
        "alert ChaosCheckpointFailing"
    ),
}


def fetch_alerts(alertmanager: str, timeout: float = 3.0) -> list[dict[str, object]]:
    """Active alerts from Alertmanager's v2 API, silenced and inhibited ones too (a maintenance
    window's silence hides an alert from people, not the fact that it fired); an unreachable
    Alertmanager yields none (logged)."""
    url = alertmanager.rstrip("/") + "/api/v2/alerts?active=true&silenced=true&inhibited=true"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - site-configured URL
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        log.debug("alertmanager %s: %s", alertmanager, exc)
        return []
    return data if isinstance(data, list) else []


def silenced(alert: dict[str, object]) -> bool:
    """Alertmanager silenced or inhibited the alert (v2 ``status``): it fired all the same."""
    status = alert.get("status")
    if not isinstance(status, dict):
        return False
    return status.get("state") == "suppressed" or bool(status.get("silencedBy") or status.get("inhibitedBy"))


def host_of(value: str) -> str:
    """The host a label value names: ``node2:9100`` (Prometheus' ``instance``) and ``node2.site:9100``
    name ``node2``; an address stays whole."""
    host = value
    m = re.fullmatch(r"\[(.+)\]:\d+|([^:]+):\d+", value)
    if m is not None:
        host = m.group(1) or m.group(2)
    if ":" in host or re.fullmatch(r"[\d.]+", host):
        return host
    return host.split(".", 1)[0]


@dataclass
class Watcher:
    """Polls Slurm (and Alertmanager) while one job runs; one query of each kind per tick.

    ``detectors`` are the site's: each drain reason or alert of theirs about the job or its nodes
    is one observation ``detector:<name>``, beside the generic ones (``node_drained``,
    ``alert_firing:<alertname>``) that today's expectations name.

    A drain, a down node and a detector's reason are timed when Slurm set the node's reason (its
    ``reason_time``), not when we polled: a poll every 2 s would otherwise add up to 2 s to every
    time to detect. Where Slurm gives no reason time, or one older than a poll that did not yet
    show the change (a reason kept from before, as Slurm keeps one when a drained node goes down),
    the poll's time stands.

    ``reference_heartbeats``: where the watcher can read the job's heartbeats (the site's
    ``monitoring.heartbeat_dir``, on the sandbox a local directory), to run slurm-chaos's own
    heartbeat checks (straggler, checkpoint failures) on them as a reference, whatever the site's
    health check enables: each finding is one observation ``reference:<check>`` at the time of the
    heartbeat that showed it. It is never a detection; it says what the site's detectors missed.
    """

    scheduler: Scheduler
    job_id: str
    alertmanager: str | None = None
    clock: Clock = field(default_factory=SystemClock)
    alerts: Callable[[str], list[dict[str, object]]] = fetch_alerts
    detectors: tuple[Detector, ...] = ()
    node_labels: tuple[str, ...] = NODE_LABELS
    observations: list[Observation] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    restarts: int = 0
    nodes_seen: set[str] = field(default_factory=set)
    #: Other names of the nodes seen (NodeHostName, NodeAddr) -> node name.
    _aliases: dict[str, str] = field(default_factory=dict)
    #: Per observation key of a node's state: the last poll that did not show it.
    _clear_at: dict[str, float] = field(default_factory=dict)
    last: JobInfo | None = None
    reference_heartbeats: Path | None = None
    reference_thresholds: Thresholds = field(default_factory=Thresholds)

    def _add(self, key: str, o: Observation) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        self.observations.append(o)
        log.info("observed %s: %s%s", o.signal, o.detail, " (silenced)" if o.silenced else "")

    def _note(
        self,
        key: str,
        signal: str,
        detail: str,
        when: float | None = None,
        quiet: bool = False,
        res: float = 0.0,
    ) -> None:
        t = self.clock.time() if when is None else when
        self._add(key, Observation(signal, t, detail, silenced=quiet, resolution_s=res))

    def _detected(
        self, key: str, d: Detector, detail: str, when: float | None, quiet: bool = False, res: float = 0.0
    ) -> None:
        """A firing of site detector ``d``: observation ``detector:<name>``, with what it covers."""
        t = self.clock.time() if when is None else when
        fired = Observation(detector_signal(d.name), t, detail, d.name, d.signals, quiet, res)
        self._add(f"{key}@{d.name}", fired)

    def tick(self) -> JobInfo | None:
        """One poll of the job, one query of its nodes, one of Alertmanager."""
        info = self.scheduler.poll([self.job_id]).get(self.job_id)
        if info is None:
            return self.last
        self.last = info
        self.nodes_seen.update(info.nodes)
        if info.restarts > self.restarts:
            self.restarts = info.restarts
            what = f"job {self.job_id} requeued ({info.restarts})"
            self._note(f"requeue{info.restarts}", Signal.JOB_REQUEUED, what)
        if self.restarts and info.state == JobState.RUNNING and info.nodes:
            self._note(f"rescheduled{self.restarts}", Signal.JOB_RESCHEDULED, ",".join(info.nodes))
        if self.nodes_seen:
            for node in self.scheduler.nodes(sorted(self.nodes_seen)).values():
                self._check_node(node)
        if self.alertmanager:
            for alert in self.alerts(self.alertmanager):
                self._check_alert(alert)
        if self.reference_heartbeats is not None:
            self._check_reference(self.reference_heartbeats)
        return info

    def _check_reference(self, directory: Path) -> None:
        """slurm-chaos's heartbeat checks on this job's heartbeats: each finding once per node."""
        try:
            beats = [b for b in scan_heartbeats(directory).beats if b.job_id == self.job_id]
        except OSError as exc:
            log.debug("reference heartbeats %s: %s", directory, exc)
            return
        now = self.clock.time()
        th = self.reference_thresholds
        for node in sorted({b.host for b in beats}):
            mine: list[Beat] = [b for b in beats if b.host == node]
            for result in (
                check_straggler(node, beats, th, now),
                check_checkpoint(node, None, mine, th, now),
            ):
                if result.status != CRITICAL:
                    continue
                # The newest heartbeat of the node showed it: when a check reading it would have fired.
                when = max(b.time for b in mine)
                catcher = REFERENCE_CATCHERS.get(result.check, f"health check {result.check!r}")
                detail = f"{node}: {result.message} [{catcher}]"
                self._note(f"ref-{result.check}-{node}", reference_signal(result.check), detail, when)

    def _check_node(self, node: NodeInfo) -> None:
        name = node.name
        self._aliases.update({host_of(a): name for a in (node.hostname, node.address) if a and a != name})
        # Our own injected drain is the fault, not a detection of it; nor is the health check's drain
        # on another job's findings (a job on a shared node) a detection of this one's fault.
        ignored = node.reason.startswith(REASON_PREFIX) or self.anothers_drain(node.reason)
        now = self.clock.time()
        drained = node.drain and bool(node.reason) and not ignored
        healthcheck = drained and node.reason.startswith(HEALTHCHECK_PREFIX)
        detail = f"{name}: {node.reason}"
        down = f"{name}: {node.reason or 'not responding'}"
        for key, signal, what, on in (
            (f"hc-{name}", Signal.HEALTHCHECK_DRAIN, detail, healthcheck),
            (f"drain-{name}", Signal.NODE_DRAINED, detail, drained),
            (f"down-{name}", Signal.NODE_DOWN, down, "DOWN" in node.state),
        ):
            shown = self._shown(key, on, node, ignored, now)
            if shown is not None:
                self._note(key, signal, what, shown[0], res=shown[1])
        key = f"reason-{name}-{node.reason}"
        reasoned = bool(node.reason) and not ignored and any(s in node.state for s in REASON_STATES)
        shown = self._shown(key, reasoned, node, ignored, now)
        if shown is not None:
            for d in self.detectors:
                if d.matches_reason(node.reason):
                    self._detected(key, d, detail, shown[0], res=shown[1])

    def anothers_drain(self, reason: str) -> bool:
        """A health-check drain reason that names jobs (findings of their own heartbeats or tasks),
        none of them this one: another job's, which says nothing about this job's fault."""
        if not reason.startswith(HEALTHCHECK_PREFIX):
            return False
        jobs = set(REASON_JOB_RE.findall(reason))
        return bool(jobs) and self.job_id not in jobs

    def _shown(
        self, key: str, on: bool, node: NodeInfo, ours: bool, now: float
    ) -> tuple[float | None, float] | None:
        """None where the node does not show the state ``key`` names (this poll is then the last that
        did not); else when it came and that time's resolution: Slurm's reason time, or the poll's
        (None, 0) where Slurm gives none, the reason is our own injected one, or the reason is older
        than the last poll that did not show the state (it was there before the state came)."""
        if not on:
            self._clear_at[key] = now
            return None
        if node.reason_time is None or not node.reason or ours:
            return None, 0.0
        t = node.reason_time.timestamp()
        clear = self._clear_at.get(key)
        if clear is not None and t + REASON_TIME_RESOLUTION_S <= clear:
            return None, 0.0
        # Never later than we saw it: a controller clock ahead of ours.
        return min(t, now), REASON_TIME_RESOLUTION_S

    def _check_alert(self, alert: dict[str, object]) -> None:
        labels = alert.get("labels")
        if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
            return
        if not self.concerns_job(labels):
            return
        detail = json.dumps(labels, sort_keys=True)
        quiet = silenced(alert)
        # One observation per alert (its labels), at the time Alertmanager says it began: an
        # alert of the same name about an earlier job neither hides this one nor counts.
        when = starts_at(alert)
        self._note(f"alert-{detail}", alert_signal(str(labels["alertname"])), detail, when, quiet)
        for d in self.detectors:
            if d.matches_alert(labels):
                self._detected(f"alert-{detail}", d, detail, when, quiet)

    def alert_nodes(self, labels: dict[str, object]) -> set[str]:
        """The nodes an alert's labels name (the site's node labels), by their Slurm names."""
        hosts = {host_of(str(labels[k])) for k in self.node_labels if k in labels}
        return {self._aliases.get(h, h) for h in hosts}

    def concerns_job(self, labels: dict[str, object]) -> bool:
        """An alert that names a job counts only for this job; one that names a node only for this
        job's nodes; one that names neither (cluster-wide) for every job."""
        jobs = {str(labels[k]) for k in JOB_LABELS if k in labels}
        if jobs:
            return self.job_id in jobs
        nodes = self.alert_nodes(labels)
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
