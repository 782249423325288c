"""Remediation checks the engine makes itself.

Where a requeued job went, and whether placement avoids a slow node.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from slurm_chaos.analysis.model import Observation
from slurm_chaos.campaign import controller
from slurm_chaos.errors import ChaosError
from slurm_chaos.placement import apply_settings, current_setting, proposals, rank_nodes, read_weights
from slurm_chaos.site import Site

if TYPE_CHECKING:
    from pathlib import Path

    from slurm_chaos.campaign.engine import Campaign
    from slurm_chaos.experiment import Experiment

log = logging.getLogger(__name__)


def rescheduled_same_switch(
    observations: list[Observation], lost: set[str], site: Site
) -> Observation | None:
    """The job's new allocation after a requeue lies under one switch and avoids every lost node."""
    for o in observations:
        if o.signal != "job_rescheduled":
            continue
        nodes = [n for n in o.detail.split(",") if n]
        switches = {site.switch_of(n) for n in nodes}
        if nodes and len(switches) == 1 and not set(nodes) & lost:
            return Observation("rescheduled_same_switch", o.time, f"{','.join(nodes)} under {switches.pop()}")
    return None


def avoid_slow_node(camp: Campaign, exp: Experiment, fault_dir: Path) -> list[Observation]:
    """Rank the fault job's nodes, mark the slow one, and check that a job asking for fast nodes avoids it.

    Settings are journalled before they change and restored by the campaign's rollback.
    """
    ranking = rank_nodes([fault_dir])
    slow = {r.node for r in ranking if r.slow}
    if not slow:
        return []
    found = [Observation("slow_node_identified", time.time(), ", ".join(sorted(slow)))]
    env = camp.site.slurm_env()
    nodes = list(camp.site.partition_nodes)
    current = camp.scheduler.nodes(nodes)
    weights = read_weights(camp.runner, env, nodes)
    for r in ranking:
        old = current_setting(current[r.node], weights.get(r.node, 1))
        camp.journal.record(
            controller.Action(
                time.time(),
                exp.name,
                "setting",
                r.node,
                data={"weight": old.weight, "features": list(old.features)},
            )
        )
    apply_settings(camp.runner, env, proposals(ranking, current))
    argv = [
        "sbatch",
        "--parsable",
        f"--nodes={exp.nodes}",
        "--constraint=fast",
        "--exclusive",
        f"--partition={camp.site.slurm.partition}",
        "--output=/dev/null",
        "--time=00:02:00",
    ]
    if camp.site.slurm.reservation:
        argv.append(f"--reservation={camp.site.slurm.reservation}")
    if camp.site.slurm.account:
        argv.append(f"--account={camp.site.slurm.account}")
    res = camp.runner([*argv, "--wrap", "srun hostname"], timeout=30, env=env)
    if not res.ok:
        raise ChaosError(f"placement check job was refused: {res.stderr.strip()}")
    job_id = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = camp.scheduler.poll([job_id]).get(job_id)
        if info is not None and info.nodes and (info.state.is_terminal or info.state.value == "RUNNING"):
            if not set(info.nodes) & slow:
                found.append(
                    Observation("avoided_slow_node", time.time(), f"job {job_id} got {','.join(info.nodes)}")
                )
            else:
                log.warning("job %s asked for fast nodes and got %s", job_id, ",".join(info.nodes))
            break
        time.sleep(0.5)
    camp.scheduler.cancel([job_id])
    return found
