"""The package's import graph, built from the sources: no cycles, and each stage imports only downward.

A module's imports are every ``import``/``from`` of a ``mongo_cdc*`` module anywhere in it: function
bodies included, since a cycle through a function-level import still ties the two modules together,
and ``if TYPE_CHECKING:`` blocks included, since a name imported there for a hint is used at run
time through the object that carries it (a run that holds its driver and calls back into it is a
circle, whatever the import statement says).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "include", ROOT / "spark_apps"]
PACKAGES = ("mongo_cdc", "mongo_cdc_airflow", "mongo_cdc_dev")


def _module_name(path: Path) -> str:
    base = next(source for source in SOURCES if source in path.parents)
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of ours -> the modules of ours it imports, for hints or to run."""
    paths = [path for source in SOURCES for path in source.rglob("*.py")]
    modules = {_module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = _imports(ast.parse(path.read_text(), str(path)))
        graph[name] = {target for target in imported if target in modules and target != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_our_modules_and_their_imports() -> None:
    graph = import_graph()
    assert "mongo_cdc.lake.landing" in graph["mongo_cdc.capture.snapshot"]
    assert "mongo_cdc.lake.layout" in graph["mongo_cdc.lake"]


def test_no_module_imports_itself_through_others() -> None:
    cycle = _cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _arrows_up(graph: dict[str, set[str]], package: str, above: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules of ``package`` that import a module of a package ``above`` it, with those."""
    inside = [m for m in graph if m == package or m.startswith(f"{package}.")]
    arrows = {m: sorted(t for t in graph[m] if t.startswith(above)) for m in inside}
    return {module: targets for module, targets in arrows.items() if targets}


def test_the_lake_imports_neither_capture_nor_transform() -> None:
    """The ledger is the lowest stage: capture writes to it and the transform reads it."""
    assert _arrows_up(import_graph(), "mongo_cdc.lake", ("mongo_cdc.capture", "mongo_cdc.transform")) == {}


def test_the_config_imports_no_capture_module() -> None:
    """The configuration owns its vocabularies (capture, snapshot and oversize modes, field rules):
    the capture modules read a ``SourceConfig``, so an arrow from config to capture would run back up."""
    assert _arrows_up(import_graph(), "mongo_cdc.config", ("mongo_cdc.capture",)) == {}


def test_an_import_for_type_hints_counts() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mongo_cdc.x import Y\n")
    assert "mongo_cdc.x" in _imports(tree)


def test_the_core_imports_neither_airflow_nor_the_developer_tooling() -> None:
    graph = import_graph()
    for module, targets in graph.items():
        if module == "mongo_cdc" or module.startswith("mongo_cdc."):
            outside = {t for t in targets if t.startswith(("mongo_cdc_airflow", "mongo_cdc_dev"))}
            assert not outside, f"{module} imports {sorted(outside)}"


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module a newcomer can read in one sitting: split one that grows past this by what it owns."""
    paths = [path for source in SOURCES for path in source.rglob("*.py")]
    long = {
        str(p.relative_to(ROOT)): n
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"
