"""What ``plugins/dlrover_plugin.py`` exports into the Airflow plugins folder.

Airflow loads the plugins folder first, then the ``airflow.plugins`` entry points, and skips a
second plugin of the same name with an import error ("already registered"). So the shim exports
``DLRoverPlugin`` only where no installed distribution declares the entry point (the files were
copied, not installed); where one does, the entry point registers it, once.
"""

from importlib.metadata import entry_points

from airflow_dlrover.plugins import ENTRY_POINT, DLRoverPlugin  # noqa: F401 (exported through __all__)

INSTALLED = any(ep.value == ENTRY_POINT for ep in entry_points(group="airflow.plugins"))
__all__ = [] if INSTALLED else ["DLRoverPlugin"]
