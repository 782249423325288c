"""The campaign's cost as the cluster grows: 4, 16 and 64 sandbox nodes side by side.

For each size, as root, on a sandbox of its own (`--name`, default `scale`; taken down between
sizes and at the end):

- `sandbox up` wall time, with its leaf switches (4 and 16 nodes: two and four leaves; 64: four);
- Slurm commands per watcher tick while a job runs on min(N, 16) nodes, counted at the Runner
  (each squeue/scontrol/sinfo the watcher starts), not timed;
- `site init` from the live sandbox, its TODOs filled from site_configs/sandbox.yaml;
- campaign overhead of one experiment (control-aa): wall time beyond the probe's own steps;
- `cleanup --site` across every node;
- at 64 nodes: a 16-rank probe job (allreduce mode) confined to one leaf (`--switches=1`), the
  loss of that leaf (every node's link cut, as the campaign's rack-loss does), and the requeued job
  rescheduled within another leaf.

    sudo python bench/bench_scale.py [--sizes 4,16,64] [--name scale] [--json FILE]

Prints one table, the sizes as columns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from slurm_chaos.campaign.controller import SandboxNodeControl
from slurm_chaos.campaign.observe import Watcher
from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.probe.reader import read_run
from slurm_chaos.runner import Completed, SubprocessRunner
from slurm_chaos.sandbox.cluster import Sandbox
from slurm_chaos.sandbox.layout import site_placeholders
from slurm_chaos.site import load_site, todo_entries
from slurm_chaos.slurm.cli_backend import SlurmCLI

REPO = Path(__file__).resolve().parents[1]
SHIPPED_SITE = REPO / "site_configs" / "sandbox.yaml"
LEAVES = {4: 2, 16: 4, 64: 4}
SLURM = frozenset({"sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel", "sacct", "sacctmgr"})


class CountingRunner:
    """A Runner that counts the Slurm commands it starts."""

    def __init__(self) -> None:
        self.inner = SubprocessRunner()
        self.counts: Counter[str] = Counter()

    def __call__(self, argv: Sequence[str], **kw: Any) -> Completed:
        if argv and Path(argv[0]).name in SLURM:
            self.counts[Path(argv[0]).name] += 1
        return self.inner(argv, **kw)


def cli(*args: str, env: Mapping[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "slurm_chaos", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode not in (0, 1):
        raise SystemExit(f"slurm-chaos {' '.join(args)}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return res


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn(*args, **kw)
    return time.monotonic() - t0, out


def fill_site(initialised: Path, out: Path, sandbox: str) -> Path:
    """`site init`'s draft with every TODO answered as the shipped sandbox config answers it
    (the shipped config's placeholders filled from sandbox `sandbox`, the one being measured)."""
    reference = load_site(SHIPPED_SITE, lambda _name: site_placeholders(sandbox))
    mon = reference.monitoring
    answers: dict[str, Any] = {
        "slurm.hooks_dir": reference.slurm.hooks_dir,
        "nodes.interface": reference.nodes.interface,
        "probe.python": reference.probe.python,
        "probe.model_size": reference.probe.model_size,
        "checkpoint.path": reference.checkpoint.path,
        "monitoring.prometheus": mon.prometheus,
        "monitoring.alertmanager": mon.alertmanager,
        "monitoring.heartbeat_dir": mon.heartbeat_dir,
        "monitoring.healthcheck_signals": list(mon.healthcheck_signals),
        "safety.allowed_users": list(reference.safety.allowed_users),
    }
    data = yaml.safe_load(initialised.read_text())
    for key, _ in todo_entries(data):
        *parents, last = key.split(".")
        section = data
        for name in parents:
            section = section[int(name) if isinstance(section, list) else name]
        section[last] = answers[key]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def queries_per_tick(env: Mapping[str, str], nodes: int) -> float:
    """Slurm commands per watcher tick while a job runs on `nodes` nodes."""
    runner = CountingRunner()
    slurm = SlurmCLI(env, runner)
    job = slurm.submit_wrap("sleep 20", ["-N", str(nodes), "--exclusive", "-t", "5", "-o", "/dev/null"])
    watcher = Watcher(slurm, job, None)
    while (info := slurm.poll([job]).get(job)) is None or info.state.value != "RUNNING":
        time.sleep(0.5)
    runner.counts.clear()
    ticks = 0
    for _ in range(10):
        watcher.tick()
        ticks += 1
        time.sleep(0.5)
    slurm.cancel([job])
    return sum(runner.counts.values()) / ticks


def probe_span(directory: Path) -> float:
    run = read_run(directory)
    starts = [float(r.t_start[0]) for r in run.ranks if len(r.t_start)]
    ends = [float(r.t_start[-1] + r.step_time[-1]) for r in run.ranks if len(r.t_start)]
    return max(ends) - min(starts)


def leaf_loss(env: Mapping[str, str], layout: Any, work: Path) -> dict[str, Any]:
    """A 16-rank allreduce probe job in one leaf; the leaf is lost; the requeue lands in another."""
    slurm = SlurmCLI(env, SubprocessRunner())
    out = work / "leaf-loss"
    out.mkdir()
    probe = f"{sys.executable} -m slurm_chaos.probe --mode allreduce --steps 400 --out {out}"
    job = slurm.submit_wrap(
        f"srun {probe}",
        [
            "-N",
            "16",
            "--ntasks-per-node=1",
            "--switches=1",
            "--requeue",
            "-t",
            "10",
            "-o",
            str(out / "slurm-%j.out"),
        ],
    )
    leaves = layout.switches()

    def leaf_of(nodelist: Sequence[str]) -> set[str]:
        return {sw for sw, members in leaves.items() if set(members) & set(nodelist)}

    t0 = time.monotonic()
    while not ((info := slurm.poll([job]).get(job)) and info.state.value == "RUNNING" and info.nodes):
        time.sleep(0.5)
    first = leaf_of(info.nodes)
    started = time.monotonic() - t0
    time.sleep(5)  # the ranks are training
    (lost,) = first
    # The leaf is lost as the campaign's rack-loss loses it: every node's link cut at once, so
    # that Slurm finds them not responding and requeues the job. (`scontrol update State=DOWN`
    # node by node was no loss: ReturnToService=2 took each node back at once, the requeued job
    # was launched into the leaf while its last nodes went down, and Slurm held it: "launch
    # failed requeued held", never to run again.)
    control = SandboxNodeControl(env["SLURM_CHAOS_SANDBOX"], SubprocessRunner(), slurm)
    for node in leaves[lost]:
        control.lose(node)
    t_lost = time.monotonic()
    again = None
    # Every change of what the controller says of the job, so that a run that never reschedules
    # says where it stopped (requeued or not, held, waiting on BeginTime or on nodes).
    trace: list[str] = []
    seen = None
    while time.monotonic() - t_lost < 300:
        info = slurm.poll([job]).get(job)
        now = (
            None
            if info is None
            else (info.state.value, info.reason, info.restarts, ",".join(sorted(leaf_of(info.nodes))))
        )
        if now != seen:
            trace.append(f"{time.monotonic() - t_lost:6.1f}s {now}")
            seen = now
        if info and info.state.value == "RUNNING" and info.nodes and info.restarts > 0:
            again = leaf_of(info.nodes)
            break
        time.sleep(0.5)
    rescheduled = time.monotonic() - t_lost
    if again is None:
        for argv in (
            ["scontrol", "show", "job", job],
            ["sacct", "-j", job, "-D", "-X", "-o", "JobID,State,Reason%30,NodeList%40,Start,End"],
        ):
            done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, check=False)
            trace.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    slurm.cancel([job])
    for node in leaves[lost]:
        try:
            control.restore(node)  # the link up, and the node resumed if Slurm did not take it back
        except (ChaosError, SlurmError) as exc:
            print(f"bench_scale: restore {node}: {exc}", file=sys.stderr)
    return {
        "first_leaf": lost,
        "started_s": started,
        "rescheduled_on": sorted(again) if again else None,
        "rescheduled_within_one_other_leaf": again is not None and len(again) == 1 and lost not in again,
        "reschedule_s": rescheduled,
        "trace": trace,
    }


def one_size(name: str, nodes: int, work: Path) -> dict[str, Any]:
    leaves = LEAVES.get(nodes, max(1, nodes // 16))
    env = {**os.environ, "SLURM_CHAOS_SANDBOX": name}
    row: dict[str, Any] = {"nodes": nodes, "leaves": leaves}
    row["sandbox_up_s"], _ = timed(
        cli,
        "sandbox",
        "up",
        "--name",
        name,
        "--nodes",
        str(nodes),
        "--switches",
        str(leaves),
        "--no-install",
        env=env,
    )
    sb = Sandbox(name)
    layout = sb.layout()
    env = {**env, **layout.env()}
    site_dir = work / f"site-{nodes}"
    site_dir.mkdir()
    cli("site", "init", "--out", str(site_dir / "init.yaml"), env=env)
    site = fill_site(site_dir / "init.yaml", site_dir / "site.yaml", name)
    cli("plugin", "install", "--site", str(site), "--prefix", str(layout.root / "prefix"), env=env)
    row["queries_per_tick"] = queries_per_tick(env, min(nodes, 16))
    out = work / f"run-{nodes}"
    row["experiment_s"], _ = timed(
        cli, "run", "--site", str(site), "control-aa", "--out", str(out), "-q", env=env
    )
    # Each probe run once: an experiment's baseline is a link to its shape's run.
    runs = {p.parent.resolve() for p in out.glob("**/rank-0.h5")}
    row["probe_s"] = sum(probe_span(d) for d in runs)
    row["overhead_s"] = row["experiment_s"] - row["probe_s"]
    row["cleanup_s"], _ = timed(cli, "cleanup", "--site", str(site), env=env)
    if nodes >= 64:
        row["leaf_loss"] = leaf_loss(env, layout, work)
    row["sandbox_down_s"], _ = timed(cli, "sandbox", "down", "--name", name, env=env)
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    row["namespaces_left"] = sum(f"slurm-chaos-{name}-" in line for line in leftovers.splitlines())
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--name", default="scale")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_scale: needs root (it brings up sandboxes)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            try:
                rows.append(one_size(args.name, n, Path(tmp)))
            finally:
                cli("sandbox", "down", "--name", args.name, env=os.environ)
            print(json.dumps(rows[-1]), file=sys.stderr)
    fields = [
        ("leaf switches", "leaves", "{:d}"),
        ("sandbox up (s)", "sandbox_up_s", "{:.1f}"),
        ("Slurm commands per watcher tick", "queries_per_tick", "{:.2f}"),
        ("control-aa wall (s)", "experiment_s", "{:.1f}"),
        ("  of which probe steps (s)", "probe_s", "{:.1f}"),
        ("  campaign overhead (s)", "overhead_s", "{:.1f}"),
        ("cleanup --site (s)", "cleanup_s", "{:.1f}"),
        ("sandbox down (s)", "sandbox_down_s", "{:.1f}"),
        ("namespaces left after down", "namespaces_left", "{:d}"),
    ]
    print(f"{'nodes':34}" + "".join(f"{r['nodes']:>10}" for r in rows))
    for label, key, fmt in fields:
        print(f"{label:34}" + "".join(f"{fmt.format(r[key]):>10}" for r in rows))
    for r in rows:
        if "leaf_loss" in r:
            loss = dict(r["leaf_loss"])
            trace = loss.pop("trace")
            print(f"leaf loss at {r['nodes']} nodes: {json.dumps(loss)}")
            print("  the job after the loss (time, (state, reason, restarts, leaves)):")
            print("\n".join(f"  {line}" for line in trace))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
