"""The cluster simulator: work conservation, quota refusal, the run-time bound, reproducibility, CLI."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import sim.cluster

from sim.cli import main
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import Probe, begin
from airflow_dlrover.optimizer.types import Configuration, Phase
from airflow_dlrover.optimizer.finetune import shape
from airflow_dlrover.optimizer.transitions import measured as measured_transitions
from airflow_dlrover.timings import PROBE_REPORT_INTERVAL_S, REPORT_INTERVAL_S, SUPERVISOR_POLL_S
from sim.bound import bound_table, check, peak_throughput
from sim.cluster import CheckPlan, Cluster, Policy, QuotaExceededError, Resize, SetHotPsCpu, Start, rate_factor
from sim.dlrover_bridge import DLRoverUnavailable, default_venv, venv_python
from sim.policies import OursPolicy, make_policy, planner_configurations
from sim.run import SUMMARY_COLUMNS, run_policy, summarise
from sim.truth import BATCH, AllReduce, MovingHotShard, QueueingTable, Roofline, measured_roofline
from sim.workload import SimConfig, generate_trace

pytestmark = pytest.mark.unit

SMALL = SimConfig(jobs=24, seed=3, cluster_cpu=1500.0, cluster_memory_mb=6e6)
HAS_DLROVER = venv_python(default_venv()).exists()


@pytest.fixture(scope="module")
def small_run():
    """``small_run(policy)``: ``run_policy(SMALL, policy)``, run once per policy for the module and
    read by every test that needs it (a run is deterministic: ``test_seeds_reproduce_exactly``)."""
    runs = {}

    def run(policy):
        if policy not in runs:
            runs[policy] = run_policy(SMALL, policy)
        return runs[policy]

    return run


@pytest.mark.parametrize("policy", ["user", "user-adapts", "ours", "oracle", "oracle-jct"])
def test_work_is_conserved(policy, small_run):
    run = small_run(policy)
    jobs = run.jobs
    assert len(jobs) == SMALL.jobs
    done = jobs[jobs["status"] == "done"]
    assert len(done) > 0
    trace = {spec.id: spec for spec in generate_trace(SMALL)}
    # Every sample trained exactly once in the final lineage; the rolled-back ones again.
    assert np.allclose(done["trained_samples"], done["samples"] + done["wasted_samples"], rtol=1e-9)
    assert (jobs["wasted_samples"] >= 0).all()
    for _, row in done.iterrows():
        assert row["samples"] == trace[row["job"]].samples
    assert (done["jct_s"] > 0).all()
    assert ((jobs["cpu_util"] <= 1.0 + 1e-9) | jobs["cpu_util"].isna()).all()


def test_failures_roll_back_to_the_checkpoint_and_are_retrained():
    cfg = replace(SMALL, node_failure_per_node_hour=0.05)
    jobs = run_policy(cfg, "user").jobs
    assert jobs["failures"].sum() > 0 and jobs["wasted_samples"].sum() > 0
    done = jobs[jobs["status"] == "done"]
    assert np.allclose(done["trained_samples"], done["samples"] + done["wasted_samples"])


class Greedy(Policy):
    name = "greedy"

    def start(self, job):
        return Start(config=Configuration(int(job.limit.cpu), 1, 1.0, 1.0, 1024.0, 1024.0, 0, 512))


def test_a_policy_allocating_beyond_the_quota_is_refused():
    trace = generate_trace(SMALL)[:3]
    with pytest.raises(QuotaExceededError, match=r"policy 'greedy', job 0: cpu.*the allocation was refused"):
        Cluster(SMALL, trace, Greedy()).run()


def test_a_start_that_does_not_fit_now_waits_in_the_queue():
    cfg = replace(SMALL.without_instability(), cluster_cpu=100.0, cluster_memory_mb=2e6)

    class Fixed(Policy):
        name = "fixed"

        def start(self, job):
            return Start(config=Configuration(4, 2, 8.0, 8.0, 4096.0, 65536.0, 0, 512))  # 48 cores

    jobs = Cluster(cfg, generate_trace(cfg)[:10], Fixed()).run()
    assert all(job.phase == "done" for job in jobs)
    assert max(job.queue_s for job in jobs) > 0  # two fit in 100 cores at once


#: The default scenario (instability on, contention on) at a tenth of its jobs on a tenth of its cluster.
DEFAULT_TENTH = SimConfig(jobs=100, seed=5, cluster_cpu=SimConfig().cluster_cpu / 10,
                          cluster_memory_mb=SimConfig().cluster_memory_mb / 10)


@pytest.fixture(scope="module")
def default_tenth():
    """DEFAULT_TENTH's trace, its bound per job, and ``run(policy)``: that policy's jobs table on the
    trace, run once per module (the DLRover policy needs its venv: it skips without it)."""
    cfg = DEFAULT_TENTH
    assert cfg.instability and cfg.rate_noise > 0
    trace = generate_trace(cfg)
    runs = {}

    def run(policy):
        if policy not in runs:
            if policy != "dlrover":
                runs[policy] = run_policy(cfg, policy, trace=trace).jobs
            elif not HAS_DLROVER:
                pytest.skip(f"no dlrover venv at {default_venv()} (make dlrover-venv)")
            else:
                from sim.dlrover_bridge import DLRoverBridge

                with DLRoverBridge() as bridge:
                    runs[policy] = run_policy(cfg, policy, trace=trace, bridge=bridge).jobs
        return runs[policy]

    return bound_table(cfg, trace), run


@pytest.mark.parametrize("policy", ["user", "user-adapts", "ours", "oracle", "oracle-jct",
                                    pytest.param("dlrover", marks=pytest.mark.jobs)])
def test_no_policy_beats_the_bound_on_any_job(policy, default_tenth):
    """The bound (sim.bound) is one: per job, run time and JCT at or above it, exactly, for every
    policy on the default scenario's settings; and X* is at or above every true rate any job ran at."""
    bounds, run = default_tenth
    jobs = run(policy)
    bound = np.array([bounds[job][0] for job in jobs["job"]])
    peak = np.array([bounds[job][1] for job in jobs["job"]])
    assert (jobs["bound_run_s"].to_numpy() == bound).all()
    assert (jobs["peak_true_rate"].to_numpy() <= peak).all()
    assert (jobs["run_s"].to_numpy() >= bound).all()
    assert (jobs["jct_s"].to_numpy() >= bound).all()
    assert (jobs["status"] == "done").mean() > 0.8


def test_the_bound_is_met_closely_on_a_contended_cluster(default_tenth):
    """Not vacuous: the cluster is contended, and the policies come within a few % of the bound on some jobs."""
    bounds, run = default_tenth
    runs = [run(policy) for policy in ("user", "ours", "oracle")]
    assert sum((jobs["queue_s"] > 0).sum() for jobs in runs) > 0
    best = np.minimum.reduce([jobs["run_s"].to_numpy() for jobs in runs])
    assert np.min(best / np.array([bounds[job][0] for job in runs[0]["job"]])) < 1.2


def _brute_force(truth, limit, allreduce, rng, n=200_000):
    """The largest truth over the planner's range within ``limit`` and ``n`` random configurations on
    the budget line (continuous per-node CPU, any counts of the domain)."""
    grid = planner_configurations(limit, allreduce)
    best = float(np.max(truth.throughput(grid.workers, grid.ps, grid.worker_cpu, grid.ps_cpu)))
    if allreduce:
        w = rng.integers(1, min(C.PLAN_MAX_WORKERS, int(limit / 0.5)) + 1, n).astype(float)
        lw = rng.uniform(0.5, limit / w)
        return max(best, float(np.max(truth.throughput(w, 0.0, lw, 0.0))))
    # counts: n uniform over w ≤ 128, p ≤ 64 (where the queueing tables vary), n log-uniform over the
    # whole domain (w ≤ 1,024, p ≤ 256)
    w = np.r_[rng.integers(1, 129, n), np.floor(np.exp(rng.uniform(0.0, np.log(C.PLAN_MAX_WORKERS + 1), n)))]
    p = np.r_[rng.integers(1, 65, n), np.floor(np.exp(rng.uniform(0.0, np.log(C.PLAN_MAX_PS + 1), n)))]
    w, p = w[(w + p) * 0.5 <= limit], p[(w + p) * 0.5 <= limit]
    lw = 0.5 * np.exp(rng.uniform(0.0, np.log((limit - 0.5 * p) / w / 0.5)))
    lp = (limit - w * lw) / p
    inside = rng.random(len(w)) < 0.3  # some strictly inside the budget
    lp = np.where(inside, 0.5 + (lp - 0.5) * rng.random(len(w)), lp)
    return max(best, float(np.max(truth.throughput(w, p, lw, lp))))


@pytest.mark.parametrize("truth", [QueueingTable("default", scale=1.7), QueueingTable("hot_shard"),
                                   QueueingTable("net_bound"), replace(measured_roofline()[0], scale=0.12),
                                   Roofline(), Roofline(io=3e5, gamma=0.01, ratio=8.0, skew=1.1),
                                   AllReduce(model_bytes=5e7, rack=4.0), MovingHotShard(seed=3, day=2)],
                         ids=lambda t: t.family)
def test_the_bounds_peak_throughput_is_the_max_of_a_brute_force_search(truth):
    rng = np.random.default_rng(0)
    for limit in (64.0, 208.0):
        peak = peak_throughput(truth, limit)
        brute = _brute_force(truth, limit, isinstance(truth, AllReduce), rng)
        assert brute <= peak <= brute * 1.01, (limit, brute, peak)


def test_the_monotone_truths_grow_with_per_node_cpu():
    """The bound's upper estimate for rooflines, all-reduce and the moving shard takes a box's top corner: valid as
    these truths never fall when a node gets more CPU."""
    rng = np.random.default_rng(1)
    w, p = rng.integers(1, C.PLAN_MAX_WORKERS + 1, 5000), rng.integers(1, C.PLAN_MAX_PS + 1, 5000)
    lw, lp = rng.uniform(0.5, 40, 5000), rng.uniform(0.5, 40, 5000)
    more = rng.uniform(1.0, 3.0, 5000)
    for truth in (Roofline(), Roofline(io=3e5, gamma=0.02, skew=0.8), measured_roofline()[0], AllReduce(),
                  MovingHotShard(seed=3), MovingHotShard(seed=4, day=5, lock_cores=1.0)):
        base = truth.throughput(w, p, lw, lp)
        assert (truth.throughput(w, p, lw * more, lp) >= base).all()
        assert (truth.throughput(w, p, lw, lp * more) >= base).all()


def test_the_realised_rate_noise_is_common_to_every_policy():
    trace = generate_trace(SMALL)
    factors = [rate_factor(SMALL, spec) for spec in trace]
    assert factors == [rate_factor(SMALL, spec) for spec in generate_trace(SMALL)]
    assert 0.0 < np.std(np.log(factors)) < 2 * SMALL.rate_noise
    assert rate_factor(replace(SMALL, rate_noise=0.0), trace[0]) == 1.0
    oracle = run_policy(SMALL.without_instability(), "oracle").jobs
    user = run_policy(SMALL.without_instability(), "user").jobs
    assert (oracle["bound_run_s"] == user["bound_run_s"]).all()


def test_a_run_faster_than_x_star_fails_the_check():
    trace = generate_trace(SMALL)[:3]
    bounds = bound_table(SMALL, trace)
    table = pd.DataFrame({"job": [s.id for s in trace], "peak_true_rate": [bounds[s.id][1] for s in trace]})
    check("p", table, bounds)  # at X*: fine
    table.loc[1, "peak_true_rate"] *= 1.0001
    with pytest.raises(AssertionError, match=r"policy 'p', job .*above the bound's X\*"):
        check("p", table, bounds)


def test_seeds_reproduce_exactly(small_run):
    a = small_run("ours").jobs
    b = run_policy(SMALL, "ours").jobs
    pd.testing.assert_frame_equal(a, b)
    c = run_policy(replace(SMALL, seed=4), "ours").jobs
    assert not a["jct_s"].equals(c["jct_s"])


def test_identical_traces_for_every_policy():
    first, second = generate_trace(SMALL), generate_trace(SMALL)
    assert [(j.arrival_s, j.samples, j.hot_ps_at, j.family.user) for j in first] == \
        [(j.arrival_s, j.samples, j.hot_ps_at, j.family.user) for j in second]


def test_summary_metrics(small_run):
    table = small_run("user").jobs
    row = summarise(table)
    assert list(row) == list(SUMMARY_COLUMNS)
    assert 0 < row["cpu_util"] < 1 and 0 < row["mem_util"] < 1
    assert row["median_jct_s"] <= row["p90_jct_s"]


def test_cli_writes_the_files_with_the_exact_columns(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["--jobs", "12", "--seed", "2", "--policies", "user,oracle", "--out", str(out),
                 "--cluster-cpu", "1500", "--processes", "1"]) == 0
    printed = capsys.readouterr().out
    assert "median_jct_s" in printed and "oracle" in printed
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == ["policy", "median_jct_s", "p90_jct_s", "median_run_s", "cpu_util", "mem_util",
                                     "completion_rate", "resource_hours", "queue_delay_s"]
    assert list(summary["policy"]) == ["user", "oracle", "bound"]
    assert "n/a" in printed  # the bound has no utilisation
    jobs = pd.read_csv(out / "jobs.csv")
    assert len(jobs) == 24 and set(jobs["policy"]) == {"user", "oracle"}
    assert (jobs["run_s"] >= jobs["bound_run_s"]).all()
    for name in ("jct_cdf.png", "utilisation.png", "summary_ci.csv", "utilisation.csv"):
        assert (out / name).stat().st_size > 0


@pytest.mark.jobs
def test_policies_run_side_by_side_as_they_run_one_after_the_other():
    """``simulate`` with a pool (the policies and the jobs' bounds in parallel) gives the serial
    run's tables: every job's outcome and its ``bound_run_s``, filled and checked."""
    from sim.run import simulate

    cfg = replace(SMALL, jobs=10)
    summary, _, serial = simulate(cfg, ["user", "oracle"], processes=1, resamples=20)
    pooled_summary, _, pooled = simulate(cfg, ["user", "oracle"], processes=2, resamples=20)
    for one, other in zip(serial, pooled):
        pd.testing.assert_frame_equal(one.jobs, other.jobs, check_exact=True)
        assert one.jobs["bound_run_s"].notna().all()
    pd.testing.assert_frame_equal(summary, pooled_summary, check_exact=True)


def test_cli_rejects_an_unknown_policy(tmp_path, capsys):
    assert main(["--jobs", "5", "--policies", "user,magic", "--out", str(tmp_path)]) == 2
    assert "policies='magic'" in capsys.readouterr().err


def test_dlrover_without_its_venv_names_the_setup_command(tmp_path, capsys):
    missing = tmp_path / "no-venv"
    assert main(["--jobs", "5", "--policies", "dlrover", "--out", str(tmp_path),
                 "--dlrover-venv", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "dlrover==0.6.1" in err and "--setup-dlrover" in err and str(missing) in err


@pytest.mark.jobs
@pytest.mark.skipif(not HAS_DLROVER, reason=f"no dlrover venv at {default_venv()} (make dlrover-venv)")
def test_dlrover_policy_drives_the_real_package():
    from sim.dlrover_bridge import DLRoverBridge

    with DLRoverBridge() as bridge:
        assert bridge.version == "0.6.1"
        run = run_policy(SMALL, "dlrover", bridge=bridge)
        assert bridge.calls > SMALL.jobs  # it was asked, job after job
    jobs = run.jobs
    assert jobs["resizes"].sum() > 0  # DLRover's stage machine resized the jobs it started at 1+1
    done = jobs[jobs["status"] == "done"]
    assert np.allclose(done["trained_samples"], done["samples"] + done["wasted_samples"])


def test_bridge_error_is_clear_when_venv_missing(tmp_path):
    from sim.dlrover_bridge import DLRoverBridge

    with pytest.raises(DLRoverUnavailable, match="python -m venv"):
        DLRoverBridge(tmp_path / "nothing")


def test_ours_decides_nothing_itself_the_products_controller_does(monkeypatch, small_run):
    """The ours policy's probes, plan, resizes, heals and OOM answers all come out of
    ``controller.step``: with a controller that never acts, ours never starts, probes, fits or
    changes a job."""
    import sim.policies

    acting = small_run("ours")
    assert acting.counters["steps"] > 0 and acting.jobs["resizes"].sum() > 0 and acting.jobs["profile_s"].sum() > 0
    monkeypatch.setattr(sim.policies, "step", lambda state, observation: (state, []))
    idle = run_policy(SMALL, "ours")
    jobs = idle.jobs
    assert (jobs["status"] == "failed").all() and idle.counters["fits"] == 0
    assert (jobs[["profile_s", "resizes", "ooms", "failures", "trained_samples", "cpu_alloc_core_h"]] == 0).all().all()


class ReplayedJob:
    """A launcher over one job whose probes are measured as the simulation measured them, on the
    simulation's backend (its transition table, in-place resizes or not)."""

    def __init__(self, samples_total: float, transitions=None, in_place: bool = True):
        self.config, self.samples_done, self.samples_total = None, 0.0, samples_total
        self.transitions, self.in_place = transitions or measured_transitions(), in_place
        self.report_intervals = []  # what the profile asked the master for

    def trainer(self, job_id):
        return None

    def master_call(self, job_id, path, body, timeout=0.0):
        assert path == "/report_interval"
        self.report_intervals.append(body["seconds"])

    def exists(self, job_id):
        return self.config is not None

    def launch(self, spec, config):
        self.config = config

    def read_job(self, job_id):
        return {"config": self.config.to_row(), "nodes": {}}

    def progress(self, job_id, timeout=0.0):
        return {"state": "training", "samples_done": self.samples_done, "samples_total": self.samples_total}

    def restart_cost_s(self, job_id):
        return None

    def transition_costs(self):
        return self.transitions

    def can_resize_in_place(self):
        return self.in_place

    def apply(self, job_id, actions):
        return []


def test_the_simulated_and_the_product_profile_visit_the_same_probes_in_the_same_order(monkeypatch):
    """The profile task's loop (``lifecycle.profiling.advance``), given the job the simulation
    profiled and each probe measured as the simulation measured it, asks for the same probes,
    sized the same, in the same order, and ends the profile where the simulation did."""
    import airflow_dlrover.lifecycle.profiling as profiling

    cfg = SMALL.without_instability()
    jobs = Cluster(cfg, generate_trace(cfg), OursPolicy()).run()
    profiled = [j for j in jobs if j.ooms == 0 and j.state["controller"].probes_issued >= C.MIN_PROBES_COLD]
    assert profiled
    for job in profiled[:3]:
        simulated = job.state["controller"]
        windows = list(job.probe_rows)
        replay = ReplayedJob(job.spec.samples, cfg.transitions, cfg.in_place)

        def measure_probe(launcher, job_id, config, window_s, quota, halfwidth=0.0):  # the simulated window
            row = windows.pop(0)
            launcher.config, launcher.samples_done = config, row["samples_seen"]
            return row

        monkeypatch.setattr(profiling, "measure_probe", measure_probe)
        monkeypatch.setattr(profiling, "stand_in", lambda spec: spec)  # the replay measures whatever it is asked to
        asked = []
        state = begin(job.limit, "efficiency", prior=None, batch_size=BATCH, table_mb=job.spec.family.start_tables_mb,
                      table_start_mb=job.spec.family.start_tables_mb, allreduce=job.spec.family.user.ps == 0)
        state, _ = profiling.advance(replay, str(job.spec.id), state, spec=SimpleNamespace(total_samples=job.spec.samples),
                                     on_step=lambda before, after, actions, seen: asked.extend(
                                         a.config for a in actions if isinstance(a, Probe)))
        assert state.phase == Phase.FITTING
        assert asked == job.probes[:simulated.probes_issued] and state.probes_issued == simulated.probes_issued
        # probes measured with the reports the simulation assumed, and the job's own interval given back
        assert replay.report_intervals == [PROBE_REPORT_INTERVAL_S, REPORT_INTERVAL_S]


ALLREDUCE = replace(SMALL, allreduce_fraction=0.5)


def test_allreduce_families_are_added_without_changing_the_ps_families():
    before, after = generate_trace(SMALL), generate_trace(ALLREDUCE)
    assert [(j.arrival_s, j.samples) for j in before] == [(j.arrival_s, j.samples) for j in after]
    kinds = {j.family.index: j.family.user.ps == 0 for j in after}
    assert 0 < sum(kinds.values()) < len(kinds)
    for old, new in zip(before, after):
        if kinds[new.family.index]:
            assert isinstance(new.family.truth, AllReduce) and new.family.memory.replicated
            assert new.family.user.ps == 0 and new.family.user.ps_cpu == 0 and new.hot_ps_at is None
        else:  # common random numbers: the same PS family, the same draws
            assert new.family == old.family and new.hot_ps_at == old.hot_ps_at


def test_the_allreduce_truth_scales_until_its_ring_leaves_the_rack():
    truth = AllReduce(model_bytes=2e7, bandwidth=1.25e9, rack=8, oversubscription=4.0)
    w = np.array([1, 2, 4, 8, 16, 32])
    x = truth.throughput(w, 0, 4.0, 0.0)
    assert np.all(np.diff(x[:4]) > 0) and np.all(x[:4] / w[:4] <= x[0] + 1e-9)  # sub-linear within the rack
    assert x[4] < x[3]  # past the rack the uplinks are the bottleneck
    worker, ps = truth.cpu_used(w, 0, 4.0, 0.0)
    assert np.all((0 < worker) & (worker <= 4.0)) and np.all(ps == 0)
    assert worker[3] < worker[0]  # ranks wait for the ring
    memory = generate_trace(ALLREDUCE)[0].family.memory
    if memory.replicated:  # every worker holds the growing tables; no PS needs any
        assert memory.worker_mb(1e8) > memory.worker_mb(0.0) and memory.ps_mb(1) == 0


@pytest.mark.parametrize("policy", ["user", "ours", "oracle"])
def test_allreduce_jobs_run_without_ps_under_every_policy(policy):
    run = run_policy(ALLREDUCE, policy)
    jobs = run.jobs.set_index("job")
    trace = {spec.id: spec for spec in generate_trace(ALLREDUCE)}
    allreduce = [i for i, spec in trace.items() if spec.family.user.ps == 0]
    rows = jobs.loc[allreduce]
    assert len(rows) > 0 and (rows["ps"] == 0).all() and (rows["truth"] == "allreduce").all()
    done = rows[rows["status"] == "done"]
    assert len(done) > 0
    assert np.allclose(done["trained_samples"], done["samples"] + done["wasted_samples"], rtol=1e-9)


def test_dlrover_runs_an_allreduce_job_as_its_own_optimizer_does():
    """AllreduceJobResourceOptimizer (0.6.1): the owner's workers, and an OOM-killed worker
    relaunched as it was — so an owner who sized for smaller tables fails; no PS optimizer call."""
    from sim.policies import DLRoverPolicy

    class NoBridge:
        def call(self, requests):
            raise AssertionError(f"an all-reduce job asked DLRover's PS optimizer: {requests}")

    cfg = replace(SMALL, allreduce_fraction=1.0, user_underprovision=1.0)  # owners sized for yesterday's tables
    trace = generate_trace(cfg)
    assert all(spec.family.user.ps == 0 for spec in trace)
    jobs = Cluster(cfg, trace, DLRoverPolicy(NoBridge())).run()
    for job in jobs:
        assert job.config_final == job.spec.family.user and job.resizes == 0
    assert any(job.phase == "failed" and job.ooms > cfg.max_oom_retries for job in jobs)


#: The truth: a family's performance and memory functions, a job's instability draws. Only the
#: cluster (and the truth, the trace, the bound and the report after the run) may read it.
HIDDEN = {"Family": {"truth", "memory"},
          "JobSpec": {"hot_ps_at", "hot_ps_factor", "straggler_at", "straggler_speed", "failure_exponentials"}}
TRUTH_READERS = {"sim.cluster", "sim.truth", "sim.workload", "sim.run", "sim.bound"}


@pytest.fixture
def truth_tripwire(monkeypatch):
    """Reading the truth raises for the whole extent of a call to a policy that may not read it
    (``sim.cluster.IN_POLICY_CALL``), whichever module reads it, and at any time from a module not
    in ``TRUTH_READERS`` (the frame that asked names it)."""
    import sys

    import sim.cluster
    import sim.workload

    for cls_name, names in HIDDEN.items():
        def guarded(self, name, _names=names):
            if name in _names:
                caller = sys._getframe(1).f_globals.get("__name__")
                if sim.cluster.IN_POLICY_CALL[0] or caller not in TRUTH_READERS:
                    raise AssertionError(f"{caller} read the truth: {type(self).__name__}.{name}")
            return object.__getattribute__(self, name)

        monkeypatch.setattr(getattr(sim.workload, cls_name), "__getattribute__", guarded)


@pytest.mark.parametrize("policy", ["user", "user-adapts", "ours", pytest.param("dlrover", marks=pytest.mark.jobs)])
def test_no_policy_but_the_oracle_reads_the_truth(policy, truth_tripwire):
    cfg = replace(SMALL, allreduce_fraction=0.3)
    if policy == "dlrover":
        if not HAS_DLROVER:
            pytest.skip("no dlrover venv")
        from sim.dlrover_bridge import DLRoverBridge

        with DLRoverBridge() as bridge:
            run = run_policy(cfg, policy, bridge=bridge)
    else:
        run = run_policy(cfg, policy)
    assert len(run.jobs) == cfg.jobs and (run.jobs["status"] == "done").any()


def test_the_tripwire_catches_a_policy_that_reads_the_truth(truth_tripwire):
    class Peeking(Policy):
        name = "peeking"

        def start(self, job):
            assert not hasattr(job.spec.family, "memory")  # the view has no path to the truth
            job._job.spec.family.memory.worker_mb()  # around the view: what a real job cannot know
            return Start(config=job.spec.family.user)

    with pytest.raises(AssertionError, match=r"read the truth: Family.memory"):
        Cluster(SMALL, generate_trace(SMALL)[:2], Peeking()).run()


def test_a_policy_sees_its_job_through_a_read_only_view():
    class Looking(Policy):
        name = "looking"
        seen = []

        def start(self, job):
            self.seen.append((job, self.cluster))
            return Start(config=job.spec.family.user)

    Cluster(SMALL, generate_trace(SMALL)[:2], Looking()).run()
    view, cluster = Looking.seen[0]
    assert isinstance(view, sim.cluster.JobView) and isinstance(cluster, sim.cluster.ClusterView)
    with pytest.raises(AttributeError):
        view.config = None  # nothing of the job can be written through it
    assert not hasattr(cluster, "jobs") and not hasattr(cluster, "free_cpu")  # no other job, no free room


def test_a_job_that_never_completes_counts_as_an_infinite_time():
    table = pd.DataFrame({"policy": "p", "status": ["done", "done", "failed", "failed", "failed"],
                          "jct_s": [10.0, 20.0, np.inf, np.inf, np.inf], "run_s": [5.0, 8.0, np.inf, np.inf, np.inf],
                          "cpu_used_core_h": 1.0, "cpu_alloc_core_h": 2.0, "mem_used_gb_h": 1.0, "mem_alloc_gb_h": 4.0,
                          "queue_s": 0.0})
    row = summarise(table)
    assert row["median_jct_s"] == np.inf and row["median_run_s"] == np.inf  # 3 of 5 never finished
    assert row["completion_rate"] == 0.4
    row = summarise(table.iloc[:4])  # half failed: the median is the larger middle order statistic
    assert row["median_jct_s"] == 20.0 and row["p90_jct_s"] == np.inf
    assert summarise(table.iloc[:2])["median_jct_s"] == 10.0


def test_a_resize_that_does_not_fit_waits_and_is_applied_when_room_frees():
    cfg = replace(SMALL.without_instability(), cluster_cpu=100.0, cluster_memory_mb=2e6)
    small, big = Configuration(4, 2, 8.0, 8.0, 4096.0, 65536.0, 0, 512), Configuration(6, 2, 8.0, 8.0, 4096.0, 65536.0, 0, 512)

    class Grows(Policy):
        name = "grows"

        def start(self, job):
            return Start(config=small)  # 48 cores: two jobs fill 96 of 100

        def check(self, job, obs):
            return [Resize(big, "grow")] if job.spec.id == 0 and job.resizes == 0 and job.deferred == 0 else []

    trace = sorted(generate_trace(cfg)[:2], key=lambda spec: spec.id)
    trace = [replace(trace[0], arrival_s=0.0, samples=4e9), replace(trace[1], arrival_s=1.0, samples=2e8)]
    first, second = Cluster(cfg, trace, Grows()).run()
    assert first.deferred == 1 and first.resizes == 1  # asked while full; applied once the other ended
    assert first.config_final == big and first.phase == second.phase == "done"
    assert second.end_s < first.end_s


@pytest.mark.jobs
@pytest.mark.skipif(not HAS_DLROVER, reason="no dlrover venv")
def test_dlrover_starts_with_the_owners_per_node_resources():
    from sim.dlrover_bridge import DLRoverBridge
    from sim.policies import DLRoverPolicy

    trace = [spec for spec in generate_trace(SMALL)][:6]
    with DLRoverBridge() as bridge:
        policy = DLRoverPolicy(bridge)
        cluster = Cluster(SMALL, trace, policy)
        policy.begin(cluster)
        for spec, job in zip(trace, cluster.jobs):
            start = policy.start(job).config
            user = spec.family.user
            # its original PS resources are kept; the counts and the worker size are its own
            assert (start.ps_cpu, start.ps_memory_mb) == (user.ps_cpu, user.ps_memory_mb)
            policy.finish(job)


def test_families_recur_daily_and_drift_between_days():
    cfg = replace(SMALL, days=3)
    trace = generate_trace(cfg)
    assert len(trace) == 3 * SMALL.jobs and generate_trace(cfg) == trace
    by_family: dict = {}
    for job in trace:
        assert job.day * cfg.day_s <= job.arrival_s < (job.day + 1) * cfg.day_s
        by_family.setdefault(job.family.index, []).append(job)
    assert len(by_family) == SMALL.jobs  # one run a family a day
    first_day = {job.family.index: job for job in generate_trace(SMALL)}
    for index, runs in by_family.items():
        runs.sort(key=lambda j: j.day)
        assert [j.day for j in runs] == [0, 1, 2]
        assert runs[0].family == first_day[index].family  # day 1 is the one-day trace's
        assert len({j.family.user for j in runs}) == 1  # the owner wrote it once
        scales = [j.family.truth.scale for j in runs]
        assert len(set(scales)) == 3  # the model drifts ...
        tables = [j.family.memory.table_mb for j in runs]
        assert tables == sorted(tables)  # ... and its tables only grow


def test_ours_profiles_on_a_familys_first_day_and_warm_starts_from_its_own_runs_after():
    cfg = replace(SMALL.without_instability(), days=2)
    jobs = run_policy(cfg, "ours").jobs
    cold, warm = jobs[jobs["day"] == 0], jobs[jobs["day"] == 1]
    assert (cold["profile_s"] > 0).all()  # no history on the first day: every job profiles
    profiled = cold[cold["status"] == "done"]
    # probes on the job train it: profiling costs less than its wall time; on its stand-in, all of it
    on_job = profiled["profile_cost_s"] < profiled["profile_s"]
    on_stand_in = (profiled["profile_cost_s"] == profiled["profile_s"]) & (profiled["wasted_samples"] > 0)
    assert ((on_job | on_stand_in) & (profiled["profile_cost_s"] >= 0)).all()
    finished_first = set(cold.loc[cold["status"] == "done", "family"])
    warm_started = warm[warm["family"].isin(finished_first) & (warm["arrival_s"] > cold["jct_s"].max())]
    assert len(warm_started) > 0 and (warm_started["profile_s"] == 0).mean() > 0.75  # most plan from their prior
    assert warm_started["profile_s"].sum() < 0.25 * cold["profile_s"].sum()


class CheckingPolicy(Policy):
    """One probe, then a check of ``PLAN`` (``CheckPlan``), then ``PLAN`` or another plan."""

    name = "checking"
    PROBE = Configuration(2, 1, 1.0, 1.0, 2048.0, 2048.0, 0, 512)
    PLAN = Configuration(4, 2, 1.0, 1.0, 2048.0, 2048.0, 0, 512)
    OTHER = Configuration(3, 2, 1.0, 1.0, 2048.0, 2048.0, 0, 512)
    WINDOW_S = 3.0

    def __init__(self, final):
        self.final, self.rows, self.checks_at, self.profiled_at = final, [], [], None

    def start(self, job):
        user = job.spec.family.user  # memory the job's tables fit in
        self.memory = dict(worker_memory_mb=user.worker_memory_mb, ps_memory_mb=2 * user.ps_memory_mb)
        return Start(probes=[replace(self.PROBE, **self.memory)], window_s=self.WINDOW_S)

    def after_profile(self, job, samples):
        self.rows = list(samples)
        if len(samples) == 1:
            return CheckPlan(replace(self.PLAN, **self.memory))
        self.profiled_at = self.cluster.now
        return replace(self.final, **self.memory)

    def check(self, job, obs):
        self.checks_at.append((self.cluster.now, obs.config))
        return []


@pytest.mark.parametrize("final", [CheckingPolicy.PLAN, CheckingPolicy.OTHER])
def test_a_plan_check_measures_the_plan_on_the_job_and_only_another_plan_relaunches(final):
    # checkpoints and restores too fast to count: every transition's cost is the table's own figure
    free_state = replace(measured_transitions(), checkpoint_mb_per_s=1e15, restore_mb_per_s=1e15)
    cfg = replace(SMALL.without_instability(), transitions=free_state)
    policy = CheckingPolicy(final)
    job = Cluster(cfg, generate_trace(cfg)[:1], policy).run()[0]
    assert job.phase == "done"
    # a window of the probe, then one of the plan: the check is a probe of the profile
    assert [(r["workers"], r["ps"]) for r in policy.rows] == [(2, 1), (4, 2)]
    costs = cfg.transitions
    probe, plan = (replace(c, **policy.memory) for c in (CheckingPolicy.PROBE, CheckingPolicy.PLAN))
    # each measured as measure_probe does: the first report past the change, the window, its last poll
    measured = C.PROBE_REPORT_AFTER_S + PROBE_REPORT_INTERVAL_S + CheckingPolicy.WINDOW_S + SUPERVISOR_POLL_S
    assert job.profile_s == pytest.approx(costs.cold_launch_s + measured + costs.of(probe, plan) + measured)
    first_check_at, config = policy.checks_at[0]
    # the checked plan runs on as it is; another is a resize from it
    relaunch = 0.0 if final == CheckingPolicy.PLAN else costs.of(plan, replace(final, **policy.memory))
    assert first_check_at == pytest.approx(policy.profiled_at + relaunch + cfg.check_s)
    assert shape(config) == shape(final)


def test_ours_checks_an_extrapolating_plan_as_the_launch_task_does():
    cfg = SMALL.without_instability()
    policy = OursPolicy()
    jobs = Cluster(cfg, generate_trace(cfg), policy).run()
    checked = [job for job in jobs if job.state["controller"].plan_checks]
    assert checked, "no cold plan extrapolated past its probes"
    for job in jobs:
        checks = job.state["controller"].plan_checks
        assert checks <= C.PLAN_CHECK_PROBES
        profile = job.state["controller"].profile
        assert len(profile) == job.probe_index  # a window a probe, a check being one
        if checks and job.probe_index == len(job.probes):  # the last check measured the plan (unless the
            assert shape(profile[-1]) == shape(job.probes[-1])  # job ended first)


class ApartPolicy(Policy):
    """Two probes across a PS count change, on the job or on its stand-in (``Start.apart``), then
    the last probe's configuration as the plan."""

    name = "apart"
    PROBES = (Configuration(2, 1, 1.0, 1.0, 2048.0, 2048.0, 0, 512),
              Configuration(2, 2, 1.0, 1.0, 2048.0, 2048.0, 0, 512))
    WINDOW_S = 3.0

    def __init__(self, apart):
        self.apart, self.profiled_at, self.checks_at = apart, None, []

    def start(self, job):
        user = job.spec.family.user  # memory the job's tables fit in
        self.memory = dict(worker_memory_mb=user.worker_memory_mb, ps_memory_mb=2 * user.ps_memory_mb)
        return Start(probes=[replace(p, **self.memory) for p in self.PROBES], window_s=self.WINDOW_S,
                     apart=self.apart)

    def after_profile(self, job, samples):
        self.profiled_at, self.profiled_samples = self.cluster.now, job.samples_done
        return replace(self.PROBES[-1], **self.memory)

    def check(self, job, obs):
        self.checks_at.append(self.cluster.now)
        return []


def test_a_profile_on_the_stand_in_changes_ps_without_the_jobs_tables_and_throws_its_training_away():
    slow_state = replace(measured_transitions(), checkpoint_mb_per_s=50.0, restore_mb_per_s=100.0)
    cfg = replace(SMALL.without_instability(), transitions=slow_state)
    runs = {}
    for apart in (False, True):
        policy = ApartPolicy(apart)
        job = Cluster(cfg, generate_trace(cfg)[:1], policy).run()[0]
        assert job.phase == "done"
        runs[apart] = job, policy
    (on_job, on_job_policy), (stand_in, stand_in_policy) = runs[False], runs[True]
    tables = on_job.spec.family.memory.table_mb
    assert tables > 0
    # the same probes, the same windows; the PS change of the stand-in moved none of the job's tables
    assert on_job.profile_s - stand_in.profile_s == pytest.approx(
        tables / slow_state.checkpoint_mb_per_s + tables / slow_state.restore_mb_per_s)
    # the job on its own probe runs on as it is; the stand-in's job starts cold on the plan ...
    assert on_job_policy.checks_at[0] == pytest.approx(on_job_policy.profiled_at + cfg.check_s)
    assert stand_in_policy.checks_at[0] == pytest.approx(stand_in_policy.profiled_at + slow_state.cold_launch_s
                                                         + cfg.check_s)
    # ... and trains every sample itself: what the stand-in trained is thrown away, its whole time a cost
    assert on_job.wasted_samples == 0 and on_job.profile_cost_s < on_job.profile_s
    assert stand_in.wasted_samples == pytest.approx(stand_in_policy.profiled_samples) and stand_in.wasted_samples > 0
    assert stand_in.trained_samples == pytest.approx(stand_in.spec.samples + stand_in.wasted_samples)
    assert stand_in.profile_cost_s == stand_in.profile_s


class HealThenResize(Policy):
    """Heal the hot PS (4 cores over the group's 2), then resize to 6 workers and ``target_ps`` PS.
    An instrument, not a contender: it reads the cluster's record of the job (when the PS ran hot)."""

    name = "heal-then-resize"
    reads_truth = True

    def __init__(self, target_ps):
        self.target_ps, self.after, self.hot_after = target_ps, None, None

    def start(self, job):
        user = job.spec.family.user
        self.before = Configuration(4, 2, 1.0, 2.0, user.worker_memory_mb, 2 * user.ps_memory_mb, 0, 512)
        return Start(config=self.before)

    def on_onset(self, job, kind):
        return [SetHotPsCpu(4.0)] if kind == "hot_ps" else []

    def check(self, job, obs):
        if job.config == self.after and self.hot_after is None:
            self.hot_after = (job.hot_ps_cpu, job.alloc_cpu)
        if job.hot_active and self.after is None:
            self.after = replace(self.before, workers=6, ps=self.target_ps)
            return [Resize(self.after)]
        return []


@pytest.mark.parametrize("target_ps, hot_cpu", [(2, 4.0), (3, 2.0)])
def test_a_heal_survives_a_resize_only_where_the_ps_stay_as_they_are(target_ps, hot_cpu):
    """As ``BaseLauncher.resize``: a workers-only resize leaves the healed ps-0 alone; one that
    changes the PS restarts them all at the group's CPU (and holds no extra core past the quota)."""
    cfg = replace(SMALL.without_instability(), instability=True, hot_ps_probability=1.0)
    spec = next(s for s in generate_trace(cfg) if s.hot_ps_at is not None and s.hot_ps_at < 0.5)
    policy = HealThenResize(target_ps)
    job = Cluster(cfg, [spec], policy).run()[0]
    assert job.phase == "done" and job.config_final == policy.after
    assert policy.hot_after == (hot_cpu, policy.after.cores + hot_cpu - policy.after.ps_cpu)


def test_the_least_jct_oracle_plans_the_fastest_truth_and_the_knee_no_faster():
    """Per job, oracle-jct's plan has the largest true throughput of the planner's range within the
    quota (memory for the true peak): at least the knee's; the knee never uses more cores."""
    from sim.policies import true_plan

    cfg = SMALL.without_instability()
    cluster = Cluster(cfg, generate_trace(cfg), make_policy("oracle-jct"))
    for job in cluster.jobs:
        fastest, knee = true_plan(job, "throughput", job.limit), true_plan(job, "efficiency", job.limit)
        truth = job.spec.family.truth
        speed = [float(truth.throughput(c.workers, c.ps, c.worker_cpu, c.ps_cpu)) for c in (fastest, knee)]
        assert speed[0] >= speed[1] and knee.cores <= fastest.cores + 1e-9
    run = run_policy(cfg, "oracle-jct")
    assert run.name == "oracle-jct" and (run.jobs["status"] == "done").all()


def test_an_owner_who_adapts_raises_memory_after_an_oom_and_keeps_the_fastest_config():
    cfg = replace(SMALL.without_instability(), days=3, user_underprovision=1.0)  # every owner's PS too small
    owner, adapting = run_policy(cfg, "user").jobs, run_policy(cfg, "user-adapts").jobs
    assert (owner["status"] == "failed").any()  # retried as is: fails again
    assert adapting["status"].eq("done").sum() > owner["status"].eq("done").sum()
    for family, runs in adapting.sort_values("day").groupby("family"):
        first = runs.iloc[0]
        if first["ooms"] and first["status"] == "done":  # its raised memory is what the next days start with
            assert (runs.iloc[1:]["ps_memory_mb"] >= first["ps_memory_mb"]).all()
            assert (runs.iloc[1:]["ooms"] == 0).all()


def test_one_off_jobs_share_no_family_and_a_shift_changes_its_family_from_its_day_on():
    cfg = replace(SMALL, days=4, one_off_fraction=0.3, shift_fraction=0.5)
    trace = generate_trace(cfg)
    one_off = [spec for spec in trace if spec.family.recurrence == "one-off"]
    assert one_off and len({spec.family.index for spec in one_off}) == len(one_off)  # never the same family
    daily = {spec.family.index for spec in trace if spec.family.recurrence != "one-off"}
    assert not daily & {spec.family.index for spec in one_off}
    shifted = [spec for spec in trace if spec.family.recurrence not in ("daily", "one-off")]
    assert shifted and all(spec.day >= 2 for spec in shifted)
    by_day = {(spec.family.index, spec.day): spec for spec in trace}
    shift_days = [spec for spec in shifted if by_day[(spec.family.index, spec.day - 1)].family.recurrence == "daily"]
    assert shift_days
    for spec in shift_days:  # against the same family the day before
        before = by_day[(spec.family.index, spec.day - 1)].family
        if spec.family.recurrence == "tables×2":
            assert spec.family.start_tables_mb >= 1.9 * before.start_tables_mb
        elif spec.family.recurrence == "data×2":
            assert spec.family.typical_samples >= 1.5 * before.typical_samples
        else:
            assert spec.family.truth != before.truth
    assert {spec.family.recurrence for spec in shifted} <= {"tables×2", "data×2", "model"}
    # the other families are the same whatever the fractions (their own random streams)
    plain = generate_trace(replace(cfg, one_off_fraction=0.0, shift_fraction=0.0))
    assert [s.arrival_s for s in plain] == [s.arrival_s for s in trace]
