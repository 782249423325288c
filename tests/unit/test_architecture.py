"""The package's shape: no import cycle between its parts, and one door to Slurm.

Both read the source (AST), so they hold for imports inside functions as much as at the top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_chaos"

# Known edges still to remove (#13), none left: a site's ${sandbox_*} placeholders are filled in
# from values its loader is given (sandbox.layout.site_placeholders), so site does not import sandbox.
KNOWN_EDGES: set[tuple[str, str]] = set()

SLURM_COMMANDS = frozenset(
    {"sbatch", "srun", "salloc", "scontrol", "squeue", "sinfo", "scancel", "sacct", "sacctmgr"}
)
# Modules that may still run Slurm commands themselves, with how many call sites each has.
KNOWN_SLURM_CALLERS = {
    # The sandbox brings up its own daemons and reservation: exempt for good.
    "sandbox/cluster.py": 7,
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def _unit(dotted: str) -> str | None:
    """`slurm_chaos.campaign.engine` -> `campaign`; `slurm_chaos.site` -> `site`."""
    parts = dotted.split(".")
    if parts[0] != "slurm_chaos" or len(parts) < 2:
        return None
    return parts[1]


def _imports(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def package_graph() -> dict[str, set[str]]:
    """Which part of the package imports which (parts: top-level modules and subpackages)."""
    graph: dict[str, set[str]] = {}
    for rel, tree in _modules():
        src = rel.split("/")[0].removesuffix(".py")
        for name in _imports(tree):
            dst = _unit(name)
            exists = dst is not None and ((PACKAGE / dst).is_dir() or (PACKAGE / f"{dst}.py").is_file())
            if exists and dst != src and (src, dst) not in KNOWN_EDGES:
                graph.setdefault(src, set()).add(str(dst))
    return graph


def module_graph(package: str) -> dict[str, set[str]]:
    """Which module of one subpackage imports which other module of it."""
    graph: dict[str, set[str]] = {}
    prefix = f"slurm_chaos.{package}."
    for rel, tree in _modules():
        if not rel.startswith(f"{package}/"):
            continue
        src = rel.removesuffix(".py").replace("/", ".")
        for name in _imports(tree):
            if name.startswith(prefix):
                dst = f"{package}.{name[len(prefix) :].split('.')[0]}"
                if dst != src and (PACKAGE / f"{dst.replace('.', '/')}.py").exists():
                    graph.setdefault(src, set()).add(dst)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_cycle_between_the_packages_parts() -> None:
    assert cycles(package_graph()) == []


@pytest.mark.parametrize("package", ["slurm", "campaign", "rundir", "observe", "probe", "sandbox"])
def test_no_cycle_between_modules_of(package: str) -> None:
    assert cycles(module_graph(package)) == []


def test_the_layers_named_in_the_issue_point_one_way() -> None:
    graph = package_graph()
    assert "observe" not in graph.get("probe", set())  # the probe writes heartbeats; observe reads them
    assert "sandbox" not in graph.get("site", set())  # a site's errors do not depend on a live sandbox
    assert "observe" not in graph.get("sandbox", set()) or "sandbox" not in graph.get("observe", set())
    assert "slurm.backend" not in module_graph("slurm").get("slurm.select", set())


def slurm_command_sites(tree: ast.Module) -> list[tuple[int, str]]:
    """argv lists (or tuples) that start with a Slurm command: `["scontrol", "update", ...]`."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) > 1:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS:
                # A tuple of names to compare with (`name in ("srun", "slurmstepd")`) runs nothing.
                if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                    if not any(isinstance(e.value, str) and e.value.startswith("-") for e in node.elts):
                        continue
                sites.append((node.lineno, str(first.value)))
    return sorted(sites)


def test_slurm_command_finder() -> None:
    tree = ast.parse(
        'r(["scontrol", "update", x])\nif n in ("srun", "slurmstepd"): pass\nargv = ["sinfo", "-h"]'
    )
    assert slurm_command_sites(tree) == [(1, "scontrol"), (3, "sinfo")]


def test_only_the_scheduler_runs_slurm_commands() -> None:
    found: dict[str, list[tuple[int, str]]] = {}
    for rel, tree in _modules():
        if rel.startswith("slurm/"):
            continue
        sites = slurm_command_sites(tree)
        if sites:
            found[rel] = sites
    unexpected = {rel: sites for rel, sites in found.items() if len(sites) != KNOWN_SLURM_CALLERS.get(rel, 0)}
    assert not unexpected, (
        "Slurm commands outside slurm_chaos/slurm/ (add a Scheduler method instead): "
        + "; ".join(f"{rel}: " + ", ".join(f"line {n} {c}" for n, c in s) for rel, s in unexpected.items())
    )
