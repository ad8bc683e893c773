from dataclasses import replace
import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import ALLREDUCE_TERMS, fit_throughput
from airflow_dlrover.optimizer.probes import (
    design_probes, next_probe, next_probe_cost_s, next_probe_in_budget, probe_sized, probes_always_measured,
    profile_apart, profile_continues, profile_is_partial,
)
from airflow_dlrover.optimizer.transitions import measured as measured_transitions
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError, Quota
from sim.synthetic import TRUE_THETA, model_samples

pytestmark = pytest.mark.unit


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
    shape = ["workers", "ps", "worker_cpu", "ps_cpu"]
    both = big.merge(plain, on=shape, suffixes=("", "_plain"))
    assert len(both) == len(big) and (big["ps_memory_mb"] >= need).all()
    assert (both["ps_memory_mb"] >= both["ps_memory_mb_plain"]).all()
    assert (big["workers"] * big["worker_memory_mb"] + big["ps"] * big["ps_memory_mb"] <= quota.memory_mb).all()
    with pytest.raises(InvalidInputError) as err:
        design_probes(Quota(cpu=8, memory_mb=4096), table_mb=6000.0)
    assert err.value.field == "memory" and "the layout's tables take 6,000 MB" in str(err.value)


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpu", [16, 64, 512])
def test_allreduce_probes_have_no_ps_and_identify_the_ring(cpu):
    import numpy as np
    import pandas as pd

    from sim.synthetic import ALLREDUCE_THETA, true_throughput

    quota = Quota(cpu=cpu, memory_mb=256 * 1024)
    probes = design_probes(quota, allreduce=True)
    assert list(probes.columns) == list(CONFIG_COLUMNS)
    assert (probes.ps == 0).all() and (probes.ps_cpu == 0).all() and (probes.ps_memory_mb == 0).all()
    assert set(probes.workers) <= set(C.PROBE_WORKERS) and set(probes.worker_cpu) <= set(C.PROBE_CPU)
    assert len(probes) == 5 + C.PROBES_BEYOND_PARAMETERS  # overhead, worker_compute, the ring's two, io
    assert not probes.duplicated().any() and probes.workers.nunique() >= 3 and probes.worker_cpu.nunique() >= 2
    assert (probes.workers * probes.worker_cpu <= max(cpu * C.PROBE_QUOTA_FRACTION, 2)).all()
    # Each probe's memory is shared over its workers alone (no PS takes a share).
    assert (probes.worker_memory_mb == quota.memory_mb * C.PROBE_QUOTA_FRACTION / probes.workers).all()
    configs = list(probes[["workers", "ps", "worker_cpu", "ps_cpu"]].itertuples(index=False, name=None))
    model = fit_throughput(model_samples(ALLREDUCE_THETA, configs), sharpness=1.0, leave_one_out=False)
    assert model.allreduce and {"allreduce", "allreduce_latency", "worker_compute", "overhead"} <= set(model.identified)
    elsewhere = pd.DataFrame([(3, 0, 2, 0), (16, 0, 1, 0), (6, 0, 0.5, 0)], columns=["workers", "ps", "worker_cpu", "ps_cpu"])
    np.testing.assert_allclose(model.predict(elsewhere, band=False), true_throughput(elsewhere, ALLREDUCE_THETA), rtol=1e-6)


def test_allreduce_probes_follow_the_prior_and_refuse_the_other_kind():
    from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA

    ar_prior = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS), leave_one_out=False)
    quota = Quota(64, 256 * 1024)
    probes = design_probes(quota, prior=ar_prior, count=3)  # the prior's kind
    assert len(probes) == 3 and (probes.ps == 0).all()
    memory = MemoryModel(None, None, 3000, 0.5)
    warm = design_probes(quota, prior=ar_prior, memory=memory, count=2)
    assert (warm.worker_memory_mb == memory.worker_request_mb(512)).all() and (warm.ps_memory_mb == 0).all()
    with pytest.raises(InvalidInputError) as err:
        design_probes(quota, prior=fit_throughput(model_samples(), leave_one_out=False), allreduce=True)
    assert err.value.field == "prior"
    with pytest.raises(InvalidInputError) as err:
        design_probes(quota, memory=MemoryModel(400, 8000, 900, 0.5), allreduce=True)
    assert err.value.field == "memory"


def test_allreduce_probes_fit_a_quota_too_small_for_a_ps_job_and_give_each_worker_the_tables():
    tiny = Quota(cpu=0.5, memory_mb=4096)
    probes = design_probes(tiny, allreduce=True)  # one worker of half a core: no PS to add
    assert len(probes) == 1 and (probes.workers * probes.worker_cpu <= 0.5).all()
    with pytest.raises(InvalidInputError):
        design_probes(tiny)
    quota = Quota(cpu=8, memory_mb=32_768)
    big = design_probes(quota, table_mb=6000.0, allreduce=True)
    need = (C.PS_PROCESS_BASE_MB + 6000.0) * (1 + C.MEMORY_MARGIN_FRACTION)
    assert (big.worker_memory_mb >= need).all() and (big.workers * big.worker_memory_mb <= quota.memory_mb).all()
    with pytest.raises(InvalidInputError) as err:
        design_probes(Quota(cpu=8, memory_mb=4096), table_mb=6000.0, allreduce=True)
    assert err.value.field == "memory" and "6,000 MB on every worker" in str(err.value)


def test_the_profile_budget_ends_a_short_jobs_profile_early_and_lets_a_long_one_finish():
    designed = 10  # eight parameters and two beyond
    assert probes_always_measured(designed) == designed - C.PROBES_BEYOND_PARAMETERS == 8
    assert probes_always_measured(5) == C.MIN_PROBES_COLD and probes_always_measured(3) == 3
    # MIN_PROBES_COLD always, whatever they cost; the rest of those that identify the parameters
    # while the profile stays within PROFILE_SHORT_JOB_FRACTION of the run (a partial fit past it)
    assert all(profile_continues(k, designed, 1e6, 1.0, 1e6) for k in range(C.MIN_PROBES_COLD))
    assert not any(profile_continues(k, designed, 1e6, 1.0, 1e6) for k in range(C.MIN_PROBES_COLD, designed))
    assert profile_is_partial(C.MIN_PROBES_COLD, designed) and not profile_is_partial(8, designed)
    # 4 probes in 360 s: a run of 1,500 s holds 375 s more at 25 %, 4,000 s 1,000 s
    assert not profile_continues(4, designed, 360.0, 1140 * 1e5, 1e5)
    assert profile_continues(4, designed, 360.0, 3640 * 1e5, 1e5)
    # 8 probes in 720 s, 4e8 samples left at 1e5 samples/s: a run of 4,720 s allows 236 s of profile.
    assert not profile_continues(8, designed, 720.0, 4e8, 1e5)
    # The same probes on a job 20× as long: 80 k s of run time allows 4 k s, so a ninth probe.
    assert profile_continues(8, designed, 720.0, 8e9, 1e5)
    # exactly at the budget: elapsed · (1 + 1/k) = f · (elapsed + left / X)
    elapsed, k = 800.0, 9
    left = (elapsed * (1 + 1 / k) / C.PROFILE_BUDGET_FRACTION - elapsed) * 1e5
    assert profile_continues(k, designed, elapsed, left, 1e5)
    assert not profile_continues(k, designed, elapsed, left * 0.999, 1e5)
    # never past the design, nor past a finished job's
    assert not profile_continues(designed, designed, 1.0, 1e12, 1.0)
    assert not profile_continues(8, designed, 100.0, 0.0, 1e5)


def _measured(configs, took_s, throughput=1e5):
    import pandas as pd

    return pd.DataFrame([dict(c.to_row(), throughput=throughput, probe_s=t) for c, t in zip(configs, took_s)])


def test_a_probes_cost_is_its_transition_plus_a_windows_own_time():
    table, state_mb = measured_transitions(), 10_000.0
    a, b, c = Configuration(2, 1, 1.0, 1.0, 2048, 2048), Configuration(4, 1, 1.0, 1.0, 2048, 2048), \
        Configuration(4, 2, 1.0, 1.0, 2048, 2048)
    rows = _measured([a, b], [table.cold_launch_s + 3.0, table.worker_join_s + 5.0])
    assert next_probe_cost_s(rows.iloc[:0], c) is None
    # the window's own time: the median of 3 s and 5 s past each probe's transition
    assert next_probe_cost_s(rows, c, table, state_mb=state_mb) == pytest.approx(
        table.ps_change_s + table.checkpoint_s(state_mb) + table.restore_s(state_mb) + 4.0)
    assert next_probe_cost_s(rows, replace(b, worker_cpu=2.0), table) == pytest.approx(table.node_relaunch_s + 4.0)


def test_past_the_identifying_probes_a_probe_behind_a_ps_change_gives_way_to_a_cheaper_one():
    table, state_mb = measured_transitions(), 20_000.0  # a PS change writes and reads 20 GB: ~130 s
    quota = Quota(cpu=256, memory_mb=1 << 20)
    head = [Configuration(w, 1, cpu, 1.0, 2048, 2048) for w in (1, 2, 4, 8) for cpu in (1.0, 2.0)]
    ps_change, cheap = Configuration(8, 4, 2.0, 1.0, 2048, 2048), Configuration(16, 1, 2.0, 1.0, 2048, 2048)
    order = (*head, ps_change, cheap)
    assert probes_always_measured(len(order)) == len(head)
    rows = _measured(head, [table.cold_launch_s + 3.0] + [table.worker_join_s + 3.0] * 7)
    elapsed = float(rows["probe_s"].sum())
    kwargs = dict(transitions=table, state_mb=state_mb)
    ps_change_s = next_probe_cost_s(rows, ps_change, **kwargs)
    cheap_s = next_probe_cost_s(rows, cheap, **kwargs)
    assert ps_change_s > 100.0 > 10.0 > cheap_s

    def left_for(budget_s):  # the samples left at 1e5 samples/s for which the profile may take budget_s
        return (budget_s / C.PROFILE_BUDGET_FRACTION - elapsed) * 1e5

    # a long job: the most informative first, PS change and all
    long_job = left_for(elapsed + ps_change_s) * 1.001
    assert next_probe_in_budget(order, 8, rows, quota, samples_left=long_job, **kwargs) == (order, ps_change, False)
    # a shorter one: the PS change passes the budget, the cheaper probe is taken in its place
    left = left_for(elapsed + cheap_s)
    assert next_probe_in_budget(order, 8, rows, quota, samples_left=left * 1.001, **kwargs) == (
        (*head, cheap, ps_change), cheap, False)
    # shorter still: neither fits, the budget ends the profile
    assert next_probe_in_budget(order, 8, rows, quota, samples_left=left * 0.99, **kwargs) == (order, None, True)
    # the same job planned at 4× the best probe's rate runs a quarter as long: no room for the PS change
    best = float(rows["throughput"].max())
    assert next_probe_in_budget(order, 8, rows, quota, samples_left=long_job, run_throughput=4 * best, **kwargs) == (
        (*head, cheap, ps_change), cheap, False)
    # every probe measured: nothing left, not the budget's doing
    assert next_probe_in_budget(order, 10, _measured(order, [5.0] * 10), quota, samples_left=1e12, **kwargs) == (
        order, None, False)


def test_an_identifying_probe_is_not_skipped_for_a_cheaper_one():
    table, state_mb = measured_transitions(), 20_000.0
    quota = Quota(cpu=256, memory_mb=1 << 20)
    order = tuple(Configuration(w, ps, 1.0, 1.0, 2048, 2048) for w, ps in
                  ((1, 1), (2, 1), (4, 1), (4, 8), (8, 1), (8, 8), (16, 8), (16, 1)))
    rows = _measured(order[:4], [table.cold_launch_s + 3.0, 4.0, 4.0, 140.0])
    # the job is too short for the fifth, a PS change back: the profile ends (a partial fit), even
    # though the sixth would fit
    short = (float(rows["probe_s"].sum()) + 50.0) / C.PROFILE_SHORT_JOB_FRACTION * 1e5
    assert next_probe_in_budget(order, 4, rows, quota, samples_left=short, transitions=table,
                                state_mb=state_mb) == (order, None, True)
    # without a job size (a run of unknown length) the profile goes on in order
    assert next_probe_in_budget(order, 4, rows, quota, samples_left=None, transitions=table,
                                state_mb=state_mb) == (order, order[4], False)


def test_a_profile_goes_apart_when_the_ps_changes_would_move_more_than_the_stand_in_throws_away():
    probes = design_probes(Quota(cpu=64, memory_mb=256 * 1024))
    identifying = probes.iloc[:probes_always_measured(len(probes))]
    changes = identifying["ps"].nunique() - 1  # the cheapest order visits each PS count once
    assert changes >= 1
    # only a PS change's writing and reading back of the state costs; the stand-in's own launch costs c
    free = {name: 0.0 for name in ("relaunch_s", "worker_join_s", "worker_leave_s", "cpu_in_place_s",
                                   "memory_in_place_s", "node_relaunch_s", "ps_change_s", "ps_recovery_s")}
    table = replace(measured_transitions(), **free, cold_launch_s=7.0, checkpoint_mb_per_s=100.0,
                    restore_mb_per_s=400.0)
    window_s = 2.0
    # changes · S · (1/100 + 1/400) > n · window + c, at S = 80 · (n · window + c) / changes
    boundary_mb = 80.0 * (len(identifying) * window_s + table.cold_launch_s) / changes
    assert not profile_apart(probes, table, state_mb=boundary_mb * 0.99, window_s=window_s)
    assert profile_apart(probes, table, state_mb=boundary_mb * 1.01, window_s=window_s)
    assert not profile_apart(probes, table, state_mb=0.0, window_s=window_s)  # nothing to move
    # on the runtime's measured table: a job continuing 20 GB of tables goes apart, one of 100 MB does not
    assert profile_apart(probes, state_mb=20_000.0) and not profile_apart(probes, state_mb=100.0)


def test_each_probe_shares_the_probe_memory_over_its_own_nodes():
    quota = Quota(cpu=64, memory_mb=65_536)
    probes = design_probes(quota)
    nodes = probes.workers + probes.ps
    assert probes.workers.nunique() >= 2
    assert (probes.worker_memory_mb == probes.ps_memory_mb).all()
    assert (probes.worker_memory_mb * nodes <= quota.memory_mb * C.PROBE_QUOTA_FRACTION).all()
    half = quota.memory_mb * C.PROBE_QUOTA_FRACTION
    assert (probes.worker_memory_mb * nodes > half - nodes * C.MEMORY_GRANULARITY_MB).all()


def test_a_probe_is_sized_to_what_the_earlier_probes_used():
    import pandas as pd

    quota = Quota(cpu=16, memory_mb=32_768)
    probe = Configuration(8, 2, 1.0, 1.0, 1024.0, 1024.0)
    assert probe_sized(probe, pd.DataFrame(), quota) == probe  # nothing measured yet: the design's
    measured = pd.DataFrame([
        dict(Configuration(2, 1, 1.0, 1.0, 4096.0, 4096.0).to_row(), worker_memory_used_mb=1500.0,
             ps_memory_used_mb=3000.0),
        dict(Configuration(2, 2, 1.0, 1.0, 2048.0, 2048.0).to_row(), worker_memory_used_mb=1400.0,
             ps_memory_used_mb=1600.0),
    ])
    sized = probe_sized(probe, measured, quota)
    # the workers' peak on any probe, the PS's on the probes with as many PS; each + its margin
    assert sized.worker_memory_mb == 1728.0 and sized.ps_memory_mb == 1840.0  # ⌈1.15 · peak / 16⌉ · 16
    assert sized.to_row() | {"worker_memory_mb": 0, "ps_memory_mb": 0} == probe.to_row() | {
        "worker_memory_mb": 0, "ps_memory_mb": 0}
    # never below the design's; a PS count not measured yet keeps the design's PS memory
    assert probe_sized(Configuration(1, 4, 1.0, 1.0, 2048.0, 1024.0), measured, quota).to_row() == Configuration(
        1, 4, 1.0, 1.0, 2048.0, 1024.0).to_row()
    # a job without PS usage (an all-reduce trainer) is sized from its workers alone
    allreduce = pd.DataFrame([dict(Configuration(2, 0, 1.0, 0.0, 2048.0, 0.0).to_row(), worker_memory_used_mb=3000.0,
                                   ps_memory_used_mb=float("nan"))])
    assert probe_sized(Configuration(4, 0, 1.0, 0.0, 1024.0, 0.0), allreduce, quota).worker_memory_mb == 3456.0
    # a probe that, so sized, passes the quota's memory is not run
    assert probe_sized(Configuration(16, 0, 1.0, 0.0, 1024.0, 0.0), allreduce, quota) is None
    # ... and leaves the design: the next probe is measured in its place
    order = [Configuration(2, 0, 1.0, 0.0, 2048.0, 0.0), Configuration(16, 0, 1.0, 0.0, 1024.0, 0.0),
             Configuration(4, 0, 1.0, 0.0, 1024.0, 0.0)]
    left, probe = next_probe(tuple(order), 1, allreduce, quota)
    assert probe == Configuration(4, 0, 1.0, 0.0, 3456.0, 0.0)
    assert [c.workers for c in left] == [2, 4] and next_probe(left[:1], 1, allreduce, quota) == (left[:1], None)
