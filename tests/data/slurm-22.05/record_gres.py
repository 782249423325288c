"""Records `scontrol -o show node` and `sinfo --json` of a sandbox whose nodes declare GPUs (GRES).

Run as root on a machine that can run the sandbox: `python3 tests/data/slurm-22.05/record_gres.py`.
It brings up the sandbox `hgres` with fake GPU device files (/dev/tty*: slurmd only checks that
they exist), records, and takes the sandbox down. slurm.conf declares two sockets per node, but
slurmd on a one-socket machine keeps the hardware's layout ("Node reconfigured socket/core
boundaries"), so every bound GPU lands on socket 0 there:

  node1  gpu:tesla:2, Cores=0 and Cores=1   -> `gpu:tesla:2(S:0)` (one socket holds both cores)
  node2  gpu:tesla:2, both Cores=0          -> `gpu:tesla:2(S:0)`
  node3  gpu:a100:1 and gpu:t4:1            -> one entry per type: `gpu:a100:1(S:0),gpu:t4:1(S:0)`
  node4  gpu:tesla:2 without Cores=         -> `gpu:tesla:2`, no socket suffix
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from slurm_chaos.runner import SubprocessRunner  # noqa: E402
from slurm_chaos.sandbox.cluster import Sandbox, _write  # noqa: E402
from slurm_chaos.sandbox.layout import Layout  # noqa: E402

NODE_GRES = {
    "node1": "gpu:tesla:2",
    "node2": "gpu:tesla:2",
    "node3": "gpu:a100:1,gpu:t4:1",
    "node4": "gpu:tesla:2",
}
GRES_CONF = """\
NodeName=node1 Name=gpu Type=tesla File=/dev/tty10 Cores=0
NodeName=node1 Name=gpu Type=tesla File=/dev/tty11 Cores=1
NodeName=node2 Name=gpu Type=tesla File=/dev/tty[10-11] Cores=0
NodeName=node3 Name=gpu Type=a100 File=/dev/tty10 Cores=0
NodeName=node3 Name=gpu Type=t4 File=/dev/tty11 Cores=1
NodeName=node4 Name=gpu Type=tesla File=/dev/tty[10-11]
"""


class GresSandbox(Sandbox):
    def _write_configs(self, layout: Layout, health_interval: int) -> None:
        super()._write_configs(layout, health_interval)
        conf = layout.slurm_conf.read_text()
        conf = re.sub(
            r"^(NodeName=(node\d+) .*?)Sockets=1 CoresPerSocket=2 ",
            lambda m: f"{m.group(1)}Sockets=2 CoresPerSocket=1 Gres={NODE_GRES[m.group(2)]} ",
            conf,
            flags=re.MULTILINE,
        )
        _write(layout.slurm_conf, "GresTypes=gpu\n" + conf)
        _write(layout.etc / "gres.conf", GRES_CONF)


def main() -> int:
    sandbox = GresSandbox("hgres")
    layout = sandbox.up(nodes=4, install=False, monitoring=False)
    env = {"SLURM_CONF": str(layout.slurm_conf)}
    run = SubprocessRunner()
    try:
        for argv, name in [
            (["scontrol", "-o", "show", "node"], "scontrol_show_node_gres_oneliner.txt"),
            (["sinfo", "--json"], "sinfo_gres.json"),
        ]:
            done = run(argv, timeout=20, env=env)
            if not done.ok:
                print(done.stderr, file=sys.stderr)
                return 1
            (HERE / name).write_text(done.stdout)
    finally:
        sandbox.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
