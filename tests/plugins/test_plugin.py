"""The plugin's registration: the entry point, the plugins-folder shim, never twice; cheap to load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from airflow_dlrover.plugins import ENTRY_POINT, URL_PREFIX, DLRoverPlugin

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]

#: Loads the plugins as Airflow does, where no installed ``airflow-dlrover`` declares the entry point
#: (the files were copied) — unless ``probe`` puts one on the path (the package is installed).
LOAD = r"""
import importlib, json
modules = [importlib.import_module("importlib.metadata")]
try:  # Airflow reads entry points through the backport on Python < 3.12
    modules.append(importlib.import_module("importlib_metadata"))
except ImportError:
    pass
for module in modules:
    def distributions(_all=module.distributions, **kwargs):
        return [d for d in _all(**kwargs) if (d.metadata["Name"] or "").lower().replace("_", "-") != "airflow-dlrover"]
    module.distributions = distributions
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"plugins": [[p.name, str(p.source)] for p in plugins], "errors": errors}))
"""


def load_plugins(tmp_path: Path, folder: Path, entry_point: bool) -> dict:
    paths = [str(ROOT)]
    if entry_point:  # a distribution that declares our entry point, as an installed wheel does
        info = tmp_path / "site" / "dlrover_ui_probe-0.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dlrover-ui-probe\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(f"[airflow.plugins]\ndlrover = {ENTRY_POINT}\n")
        paths.insert(0, str(info.parent))
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(folder),
           "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pyproject_declares_the_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["airflow.plugins"] == {"dlrover": ENTRY_POINT}
    module, name = ENTRY_POINT.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is DLRoverPlugin


def test_the_plugin_mounts_the_app_and_links_its_views():
    plugin = DLRoverPlugin()
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == URL_PREFIX == "/dlrover"
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES

    assert not any(URL_PREFIX.startswith(p) for p in RESERVED_URL_PREFIXES)
    views = {v["destination"]: v for v in plugin.external_views}
    assert set(views) == {"nav", "dag_run", "task_instance"}
    assert views["dag_run"]["href"] == "/dlrover/dag-runs/{DAG_ID}/{RUN_ID}"
    assert views["task_instance"]["href"] == "/dlrover/dag-runs/{DAG_ID}/{RUN_ID}/tasks/{TASK_ID}"
    assert len({v["url_route"] for v in plugin.external_views}) == 3
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    for view in plugin.external_views:  # the API server's own schema of an external view
        ExternalViewResponse.model_validate(view)
    routes = {r.path for r in app["app"].routes}
    assert {"/", "/runs/{run}", "/dag-runs/{dag_id}/{run_id}", "/dag-runs/{dag_id}/{run_id}/tasks/{task_id}",
            "/what-if"} <= routes


@pytest.mark.jobs
def test_loading_the_plugin_is_cheap():
    """Every Airflow process loads plugins: no app, optimizer, pandas or torch until the API server asks."""
    code = ("import sys, airflow_dlrover.plugins; print(sorted(m for m in ('airflow_dlrover.plugins.app', "
            "'pandas', 'scipy', 'torch', 'kubernetes') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr[-2000:]


@pytest.mark.parametrize(("entry_point", "source"), [
    (False, "$PLUGINS_FOLDER/dlrover_plugin.py"),   # files copied into the plugins folder
    (True, "dlrover-ui-probe==0.0: EntryPoint"),    # the package installed, the shim copied as well
])
@pytest.mark.jobs
def test_registered_once_whether_installed_or_copied(tmp_path, entry_point, source):
    loaded = load_plugins(tmp_path, ROOT / "plugins", entry_point)
    assert [name for name, _ in loaded["plugins"]] == ["dlrover"]
    assert loaded["plugins"][0][1].startswith(source)
    assert loaded["errors"] == {}


@pytest.mark.jobs
def test_a_naive_shim_beside_the_entry_point_is_skipped_with_an_import_error(tmp_path):
    """Why the shim stands down: Airflow keeps the first plugin of a name and reports the second."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "naive.py").write_text("from airflow_dlrover.plugins import DLRoverPlugin\n")
    loaded = load_plugins(tmp_path, folder, entry_point=True)
    assert [name for name, _ in loaded["plugins"]] == ["dlrover"]
    assert any("already registered" in message for message in loaded["errors"].values())
