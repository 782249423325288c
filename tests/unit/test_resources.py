"""Shipped files are found through slurm_chaos.resources; --site takes a shipped config's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.resources import shipped, site_config

REPO = Path(__file__).resolve().parents[2]


def test_shipped_directories_from_a_checkout() -> None:
    assert shipped("spank_plugin") == REPO / "spank_plugin"
    assert (shipped("preload") / "Makefile").is_file()
    assert (shipped("sbatch_templates") / "fault.sbatch.j2").is_file()
    assert (shipped("site_configs") / "alerts" / "slurm-chaos.rules.yml").is_file()
    assert {p.stem for p in shipped("suites").glob("*.yaml")} >= {"maintenance", "gpu"}
    assert (shipped("experiments") / "rack-loss.yaml").is_file()


@pytest.mark.parametrize("arg", ["sandbox", "sandbox.yaml", "site_configs/sandbox.yaml"])
def test_a_shipped_site_config_by_name_from_anywhere(
    arg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert site_config(arg) == REPO / "site_configs" / "sandbox.yaml"


def test_a_file_where_the_user_is_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "sandbox.yaml").write_text("cluster: mine\n")
    (tmp_path / "sandbox").write_text("cluster: mine\n")
    assert site_config("site_configs/sandbox.yaml") == Path("site_configs/sandbox.yaml")
    assert site_config("sandbox") == Path("sandbox")


@pytest.mark.parametrize("arg", ["nosuch", "conf/sandbox.yaml", "/etc/nosuch/sandbox.yaml"])
def test_anything_else_stays_as_given(arg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert site_config(arg) == Path(arg)  # the site loader names it in its error
