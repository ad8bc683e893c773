"""The model Asset event's ``extra``, from a finished job's summary."""

import math

import pytest

from airflow_dlrover.operators.report import model_event

pytestmark = pytest.mark.unit

JOB = {"export": "/models/2026-11-02", "eval_auc": 0.7123, "eval_loss": 0.4512, "samples_trained": 1_200_000}


def test_the_event_carries_the_model_and_the_one_it_continued_from():
    previous = {"uri": "/models/2026-11-01", "auc": 0.7051, "loss": 0.4601, "samples": 8000}
    assert model_event({**JOB, "previous_model": previous}, 7, "scheduled__2026-11-02") == {
        "uri": "/models/2026-11-02", "auc": 0.7123, "log_loss": 0.4512, "previous_uri": "/models/2026-11-01",
        "previous_auc": 0.7051, "previous_log_loss": 0.4601, "samples_trained": 1_200_000,
        "dag_run": "scheduled__2026-11-02", "run": 7}


@pytest.mark.parametrize("previous", [None, {}])
def test_without_a_previous_model_its_fields_are_none(previous):
    event = model_event({**JOB, "previous_model": previous}, 7, "manual")
    assert event["previous_uri"] is event["previous_auc"] is event["previous_log_loss"] is None
    assert event["auc"] == 0.7123 and event["uri"] == "/models/2026-11-02"
    assert model_event(JOB, 7, "manual") == event  # a summary without the key


def test_a_trainer_report_and_undefined_metrics():
    event = model_event({"auc": 0.66, "loss": math.nan, "previous_model": {"uri": "u", "auc": math.nan}}, 1, "m")
    assert event["auc"] == 0.66 and event["log_loss"] is None and event["uri"] is None
    assert event["previous_uri"] == "u" and event["previous_auc"] is None and event["previous_log_loss"] is None
