"""airflow-dlrover: DLRover-RM resource optimisation and recovery as an Apache Airflow provider."""

__version__ = "0.1.0"
