"""Session-wide test settings: an isolated AIRFLOW_HOME without examples, a dags folder with the
example DAG, and (for the tests that need it) one migrated metadata DB per session."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_HOME = tempfile.mkdtemp(prefix="dlrover-test-airflow-")
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
DAGS_FOLDER = Path(os.environ["AIRFLOW_HOME"]) / "dags"
DAGS_FOLDER.mkdir(parents=True, exist_ok=True)
shutil.copy(Path(__file__).parents[1] / "dags" / "dlrm_daily_retrain.py", DAGS_FOLDER)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_FOLDER)


@pytest.fixture(scope="session")
def airflow_db():
    """The metadata DB, migrated once per session (SQLite under the test AIRFLOW_HOME)."""
    from airflow.utils.db import initdb

    initdb()
    return os.environ["AIRFLOW_HOME"]
