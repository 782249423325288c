"""Prometheus exporter of probe heartbeats and health-check results.

``python -m slurm_chaos.observe.exporter --port P --heartbeat-dir D`` serves, on every scrape, what
the heartbeat files and the health check's state files say right now: per rank step, compute and
communication time, its straggler ratio, checkpoint failures and NUMA mismatch; per node the
result of each check. Stale heartbeats (ranks that ended) are left out, so alerts resolve.

Only the signals the site's health-check config enables are exported: a monitoring set-up that
leaves a signal out must stay blind to it, alerts included (that is how a blind spot is shown).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from slurm_chaos.errors import ChaosError
from slurm_chaos.observe.checks import CRITICAL, OK, SIGNALS, WARNING, Thresholds
from slurm_chaos.observe.healthcheck import Options, load_config
from slurm_chaos.observe.heartbeat import Beat, read_heartbeats, straggler_ratio

log = logging.getLogger(__name__)

RANK_LABELS = ["job_id", "rank", "host", "world_size", "mode"]
# A node's health result older than this is from a check that no longer runs.
HEALTH_STALE_S = 120.0


@dataclass(frozen=True)
class Sources:
    """Where the exporter reads from; the config is re-read on every scrape (it is a few lines)."""

    heartbeats: Path
    states: Path | None = None
    config: Path | None = None

    def options(self) -> Options:
        if self.config is not None and self.config.exists():
            try:
                return load_config(self.config)
            except ChaosError as exc:
                log.warning("ignoring %s: %s", self.config, exc)
        return Options()

    @property
    def state_dir(self) -> Path:
        return self.states or self.heartbeats.parent / "health"


def _rank_labels(b: Beat) -> list[str]:
    return [b.job_id, str(b.rank), b.host, str(b.world_size), b.mode]


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def probe_metrics(
    beats: list[Beat], signals: frozenset[str], th: Thresholds, now: float
) -> list[GaugeMetricFamily]:
    """Per-rank gauges from the fresh heartbeats, for the enabled signals only."""
    fresh = [b for b in beats if b.fresh(now, th.stale_after_s)]
    out: list[GaugeMetricFamily] = []
    if "straggler" in signals:
        step = _gauge(
            "slurm_chaos_probe_step_seconds", "Mean step time over the rank's last steps", RANK_LABELS
        )
        compute = _gauge("slurm_chaos_probe_compute_seconds", "Mean compute time per step", RANK_LABELS)
        comm = _gauge("slurm_chaos_probe_comm_seconds", "Mean communication time per step", RANK_LABELS)
        last = _gauge("slurm_chaos_probe_last_step", "Last step the rank reported", RANK_LABELS)
        age = _gauge(
            "slurm_chaos_probe_heartbeat_age_seconds", "Seconds since the rank's heartbeat", RANK_LABELS
        )
        ratio = _gauge(
            "slurm_chaos_probe_straggler_ratio",
            "Rank's compute time over the median of its job's other ranks",
            RANK_LABELS,
        )
        steady = [b for b in fresh if b.window >= th.straggler_min_steps]
        for b in fresh:
            labels = _rank_labels(b)
            step.add_metric(labels, b.step_time)
            compute.add_metric(labels, b.compute_time)
            comm.add_metric(labels, b.comm_time)
            last.add_metric(labels, b.step)
            age.add_metric(labels, now - b.time)
            r = straggler_ratio(b, steady) if b.window >= th.straggler_min_steps else None
            if r is not None:
                ratio.add_metric(labels, r)
        out += [step, compute, comm, last, age, ratio]
    if "checkpoint" in signals:
        ckpt = _gauge(
            "slurm_chaos_probe_checkpoint_failures", "Checkpoint writes that failed in this run", RANK_LABELS
        )
        for b in fresh:
            ckpt.add_metric(_rank_labels(b), b.checkpoint_failures)
        out.append(ckpt)
    if "numa" in signals:
        numa = _gauge(
            "slurm_chaos_probe_numa_mismatch", "1 if the rank's GPU is on a remote NUMA node", RANK_LABELS
        )
        for b in fresh:
            numa.add_metric(_rank_labels(b), 1.0 if b.numa_mismatch else 0.0)
        out.append(numa)
    return out


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def health_metrics(state_dir: Path, signals: frozenset[str], now: float) -> list[GaugeMetricFamily]:
    """Per node and check: the health check's last result (1 ok / 0 failed) and its Nagios status."""
    ok = _gauge(
        "slurm_chaos_health_check_ok",
        "1 if the check passed (OK or WARNING) on its last run",
        ["node", "check"],
    )
    status = _gauge(
        "slurm_chaos_health_check_status", "Nagios status: 0 OK 1 WARNING 2 CRITICAL", ["node", "check"]
    )
    age = _gauge(
        "slurm_chaos_health_check_age_seconds", "Seconds since the node's last health check", ["node"]
    )
    for path in sorted(state_dir.glob("[!.]*.json")) if state_dir.is_dir() else []:
        state = _read_state(path)
        if state is None or now - float(state.get("time", 0)) > HEALTH_STALE_S:
            continue
        node = str(state.get("node", path.stem))
        age.add_metric([node], now - float(state["time"]))
        for r in state.get("results", []):
            if isinstance(r, dict) and r.get("check") in signals:
                code = int(r.get("status", OK))
                ok.add_metric([node, str(r["check"])], 0.0 if code == CRITICAL else 1.0)
                status.add_metric([node, str(r["check"])], code if code in (OK, WARNING, CRITICAL) else 3)
    return [ok, status, age]


class ChaosCollector(Collector):
    """Reads the files afresh on each scrape: what is exported is what the node shows now."""

    def __init__(self, sources: Sources, clock: Any = time.time) -> None:
        self.sources = sources
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        opts = self.sources.options()
        enabled = _gauge(
            "slurm_chaos_signal_enabled", "1 if this monitoring set-up watches the signal", ["signal"]
        )
        for name in SIGNALS:
            enabled.add_metric([name], 1.0 if name in opts.signals else 0.0)
        yield enabled
        beats = read_heartbeats(self.sources.heartbeats)
        yield from probe_metrics(beats, opts.signals, opts.thresholds, now)
        yield from health_metrics(self.sources.state_dir, opts.signals, now)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurm_chaos.observe.exporter", description=__doc__.splitlines()[0]
    )
    p.add_argument("--port", type=int, required=True, help="port to serve /metrics on")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--heartbeat-dir", type=Path, required=True, help="probe heartbeat directory")
    p.add_argument("--state-dir", type=Path, help="health-check results (default: <heartbeat-dir>/../health)")
    p.add_argument("--config", type=Path, help="the health check's TOML config: enabled signals, thresholds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    registry = CollectorRegistry()
    registry.register(ChaosCollector(Sources(args.heartbeat_dir, args.state_dir, args.config)))
    try:
        start_http_server(args.port, addr=args.address, registry=registry)
    except OSError as exc:
        print(f"exporter: cannot listen on {args.address}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"exporter: serving {args.heartbeat_dir} on http://{args.address}:{args.port}/metrics", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
