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
for dag_file in ("dlrm_daily_retrain.py", "deploy_on_new_model.py"):
    shutil.copy(Path(__file__).parents[1] / "dags" / dag_file, DAGS_FOLDER)
#: an example trainer's DAG runs beside its trainer (examples/<name>: dag.py and train.py)
for example in ("ddp_dlrm", "ps_dlrm"):
    shutil.copytree(Path(__file__).parents[1] / "examples" / example, DAGS_FOLDER / example, dirs_exist_ok=True)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_FOLDER)


@pytest.fixture(scope="session")
def airflow_db():
    """The metadata DB, migrated once per session (SQLite under the test AIRFLOW_HOME)."""
    from airflow.utils.db import initdb

    initdb()
    return os.environ["AIRFLOW_HOME"]


#: The example DAG's small run with a killed worker (about a minute of training): tests/dags checks
#: its recovery through a retry, tests/plugins draws it. One run per session serves both.
KILLED_WORKER_CONF = {"samples": 2_400_000, "table_size": 5000, "quota_cpu": 1.5, "quota_memory": "4Gi",
                      "inject": "kill-worker@4s"}


@pytest.fixture(scope="session")
def killed_worker_run(airflow_db):
    """The ``DagRun`` of ``dag.test()`` with :data:`KILLED_WORKER_CONF` (warm-started when an
    earlier test of the session ran the job)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    return bag.get_dag("dlrm_daily_retrain").test(run_conf=KILLED_WORKER_CONF)
