"""docker-compose.yaml, checked without a container engine: the Compose specification's JSON schema
(tests/system/compose-spec.json, from github.com/compose-spec/compose-spec, schema/compose-spec.json at
commit a08f8d51631b7127ddac3d2c65537db429d0f1d0) and the cross-references Compose only finds at
``up`` time or the DAGs only find at run time."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from mongo_cdc_airflow.local_env import REPO_ROOT

COMPOSE_FILE = Path(REPO_ROOT, "docker-compose.yaml")
SCHEMA_FILE = Path(__file__).with_name("compose-spec.json")
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
CONTAINER_REPO = "/opt/airflow"  # where the Airflow image's AIRFLOW_HOME, and so the mounted repo, is


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the KEY=VALUE list form
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def mounts(service: dict) -> list[dict]:
    """Every volume entry in the long form: type, source, target."""
    result = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            result.append(entry)
            continue
        source, _, rest = entry.partition(":")
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        result.append({"type": kind, "source": source, "target": rest.split(":")[0]})
    return result


def airflow_services(compose: dict) -> dict[str, dict]:
    """The services running an Airflow component (their command's first word)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("command") and service["command"][0] in AIRFLOW_COMPONENTS
    }


def service_host(url: str) -> str:
    return urlsplit(url if "://" in url else f"//{url}").hostname


def host_path(service: dict, container_path: str) -> Path:
    """The repo path bind-mounted at ``container_path`` (or above it) in ``service``."""
    for mount in mounts(service):
        target = mount["target"].rstrip("/")
        if mount["type"] == "bind" and (container_path == target or container_path.startswith(target + "/")):
            return COMPOSE_FILE.parent / mount["source"] / os.path.relpath(container_path, target)
    raise AssertionError(f"{container_path} is not bind-mounted from the repo")


def test_the_compose_file_follows_the_compose_specification(compose: dict, validator) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)
    # Compose v2 only: the obsolete top-level `version` key is not there
    assert "version" not in compose


def test_the_schema_check_is_not_vacuous(compose: dict, validator) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["mongo-router"]["depends_on"]["mongo-init-replica-sets"]["condition"] = "done"
    broken["services"]["minio"]["healthcheck"]["test"] = {"cmd": "mc ready local"}
    broken["services"]["postgres"]["image_name"] = "postgres"
    assert len(list(validator.iter_errors(broken))) == 3


def test_every_depends_on_names_a_service_and_a_condition_it_can_meet(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        depends_on = service.get("depends_on", {})
        for dependency in depends_on:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            condition = depends_on[dependency]["condition"] if isinstance(depends_on, dict) else None
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s health"
            if condition == "service_completed_successfully":
                assert services[dependency].get("restart", "no") == "no", f"{dependency} is not one-shot"


def test_every_volume_is_declared_and_every_mounted_path_exists(compose: dict) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in compose["services"].items():
        for mount in mounts(service):
            if mount["type"] == "volume":
                assert mount["source"] in declared, f"{name} mounts undeclared volume {mount['source']}"
                used.add(mount["source"])
            elif mount["type"] == "bind":
                path = COMPOSE_FILE.parent / mount["source"]
                assert path.exists(), f"{name} mounts {mount['source']}, which is not in the repo"
        build = service.get("build")
        if build:
            context = COMPOSE_FILE.parent / build["context"]
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
    assert used == declared, f"declared but unused volumes: {sorted(declared - used)}"


def test_the_four_airflow_components_run(compose: dict) -> None:
    commands = sorted(service["command"][0] for service in airflow_services(compose).values())
    assert commands == sorted(AIRFLOW_COMPONENTS)


def test_every_airflow_component_has_what_the_dags_need(compose: dict) -> None:
    """Connections resolving to services of this file, the lake in the bucket minio-init creates,
    the packages on PYTHONPATH and a sources folder whose connection ids are all defined."""
    services = compose["services"]
    bucket_command = " ".join(services["minio-init"]["command"])
    for name, service in airflow_services(compose).items():
        env = environment(service)
        mongo = json.loads(env["AIRFLOW_CONN_MONGO_DEFAULT"])
        assert mongo["conn_type"] == "mongo" and mongo["host"] in services, name
        spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert spark["conn_type"] == "spark" and service_host(spark["host"]) in services, name
        lake_root = urlsplit(env["MONGO_CDC_LAKE_ROOT"])
        assert lake_root.scheme == "s3" and f"mb --ignore-existing lake/{lake_root.netloc}" in bucket_command

        assert f"{CONTAINER_REPO}/include" in env["PYTHONPATH"].split(":"), name
        assert host_path(service, f"{CONTAINER_REPO}/include/mongo_cdc_airflow").is_dir(), name
        assert host_path(service, f"{CONTAINER_REPO}/dags/mongo_cdc_dags.py").is_file(), name
        assert host_path(service, f"{CONTAINER_REPO}/spark_apps/cdc_transform.py").is_file(), name

        sources = sorted(host_path(service, env["MONGO_CDC_SOURCES_DIR"]).glob("*.yaml"))
        assert sources, f"{name}: no source YAML in {env['MONGO_CDC_SOURCES_DIR']}"
        for source in sources:
            settings = yaml.safe_load(source.read_text())
            conn_ids = {
                settings.get("mongodb.connection.id", "mongo_default"),
                settings.get("spark.connection.id", "spark_default"),
                settings["lake.connection.id"],  # an s3:// lake needs its credentials
            }
            for conn_id in conn_ids:
                assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, f"{name}: {source.name} uses {conn_id}"
            lake = json.loads(env[f"AIRFLOW_CONN_{settings['lake.connection.id'].upper()}"])
            assert lake["conn_type"] == "aws" and service_host(lake["extra"]["endpoint_url"]) in services
        # task processes report to the API server's execution API
        assert service_host(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]) in services, name
