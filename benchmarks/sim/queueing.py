"""Discrete-event queueing simulation of parameter-server (PS) DLRM training.

Why this exists
---------------
The optimizer fits a closed-form throughput model (DLRover-RM style) to profile samples. To check
its accuracy honestly, the samples must come from a *different* model family. This module produces
them from a small event-driven simulation of PS training, in which throughput emerges from queues
(PS cores, PS network cards) rather than from a formula. A cluster simulator can use
:func:`simulate_config` as its hidden "true" performance function.

What is simulated
-----------------
``workers`` workers run asynchronously with respect to each other; each one repeats a step:

1. **Dense compute** of a batch of ``B`` samples on the worker, alone (no shared resource):
   ``B * dense_core_s_per_sample / effective_cores(worker_cpu) + step_overhead_s``, times a
   lognormal noise factor (mean 1, coefficient of variation ``noise_cv``). ``effective_cores`` is
   Amdahl's law above one core and the CPU quota (``c``) below one core. A worker with GPUs
   instead spends ``B * gpu_s_per_sample / worker_gpu`` on the GPU plus an input pipeline of
   ``B * input_core_s_per_sample / worker_cpu`` on its CPUs.
2. **Embedding lookup.** The batch needs ``B * rows_per_sample`` embedding rows. Row ids follow a
   Zipf law (exponent ``zipf_skew``; 0 = uniform) over ``embedding_ids`` ids that are hashed onto
   the PS, so a skew makes the PS holding the hot ids hot. Each step draws the per-PS row counts
   from a multinomial with those shares. The worker sends one request to every PS. At a PS the
   request queues FCFS for the PS's cores: ``ps_cpu`` = λ cores are modelled as ``ceil(λ)``
   parallel servers each running at speed ``λ / ceil(λ)``. Service costs
   ``ps_core_s_per_request + rows * ps_core_s_per_row`` core-seconds, inflated by
   ``1 + ps_contention * (requests already waiting at that PS)`` (lock / scheduler contention,
   which is what makes throughput *fall* when many workers crowd few PS) and by the noise
   factor. The reply then queues on the PS's network card (one FCFS server per PS, time
   ``rows * bytes_per_row / ps_bandwidth_bytes_s``) and reaches the worker ``rpc_latency_s``
   later. The worker waits for all replies.
3. **Gradient push**: the same row counts go back; the gradients first cross the PS's network
   card (same FCFS server), then queue for its cores at ``ps_update_core_s_per_row``, and the
   acknowledgement reaches the worker ``rpc_latency_s`` later. The worker waits for all of them,
   and the step is done.

Workers start at a random offset in ``[0, start_jitter_s)``. The run continues until
``workers * steps_per_worker`` steps have completed (all workers keep running until then, so the
measurement never includes a tail where some workers have stopped). The first
``warmup_fraction`` of the completions is discarded: throughput is the samples completed between
the warm-up completion and the last one, divided by that time. CPU use is the busy core-seconds of
the worker compute (input pipeline only, for GPU workers; a worker waiting for the PS is idle) and
of the PS servers within the same window, per node; it never exceeds the allocation. Memory is a
working-set model with a small noise: a PS holds ``ps_base_mb + embedding_table_mb / ps`` plus one
in-flight request buffer per worker, a worker ``worker_base_mb + B * activation_mb_per_sample``
plus its embedding rows and their gradients. It is the *demand* and is not capped by the
allocation (a cluster simulator may compare it with the allocation to decide on OOM).

The event loop is a heap of plain tuples ``(time, code, worker, ps)``. A resource is assigned
when a request *arrives* at it (events run in time order, so every earlier arrival has been
assigned already and FCFS is exact): one event per request per internal hand-over (cores →
network card for a lookup, network card → cores for a push) plus three per worker step, i.e.
``2 * ps + 3`` events per step. Service times with their noise are drawn up front per step. CPU
use is accounted without per-request records: busy time assigned so far minus the work still
ahead of the current time, snapshotted at the two window ends.

Defaults (see :class:`Physics`) describe a small DLRM (Criteo-like: 26 sparse features, 64-dim
fp32 embeddings, a 2.5 GB table) on CPUs: one worker with 1 core and ``B = 512`` trains at about
2,900 samples/s; one 1-core PS saturates at about 8 such workers (~12,500 samples/s) and with 32
workers throughput falls ~10 % below that peak as requests queue; four 1-core PS peak at about 16
workers (~47,000 samples/s). Throughput rises with worker cores with diminishing returns (Amdahl)
and with PS cores until the workers become the bottleneck.

Performance
-----------
About 0.21 s per configuration at ``workers = 32, ps = 16`` with the default 200 steps per worker,
the largest configuration of the intended grid (best of 5: 0.200-0.207 s; medians of repeated
runs 0.21-0.28 s on this shared VM); ``workers = 32, ps = 8`` takes ~0.11 s and
``workers = 8, ps = 4`` ~0.013 s. The cost is about 1 µs per event, so it grows as
``workers * steps_per_worker * (2 * ps + 3)``. Measured on the 2-core development machine (AMD
EPYC, Python 3.11, numpy 2.4) from the repository root with::

    python -m timeit -n 1 -r 5 -s "from sim.queueing import simulate_config
    as s; c = dict(workers=32, ps=16, worker_cpu=1, ps_cpu=1)" "s(c)"

(one line; the break after ``simulate_config`` is for this docstring only).

Only the standard library, numpy and pandas are used.
"""

from __future__ import annotations

import heapq
import math
import struct
from collections import deque
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, USAGE_COLUMNS

__all__ = [
    "CONFIG_COLUMNS",
    "MEASURED_COLUMNS",
    "SAMPLE_COLUMNS",
    "CONFIG_DEFAULTS",
    "Physics",
    "simulate_config",
    "simulate_samples",
]

#: The measured columns a profile sample adds to its configuration.
MEASURED_COLUMNS = ("throughput", *USAGE_COLUMNS)
#: The columns of a simulated profile sample, in order.
SAMPLE_COLUMNS = CONFIG_COLUMNS + MEASURED_COLUMNS
#: Values used for optional configuration columns that are absent (or NaN).
CONFIG_DEFAULTS: dict[str, float] = {
    "worker_memory_mb": 4096.0,
    "ps_memory_mb": 4096.0,
    "worker_gpu": 0,
    "batch_size": 512,
}
_REQUIRED = ("workers", "ps", "worker_cpu", "ps_cpu")
_INTEGER = ("workers", "ps", "worker_gpu", "batch_size")
_MIB = float(2**20)
#: Fixed seed of the id → PS hash, so that the hot PS is a property of the job, not of the run.
_HASH_SEED = 20240601

# Event codes. Ties in time are broken by code, then worker, then PS: deterministic.
_LOOKUP = 0  # a worker finished its dense compute: send lookups to every PS
_LOOKUP_NIC = 1  # a PS finished a lookup on its cores: the reply goes onto its network card
_PUSH = 2  # a worker has all lookup replies: send gradients to every PS
_PUSH_CPU = 3  # gradients crossed a PS's network card: the update queues for its cores
_STEP_DONE = 4  # a worker has all acknowledgements (or starts): next dense compute


@dataclass(frozen=True)
class Physics:
    """The hidden physics of the simulated job and cluster. Times in seconds, sizes in bytes/MB.

    The defaults describe a small DLRM (Criteo-like) trained on CPU nodes with a 10 Gbit/s
    network; they are chosen so that, over workers 1..32, PS 1..8 and 0.5..8 cores per node, the
    throughput curves show worker-bound growth, PS saturation and a mild decline under crowding.
    """

    dense_core_s_per_sample: float = 2.5e-4
    """Core-seconds of dense forward+backward per sample on one CPU core (B=512: 0.128 s)."""

    dense_parallel_fraction: float = 0.9
    """Amdahl parallel fraction of the dense compute: ``c`` cores act as
    ``1 / ((1 - f) + f / c)`` cores when ``c >= 1`` (8 cores ≈ 4.7). Below one core the CPU
    quota simply slows the worker down (``c`` cores act as ``c``)."""

    step_overhead_s: float = 0.002
    """Fixed per-step framework overhead on one core (graph dispatch, bookkeeping)."""

    gpu_s_per_sample: float = 1.0e-5
    """GPU-seconds of dense compute per sample on one GPU (used when ``worker_gpu > 0``)."""

    input_core_s_per_sample: float = 2.0e-5
    """Core-seconds of input pipeline (parsing, batching) per sample on a GPU worker; perfectly
    parallel over the worker's cores. CPU workers' input cost is part of the dense cost."""

    rows_per_sample: float = 26.0
    """Embedding rows looked up per sample (one per sparse feature; Criteo has 26)."""

    embedding_ids: int = 720720
    """Number of distinct embedding ids over which the Zipf law is spread (lcm(1..16), so that a
    uniform law splits exactly evenly over up to 16 PS)."""

    zipf_skew: float = 0.8
    """Zipf exponent of the id popularity; 0 = uniform. With the ids hashed onto the PS, 0.8
    (mild, the default) makes the hottest PS carry about 1.07× its fair share at 4 PS, 1.11× at
    8 and 1.2× at 16; 1.0 gives 1.24×, 1.48× and 2.0×; 1.1 gives 1.38×, 1.82× and 2.8×."""

    ps_core_s_per_row: float = 1.0e-6
    """PS core-seconds to look up (gather and serialise) one embedding row."""

    ps_update_core_s_per_row: float = 2.0e-6
    """PS core-seconds to apply the gradient of one row (optimizer update, e.g. Adagrad)."""

    ps_core_s_per_request: float = 5.0e-5
    """PS core-seconds of fixed RPC handling per request (so more PS are not free)."""

    ps_contention: float = 0.005
    """Relative slow-down of a PS request per request already waiting at that PS when it arrives
    (lock and scheduler contention): 30 waiting requests make service 15 % slower."""

    bytes_per_row: float = 256.0
    """Bytes per embedding row on the wire (64-dim float32)."""

    ps_bandwidth_bytes_s: float = 1.25e9
    """Network bandwidth of a PS node (10 Gbit/s), one FCFS transfer at a time."""

    rpc_latency_s: float = 5.0e-4
    """Fixed round-trip latency of one RPC, paid once by each reply/acknowledgement."""

    noise_cv: float = 0.05
    """Coefficient of variation of the lognormal noise (mean 1) on every worker compute and every
    PS service time. 0 = deterministic service times."""

    start_jitter_s: float = 0.05
    """Workers start at a uniform random offset in ``[0, start_jitter_s)``."""

    warmup_fraction: float = 0.2
    """Fraction of the completed steps discarded as warm-up before measuring."""

    worker_base_mb: float = 600.0
    """Resident memory of a worker process before any batch (runtime, dense model, optimizer)."""

    activation_mb_per_sample: float = 0.5
    """Worker memory for activations and their gradients per sample of the batch."""

    ps_base_mb: float = 400.0
    """Resident memory of a PS process without its share of the embedding tables."""

    embedding_table_mb: float = 2560.0
    """Total size of the embedding tables with optimizer slots, split evenly over the PS."""

    memory_noise_cv: float = 0.02
    """Coefficient of variation of the lognormal noise on the reported memory use."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"Physics.{f.name}={value!r} is invalid: allowed a number")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"Physics.{f.name}={value!r} is invalid: allowed a finite number ≥ 0"
                )
        positive = (
            "dense_core_s_per_sample",
            "gpu_s_per_sample",
            "rows_per_sample",
            "ps_bandwidth_bytes_s",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"Physics.{name}={getattr(self, name)!r} is invalid: allowed a number > 0"
                )
        if self.dense_parallel_fraction > 1:
            raise ValueError(
                f"Physics.dense_parallel_fraction={self.dense_parallel_fraction!r} is invalid: "
                "allowed a number in [0, 1]"
            )
        if self.warmup_fraction >= 1:
            raise ValueError(
                f"Physics.warmup_fraction={self.warmup_fraction!r} is invalid: "
                "allowed a number in [0, 1)"
            )
        if self.embedding_ids < 1 or float(self.embedding_ids) != int(self.embedding_ids):
            raise ValueError(
                f"Physics.embedding_ids={self.embedding_ids!r} is invalid: allowed an integer ≥ 1"
            )

    def effective_cores(self, cores: float) -> float:
        """Cores' worth of dense compute speed from ``cores`` allocated cores (Amdahl above 1)."""
        if cores <= 1.0:
            return cores
        f = self.dense_parallel_fraction
        return 1.0 / ((1.0 - f) + f / cores)


# ---------------------------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------------------------


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _config_tuple(config: Mapping[str, Any]) -> tuple:
    """Validate one configuration and return its 8 values in :data:`CONFIG_COLUMNS` order."""
    values = []
    for name in CONFIG_COLUMNS:
        value = config[name] if name in config else None
        if _is_missing(value):
            if name in _REQUIRED:
                raise ValueError(f"{name} is missing: the configuration needs the column {name!r}")
            value = CONFIG_DEFAULTS[name]
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is invalid: allowed a number") from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(f"{name}={value!r} is invalid: allowed a finite number")
        if name in _INTEGER:
            minimum = 0 if name == "worker_gpu" else 1
            if not number.is_integer() or number < minimum:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer ≥ {minimum}")
            values.append(int(number))
        else:
            if number <= 0:
                raise ValueError(f"{name}={value!r} is invalid: allowed a number > 0")
            values.append(number)
    return tuple(values)


def _check_steps(steps_per_worker: Any) -> int:
    ok = isinstance(steps_per_worker, (int, np.integer)) and not isinstance(steps_per_worker, bool)
    if not ok or steps_per_worker < 2:
        raise ValueError(
            f"steps_per_worker={steps_per_worker!r} is invalid: allowed an integer ≥ 2"
        )
    return int(steps_per_worker)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r} is invalid: allowed an integer")
    return int(seed)


def _seed_words(seed: int, window: int, cfg: tuple) -> np.ndarray:
    """Entropy for one measurement: a function of the seed, the window and the configuration."""
    packed = struct.pack("<qq8d", seed, window, *(float(v) for v in cfg))
    return np.frombuffer(packed, dtype=np.uint32).copy()


#: The most popular ids are hashed onto the PS one by one; the mass of the long tail beyond them
#: (many ids, each rare) is spread evenly, as a hash does on average. Hashing all 720720 ids
#: instead changes the shares by < 1 % and costs ~40 ms per (skew, ps).
_HEAD_IDS = 4096


def _id_hash(n: int) -> np.ndarray:
    """A fixed pseudo-random 64-bit hash of the ids 1 .. n (SplitMix64's finaliser)."""
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z += np.uint64(_HASH_SEED)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _zipf_tail(skew: float, first: int, last: int) -> float:
    """``sum(k ** -skew for k in first..last)`` by the midpoint rule (relative error ~1e-9 when
    ``first`` is in the thousands)."""
    a, b = first - 0.5, last + 0.5
    if abs(skew - 1.0) < 1e-12:
        return math.log(b / a)
    return (b ** (1.0 - skew) - a ** (1.0 - skew)) / (1.0 - skew)


@lru_cache(maxsize=256)
def _ps_shares(ps: int, skew: float, n_ids: int) -> tuple[float, ...]:
    """Fraction of row lookups that land on each PS: ids ranked 1 .. n_ids with Zipf popularity
    ``k ** -skew``, each id on PS ``hash(id) mod ps``."""
    if ps == 1:
        return (1.0,)
    if skew == 0:
        return (1.0 / ps,) * ps
    head = min(n_ids, _HEAD_IDS)
    owner = (_id_hash(head) % np.uint64(ps)).astype(np.intp)
    shares = np.bincount(owner, weights=np.arange(1, head + 1, dtype=float) ** -skew, minlength=ps)
    if n_ids > head:
        shares += _zipf_tail(skew, head + 1, n_ids) / ps
    return tuple(float(s) for s in shares / shares.sum())


def _noise(rng: np.random.Generator, cv: float, shape: Any) -> np.ndarray:
    """Lognormal factors with mean 1 and coefficient of variation ``cv`` (ones when cv = 0)."""
    if cv <= 0:
        return np.ones(shape)
    sigma = math.sqrt(math.log1p(cv * cv))
    return rng.lognormal(-0.5 * sigma * sigma, sigma, shape)


# ---------------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------------


def _simulate(cfg: tuple, physics: Physics, steps_per_worker: int, seed: int, window: int) -> dict:
    workers, ps, worker_cpu, ps_cpu, worker_mem, ps_mem, worker_gpu, batch = cfg
    ph = physics
    rng = np.random.default_rng(_seed_words(seed, window, cfg))

    budget = workers * steps_per_worker
    warm = min(max(1, int(round(ph.warmup_fraction * budget))), budget - 1)
    max_steps = budget + workers  # steps that can start before the budget-th completion

    # --- worker compute per step (before noise) and its CPU busy rate
    if worker_gpu > 0:
        input_s = batch * ph.input_core_s_per_sample / worker_cpu
        step_s = input_s + batch * ph.gpu_s_per_sample / worker_gpu + ph.step_overhead_s
        busy_fraction = input_s / step_s  # the CPUs are busy during the input part only
        busy_rate = worker_cpu
    else:
        step_s = batch * ph.dense_core_s_per_sample / ph.effective_cores(worker_cpu)
        step_s += ph.step_overhead_s / min(worker_cpu, 1.0)
        busy_fraction = 1.0
        busy_rate = ph.effective_cores(worker_cpu)  # ≤ worker_cpu

    # --- embedding rows per PS per step, and from them the service times of every request
    # (noise included) before contention: lists of lists index faster than numpy in the loop.
    rows_total = max(1, int(round(batch * ph.rows_per_sample)))
    shares = _ps_shares(ps, float(ph.zipf_skew), int(ph.embedding_ids))
    if ps == 1:
        rows = np.full((max_steps, 1), float(rows_total))
    else:
        rows = rng.multinomial(rows_total, shares, size=max_steps).astype(float)
    servers = max(1, math.ceil(ps_cpu - 1e-9))  # ceil(λ) servers at speed λ / ceil(λ)
    server_speed = ps_cpu / servers
    req_core_s = ph.ps_core_s_per_request
    lookup_s = (req_core_s + rows * ph.ps_core_s_per_row) / server_speed
    lookup_s = (lookup_s * _noise(rng, ph.noise_cv, rows.shape)).tolist()
    update_s = (req_core_s + rows * ph.ps_update_core_s_per_row) / server_speed
    update_s = (update_s * _noise(rng, ph.noise_cv, rows.shape)).tolist()
    nic_s = (rows * (ph.bytes_per_row / ph.ps_bandwidth_bytes_s)).tolist()
    compute_s = (step_s * _noise(rng, ph.noise_cv, max_steps)).tolist()
    if ph.start_jitter_s > 0:
        starts = rng.uniform(0.0, ph.start_jitter_s, workers).tolist()
    else:
        starts = [0.0] * workers
    contention = ph.ps_contention
    latency = ph.rpc_latency_s

    cpu_free = [[0.0] * servers for _ in range(ps)]  # per PS: a heap of its servers' free times
    waiting = [deque() for _ in range(ps)]  # per PS: start times of requests still waiting
    nic_free = [0.0] * ps

    step_of = [0] * workers  # index of each worker's current step (into the per-step lists)
    pending = [0] * workers  # replies still awaited in the current phase
    latest = [0.0] * workers  # latest reply time in the current phase
    busy_until = [0.0] * workers  # end of each worker's latest CPU-busy interval

    # CPU accounting without per-request records: the busy time up to an event time T is the
    # busy time assigned so far minus what is still ahead of T. All requests assigned by then
    # arrived at or before T, so a PS server works without a gap from T to its free time.
    ps_assigned = 0.0  # seconds of PS server time assigned so far (all servers, all PS)
    worker_assigned = 0.0  # seconds of worker CPU-busy time assigned so far (all workers)

    def ps_busy_before(now: float) -> float:
        ahead = sum(f - now for heap_ in cpu_free for f in heap_ if f > now)
        return ps_assigned - ahead

    def worker_busy_before(now: float) -> float:
        return worker_assigned - sum(b - now for b in busy_until if b > now)

    heap: list = [(starts[w], _STEP_DONE, w, -1) for w in range(workers)]  # -1: first start
    heapq.heapify(heap)
    push = heapq.heappush
    pop = heapq.heappop
    replace = heapq.heapreplace
    ps_range = range(ps)
    next_step = 0
    completed = 0
    t0 = ps_at_t0 = worker_at_t0 = 0.0

    while True:
        t, code, w, j = pop(heap)
        if code == _LOOKUP_NIC:  # lookup reply queues on PS j's network card
            free = nic_free[j]
            end = (t if t > free else free) + nic_s[step_of[w]][j]
            nic_free[j] = end
            end += latency
            if end > latest[w]:
                latest[w] = end
            left = pending[w] - 1
            pending[w] = left
            if not left:
                push(heap, (latest[w], _PUSH, w, 0))
        elif code == _PUSH_CPU:  # gradients arrived at PS j: queue the update on its cores
            wait = waiting[j]
            while wait and wait[0] <= t:
                wait.popleft()
            servers_j = cpu_free[j]
            free = servers_j[0]
            if free > t:
                begin = free
                wait.append(free)
            else:
                begin = t
            service = update_s[step_of[w]][j] * (1.0 + contention * len(wait))
            ps_assigned += service
            replace(servers_j, begin + service)
            end = begin + service + latency
            if end > latest[w]:
                latest[w] = end
            left = pending[w] - 1
            pending[w] = left
            if not left:
                push(heap, (latest[w], _STEP_DONE, w, 0))
        elif code == _LOOKUP:  # dense compute done: a lookup request to every PS's cores
            pending[w] = ps
            latest[w] = 0.0
            services = lookup_s[step_of[w]]
            for j, service, wait, servers_j in zip(ps_range, services, waiting, cpu_free):
                while wait and wait[0] <= t:
                    wait.popleft()
                free = servers_j[0]
                if free > t:
                    begin = free
                    wait.append(free)
                else:
                    begin = t
                service *= 1.0 + contention * len(wait)
                ps_assigned += service
                end = begin + service
                replace(servers_j, end)
                push(heap, (end, _LOOKUP_NIC, w, j))
        elif code == _PUSH:  # all lookups answered: gradients cross each PS's network card
            pending[w] = ps
            latest[w] = 0.0
            for j, transfer in enumerate(nic_s[step_of[w]]):
                free = nic_free[j]
                end = (t if t > free else free) + transfer
                nic_free[j] = end
                push(heap, (end, _PUSH_CPU, w, j))
        else:  # _STEP_DONE: a step completed (or, j == -1, the worker starts): next dense compute
            if j == 0:
                completed += 1
                if completed == warm:
                    t0, ps_at_t0, worker_at_t0 = t, ps_busy_before(t), worker_busy_before(t)
                elif completed == budget:
                    break
            step_of[w] = next_step
            d = compute_s[next_step]
            next_step += 1
            worker_assigned += d * busy_fraction
            busy_until[w] = t + d * busy_fraction
            push(heap, (t + d, _LOOKUP, w, 0))

    # The warm-up ends at the `warm`-th completion, the measurement at the `budget`-th (events
    # at equal times run before a completion, so both snapshots see everything up to them).
    t1 = t
    span = t1 - t0
    if not span > 0:  # pragma: no cover - only with degenerate physics
        raise ValueError("the simulated measurement window is empty; check the Physics values")
    throughput = (budget - warm) * batch / span
    worker_cpu_used = busy_rate * (worker_busy_before(t1) - worker_at_t0) / (workers * span)
    ps_cpu_used = server_speed * (ps_busy_before(t1) - ps_at_t0) / (ps * span)

    # --- memory working sets (demand, not capped by the allocation)
    mem_noise = _noise(rng, ph.memory_noise_cv, 2)
    row_mb = ph.bytes_per_row / _MIB
    worker_memory_used = (
        ph.worker_base_mb + batch * ph.activation_mb_per_sample + 2.0 * rows_total * row_mb
    ) * mem_noise[0]
    # each worker has at most one request (rows and their vectors) in flight at each PS
    ps_memory_used = (
        ph.ps_base_mb + ph.embedding_table_mb / ps + workers * 2.0 * (rows_total / ps) * row_mb
    ) * mem_noise[1]

    row = dict(zip(CONFIG_COLUMNS, cfg))
    row.update(
        throughput=throughput,
        worker_cpu_used=min(worker_cpu_used, worker_cpu),
        ps_cpu_used=min(ps_cpu_used, ps_cpu),
        worker_memory_used_mb=float(worker_memory_used),
        ps_memory_used_mb=float(ps_memory_used),
        worker_memory_peak_mb=float(worker_memory_used),  # every node alike: the largest is the mean
        ps_memory_peak_mb=float(ps_memory_used),
    )
    return row


def simulate_config(
    config: Mapping[str, float],
    physics: Physics = Physics(),
    *,
    steps_per_worker: int = 200,
    seed: int = 0,
) -> dict:
    """Simulate one configuration; returns the sample row: the config columns + throughput + the
    four ``*_used`` columns.

    ``config`` maps the :data:`CONFIG_COLUMNS` to values; ``workers, ps, worker_cpu, ps_cpu`` are
    required, the others default to :data:`CONFIG_DEFAULTS`. Raises :class:`ValueError` naming the
    column and its value when a value is missing or out of range (``workers < 1``, ``ps < 1``,
    ``cpu <= 0``, ``batch_size < 1``, a non-integer count, ...).

    The result is a deterministic function of the configuration, the physics, the steps and the
    seed; it equals the first measurement window of :func:`simulate_samples` for that row.
    """
    cfg = _config_tuple(config)
    return _simulate(cfg, physics, _check_steps(steps_per_worker), _check_seed(seed), 0)


def simulate_samples(
    configs: pd.DataFrame,
    physics: Physics = Physics(),
    *,
    steps_per_worker: int = 200,
    seed: int = 0,
    windows: int = 1,
) -> pd.DataFrame:
    """One row per configuration per measurement window (``windows > 1`` = several independent
    measurements, distinct seeds derived from ``seed``). Deterministic for a given seed.

    Rows come configuration by configuration, windows in order, with the columns
    :data:`SAMPLE_COLUMNS` and a fresh index. The randomness of a measurement depends on
    ``(seed, window, configuration)``, not on the row's position, so window ``k`` of a
    configuration is the same whichever table it is in; identical rows give identical samples
    (ask for more ``windows`` to get repeated measurements).
    """
    if not isinstance(configs, pd.DataFrame):
        raise ValueError(f"configs={type(configs).__name__} is invalid: allowed a pandas DataFrame")
    if isinstance(windows, bool) or not isinstance(windows, (int, np.integer)) or windows < 1:
        raise ValueError(f"windows={windows!r} is invalid: allowed an integer ≥ 1")
    for name in _REQUIRED:
        if name not in configs.columns:
            raise ValueError(f"{name} is missing: configs needs the column {name!r}")
    steps = _check_steps(steps_per_worker)
    seed = _check_seed(seed)
    records = configs.to_dict("records")
    cfgs = []
    for position, record in enumerate(records):
        try:
            cfgs.append(_config_tuple(record))
        except ValueError as error:
            raise ValueError(f"{error} (row {position})") from None
    rows = [_simulate(cfg, physics, steps, seed, k) for cfg in cfgs for k in range(int(windows))]
    table = pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))
    for name in _INTEGER:
        table[name] = table[name].astype("int64")
    return table
