"""ckpt-full against its own user, on the real sandbox (issue #27, findings 2 and 5).

Finding 2: an allowed, unprivileged user (chaosok) stacks a mount on, under or above the job's
full checkpoint volume from inside the job, as the setuid ``fusermount3`` of an Apptainer site
lets them: ``squashfuse x.sqfs DIR``. The daemon dies with the job; its mount stays. The undo
once refused to unmount anything with a mount on or under it, so the overlay and the tmpfs (RAM)
under it stayed on the node after the job. Now the undo detaches everything stacked on our
mount, and the node is as before: no mount left under the checkpoint root, the same mount table.

Where the sandbox lacks FUSE (no ``fuse3``/``squashfuse``/``squashfs-tools``: Debian packages
``fuse3 squashfuse squashfs-tools``), the stacked mount is a bind mount that root makes in the
node's mount namespace while the job waits: a stand-in for the user's FUSE mount, which the
undo treats the same way (it tells mounts apart by where they sit, not by their type).

/dev/fuse is 0600 on this host (no udev in the container); a Debian host's udev makes it 0666.
For the FUSE case the test binds a 0666 node of the same device over /dev/fuse in the test
node's mount namespace only (set up before the snapshot of the node, removed after).

Finding 5: ``leave`` beyond the catalogue's cap (1G) is refused at submission by the SPANK plugin,
naming the key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_faults_node import USER_PY, Cluster, cluster, unmount_under

from slurm_chaos.runner import SubprocessRunner

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

__all__ = ["cluster"]  # the module's fixture: hooks and policy for node faults, from test_faults_node

NODE = "node3"
FUSE_TOOLS = ("fusermount3", "squashfuse", "mksquashfs")
FUSE_DEV = (10, 229)

# As the job's user: stack a mount on POINT (FUSE by the user, or wait for root's bind mount),
# show what the job sees, leave it mounted (its FUSE daemon dies with the job).
STACK_JOB = """
set -u
CKPT={ckpt}
POINT={point}
{py} - <<'EOF'
import os
st = os.statvfs("{ckpt}") if os.path.isdir("{ckpt}") else None
print("FREE", st.f_bavail * st.f_frsize if st else "none")
EOF
{prepare}
if [ {how} = fuse ]; then
    squashfuse {image} "$POINT" && echo "STACKED by the job"
else
    touch {flag}.ready
    for i in $(seq 600); do [ -e {flag}.stacked ] && break; sleep 0.1; done
    echo "STACKED by root for the job"
fi
cat "$POINT/hello" 2>&1
grep -F -e "slurm-chaos-ckpt-$SLURM_JOB_ID-" -e "$POINT " /proc/self/mountinfo | sed 's/^/MOUNT /'
"""


def fuse_ready() -> bool:
    return all(shutil.which(tool) for tool in FUSE_TOOLS)


@pytest.fixture
def user_fuse(cluster: Cluster) -> Iterator[None]:
    """/dev/fuse the node's users may open (0666, as udev makes it), in the node's namespace only."""
    st = os.stat("/dev/fuse")
    if st.st_mode & 0o006 == 0o006:
        yield
        return
    where = cluster.root / "tmp" / f"fuse-{uuid.uuid4().hex[:6]}"
    where.mkdir(mode=0o700, parents=True)
    node = where / "fuse"
    os.mknod(node, 0o666 | 0o020000, os.makedev(*FUSE_DEV))
    node.chmod(0o666)
    assert cluster.in_node(NODE, ["mount", "--bind", str(node), "/dev/fuse"]).ok
    try:
        yield
    finally:
        cluster.in_node(NODE, ["umount", "-l", "/dev/fuse"])
        shutil.rmtree(where)


def mounts_under(cluster: Cluster, prefix: Path) -> list[str]:
    info = Path(f"/proc/{cluster.slurmd_pid(NODE)}/mountinfo").read_text()
    return [line for line in info.splitlines() if line.split()[4].startswith(f"{prefix}/")]


def job_mounts(out: str) -> dict[str, set[str]]:
    """{source: per-mount options} of the mounts the job printed (its MOUNT lines)."""
    found = {}
    for line in out.splitlines():
        if line.startswith("MOUNT "):
            fields = line.split()[1:]
            sep = fields.index("-", 6)
            found[fields[sep + 2]] = set(fields[5].split(","))
    return found


@pytest.mark.parametrize("where", ["under", "on", "above"])
def test_a_mount_the_job_stacks_on_its_full_volume_is_detached_with_it(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser], request: pytest.FixtureRequest, where: str
) -> None:
    """under: squashfuse x.sqfs ckpt/m; on: over the overlay's root; above: over the directory
    that holds it (the overlay is then hidden from every path)."""
    how = "fuse" if fuse_ready() else "bind"
    if how == "fuse":
        request.getfixturevalue("user_fuse")
    user = sandbox_users["chaosok"]
    mine = cluster.checkpoints / f"{user.name}-{uuid.uuid4().hex[:6]}"
    assert cluster.run(user.argv("mkdir", "-p", str(mine / "a"))).ok
    ckpt = mine / "a" / "ckpt"
    point = {"under": ckpt / "m", "on": ckpt, "above": mine / "a"}[where]
    src = user.home / f"stack-{mine.name}"
    (src / "img").mkdir(parents=True)
    (src / "img" / "hello").write_text("hello from the stacked mount\n")
    image = src / "x.sqfs"
    if how == "fuse":
        made = subprocess.run(["mksquashfs", str(src / "img"), str(image), "-quiet", "-noappend"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert made.returncode == 0, made.stderr
    for p in (src, src / "img", src / "img" / "hello", *([image] if how == "fuse" else [])):
        os.chown(p, user.uid, user.gid)
    flag = src / "flag"
    script = STACK_JOB.format(
        ckpt=ckpt,
        point=point,
        prepare=f'mkdir "{point}"' if where == "under" else "",
        how=how,
        image=image,
        flag=flag,
        py=USER_PY,
    )
    before = cluster.snapshot(NODE)
    try:
        spec = f"ckpt-full:path={ckpt},leave=64K"
        job = cluster.submit(script, spec, "-N1", "-w", NODE, user=user)
        if how == "bind":  # root's stand-in for the user's FUSE mount, made in the node's namespace
            end = time.monotonic() + 120
            while not Path(f"{flag}.ready").exists() and time.monotonic() < end:
                time.sleep(0.2)
            assert cluster.in_node(NODE, ["mount", "--bind", str(src / "img"), str(point)]).ok
            Path(f"{flag}.stacked").touch()
        cluster.wait_done(job, [NODE])
        out = cluster.output(job)
        assert "STACKED" in out and "hello from the stacked mount" in out, out
        # The job had its full volume, on a tmpfs and an overlay that honour no set-uid bit or device.
        assert "FREE 65536" in out, out
        ours = {s: o for s, o in job_mounts(out).items() if s.startswith(f"slurm-chaos-ckpt-{job}-")}
        assert len(ours) == 2 and all({"nosuid", "nodev"} <= o for o in ours.values()), out
        assert mounts_under(cluster, cluster.checkpoints) == []
        assert not list(Path("/run/slurm-chaos").glob(f"ckpt-{NODE}-{job}"))
        assert cluster.snapshot(NODE) == before
    finally:
        left = unmount_under(cluster, NODE, mine)
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
    assert not left


def test_leave_beyond_the_cap_is_refused_at_submission(  # type: ignore[no-untyped-def]
    sandbox, chaos_site: Path, sandbox_users: dict[str, SandboxUser]
) -> None:
    """leave=900G once made root write 900 GB into the node's RAM: the plugin refuses it, naming the key."""
    user = sandbox_users["chaosok"]
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SLURM_CONF": sandbox.env["SLURM_CONF"],
        **{k: v for k, v in sandbox.env.items() if k.endswith("_RESERVATION")},
    }
    ckpt = sandbox.shared_dir / "checkpoints" / f"{user.name}-cap"
    for leave, refused in (("900G", True), ("2G", True), ("1G", False)):
        argv = user.argv(
            "sbatch", "--parsable", "--hold", "-N1", "--exclusive", "-o", "/dev/null",
            f"--chaos=ckpt-full:path={ckpt},leave={leave}", "--wrap", "true", env=env,
        )  # fmt: skip
        res = SubprocessRunner()(argv, timeout=60, env=sandbox.env)
        job = res.stdout.strip().split(";")[0]
        if job:  # never let a job that got through run
            SubprocessRunner()(["scancel", job], timeout=30, env=sandbox.env)
        if refused:
            assert not res.ok and not job, (leave, res)
            assert f"ckpt-full: leave: bad value '{leave}' (above the maximum 1G)" in res.stderr, res.stderr
        else:
            assert res.ok and job, (leave, res)
