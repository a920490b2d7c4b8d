"""A collection's namespace, ``<db>.<collection>``: the one owner of splitting and joining the name.

MongoDB refuses a dot in a database name but allows one in a collection name
(``shop.orders.archive`` is collection ``orders.archive`` of ``shop``), so the name splits at its
first dot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Namespace:
    db: str
    collection: str

    @classmethod
    def parse(cls, text: str) -> Namespace:
        """The namespace ``text`` names; a part ``text`` lacks (no dot, nothing after it) is empty."""
        db, _, collection = text.partition(".")
        return cls(db, collection)

    def __str__(self) -> str:
        return f"{self.db}.{self.collection}"

    def __iter__(self) -> Iterator[str]:
        """The two parts, so ``db, collection = Namespace.parse(text)`` reads them."""
        return iter((self.db, self.collection))
