"""The DLRover operators, one module per stage: profile → fit → launch → fine-tune → report
(the guard is ``sensors.guard``). Importing them is cheap: no torch, scipy or Kubernetes client."""

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.finetune import DLRoverFineTuneOperator
from airflow_dlrover.operators.fit import DLRoverFitOperator
from airflow_dlrover.operators.launch import DLRoverLaunchOperator
from airflow_dlrover.operators.profile import DLRoverProfileOperator
from airflow_dlrover.operators.report import DLRoverReportOperator

__all__ = ["DLRoverBaseOperator", "DLRoverFineTuneOperator", "DLRoverFitOperator", "DLRoverLaunchOperator",
           "DLRoverProfileOperator", "DLRoverReportOperator"]
