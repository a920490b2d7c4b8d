"""The pages that walk a newcomer through the code name only what the code has.

Every dotted name that ``docs/walkthrough.md`` and ``docs/architecture.md`` quote in backticks
(``slice_tasks.transform_slice``, ``StateRun.merge``, ``mongo_cdc.lake.landing.SourceLake``) must
be found in the sources, read as text (nothing is imported): a module by its dotted path or by its
last parts, a class by its name, then each further part as a definition inside it. A dotted name
that is no code (a configuration key, a MongoDB namespace, a file) is named as such below, so a
renamed module or function cannot pass for one.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from mongo_cdc.config.dag_settings import DAG_SETTINGS
from mongo_cdc.config.source import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "walkthrough.md", ROOT / "docs" / "architecture.md"]
SOURCES = [ROOT / "include", ROOT / "spark_apps", ROOT / "dags"]
# Dotted names the pages quote that are not code: the demo's namespace and source file, the MongoDB
# config database's collections that shard discovery reads, and the CDC DAG's task ids inside its
# per-shard group.
NOT_CODE = {
    *("inventory.customers", "inventory.yaml"),
    *("config.chunks", "config.collections", "config.shards"),
    *("shard_sync.pull", "shard_sync.snapshot", "shard_sync.verify"),
}
CONFIG_KEYS = set(SETTINGS) | set(DAG_SETTINGS)

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


@dataclass
class Scope:
    """A module or class: the names defined (or imported) in it, and the classes among them."""

    names: set[str] = field(default_factory=set)
    classes: dict[str, Scope] = field(default_factory=dict)


def _scope(body: list[ast.stmt]) -> Scope:
    scope = Scope()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.ClassDef):
                scope.names.add(node.name)
                scope.classes[node.name] = _scope(node.body)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scope.names.add(node.name)
            elif isinstance(node, ast.Assign):
                scope.names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                scope.names.add(node.target.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                scope.names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.If | ast.Try):  # definitions under a guard still define
                visit(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])

    visit(body)
    return scope


def code_index() -> dict[str, Scope]:
    """Each module of ours by its dotted name (``include/`` packages by package, the rest by path)."""
    modules: dict[str, Scope] = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            parts = list(path.relative_to(source if source.name == "include" else ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = _scope(ast.parse(path.read_text(), str(path)).body)
    return modules


def _member(scope: Scope, parts: list[str], modules: dict[str, Scope], module: str) -> bool:
    """Whether ``parts`` name a definition reached from ``scope`` (a module's submodules included)."""
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if module and f"{module}.{head}" in modules:
        return _member(modules[f"{module}.{head}"], rest, modules, f"{module}.{head}")
    if head in scope.classes:
        return _member(scope.classes[head], rest, modules, "")
    return head in scope.names and not rest


def resolves(name: str, modules: dict[str, Scope]) -> bool:
    """Whether a quoted dotted name is a module, or a definition in one, or a class's member."""
    parts = name.removesuffix("()").split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        for module, scope in modules.items():
            if (module == head or module.endswith(f".{head}")) and _member(
                scope, parts[cut:], modules, module
            ):
                return True
    classes = [scope.classes[parts[0]] for scope in modules.values() if parts[0] in scope.classes]
    return any(_member(scope, parts[1:], modules, "") for scope in classes)


def quoted_names(page: Path) -> set[str]:
    """The page's code spans that are a dotted name (a trailing ``()`` allowed), outside fences."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    spans = {span.strip() for span in _CODE_SPAN.findall(text)}
    return {s for s in spans if _DOTTED.fullmatch(s.removesuffix("()"))} - NOT_CODE - CONFIG_KEYS


def test_the_index_finds_modules_classes_and_members():
    modules = code_index()
    assert resolves("mongo_cdc.lake.landing.SourceLake", modules)
    assert resolves("landing.SourceLake.commit", modules)
    assert resolves("lake.landing", modules)
    assert resolves("SourceLake.commit", modules)
    assert resolves("mongo_cdc_airflow.dag_factory.build_dags()", modules)
    assert resolves("spark_apps.cdc_transform", modules)
    assert not resolves("landing.SourceLake.no_such_method", modules)
    assert not resolves("SourceLake.commit.deeper", modules)
    assert not resolves("no_such_module.SourceLake", modules)


def test_the_pages_quote_dotted_names():
    for page in PAGES:
        assert len(quoted_names(page)) > 10, f"the parser found too few dotted names in {page.name}"


def test_every_quoted_dotted_name_is_in_the_code():
    modules = code_index()
    missing = {
        page.relative_to(ROOT).as_posix(): sorted(
            name for name in quoted_names(page) if not resolves(name, modules)
        )
        for page in PAGES
    }
    assert missing == {page.relative_to(ROOT).as_posix(): [] for page in PAGES}, (
        "names the pages quote that the code does not have: rename them in the page, or, if one is "
        "no code (a key, a file), add it to NOT_CODE"
    )
