"""The history on the sandbox: two windows with the site's monitoring, a third after it was weakened
on purpose (the health check no longer checks stragglers, no alerts are read): `history --compare`
names the experiment whose detection regressed, with both windows, and exits 1; the same compare
between the first two exits 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sandbox_cli import cli, reinstall_plugin

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def _site(chaos_site: Path, tmp_path: Path, name: str, history: Path, weaker: bool = False) -> Path:
    """The sandbox site (the same cluster, so one history) with history.path set; ``weaker``: the
    monitoring of sandbox-weak-monitoring.yaml."""
    data = yaml.safe_load(chaos_site.read_text())
    data["history"] = {"path": str(history)}
    if weaker:
        monitoring = data["monitoring"]
        monitoring["healthcheck_signals"] = [s for s in monitoring["healthcheck_signals"] if s != "straggler"]
        monitoring.update(prometheus=None, alertmanager=None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_compare_names_the_detection_that_regressed(sandbox, chaos_site: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    history = tmp_path / "history.sqlite"
    full = _site(chaos_site, tmp_path, "full", history)
    weak = _site(chaos_site, tmp_path, "weak", history, weaker=True)
    run_ids = []
    for i, site in enumerate((full, full, weak), start=1):
        out = tmp_path / f"w{i}"
        try:
            res = cli("run", "--site", str(site), "slow-rank", "--out", str(out), "-q", env=sandbox.env)
        finally:
            if site == weak:
                reinstall_plugin(sandbox, chaos_site)
        assert res.returncode in (0, 1), res.stderr
        run_ids.append(json.loads((out / "manifest.json").read_text())["run_id"])
        assert f"history: {run_ids[-1]} added to {history}" in res.stdout
        verdict = json.loads((out / "report.json").read_text())["experiments"][0]["verdict"]
        assert verdict == ("BLIND SPOT" if site == weak else "PASSED"), res.stdout

    same = cli("history", "--site", str(full), "--compare", "--window", run_ids[1], env=sandbox.env)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "findings: 0" in same.stdout

    worse = cli("history", "--site", str(full), "--compare", "--format", "json", env=sandbox.env)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    doc = json.loads(worse.stdout)
    assert {f["experiment"] for f in doc["findings"]} == {"slow-rank"}
    by_what = {f["what"]: f for f in doc["findings"]}
    assert (
        by_what["verdict"]["before"]["value"] == "PASSED"
        and by_what["verdict"]["now"]["value"] == "BLIND SPOT"
    )
    detection = by_what["detection"]
    assert (detection["before"]["window"], detection["now"]["window"]) == (run_ids[1], run_ids[2])
    assert detection["before"]["value"].startswith("by ") and detection["now"]["value"] == "not detected"

    table = cli("history", "--site", str(full), env=sandbox.env)
    assert table.returncode == 0 and all(r in table.stdout for r in run_ids), table.stdout
