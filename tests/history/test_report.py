import pytest

from airflow_dlrover.history.report import profiling_cost_s

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
