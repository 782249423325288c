"""What the watcher asks Slurm each tick does not grow with the job's node count (counted, not timed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from slurm_chaos.campaign.observe import Watcher
from slurm_chaos.clock import FakeClock
from slurm_chaos.slurm.fake import FakeScheduler, Submission, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

TICKS = 20


def queries_per_tick(nodes: int, drain_at: int) -> Counter[str]:
    names = tuple(f"node{i}" for i in range(nodes))

    def lifecycle(sub: Submission) -> list[JobInfo]:
        return [JobInfo("", "probe", JobState.RUNNING, nodes=names)] * (TICKS + 1)

    fake = FakeScheduler(node_table=idle_nodes(nodes), lifecycle=lifecycle)
    job = fake.submit(Path("probe.sbatch"))
    alerts: list[dict[str, object]] = []
    fetched: list[str] = []

    def fetch(url: str) -> list[dict[str, object]]:
        fetched.append(url)
        return alerts

    watcher = Watcher(fake, job, "http://alertmanager.invalid", FakeClock(), alerts=fetch)
    before = fake.queries.copy()
    for tick in range(TICKS):
        if tick == drain_at:  # a fault mid-job: half the nodes drained, one alert per node
            for name in names[: nodes // 2]:
                fake.drain(name, "slurm-chaos-health: straggler")
                alerts.append({"labels": {"alertname": "ChaosStraggler", "node": name}, "startsAt": ""})
        watcher.tick()
    spent = fake.queries - before
    spent["alertmanager"] = len(fetched)
    assert all(count % TICKS == 0 for count in spent.values()), spent
    return Counter({kind: count // TICKS for kind, count in spent.items()})


@pytest.mark.parametrize("drain_at", [TICKS, TICKS // 2])
def test_queries_per_tick_are_the_same_at_4_and_64_nodes(drain_at: int) -> None:
    small, large = queries_per_tick(4, drain_at), queries_per_tick(64, drain_at)
    assert small == large
    assert small["poll"] == 1 and small["nodes"] <= 1 and small["alertmanager"] == 1
    assert sum(small.values()) <= 3
