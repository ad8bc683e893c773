"""The DLRover sensors: the instability guard (``guard``)."""

from airflow_dlrover.sensors.guard import DLRoverInstabilitySensor, DLRoverNodeFailure

__all__ = ["DLRoverInstabilitySensor", "DLRoverNodeFailure"]
