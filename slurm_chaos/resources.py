"""The files slurm-chaos ships beside its code, found the same way from a wheel and from a checkout.

A wheel or sdist carries them inside the package (``slurm_chaos/<name>/``; setup.py maps the
top-level ``sbatch_templates/``, ``site_configs/``, ``spank_plugin/`` and ``preload/`` in), so
importlib.resources finds them wherever pip put the package. In a checkout (PYTHONPATH, or an
editable install) the top-level directories are read where they are.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path
from typing import Literal

from slurm_chaos.errors import ChaosError

Shipped = Literal[
    "experiments",  # the experiment library
    "suites",  # named lists of experiments (campaign --suite)
    "sbatch_templates",  # Jinja templates of the baseline and fault jobs
    "site_configs",  # example site configs; alerts/: Prometheus rules, Alertmanager config
    "spank_plugin",  # C sources and Makefile of the SPANK plugin
    "preload",  # C sources and Makefile of the checkpoint I/O shim
]

# What holds the package: a checkout's root, or site-packages.
_ROOT = Path(__file__).resolve().parent.parent


def _find(name: Shipped) -> Path | None:
    packaged = files("slurm_chaos") / name
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    checkout = _ROOT / name
    return checkout if checkout.is_dir() else None


def shipped(name: Shipped) -> Path:
    """The directory `name` as shipped with this slurm_chaos (read-only: never build in it)."""
    found = _find(name)
    if found is None:
        raise ChaosError(f"this slurm-chaos was installed without its {name}/ (looked under {_ROOT})")
    return found


def site_config(arg: str) -> Path:
    """A --site argument as a path: the file given, or else a shipped site config of that name.

    ``sandbox``, ``sandbox.yaml`` and ``site_configs/sandbox.yaml`` (the README's spelling, typed
    outside a checkout) name the shipped ``sandbox.yaml`` when there is no such file where the
    user is. Anything else stays as given, for the site loader to report.
    """
    path = Path(arg)
    configs = _find("site_configs")
    if path.exists() or configs is None or path.parent not in (Path(), Path("site_configs")):
        return path
    candidate = configs / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    return candidate if candidate.is_file() else path


def import_root() -> Path:
    """The directory to put on a child's PYTHONPATH so that it imports this slurm_chaos."""
    return _ROOT


def isolated_python(
    module: str, func: str = "main", python: str | None = None, root: Path | str | None = None
) -> list[str]:
    """``python -I -c BOOTSTRAP``: `module`'s `func(argv)` run by this interpreter on this
    slurm_chaos, isolated (no PYTHON* variables, neither the current directory nor user
    site-packages on sys.path): how root runs our code; append its arguments. `python` and
    `root` name another interpreter and import root (a node image's, as its node sees them)."""
    boot = (
        f"import sys; sys.path.insert(0, {str(root or import_root())!r}); "
        f"from {module} import {func}; sys.exit({func}(sys.argv[1:]))"
    )
    return [python or sys.executable, "-I", "-c", boot]
