"""Closed sets of words are enums: each refuses a word outside it naming the words it takes, and
the files that hold one read back as the same members, written as the same words."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import pytest

from slurm_chaos.analysis.model import StragglerKind
from slurm_chaos.campaign.controller import Action, ActionKind, ControllerJournal
from slurm_chaos.enums import allowed, parse_enum
from slurm_chaos.errors import ChaosError, ConfigError
from slurm_chaos.experiment import Mode, Remediation, Strategy, load_experiment_file
from slurm_chaos.probe.schema import ProbeMode
from slurm_chaos.rundir import Role, RunKind

ENUMS: list[type[StrEnum]] = [
    Strategy,
    Mode,
    Remediation,
    ProbeMode,
    StragglerKind,
    ActionKind,
    RunKind,
    Role,
]


@pytest.mark.parametrize("kind", ENUMS, ids=lambda k: k.__name__)
def test_each_word_reads_as_its_member_and_another_is_refused_naming_the_words(kind: type[StrEnum]) -> None:
    for member in kind:
        assert parse_enum(kind, member.value) is member
    words = [m.value for m in kind]
    assert allowed(kind) == ", ".join(words)
    for bad in ("no-such-word", words[0].upper(), None, 1):
        with pytest.raises(ValueError) as exc:
            parse_enum(kind, bad)
        assert str(exc.value) == f"expected one of {', '.join(words)}, got {bad!r}"


def test_the_controller_journal_writes_the_kind_as_its_word_and_reads_back_the_member(tmp_path: Path) -> None:
    journal = ControllerJournal(tmp_path / "controller-journal.jsonl")
    actions = [
        Action(1.0, "node-drain", ActionKind.DRAIN, "n01"),
        Action(2.0, "rack-loss", ActionKind.LOSE, "n02"),
        Action(3.0, "known-slow-node", ActionKind.SETTING, "n03", data={"weight": 1, "features": ["a"]}),
    ]
    for a in actions:
        journal.record(a)
    lines = [json.loads(line) for line in journal.path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["drain", "lose", "setting"]
    assert journal.pending() == actions
    assert [a.kind for a in journal.actions("rack-loss", ActionKind.LOSE)] == [ActionKind.LOSE]
    assert journal.actions("rack-loss", ActionKind.DRAIN) == []


def test_a_journal_line_of_an_unknown_kind_names_the_file_the_line_and_the_kinds(tmp_path: Path) -> None:
    path = tmp_path / "controller-journal.jsonl"
    good = {"time": 1.0, "experiment": "x", "kind": "drain", "node": "n01", "undone": False, "data": {}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "kind": "reboot"}) + "\n")
    with pytest.raises(ChaosError) as exc:
        ControllerJournal(path).pending()
    assert str(exc.value) == (
        f"{path}: line 2: not a journal entry (expected one of drain, lose, setting, got 'reboot')"
    )


EXPERIMENT = "name: x\nstrategy: numa\ndescription: d\nfault: {spec: numa-mismatch}\nexpect: {}\n"


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"strategy": "quantum"}, "strategy", Strategy),
        ({"mode": "inference"}, "mode", Mode),
        ({"expect": "{remediation: [reboot]}"}, "expect.remediation.0", Remediation),
    ],
)
def test_an_experiment_word_outside_its_enum_names_the_file_the_key_and_the_words(
    tmp_path: Path, change: dict[str, str], key: str, words: type[StrEnum]
) -> None:
    p = tmp_path / "x.yaml"
    lines = dict(line.split(": ", 1) for line in EXPERIMENT.splitlines())
    p.write_text("".join(f"{k}: {v}\n" for k, v in {**lines, **change}.items()))
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert (exc.value.path, exc.value.key) == (str(p), key)
    assert exc.value.problem.startswith(f"expected one of {allowed(words)}, got '")  # parse_enum's words
    good = tmp_path / "good.yaml"
    good.write_text(EXPERIMENT)
    exp = load_experiment_file(good)
    assert exp.strategy is Strategy.NUMA and exp.mode is Mode.TRAIN


def test_observation_signals_read_back_as_the_words_they_were_written_with(tmp_path: Path) -> None:
    from slurm_chaos.rundir import (
        Expectation,
        FaultWindow,
        Observation,
        ObservationLog,
        Signal,
        alert_signal,
        detector_signal,
        load_observations,
        write_observations,
    )

    written = ObservationLog(
        fault_window=FaultWindow(start=1.0, end=None),
        observations=(
            Observation(Signal.JOB_REQUEUED, 2.0, "job 7 requeued (1)"),
            Observation(alert_signal("ChaosStraggler"), 3.0, "{}"),
            Observation(detector_signal("nhc"), 4.0, "node2: NHC: full", "nhc", ("checkpoint",)),
        ),
        expectation=Expectation(),
    )
    path = tmp_path / "observations.json"
    write_observations(path, written)
    raw = [o["signal"] for o in json.loads(path.read_text())["observations"]]
    assert raw == ["job_requeued", "alert_firing:ChaosStraggler", "detector:nhc"]
    assert [o.signal for o in load_observations(path).observations] == raw
    assert load_observations(path).observations[0].signal == Signal.JOB_REQUEUED
