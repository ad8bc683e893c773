from airflow_dlrover.plugins.shim import *  # noqa: F401,F403 — the DLRover-RM UI, unless its entry point is installed
