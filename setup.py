"""What goes into the wheel; the rest of the metadata is in setup.cfg.

The job templates, site configs and the C sources of the SPANK plugin and the I/O shim stay at the
top of the repository, where admins and the C tooling expect them; the wheel carries them inside
the package (``slurm_chaos/<dir>/``) so that ``slurm_chaos.resources`` finds them wherever the
package is installed. Only sources are listed: build outputs (``build/``, ``*.o``, ``*.so``) never
ship. MANIFEST.in puts the same files into the sdist.
"""

from setuptools import find_packages, setup

SHIPPED = {
    "sbatch_templates": ["*.j2"],
    "site_configs": ["*.yaml", "alerts/*.yml"],
    "spank_plugin": ["Makefile", "README.md", "*.c", "*.h", "*.map", "*.sh", "*.py", "seeds/*"],
    "preload": ["Makefile", "*.c", "*.h", "*.sh", "seeds/*"],
}

setup(
    packages=find_packages(include=["slurm_chaos", "slurm_chaos.*"]) + [f"slurm_chaos.{d}" for d in SHIPPED],
    package_dir={f"slurm_chaos.{d}": d for d in SHIPPED},
    package_data={
        "slurm_chaos": [
            "py.typed",
            "sandbox/templates/*.j2",
            "schemas/*.json",
            "experiments/*.yaml",
            "suites/*.yaml",
            "faults/*.json",
            "faults/*.lua",
            "observe/*.nhc",
        ],
        **{f"slurm_chaos.{d}": patterns for d, patterns in SHIPPED.items()},
    },
)
