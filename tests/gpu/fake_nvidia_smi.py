#!/usr/bin/env python3
"""A stand-in nvidia-smi answering as a captured machine did (for testing check_gpu.sh's fault
checks without a GPU): ``-L``, ``topo -m`` and ``--query-gpu=<fields> --format=csv`` from the
capture named by $FAKE_SMI_CAPTURE (idle section), with ``-pl`` changing the power limit it reports
(state in $FAKE_SMI_STATE) and every call appended to $FAKE_SMI_STATE.calls."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_captures import load, project


def main(argv: list[str]) -> int:
    capture = load(os.environ["FAKE_SMI_CAPTURE"])
    state = Path(os.environ["FAKE_SMI_STATE"])
    cells = json.loads(state.read_text()) if state.exists() else {}
    with open(f"{state}.calls", "a") as calls:
        calls.write(" ".join(argv) + "\n")
    query = capture.output("idle", "nvidia-smi --query-gpu=")
    if argv[:1] == ["-L"]:
        print(capture.output("capabilities", "nvidia-smi -L"), end="")
    elif argv[:2] == ["topo", "-m"]:
        print(capture.output("capabilities", "nvidia-smi topo -m"), end="")
    elif argv and argv[0].startswith("--query-gpu="):
        print(project(query, argv[0].split("=", 1)[1].split(","), cells), end="")
    elif "-pl" in argv:
        limit = f"{float(argv[argv.index('-pl') + 1]):.2f} W"
        (row,) = [r for r in project(query, ["pci.bus_id"]).splitlines()[1:]]
        state.write_text(json.dumps({row: {"power.limit": limit, "enforced.power.limit": limit}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
