"""Per-site deadlines: `monitoring.deadlines.<kind>` overrides an experiment's for a kind it names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_chaos import rundir
from slurm_chaos.campaign import controller
from slurm_chaos.campaign.engine import open_campaign, run_experiment
from slurm_chaos.campaign.progress import Progress
from slurm_chaos.clock import FakeClock
from slurm_chaos.errors import ConfigError
from slurm_chaos.experiment import Expect, load_experiment, with_site_deadlines
from slurm_chaos.render import render_job
from slurm_chaos.rundir import Role
from slurm_chaos.site import Deadline, Site, load_site, signal_kinds
from slurm_chaos.slurm.fake import FakeScheduler, Submission, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "sites" / "golden.yaml"


def _site(tmp_path: Path, deadlines: object) -> Path:
    data = yaml.safe_load(GOLDEN.read_text())
    data.setdefault("monitoring", {})["deadlines"] = deadlines
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_site_declares_deadlines_per_signal_kind(tmp_path: Path) -> None:
    site = load_site(
        _site(tmp_path, {"gpu_xid": {"detect_within_s": 600}, "numa": {"remediate_within_s": 30}})
    )
    assert site.monitoring.deadlines == {"gpu_xid": Deadline(600, None), "numa": Deadline(None, 30)}
    assert load_site(GOLDEN).monitoring.deadlines == {}


@pytest.mark.parametrize(
    ("deadlines", "key", "words"),
    [
        (
            {"gpu_xyd": {"detect_within_s": 600}},
            "monitoring.deadlines.gpu_xyd",
            f"expected one of {', '.join(signal_kinds())}, got 'gpu_xyd'",  # enums.parse_enum's words
        ),
        ({"gpu_xid": {"detect_within": 600}}, "monitoring.deadlines.gpu_xid.detect_within", "unknown key"),
        ({"gpu_xid": {"detect_within_s": "10m"}}, "monitoring.deadlines.gpu_xid.detect_within_s", "expected"),
        ({"gpu_xid": {"detect_within_s": 0}}, "monitoring.deadlines.gpu_xid.detect_within_s", "0"),
        ({"gpu_xid": {}}, "monitoring.deadlines.gpu_xid", "non-empty"),
    ],
)
def test_a_bad_deadline_names_the_file_and_key(
    tmp_path: Path, deadlines: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_site(_site(tmp_path, deadlines))
    assert exc.value.key == key
    assert words in exc.value.problem
    assert str(tmp_path / "site.yaml") in str(exc.value)
    assert exc.value.exit_code == 2


def test_the_override_applies_to_a_kind_the_experiment_names() -> None:
    exp = load_experiment("gpu-xid")  # signal:gpu_xid, detect 60 s, remediate 120 s
    assert (exp.expect.detect_within_s, exp.expect.remediate_within_s) == (60, 120)
    site = with_site_deadlines(exp, {"gpu_xid": Deadline(600, 900)})
    assert (site.expect.detect_within_s, site.expect.remediate_within_s) == (600, 900)
    assert site.hold_limit_s == 900 + 30  # the held fault job outlasts the site's deadline
    only_detect = with_site_deadlines(exp, {"gpu_xid": Deadline(detect_within_s=600)})
    assert (only_detect.expect.detect_within_s, only_detect.expect.remediate_within_s) == (600, 120)


def test_no_override_leaves_the_experiment_as_it_is() -> None:
    exp = load_experiment("gpu-xid")
    assert with_site_deadlines(exp, {}) is exp
    # A kind the experiment does not name (checkpoint) changes nothing.
    assert with_site_deadlines(exp, {"checkpoint": Deadline(600, 900)}) is exp
    # Today's entries (healthcheck_drain, alert_firing:...) are not signal kinds.
    plain = replace(exp, expect=Expect(detect=("healthcheck_drain",), detect_within_s=60))
    assert with_site_deadlines(plain, {"gpu_xid": Deadline(600)}) is plain


def test_several_named_kinds_the_longest_override_holds() -> None:
    exp = load_experiment("gpu-xid")
    two = replace(exp, expect=replace(exp.expect, detect=("signal:gpu_xid", "signal:node_health")))
    got = with_site_deadlines(two, {"gpu_xid": Deadline(300), "node_health": Deadline(600)})
    assert got.expect.detect_within_s == 600


def _completes(sub: Submission) -> list[JobInfo]:
    running = JobInfo("", "job", JobState.RUNNING, nodes=("n01", "n02"))
    return [running] * 5 + [JobInfo("", "job", JobState.COMPLETED, nodes=("n01", "n02"))]


def test_the_campaign_holds_and_judges_by_the_sites_deadline(tmp_path: Path) -> None:
    """observations.json (what the verdict reads) and the rendered hold carry the effective deadline."""
    site: Site = load_site(_site(tmp_path, {"gpu_xid": {"detect_within_s": 600}}))
    nodes = {f"n{i:02d}": replace(info, name=f"n{i:02d}") for i, info in enumerate(idle_nodes(9).values())}
    fake = FakeScheduler(node_table=nodes, lifecycle=_completes)
    camp = open_campaign(
        site,
        [load_experiment("gpu-xid")],
        tmp_path / "run",
        resume=False,
        scheduler=fake,
        control=controller.SlurmNodeControl(fake),
        kind="campaign",
        progress=Progress(quiet=True),
        clock=FakeClock(),
    )
    camp.probe_step = lambda job_dir: 200
    run_experiment(camp, camp.experiments[0])
    exp_dir = rundir.experiment_dir(camp.run_dir, "gpu-xid")
    log = rundir.load_observations(exp_dir / rundir.OBSERVATIONS)
    assert log.expectation.detect_within_s == 600
    assert log.expectation.remediate_within_s == 120  # not overridden
    assert "--hold-max-s 630" in (exp_dir / "fault.sbatch").read_text()
    # `slurm-chaos render` (a dry run) renders the same hold.
    text = render_job(site, load_experiment("gpu-xid"), Role.FAULT, tmp_path / "f", "dry-run")
    assert "--hold-max-s 630" in text


def test_the_dry_run_plan_shows_the_effective_deadline(tmp_path: Path) -> None:
    from slurm_chaos.campaign.commands import plan_json

    site = load_site(_site(tmp_path, {"gpu_xid": {"detect_within_s": 600}}))
    (entry,) = plan_json(site, [load_experiment("gpu-xid")])["experiments"]
    assert entry["expect"]["detect_within_s"] == 600
