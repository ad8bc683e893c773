import json
import os
import subprocess
import sys
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import jsonschema

import airflow
from airflow_dlrover.get_provider_info import get_provider_info

pytestmark = pytest.mark.unit


def test_provider_info_validates_against_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-dlrover"


def test_every_listed_module_and_hook_class_imports():
    info = get_provider_info()
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info.get(section, []):
            for module in entry["python-modules"]:
                import_module(module)
    for connection in info["connection-types"]:
        module, _, name = connection["hook-class-name"].rpartition(".")
        hook = getattr(import_module(module), name)
        assert hook.conn_type == connection["connection-type"] == "dlrover"


def test_entry_point_is_registered():
    (entry,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_dlrover")]
    assert entry.load() is get_provider_info


def test_providers_manager_knows_the_provider_and_connection_type():
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "airflow-dlrover" in ProvidersManager().providers
    hook = ProvidersManagerTaskRuntime().hooks["dlrover"]
    assert hook.hook_class_name == "airflow_dlrover.hooks.dlrover.DLRoverHook"


@pytest.mark.jobs
def test_airflow_cli_lists_the_provider():
    env = dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False")
    airflow_bin = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow_bin), "providers", "list", "--output", "json"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    providers = {p["package_name"]: p for p in json.loads(result.stdout[result.stdout.index("[{"):])}
    assert providers["airflow-dlrover"]["version"] == "0.1.0"
