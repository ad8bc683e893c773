import math

import pytest

from airflow_dlrover.history.report import format_report, model_comparison, profiling_cost_s

pytestmark = pytest.mark.unit


def test_profiling_costs_its_time_less_the_plan_time_of_what_the_job_trained_meanwhile():
    # 40 s of probes trained 1.2 M samples, a 10 s plan check 0.45 M; the plan trains 50,000/s
    assert profiling_cost_s([(40.0, 1_200_000), (10.0, 450_000)], 50_000.0) == pytest.approx(16.0 + 1.0)
    # a stage that trained faster than the plan costs nothing, and lends nothing to the others
    assert profiling_cost_s([(40.0, 1_200_000), (10.0, 900_000)], 50_000.0) == pytest.approx(16.0)
    assert profiling_cost_s([(0.0, None)], 50_000.0) == 0.0  # a warm start: no probe


@pytest.mark.parametrize("stages, throughput", [([(40.0, 1e6)], None), ([(40.0, 1e6), (10.0, None)], 5e4)])
def test_profiling_cost_is_unknown_without_the_plan_speed_or_a_stage_samples(stages, throughput):
    assert profiling_cost_s(stages, throughput) is None


JOB = {"trainer": False, "samples_trained": 1_200_000, "samples_expected": 1_200_000, "samples_lost": 0,
       "samples_duplicated": 0, "restarts": 0, "eval_loss": 0.4512, "eval_auc": 0.7123, "eval_samples": 8000,
       "export": "/models/2026-11-02"}
PLAN = {"workers": 2, "ps": 1, "worker_cpu": 0.5, "ps_cpu": 0.5, "worker_memory_mb": 2048, "ps_memory_mb": 2048,
        "worker_gpu": 0, "batch_size": 512, "reason": "throughput"}
PREVIOUS = {"uri": "/models/2026-11-01", "auc": 0.7051, "loss": 0.4601, "samples": 8000}


def report_of(job):
    """A minimal report of a run that trained ``job`` (what ``format_report`` reads)."""
    return {"status": "succeeded", "jct_s": 60.0, "profile_s": 0.0, "profile_share": 0.0, "probes": 0,
            "warm_start": True, "plan": PLAN, "baseline": None, "predicted_throughput": None,
            "measured_throughput": None, "utilisation": {}, "decisions": [], "resizes": 0, "failures": [],
            "recoveries": [], "instability": [], "job": job, "model_comparison": model_comparison(job)}


def test_the_report_compares_today_with_the_previous_model_on_the_same_rows():
    job = {**JOB, "previous_model": PREVIOUS}
    comparison = model_comparison(job)
    assert comparison == {"previous_uri": "/models/2026-11-01", "samples": 8000, "auc": 0.7123, "log_loss": 0.4512,
                          "previous_auc": 0.7051, "previous_log_loss": 0.4601,
                          "auc_change": pytest.approx(0.0072), "log_loss_change": pytest.approx(-0.0089)}
    lines = format_report(report_of(job))
    assert ("today vs the previous model (/models/2026-11-01) on today's 8,000 held-out rows: "
            "AUC 0.7123 vs 0.7051 (+0.0072), log loss 0.4512 vs 0.4601 (-0.0089)") in lines


def test_without_a_previous_model_there_is_no_comparison():
    assert model_comparison(JOB) is None and model_comparison({**JOB, "previous_model": None}) is None
    assert model_comparison(None) is None
    lines = format_report(report_of(JOB))
    assert not any("previous model" in line for line in lines)
    assert any("model exported to /models/2026-11-02" in line for line in lines)
    older = report_of(JOB)
    del older["model_comparison"]  # a run reported before the comparison was
    assert format_report(older) == lines


def test_an_undefined_metric_has_no_change():
    job = {**JOB, "eval_auc": math.nan, "previous_model": {**PREVIOUS, "loss": None}}
    comparison = model_comparison(job)
    assert comparison["auc_change"] is None and comparison["log_loss_change"] is None
    line = next(line for line in format_report(report_of(job)) if "previous model" in line)
    assert line.endswith("AUC — vs 0.7051, log loss 0.4512 vs —")
