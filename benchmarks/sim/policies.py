"""The four policies compared on identical traces.

``user``     the configuration the job's owner wrote (per family), never changed; an OOM is
             retried as is (Airflow retries), and fails again.
``dlrover``  DLRover 0.6.1's own ``PSJobResourceOptimizer`` / ``PSLocalOptimizer`` (its venv,
             through :mod:`.dlrover_bridge`), configured as its users write an ElasticJob in
             auto mode (``optimizeMode: single-job``): the per-node CPU and memory of the owner's
             configuration as its original resources, no replica counts — so DLRover chooses
             the counts, keeps the owner's PS CPU and memory, and takes its own worker size
             (``_check_ignore_original_*_resource``). Then its stage machine every 300 s
             (``SEC_INTERVAL_TO_OPTIMIZE``) fed with the runtime stats, its OOM recovery (×2
             memory). Its plans are applied as DLRover's auto-scaler applies them; one that does
             not fit the cluster now stays pending until it does (as its pods would); one past
             the job's quota is refused (as a Kubernetes ResourceQuota would) and counted.
             DLRover 0.6.1 has no straggler handling for PS jobs.
``ours``     the product's controller, as the DAG runs it, behind a translator: the simulated
             job becomes the controller's ``Observation`` (its probe rows, then every period's
             windows, every node's status and the per-node usage), and the actions ``step``
             returns become the cluster's (a ``Probe`` is a probe or the plan's check, a ``Launch``
             the run's start, a ``Resize``, ``Heal`` or ``Relaunch`` what the cluster can do of
             it); an OOM kill is a failed node's observation, the step after it (the guard's
             retry) relaunches. The state starts at ``controller.begin``, given the size of the
             tables the job starts from, as the DAG gives the layout's (a cold start's; a warm
             start, from the family's earlier runs in this simulation, has none), and its prior
             is ``job_model.choose_prior`` over the family's earlier models, its memory margins
             from the family's OOM kills, as the history store's; a family with none starts from
             the models of families of its signature (``similarity.similar_prior``: a one-off
             family's earlier jobs). The policy decides nothing itself.
``oracle-jct`` the least-JCT plan on the truth: the configuration of most true throughput under
             the job's quota (memory for the true peak, instability healed at onset as ``oracle``
             heals it): the reference for speed, where ``oracle`` is the reference for efficiency.
``oracle``   the *knee reference*, not a bound: the same objective as ``ours`` (the efficiency
             knee by default) evaluated on the true function over every configuration the planner
             searches under the job's quota (``planner.search_range``), memory sized
             for the true peak, instability healed at onset. Another policy can run a job faster
             (the owner's larger allocation sometimes does); the per-job run-time lower bound is
             :mod:`sim.bound` (the ``bound`` row). It is the only policy that reads the truth
             (``tests/simulate``: a tripwire fails any other).

An all-reduce family (no PS, ``truth.AllReduce``) is known to be one by every policy, as its owner
declares it (``trainer.kind``): ``ours`` probes and plans it on the all-reduce grid; ``dlrover``
runs it as DLRover 0.6.1's ``AllreduceJobResourceOptimizer`` does — the owner's worker resources
as written (its ``get_job_resource_plan`` adds workers only on free GPU nodes, a query 0.6.1 leaves
returning 0), and an OOM-killed worker relaunched as it was (its ``adjust_oom_resource`` is empty).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from functools import lru_cache

import numpy as np

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import (
    ControllerState, Fail, Heal, Launch, Observation as Seen, Probe, Relaunch, Resize as ResizeAction, begin, step,
)
from airflow_dlrover.optimizer.job_model import JobModel, choose_prior
from airflow_dlrover.optimizer.similarity import similar_prior
from airflow_dlrover.optimizer.planner import Configurations, configurations, knee, pareto_front, search_range
from airflow_dlrover.optimizer.types import (
    Configuration, InvalidInputError, NodeState, NodeStatus, Phase, Quota, Reason,
)
from sim.cluster import (
    CheckPlan,
    JobRun,
    JobView,
    Observation,
    Policy,
    ReplaceWorker,
    Resize,
    SetHotPsCpu,
    SetMemory,
    Start,
)
from sim.truth import BATCH

POLICIES = ("user", "user-adapts", "dlrover", "ours", "oracle", "oracle-jct")


def _config(w, p, lw, lp, wm, pm) -> Configuration:
    return Configuration(int(w), int(p), float(lw), float(lp), float(wm), float(pm), 0, BATCH)


# ---------------------------------------------------------------------------------------------
# user
# ---------------------------------------------------------------------------------------------


def users_config(job: JobView) -> Configuration:
    """The configuration the job's owner wrote."""
    u = job.spec.family.user
    return _config(u.workers, u.ps, u.worker_cpu, u.ps_cpu, u.worker_memory_mb, u.ps_memory_mb)


class UserPolicy(Policy):
    name = "user"

    def start(self, job: JobView) -> Start:
        return Start(config=users_config(job))


class AdaptingUserPolicy(UserPolicy):
    """An owner who learns from the job's own runs: after an OOM kill the killed role's memory
    doubles (within the job's quota), and each day's run copies the fastest configuration that
    completed in the last ``WEEK_DAYS`` days (memory as raised), else the last one it ran."""

    name = "user-adapts"
    WEEK_DAYS = 7

    def __init__(self):
        self.runs: dict[int, list[tuple[int, Configuration, float]]] = {}  # family → (day, config, run s)

    def start(self, job: JobView) -> Start:
        runs = [r for r in self.runs.get(job.spec.family.index, ()) if job.spec.day - r[0] <= self.WEEK_DAYS]
        if not runs:
            return Start(config=users_config(job))
        done = [r for r in runs if math.isfinite(r[2])]
        config = min(done, key=lambda r: r[2])[1] if done else runs[-1][1]
        return Start(config=config)

    def on_oom(self, job: JobView, obs: Observation, node: str) -> SetMemory | None:
        c = obs.config
        count, memory = (c.ps, c.ps_memory_mb) if node == "ps" else (c.workers, c.worker_memory_mb)
        room = (job.limit.memory_mb - (c.memory_mb - count * memory)) / count
        grown = min(2.0 * memory, math.floor(room / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB)
        if grown <= memory:
            return SetMemory()  # nothing more fits: retried as is
        return SetMemory(ps_memory_mb=grown) if node == "ps" else SetMemory(worker_memory_mb=grown)

    def finish(self, job: JobView) -> None:
        run_s = job.end_s - job.start_s if job.phase == "done" else math.inf
        config = getattr(job, "config_final", None) or job.config
        if config is not None:
            self.runs.setdefault(job.spec.family.index, []).append((job.spec.day, config, run_s))


# ---------------------------------------------------------------------------------------------
# oracle
# ---------------------------------------------------------------------------------------------


def is_allreduce(job: JobView | JobRun) -> bool:
    """The job's family trains without PS (its owner says so: ``trainer.kind``)."""
    return job.spec.family.user.ps == 0


@lru_cache(maxsize=4)
def planner_configurations(cpu: float, allreduce: bool) -> Configurations:
    """Every configuration the planner searches under ``cpu`` cores (``planner.search_range``: every
    node size, no GPU), in its order."""
    return configurations(search_range(cpu, allreduce=allreduce), cpu)


def true_plan(job: JobRun, objective: str, quota: Quota, truth_on_grid: np.ndarray | None = None) -> Configuration:
    """The best configuration on the *true* function, by the planner's own rules and range.
    ``truth_on_grid``: the true throughput over ``planner_configurations``, when already computed."""
    family = job.spec.family
    grid = planner_configurations(quota.cpu, is_allreduce(job))
    w, p, lw, lp = grid.workers, grid.ps, grid.worker_cpu, grid.ps_cpu
    x = family.truth.throughput(w, p, lw, lp) if truth_on_grid is None else truth_on_grid
    memory = family.memory
    granule = C.MEMORY_GRANULARITY_MB
    worker_mem = float(np.ceil(memory.worker_mb(job.spec.samples) / granule) * granule)
    ps_need = np.concatenate([[0.0], np.ceil(memory.ps_mb(np.arange(1, grid.range.max_ps + 1), job.spec.samples)
                                             / granule) * granule])
    total_mem = w * worker_mem + p * ps_need[p]
    feasible = total_mem <= quota.memory_mb
    xf = np.where(feasible, x, -np.inf)
    if objective == "throughput":
        best = int(np.argmax(xf))
    else:
        best = knee(pareto_front(grid.cores, xf), x, grid.cores)
    return _config(w[best], p[best], lw[best], lp[best], worker_mem, ps_need[p[best]])


class OraclePolicy(Policy):
    """The knee reference: ``ours``' objective planned on the truth (not a bound on run time)."""

    reads_truth = True

    #: Families' truths over their quota's configurations kept (the runs of a family on one day share it).
    KEPT_TRUTHS = 8

    def __init__(self, objective: str = "efficiency", name: str = "oracle"):
        self.objective, self.name = objective, name
        self._truth_on_grid: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def start(self, job: JobRun) -> Start:
        # A family's truth over its quota's configurations is the same for every run of a day;
        # memory (and so what is feasible) depends on this run's samples.
        family, key = job.spec.family, (job.spec.family.index, job.spec.day)
        if key not in self._truth_on_grid:
            grid = planner_configurations(job.limit.cpu, is_allreduce(job))
            self._truth_on_grid[key] = family.truth.throughput(grid.workers, grid.ps, grid.worker_cpu, grid.ps_cpu)
            while len(self._truth_on_grid) > self.KEPT_TRUTHS:
                self._truth_on_grid.popitem(last=False)
        self._truth_on_grid.move_to_end(key)
        return Start(config=true_plan(job, self.objective, job.limit, self._truth_on_grid[key]))

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


class OursPolicy(Policy):
    name = "ours"

    def __init__(self, objective: str = "efficiency", *, similar_priors: bool = True):
        self.objective = objective
        self.similar_priors = similar_priors  # False: a family without history starts cold (an ablation)
        self.history: dict[int, list[JobModel]] = {}  # a family's models, newest first (the history store's)
        self.oom_history: dict[int, list[set[str]]] = {}  # the roles OOM-killed in each run, newest first
        self.signatures: dict[int, dict] = {}  # each family's signature, as its profile recorded it
        self.last_configs: dict[int, Configuration] = {}  # the configuration each family's last run ended on
        self.fits = 0
        self.steps = 0

    # --- the profile, fit and launch tasks: the controller's phases before training
    def start(self, job: JobView) -> Start:
        family = job.spec.family
        prior = choose_prior(self.history.get(family.index, ()))  # only this simulation's earlier runs
        if prior is not None and prior.memory is not None:
            prior = replace(prior, memory=prior.memory.with_oom_history(self.oom_history.get(family.index, ())))
        similar = None if prior is not None or not self.similar_priors else similar_prior(family.signature, (
            (str(index), self.signatures[index], found.throughput) for index, models in self.history.items()
            if index != family.index and (found := choose_prior(models)) is not None))
        self.signatures[family.index] = family.signature
        # A real job knows the size of the tables it starts from (its layout, its checkpoint), not
        # how they will grow: the probes' PS (an all-reduce job's workers) hold at least them.
        job.state["controller"] = begin(job.limit, self.objective, prior=prior, batch_size=BATCH,
                                        table_mb=family.start_tables_mb, table_start_mb=family.start_tables_mb,
                                        allreduce=is_allreduce(job),
                                        similar=similar, last_run_config=self.last_configs.get(family.index))
        job.state["fed"] = 0
        action = self._advance(job, self._profile_seen(job, None))
        if isinstance(action, Probe):
            state: ControllerState = job.state["controller"]
            return Start(probes=[action.config, *state.probes[state.probes_issued:]], window_s=state.window_s,
                         apart=action.apart)
        if isinstance(action, Launch):
            return Start(config=action.plan.config)
        return Start()

    def next_probe(self, job: JobView) -> Configuration | None:
        action = self._advance(job, self._profile_seen(job, job.state.get("probe")))
        if isinstance(action, Probe) and job.state["controller"].phase == Phase.PROFILING:
            return action.config
        job.state["after_profile"] = action
        return None

    def after_profile(self, job: JobView, samples: list[dict]) -> Configuration | CheckPlan | None:
        if "after_profile" in job.state:
            action = job.state.pop("after_profile")
        else:
            action = self._advance(job, self._profile_seen(job, job.state.get("probe")))
        if isinstance(action, Probe):
            return CheckPlan(action.config, action.window_s)
        return action.plan.config if isinstance(action, Launch) else None

    def _profile_seen(self, job: JobView, config: Configuration | None) -> Seen:
        """What a profiling job shows: the probe rows measured since the last step; a stand-in's
        samples are not the job's (``lifecycle.profiling``: the whole job remains)."""
        windows = tuple(job.probe_rows[job.state["fed"]:])
        job.state["fed"] = len(job.probe_rows)
        done = 0.0 if job.state["controller"].apart else job.samples_done
        return _seen(self.cluster.cfg, job, self.cluster.now, config, done, windows=windows)

    def _advance(self, job: JobView, seen: Seen):
        """Step while the phase changes without an action to carry out (as the fit task's step
        is followed by the launch task's); returns the probe, launch or failure asked for, or None."""
        while True:
            phase = job.state["controller"].phase
            actions = self._step(job, seen)
            seen = replace(seen, windows=())
            action = next((a for a in actions if isinstance(a, (Probe, Launch, Fail))), None)
            if action is not None or job.state["controller"].phase == phase:
                return action

    # --- the fine-tune and the guard: observe, step, apply
    def check(self, job: JobView, obs: Observation) -> list:
        config = obs.config
        ps = bool(config.ps)  # an all-reduce job's rows have no PS usage (as a trainer's reports)
        windows = tuple(dict(config.to_row(), throughput=x, worker_cpu_used=obs.worker_cpu_used,
                             ps_cpu_used=float(np.mean(obs.ps_cpu_used)) if ps else math.nan,
                             worker_memory_used_mb=obs.worker_memory_used_mb,
                             ps_memory_used_mb=obs.ps_memory_used_mb if ps else math.nan, samples_seen=obs.samples_done,
                             timestamp=obs.now_s) for x in obs.windows)
        actions = self._step(job, _seen(self.cluster.cfg, job, obs.now_s, config, obs.samples_done, obs.hot_ps_cpu,
                                        windows=windows, usage=_usage(obs)))
        out = []
        for action in actions:
            if isinstance(action, ResizeAction):
                out.append(Resize(action.config, action.describe()))
            elif isinstance(action, Heal) and action.node == "ps-0" and action.cpu:
                out.append(SetHotPsCpu(action.cpu))
            elif isinstance(action, Relaunch) and action.reason == Reason.STRAGGLER:
                out.append(ReplaceWorker(int(action.node.split("-")[1])))
        return out

    def on_oom(self, job: JobView, obs: Observation, node: str) -> SetMemory | None:
        """Every node of the killed role is OOM-killed (they hold equal shares): the guard's try
        reports it, its retry relaunches them with the memory the controller gives."""
        killed = _seen(self.cluster.cfg, job, obs.now_s, obs.config, obs.samples_done, obs.hot_ps_cpu, oom_role=node)
        if job.phase != "profiling":  # a kill while it trains: a plan's memory (a probe's is a guess)
            job.state.setdefault("oom_roles", set()).add(node)
        self._step(job, killed)  # Fail(retryable): the try reports the failure
        actions = self._step(job, killed)
        if any(isinstance(a, Fail) for a in actions):
            return None
        grown = [a.memory_mb for a in actions if isinstance(a, Relaunch) and a.memory_mb]
        if not grown:
            return None
        return SetMemory(worker_memory_mb=min(grown)) if node == "worker" else SetMemory(ps_memory_mb=min(grown))

    def _step(self, job: JobView, seen: Seen) -> list:
        self.steps += 1
        before: ControllerState = job.state["controller"]
        job.state["controller"], actions = step(before, seen)
        if job.state["controller"].model is not before.model:
            self.fits += 1
        return actions

    def finish(self, job: JobView) -> None:
        state: ControllerState | None = job.state.get("controller")
        if state is not None and state.model is not None:  # the run's model joins the history store's
            self.history.setdefault(job.spec.family.index, []).insert(0, state.model)
        if job.config_final is not None:  # the history store's records of its launch and resizes
            self.last_configs[job.spec.family.index] = job.config_final
        if state is not None:  # and its OOM kills while it trained (the guard's events)
            self.oom_history.setdefault(job.spec.family.index, []).insert(0, job.state.get("oom_roles", set()))


def _seen(cfg, job: JobView, now_s: float, config: Configuration | None, samples_done: float,
          hot_ps_cpu: float = 0.0, *,
          windows: tuple = (), usage: tuple = (), oom_role: str | None = None) -> Seen:
    """The controller's observation of a simulated job (``cfg``: the simulation's, whose transition
    table the job pays, as a real job's observer reads its launcher's): its configuration's nodes (ps-0 with its
    own CPU once healed), those of ``oom_role`` OOM-killed (one incarnation per kill: ``restarts``
    = the kills); none before it runs."""
    nodes = []
    if config is not None:
        nodes.append(NodeStatus("master", "master", 0, NodeState.RUNNING, T.MASTER_CPU, T.MASTER_MEMORY_MB))
        for role, count, cpu, memory in (("ps", config.ps, config.ps_cpu, config.ps_memory_mb),
                                         ("worker", config.workers, config.worker_cpu, config.worker_memory_mb)):
            state = NodeState.OOM_KILLED if role == oom_role else NodeState.RUNNING
            for i in range(count):
                node_cpu = hot_ps_cpu if role == "ps" and i == 0 and hot_ps_cpu else cpu
                nodes.append(NodeStatus(f"{role}-{i}", role, i, state, node_cpu, memory, restarts=job.ooms,
                                        reason="OOM-killed" if role == oom_role else ""))
    return Seen(now_s, config, samples_done=samples_done, samples_total=job.spec.samples, windows=windows,
                nodes=tuple(nodes), usage=usage, transitions=cfg.transitions, in_place=cfg.in_place)


def _usage(obs: Observation) -> tuple:
    """The period's per-node usage rows (the workers the cluster reports speeds of, every PS)."""
    config = obs.config
    rows = [{"time_s": obs.now_s, "node": f"ps-{i}", "role": "ps", "cpu_used": used,
             "cpu_limit": obs.hot_ps_cpu if i == 0 else config.ps_cpu, "memory_used_mb": obs.ps_memory_used_mb,
             "memory_limit_mb": config.ps_memory_mb, "throughput": None, "age_s": math.inf}
            for i, used in enumerate(obs.ps_cpu_used)]
    rows += [{"time_s": obs.now_s, "node": f"worker-{k}", "role": "worker", "cpu_used": obs.worker_cpu_used,
              "cpu_limit": config.worker_cpu, "memory_used_mb": obs.worker_memory_used_mb,
              "memory_limit_mb": config.worker_memory_mb, "throughput": speed, "age_s": math.inf}
             for k, speed in enumerate(obs.worker_speeds)]
    return tuple(rows)


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

    def check_interval(self, job: JobView) -> float:
        # DLRover asks its optimizer every 300 s; when its stage machine can only answer with an
        # empty plan until its PS interval passes (it says so), the next ask is then.
        quiet = job.state.get("quiet_until")
        now = self.cluster.now
        if quiet is not None and quiet > now + _DLROVER_OPT_INTERVAL_S:
            return quiet - now + 1.0
        return _DLROVER_OPT_INTERVAL_S

    def start(self, job: JobView) -> Start:
        if is_allreduce(job):  # AllreduceJobResourceOptimizer: the owner's worker resources
            return Start(config=users_config(job))
        user = users_config(job)  # the ElasticJob's per-node resources; DLRover chooses the counts
        reply = self.bridge.call([{"op": "new", "job": str(job.spec.id), "now": self.cluster.now,
                                   "cpu": job.limit.cpu, "memory_bytes": int(job.limit.memory_mb * 2**20),
                                   "worker": {"cpu": user.worker_cpu, "memory_mb": user.worker_memory_mb},
                                   "ps": {"cpu": user.ps_cpu, "memory_mb": user.ps_memory_mb}}])[0]
        groups = reply["groups"]
        worker, ps = groups["worker"], groups["ps"]
        config = _config(max(worker["count"], 1), max(ps["count"], 1), worker["cpu"] or 1, ps["cpu"] or 1,
                         worker["memory_mb"] or _DLROVER_DEFAULT_MEMORY_MB, ps["memory_mb"] or _DLROVER_DEFAULT_MEMORY_MB)
        return Start(config=config)

    def _reports(self, job: JobView, obs: Observation) -> list[dict]:
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

    def check(self, job: JobView, obs: Observation) -> list:
        if is_allreduce(job):  # get_job_resource_plan: no free GPU node ever, the same workers
            return []
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

    def _guarded(self, job: JobView, actions: list) -> list:
        """A plan past the job's quota is refused by the cluster (like a ResourceQuota)."""
        kept = []
        cpu = min(job.limit.cpu, self.cluster.capacity.cpu)
        mem = min(job.limit.memory_mb, self.cluster.capacity.memory_mb)
        for action in actions:
            if isinstance(action, Resize):
                extra = max(job.hot_ps_cpu - action.config.ps_cpu, 0.0)
                if action.config.cores + extra > cpu or action.config.memory_mb > mem:
                    job.refuse()
                    continue
            if isinstance(action, SetHotPsCpu) and job.alloc_cpu + action.cpu - max(job.hot_ps_cpu, job.config.ps_cpu) > cpu:
                job.refuse()
                continue
            kept.append(action)
        return kept

    def on_oom(self, job: JobView, obs: Observation, node: str) -> SetMemory | None:
        c = obs.config
        if is_allreduce(job):  # adjust_oom_resource does nothing: relaunched as it was
            return SetMemory(worker_memory_mb=c.worker_memory_mb)
        kind = "ps" if node == "ps" else "worker"
        memory = c.ps_memory_mb if kind == "ps" else c.worker_memory_mb
        cpu = c.ps_cpu if kind == "ps" else c.worker_cpu
        reply = self.bridge.call([{"op": "oom", "job": str(job.spec.id), "now": obs.now_s, "type": kind,
                                   "name": f"{kind}-0", "cpu": cpu, "memory_mb": memory}])[0]
        new = float(max(reply["memory_mb"], reply["group_memory_mb"]))
        count = c.ps if kind == "ps" else c.workers
        other = c.memory_mb - count * memory
        if other + count * new > job.limit.memory_mb:
            job.refuse()
            return None
        return SetMemory(ps_memory_mb=new) if kind == "ps" else SetMemory(worker_memory_mb=new)

    def finish(self, job: JobView) -> None:
        if not is_allreduce(job):
            self.bridge.call([{"op": "close", "job": str(job.spec.id)}])


def make_policy(name: str, *, objective: str = "efficiency", bridge=None) -> Policy:
    if name == "user":
        return UserPolicy()
    if name == "oracle":
        return OraclePolicy(objective)
    if name == "oracle-jct":
        return OraclePolicy("throughput", name="oracle-jct")
    if name == "user-adapts":
        return AdaptingUserPolicy()
    if name == "ours":
        return OursPolicy(objective)
    if name == "dlrover":
        if bridge is None:
            raise InvalidInputError("policies", name, "dlrover with its venv (see dlrover_bridge)")
        return DLRoverPolicy(bridge)
    raise InvalidInputError("policies", name, " | ".join(POLICIES))


__all__ = ["POLICIES", "AdaptingUserPolicy", "DLRoverPolicy", "OraclePolicy", "OursPolicy", "UserPolicy", "is_allreduce",
           "make_policy",
           "true_plan"]
