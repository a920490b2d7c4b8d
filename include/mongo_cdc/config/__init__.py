"""Source configuration: one YAML file per MongoDB source, validated when the DAG file is parsed.

Every key is declared once, on its ``SourceConfig`` field (``source``): key, default, value type
(``values``: the parser, which also says what is allowed) and description. ``loading`` reads and
validates the YAML files from those declarations; ``reference`` renders the configuration page
(docs/configuration.md). Every problem is reported as a ``SourceConfigError`` naming the file,
the key and what is allowed.
"""

from mongo_cdc.config.loading import (
    LAKE_ROOT_ENV,
    default_lake_root,
    load_source,
    load_sources,
)
from mongo_cdc.config.namespace_filters import SYSTEM_DATABASES
from mongo_cdc.config.snapshot_mode_table import SNAPSHOT_MODES
from mongo_cdc.config.source import (
    SETTINGS,
    SKIPPABLE_OPERATIONS,
    SourceConfig,
)
from mongo_cdc.config.values import MAX_INT, SourceConfigError

__all__ = [
    "LAKE_ROOT_ENV",
    "MAX_INT",
    "SETTINGS",
    "SKIPPABLE_OPERATIONS",
    "SNAPSHOT_MODES",
    "SYSTEM_DATABASES",
    "SourceConfig",
    "SourceConfigError",
    "default_lake_root",
    "load_source",
    "load_sources",
]
