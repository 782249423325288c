"""The ``spawns`` marker: a unit test that starts torch ranks or builds C says so.

``pytest -m "not spawns"`` is then the quick pass (pure Python, in-process); ``make test`` still runs
everything. A test counts as spawning when it calls a rank launcher or ``make`` itself, through a
helper or a fixture of its module; one that spawns some other way is listed in OTHER_SPAWNERS.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]
#: What starts processes of their own: the probe's local rank launchers and the C builds' ``make``.
LAUNCHERS = {"run_local", "start_ranks", "_make"}
#: Tests that spawn without a launcher (a torch process of their own).
OTHER_SPAWNERS = {
    ("test_probe_run.py", "test_rank_exits_cleanly_while_a_daemon_thread_is_inside_torch"),
    # plugin install --root with the real runner: make builds the plugin and the I/O shim.
    ("test_install_root.py", "test_the_plugin_is_built_here_and_copied_into_the_image"),
}


def _is_spawns(node: ast.expr) -> bool:
    """``pytest.mark.spawns``, called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "spawns"


def _names(node: ast.AST) -> set[str]:
    called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    if isinstance(node, ast.FunctionDef):
        called |= {a.arg for a in node.args.args}  # fixtures it takes
    return called


def _spawning_tests(path: Path) -> tuple[set[str], set[str]]:
    """(tests that spawn, tests marked spawns) of one test module."""
    tree = ast.parse(path.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    spawning = set(LAUNCHERS)
    while True:  # helpers and fixtures that reach a launcher, however deep
        more = {name for name, f in functions.items() if _names(f) & spawning} - spawning
        if not more:
            break
        spawning |= more
    module_marked = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and any(_is_spawns(e) for e in ast.walk(n.value) if isinstance(e, ast.expr))
        for n in tree.body
    )
    tests = {name: f for name, f in functions.items() if name.startswith("test_")}
    spawns = {name for name in tests if name in spawning or (path.name, name) in OTHER_SPAWNERS}
    marked = {
        name for name, f in tests.items() if module_marked or any(_is_spawns(d) for d in f.decorator_list)
    }
    return spawns, marked


def test_every_unit_test_that_spawns_is_marked_and_only_those() -> None:
    unmarked, overmarked = [], []
    for path in sorted(UNIT.glob("test_*.py")):
        spawns, marked = _spawning_tests(path)
        unmarked += [f"{path.name}::{t}" for t in sorted(spawns - marked)]
        overmarked += [f"{path.name}::{t}" for t in sorted(marked - spawns)]
    assert unmarked == [], "add @pytest.mark.spawns"
    assert overmarked == [], "marked spawns but starts no ranks and builds nothing"


def test_the_marker_is_registered() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    markers = [line.split(":")[0].strip() for line in cfg["tool:pytest"]["markers"].splitlines() if line]
    assert "spawns" in markers


def test_the_checker_sees_a_launcher_through_a_helper_and_a_fixture(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text(
        "import pytest\n"
        "def helper():\n    return run_local(2, [])\n"
        "@pytest.fixture\ndef built():\n    return _make('x')\n"
        "@pytest.mark.spawns\ndef test_a():\n    helper()\n"
        "def test_b(built):\n    pass\n"
        "def test_c():\n    pass\n"
    )
    assert _spawning_tests(module) == ({"test_a", "test_b"}, {"test_a"})
