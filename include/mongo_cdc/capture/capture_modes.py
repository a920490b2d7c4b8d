"""Debezium's ``capture.mode`` and ``capture.mode.full.update.type``: what a change stream is asked for.

capture.mode                                 update ``after``                  ``before``
-------------------------------------------  --------------------------------  -----------------
change_streams                               none (``updateDescription`` only)  none
change_streams_update_full (default)         ``updateLookup`` or post-image    none
change_streams_with_pre_image                none                              ``whenAvailable``
change_streams_update_full_with_pre_image    ``updateLookup`` or post-image    ``whenAvailable``

(``after`` of an update is the ``fullDocument`` option, ``before`` ``fullDocumentBeforeChange``.)

``capture.mode.full.update.type`` picks the update ``after`` of the two full modes: ``lookup``
reads the document when the stream returns the event (it may already hold later writes, or be
null when the document is gone by then); ``post_image`` takes the post-image MongoDB stored with
the event (``fullDocument: whenAvailable``): the document exactly as that write left it.

Pre- and post-images exist only for collections with ``changeStreamPreAndPostImages`` enabled.
Debezium asks for them ``whenAvailable``, so a collection without the option silently yields null
images; ``require_images`` refuses to start a snapshot or a pull in that case instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from mongo_cdc.capture.collection_kinds import matched_collections
from mongo_cdc.config.capture_mode_table import CAPTURE_MODES

if TYPE_CHECKING:
    from mongo_cdc.config import SourceConfig


_FULL_DOCUMENT = {"lookup": "updateLookup", "post_image": "whenAvailable"}
_ENABLE_IMAGES = "changeStreamPreAndPostImages: {enabled: true}"


class ImagesNotEnabledError(RuntimeError):
    """Captured collections lack ``changeStreamPreAndPostImages`` that the capture mode needs."""


def watch_options(config: SourceConfig) -> dict[str, Any]:
    """The ``fullDocument`` / ``fullDocumentBeforeChange`` options of ``MongoClient.watch``."""
    mode = CAPTURE_MODES[config.capture_mode]
    options: dict[str, Any] = {}
    if mode.full_update:
        options["full_document"] = _FULL_DOCUMENT[config.capture_mode_full_update_type]
    if mode.pre_image:
        options["full_document_before_change"] = "whenAvailable"
    return options


def needs_images(config: SourceConfig) -> bool:
    """Whether the capture mode reads images MongoDB records only with changeStreamPreAndPostImages."""
    mode = CAPTURE_MODES[config.capture_mode]
    return mode.pre_image or (mode.full_update and config.capture_mode_full_update_type == "post_image")


def captured_collection_options(client: MongoClient, config: SourceConfig) -> Iterator[tuple[str, str, dict]]:
    """(db, collection, listCollections options) of every captured collection (views and
    time-series collections excluded: no change stream reads them)."""
    for db, names, infos in matched_collections(client, config):
        for name in names:
            if infos[name].get("type", "collection") == "collection" and config.captures_collection(db, name):
                yield db, name, infos[name].get("options", {})


def require_images(client: MongoClient, config: SourceConfig, rs: str) -> None:
    """Fail, naming every captured collection without ``changeStreamPreAndPostImages``, if the mode needs it.

    Runs before anything lands, so a refused step leaves the lake and the offset as they were.
    """
    if not needs_images(config):
        return
    missing = sorted(
        (db, collection)
        for db, collection, options in captured_collection_options(client, config)
        if not options.get("changeStreamPreAndPostImages", {}).get("enabled")
    )
    if not missing:
        return
    reason = (
        f"capture.mode '{config.capture_mode}'"
        if CAPTURE_MODES[config.capture_mode].pre_image
        else "capture.mode.full.update.type 'post_image'"
    )
    fixes = "\n".join(
        f'  use {db}; db.runCommand({{collMod: "{collection}", {_ENABLE_IMAGES}}})'
        for db, collection in missing
    )
    names = ", ".join(f"{db}.{collection}" for db, collection in missing)
    raise ImagesNotEnabledError(
        f"replica set {rs}: {reason} needs change stream pre- and post-images, but "
        f"{len(missing)} captured collection(s) do not record them: {names}. "
        f"Nothing was landed and the offset is unchanged. Enable them (changes made before that carry "
        f"no images), then run again:\n{fixes}"
    )
