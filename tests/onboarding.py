"""Filling in what `slurm-chaos site init` leaves as TODO, as a site admin would."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slurm_chaos.site import todo_entries


def fill_todos(site: Path, values: Mapping[str, Any], out: Path) -> Path:
    """Write `site` to `out` with every TODO replaced by values[dotted key]; a TODO without a value fails."""
    data = yaml.safe_load(site.read_text())
    for key, what in todo_entries(data):
        assert key in values, f"no value to fill in {key} (TODO: {what})"
        *parents, last = key.split(".")
        section = data
        for name in parents:
            section = section[int(name) if isinstance(section, list) else name]
        section[last] = values[key]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
