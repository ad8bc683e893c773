"""The four policies compared on identical traces.

``user``     the configuration the job's owner wrote (per family), never changed; an OOM is
             retried as is (Airflow retries), and fails again.
``dlrover``  DLRover 0.6.1's own ``PSJobResourceOptimizer`` / ``PSLocalOptimizer`` (its venv,
             through :mod:`.dlrover_bridge`): full auto mode — its job-creation resources, then its
             stage machine every 300 s (``SEC_INTERVAL_TO_OPTIMIZE``) fed with the runtime stats,
             its OOM recovery (×2 memory). Its plans are applied as DLRover's auto-scaler applies
             them; a plan past the job's quota is refused (as a Kubernetes ResourceQuota would)
             and counted. DLRover 0.6.1 has no straggler handling for PS jobs.
``ours``     the optimizer of this package, for real: probes (``design_probes``: a cold start's;
             a warm start, from the family's history, has none) whose time and samples are the
             job's, ``fit_job_model``,
             ``plan`` (the efficiency knee under the job's quota), ``decide`` every period (for the same
             objective, under what the cluster has free) with
             refits as new configurations are measured, and the instability detectors
             (``detect_hot_ps``, ``detect_stragglers``, ``detect_oom_risk``) with their actions.
             After a run the family's history keeps what the history store's ``prior_model``
             gives the next run: the newest cold fit's throughput model, and the memory growth
             the run showed.
``oracle``   knows the truth: the same objective as ``ours`` evaluated on the true function over
             the planner's grid, memory sized for the true peak, instability healed at onset.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.finetune import ResizeRecord, decide
from airflow_dlrover.optimizer.instability import detect_hot_ps, detect_oom_risk, detect_stragglers
from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model
from airflow_dlrover.optimizer.memory import fit_memory, memory_request_mb
from airflow_dlrover.optimizer.planner import _knee, _pareto_front, plan, search_grid
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota
from airflow_dlrover.simulate.cluster import (
    JobRun,
    Observation,
    Policy,
    ReplaceWorker,
    Resize,
    SetHotPsCpu,
    SetMemory,
    Start,
)
from airflow_dlrover.simulate.truth import BATCH

POLICIES = ("user", "dlrover", "ours", "oracle")


def _config(w, p, lw, lp, wm, pm) -> Configuration:
    return Configuration(int(w), int(p), float(lw), float(lp), float(wm), float(pm), 0, BATCH)


# ---------------------------------------------------------------------------------------------
# user
# ---------------------------------------------------------------------------------------------


class UserPolicy(Policy):
    name = "user"

    def start(self, job: JobRun) -> Start:
        u = job.spec.family.user
        return Start(config=_config(u.workers, u.ps, u.worker_cpu, u.ps_cpu, u.worker_memory_mb, u.ps_memory_mb))


# ---------------------------------------------------------------------------------------------
# oracle
# ---------------------------------------------------------------------------------------------


def true_plan(job: JobRun, objective: str, quota: Quota, truth_on_grid: np.ndarray | None = None) -> Configuration:
    """The best configuration on the *true* function, by the planner's own rules and grid.
    ``truth_on_grid``: the true throughput over the quota's grid prefix, when already computed."""
    family = job.spec.family
    grid = search_grid(BATCH)
    n = grid.prefix(quota.cpu)
    w, p, lw, lp = grid.workers[:n], grid.ps[:n], grid.worker_cpu[:n], grid.ps_cpu[:n]
    x = family.truth.throughput(w, p, lw, lp) if truth_on_grid is None else truth_on_grid
    memory = family.memory
    worker_mem = float(np.ceil(memory.worker_mb() / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB)
    ps_need = np.ceil(memory.ps_mb(np.arange(1, C.GRID_MAX_PS + 1), job.spec.samples) / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB
    total_mem = w * worker_mem + p * ps_need[p - 1]
    feasible = total_mem <= quota.memory_mb
    xf = np.where(feasible, x, -np.inf)
    if objective == "throughput":
        best = int(np.argmax(xf))
    else:
        best = _knee(_pareto_front(grid, n, xf), x, grid.cores[:n])
    return _config(w[best], p[best], lw[best], lp[best], worker_mem, ps_need[p[best] - 1])


class OraclePolicy(Policy):
    name = "oracle"

    def __init__(self, objective: str = "efficiency"):
        self.objective = objective
        self._truth_on_grid: dict[int, np.ndarray] = {}

    def start(self, job: JobRun) -> Start:
        # A family's truth over its quota's grid is the same for every run; memory (and so what
        # is feasible) depends on this run's samples.
        family = job.spec.family
        if family.index not in self._truth_on_grid:
            grid = search_grid(BATCH)
            n = grid.prefix(job.limit.cpu)
            self._truth_on_grid[family.index] = family.truth.throughput(
                grid.workers[:n], grid.ps[:n], grid.worker_cpu[:n], grid.ps_cpu[:n])
        return Start(config=true_plan(job, self.objective, job.limit, self._truth_on_grid[family.index]))

    def on_onset(self, job: JobRun, kind: str) -> list:
        if kind == "hot_ps":
            cpu = job.config.ps_cpu * job.spec.hot_ps_factor
            if job.alloc_cpu + cpu - job.config.ps_cpu <= job.limit.cpu:
                return [SetHotPsCpu(cpu)]
            return []
        return [ReplaceWorker()]


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------


def _history_model(job: JobRun, quota: Quota) -> JobModel:
    """Yesterday's model of a family with history: yesterday's cold profile, fitted, plus the
    memory growth yesterday's run showed (the history store keeps both)."""
    family = job.spec.family
    rng = np.random.default_rng([job.spec.seed, 3])
    probes = design_probes(quota, batch_size=BATCH)
    rows = _measure(family, probes, rng, samples_seen=0.0)
    model = fit_job_model(pd.DataFrame(rows))
    # Yesterday's run: PS memory at a few points of its progress.
    grown = [dict(rows[0], samples_seen=s, ps_memory_used_mb=float(family.memory.ps_mb(rows[0]["ps"], s)))
             for s in np.linspace(0.0, family.typical_samples, 5)]
    growth = fit_memory(pd.DataFrame(grown)).table_growth_mb_per_m_samples
    return JobModel(model.throughput, model.memory.with_table_growth(growth))


def _measure(family, configs: pd.DataFrame, rng, samples_seen: float) -> list[dict]:
    rows = []
    for row in configs.to_dict("records"):
        w, p, lw, lp = row["workers"], row["ps"], row["worker_cpu"], row["ps_cpu"]
        x = float(family.truth.throughput(w, p, lw, lp))
        wc, pc = family.truth.cpu_used(w, p, lw, lp)
        for _ in range(2):
            rows.append(dict(row, throughput=x * rng.lognormal(0.0, 0.05), worker_cpu_used=float(wc),
                             ps_cpu_used=float(pc), worker_memory_used_mb=family.memory.worker_mb(),
                             ps_memory_used_mb=float(family.memory.ps_mb(p, samples_seen)), samples_seen=samples_seen))
    return rows


class OursPolicy(Policy):
    name = "ours"

    def __init__(self, objective: str = "efficiency"):
        self.objective = objective
        self.history: dict[int, JobModel] = {}
        self.fits = 0
        self.plans = 0

    # --- pre-tune
    def start(self, job: JobRun) -> Start:
        family = job.spec.family
        prior = self.history.get(family.index)
        if prior is None and family.history:
            prior = self.history[family.index] = _history_model(job, job.limit)
        job.state["prior"] = prior
        if prior is not None:
            probes = design_probes(job.limit, batch_size=BATCH, prior=prior.throughput, memory=prior.memory)
        else:
            probes = design_probes(job.limit, batch_size=BATCH)
        if probes.empty:  # a warm start: the prior is the run's model and plans (as the fit task)
            job.state["rows"], job.state["probe_rows"], job.state["model"] = [], [], prior
            return Start(config=self._plan(job, prior, job.limit, job.spec.samples))
        return Start(probes=[Configuration(**row) for row in probes.to_dict("records")])

    def after_profile(self, job: JobRun, samples: list[dict]) -> Configuration:
        job.state["rows"] = list(samples)
        job.state["probe_rows"] = list(samples)
        model = self._fit(job)
        return self._plan(job, model, job.limit, job.remaining)

    def _fit(self, job: JobRun) -> JobModel:
        prior: JobModel | None = job.state["prior"]
        table = pd.DataFrame(job.state["rows"])
        model = fit_job_model(table, prior, leave_one_out=False)
        self.fits += 1
        memory = model.memory
        if memory is not None and prior is not None and prior.memory is not None and "table_growth_mb_per_m_samples" in memory.pinned:
            memory = memory.with_table_growth(prior.memory.table_growth_mb_per_m_samples)
        if "growth" in job.state:  # measured on this run (OOM guard's trend): keep the larger
            memory = memory.with_table_growth(max(memory.table_growth_mb_per_m_samples, job.state["growth"]))
        model = JobModel(model.throughput, memory)
        job.state["model"] = model
        return model

    def _plan(self, job: JobRun, model: JobModel, quota: Quota, remaining: float) -> Configuration:
        self.plans += 1
        try:
            chosen = plan(model.throughput, model.memory, quota, self.objective, samples=remaining, batch_size=BATCH)
        except InvalidInputError:
            # Memory forecast too large for the quota: plan without the growth, the guard watches.
            chosen = plan(model.throughput, model.memory.with_table_growth(0.0), quota, self.objective, batch_size=BATCH)
        return chosen.config

    # --- fine-tune + guard
    def check(self, job: JobRun, obs: Observation) -> list:
        actions = self._guard(job, obs)
        if actions:
            return actions
        config = obs.config
        # The runtime's windows enter the sample table as one row per configuration (their
        # median, refreshed each period): hundreds of windows of one configuration would
        # otherwise out-weigh the probes and the model would forget everything else.
        runtime = job.state.setdefault("runtime", {})
        key = (config.workers, config.ps, config.worker_cpu, config.ps_cpu)
        windows = runtime.setdefault(key, [])
        windows.extend(obs.windows)
        row = dict(config.to_row(), throughput=float(np.median(windows)), worker_cpu_used=obs.worker_cpu_used,
                   ps_cpu_used=float(np.mean(obs.ps_cpu_used)), worker_memory_used_mb=obs.worker_memory_used_mb,
                   ps_memory_used_mb=obs.ps_memory_used_mb, samples_seen=obs.samples_done, timestamp=obs.now_s)
        job.state.setdefault("runtime_rows", {})[key] = row
        if obs.config.ps == job.state.get("series_ps", obs.config.ps):
            job.state["series_ps"] = obs.config.ps
            job.state.setdefault("memory_series", []).append(row)
        job.state["rows"] = job.state["probe_rows"] + list(job.state["runtime_rows"].values())
        model = job.state["model"]
        if len(runtime) != job.state.get("fitted_runtime", 0) or len(windows) in (3, 12):
            job.state["fitted_runtime"] = len(runtime)
            model = self._fit(job)
        since = job.state.setdefault("since_resize", [])
        since.extend(obs.windows)
        free = self.cluster.free_quota(job)
        # A healed hot PS keeps its extra cores through a resize: the fine-tune plans without them.
        extra = max(obs.hot_ps_cpu - config.ps_cpu, 0.0)
        quota = Quota(cpu=max(free.cpu - extra, config.cores), memory_mb=free.memory_mb)
        if quota.cpu < config.cores or quota.memory_mb < config.memory_mb:
            return []
        # A "keep" stays a keep while nothing it rests on changed: the same model, quota, measured
        # speed (±5 %) and resize history — its saving only shrinks as the remaining samples do.
        # Skipping those repeats saves most of the planner calls of a long job.
        x_now = float(np.median(since))
        signature = (id(model), quota.cpu, round(quota.memory_mb, -3), round(math.log(max(x_now, 1e-9)) / 0.05),
                     len(job.state.setdefault("rejected", [])), id(job.state.get("last_resize")), len(since) >= C.MIN_OBSERVATIONS_TO_JUDGE)
        if job.state.get("kept") == signature:
            return []
        try:
            decision = decide(model.throughput, model.memory, quota, config, since, obs.remaining, obs.now_s,
                              job.state.get("last_resize"), job.state["rejected"], objective=self.objective)
        except InvalidInputError:
            return []
        if decision.action == "keep":
            if not decision.reason.startswith(("last resize", "judging")):
                job.state["kept"] = signature
            return []
        if decision.reject is not None:
            job.state["rejected"].append(decision.reject)
        target = decision.target
        job.state["last_resize"] = ResizeRecord(obs.now_s, config, target, x_now, decision.predicted_speedup or 1.0,
                                                is_revert=decision.action == "revert")
        job.state["since_resize"] = []
        return [Resize(target, decision.reason)]

    def _guard(self, job: JobRun, obs: Observation) -> list:
        """The instability detectors, each behind an exact pre-filter of its own rule (the filter
        is a necessary condition of the detector's, so it changes no decision, only the cost)."""
        actions = []
        config = obs.config
        ps_limit = [obs.hot_ps_cpu] + [config.ps_cpu] * (config.ps - 1)
        util = [used / limit for used, limit in zip(obs.ps_cpu_used, ps_limit)]
        hot = [i for i in range(config.ps) if util[i] >= C.HOT_PS_UTILISATION
               and util[i] >= C.HOT_PS_SKEW * float(np.median(util[:i] + util[i + 1:]))] if config.ps >= 2 else []
        if hot:
            table = pd.DataFrame(dict(time_s=obs.now_s, node=[f"ps-{i}" for i in range(config.ps)], role="ps",
                                      cpu_used=obs.ps_cpu_used, cpu_limit=ps_limit))
            for event in detect_hot_ps(table):
                cpu = float(event.action.value)
                if job.alloc_cpu + cpu - obs.hot_ps_cpu <= job.limit.cpu:  # healing stays in the quota
                    actions.append(SetHotPsCpu(cpu))
        speeds = obs.worker_speeds
        if len(speeds) >= 2 and min(speeds) < C.STRAGGLER_SPEED_FRACTION * max(speeds):
            table = pd.DataFrame(dict(time_s=np.repeat(obs.now_s - np.arange(3)[::-1] * obs.window_s, len(speeds)),
                                      node=[f"worker-{i}" for i in range(len(speeds))] * 3, role="worker",
                                      throughput=speeds * 3))
            if detect_stragglers(table):
                actions.append(ReplaceWorker())
        history = obs.memory_history + [(obs.now_s, obs.ps_memory_used_mb)]
        limit = config.ps_memory_mb
        if len(history) >= 2:
            times, used = zip(*history[-6:])
            # The steepest slope between any two points bounds the detector's Theil–Sen slope.
            steepest = max([(used[j] - used[i]) / (times[j] - times[i]) for i in range(len(times))
                            for j in range(i + 1, len(times)) if times[j] != times[i]] + [0.0])
            reach = used[-1] + steepest * (C.OOM_HORIZON_S + max(times) - min(times))
            if used[-1] >= C.OOM_USAGE_FRACTION * limit or reach >= limit:
                table = pd.DataFrame(dict(time_s=times, node="ps", memory_used_mb=used, memory_limit_mb=limit))
                remaining_s = obs.remaining / max(np.median(obs.windows), 1e-9)
                for event in detect_oom_risk(table, remaining_s=remaining_s):
                    new = float(event.action.value)
                    if job.alloc_mem + (new - limit) * config.ps <= job.limit.memory_mb:
                        actions.append(SetMemory(ps_memory_mb=new))
                        growth = event.evidence["slope_mb_per_min"] / 60.0 * config.ps / max(np.median(obs.windows), 1e-9) * 1e6
                        job.state["growth"] = max(job.state.get("growth", 0.0), growth)
        return actions

    def on_oom(self, job: JobRun, obs: Observation, node: str) -> SetMemory | None:
        config = obs.config
        if node == "worker":
            return SetMemory(worker_memory_mb=float(memory_request_mb(obs.worker_memory_used_mb * 1.5)))
        history = obs.memory_history + [(obs.now_s, obs.ps_memory_used_mb)]
        times, used = np.array(history[-6:]).T
        remaining_s = obs.remaining / max(np.median(obs.windows), 1e-9)
        table = pd.DataFrame(dict(time_s=times, node="ps", memory_used_mb=used, memory_limit_mb=config.ps_memory_mb))
        events = detect_oom_risk(table, remaining_s=remaining_s) if len(times) >= 1 else []
        new = float(events[0].action.value) if events else float(memory_request_mb(obs.ps_memory_used_mb * 1.3))
        new = max(new, config.ps_memory_mb * 1.25)
        cap = (job.limit.memory_mb - config.workers * config.worker_memory_mb) / config.ps
        return SetMemory(ps_memory_mb=min(new, cap)) if cap > config.ps_memory_mb else None

    def finish(self, job: JobRun) -> None:
        model: JobModel | None = job.state.get("model")
        if model is None:
            return
        memory = model.memory
        series = job.state.get("memory_series", [])
        if len({r["samples_seen"] for r in series}) >= 2:
            growth = fit_memory(pd.DataFrame(series)).table_growth_mb_per_m_samples
            memory = memory.with_table_growth(max(growth, memory.table_growth_mb_per_m_samples))
        # The history store's prior (``HistoryStore.prior_model``): the newest cold fit's throughput
        # model with the newest memory model; a warm-started refit never becomes a prior.
        prior = self.history.get(job.spec.family.index)
        throughput = prior.throughput if prior is not None and model.throughput.report.warm_start else model.throughput
        self.history[job.spec.family.index] = JobModel(throughput, memory)


# ---------------------------------------------------------------------------------------------
# DLRover
# ---------------------------------------------------------------------------------------------

_DLROVER_OPT_INTERVAL_S = 300.0  # DLRover's SEC_INTERVAL_TO_OPTIMIZE
_DLROVER_DEFAULT_MEMORY_MB = 8000.0  # DLRover's DefaultNodeResource.{PS,WORKER}_MEMORY
_MAX_PS_NUM = 15  # DLRover's NodeResourceLimit.MAX_PS_NUM (applied inside its optimizer too)
_GIB = 2**30


class DLRoverPolicy(Policy):
    name = "dlrover"
    windows = 5

    def __init__(self, bridge):
        self.bridge = bridge

    def check_interval(self, job: JobRun) -> float:
        # DLRover asks its optimizer every 300 s; when its stage machine can only answer with an
        # empty plan until its PS interval passes (it says so), the next ask is then.
        quiet = job.state.get("quiet_until")
        now = self.cluster.now
        if quiet is not None and quiet > now + _DLROVER_OPT_INTERVAL_S:
            return quiet - now + 1.0
        return _DLROVER_OPT_INTERVAL_S

    def start(self, job: JobRun) -> Start:
        reply = self.bridge.call([{"op": "new", "job": str(job.spec.id), "now": self.cluster.now,
                                   "cpu": job.limit.cpu, "memory_bytes": int(job.limit.memory_mb * 2**20)}])[0]
        groups = reply["groups"]
        worker, ps = groups["worker"], groups["ps"]
        config = _config(max(worker["count"], 1), max(ps["count"], 1), worker["cpu"] or 1, ps["cpu"] or 1,
                         worker["memory_mb"] or _DLROVER_DEFAULT_MEMORY_MB, ps["memory_mb"] or _DLROVER_DEFAULT_MEMORY_MB)
        return Start(config=config)

    def _reports(self, job: JobRun, obs: Observation) -> list[dict]:
        c = obs.config
        out = []
        for k, speed in enumerate(obs.windows):  # five windows: DLRover's _LATEST_SAMPLE_COUNT
            now = obs.now_s - (len(obs.windows) - 1 - k) * obs.window_s
            ps = [[1, [obs.hot_ps_cpu if i == 0 else c.ps_cpu, c.ps_memory_mb, round(obs.ps_cpu_used[i], 2),
                       int(obs.ps_memory_used_mb * 2**20)]] for i in range(c.ps)]
            workers = [[c.workers, [c.worker_cpu, c.worker_memory_mb, round(obs.worker_cpu_used, 2),
                                    int(obs.worker_memory_used_mb * 2**20)]]]
            out.append({"op": "report", "job": str(job.spec.id), "now": now, "speed": speed,
                        "step": int(obs.samples_done / BATCH), "ps": ps, "workers": workers})
        return out

    def check(self, job: JobRun, obs: Observation) -> list:
        requests = self._reports(job, obs) + [{"op": "plan", "job": str(job.spec.id), "now": obs.now_s}]
        reply = self.bridge.call(requests)[-1]
        job.state["quiet_until"] = reply.get("quiet_until")
        c = obs.config
        row = c.to_row()
        groups = reply["groups"]
        if "worker" in groups and groups["worker"]["count"] > 0:
            g = groups["worker"]
            row.update(workers=int(g["count"]), worker_cpu=float(g["cpu"] or c.worker_cpu),
                       worker_memory_mb=float(g["memory_mb"] or c.worker_memory_mb))
        if "ps" in groups and groups["ps"]["count"] > 0:
            g = groups["ps"]
            row.update(ps=int(min(g["count"], _MAX_PS_NUM)), ps_cpu=float(g["cpu"] or c.ps_cpu),
                       ps_memory_mb=float(g["memory_mb"] or c.ps_memory_mb))
        actions = []
        target = Configuration(**row)
        if target != c:
            actions.append(Resize(target, "dlrover plan"))
        nodes = reply["nodes"]
        if nodes:
            # Per-PS CPU (its hot-PS rule): ps-0 is the hot one in the simulation; the others
            # share the group's CPU.
            if "ps-0" in nodes:
                actions.append(SetHotPsCpu(float(nodes["ps-0"]["cpu"])))
            others = [v["cpu"] for k, v in nodes.items() if k != "ps-0"]
            if others and max(others) > c.ps_cpu:
                actions.append(Resize(Configuration(**{**target.to_row(), "ps_cpu": float(max(others))}), "dlrover ps cpu"))
        return self._guarded(job, actions)

    def _guarded(self, job: JobRun, actions: list) -> list:
        """A plan past the job's quota is refused by the cluster (like a ResourceQuota)."""
        kept = []
        cpu = min(job.limit.cpu, self.cluster.capacity.cpu)
        mem = min(job.limit.memory_mb, self.cluster.capacity.memory_mb)
        for action in actions:
            if isinstance(action, Resize):
                extra = max(job.hot_ps_cpu - action.config.ps_cpu, 0.0)
                if action.config.cores + extra > cpu or action.config.memory_mb > mem:
                    job.refused += 1
                    continue
            if isinstance(action, SetHotPsCpu) and job.alloc_cpu + action.cpu - max(job.hot_ps_cpu, job.config.ps_cpu) > cpu:
                job.refused += 1
                continue
            kept.append(action)
        return kept

    def on_oom(self, job: JobRun, obs: Observation, node: str) -> SetMemory | None:
        c = obs.config
        kind = "ps" if node == "ps" else "worker"
        memory = c.ps_memory_mb if kind == "ps" else c.worker_memory_mb
        cpu = c.ps_cpu if kind == "ps" else c.worker_cpu
        reply = self.bridge.call([{"op": "oom", "job": str(job.spec.id), "now": obs.now_s, "type": kind,
                                   "name": f"{kind}-0", "cpu": cpu, "memory_mb": memory}])[0]
        new = float(max(reply["memory_mb"], reply["group_memory_mb"]))
        count = c.ps if kind == "ps" else c.workers
        other = c.memory_mb - count * memory
        if other + count * new > job.limit.memory_mb:
            job.refused += 1
            return None
        return SetMemory(ps_memory_mb=new) if kind == "ps" else SetMemory(worker_memory_mb=new)

    def finish(self, job: JobRun) -> None:
        self.bridge.call([{"op": "close", "job": str(job.spec.id)}])


def make_policy(name: str, *, objective: str = "efficiency", bridge=None) -> Policy:
    if name == "user":
        return UserPolicy()
    if name == "oracle":
        return OraclePolicy(objective)
    if name == "ours":
        return OursPolicy(objective)
    if name == "dlrover":
        if bridge is None:
            raise InvalidInputError("policies", name, "dlrover with its venv (see dlrover_bridge)")
        return DLRoverPolicy(bridge)
    raise InvalidInputError("policies", name, " | ".join(POLICIES))


__all__ = ["POLICIES", "DLRoverPolicy", "OraclePolicy", "OursPolicy", "UserPolicy", "make_policy", "true_plan"]
