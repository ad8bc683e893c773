"""docs/kubernetes.md stays true: its YAML validates strictly, its connection extras are accepted."""

import json
import re
from pathlib import Path

import kubernetes_validate
import yaml

import pytest

from airflow_dlrover.hooks.dlrover import settings_from_extras
from airflow_dlrover.launchers import make_launcher

pytestmark = pytest.mark.unit

DOC = (Path(__file__).parents[2] / "docs" / "kubernetes.md").read_text()


def test_every_yaml_block_validates_strictly():
    documents = [d for block in re.findall(r"```yaml\n(.*?)```", DOC, re.S) for d in yaml.safe_load_all(block)]
    assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "Role", "RoleBinding", "NetworkPolicy"]
    for document in documents:
        kubernetes_validate.validate(document, "1.37", strict=True)


def test_the_role_reads_the_jobs_secret_by_name_only():
    """Listing or watching Secrets (or deleting them as a collection, which returns them) would let
    the launcher read every Secret of the namespace: the code names the job's own."""
    role = next(d for block in re.findall(r"```yaml\n(.*?)```", DOC, re.S) for d in yaml.safe_load_all(block)
                if d["kind"] == "Role")
    secrets = [rule for rule in role["rules"] if "secrets" in rule["resources"]]
    assert len(secrets) == 1 and sorted(secrets[0]["verbs"]) == ["create", "delete", "get", "patch"]


def test_the_connection_example_configures_a_kubernetes_launcher(tmp_path):
    extras = json.loads(re.search(r"--conn-extra '(\{.*?\})'", DOC, re.S).group(1))
    settings = settings_from_extras(extras, "dlrover_default")
    launcher = make_launcher(settings.launcher, str(tmp_path), settings.kubernetes)
    assert type(launcher).__name__ == "KubernetesLauncher"
    assert (launcher.namespace, launcher.placement.volume_claim, launcher.placement.data_volume_claim) == (
        "recsys-training", "dlrover-jobs", "criteo-days")
    assert settings.quota.cpu == 64
