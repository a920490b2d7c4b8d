"""The values ``cursor.oversize.handling.mode`` takes, and what each does with a change event over
MongoDB's 16 MB limit: the table the setting is checked against (``config.source``) and the pull
turns into pipeline stages (``capture.oversized_events``, which documents the modes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OversizeMode:
    skips: bool  # an event over the limit is replaced by a marker: logged and counted, not landed
    splits: bool  # the server cuts large events into fragments, joined again before they land


OVERSIZE_MODES = {
    "fail": OversizeMode(skips=False, splits=False),
    "skip": OversizeMode(skips=True, splits=False),
    "split": OversizeMode(skips=False, splits=True),
}
