"""The probe end to end on this machine: ranks as processes meeting on loopback, no Slurm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.probe.local import run_local, start_ranks, wait_ranks
from slurm_chaos.probe.reader import read_rank, read_run

QUIET = ["--progress-every", "0"]


def _ok(results: list) -> None:  # type: ignore[type-arg]
    assert all(r.returncode == 0 for r in results), "\n".join(r.stderr[-2000:] for r in results)


def _summary(stdout: str) -> dict[str, object]:
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.spawns
def test_two_ranks_write_consistent_files(tmp_path: Path) -> None:
    t0 = time.time()
    results = run_local(2, ["--steps", "20", "--out", str(tmp_path), "--progress-every", "5"])
    wall = time.time() - t0
    _ok(results)
    run = read_run(tmp_path)
    assert run.world_size == 2 and run.matrix("step_time").shape == (2, 20)
    for rk in run.ranks:
        assert rk.step.tolist() == list(range(20))
        assert (
            rk.attrs["backend"] == "gloo"
            and rk.attrs["complete"] is True
            and rk.attrs["exit_reason"] == "done"
        )
        assert 0 < rk.step_time.sum() < wall
        parts = (
            rk.fields["compute_time"] + rk.comm_time + rk.fields["optimizer_time"] + rk.fields["data_time"]
        )
        assert np.all(parts <= rk.step_time) and np.all(parts > 0.8 * rk.step_time)
        assert np.all(rk.comm_time > 0)
        assert np.all(np.diff(rk.t_start) > 0)
    out = results[0].stdout
    assert out.count("probe: step ") == 4
    summary = _summary(out)
    assert summary["steps"] == 20 and summary["world_size"] == 2 and summary["checkpoint_failures"] == 0
    assert results[1].stdout.strip() == ""  # only rank 0 talks


def _wait_for_steps(path: Path, at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            if len(read_rank(path).step) >= at_least:
                return
        except Exception:  # not created or not flushed yet
            continue
    raise AssertionError(f"{path}: fewer than {at_least} steps after {timeout} s")


@pytest.mark.spawns
def test_killed_rank_leaves_readable_file_and_peer_exits_with_reason(tmp_path: Path) -> None:
    procs = start_ranks(2, ["--steps", "100000", "--out", str(tmp_path), "--flush-interval", "0.2", *QUIET])
    path = tmp_path / "rank-1.h5"
    _wait_for_steps(path, 10)
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    results = wait_ranks(procs, timeout=60)
    assert results[1].returncode == -signal.SIGKILL
    assert results[0].returncode == 1
    assert "a collective failed (peer dead or unreachable)" in results[0].stderr
    dead = read_rank(path)
    assert len(dead.step) >= 10 and dead.step.tolist() == list(range(len(dead.step)))
    assert "complete" not in dead.attrs
    assert dead.t_start[-1] <= killed_at
    survivor = read_rank(tmp_path / "rank-0.h5")
    assert survivor.attrs["complete"] is True and str(survivor.attrs["exit_reason"]).startswith(
        "collective failed"
    )
    assert len(survivor.step) >= len(dead.step)


@pytest.mark.spawns
def test_hung_peer_fails_the_rank_after_the_collective_timeout(tmp_path: Path) -> None:
    args = [
        "--steps",
        "100000",
        "--out",
        str(tmp_path),
        "--flush-interval",
        "0.2",
        "--collective-timeout",
        "3",
    ]
    procs = start_ranks(2, [*args, *QUIET])
    _wait_for_steps(tmp_path / "rank-0.h5", 5)
    procs[1].send_signal(signal.SIGSTOP)  # alive but silent: a straggler past all patience
    t0 = time.monotonic()
    try:
        (result,) = wait_ranks(procs[:1], timeout=60)
    finally:
        procs[1].kill()
        procs[1].wait()
    assert result.returncode == 1 and time.monotonic() - t0 < 30
    assert "a collective failed (peer dead or unreachable)" in result.stderr and "Timed out" in result.stderr
    assert read_rank(tmp_path / "rank-0.h5").attrs["complete"] is True


@pytest.mark.spawns
def test_sigterm_closes_the_file(tmp_path: Path) -> None:
    (proc,) = start_ranks(1, ["--steps", "100000", "--out", str(tmp_path), "--flush-interval", "0.2", *QUIET])
    _wait_for_steps(tmp_path / "rank-0.h5", 5)
    proc.send_signal(signal.SIGTERM)
    (result,) = wait_ranks([proc], timeout=60)
    assert result.returncode == 143, result.stderr
    rk = read_rank(tmp_path / "rank-0.h5")
    assert rk.attrs["exit_reason"] == "stopped by signal SIGTERM" and len(rk.step) > 0


@pytest.mark.spawns
def test_resume_records_lost_steps_and_matches_uninterrupted_run(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    common = ["--ckpt-dir", str(ckpt), "--ckpt-every", "10", *QUIET]
    _ok(run_local(2, ["--steps", "25", "--out", str(out), *common]))  # attempt 1 stops after step 24
    second = run_local(2, ["--steps", "40", "--out", str(out), *common])
    _ok(second)
    summary = _summary(second[0].stdout)
    assert (summary["restart_step"], summary["steps_lost"], summary["restarts"]) == (20, 5, 1)
    run = read_run(out)
    for rk in run.ranks:
        assert rk.attrs["restart_step"] == 20 and rk.attrs["steps_lost"] == 5 and rk.attrs["attempt"] == 1
        assert rk.step.tolist() == list(range(25)) + list(range(20, 40))
        (resumed,) = [e for e in rk.events if e.kind == "resumed"]
        assert "steps_lost=5" in resumed.detail and "recovery_time_s=" in resumed.detail
        assert (out / f"rank-{rk.rank}.attempt-0.h5").exists()
    _ok(run_local(2, ["--steps", "40", "--out", str(tmp_path / "straight"), *QUIET]))
    straight = read_run(tmp_path / "straight").ranks[0].attrs["param_checksum"]
    assert run.ranks[0].attrs["param_checksum"] == straight  # the resumed run is the same training


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {res.stderr.strip()}")
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.spawns
def test_failing_checkpoint_storage_does_not_stop_training(tmp_path: Path, readonly_dir: Path) -> None:
    results = run_local(
        2,
        [
            "--steps",
            "25",
            "--out",
            str(tmp_path / "out"),
            "--ckpt-dir",
            str(readonly_dir),
            "--ckpt-every",
            "5",
            *QUIET,
        ],
    )
    _ok(results)
    assert _summary(results[0].stdout)["checkpoint_failures"] == 8  # steps 5, 10, 15, 20 on two ranks
    for rk in read_run(tmp_path / "out").ranks:
        assert len(rk.step) == 25
        failed = [e for e in rk.events if e.kind == "checkpoint_failed"]
        assert len(failed) == 4 and all("EROFS" in e.detail for e in failed)


@pytest.mark.spawns
def test_allreduce_mode_reports_bandwidth(tmp_path: Path) -> None:
    results = run_local(
        2,
        [
            "--mode",
            "allreduce",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--min-bytes",
            "1024",
            "--max-bytes",
            "65536",
            "--out",
            str(tmp_path),
        ],
    )
    _ok(results)
    for rk in read_run(tmp_path).ranks:
        ar = rk.allreduce
        assert ar["size_bytes"].tolist() == [1024 * 2**i for i in range(7)]
        assert np.allclose(ar["algbw"], ar["size_bytes"] / ar["time"] / 1e9)
        assert np.allclose(ar["busbw"], ar["algbw"])  # 2(n-1)/n = 1 for two ranks
        assert len(rk.step) == 35 and np.array_equal(rk.step_time, rk.comm_time)
        # Step s timed one all_reduce of size_bytes[s // 5]: the analysis' busbw rests on it.
        assert rk.attrs["allreduce_iterations"] == 5
        bytes_per_step = rk.allreduce_bytes()
        assert bytes_per_step is not None and bytes_per_step.tolist() == [
            1024 * 2 ** (s // 5) for s in range(35)
        ]
    assert float(str(_summary(results[0].stdout)["peak_busbw_gbps"])) > 0


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0", "--out", "x"], "--steps: 0 must be at least 1"),
        (["--steps", "5"], "the following arguments are required: --out"),
        (["--steps", "5", "--out", "x", "--mode", "bogus"], "invalid choice: 'bogus'"),
        (
            ["--steps", "5", "--out", "x", "--min-bytes", "4096", "--max-bytes", "1024"],
            "smaller than --min-bytes",
        ),
        (["--steps", "5", "--out", "/proc/no-such-dir"], "--out /proc/no-such-dir: cannot write there"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    (result,) = run_local(1, args, timeout=60)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.spawns
def test_rendezvous_timeout_exits_nonzero_naming_host(tmp_path: Path) -> None:
    (proc,) = start_ranks(2, ["--steps", "5", "--out", str(tmp_path), "--rendezvous-timeout", "2"], ranks=[1])
    (result,) = wait_ranks([proc], timeout=60)
    assert result.returncode == 1
    assert "rendezvous timed out after 2 s: rank 0's host 127.0.0.1:" in result.stderr
    assert not (tmp_path / "rank-1.h5").exists()


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "full"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {res.stderr.strip()}")
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.spawns
def test_full_output_storage_fails_the_rank_clearly(full_dir: Path) -> None:
    (result,) = run_local(
        1, ["--steps", "5000", "--out", str(full_dir / "out"), "--flush-every", "1", *QUIET]
    )
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("probe: error:")]
    assert "No space left on device" in line and "peer" not in line


_TORCH_IN_A_DAEMON_THREAD = """
import io, sys, threading, time
import torch
from slurm_chaos.probe.cli import leave

def write():  # as the background checkpoint writer does, forever: slow or hung storage
    x = torch.randn(1000, 1000)
    while True:
        torch.save(x, io.BytesIO())

threading.Thread(target=write, daemon=True).start()
time.sleep(0.3)
print("done", flush=True)
if sys.argv[1] == "leave":
    leave(0)
"""


@pytest.mark.spawns
def test_rank_exits_cleanly_while_a_daemon_thread_is_inside_torch(tmp_path: Path) -> None:
    """A rank whose checkpoint writer is still inside torch when it ends must exit 0, not abort.

    Through the interpreter's finalisation such a process dies with "terminate called without an
    active exception" (exit 134); the probe leaves through `leave`, which skips it.
    """
    script = tmp_path / "rank.py"
    script.write_text(_TORCH_IN_A_DAEMON_THREAD)
    for _ in range(5):
        res = subprocess.run(
            [sys.executable, str(script), "leave"], capture_output=True, text=True, timeout=120, check=False
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == "done\n" and "terminate called" not in res.stderr


@pytest.mark.spawns
def test_an_earlier_attempt_resuming_late_leaves_the_requeued_runs_files_alone(tmp_path: Path) -> None:
    """Ranks of a lost node carry on when it comes back, after the job was requeued and rerun
    elsewhere: they must not replace what the rerun recorded (a rack-loss verdict read them)."""
    out = tmp_path / "out"
    job = {"SLURM_JOB_ID": "4242"}
    _ok(
        run_local(
            2, ["--steps", "12", "--out", str(out), *QUIET], extra_env={**job, "SLURM_RESTART_COUNT": "1"}
        )
    )
    before = {p.name: p.read_bytes() for p in out.glob("rank-*.h5")}
    late = run_local(
        2, ["--steps", "12", "--out", str(out), *QUIET], extra_env={**job, "SLURM_RESTART_COUNT": "0"}
    )
    assert all(r.returncode == 1 for r in late), [r.stderr[-500:] for r in late]
    assert all("belongs to restart 1 of job 4242" in r.stderr for r in late)
    assert {p.name: p.read_bytes() for p in out.glob("rank-*.h5")} == before
    assert [len(rk.step) for rk in read_run(out).ranks] == [12, 12]


@pytest.mark.spawns
def test_a_held_job_trains_on_until_released_then_ends_completed(tmp_path: Path) -> None:
    """After its steps the job keeps training (the fault stays on) until the campaign's release
    file appears; every rank stops at the same step, and the run ends as a normal one."""
    out, release = tmp_path / "out", tmp_path / "release"
    args = ["--steps", "20", "--out", str(out), "--hold-file", str(release), "--flush-interval", "0.2"]
    procs = start_ranks(2, [*args, *QUIET])
    _wait_for_steps(out / "rank-0.h5", 60)  # 40 steps past --steps: holding, not ended
    assert all(p.poll() is None for p in procs)
    release.touch()
    results = wait_ranks(procs, timeout=60)
    _ok(results)
    run = read_run(out)
    lengths = {len(rk.step) for rk in run.ranks}
    assert len(lengths) == 1 and lengths.pop() >= 60  # the same steps on every rank
    for rk in run.ranks:
        assert rk.step.tolist() == list(range(len(rk.step)))
        assert rk.attrs["exit_reason"] == "done" and rk.attrs["steps_completed"] == len(rk.step)
        kinds = [e.kind for e in rk.events]
        assert kinds.count("hold_started") == 1 and kinds.count("hold_ended") == 1
        (ended,) = [e for e in rk.events if e.kind == "hold_ended"]
        assert "released" in ended.detail
    assert _summary(results[0].stdout)["last_step"] == len(run.ranks[0].step) - 1


@pytest.mark.spawns
def test_a_hold_nobody_releases_ends_at_its_limit(tmp_path: Path) -> None:
    """A campaign that died never releases its job: the job ends by itself at the hold's limit."""
    out = tmp_path / "out"
    args = ["--steps", "10", "--out", str(out), "--hold-file", str(tmp_path / "never"), "--hold-max-s", "1"]
    results = run_local(2, [*args, *QUIET], timeout=120)
    _ok(results)
    for rk in read_run(out).ranks:
        (ended,) = [e for e in rk.events if e.kind == "hold_ended"]
        assert "limit of 1 s reached" in ended.detail
        assert len(rk.step) >= 10


def test_mode_is_read_into_its_enum_and_an_unknown_one_names_the_modes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from slurm_chaos.probe.cli import parse
    from slurm_chaos.probe.schema import ProbeMode

    assert parse(["--steps", "5", "--out", "/tmp/x"]).mode is ProbeMode.TRAIN
    assert parse(["--steps", "5", "--out", "/tmp/x", "--mode", "allreduce"]).mode is ProbeMode.ALLREDUCE
    with pytest.raises(SystemExit) as exc:
        parse(["--steps", "5", "--out", "/tmp/x", "--mode", "inference"])
    assert exc.value.code == 2
    assert "--mode: invalid choice: 'inference' (choose from 'train', 'allreduce')" in capsys.readouterr().err


def test_hold_is_for_training_only() -> None:
    from slurm_chaos.errors import UsageError
    from slurm_chaos.probe.cli import parse

    with pytest.raises(UsageError, match="--hold-file"):
        parse(["--steps", "5", "--out", "/tmp/x", "--mode", "allreduce", "--hold-file", "/tmp/r"])
