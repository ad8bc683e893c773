"""Session-wide test settings: an isolated AIRFLOW_HOME without examples."""

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="dlrover-test-airflow-")
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
