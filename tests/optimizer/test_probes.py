import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import ALLREDUCE_TERMS, fit_throughput
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, InvalidInputError, Quota
from synthetic import TRUE_THETA, model_samples


@pytest.mark.parametrize("cpu", [16, 64, 512])
def test_cold_design_identifies_every_cpu_parameter_cheaply(cpu):
    quota = Quota(cpu=cpu, memory_mb=256 * 1024)
    probes = design_probes(quota)
    assert list(probes.columns) == list(CONFIG_COLUMNS)
    assert len(probes) == 8 + C.PROBES_BEYOND_PARAMETERS  # eight CPU parameters
    cores = probes.workers * probes.worker_cpu + probes.ps * probes.ps_cpu
    assert (cores <= max(cpu * C.PROBE_QUOTA_FRACTION, 2)).all()
    assert not probes.duplicated().any()
    for column in ("workers", "ps", "worker_cpu", "ps_cpu"):
        assert probes[column].nunique() >= 2, column
    memory = probes.workers * probes.worker_memory_mb + probes.ps * probes.ps_memory_mb
    assert (memory <= quota.memory_mb * C.PROBE_QUOTA_FRACTION).all()
    # Noiseless samples at exactly these probes recover the model: nothing but the GPU (and the
    # all-reduce terms, which a PS job has not) is pinned.
    configs = list(probes[["workers", "ps", "worker_cpu", "ps_cpu"]].itertuples(index=False, name=None))
    model = fit_throughput(model_samples(configs=configs), sharpness=1.0, leave_one_out=False)
    assert set(model.report.pinned) == {"gpu_compute", *ALLREDUCE_TERMS}
    for name, value in TRUE_THETA.items():
        assert model.params[name] == pytest.approx(value, rel=0.01, abs=1e-12)


def test_a_tiny_probing_budget_reports_what_it_cannot_identify():
    probes = design_probes(Quota(cpu=1.5, memory_mb=64 * 1024))  # a small quota: probes may use all of it
    assert len(probes) == 5  # every configuration that fits
    configs = list(probes[["workers", "ps", "worker_cpu", "ps_cpu"]].itertuples(index=False, name=None))
    model = fit_throughput(model_samples(configs=configs), sharpness=1.0, leave_one_out=False)
    assert set(model.report.pinned) == {"gpu_compute", "network", "contention", "io", *ALLREDUCE_TERMS}
    assert model.report.pinned["io"] == "5 configurations cannot identify every parameter; set to 0"


def test_a_warm_start_profiles_nothing_and_a_counted_warm_design_uses_the_prior_memory():
    prior = fit_throughput(model_samples(), leave_one_out=False)
    memory = MemoryModel(400, 8000, 900, 0.5)
    quota = Quota(64, 256 * 1024)
    warm = design_probes(quota, prior=prior, memory=memory)
    assert C.MIN_PROBES_WARM == 0 and warm.empty and list(warm.columns) == list(CONFIG_COLUMNS)
    # Without the prior's memory model a plan could not size the nodes: a full (cold-sized) design.
    assert len(design_probes(quota, prior=prior)) == len(design_probes(quota))
    probes = design_probes(quota, prior=prior, memory=memory, count=3)
    assert len(probes) == 3 and (probes.ps_memory_mb == memory.ps_request_mb(probes.ps)).all()


def test_gpu_design_and_errors():
    probes = design_probes(Quota(64, 256 * 1024, gpu=8), worker_gpu=1)
    assert (probes.worker_gpu == 1).all() and (probes.workers <= 8).all()
    with pytest.raises(InvalidInputError) as err:
        design_probes(Quota(64, 256 * 1024, gpu=0), worker_gpu=1)
    assert err.value.field == "worker_gpu"
    with pytest.raises(InvalidInputError) as err:
        design_probes(Quota(0.5, 4096))
    assert err.value.field == "cpu"


def test_cold_probes_give_each_ps_its_share_of_the_layouts_tables():
    quota = Quota(cpu=8, memory_mb=32_768)
    plain = design_probes(quota)
    big = design_probes(quota, table_mb=6000.0)  # 26 tables of 1M rows, dim 16, partly
    need = (C.PS_PROCESS_BASE_MB + 6000.0 / big["ps"]) * (1 + C.MEMORY_MARGIN_FRACTION)
    assert (big["ps_memory_mb"] >= need).all() and (big["ps_memory_mb"] >= plain["ps_memory_mb"].max()).all()
    assert (big["workers"] * big["worker_memory_mb"] + big["ps"] * big["ps_memory_mb"] <= quota.memory_mb).all()
    with pytest.raises(InvalidInputError) as err:
        design_probes(Quota(cpu=8, memory_mb=4096), table_mb=6000.0)
    assert err.value.field == "memory" and "the layout's tables take 6,000 MB" in str(err.value)
