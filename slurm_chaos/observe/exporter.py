"""Prometheus exporter of probe heartbeats and health-check results.

``python -m slurm_chaos.observe.exporter --port P --heartbeat-dir D`` serves, on every scrape, what
the heartbeat files and the health check's state files say right now: per rank step, compute and
communication time, its straggler ratio, checkpoint failures and NUMA mismatch; per node the
result of each check. Per-rank and per-node series carry the node under dcgm-exporter's name too
(``Hostname``), and a rank's GPU (``gpu``, NVML's index) where its heartbeat says, so a site's rules
can join them with dcgm-exporter's and node_exporter's (``--node-label``/``--gpu-label`` rename them).
Counters (Prometheus' ``_total`` names) count what only grows: a rank's failed checkpoint writes,
the files the exporter rejected; everything else is a gauge. Stale heartbeats (ranks that ended) are
left out, so alerts resolve.

A site that runs node_exporter rather than one more daemon: ``--textfile PATH.prom --interval S``
writes the same registry (``generate_latest``) to PATH every S seconds, atomically, for node_exporter's
textfile collector (``--collector.textfile.directory``); ``--once`` writes it once.

Each file is read on its own: one that is malformed or not trusted (see heartbeat.py; a state
file must be its directory owner's, in a directory no one else writes) is skipped and counted in
``slurm_chaos_exporter_rejected_files_total`` (per read, since the exporter started), never fatal to
the scrape. A scrape that fails all the same, or an exporter that is down, fires ChaosExporterDown
(site_configs/alerts).

Only the signals the site's health-check config enables are exported: a monitoring set-up that
leaves a signal out must stay blind to it, alerts included (that is how a blind spot is shown).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from slurm_chaos.errors import ChaosError
from slurm_chaos.observe.checks import CRITICAL, OK, SIGNALS, WARNING, Thresholds
from slurm_chaos.observe.healthcheck import Options, load_config
from slurm_chaos.probe.heartbeat import Beat, scan_heartbeats, straggler_ratio

log = logging.getLogger(__name__)

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


#: Labels of our own on the per-rank and per-node series; a join label may not take one of these names.
OWN_LABELS = frozenset({"job_id", "rank", "host", "world_size", "mode", "node", "check", "kind", "signal"})
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class JoinLabels:
    """The names of the labels that let a site's rules join our series with its own exporters':
    the node, as dcgm-exporter names it (``Hostname``; node_exporter's ``instance`` is the scrape
    target's, which Prometheus sets), and the GPU's NVML index (dcgm-exporter's ``gpu``)."""

    node: str = "Hostname"
    gpu: str = "gpu"

    def __post_init__(self) -> None:
        for what, name in (("node", self.node), ("gpu", self.gpu)):
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__") or name in OWN_LABELS:
                raise ValueError(f"{what} label {name!r}: not a label name of its own")
        if self.node == self.gpu:
            raise ValueError(f"node and gpu label are both {self.node!r}")


def rank_labels(b: Beat, join: JoinLabels) -> dict[str, str]:
    """A rank's series labels: ours, the node under the join name too, and its GPU where known."""
    labels = {
        "job_id": b.job_id,
        "rank": str(b.rank),
        "host": b.host,
        join.node: b.host,
        "world_size": str(b.world_size),
        "mode": b.mode,
    }
    if b.gpu is not None:
        labels[join.gpu] = str(b.gpu)
    return labels


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc)


def _counter(name: str, doc: str) -> CounterMetricFamily:
    """A counter family `name`; its samples are exposed as ``<name>_total``."""
    return CounterMetricFamily(name, doc)


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    """One sample; by label dict, as a rank without a GPU has no ``gpu`` label at all (not an empty one)."""
    family.add_sample(family.name + ("_total" if family.type == "counter" else ""), labels, value)


def probe_metrics(
    beats: list[Beat], signals: frozenset[str], th: Thresholds, now: float, join: JoinLabels = JoinLabels()
) -> list[Metric]:
    """Per-rank metrics from the fresh heartbeats, for the enabled signals only."""
    fresh = [b for b in beats if b.fresh(now, th.stale_after_s)]
    out: list[Metric] = []
    if "straggler" in signals:
        step = _gauge("slurm_chaos_probe_step_seconds", "Mean step time over the rank's last steps")
        compute = _gauge("slurm_chaos_probe_compute_seconds", "Mean compute time per step")
        comm = _gauge("slurm_chaos_probe_comm_seconds", "Mean communication time per step")
        last = _gauge("slurm_chaos_probe_last_step", "Last step the rank reported")
        age = _gauge("slurm_chaos_probe_heartbeat_age_seconds", "Seconds since the rank's heartbeat")
        ratio = _gauge(
            "slurm_chaos_probe_straggler_ratio",
            "Rank's compute time over the median of its job's other ranks",
        )
        steady = [b for b in fresh if b.window >= th.straggler_min_steps]
        for b in fresh:
            labels = rank_labels(b, join)
            _add(step, labels, b.step_time)
            _add(compute, labels, b.compute_time)
            _add(comm, labels, b.comm_time)
            _add(last, labels, b.step)
            _add(age, labels, now - b.time)
            r = straggler_ratio(b, steady) if b.window >= th.straggler_min_steps else None
            if r is not None:
                _add(ratio, labels, r)
        out += [step, compute, comm, last, age, ratio]
    if "checkpoint" in signals:
        # A count over the rank's run: it only grows (a new run is a new series: its job or rank differ).
        ckpt = _counter("slurm_chaos_probe_checkpoint_failures", "Checkpoint writes that failed in this run")
        for b in fresh:
            _add(ckpt, rank_labels(b, join), b.checkpoint_failures)
        out.append(ckpt)
    if "numa" in signals:
        numa = _gauge("slurm_chaos_probe_numa_mismatch", "1 if the rank's GPU is on a remote NUMA node")
        for b in fresh:
            _add(numa, rank_labels(b, join), 1.0 if b.numa_mismatch else 0.0)
        out.append(numa)
    return out


@dataclass(frozen=True)
class NodeState:
    """One node's last health-check run, as its state file says."""

    node: str
    time: float
    results: tuple[tuple[str, int], ...]


def parse_state(text: str, stem: str) -> NodeState | str:
    """A state file's text, or why it is not one; its node must be the file's own name."""
    try:
        data = json.loads(text)
        node, when = str(data["node"]), float(data["time"])
        results = tuple((str(r["check"]), int(r.get("status", OK))) for r in data.get("results", []))
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError):
        return "malformed"
    if node != stem or not math.isfinite(when):
        return f"says node {node!r} at {when}"
    return NodeState(node, when, results)


def read_states(state_dir: Path) -> tuple[list[NodeState], list[str]]:
    """Every node's state file the health check wrote (its directory's owner's), and what was skipped."""
    try:
        dir_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return [], []
    states: list[NodeState] = []
    rejected: list[str] = []
    try:
        top = os.fstat(dir_fd)
        if top.st_mode & 0o022:
            return [], [f"{state_dir}: writable by others: no state trusted"]
        for name in sorted(os.listdir(dir_fd)):
            m = re.fullmatch(r"([^.].*)\.json", name)
            if not m:
                continue
            found = _read_state(dir_fd, name, m.group(1), top.st_uid)
            if isinstance(found, NodeState):
                states.append(found)
            else:
                rejected.append(f"{name}: {found}")
    finally:
        os.close(dir_fd)
    return states, rejected


def _read_state(dir_fd: int, name: str, stem: str, owner: int) -> NodeState | str:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_size > 1 << 20:
            return "not a regular file of the state directory's owner"
        text = os.read(fd, st.st_size + 1).decode(errors="replace")
    finally:
        os.close(fd)
    return parse_state(text, stem)


def health_metrics(
    states: list[NodeState], signals: frozenset[str], now: float, join: JoinLabels = JoinLabels()
) -> list[Metric]:
    """Per node and check: the health check's last result (1 ok / 0 failed) and its Nagios status."""
    ok = _gauge("slurm_chaos_health_check_ok", "1 if the check passed (OK or WARNING) on its last run")
    status = _gauge("slurm_chaos_health_check_status", "Nagios status: 0 OK 1 WARNING 2 CRITICAL")
    age = _gauge("slurm_chaos_health_check_age_seconds", "Seconds since the node's last health check")
    for state in states:
        # A time ahead of now is clamped: it must not keep a result fresh for ever.
        when = min(state.time, now)
        if now - when > HEALTH_STALE_S:
            continue
        node = {"node": state.node, join.node: state.node}
        _add(age, node, now - when)
        for check, code in state.results:
            if check in signals:
                _add(ok, node | {"check": check}, 0.0 if code == CRITICAL else 1.0)
                _add(status, node | {"check": check}, code if code in (OK, WARNING, CRITICAL) else 3)
    return [ok, status, age]


#: The kinds of input file the exporter reads (the ``kind`` label of its rejected-file counter).
REJECTED_KINDS = ("heartbeat", "health")


def rejected_metric(totals: dict[str, int]) -> CounterMetricFamily:
    """Files skipped as malformed or not trusted, summed over every read since the exporter started:
    a file rejected on each scrape adds one each time, so its rate shows it is still there."""
    counter = _counter(
        "slurm_chaos_exporter_rejected_files",
        "Input files skipped as malformed or not trusted, over every read since the exporter started",
    )
    for kind in REJECTED_KINDS:
        _add(counter, {"kind": kind}, totals.get(kind, 0))
    return counter


class ChaosCollector(Collector):
    """Reads the files afresh on each scrape: what is exported is what the node shows now (only the
    rejected-file counter carries over from one read to the next)."""

    def __init__(self, sources: Sources, clock: Any = time.time, join: JoinLabels = JoinLabels()) -> None:
        self.sources = sources
        self.clock = clock
        self.join = join
        self._rejected = dict.fromkeys(REJECTED_KINDS, 0)
        # The HTTP server collects in a thread per scrape: the counter must not lose an increment.
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        opts = self.sources.options()
        enabled = _gauge("slurm_chaos_signal_enabled", "1 if this monitoring set-up watches the signal")
        for name in SIGNALS:
            _add(enabled, {"signal": name}, 1.0 if name in opts.signals else 0.0)
        yield enabled
        scan = scan_heartbeats(self.sources.heartbeats)
        yield from probe_metrics(list(scan.beats), opts.signals, opts.thresholds, now, self.join)
        states, bad_states = read_states(self.sources.state_dir)
        yield from health_metrics(states, opts.signals, now, self.join)
        for line in (*scan.rejected, *bad_states):
            log.debug("skipped %s", line)
        with self._lock:
            self._rejected["heartbeat"] += len(scan.rejected)
            self._rejected["health"] += len(bad_states)
            totals = dict(self._rejected)
        yield rejected_metric(totals)


#: node_exporter's textfile collector reads only files of this suffix.
TEXTFILE_SUFFIX = ".prom"


def write_textfile(registry: CollectorRegistry, path: Path) -> None:
    """One read of the registry, in Prometheus' text format, to `path` as node_exporter's textfile
    collector reads it: a temporary file in the same directory (no ``.prom`` suffix, so the collector
    skips it), fsynced, mode 0644, renamed over `path`: a reader sees the old file or the new one."""
    text = generate_latest(registry)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), 0o644)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def serve_textfile(
    registry: CollectorRegistry, path: Path, interval: float, wait: Callable[[float], bool]
) -> None:
    """Rewrite `path` every `interval` s until `wait(interval)` says stop (True). The first write's
    failure is raised (the path is wrong); a later one is logged and the next write tries again."""
    write_textfile(registry, path)
    while not wait(interval):
        try:
            write_textfile(registry, path)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc.strerror or exc)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurm_chaos.observe.exporter", description=__doc__.splitlines()[0]
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--port", type=int, help="port to serve /metrics on")
    out.add_argument(
        "--textfile",
        type=Path,
        help=f"write the metrics to this {TEXTFILE_SUFFIX} file instead (node_exporter's textfile collector)",
    )
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--interval",
        type=_positive_seconds,
        default=15.0,
        help="--textfile: seconds between writes (default: %(default)s)",
    )
    p.add_argument("--once", action="store_true", help="--textfile: write once and exit")
    p.add_argument("--heartbeat-dir", type=Path, required=True, help="probe heartbeat directory")
    p.add_argument("--state-dir", type=Path, help="health-check results (default: <heartbeat-dir>/../health)")
    p.add_argument("--config", type=Path, help="the health check's TOML config: enabled signals, thresholds")
    p.add_argument(
        "--node-label",
        default=JoinLabels.node,
        help="label naming the node beside 'host'/'node', to join the site's series (default: %(default)s)",
    )
    p.add_argument(
        "--gpu-label",
        default=JoinLabels.gpu,
        help="label naming a rank's GPU (NVML index), where its heartbeat says (default: %(default)s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        join = JoinLabels(args.node_label, args.gpu_label)
    except ValueError as exc:
        parser.error(str(exc))
    if args.textfile is not None and args.textfile.suffix != TEXTFILE_SUFFIX:
        parser.error(f"--textfile {args.textfile}: node_exporter reads only *{TEXTFILE_SUFFIX} files")
    if args.once and args.textfile is None:
        parser.error("--once: only with --textfile")
    # One registry, one collector: the HTTP and the textfile mode cannot export different things.
    registry = CollectorRegistry()
    registry.register(ChaosCollector(Sources(args.heartbeat_dir, args.state_dir, args.config), join=join))
    if args.textfile is not None:
        return _textfile_main(registry, args.textfile, args.interval, args.once)
    try:
        start_http_server(args.port, addr=args.address, registry=registry)
    except OSError as exc:
        print(f"exporter: cannot listen on {args.address}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"exporter: serving {args.heartbeat_dir} on http://{args.address}:{args.port}/metrics", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


def _textfile_main(registry: CollectorRegistry, path: Path, interval: float, once: bool) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve_textfile(registry, path, interval, lambda s: once or stop.wait(s))
    except OSError as exc:
        print(f"exporter: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
