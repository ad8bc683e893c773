"""The trace: days of DLRM retraining jobs arriving at a shared cluster.

Everything random about the workload is drawn here, once per seed, so that every policy sees the
same jobs, the same hidden truths and the same instability draws (common random numbers).

* **Job families.** A family is one recommendation model retrained every day
  (``jobs_per_family`` runs a day, at the same hours each day: a daily schedule): the same
  hidden performance function, memory model and user-written configuration. Between days the
  family **drifts**: its truth's ``scale`` follows a lognormal random walk (``drift_sigma`` a
  day: features added, the model reworked), its tables grow (``table_growth`` a day) and so do
  its samples (``data_growth`` a day); a truth with a ``day`` field is told the day. A policy
  that keeps history has it from the family's earlier runs in the simulation only, so
  ``days = 1`` is the cold scenario (a family's first runs) and days 2… the warm one.
* **Harder work.** A fraction ``one_off_fraction`` of the families are **one-off** jobs: each
  day's run is a job nobody ran before (a family index of its own: no history, ever). A fraction
  ``shift_fraction`` **shift** once, on a day ≥ 2 drawn for each: its tables double, or its data
  doubles, or (a PS job not large) its model changes: a fresh truth. Both from streams of their own.
* **Arrivals.** Each of a family's daily runs has an hour of the day drawn once from a diurnal
  density (busier in the working hours), plus a jitter each day (``arrival_jitter_s``).
* **Truth** families: ``queueing`` tables (three physics), the ``measured`` roofline, random
  ``roofline``\\ s, ``moving_shard`` (hot row ranges that move each day; see :mod:`.truth`), each scaled by a model-size factor — and, for a fraction
  ``allreduce_fraction`` of the families, data-parallel ``allreduce`` jobs without PS (p = 0,
  tables replicated on every worker; their owners write a worker count and size, no PS). Those
  are drawn from a stream of their own, so that the PS families are the same for any fraction.
  Likewise a fraction ``large_fraction`` are **large** PS jobs (``_large_truth``, issue 20): wide
  embeddings (rows of 1–2 KB, 48–96 lookups a sample) that only many PS links serve, workers that
  gain little past one core, tables of ~150 GB — at their best hundreds of workers and more than
  64 PS, under quotas of 240–960 cores (their owners write 128–256 workers and 32–64 PS).
* **User configurations** mimic what DLRover and the DLRover-RM paper report of manual settings:
  generous CPU per node (CPU utilisation ~15–35 %), memory at 2–6× the need (memory utilisation
  ~15–35 %), and a fraction ``user_underprovision`` of families whose PS memory is below the peak
  their tables grow to (they OOM part-way). Written once, for the first day, and kept.
* **Instability** (per job, same draws for every policy): node failures at
  ``node_failure_per_node_hour`` (a unit-exponential sequence consumed by each job's node-hours),
  a hot PS with probability ``hot_ps_probability`` (one PS's load ×``hot_ps_factor`` from a point
  of its progress on), a straggling worker with probability ``straggler_probability`` (runs at
  ``straggler_speed`` of the others), and PS memory growth (every job; past its limit = OOM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from airflow_dlrover.optimizer.transitions import TransitionCosts, measured as measured_transitions
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError

from sim.truth import (
    AllReduce,
    MemoryTruth,
    MovingHotShard,
    QueueingTable,
    Roofline,
    Truth,
    measured_roofline,
)


@dataclass(frozen=True)
class SimConfig:
    """Knobs of the simulated days. Defaults are the issue's evaluation setting."""

    #: Jobs a day.
    jobs: int = 1000
    seed: int = 1
    days: int = 1
    day_s: float = 86_400.0
    #: The cluster quota shared by all jobs (cores, MB).
    cluster_cpu: float = 8000.0
    cluster_memory_mb: float = 40_000.0 * 1024
    #: Runs of a family a day (a family is one model retrained on a daily schedule).
    jobs_per_family: int = 1
    #: Day-to-day drift (ours): σ of the daily lognormal step of a truth's scale; growth a day of
    #: the tables (uniform range) and of the samples (uniform range, each day × lognormal 0.1).
    drift_sigma: float = 0.05
    table_growth: tuple[float, float] = (0.0, 0.03)
    data_growth: tuple[float, float] = (0.0, 0.04)
    #: Families whose every run is new (no history ever), and families that shift once (tables or
    #: data × 2, or a new model) on a day ≥ 2.
    one_off_fraction: float = 0.0
    shift_fraction: float = 0.0
    #: σ of a run's arrival around its family's hour of the day.
    arrival_jitter_s: float = 900.0
    #: Samples per job: lognormal median and σ, clipped.
    samples_median: float = 4e8
    samples_sigma: float = 0.7
    #: Instability rates.
    node_failure_per_node_hour: float = 0.002
    hot_ps_probability: float = 0.15
    hot_ps_factor: tuple[float, float] = (1.6, 3.0)
    straggler_probability: float = 0.15
    straggler_speed: tuple[float, float] = (0.15, 0.5)
    user_underprovision: float = 0.12
    #: Families of data-parallel jobs without PS (all-reduce; ``truth.AllReduce``).
    allreduce_fraction: float = 0.0
    #: Families of large PS jobs (``_large_truth``): hundreds of workers, more than 64 PS.
    large_fraction: float = 0.0
    #: Relative noise (lognormal cv) of the realised training rate and of each measured window.
    rate_noise: float = 0.03
    window_noise: float = 0.05
    #: Relative noise of a period's CPU reading per node (cgroup CPU seconds over a window shared
    #: with GC and data loading) and of a memory reading (the allocator's sawtooth).
    usage_noise: float = 0.05
    memory_noise: float = 0.02
    #: The runtime: checkpoint interval and what each transition costs every policy (the runtime's
    #: measured table on pods, ``optimizer.transitions``); a Kubernetes ≥ 1.33 cluster resizes a
    #: node's CPU and memory in place. A probe's window is the policy's (``cluster.Start``).
    checkpoint_s: float = 600.0
    transitions: TransitionCosts = field(default_factory=lambda: measured_transitions().on_kubernetes())
    in_place: bool = True
    #: The policies' control loop: fine-tune / guard period.
    check_s: float = 600.0
    #: Retries after an OOM before a job is given up (Airflow retries / DLRover relaunches).
    max_oom_retries: int = 3
    #: Instability switches (tests turn them off).
    instability: bool = True

    def without_instability(self) -> "SimConfig":
        return replace(self, instability=False, node_failure_per_node_hour=0.0, hot_ps_probability=0.0,
                       straggler_probability=0.0, user_underprovision=0.0)


@dataclass(frozen=True)
class Family:
    index: int
    truth: Truth
    memory: MemoryTruth
    user: Configuration  # the owner's hand-set configuration (one vocabulary: a configuration is a row)
    limit_cpu: float  # per-job quota the owner is granted (cores)
    limit_memory_mb: float
    typical_samples: float
    #: The tables a run starts from (MB): what its layout and checkpoint tell the job, not how
    #: they will grow (``memory`` is the truth).
    start_tables_mb: float
    #: ``daily``, ``one-off`` (each run a new job) or what shifted it: ``tables×2``, ``data×2``, ``model``.
    recurrence: str = "daily"
    #: The family's model and feature layout (its first index): a one-off family's jobs, each of
    #: its own, share it, as two teams' jobs on one layout do.
    layout: int = -1

    @property
    def signature(self) -> dict:
        """What a job of the family knows of its work per sample (``optimizer.similarity``): its
        kind, its model and layout, and its tables' size (their rows, at a fixed width)."""
        return {"trainer": "allreduce" if self.user.ps == 0 else "ps", "model": f"layout-{self.layout}",
                "rows": self.start_tables_mb}


@dataclass(frozen=True)
class JobSpec:
    id: int
    family: Family
    arrival_s: float
    samples: float
    #: Instability draws (fractions of progress; factors; exponentials).
    hot_ps_at: float | None
    hot_ps_factor: float
    straggler_at: float | None
    straggler_speed: float
    failure_exponentials: tuple[float, ...] = field(repr=False, default=())
    seed: int = 0
    #: The day of the trace (0: the family's first).
    day: int = 0


def _truth(rng: np.random.Generator) -> Truth:
    kind = rng.choice(["queueing", "measured", "roofline", "moving_shard"], p=[0.4, 0.2, 0.3, 0.1])
    if kind == "queueing":
        return QueueingTable(physics=str(rng.choice(["default", "hot_shard", "net_bound"])),
                             scale=float(rng.lognormal(0.0, 0.4)))
    if kind == "measured":
        base, _ = measured_roofline()
        # The runtime's DLRM is tiny (~40k samples/s per worker core): production models are
        # 5–20× heavier per sample.
        return replace(base, scale=float(rng.lognormal(math.log(0.12), 0.4)))
    if kind == "moving_shard":
        return _moving_shard_truth(rng)
    return _roofline_truth(rng)


def _roofline_truth(rng: np.random.Generator) -> Roofline:
    return Roofline(
        c_w=float(2.5e-4 * rng.lognormal(0.0, 0.4)),
        f=float(rng.uniform(0.8, 0.97)),
        o=float(rng.uniform(1e-3, 5e-3)),
        kappa=float(3e-6 * rng.lognormal(0.0, 0.5)),
        r=float(5e-5 * rng.lognormal(0.0, 0.5)),
        skew=float(rng.choice([0.0, 0.8, 1.0, 1.1])),
        bandwidth=float(rng.choice([2.5e8, 1.25e9, 3.1e9])),
        io=float(rng.choice([np.inf, np.inf, rng.uniform(1.5e5, 6e5)])),
        ratio=float(rng.uniform(6, 24)),
        gamma=float(rng.choice([0.0, 0.0, rng.uniform(0.002, 0.02)])),
    )


def _moving_shard_truth(rng: np.random.Generator) -> MovingHotShard:
    """A family whose hot row ranges move from day to day (``truth.MovingHotShard``; day 0 here)."""
    return MovingHotShard(
        seed=int(rng.integers(2**31)),
        hot=float(rng.uniform(0.08, 0.35)),
        n_hot=int(rng.choice([1, 2, 3])),
        lock_cores=float(rng.uniform(1.5, 4.0)),
        c_w=float(2.5e-4 * rng.lognormal(0.0, 0.4)),
        f=float(rng.uniform(0.8, 0.97)),
        o=float(rng.uniform(1e-3, 5e-3)),
        kappa=float(6e-6 * rng.lognormal(0.0, 0.5)),
        r=float(5e-5 * rng.lognormal(0.0, 0.5)),
        io=float(rng.choice([np.inf, np.inf, rng.uniform(1.5e5, 6e5)])),
        scale=float(rng.lognormal(0.0, 0.4)),
    )


def _memory(rng: np.random.Generator, typical_samples: float) -> MemoryTruth:
    table = float(rng.lognormal(math.log(12_000), 0.6))
    alpha = float(rng.uniform(0.6, 1.0))
    grown = table * float(rng.uniform(0.15, 0.8))  # growth over a typical run
    return MemoryTruth(
        ps_base_mb=float(rng.uniform(400, 1000)),
        table_mb=table,
        growth_mb_per_m=grown / (typical_samples / 1e6) ** alpha,
        alpha=alpha,
        worker_base_mb=float(rng.uniform(800, 2500)),
        activation_mb_per_sample=float(rng.uniform(0.5, 2.0)),
    )


def _allreduce_truth(rng: np.random.Generator) -> AllReduce:
    return AllReduce(
        c_w=float(2.5e-4 * rng.lognormal(0.0, 0.4)),
        f=float(rng.uniform(0.8, 0.97)),
        o=float(rng.uniform(1e-3, 5e-3)),
        sigma=float(rng.uniform(0.02, 0.1)),
        model_bytes=float(rng.lognormal(math.log(5e7), 0.8)),  # dense part + the touched rows' gradients
        bandwidth=float(rng.choice([1.25e9, 3.1e9, 1.25e10])),
        latency=float(rng.uniform(2e-5, 1e-4)),
        rack=float(rng.choice([4, 8, 16])),
        oversubscription=float(rng.uniform(2.0, 4.0)),
        overlap=float(rng.uniform(0.3, 0.8)),
        io=float(rng.choice([np.inf, np.inf, rng.uniform(1.5e5, 6e5)])),
        scale=float(rng.lognormal(0.0, 0.4)),
    )


def _large_truth(rng: np.random.Generator) -> Roofline:
    """A large PS job: wide embedding rows through each PS's link (``bandwidth`` / (2 · rows · bytes)
    samples/s a PS: 3–25 k), workers of low Amdahl fraction (small workers pay best) — so its best
    configurations have ~2 workers a PS and hundreds of each (``family = "large"``)."""
    return Roofline(
        c_w=float(2.5e-4 * rng.lognormal(0.0, 0.3)),
        f=float(rng.uniform(0.3, 0.6)),
        o=float(rng.uniform(1e-3, 3e-3)),
        kappa=float(3e-6 * rng.lognormal(0.0, 0.4)),
        rows=float(rng.uniform(48.0, 96.0)),
        r=float(5e-5 * rng.lognormal(0.0, 0.4)),
        skew=float(rng.choice([0.0, 0.0, 0.6])),
        bandwidth=float(rng.choice([1.25e9, 2.5e9])),
        bytes_per_row=float(rng.choice([1024.0, 2048.0])),
        scale=float(rng.lognormal(0.0, 0.3)),
        family="large",
    )


def _large_memory(rng: np.random.Generator, typical_samples: float) -> MemoryTruth:
    """Tables of ~150 GB (at most 400 GB) over the PS; small workers."""
    table = float(min(rng.lognormal(math.log(150_000), 0.5), 400_000.0))
    alpha = float(rng.uniform(0.6, 1.0))
    grown = table * float(rng.uniform(0.1, 0.4))
    return MemoryTruth(ps_base_mb=float(rng.uniform(400, 1000)), table_mb=table,
                       growth_mb_per_m=grown / (typical_samples / 1e6) ** alpha, alpha=alpha,
                       worker_base_mb=float(rng.uniform(600, 1200)), activation_mb_per_sample=float(rng.uniform(0.5, 1.0)))


def _large_user(rng: np.random.Generator, memory: MemoryTruth, typical_samples: float, underprovision: bool) -> Configuration:
    """What an owner writes for a large job: 128–256 workers of 1–2 cores, 32–64 PS of 2–4 (at most
    768 cores: a quota ≤ 960), memory at 1.5–3× the workers' need and 1.8–4× a generous run's PS peak."""
    workers = int(rng.choice([128, 192, 256]))
    ps = int(rng.choice([32, 48, 64]))
    worker_cpu = float(rng.choice([1.0, 2.0]))
    ps_cpu = float(rng.choice([2.0, 4.0]))
    worker_mem = _round_up(memory.worker_mb() * rng.uniform(1.5, 3.0), 1024)
    ps_mem = _round_up(float(memory.ps_mb(ps, 2.0 * typical_samples)) * rng.uniform(1.8, 4.0), 1024)
    if underprovision:
        start, end = float(memory.ps_mb(ps, 0.0)), float(memory.ps_mb(ps, typical_samples))
        ps_mem = _round_up(start + (end - start) * rng.uniform(0.2, 0.6), 256)
    return Configuration(workers, ps, worker_cpu, ps_cpu, worker_mem, ps_mem)


def _allreduce_memory(rng: np.random.Generator, typical_samples: float) -> MemoryTruth:
    """Replicated tables: small enough for every worker to hold (larger ones are sharded on PS)."""
    table = float(rng.lognormal(math.log(1500), 0.5))
    alpha = float(rng.uniform(0.6, 1.0))
    grown = table * float(rng.uniform(0.1, 0.5))
    return MemoryTruth(ps_base_mb=0.0, table_mb=table, growth_mb_per_m=grown / (typical_samples / 1e6) ** alpha,
                       alpha=alpha, worker_base_mb=float(rng.uniform(800, 2500)),
                       activation_mb_per_sample=float(rng.uniform(0.5, 2.0)), replicated=True)


def _allreduce_user(rng: np.random.Generator, memory: MemoryTruth, typical_samples: float, underprovision: bool) -> Configuration:
    workers = int(rng.choice([2, 4, 8, 16, 32], p=[0.15, 0.3, 0.3, 0.15, 0.1]))
    worker_cpu = float(rng.choice([4.0, 8.0, 16.0], p=[0.3, 0.5, 0.2]))
    peak = memory.worker_mb(2.0 * typical_samples)
    worker_mem = _round_up(peak * rng.uniform(1.5, 3.0), 1024)
    if underprovision:  # sized for the day the tables were small
        start, end = memory.worker_mb(0.0), memory.worker_mb(typical_samples)
        worker_mem = _round_up(start + (end - start) * rng.uniform(0.2, 0.6), 256)
    return Configuration(workers, 0, worker_cpu, 0.0, worker_mem, 0.0)


def _round_up(value: float, step: float) -> float:
    return float(math.ceil(value / step) * step)


def _user(rng: np.random.Generator, memory: MemoryTruth, typical_samples: float, underprovision: bool) -> Configuration:
    workers = int(rng.choice([4, 8, 12, 16, 24, 32], p=[0.15, 0.25, 0.15, 0.2, 0.1, 0.15]))
    ps = int(max(1, min(16, round(workers / rng.choice([2, 4, 8])))))
    worker_cpu = float(rng.choice([2.0, 4.0, 8.0], p=[0.3, 0.5, 0.2]))
    ps_cpu = float(rng.choice([2.0, 4.0, 8.0], p=[0.3, 0.5, 0.2]))
    worker_mem = _round_up(memory.worker_mb() * rng.uniform(2.5, 6.0), 1024)
    peak = float(memory.ps_mb(ps, 2.0 * typical_samples))  # a generous run's peak
    ps_mem = _round_up(peak * rng.uniform(1.8, 4.0), 1024)
    if underprovision:
        # Sized for the day the table was small: enough to start, not for the growth.
        start = float(memory.ps_mb(ps, 0.0))
        end = float(memory.ps_mb(ps, typical_samples))
        ps_mem = _round_up(start + (end - start) * rng.uniform(0.2, 0.6), 256)
    return Configuration(workers, ps, worker_cpu, ps_cpu, worker_mem, ps_mem)


def on_day(family: Family, day: int, scale_step: float, table_step: float, data_step: float) -> Family:
    """The family on ``day``: truth scale × ``scale_step``, tables × ``table_step``, samples ×
    ``data_step`` (each the product of the days' factors so far); the user's configuration kept."""
    truth = replace(family.truth, scale=family.truth.scale * scale_step)
    if any(f.name == "day" for f in fields(truth)):
        truth = replace(truth, day=day)
    memory = replace(family.memory, table_mb=family.memory.table_mb * table_step,
                     growth_mb_per_m=family.memory.growth_mb_per_m * table_step)
    return replace(family, truth=truth, memory=memory, typical_samples=family.typical_samples * data_step,
                   start_tables_mb=memory.table_mb)


def _diurnal_hours(rng: np.random.Generator, n: int, day_s: float) -> np.ndarray:
    """``n`` times of day from the density ∝ 1 + 0.6·sin(2π(t/day − 0.375)) (peak mid-afternoon), by thinning."""
    times: list[float] = []
    while len(times) < n:
        t = rng.uniform(0.0, day_s, size=4 * n + 8)
        keep = rng.random(t.size) < (1.0 + 0.6 * np.sin(2 * np.pi * (t / day_s - 0.375))) / 1.6
        times.extend(t[keep].tolist())
    return np.asarray(times[:n])


def generate_trace(config: SimConfig) -> list[JobSpec]:
    """Every day's jobs, sorted by arrival; a deterministic function of ``config``."""
    if config.days < 1 or config.jobs_per_family < 1:
        raise InvalidInputError("days / jobs_per_family", f"{config.days} / {config.jobs_per_family}", "integers ≥ 1")
    rng = np.random.default_rng([config.seed, 7])
    n_families = max(1, int(round(config.jobs / config.jobs_per_family)))
    families = []
    for index in range(n_families):
        typical = float(np.clip(rng.lognormal(math.log(config.samples_median), config.samples_sigma), 2e7, 6e9))
        truth = _truth(rng)
        memory = _memory(rng, typical)
        under = bool(rng.random() < config.user_underprovision)
        user = _user(rng, memory, typical, under)
        own = np.random.default_rng([config.seed, 13, index])  # the all-reduce draws' own stream
        large = np.random.default_rng([config.seed, 17, index])  # the large families' own stream
        if own.random() < config.allreduce_fraction:
            truth, memory = _allreduce_truth(own), _allreduce_memory(own, typical)
            user = _allreduce_user(own, memory, typical, under)
        elif large.random() < config.large_fraction:
            typical = float(np.clip(large.lognormal(math.log(3e9), 0.4), 2e7, 6e9))  # billions of samples a day
            truth, memory = _large_truth(large), _large_memory(large, typical)
            user = _large_user(large, memory, typical, under)
        limit_cpu = float(max(64.0, _round_up(user.cores * 1.25, 16)))
        limit_mem = float(max(limit_cpu * 4096.0, _round_up(user.memory_mb * 1.25, 1024)))
        families.append(Family(index, truth, memory, user, limit_cpu, limit_mem, typical, memory.table_mb,
                               layout=index))

    # A family's daily runs: hours drawn once; the jobs a day are the families' runs.
    slots = [(f, hour) for f in families for hour in _diurnal_hours(rng, config.jobs_per_family, config.day_s)]
    drift = np.random.default_rng([config.seed, 19])
    steps = np.ones((n_families, config.days, 3))
    if config.days > 1:
        steps[:, 1:, 0] = drift.lognormal(0.0, config.drift_sigma, (n_families, config.days - 1))
        steps[:, 1:, 1] = 1.0 + drift.uniform(*config.table_growth, (n_families, 1))
        steps[:, 1:, 2] = (1.0 + drift.uniform(*config.data_growth, (n_families, 1))) \
            * drift.lognormal(0.0, 0.1, (n_families, config.days - 1))
    shifts = {}  # family index → (day, what, the new truth of a model change)
    for family in families:
        one_off = np.random.default_rng([config.seed, 23, family.index])
        shift = np.random.default_rng([config.seed, 29, family.index])
        if one_off.random() < config.one_off_fraction:
            families[family.index] = replace(family, recurrence="one-off")
        elif shift.random() < config.shift_fraction and config.days > 2:
            kinds = ["tables×2", "data×2"] if family.user.ps == 0 or family.truth.family == "large" else [
                "tables×2", "data×2", "model"]  # a new model of an all-reduce or large job is not drawn
            day, what = int(shift.integers(2, config.days)), str(shift.choice(kinds))
            shifts[family.index] = (day, what, _truth(shift) if what == "model" else None)
            if what != "model":
                steps[family.index, day, 1 if what == "tables×2" else 2] *= 2.0
    slots = [(families[f.index], hour) for f, hour in slots]
    steps = np.cumprod(steps, axis=1)

    runs = []
    for day in range(config.days):
        jitter = rng.normal(0.0, config.arrival_jitter_s, len(slots)) if day else np.zeros(len(slots))
        for (family, hour), dt in zip(slots, jitter):
            s = steps[family.index, day]
            shift = shifts.get(family.index)
            if shift is not None and day >= shift[0]:
                family = replace(family, recurrence=shift[1], truth=shift[2] or family.truth)
            today = on_day(family, day, *s) if day else family
            if family.recurrence == "one-off":  # a job of its own every day: no history links its runs
                today = replace(today, index=family.index + (day + 1) * len(families))
            runs.append((day * config.day_s + float(np.clip(hour + dt, 0.0, config.day_s - 1.0)), day, today))
    runs.sort(key=lambda r: r[0])

    jobs = []
    for i, (arrival, day, family) in enumerate(runs):
        samples = float(np.clip(family.typical_samples * rng.lognormal(0.0, 0.25), 1e7, 1e10))
        # Every draw is made whatever its outcome, so that the stream stays aligned across
        # families of either kind (an all-reduce family has no PS to run hot).
        hot, hot_at = rng.random() < config.hot_ps_probability, float(rng.uniform(0.1, 0.7))
        strag, strag_at = rng.random() < config.straggler_probability, float(rng.uniform(0.05, 0.7))
        jobs.append(JobSpec(
            id=i, family=family, arrival_s=float(arrival), samples=samples,
            hot_ps_at=hot_at if config.instability and hot and family.user.ps > 0 else None,
            hot_ps_factor=float(rng.uniform(*config.hot_ps_factor)),
            straggler_at=strag_at if config.instability and strag else None,
            straggler_speed=float(rng.uniform(*config.straggler_speed)),
            failure_exponentials=tuple(rng.exponential(1.0, 16).tolist()),
            seed=int(rng.integers(2**31)),
            day=day,
        ))
    return jobs
