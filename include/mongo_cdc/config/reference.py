"""The configuration reference page (docs/configuration.md), rendered from the key declarations.

``python -m mongo_cdc.config.reference > docs/configuration.md`` (``make docs``) writes it; a test
fails when the file differs from ``render()``.
"""

from __future__ import annotations

from pathlib import Path

from mongo_cdc.config.setting import Setting
from mongo_cdc.config.source import SETTINGS
from mongo_cdc.config.values import MAX_INT

REGENERATE = "make docs"

_PAGE = """\
# Source configuration reference

<!-- Generated from the key declarations in include/mongo_cdc/config/source.py by `{regenerate}`:
     edit those, not this file. -->

One YAML file per MongoDB source (see [Sources](deploying.md#sources)). `topic.prefix` is the
only required key. Validation is strict:

* Unknown keys (with the closest known key as a hint), wrong types, out-of-range integers and
  invalid regular expressions are errors that name the file, the key, the value and what is
  allowed. Every problem of a file is reported at once, not just the first.
* Integers are bounded by what they drive (the *allowed* column); an integer without its own range
  is at most {max_int}.
* Booleans are `true`/`false` only (YAML 1.2; `True`/`TRUE` too). YAML 1.1's `yes`/`no`/`on`/`off`
  are read as text, so `tombstones.on.delete: yes` is refused, and `topic.prefix: on` means `"on"`.
* A key given twice in a file is an error naming both lines (YAML loaders otherwise keep the last).
* Two sources with the same `topic.prefix` and the same lake root would write the same tables
  (Debezium requires unique prefixes too): both are refused, each naming the other.

{table}

Filter rules:

* Include and exclude lists **of one kind** are mutually exclusive (`database.*` with each other,
  `collection.*` with each other). The database and collection filters combine.
* A list can be a YAML list or a comma-separated string. Use the list form for a regex that
  contains a comma.
* `admin`, `local` and `config` are never captured. Neither are collections named `system.*`.
* Each collection the filters match is streamed (an ordinary collection), batch-captured (a view:
  [Views](semantics.md#views); a [time-series collection](semantics.md#time-series-collections)) or
  not captured, with the reason: a `system.*` collection, a view without a unique `_id`, a view or a
  time-series collection of a sharded cluster. `discover` logs those not captured and the run's
  summary names them (`not_captured`).

Example (`include/sources/{example_name}`, the demo's source):

```yaml
{example}```
"""

# The page's example is the demo's source file itself, so it stays a valid, loaded source.
EXAMPLE_SOURCE = Path(__file__).resolve().parents[2] / "sources" / "inventory.yaml"


def shown_default(declared: Setting) -> str:
    """A key's default as the page's table shows it."""
    if declared.required:
        return "**required**"
    if declared.shown_default is not None:
        return declared.shown_default
    value = declared.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | frozenset):
        return f"`{','.join(value)}`" if value else "empty"
    return f"`{value}`"


def _row(declared: Setting) -> str:
    cells = (
        f"`{declared.key}`",
        shown_default(declared),
        declared.value_type.allowed,
        declared.description,
    )
    return "| " + " | ".join(cell.replace("|", r"\|") for cell in cells) + " |"


def render() -> str:
    """The whole page, as docs/configuration.md holds it."""
    table = "\n".join(
        ["| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
        + [_row(declared) for declared in SETTINGS.values()]
    )
    example = EXAMPLE_SOURCE.read_text(encoding="utf-8")
    return _PAGE.format(
        regenerate=REGENERATE, max_int=MAX_INT, table=table, example_name=EXAMPLE_SOURCE.name, example=example
    )


if __name__ == "__main__":
    print(render(), end="")
