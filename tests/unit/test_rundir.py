"""The run directory's files: one reader and writer each, older forms still read, errors name the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_chaos import rundir
from slurm_chaos.errors import DataError
from slurm_chaos.slurm.model import JobState

DATA = Path(__file__).resolve().parent.parent / "data" / "rundir"


def test_a_manifest_the_campaign_wrote_before_loads(tmp_path: Path) -> None:
    m = rundir.read_manifest(DATA / "campaign-0.x")
    assert (m.run_id, m.kind, m.started, m.finished) == (
        "20261130-120000-campaign",
        "campaign",
        1764504000.25,
        1764504300.5,
    )
    assert m.interrupted and m.completed == ["control-aa"] and m.min_effect == 0.05
    assert m.switches == {}  # written before the manifest kept the switches
    running = m.job("node-drain-requeue", "fault")
    assert running is not None and running.state is JobState.RUNNING and running.ended is None
    assert running.nodes == ("node3", "node4") and running.restarts == 1
    # Written back in today's form, it reads back the same.
    rundir.write_manifest(tmp_path, m)
    assert rundir.read_manifest(tmp_path) == m


def test_a_manifest_in_the_analysis_form_loads() -> None:
    m = rundir.read_manifest(DATA / "analysis-0.x")
    assert m.experiments == ["gpu-throttle", "control-aa"]
    assert m.started == 1767225600.0  # 2026-01-01T00:00:00Z
    assert m.min_effect is None and m.jobs == [] and m.cluster == ""
    assert m.switches == {}


def test_a_manifest_keeps_which_switch_each_node_hangs_off(tmp_path: Path) -> None:
    m = rundir.Manifest(run_id="r", site="s", started=1.0, experiments=[], switches={"n1": "leafA"})
    rundir.write_manifest(tmp_path, m)
    assert rundir.read_manifest(tmp_path).switches == {"n1": "leafA"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"started": "yesterday"}, r"manifest\.json: started: expected Unix seconds or an ISO-8601 time"),
        ({"surprise": 1}, r"manifest\.json: surprise: unknown key"),
        ({"experiments": ["a", "a"]}, r"manifest\.json: experiments: names repeat"),
        ({"min_effect": "big"}, r"manifest\.json: min_effect: expected a fraction"),
        ({"interrupted": "yes"}, r"manifest\.json: interrupted: expected bool"),
        ({"switches": ["leafA"]}, r"manifest\.json: switches: expected an object"),
        ({"switches": {"n1": 3}}, r"manifest\.json: switches: expected an object"),
        ({"jobs": [{"experiment": "x"}]}, r"manifest\.json: jobs\[0\]\.job_id: expected a string"),
        (
            {
                "jobs": [
                    {
                        "experiment": "x",
                        "role": "fault",
                        "job_id": "1",
                        "script": "s",
                        "submitted": 1.0,
                        "pid": 3,
                    }
                ]
            },
            r"manifest\.json: jobs\[0\]\.pid: unknown key",
        ),
    ],
)
def test_a_malformed_manifest_names_the_file_and_key(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    shutil.copytree(DATA / "campaign-0.x", tmp_path / "run")
    path = tmp_path / "run" / rundir.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(DataError, match=message):
        rundir.read_manifest(tmp_path / "run")


def test_a_directory_without_a_manifest_says_so(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"manifest\.json: no such file; is .* a slurm-chaos run directory"):
        rundir.read_manifest(tmp_path)
    with pytest.raises(DataError, match="no such run directory"):
        rundir.read_manifest(tmp_path / "nope")


def test_manifest_bookkeeping() -> None:
    m = rundir.Manifest(run_id="r", site="s", started=1.0, experiments=[], planned=["a", "b", "c"])
    m.put_job(rundir.SubmittedJob("a", "fault", "7", "a.sbatch", 2.0))
    m.put_job(rundir.SubmittedJob("a", "fault", "7", "a.sbatch", 2.0, state=JobState.COMPLETED))
    assert len(m.jobs) == 1 and m.jobs[0].state is JobState.COMPLETED
    m.forget_job("a", "fault")
    assert m.jobs == []
    m.complete("c")
    m.complete("a")
    m.complete("a")
    assert m.completed == ["c", "a"] and m.experiments == ["a", "c"]  # plan order


def test_calibration_round_trip(tmp_path: Path) -> None:
    path = rundir.write_calibration(tmp_path, {"recommended_min_effect": 0.12, "runs": ["a"]})
    assert path.name == rundir.CALIBRATION_FILE
    assert rundir.load_recommended_min_effect(path) == 0.12


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "party"}, r"manifest\.json: kind: expected one of run, campaign, calibration, got 'party'"),
        (
            {"jobs": [{"experiment": "x", "role": "warmup", "job_id": "1", "script": "s", "submitted": 1.0}]},
            r"manifest\.json: jobs\[0\]\.role: expected one of baseline, fault, got 'warmup'",
        ),
    ],
)
def test_enums_in_the_manifest_name_what_they_accept(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    shutil.copytree(DATA / "campaign-0.x", tmp_path / "run")
    path = tmp_path / "run" / rundir.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(DataError, match=message):
        rundir.read_manifest(tmp_path / "run")
    assert rundir.read_manifest(DATA / "campaign-0.x").kind is rundir.RunKind.CAMPAIGN
