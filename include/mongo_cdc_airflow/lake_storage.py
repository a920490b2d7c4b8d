"""The lake's ``LakeLocation`` from ``lake.root`` and the Airflow connection ``lake.connection.id``.

Credentials never live in the source YAML. Mapping of the connection to delta-rs options:

* ``s3://``: an ``aws`` connection through the Amazon provider's ``AwsBaseHook`` (so assumed
  roles, profiles and the rest of its credential chain work): ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` (frozen when the location is built, so a
  temporary token must outlive the task), ``AWS_REGION``, and from the extra ``endpoint_url``
  (S3-compatible stores) ``AWS_ENDPOINT_URL``, plus ``AWS_ALLOW_HTTP`` for an ``http://`` one.
* ``gs://`` (untested here: no GCS in the tests): a ``google_cloud_platform`` connection's extra
  ``keyfile_dict`` (the service-account JSON) gives ``google_service_account_key``, ``key_path``
  gives ``google_service_account``.
* ``abfs[s]://`` (untested here): an ``adls``/``wasb`` connection. With extra ``tenant_id``: a
  service principal (login = client id, password = secret: ``azure_client_id``,
  ``azure_client_secret``, ``azure_tenant_id``); else extra ``sas_token`` gives
  ``azure_storage_sas_key``; else the password is the account key (``azure_storage_account_key``,
  with the login or extra ``account_name`` as ``azure_storage_account_name``).
* No connection id: no options; delta-rs and pyarrow use the environment's credentials
  (``AWS_*`` variables, instance profile, ``GOOGLE_APPLICATION_CREDENTIALS``, ...).

Credential extras that cannot be mapped are refused, never silently ignored.
"""

from __future__ import annotations

import json
from typing import Any

from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, uri_scheme

_UNMAPPED_EXTRAS = {
    "gs": ("key_secret_name", "credential_config_file", "impersonation_chain"),
    "abfs": ("connection_string", "managed_identity_client_id", "workload_identity_tenant_id"),
}


def lake_location(root: str, conn_id: str | None) -> LakeLocation:
    """``root`` (already resolved by the source config) with the credentials of ``conn_id``."""
    scheme = uri_scheme(root)
    if conn_id is None:
        return LakeLocation(root)
    if scheme is None:
        raise ValueError(
            f"lake.connection.id '{conn_id}' is set but lake.root {root!r} is a local path; "
            "remove the key or use an s3://, gs:// or abfs[s]:// root"
        )
    if scheme == "s3":
        return LakeLocation(root, _aws_options(conn_id))
    from airflow.sdk import Connection

    connection = Connection.get(conn_id)
    family = "gs" if scheme == "gs" else "abfs"
    extras = {key.rsplit("__", 1)[-1]: value for key, value in connection.extra_dejson.items()}
    refused = [key for key in _UNMAPPED_EXTRAS[family] if extras.get(key)]
    if refused:
        raise ValueError(
            f"connection '{conn_id}': extra '{refused[0]}' cannot be passed to delta-rs; "
            "use a key file or key (see mongo_cdc_airflow.lake_storage) or ambient credentials"
        )
    options = _gcs_options(extras) if family == "gs" else _azure_options(connection, extras)
    return LakeLocation(root, options)


def _aws_options(conn_id: str) -> dict[str, str]:
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    credentials = hook.get_credentials()  # also masks the secret and token in task logs
    options = {
        "AWS_ACCESS_KEY_ID": credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
        "AWS_REGION": hook.conn_config.region_name or hook.conn_region_name,
    }
    if credentials.token:
        options["AWS_SESSION_TOKEN"] = credentials.token
    endpoint = hook.conn_config.get_service_endpoint_url("s3")
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _gcs_options(extras: dict[str, Any]) -> dict[str, str]:
    if extras.get("keyfile_dict"):
        key = extras["keyfile_dict"]
        return {"google_service_account_key": key if isinstance(key, str) else json.dumps(key)}
    if extras.get("key_path"):
        return {"google_service_account": extras["key_path"]}
    return {}


def _azure_options(connection: Any, extras: dict[str, Any]) -> dict[str, str]:
    if extras.get("tenant_id"):
        return {
            "azure_client_id": connection.login or "",
            "azure_client_secret": connection.password or "",
            "azure_tenant_id": extras["tenant_id"],
        }
    account = extras.get("account_name") or connection.login
    options = {"azure_storage_account_name": account} if account else {}
    if extras.get("sas_token"):
        options["azure_storage_sas_key"] = extras["sas_token"]
    elif connection.password:
        options["azure_storage_account_key"] = connection.password
    return options


def source_lake(config: SourceConfig) -> SourceLake:
    """The source's raw tables and batch log, reached through its ``lake.connection.id``."""
    return SourceLake(lake_location(config.lake_root, config.lake_conn_id), config.topic_prefix)
