"""`site init` on the sandbox: what Slurm reports equals site_configs/sandbox.yaml; filled in, it renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from onboarding import fill_todos

from slurm_chaos.cli import main
from slurm_chaos.sandbox.layout import site_placeholders
from slurm_chaos.site import Site, load_site

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
SANDBOX_SITE = REPO / "site_configs" / "sandbox.yaml"


@pytest.fixture()
def initialised(sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`slurm-chaos site init --out site.yaml` against the test sandbox."""
    monkeypatch.setenv("SLURM_CONF", str(sandbox.slurm_conf))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", sandbox.name)  # sandbox.yaml's placeholders: this sandbox
    out = tmp_path / "site.yaml"
    assert main(["site", "init", "--out", str(out)]) == 0
    return out


def _filled_like(reference: Site) -> dict[str, Any]:
    """The answers to every TODO, taken from the shipped sandbox config."""
    mon = reference.monitoring
    return {
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


def test_site_init_reports_what_sandbox_yaml_says(initialised: Path, tmp_path: Path) -> None:
    written = yaml.safe_load(initialised.read_text())
    shipped = yaml.safe_load(SANDBOX_SITE.read_text().replace("${", "$_{"))  # placeholders: not here
    for section in ("partitions", "racks", "features"):
        assert written[section] == shipped[section], section

    reference = load_site(SANDBOX_SITE, site_placeholders)
    filled = fill_todos(initialised, _filled_like(reference), tmp_path / "filled.yaml")
    site = load_site(filled, site_placeholders)
    assert site.partitions == reference.partitions
    assert site.racks == reference.racks
    assert site.features == reference.features
    assert (site.nodes.cpus, site.nodes.numa_nodes, site.nodes.gpus_per_node) == (
        reference.nodes.cpus,
        reference.nodes.numa_nodes,
        reference.nodes.gpus_per_node,
    )
    assert (site.slurm.partition, site.slurm.reservation) == (
        reference.slurm.partition,
        reference.slurm.reservation,
    )
    assert (site.slurm.conf, site.slurm.plugstack_conf) == (
        reference.slurm.conf,
        reference.slurm.plugstack_conf,
    )
    safety = ("allowed_partitions", "allowed_reservations", "max_nodes", "require_exclusive")
    assert [getattr(site.safety, k) for k in safety] == [getattr(reference.safety, k) for k in safety]


def test_filled_in_it_renders_an_experiment(initialised: Path, tmp_path: Path) -> None:
    reference = load_site(SANDBOX_SITE, site_placeholders)
    filled = fill_todos(initialised, _filled_like(reference), tmp_path / "filled.yaml")
    out = tmp_path / "scripts"
    # numa-mismatch is judged between runs (a baseline and a fault job); slow-rank has no baseline.
    assert main(["render", "--site", str(filled), "--experiment", "numa-mismatch", "--out", str(out)]) == 0
    for role in ("baseline", "fault"):
        script = (out / f"{role}.sbatch").read_text()
        assert "#SBATCH --reservation=chaos_maint\n" in script
    assert (
        main(["render", "--site", str(filled), "--experiment", "slow-rank", "--out", str(tmp_path / "sb")])
        == 0
    )
    assert "#SBATCH --reservation=chaos_maint\n" in (tmp_path / "sb" / "fault.sbatch").read_text()
    assert not (tmp_path / "sb" / "baseline.sbatch").exists()


def test_unfilled_it_is_refused_naming_a_todo(
    initialised: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scripts"
    assert main(["render", "--site", str(initialised), "--experiment", "slow-rank", "--out", str(out)]) == 2
    assert f"{initialised}: slurm.hooks_dir: still TODO:" in capsys.readouterr().err
    assert not out.exists()
