"""The docs stay navigable: every relative link and #anchor in README.md and docs/*.md resolves, the
README stays a short first read, the architecture page's module map names every Python module, and
docs/reading.md's offline DuckDB LOAD line loads the delta extension."""

from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb
from reader_support import documented_delta_load

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200
# the folders whose every Python module the module map names
CODE_FOLDERS = ("include", "spark_apps", "dags")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _outside_fences(markdown: str) -> list[str]:
    """The page's lines that are not inside fenced code blocks (where `#` is no heading)."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the heading's text lowercased, every character but
    letters, digits, `_`, `-` and spaces removed, spaces turned into hyphens; a repeated anchor gets
    `-1`, `-2`, ... A link in a heading counts by its text."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_fences(markdown):
        heading = _HEADING.match(line)
        if heading is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(2))
        base = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def relative_links(markdown: str) -> list[str]:
    """The targets of a page's links that point into the repository (no URL scheme), outside code."""
    prose = _CODE_SPAN.sub("", "\n".join(_outside_fences(markdown)))
    return [target for target in _LINK.findall(prose) if not _SCHEME.match(target)]


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file does not exist or whose anchor is no heading there."""
    broken = []
    for link in relative_links(page.read_text(encoding="utf-8")):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: ({link})"
        if not target.exists() or ROOT not in (target, *target.parents):
            broken.append(f"{where}: no such file in the repository")
        elif anchor and target.suffix != ".md":
            broken.append(f"{where}: an anchor into a file that is not a Markdown page")
        elif anchor and anchor not in github_anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{where}: no heading with this anchor in {target.relative_to(ROOT)}")
    return broken


def module_map(architecture: str) -> str:
    """The "Module map" section of the architecture page, up to the next section of its level."""
    section = architecture.split("\n## Module map\n", 1)[1]
    return re.split(r"\n## ", section, maxsplit=1)[0]


def module_names() -> list[str]:
    """Every Python module of the code folders, as the map names it: dotted under include/ (a
    package by its own name), by path elsewhere."""
    names = []
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT / folder)
            if folder != "include":
                names.append(f"{folder}/{relative.as_posix()}")
            elif relative.name == "__init__.py":
                names.append(".".join(relative.parent.parts))
            else:
                names.append(".".join(relative.with_suffix("").parts))
    return names


def test_github_anchors_follow_githubs_slug_rules():
    page = "# A `b`: C\n## Pre- and post-images\n## BSON → types\n```\n# code\n```\n## A b: c\n## A b: c"
    assert github_anchors(page) == {"a-b-c", "pre--and-post-images", "bson--types", "a-b-c-1", "a-b-c-2"}


def test_every_relative_link_and_anchor_resolves():
    links = [link for page in PAGES for link in relative_links(page.read_text(encoding="utf-8"))]
    assert len(links) > 50, "the pages link to each other: the link parser found too few links"
    assert [problem for page in PAGES for problem in broken_links(page)] == []


def test_the_readme_is_a_short_first_read():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; keep it under {README_MAX_LINES} and move reference to docs/"
    )


def test_the_module_map_names_every_module():
    mapped = module_map(ARCHITECTURE.read_text(encoding="utf-8"))
    unnamed = [name for name in module_names() if f"`{name}`" not in mapped]
    assert unnamed == [], f"add these modules to the module map of {ARCHITECTURE.relative_to(ROOT)}"


def test_reading_mds_offline_duckdb_load_line_loads_the_delta_extension():
    """The page's one-liner prints a LOAD of the installed wheel's file (no download), which DuckDB
    loads; every DuckDB read of the tests goes through it (``reader_support``)."""
    statement = documented_delta_load()
    assert statement.startswith("LOAD '") and statement.endswith(".duckdb_extension';")
    assert os.path.isfile(statement[len("LOAD '") : -len("';")])
    connection = duckdb.connect()
    connection.execute(statement)
    loaded = connection.sql("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'delta'")
    assert loaded.fetchall() == [(True,)]
