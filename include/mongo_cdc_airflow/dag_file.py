"""``mongo-cdc-dag-file``: writes the DAG files into an existing Airflow's DAGs folder.

Two short files, because Airflow keeps an import error per file: ``mongo_cdc_dags.py`` builds the DAGs
of every valid source, and ``mongo_cdc_source_config.py`` fails with every problem of the invalid ones
(its import error in the UI), so one bad source file takes no other source's DAGs down. The
repository's own ``dags/`` holds exactly these files (tests/unit/test_packaging.py checks it).
"""

from __future__ import annotations

import argparse
import os
import sys

DAG_FILES = {
    "mongo_cdc_dags.py": '''\
"""mongo-cdc DAGs: one per source YAML in [mongo_cdc] sources_dir (docs/deploying.md)."""

from mongo_cdc_airflow.dag_factory import build_dags

globals().update(build_dags())
''',
    "mongo_cdc_source_config.py": '''\
"""Reports invalid mongo-cdc source YAMLs as this file's Airflow DAG import error.

It defines no DAG. Airflow records import errors per DAG file, so the sources' DAGs
(mongo_cdc_dags.py) stay up for every valid source while this file's import error lists every
problem of every invalid one (docs/deploying.md, "Sources").
"""

from mongo_cdc_airflow.dag_factory import raise_source_errors

raise_source_errors()
''',
}


def write_dag_files(folder: str, overwrite: bool = False) -> list[str]:
    """Write ``DAG_FILES`` into ``folder``; a different file already there is kept unless ``overwrite``."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, text in DAG_FILES.items():
        path = os.path.join(folder, name)
        if os.path.exists(path) and not overwrite:
            with open(path, encoding="utf-8") as existing:
                if existing.read() != text:
                    raise FileExistsError(f"{path} exists and differs; pass --overwrite to replace it")
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mongo-cdc-dag-file", description="Write mongo-cdc's DAG files into an Airflow DAGs folder."
    )
    parser.add_argument("folder", nargs="?", help="the DAGs folder (default: Airflow's [core] dags_folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace files that differ")
    arguments = parser.parse_args(argv)
    folder = arguments.folder
    if folder is None:
        from airflow.sdk.configuration import conf

        folder = conf.get("core", "dags_folder")
    try:
        for path in write_dag_files(folder, arguments.overwrite):
            print(f"wrote {path}")
    except FileExistsError as exc:
        print(f"mongo-cdc-dag-file: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
