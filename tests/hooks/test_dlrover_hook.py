import json
import logging

import pytest

from airflow_dlrover.hooks.dlrover import DLRoverHook, DLRoverSettings, settings_from_extras
from airflow_dlrover.optimizer.types import InvalidInputError, Quota

pytestmark = pytest.mark.unit


def _env_connection(monkeypatch, conn_id, extra, conn_type="dlrover"):
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, "extra": extra}))


def test_connection_extras_configure_launcher_history_and_quota(monkeypatch):
    _env_connection(monkeypatch, "my_dlrover", {
        "launcher": "kubernetes", "kubernetes_conn_id": "k8s", "namespace": "recsys", "image": "reg/dlrover:1",
        "history_url": "postgresql://h/db", "quota_cpu": 64, "quota_memory": "256Gi", "quota_max_nodes": 40,
    })
    settings = DLRoverHook("my_dlrover").settings
    assert settings == DLRoverSettings(
        launcher="kubernetes", kubernetes={"kubernetes_conn_id": "k8s", "namespace": "recsys", "image": "reg/dlrover:1"},
        history_url="postgresql://h/db", quota=Quota(64.0, 256 * 1024.0, 0, 40),
    )


def test_default_connection_may_be_absent():
    assert DLRoverHook().settings == DLRoverSettings()


def test_named_connection_must_exist():
    with pytest.raises(InvalidInputError) as err:
        _ = DLRoverHook("no_such_connection").settings
    assert err.value.field == "dlrover_conn_id"


def test_unknown_extras_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        settings = settings_from_extras({"launcher": "local", "command": "rm -rf /"}, "c")
    assert settings == DLRoverSettings()
    assert "ignoring unknown extra fields ['command']" in caplog.text


@pytest.mark.parametrize(
    "extras, field",
    [
        ({"launcher": "slurm"}, "connection c: launcher"),
        ({"quota_cpu": 8}, "connection c: quota"),
        ({"quota_cpu": 8, "quota_memory": "lots"}, "connection c: quota_memory"),
        ({"quota_cpu": -1, "quota_memory": "1Gi"}, "connection c: quota_cpu"),
    ],
)
def test_bad_extras_name_the_field(extras, field):
    with pytest.raises(InvalidInputError) as err:
        settings_from_extras(extras, "c")
    assert err.value.field == field


def test_wrong_connection_type_is_refused(monkeypatch):
    _env_connection(monkeypatch, "not_ours", {}, conn_type="http")
    ok, message = DLRoverHook("not_ours").test_connection()
    assert not ok and "conn_type" in message


def test_history_store_comes_from_the_connection(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _env_connection(monkeypatch, "with_history", {"history_url": url})
    store = DLRoverHook("with_history").get_history()
    assert store.url == url
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert DLRoverHook().get_history().url == f"sqlite:///{tmp_path / 'home' / 'dlrover_history.db'}"


def test_an_unreachable_metadata_api_is_not_taken_for_an_absent_connection(monkeypatch):
    """Only a missing connection means the embedded defaults; a metadata-API error propagates (the
    task is retried), so a Kubernetes job never becomes a local one on a hiccup."""
    def unreachable(cls, conn_id):
        raise ConnectionError("api-server: connection refused")

    monkeypatch.setattr(DLRoverHook, "get_connection", classmethod(unreachable))
    with pytest.raises(ConnectionError):
        _ = DLRoverHook().settings
