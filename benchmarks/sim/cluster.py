"""Discrete-event simulation of a shared cluster running a day of PS training jobs.

One :class:`Cluster` runs one policy over one trace. Jobs arrive, ask for an allocation, wait in a
first-fit queue while the cluster's CPU / memory quota is full, profile (if the policy wants),
train at the hidden true rate of their current allocation (times the job's realised-rate factor,
:func:`rate_factor`, the same for every policy), and are checked by the policy every
control period. The runtime is the same for every policy: checkpoints every ``checkpoint_s`` of
training, and every transition costs what one table says (``cfg.transitions``, the runtime's
measured :class:`~airflow_dlrover.optimizer.transitions.TransitionCosts` on pods): a first start
(a run's or a first probe's) a cold launch; the next probe, the launch after a profile and a
resize the change between the two configurations (``TransitionCosts.of``: workers join or leave,
CPU and memory in place, a PS change with the job's state checkpointed and restored); a failed node
a PS's recovery (the whole state restored) plus the work since the last checkpoint; an OOM-killed
role's relaunch a node relaunch (a PS's, its recovery); a straggler's replacement a node relaunch.

Work is conserved: ``samples_done`` only grows by training and only falls back to the last
checkpoint (the rolled-back samples are counted in ``wasted_samples`` and trained again), so a
finished job has trained its samples exactly once in its final lineage (``samples_done ==
samples``), and ``trained_samples == samples + wasted_samples``.

A policy that asks for more than its job's quota (or than the whole cluster) is refused with
:class:`QuotaExceededError`; a request within the quota that does not fit *now* waits: a start in
the queue, a resize as the job's pending resize (its new pods Pending, as on Kubernetes), applied
as soon as the cluster has room — before the queue's starts, which came later — unless the
policy asks for another configuration first. That is queueing, not an error.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota
from airflow_dlrover.timings import PROBE_REPORT_INTERVAL_S, SUPERVISOR_POLL_S
from sim.truth import BATCH
from sim.workload import JobSpec, SimConfig

BIN_S = 600.0  # resolution of the cluster time series


class QuotaExceededError(InvalidInputError):
    """A policy asked for more than the job's quota or the cluster: a bug in the policy."""

    def __init__(self, policy: str, job: int, what: str, asked: float, allowed: float):
        super().__init__(
            f"policy {policy!r}, job {job}: {what}", f"{asked:g}",
            f"≤ {allowed:g} (the job's quota / the cluster's capacity); the allocation was refused",
        )
        self.policy, self.job, self.what, self.asked, self.allowed = policy, job, what, asked, allowed

    def __reduce__(self):  # picklable across the process pool
        return (type(self), (self.policy, self.job, self.what, self.asked, self.allowed))


# ---------------------------------------------------------------------------------------------
# What policies see and do
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A policy's answer to an arriving job: profile ``probes`` first (then ``after_profile``), each
    measured for ``window_s``, or start on ``config`` directly; neither: the policy never starts it
    (it fails). ``apart``: the probes run on a stand-in of the job, without the tables it starts
    from; what the stand-in trains is thrown away and the job starts cold on its plan."""

    config: Configuration | None = None
    probes: list[Configuration] | None = None
    window_s: float = C.PROBE_WINDOW_S
    apart: bool = False


@dataclass(frozen=True)
class CheckPlan:
    """A policy's answer to a finished profile: measure ``config`` for one more probe of
    ``window_s`` (None: a probe's), the job training on it, before it is launched
    (``after_profile`` is asked again)."""

    config: Configuration
    window_s: float | None = None


@dataclass(frozen=True)
class Resize:
    config: Configuration
    reason: str = ""


@dataclass(frozen=True)
class SetHotPsCpu:
    cpu: float  # new CPU of the hot PS (node ps-0)


@dataclass(frozen=True)
class ReplaceWorker:
    node: int = 0  # index of the worker to replace


@dataclass(frozen=True)
class SetMemory:
    worker_memory_mb: float | None = None
    ps_memory_mb: float | None = None


@dataclass
class Observation:
    """What a control period measured (the metrics the runtime reports)."""

    now_s: float
    config: Configuration
    hot_ps_cpu: float  # CPU limit of ps-0
    windows: list[float]  # job throughput of each measurement window, samples/s
    window_s: float
    worker_cpu_used: float  # mean of the normal workers, cores
    ps_cpu_used: list[float]  # per PS, cores
    worker_memory_used_mb: float
    ps_memory_used_mb: float  # per PS (all PS hold equal shares)
    worker_speeds: list[float]  # per worker samples/s (index 0 = the straggler, if any)
    samples_done: float
    remaining: float
    memory_history: list[tuple[float, float]]  # (time, ps memory used) at each check


@dataclass
class JobRun:
    """The cluster's record of one job (policies read it; ``state`` is the policy's own)."""

    spec: JobSpec
    limit: Quota
    state: dict = field(default_factory=dict)
    phase: str = "arriving"  # queued | profiling | running | done | failed
    config: Configuration | None = None
    hot_ps_cpu: float = 0.0
    request: tuple | None = None  # (kind, config) waiting in the queue
    probes: list[Configuration] = field(default_factory=list)
    probe_index: int = 0
    probe_rows: list[dict] = field(default_factory=list)
    stage_end: float = math.inf
    pause_until: float = 0.0
    samples_done: float = 0.0
    since_checkpoint: float = 0.0
    run_clock: float = 0.0
    wasted_samples: float = 0.0
    trained_samples: float = 0.0
    rate: float = 0.0
    true_rate: float = 0.0
    peak_true_rate: float = 0.0  # the largest truth at any configuration it ran (for sim.bound)
    last_t: float = 0.0
    next_check: float = math.inf
    hazard_left: float = 0.0
    failure_index: int = 0
    hot_active: bool = False
    straggler_active: bool = False
    queued_since: float | None = None
    queue_s: float = 0.0
    start_s: float | None = None
    end_s: float | None = None
    cpu_alloc_s: float = 0.0
    cpu_used_s: float = 0.0
    mem_alloc_s: float = 0.0
    mem_used_s: float = 0.0
    profile_s: float = 0.0
    profile_cost_s: float = 0.0  # profile_s less the plan's true time for what the probes trained
    resizes: int = 0
    deferred: int = 0
    pending: Any = None  # the resize waiting for room (a Resize), applied when it fits
    refused: int = 0
    failures: int = 0
    ooms: int = 0
    oom_streak: int = 0
    oom_at: float = 0.0
    memory_history: list = field(default_factory=list)
    reason: str = ""
    token: int = 0

    @property
    def remaining(self) -> float:
        return self.spec.samples - self.samples_done

    @property
    def alloc_cpu(self) -> float:
        if self.config is None:
            return 0.0
        return self.config.cores + max(self.hot_ps_cpu - self.config.ps_cpu, 0.0)

    @property
    def alloc_mem(self) -> float:
        return 0.0 if self.config is None else self.config.memory_mb


@dataclass(frozen=True)
class FamilyView:
    """What a job's owner declares of its family: its identity, configuration, quota, the size of
    the tables a run starts from (its layout, its checkpoint) and its signature (its kind, model and
    layout: ``Family.signature``) — not its truth."""

    index: int
    user: Configuration
    limit_cpu: float
    limit_memory_mb: float
    start_tables_mb: float
    signature: dict


@dataclass(frozen=True)
class SpecView:
    id: int
    day: int
    arrival_s: float
    samples: float
    family: FamilyView


class JobView:
    """A policy's read-only view of its job: its declaration (``spec``, ``limit``), what it shows
    (phase, configuration, progress, probes and their rows, OOM kills, resizes applied and
    deferred, times) and the policy's own ``state``.
    No path leads from it to the truth, the cluster or another job (the ``_job`` it reads is the
    cluster's, not the policy's); ``refuse`` counts a plan the policy's own quota rule turned down."""

    __slots__ = ("_job", "spec", "limit", "state")

    def __init__(self, job: "JobRun"):
        f = job.spec.family
        self._job, self.limit, self.state = job, job.limit, job.state
        self.spec = SpecView(job.spec.id, job.spec.day, job.spec.arrival_s, job.spec.samples,
                             FamilyView(f.index, f.user, f.limit_cpu, f.limit_memory_mb, f.start_tables_mb,
                                        f.signature))

    phase = property(lambda self: self._job.phase)
    config = property(lambda self: self._job.config)
    config_final = property(lambda self: getattr(self._job, "config_final", None))
    hot_ps_cpu = property(lambda self: self._job.hot_ps_cpu)
    alloc_cpu = property(lambda self: self._job.alloc_cpu)
    samples_done = property(lambda self: self._job.samples_done)
    probes = property(lambda self: tuple(self._job.probes))
    probe_index = property(lambda self: self._job.probe_index)
    probe_rows = property(lambda self: tuple(self._job.probe_rows))
    ooms = property(lambda self: self._job.ooms)
    resizes = property(lambda self: self._job.resizes)
    deferred = property(lambda self: self._job.deferred)  # resizes that waited for room (pods Pending)
    start_s = property(lambda self: self._job.start_s)
    end_s = property(lambda self: self._job.end_s)

    def refuse(self) -> None:
        self._job.refused += 1


@dataclass(frozen=True)
class ClusterView:
    """What a policy may read of the cluster: the clock, the simulation's settings and the
    cluster's capacity (a quota its users know), not its jobs or free room."""

    _cluster: "Cluster"

    @property
    def now(self) -> float:
        return self._cluster.now

    @property
    def cfg(self) -> SimConfig:
        return self._cluster.cfg

    @property
    def capacity(self) -> Quota:
        return self._cluster.capacity


#: True while a policy that may not read the truth is being asked something (``Cluster._ask``):
#: the information test fails any read of the truth meanwhile, whichever module makes it.
IN_POLICY_CALL = [False]


class Policy:
    """Base class: every hook may be overridden; the defaults do nothing. A policy is handed a
    :class:`JobView` of each job and a :class:`ClusterView`, unless it ``reads_truth`` (an oracle:
    the job's :class:`JobRun` and the cluster itself)."""

    name = "policy"
    windows = 3  # measurement windows reported per control period
    reads_truth = False

    def begin(self, cluster: "Cluster | ClusterView") -> None:
        self.cluster = cluster

    def start(self, job: JobRun) -> Start:  # pragma: no cover - interface
        raise NotImplementedError

    def after_profile(self, job: JobRun, samples: list[dict]) -> Configuration | CheckPlan:  # pragma: no cover
        raise NotImplementedError

    def next_probe(self, job: JobRun) -> Configuration | None:
        """The probe the job measures next (``job.probes[job.probe_index]``, as the policy sizes
        it), or None: the profile ends now (``after_profile`` is asked)."""
        return job.probes[job.probe_index]

    def check(self, job: JobRun, obs: Observation) -> list:
        return []

    def check_interval(self, job: JobRun) -> float:
        return self.cluster.cfg.check_s

    def on_onset(self, job: JobRun, kind: str) -> list:
        return []

    def on_oom(self, job: JobRun, obs: Observation, node: str) -> SetMemory | None:
        return SetMemory()  # retry as is

    def finish(self, job: JobRun) -> None:
        pass

    def end(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------------



def rate_factor(cfg: SimConfig, spec: JobSpec) -> float:
    """The job's realised-rate factor, lognormal with cv ``rate_noise``: one draw per job from its
    own seed, the same for every policy (common random numbers; :mod:`sim.bound` uses it too)."""
    if not cfg.rate_noise:
        return 1.0
    return float(np.random.default_rng([spec.seed, 17]).lognormal(0.0, cfg.rate_noise))


def with_memory(config: Configuration, worker_memory_mb: float | None, ps_memory_mb: float | None) -> Configuration:
    """``config`` with the memory per node that is given (None or 0 keeps the current one)."""
    changes = {name: float(value) for name, value in (("worker_memory_mb", worker_memory_mb),
                                                       ("ps_memory_mb", ps_memory_mb)) if value}
    return replace(config, **changes) if changes else config


class Cluster:
    def __init__(self, cfg: SimConfig, trace: list[JobSpec], policy: Policy):
        self.cfg = cfg
        self.policy = policy
        self.capacity = Quota(cpu=cfg.cluster_cpu, memory_mb=cfg.cluster_memory_mb)
        self.jobs = [JobRun(spec, Quota(cpu=spec.family.limit_cpu, memory_mb=spec.family.limit_memory_mb)) for spec in trace]
        self.free_cpu = cfg.cluster_cpu
        self.free_mem = cfg.cluster_memory_mb
        self.queue: list[JobRun] = []
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.rngs = {job.spec.id: np.random.default_rng([job.spec.seed, 11]) for job in self.jobs}
        self.rate_factors = {job.spec.id: rate_factor(cfg, job.spec) for job in self.jobs}
        self._truth_cache: dict = {}
        self._views = {job.spec.id: job if policy.reads_truth else JobView(job) for job in self.jobs}
        self.bins: dict[str, np.ndarray] = {k: np.zeros(16) for k in ("cpu_alloc", "cpu_used", "mem_alloc", "mem_used", "queued")}

    # --- public
    def run(self) -> list[JobRun]:
        self._ask("begin", None, self if self.policy.reads_truth else ClusterView(self))
        for job in self.jobs:
            self._push(job.spec.arrival_s, job, "arrive")
        while self.events:
            t, _, kind, job, token = heapq.heappop(self.events)
            if token != job.token:
                continue
            self.now = t
            if kind == "arrive":
                self._arrive(job)
            else:
                self._wake(job)
        self._ask("end", None)
        return self.jobs

    def _ask(self, hook: str, job: JobRun | None, *args: Any) -> Any:
        """The policy's ``hook``, given its view of ``job`` (none for ``begin`` and ``end``), with
        ``IN_POLICY_CALL`` set for its whole extent unless the policy ``reads_truth``."""
        call = getattr(self.policy, hook)
        IN_POLICY_CALL[0] = not self.policy.reads_truth
        try:
            return call(*args) if job is None else call(self._views[job.spec.id], *args)
        finally:
            IN_POLICY_CALL[0] = False

    def free_quota(self, job: JobRun) -> Quota:
        """What ``job`` may grow to now: its quota, capped by its allocation plus the free cluster."""
        cpu = min(job.limit.cpu, job.alloc_cpu + self.free_cpu)
        mem = min(job.limit.memory_mb, job.alloc_mem + self.free_mem)
        return Quota(cpu=max(cpu, 1.0), memory_mb=max(mem, 1.0))

    # --- events
    def _push(self, t: float, job: JobRun, kind: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, job, job.token))

    def _arrive(self, job: JobRun) -> None:
        job.last_t = self.now
        job.hazard_left = job.spec.failure_exponentials[0] if job.spec.failure_exponentials else math.inf
        decision = self._ask("start", job)
        if decision.probes:
            job.probes = list(decision.probes)
            job.state["window_s"] = decision.window_s
            job.state["apart"] = decision.apart
            self._check_quota(job, max(c.cores for c in job.probes), max(c.memory_mb for c in job.probes))
            cores, memory = max(c.cores for c in job.probes), max(c.memory_mb for c in job.probes)
            if all(c.ps == 0 for c in job.probes):  # an all-reduce job's reservation: no PS either
                reserve = Configuration(1, 0, cores, 0.0, memory, 0.0)
            else:
                reserve = Configuration(1, 1, cores - 0.5, 0.5, memory / 2, memory / 2)
            self._enqueue(job, ("profile", reserve))
        elif decision.config is None:
            self._finish(job, "failed")
            return
        else:
            self._check_config(job, decision.config)
            self._enqueue(job, ("run", decision.config))
        self._dispatch()

    def _enqueue(self, job: JobRun, request: tuple) -> None:
        job.request = request
        job.phase = "queued"
        job.queued_since = self.now
        self.queue.append(job)

    def _dispatch(self) -> None:
        for job in [j for j in self.jobs if j.pending is not None]:
            if job.phase != "running":
                job.pending = None
                continue
            self._advance(job)  # at the old rate until now
            self._apply(job, [job.pending], retry=True)
            if job.pending is None:
                self._schedule(job)
        started = []
        for job in self.queue:
            kind, config = job.request
            if config.cores <= self.free_cpu + 1e-9 and config.memory_mb <= self.free_mem + 1e-6:
                started.append(job)
                self.free_cpu -= config.cores
                self.free_mem -= config.memory_mb
                job.queue_s += self.now - job.queued_since
                job.queued_since = None
                job.last_t = self.now
                if job.start_s is None:
                    job.start_s = self.now
                if kind == "profile":
                    job.config = config  # the reservation (what the probes may use at most)
                    job.phase = "profiling"
                    self._begin_probe(job)
                else:
                    # a profiled job is resized from its last probe; any other starts cold
                    cost = self._transition_s(job, job.state.pop("profiled_on", None), config)
                    job.config = config
                    job.phase = "running"
                    job.pause_until = self.now + cost
                    job.next_check = self.now + cost + self._ask("check_interval", job)
                    self._set_rate(job)
                job.request = None
                self._schedule(job)
        if started:
            self.queue = [j for j in self.queue if j.request is not None]

    def _begin_probe(self, job: JobRun) -> None:
        probe = job.probes[job.probe_index]
        previous = job.state.get("probe")  # None: the first probe starts the job cold
        job.state["probe"] = probe
        job.state["probe_began"] = self.now
        job.pause_until = self.now + self._transition_s(job, previous, probe)
        self._set_rate(job, probe)
        job.stage_end = job.pause_until + self._probe_wall_s(job, probe)

    def _state_mb(self, job: JobRun) -> float:
        """The PS state a checkpoint holds now: the tables (rows and optimiser state) as grown."""
        memory = self._memory(job)
        return 0.0 if memory.replicated else float(memory.tables_mb(job.samples_done))

    def _memory(self, job: JobRun):
        """The memory truth of what runs: the family's; a stand-in's (``Start.apart``) holds only
        the rows it grew itself, none of the tables the job starts from."""
        memory = job.spec.family.memory
        if job.phase == "profiling" and job.state.get("apart"):
            return replace(memory, table_mb=0.0)
        return memory

    def _transition_s(self, job: JobRun, current: Configuration | None, target: Configuration) -> float:
        """What changing ``current`` (None: nothing runs) into ``target`` costs the job."""
        return self.cfg.transitions.of(current, target, in_place=self.cfg.in_place, state_mb=self._state_mb(job))

    def _relaunch_s(self, job: JobRun, role: str) -> float:
        """A role's nodes restarted (OOM-killed, failed): a PS's restore the whole state."""
        costs = self.cfg.transitions
        return costs.ps_recovery_cost_s(self._state_mb(job)) if role == "ps" else costs.node_relaunch_s

    def _probe_window_s(self, job: JobRun) -> float:
        """How long the probe under way is measured: a plan check's own window, else a probe's."""
        return job.state.get("check_window_s") or job.state["window_s"]

    def _probe_wall_s(self, job: JobRun, probe: Configuration) -> float:
        """A probe's wall time once its transition is paid, as ``lifecycle.profiling.measure_probe``
        spends it: the settle (every worker's first report ``PROBE_REPORT_AFTER_S`` after the change,
        up to a report interval later), then the window, until every worker reported past it (polled
        every ``SUPERVISOR_POLL_S``; at most ``PROBE_WINDOW_REPORT_FACTOR`` windows). A worker reports
        after a step, at most every ``PROBE_REPORT_INTERVAL_S`` while profiled:
        max(PROBE_REPORT_INTERVAL_S, BATCH · workers / rate)."""
        window = self._probe_window_s(job)
        step = BATCH * probe.workers / job.true_rate if job.true_rate > 0 else 0.0
        interval = min(max(PROBE_REPORT_INTERVAL_S, step), C.PROBE_WINDOW_REPORT_FACTOR * window)
        return C.PROBE_REPORT_AFTER_S + interval + max(window, interval) + SUPERVISOR_POLL_S

    # --- the core: integrate, then act on the earliest of the job's own events
    def _schedule(self, job: JobRun) -> None:
        job.token += 1
        if job.phase in ("done", "failed", "queued"):
            return
        t, reason = math.inf, ""
        if job.pause_until > self.now:
            t, reason = job.pause_until, "resume"
        else:
            candidates = [(job.stage_end, "probe_end") if job.phase == "profiling" else (job.next_check, "check")]
            if job.rate > 0:
                candidates.append((self.now + job.remaining / job.rate, "complete"))
                spec = job.spec
                if spec.hot_ps_at is not None and not job.hot_active:
                    candidates.append((self._when_done(job, spec.hot_ps_at * spec.samples), "hot_ps"))
                if spec.straggler_at is not None and not job.straggler_active and "straggler_fixed" not in job.state:
                    candidates.append((self._when_done(job, spec.straggler_at * spec.samples), "straggler"))
                candidates.append((self._oom_time(job), "oom"))
                nodes = self._config(job).nodes
                hazard_rate = nodes * self.cfg.node_failure_per_node_hour / 3600.0
                if hazard_rate > 0:
                    candidates.append((self.now + job.hazard_left / hazard_rate, "failure"))
            t, reason = min(candidates)
        if math.isfinite(t):
            job.reason = reason
            self._push(max(t, self.now), job, "wake")

    def _when_done(self, job: JobRun, target: float) -> float:
        if job.samples_done >= target:
            return self.now
        return self.now + (target - job.samples_done) / job.rate

    def _oom_time(self, job: JobRun) -> float:
        config = self._config(job)
        memory = self._memory(job)
        if memory.worker_mb(job.samples_done) > config.worker_memory_mb:
            return self.now
        limit = config.worker_memory_mb if memory.replicated else config.ps_memory_mb
        n_star = memory.samples_to(limit, config.ps)  # the growing node reaches its limit
        if n_star <= job.samples_done:
            return self.now
        if n_star >= job.spec.samples:
            return math.inf
        return self._when_done(job, n_star)

    def _config(self, job: JobRun) -> Configuration:
        return job.state["probe"] if job.phase == "profiling" else job.config

    def _set_rate(self, job: JobRun, config: Configuration | None = None) -> None:
        config = config or self._config(job)
        truth = job.spec.family.truth
        lp = config.ps_cpu
        if job.hot_active:
            hot_cpu = max(job.hot_ps_cpu, config.ps_cpu)
            lp = min(lp, hot_cpu / job.spec.hot_ps_factor)
        x = self._truth(truth, config, lp)[0]
        if job.straggler_active:
            x *= 1.0 - (1.0 - job.spec.straggler_speed) / config.workers
        job.true_rate = x
        job.peak_true_rate = max(job.peak_true_rate, x, self._truth(truth, config, config.ps_cpu)[0])
        job.rate = x * self.rate_factors[job.spec.id]

    def _truth(self, truth, config: Configuration, lp: float) -> tuple[float, float, float]:
        """(throughput, worker CPU used, PS CPU used) of the truth, memoised per configuration."""
        key = (id(truth), config.workers, config.ps, config.worker_cpu, lp)
        hit = self._truth_cache.get(key)
        if hit is None:
            worker, ps = truth.cpu_used(config.workers, config.ps, config.worker_cpu, lp)
            hit = (float(truth.throughput(config.workers, config.ps, config.worker_cpu, lp)), float(worker), float(ps))
            self._truth_cache[key] = hit
        return hit

    def _usage(self, job: JobRun) -> tuple[float, float, list[float], float, float]:
        """(worker cpu used, worker mem used, per-PS cpu used, per-PS mem used, total used cores)."""
        config = self._config(job)
        truth = job.spec.family.truth
        lp = config.ps_cpu
        hot = job.hot_active
        if hot:
            lp = min(lp, max(job.hot_ps_cpu, config.ps_cpu) / job.spec.hot_ps_factor)
        _, worker_cpu, ps_cpu = self._truth(truth, config, lp)
        ps_cpu = min(ps_cpu, config.ps_cpu)
        per_ps = [ps_cpu] * config.ps
        if hot:
            per_ps[0] = min(max(job.hot_ps_cpu, config.ps_cpu), ps_cpu * job.spec.hot_ps_factor)
        memory = self._memory(job)
        worker_mem = min(memory.worker_mb(job.samples_done), config.worker_memory_mb)
        ps_mem = min(float(memory.ps_mb(config.ps, job.samples_done)), config.ps_memory_mb)
        total = config.workers * worker_cpu + sum(per_ps)
        return worker_cpu, worker_mem, per_ps, ps_mem, total

    def _advance(self, job: JobRun) -> None:
        t0, t1 = job.last_t, self.now
        job.last_t = t1
        if t1 <= t0 or job.config is None or job.phase in ("queued", "done", "failed"):
            return
        dt = t1 - t0
        running = t0 >= job.pause_until - 1e-9
        alloc_cpu, alloc_mem = job.alloc_cpu, job.alloc_mem
        if running:
            gained = job.rate * dt
            job.samples_done += gained
            job.trained_samples += gained
            before = job.run_clock
            job.run_clock += dt
            ckpt = self.cfg.checkpoint_s
            if math.floor(job.run_clock / ckpt) > math.floor(before / ckpt):
                job.since_checkpoint = job.rate * (job.run_clock % ckpt)
            else:
                job.since_checkpoint += gained
            nodes = self._config(job).nodes
            job.hazard_left -= nodes * self.cfg.node_failure_per_node_hour / 3600.0 * dt
            _, _, _, _, used_cpu = self._usage(job)
            config = self._config(job)
            memory = self._memory(job)
            middle = job.samples_done - gained / 2
            used_mem = config.workers * min(memory.worker_mb(middle), config.worker_memory_mb) + config.ps * min(
                float(memory.ps_mb(config.ps, middle)), config.ps_memory_mb)
        else:  # launching / recovering / resizing: resources held, little used
            used_cpu = 0.0
            used_mem = 0.25 * alloc_mem
        if job.phase == "profiling":
            job.profile_s += dt
        job.cpu_alloc_s += alloc_cpu * dt
        job.cpu_used_s += used_cpu * dt
        job.mem_alloc_s += alloc_mem * dt
        job.mem_used_s += used_mem * dt
        self._bin(t0, t1, cpu_alloc=alloc_cpu, cpu_used=used_cpu, mem_alloc=alloc_mem, mem_used=used_mem)

    def _bin(self, t0: float, t1: float, **rates: float) -> None:
        last = int(t1 // BIN_S) + 1
        if last >= len(self.bins["cpu_alloc"]):
            size = max(last + 1, 2 * len(self.bins["cpu_alloc"]))
            for key, values in self.bins.items():
                self.bins[key] = np.concatenate([values, np.zeros(size - len(values))])
        b = int(t0 // BIN_S)
        t = t0
        while t < t1:
            end = min(t1, (b + 1) * BIN_S)
            for key, rate in rates.items():
                self.bins[key][b] += rate * (end - t)
            t, b = end, b + 1

    def _wake(self, job: JobRun) -> None:
        self._advance(job)
        reason = job.reason
        if reason == "resume":
            self._set_rate(job)
        elif reason == "probe_end":
            self._probe_done(job)
            return
        elif reason == "complete":
            job.samples_done = job.spec.samples  # exactly: the last shard is done
            self._finish(job, "done")
            return
        elif reason == "check":
            if job.samples_done > job.oom_at:  # trained past the last OOM: it is behind us
                job.oom_streak = 0
            obs = self.observe(job, self.policy.windows)
            job.memory_history.append((self.now, obs.ps_memory_used_mb))
            actions = self._ask("check", job, obs)
            self._apply(job, actions)
            job.next_check = self.now + self._ask("check_interval", job)
        elif reason == "hot_ps":
            job.hot_active = True
            job.hot_ps_cpu = max(job.hot_ps_cpu, self._config(job).ps_cpu)
            self._set_rate(job)
            self._apply(job, self._ask("on_onset", job, "hot_ps"))
        elif reason == "straggler":
            job.straggler_active = True
            self._set_rate(job)
            self._apply(job, self._ask("on_onset", job, "straggler"))
        elif reason == "failure":
            job.failures += 1
            self._lose_since_checkpoint(job)
            job.pause_until = self.now + self._relaunch_s(job, "ps")
            job.failure_index += 1
            draws = job.spec.failure_exponentials
            job.hazard_left = draws[job.failure_index % len(draws)] if draws else math.inf
        elif reason == "oom":
            self._oom(job)
            return
        self._schedule(job)

    def _probe_done(self, job: JobRun) -> None:
        probe = measured_on = job.state["probe"]
        obs = self.observe(job, windows=1)  # one window, measured as a period is (``measure_probe``'s row)
        job.probe_rows.append(dict(
            probe.to_row(), throughput=obs.windows[0], worker_cpu_used=obs.worker_cpu_used,
            ps_cpu_used=float(np.mean(obs.ps_cpu_used)) if probe.ps else math.nan,
            worker_memory_used_mb=obs.worker_memory_used_mb,
            ps_memory_used_mb=obs.ps_memory_used_mb if probe.ps else math.nan, samples_seen=job.samples_done,
            timestamp=self.now, probe_s=self.now - job.state["probe_began"],
        ))
        job.probe_index += 1
        job.oom_streak = 0
        if job.probe_index < len(job.probes):
            probe = self._ask("next_probe", job)
            if probe is None:
                del job.probes[job.probe_index:]
            else:
                job.probes[job.probe_index] = probe
                self._check_quota(job, probe.cores, probe.memory_mb)
                self._reserve_for_probes(job)
        if job.probe_index < len(job.probes):
            self._begin_probe(job)
            self._schedule(job)
            return
        decision = self._ask("after_profile", job, list(job.probe_rows))
        job.state.pop("check_window_s", None)
        if decision is None:  # the policy launches nothing
            self._finish(job, "failed")
            return
        checking = isinstance(decision, CheckPlan)
        config = decision.config if checking else decision
        self._check_config(job, config)
        if checking:  # one more probe, on the plan's own resources
            job.probes.append(config)
            job.state["check_window_s"] = decision.window_s
        else:
            plan_rate = self._truth(job.spec.family.truth, config, config.ps_cpu)[0] * self.rate_factors[job.spec.id]
            if job.state.get("apart"):  # the stand-in's training is thrown away; the job starts cold
                job.wasted_samples += job.samples_done
                job.samples_done = job.since_checkpoint = job.run_clock = 0.0
            job.profile_cost_s = max(job.profile_s - job.samples_done / plan_rate, 0.0)
            job.state.pop("probe", None)
            if config == job.config and not job.state.get("apart"):  # the checked plan runs on as it is
                job.phase = "running"
                job.next_check = self.now + self._ask("check_interval", job)
                self._set_rate(job)
                self._schedule(job)
                return
        if not checking and not job.state.get("apart"):
            job.state["profiled_on"] = measured_on  # the launch resizes the job from its last probe
        self._release(job)
        job.config = None
        self._enqueue(job, ("profile" if checking else "run", config))
        self._dispatch()

    def _reserve_for_probes(self, job: JobRun) -> None:
        """Grow a profiling job's reservation to its largest probe's memory (if the cluster has
        room), as ``_arrive`` made it."""
        need = min(max(c.memory_mb for c in job.probes), job.limit.memory_mb, self.capacity.memory_mb)
        if need > job.config.memory_mb:
            grown = {"worker_memory_mb": need} if job.config.ps == 0 else {"worker_memory_mb": need / 2,
                                                                          "ps_memory_mb": need / 2}
            self._try_config(job, Configuration(**{**probe_row(job.config), **grown}), cost_s=0.0)

    def _lose_since_checkpoint(self, job: JobRun) -> None:
        lost = min(job.since_checkpoint, job.samples_done)
        job.samples_done -= lost
        job.wasted_samples += lost
        job.since_checkpoint = 0.0
        job.run_clock = 0.0

    def _oom(self, job: JobRun) -> None:
        job.ooms += 1
        job.oom_streak += 1
        config = self._config(job)
        memory = self._memory(job)
        node = "worker" if config.ps == 0 or memory.worker_mb(job.samples_done) > config.worker_memory_mb else "ps"
        obs = self.observe(job)
        # What the kernel reports of a node it killed: its usage reached its limit (not what it needed).
        if node == "worker":
            obs.worker_memory_used_mb = config.worker_memory_mb
        else:
            obs.ps_memory_used_mb = config.ps_memory_mb
        job.oom_at = job.samples_done
        self._lose_since_checkpoint(job)
        answer = self._ask("on_oom", job, obs, node) if job.oom_streak <= self.cfg.max_oom_retries else None
        if answer is None:
            self._finish(job, "failed")
            return
        if job.phase == "profiling":  # the probes relaunch with the answer's memory (the rest too)
            def bigger(probe: Configuration) -> Configuration:
                row = probe_row(probe)
                row["worker_memory_mb"] = max(row["worker_memory_mb"], answer.worker_memory_mb or 0.0)
                row["ps_memory_mb"] = max(row["ps_memory_mb"], answer.ps_memory_mb or 0.0)
                return Configuration(**row)

            job.state["probe"] = bigger(job.state["probe"])
            job.probes = [bigger(p) for p in job.probes]
            self._reserve_for_probes(job)
            job.pause_until = self.now + self._relaunch_s(job, node)
            job.stage_end = job.pause_until + self._probe_window_s(job)
            self._schedule(job)
            return
        target = with_memory(config, answer.worker_memory_mb, answer.ps_memory_mb)
        if not self._try_config(job, target, cost_s=self._relaunch_s(job, node)):
            # Does not fit now: give the resources back and wait for the larger allocation.
            self._release(job)
            job.config = None
            self._enqueue(job, ("run", target))
            self._dispatch()
            return
        self._schedule(job)

    def _finish(self, job: JobRun, phase: str) -> None:
        job.phase = phase
        job.end_s = self.now
        job.rate = 0.0
        self._release(job)
        job.config_final = job.config
        self._ask("finish", job)
        self._schedule(job)
        self._dispatch()

    def _release(self, job: JobRun) -> None:
        self.free_cpu += job.alloc_cpu
        self.free_mem += job.alloc_mem
        job.hot_ps_cpu = 0.0  # a relaunch starts every PS at the group's CPU

    # --- allocation changes
    def _check_quota(self, job: JobRun, cpu: float, mem: float) -> None:
        for what, asked, allowed in (
            ("cpu", cpu, min(job.limit.cpu, self.capacity.cpu)),
            ("memory_mb", mem, min(job.limit.memory_mb, self.capacity.memory_mb)),
        ):
            if asked > allowed + 1e-6:
                raise QuotaExceededError(self.policy.name, job.spec.id, what, asked, allowed)

    def _check_config(self, job: JobRun, config: Configuration) -> None:
        if not isinstance(config, Configuration):
            raise InvalidInputError("config", config, "a Configuration")
        if config.batch_size != BATCH:
            raise InvalidInputError("batch_size", config.batch_size, f"{BATCH} (the simulated jobs' batch)")
        self._check_quota(job, config.cores, config.memory_mb)

    def _try_config(self, job: JobRun, target: Configuration, *, cost_s: float, hot_cpu: float | None = None,
                    count_deferral: bool = True) -> bool:
        """Move a running job to ``target`` (refused past the quota; deferred if the cluster lacks room)."""
        if hot_cpu is None:  # a healed hot PS keeps its extra cores over the group's
            healed = max(job.hot_ps_cpu - job.config.ps_cpu, 0.0) if job.config is not None else 0.0
            hot = target.ps_cpu + healed
        else:
            hot = hot_cpu
        extra = max(hot - target.ps_cpu, 0.0)
        self._check_quota(job, target.cores + extra, target.memory_mb)
        d_cpu = target.cores + extra - job.alloc_cpu
        d_mem = target.memory_mb - job.alloc_mem
        if d_cpu > self.free_cpu + 1e-9 or d_mem > self.free_mem + 1e-6:
            job.deferred += count_deferral
            return False
        self.free_cpu -= d_cpu
        self.free_mem -= d_mem
        job.config = target
        job.hot_ps_cpu = hot if extra > 0 else target.ps_cpu
        job.pause_until = max(job.pause_until, self.now + cost_s)
        return True

    def _apply(self, job: JobRun, actions: list, retry: bool = False) -> None:
        """Carry out a policy's actions; a resize that does not fit now becomes the job's pending
        one (``retry``: this is its retry, and it was counted deferred once already)."""
        for action in actions or []:
            if job.phase != "running":
                return
            current = job.config
            if isinstance(action, Resize):
                job.pending = None  # a newer resize (or this one, applied now) replaces it
                if action.config == current:
                    continue
                self._check_config(job, action.config)
                cost = self._transition_s(job, current, action.config)
                # A healed hot PS keeps its extra cores (over the group's) through a resize that
                # leaves the PS as they are; one that changes them restarts it at the group's CPU
                # (``BaseLauncher.resize``), and the guard heals it again.
                same_ps = (action.config.ps, action.config.ps_cpu, action.config.ps_memory_mb) == (
                    current.ps, current.ps_cpu, current.ps_memory_mb)
                healed = max(job.hot_ps_cpu - current.ps_cpu, 0.0) if job.hot_active and same_ps else 0.0
                hot_cpu = action.config.ps_cpu + healed
                if self._try_config(job, action.config, cost_s=cost, hot_cpu=hot_cpu, count_deferral=not retry):
                    job.resizes += 1
                    if action.config.ps != current.ps:  # PS change: checkpoint, re-partition, restart
                        job.since_checkpoint = 0.0
                        job.run_clock = 0.0
                else:
                    job.pending = action
            elif isinstance(action, SetHotPsCpu):
                healed = replace(current, ps_cpu=action.cpu)  # one PS's CPU: a PS resource change's cost
                if action.cpu > job.hot_ps_cpu and self._try_config(
                        job, current, cost_s=self._transition_s(job, current, healed), hot_cpu=action.cpu):
                    job.resizes += 1
            elif isinstance(action, ReplaceWorker):
                if job.straggler_active:
                    job.straggler_active = False
                    job.state["straggler_fixed"] = True
                    job.pause_until = max(job.pause_until, self.now + self.cfg.transitions.node_relaunch_s)
            elif isinstance(action, SetMemory):
                target = with_memory(current, action.worker_memory_mb, action.ps_memory_mb)
                if target != current and self._try_config(job, target, cost_s=self._transition_s(job, current, target)):
                    job.resizes += 1
            else:
                raise InvalidInputError("action", action, "Resize | SetHotPsCpu | ReplaceWorker | SetMemory")
        self._set_rate(job)

    # --- measurements
    def observe(self, job: JobRun, windows: int = 3) -> Observation:
        """What the runtime measures: each window's throughput, each worker's speed and each node's
        CPU with their own noise (``window_noise``, ``usage_noise``), memory with ``memory_noise``
        (never past the limit)."""
        config = self._config(job)
        worker_cpu, worker_mem, per_ps, ps_mem, _ = self._usage(job)
        rng = self.rngs[job.spec.id]

        def noisy(values, cv):
            values = np.asarray(values, dtype=float)
            return values * rng.lognormal(0.0, cv, values.shape) if cv else values

        measured = noisy(np.full(windows, job.true_rate), self.cfg.window_noise).tolist()
        per_worker = job.true_rate / config.workers
        speeds = [per_worker] * min(config.workers, 8)
        if job.straggler_active:
            slow = 1.0 - (1.0 - job.spec.straggler_speed) / config.workers
            normal = job.true_rate / slow / config.workers
            speeds = [normal * job.spec.straggler_speed] + [normal] * (min(config.workers, 8) - 1)
        speeds = noisy(speeds, self.cfg.window_noise).tolist()
        worker_cpu = float(min(noisy(worker_cpu, self.cfg.usage_noise), config.worker_cpu))
        limits = [max(job.hot_ps_cpu, config.ps_cpu) if i == 0 else config.ps_cpu for i in range(len(per_ps))]
        per_ps = [float(min(v, limit)) for v, limit in zip(noisy(per_ps, self.cfg.usage_noise), limits)]
        worker_mem = float(min(noisy(worker_mem, self.cfg.memory_noise), config.worker_memory_mb))
        ps_mem = float(min(noisy(ps_mem, self.cfg.memory_noise), config.ps_memory_mb)) if config.ps else ps_mem
        return Observation(
            now_s=self.now, config=config, hot_ps_cpu=max(job.hot_ps_cpu, config.ps_cpu), windows=measured,
            window_s=60.0, worker_cpu_used=worker_cpu, ps_cpu_used=per_ps, worker_memory_used_mb=worker_mem,
            ps_memory_used_mb=ps_mem, worker_speeds=speeds, samples_done=job.samples_done,
            remaining=job.remaining, memory_history=list(job.memory_history),
        )


def probe_row(config: Configuration) -> dict[str, Any]:
    return config.to_row()
