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
    from airflow_dtrain.operators import FSDPTrainOperator as from_operators

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
