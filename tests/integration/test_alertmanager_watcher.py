"""The watcher against a real Alertmanager (Debian's prometheus-alertmanager, no Slurm needed):
a maintenance-window silence on every alert, and an alert about a node the job does not hold.

Alerts are posted to Alertmanager's v2 API as Prometheus would post them; the silence is created
with amtool where it is installed (else the v2 API), as an administrator would create it. The job
is a fake scheduler's, on node1 and node2.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.verdict import judge
from slurm_chaos.campaign.observe import Watcher, fetch_alerts
from slurm_chaos.clock import FakeClock
from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog
from slurm_chaos.sandbox.monitoring import ALERTMANAGER
from slurm_chaos.site import Detector
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not ALERTMANAGER.exists(), reason=f"{ALERTMANAGER} missing (apt-get install prometheus-alertmanager)"
)

SITE_ALERT = Detector("site-node-alerts", ("straggler", "node_health"), alert=(("alertname", "=~Site.+"),))
#: An experiment detected only by the site's alert (slow-rank's symptom, with no drain or rule named).
BY_ALERT = Expectation(expect_regression=False, detect_signals=("signal:straggler",), detect_within_s=90)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Manager:
    def __init__(self, url: str) -> None:
        self.url = url

    def post(self, *alerts: dict[str, object]) -> None:
        req = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(list(alerts)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

    def silence_everything(self, comment: str) -> str:
        """A maintenance-window silence on every alert (alertname=~".+"), for an hour."""
        if shutil.which("amtool"):
            res = subprocess.run(
                [
                    "amtool",
                    f"--alertmanager.url={self.url}",
                    *("silence", "add", "--duration=1h", "--author=slurm-chaos tests"),
                    f"--comment={comment}",
                    'alertname=~".+"',
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert res.returncode == 0, res.stderr
            return res.stdout.strip()
        now = datetime.now(UTC)
        body = {
            "matchers": [{"name": "alertname", "value": ".+", "isRegex": True, "isEqual": True}],
            "startsAt": _iso(now),
            "endsAt": _iso(now + timedelta(hours=1)),
            "createdBy": "slurm-chaos tests",
            "comment": comment,
        }
        req = urllib.request.Request(
            f"{self.url}/api/v2/silences",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return str(json.loads(resp.read())["silenceID"])


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Manager]:
    port = _free_port()
    config = tmp_path / "alertmanager.yml"
    shutil.copy(REPO / "site_configs" / "alerts" / "alertmanager.yml", config)
    argv = [
        str(ALERTMANAGER),
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "alertmanager not ready within 30 s"
            time.sleep(0.1)
        yield Manager(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _watcher(url: str, start: float) -> Watcher:
    fake = FakeScheduler(
        node_table=idle_nodes(4),
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=("node1", "node2"))] * 50,
    )
    job = fake.submit_wrap("true", [])
    return Watcher(fake, job, url, FakeClock(start), detectors=(SITE_ALERT,))


def _log(w: Watcher, start: float) -> ObservationLog:
    return ObservationLog(FaultWindow(start), tuple(sorted(w.observations, key=lambda o: o.time)), BY_ALERT)


def _alert(name: str, begins: datetime, **labels: str) -> dict[str, object]:
    return {
        "labels": {"alertname": name, **labels},
        "startsAt": _iso(begins),
        "endsAt": _iso(begins + timedelta(minutes=30)),
    }


def test_a_maintenance_window_silence_shows_as_fired_silenced_not_a_blind_spot(
    alertmanager: Manager,
) -> None:
    now = datetime.now(UTC)
    start = (now - timedelta(seconds=20)).timestamp()  # the fault began 20 s ago
    silence = alertmanager.silence_everything("maintenance window (slurm-chaos campaign)")
    alertmanager.post(_alert("SiteStraggler", now - timedelta(seconds=8), instance="node2:9100"))
    w = _watcher(alertmanager.url, start)
    w.tick()
    (fetched,) = fetch_alerts(alertmanager.url)
    assert fetched["status"]["state"] == "suppressed"  # type: ignore[index]
    assert fetched["status"]["silencedBy"] == [silence]  # type: ignore[index]
    fired = [o for o in w.observations if o.detector == "site-node-alerts"]
    assert len(fired) == 1 and fired[0].silenced
    j = judge(None, _log(w, start))
    assert j.verdict is Verdict.PASSED, j.reason
    assert j.detected_by == "site-node-alerts"
    assert "detected by site-node-alerts after 12 s (silenced)" in j.reason
    (d,) = [d for d in j.detections if d.signal == "straggler"]
    assert d.silenced and d.time_to_detect_s == pytest.approx(12, abs=0.01)


def test_an_alert_about_an_unrelated_node_does_not_count(alertmanager: Manager) -> None:
    now = datetime.now(UTC)
    start = (now - timedelta(seconds=30)).timestamp()
    # node4 is not the job's: a site alert about it, in every label form a site may use.
    alertmanager.post(
        _alert("SiteStraggler", now - timedelta(seconds=25), instance="node4:9100"),
        _alert("SiteNodeUnhealthy", now - timedelta(seconds=25), Hostname="node4"),
        _alert("SiteNodeUnhealthy", now - timedelta(seconds=25), node="node4.cluster.example"),
    )
    w = _watcher(alertmanager.url, start)
    w.tick()
    assert len(fetch_alerts(alertmanager.url)) == 3
    assert w.observations == []
    missed = judge(None, _log(w, start))
    assert missed.verdict is Verdict.BLIND_SPOT
    assert missed.detected_by is None and missed.detections == ()
    # The same alert about the job's node, 10 s later, counts from its own startsAt.
    alertmanager.post(_alert("SiteStraggler", now - timedelta(seconds=15), instance="node1:9100"))
    w.tick()
    j = judge(None, _log(w, start))
    assert j.verdict is Verdict.PASSED, j.reason
    assert j.time_to_detect_s == pytest.approx(15, abs=0.01)
    assert not any(o.silenced for o in w.observations)
