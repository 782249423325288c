"""What a sandbox node's cgroups hold beyond Slurm's standing ones, for before/after snapshots."""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def leftover_cgroups(sandbox: str, node: str, root: Path = CGROUP_ROOT) -> list[str]:
    """The node's cgroups that are not Slurm's standing ones: ours (slurm-chaos-*), anything in
    the cpu hierarchy (Slurm 22.05 makes nothing there on v1) and any job's (Slurm removes a
    job's once it ended). Each node has its subtree in every hierarchy (sandbox/cgroups.py);
    a sandbox without cgroups had ours at the cpu hierarchy's root."""
    out = [f"cpu:/{p.name}" for p in (root / "cpu").glob("slurm-chaos-*") if "sandbox" not in p.name]
    for hier in sorted(root.iterdir()):
        base = hier / f"slurm-chaos-sandbox-{sandbox}" / node
        if hier.is_symlink() or not base.is_dir():
            continue
        for d in base.rglob("*"):
            rel = str(d.relative_to(base))
            if d.is_dir() and ("slurm-chaos" in rel or "job_" in rel or hier.name == "cpu"):
                out.append(f"{hier.name}:/{rel}")
    return sorted(out)
