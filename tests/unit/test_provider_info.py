"""The provider registers with Airflow and describes everything it ships."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema

import airflow_dtrain
from airflow_dtrain.get_provider_info import get_provider_info
from tests.conftest import REPO


def test_provider_info_validates_against_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def _classes(package: str, base_names: tuple[str, ...]) -> set[str]:
    found = set()
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{package}."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and any(b.__name__ in base_names for b in cls.__mro__[1:]):
                found.add(module.__name__)
    return found


def test_provider_info_lists_every_operator_and_trigger_module():
    info = get_provider_info()
    listed = {
        kind: {m for entry in info.get(kind, []) for m in entry["python-modules"]}
        for kind in ("operators", "triggers", "sensors", "hooks")
    }
    assert _classes("airflow_dtrain.operators", ("BaseOperator",)) == listed["operators"]
    assert _classes("airflow_dtrain.triggers", ("BaseTrigger",)) == listed["triggers"]
    assert _classes("airflow_dtrain.sensors", ("BaseSensorOperator",)) == listed["sensors"]
    for kind, modules in listed.items():
        for module in modules:
            importlib.import_module(module)  # every listed module exists
    integrations = {i["integration-name"] for i in info["integrations"]}
    for kind in ("operators", "triggers", "sensors"):
        assert {e["integration-name"] for e in info[kind]} <= integrations


def test_public_names_are_importable_from_the_package():
    from airflow_dtrain.operators.fsdp_train import FSDPTrainOperator as from_operators

    assert airflow_dtrain.FSDPTrainOperator is from_operators


def test_airflow_providers_list_shows_the_provider(airflow_home):
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    ).stdout
    providers = {p["package_name"]: p for p in json.loads(out[out.index("[") :])}
    assert "airflow-dtrain" in providers, sorted(providers)
    assert providers["airflow-dtrain"]["version"] == airflow_dtrain.__version__


def test_airflow_providers_get_shows_the_documentation_url(airflow_home, tmp_path):
    """Airflow takes a provider's documentation-url from its package metadata (Project-URL: Documentation):
    build that metadata from this tree's setup.cfg, as an install writes it, and ask the CLI."""
    from airflow_dtrain.get_provider_info import DOCUMENTATION_URL

    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "egg_info", "--egg-base",
                    str(tmp_path)], cwd=REPO, check=True, capture_output=True, timeout=120)  # fmt: skip
    # first on the path, so this metadata is the one Airflow finds (whatever an older install left)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "get", "airflow-dtrain", "--full", "--output", "json"],
        check=True, capture_output=True, text=True, env=env, timeout=120,
    ).stdout  # fmt: skip
    [info] = json.loads(out[out.index("[") :])
    assert info["documentation-url"] == DOCUMENTATION_URL
    assert "airflow_dtrain.cli.get_dtrain_cli_commands" in info["cli"]


def test_the_providers_page_can_describe_the_provider():
    """The API's providers endpoint reads every provider's documentation-url (a KeyError without one)."""
    from airflow.api_fastapi.core_api.services.public.providers import _provider_mapper
    from airflow.providers_manager import ProviderInfo

    response = _provider_mapper(ProviderInfo(airflow_dtrain.__version__, get_provider_info()))
    assert response.documentation_url.startswith("https://") and response.package_name == "airflow-dtrain"
