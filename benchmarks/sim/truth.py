"""Hidden "true" performance functions of the simulated jobs (what the policies try to learn).

A policy must not be able to win by sharing the formula of the optimizer's model, so the truth comes
from three families that are *not* the optimizer's q-norm of nine terms:

``queueing``  Tables of the discrete-event PS simulation (:mod:`.queueing`), measured once on a
              log grid of (w, p, λw, λp) for three physics — default, hot-shard PS (Zipf 1.1, dear
              updates) and network-bound PS (2 Gbit/s, 512-byte rows) — and interpolated
              multilinearly in log space. Throughput there *emerges* from queues. Tables ship in
              ``benchmarks/sim/data/sim_truth_queueing.csv``; regenerate with
              ``python -m sim.truth`` (about 1–3 min per physics).
``measured``  The grid measured on the real runtime (``benchmarks/sim/data/local_grid.csv``: 21 configurations
              of 1–3 workers) calibrates a roofline (hard bottlenecks: worker cores with Amdahl,
              the hottest PS's cores, a fixed per-request PS cost); the job's size factor scales
              it to cluster sizes.
``roofline``  Random rooflines: each job family draws its own worker cost, Amdahl fraction, PS
              cost per row and per request, Zipf skew (hot shard), PS network, a job-wide I/O
              plateau and a crowding decline past a worker/PS ratio — so saturation points and PS
              bottlenecks differ from job to job. Bottlenecks combine by a near-hard soft-min
              (exponent 8), not by the model's fitted q.

``moving_shard`` A PS job whose embedding has a few hot row ranges (a viral item, a campaign), each
              carrying a share of all lookups and each held whole by the PS its id hashes to
              (id mod p): the hottest PS carries its hot ranges plus its share of the rest, so
              adding PS stops helping past ~1/h and some p are *worse* than fewer (two hot ranges
              collide on one PS), and a hot range's updates serialise on its row locks (more PS
              cores than ``lock_cores`` do not speed it). The hot ranges — their ids and shares —
              move between days (``day``). None of this is in the model's span: its PS terms are
              smooth and monotone in p and scale with λp without limit.

``allreduce`` Data-parallel jobs without PS (p = 0): every worker holds the whole model and the
              group all-reduces its gradients each step over a ring whose links slow down past a
              rack (oversubscribed uplinks), the all-reduce overlaps the backward pass in part
              (DDP's buckets), and a synchronous step waits for the slowest of w workers. None of
              the three is in the model's additive all-reduce terms.

Every function is vectorised over arrays of (w, p, λw, λp) and returns throughput in samples/s
and per-node CPU use (cores, ≤ the allocation). Memory truth (:class:`MemoryTruth`) is separate:
PS memory grows with the samples trained, sub-linearly (new ids taper off), which the optimizer's
linear growth model only approximates; an all-reduce job's tables, and their growth, are on every
worker (``replicated``).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.interpolate import RegularGridInterpolator

BATCH = 512  # every simulated job trains with batch 512 (the planner does not search the batch)

#: Grid of the queueing tables (log2-spaced; outside it, values are clamped to its edge).
TABLE_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)
TABLE_PS = (1, 2, 4, 8, 16, 32)
TABLE_CPU = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)

QUEUEING_TABLES = Path(__file__).with_name("data") / "sim_truth_queueing.csv"
LOCAL_GRID = Path(__file__).with_name("data") / "local_grid.csv"


def queueing_physics() -> dict:
    """The physics variants tabulated for the ``queueing`` family."""
    from sim.queueing import Physics

    return {
        "default": Physics(),
        "hot_shard": Physics(zipf_skew=1.1, ps_update_core_s_per_row=3e-6),
        "net_bound": Physics(ps_bandwidth_bytes_s=2.5e8, bytes_per_row=512.0),
    }


# ---------------------------------------------------------------------------------------------
# Truth interface
# ---------------------------------------------------------------------------------------------


class Truth:
    """A hidden performance function. ``scale`` multiplies throughput (a job's model size)."""

    family: str = ""

    def throughput(self, w, p, lw, lp) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def cpu_used(self, w, p, lw, lp) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        """Per-node mean CPU use (worker, PS) in cores."""
        raise NotImplementedError

    def hot_ps_share(self, p) -> np.ndarray:
        """Load of the hottest PS relative to the mean PS (1 = balanced)."""
        return np.ones_like(np.asarray(p, dtype=float))


def _arrays(*values):
    return np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in values))


def _amdahl(cores, fraction):
    cores = np.asarray(cores, dtype=float)
    return np.where(cores <= 1.0, cores, 1.0 / ((1.0 - fraction) + fraction / np.maximum(cores, 1e-9)))


def _softmin(caps: list[np.ndarray], k: float = 8.0) -> np.ndarray:
    stack = np.stack(caps)
    low = stack.min(axis=0)
    return low * np.sum((low / stack) ** k, axis=0) ** (-1.0 / k)


# ---------------------------------------------------------------------------------------------
# Roofline family (and the measured grid's member of it)
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _max_share(p: int, skew: float) -> float:
    from sim.queueing import _ps_shares

    shares = _ps_shares(int(p), float(skew), 720720)
    return max(shares) * int(p)


#: Per-PS-count values of a truth (``max_share``, ``MovingHotShard._hottest``) are kept for each count
#: up to this (``PLAN_MAX_PS``, the planner's most PS); others are computed per call.
_PS_COUNTS_KEPT = 256
#: ``_max_share`` by PS count (NaN: not computed yet), per skew.
_MAX_SHARE_KEPT: dict[float, np.ndarray] = {}


def _whole_counts(p: np.ndarray) -> np.ndarray | None:
    """``p`` as integers when each is a PS count of 1 … ``_PS_COUNTS_KEPT`` (else None)."""
    whole = p.astype(np.int64)
    ok = p.size and np.array_equal(whole, p) and int(whole.min()) >= 1 and int(whole.max()) <= _PS_COUNTS_KEPT
    return whole if ok else None


def max_share(p, skew: float) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    whole = _whole_counts(p)
    if whole is not None:
        kept = _MAX_SHARE_KEPT.setdefault(float(skew), np.full(_PS_COUNTS_KEPT + 1, np.nan))
        seen = np.zeros(len(kept), dtype=bool)
        seen[whole] = True
        for v in np.flatnonzero(seen & np.isnan(kept)):
            kept[v] = _max_share(int(v), skew)
        return kept[whole]
    flat = np.array([_max_share(int(v), skew) for v in np.unique(p)])
    return flat[np.searchsorted(np.unique(p), p)]


@dataclass(frozen=True)
class Roofline(Truth):
    """Bottlenecks (samples/s), combined by a near-hard soft-min, times a crowding decline:

    worker cores   w · B / (B·c_w / amdahl(λw, f) + o / min(λw, 1))
    hottest PS     p · λp / (share_max(p) · (κ_row · rows) + 2 · r / B · p)   (rows per sample)
    PS network     p · bandwidth / (share_max(p) · 2 · rows · bytes)
    I/O plateau    io
    crowding       × 1 / (1 + γ · max(0, w/p − ratio)²)
    """

    c_w: float = 2.5e-4  # worker core-seconds per sample
    f: float = 0.9  # Amdahl parallel fraction of the worker
    o: float = 2e-3  # per-step overhead, s
    kappa: float = 3e-6  # PS core-seconds per row (lookup + update)
    rows: float = 26.0
    r: float = 5e-5  # PS core-seconds per request
    skew: float = 0.8  # Zipf exponent of the ids (hot shard)
    bandwidth: float = 1.25e9  # bytes/s per PS
    bytes_per_row: float = 256.0
    io: float = float("inf")  # job-wide cap, samples/s
    ratio: float = 16.0  # workers per PS beyond which crowding slows the PS
    gamma: float = 0.0  # strength of the crowding decline
    scale: float = 1.0
    family: str = "roofline"

    def _caps(self, w, p, lw, lp):
        w, p, lw, lp = _arrays(w, p, lw, lp)
        share = max_share(p, self.skew) if self.skew > 0 else np.ones_like(p)
        worker = w * BATCH / (BATCH * self.c_w / _amdahl(lw, self.f) + self.o / np.minimum(lw, 1.0))
        ps = p * lp / (share * self.kappa * self.rows + 2.0 * self.r / BATCH * p)
        net = p * self.bandwidth / (share * 2.0 * self.rows * self.bytes_per_row)
        caps = [worker, ps, net]
        if math.isfinite(self.io):
            caps.append(np.full_like(worker, self.io))
        crowd = 1.0 / (1.0 + self.gamma * np.maximum(0.0, w / p - self.ratio) ** 2)
        return caps, crowd, (w, p, lw, lp, share)

    def throughput(self, w, p, lw, lp):
        caps, crowd, _ = self._caps(w, p, lw, lp)
        return self.scale * _softmin(caps) * crowd

    def cpu_used(self, w, p, lw, lp):
        caps, crowd, (w, p, lw, lp, share) = self._caps(w, p, lw, lp)
        x = _softmin(caps) * crowd
        worker = np.minimum(lw, _amdahl(lw, self.f) * x / caps[0] + 0.02 * lw)
        # Mean PS use: the hottest carries `share` × the mean load; the crowded PS burn cores in
        # lock contention (what the crowding decline costs).
        mean_ps = lp * x / caps[1] * (1.0 / share) * (1.0 + self.gamma * np.maximum(0.0, w / p - self.ratio))
        return worker, np.minimum(lp, mean_ps + 0.02 * lp)

    def hot_ps_share(self, p):
        return max_share(p, self.skew) if self.skew > 0 else np.ones_like(np.asarray(p, dtype=float))


@lru_cache(maxsize=1)
def measured_roofline() -> tuple[Roofline, float]:
    """The roofline calibrated to the runtime's measured grid; returns it and its fit MAPE."""
    from scipy.optimize import least_squares

    table = pd.read_csv(LOCAL_GRID)
    table = table[table["batch_size"] == BATCH]
    w, p, lw, lp = (table[c].to_numpy(float) for c in ("workers", "ps", "worker_cpu", "ps_cpu"))
    y = np.log(table["throughput"].to_numpy(float))

    def model(v):
        c_w, f, o, kappa, r = np.exp(v[0]), 1 / (1 + np.exp(-v[1])), np.exp(v[2]), np.exp(v[3]), np.exp(v[4])
        return Roofline(c_w=c_w, f=f, o=o, kappa=kappa, r=r, skew=0.0, family="measured")

    def residual(v):
        return np.log(model(v).throughput(w, p, lw, lp)) - y

    start = np.log([2.5e-5, 9.0, 2e-3, 4e-7, 5e-5])
    start[1] = 2.0
    fit = least_squares(residual, start)
    truth = model(fit.x)
    mape = float(np.mean(np.abs(np.exp(residual(fit.x)) - 1.0)))
    return truth, mape


# ---------------------------------------------------------------------------------------------
# Moving hot shard (a PS family whose hot rows change from day to day)
# ---------------------------------------------------------------------------------------------


def _hottest_of(truth: "MovingHotShard", values: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``MovingHotShard._hottest`` at ``p`` ≥ 1 (``values``: its distinct values, ascending)."""
    shares, ids = truth.hot_ranges()
    rest = 1.0 - shares.sum()
    load, hot = np.empty(values.size), np.empty(values.size)
    for n, v in enumerate(values):
        per_ps = np.bincount(ids % int(v), weights=shares, minlength=int(v))
        j = int(np.argmax(per_ps))
        load[n], hot[n] = per_ps[j] + rest / v, per_ps[j]
    where = np.searchsorted(values, p)
    return load[where], hot[where]


@lru_cache(maxsize=256)
def _hottest_by_count(truth: "MovingHotShard") -> tuple[np.ndarray, np.ndarray]:
    """``_hottest`` of a truth at p = 0, 1, …, ``_PS_COUNTS_KEPT`` (p = 0 as p = 1), by index."""
    counts = np.arange(0, _PS_COUNTS_KEPT + 1, dtype=float)
    return _hottest_of(truth, counts[1:], np.maximum(counts, 1.0))


@dataclass(frozen=True)
class MovingHotShard(Truth):
    """Hot row ranges i = 1..k with lookup shares h_i (H = Σ h_i) and ids u_i, each on PS u_i mod p;
    the rest, 1 − H, spread evenly. Per sample (rows lookups + updates at κ core-seconds each):

    load of PS j   L_j(p) = Σ_{i: u_i mod p = j} h_i + (1 − H)/p,   hottest j* = argmax_j L_j(p)
    hottest PS     1/X_ps = κ·rows·(H_j*/min(λp, c_lock) + (L_j* − H_j*)/λp) + 2·r/B
                   (H_j* the hot share on j*: its updates serialise on row locks, ≤ c_lock cores)
    worker cores   X_w = w · B / (B·c_w / amdahl(λw, f) + o / min(λw, 1))
    x              = scale · softmin_8(X_w, X_ps, io)

    so X ≤ c_lock / (κ·rows·max_i h_i) for every p and λp. Day d draws the hot ranges from
    ``np.random.default_rng([seed, d])``: H = hot · lognormal(0, 0.4) (clipped to [0.03, 0.6]), the
    shares h_i ~ H · Dirichlet(1), the ids u_i uniform in [0, 2²⁰).
    """

    seed: int = 0
    day: int = 0
    hot: float = 0.2  # mean total share of the hot ranges
    n_hot: int = 2
    lock_cores: float = 2.0
    c_w: float = 2.5e-4
    f: float = 0.9
    o: float = 2e-3
    kappa: float = 6e-6
    rows: float = 26.0
    r: float = 5e-5
    io: float = float("inf")
    scale: float = 1.0
    family: str = "moving_shard"

    def hot_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """The day's hot ranges: (shares h_i, ids u_i)."""
        rng = np.random.default_rng([self.seed, self.day])
        total = float(np.clip(self.hot * rng.lognormal(0.0, 0.4), 0.03, 0.6))
        shares = total * rng.dirichlet(np.ones(self.n_hot))
        ids = rng.integers(0, 2**20, self.n_hot)
        return shares, ids

    def _hottest(self, p) -> tuple[np.ndarray, np.ndarray]:
        """(L_j*(p), H_j*(p)): the hottest PS's load and hot share, as fractions of all rows."""
        p = np.maximum(np.asarray(p, dtype=float), 1.0)
        whole = _whole_counts(p)
        if whole is not None:
            load, hot = _hottest_by_count(self)
            return load[whole], hot[whole]
        return _hottest_of(self, np.unique(p), p)

    def _caps(self, w, p, lw, lp):
        w, p, lw, lp = _arrays(w, p, lw, lp)
        load, hot = self._hottest(p)
        worker = w * BATCH / (BATCH * self.c_w / _amdahl(lw, self.f) + self.o / np.minimum(lw, 1.0))
        ps_time = self.kappa * self.rows * (hot / np.minimum(lp, self.lock_cores) + (load - hot) / lp) \
            + 2.0 * self.r / BATCH
        caps = [worker, 1.0 / ps_time]
        if math.isfinite(self.io):
            caps.append(np.full_like(worker, self.io))
        return caps, (w, p, lw, lp)

    def throughput(self, w, p, lw, lp):
        caps, _ = self._caps(w, p, lw, lp)
        return self.scale * _softmin(caps)

    def cpu_used(self, w, p, lw, lp):
        caps, (w, p, lw, lp) = self._caps(w, p, lw, lp)
        x = _softmin(caps)
        worker = np.minimum(lw, _amdahl(lw, self.f) * x / caps[0] + 0.02 * lw)
        p = np.maximum(p, 1.0)
        mean_ps = x * (self.kappa * self.rows + 2.0 * self.r / BATCH * p) / p  # all PS work over p PS
        return worker, np.minimum(lp, mean_ps + 0.02 * lp)

    def hot_ps_share(self, p):
        load, _ = self._hottest(p)
        return load * np.maximum(np.asarray(p, dtype=float), 1.0)


# ---------------------------------------------------------------------------------------------
# All-reduce family (p = 0)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllReduce(Truth):
    """Synchronous data parallel, replicated model, ring all-reduce of ``model_bytes`` a step:

    compute   t_c = (B·c_w / amdahl(λw, f) + o / min(λw, 1)) · (1 + σ·√(2 ln w))   (the slowest
              of w workers: the expected maximum of w normal step times)
    ring      t_r = 2(w−1)/w · model_bytes / bw(w) + 2(w−1) · latency,
              bw(w) = bandwidth within a rack (w ≤ rack), bandwidth / oversubscription past it
    step      t = max(t_c, t_r) + (1 − overlap) · min(t_c, t_r)     (buckets overlap backward)
    x         = w · B / t, capped at the job's I/O plateau ``io``
    """

    c_w: float = 2.5e-4
    f: float = 0.9
    o: float = 2e-3
    sigma: float = 0.05
    model_bytes: float = 4e8
    bandwidth: float = 1.25e9
    latency: float = 5e-5
    rack: float = 8.0
    oversubscription: float = 3.0
    overlap: float = 0.6
    io: float = float("inf")
    scale: float = 1.0
    family: str = "allreduce"

    def _times(self, w, lw):
        w, lw = _arrays(w, lw)
        compute = (BATCH * self.c_w / _amdahl(lw, self.f) + self.o / np.minimum(lw, 1.0)) \
            * (1.0 + self.sigma * np.sqrt(2.0 * np.log(np.maximum(w, 1.0))))
        bandwidth = np.where(w <= self.rack, self.bandwidth, self.bandwidth / self.oversubscription)
        ring = 2.0 * (w - 1.0) / w * self.model_bytes / bandwidth + 2.0 * (w - 1.0) * self.latency
        step = np.maximum(compute, ring) + (1.0 - self.overlap) * np.minimum(compute, ring)
        return w, lw, compute, step

    def throughput(self, w, p, lw, lp):
        w, _, _, step = self._times(w, lw)
        return self.scale * np.minimum(w * BATCH / step, self.io)

    def cpu_used(self, w, p, lw, lp):
        w, lw, compute, step = self._times(w, lw)
        x = np.minimum(w * BATCH / step, self.io)
        busy = compute / step * x / (w * BATCH / step)  # the compute share of a step, less when I/O-bound
        worker = np.minimum(lw, _amdahl(lw, self.f) * busy + 0.05 * lw)  # + the all-reduce's own threads
        return worker, np.zeros_like(worker)


# ---------------------------------------------------------------------------------------------
# Queueing tables
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _queueing_tables() -> dict:
    table = pd.read_csv(QUEUEING_TABLES)
    axes = tuple(np.log2(np.asarray(a, dtype=float)) for a in (TABLE_WORKERS, TABLE_PS, TABLE_CPU, TABLE_CPU))
    shape = tuple(len(a) for a in axes)
    out = {}
    for name, group in table.groupby("physics"):
        group = group.sort_values(["workers", "ps", "worker_cpu", "ps_cpu"])
        if len(group) != int(np.prod(shape)):
            raise ValueError(f"{QUEUEING_TABLES}: physics {name} has {len(group)} rows, expected {np.prod(shape)}")
        grids = {}
        for column, transform in (("throughput", np.log), ("worker_util", None), ("ps_util", None)):
            values = group[column].to_numpy(float)
            values = transform(values) if transform else values
            grids[column] = RegularGridInterpolator(axes, values.reshape(shape), bounds_error=False, fill_value=None)
        out[name] = grids
    return out


def _table_points(w, p, lw, lp):
    w, p, lw, lp = _arrays(w, p, lw, lp)
    clip = [
        np.clip(np.log2(v), np.log2(lo), np.log2(hi))
        for v, lo, hi in ((w, 1, TABLE_WORKERS[-1]), (p, 1, TABLE_PS[-1]), (lw, 0.5, TABLE_CPU[-1]), (lp, 0.5, TABLE_CPU[-1]))
    ]
    return np.stack(clip, axis=-1), w.shape


@dataclass(frozen=True)
class QueueingTable(Truth):
    physics: str = "default"
    scale: float = 1.0
    family: str = "queueing"

    def throughput(self, w, p, lw, lp):
        points, shape = _table_points(w, p, lw, lp)
        return self.scale * np.exp(_queueing_tables()[self.physics]["throughput"](points.reshape(-1, 4))).reshape(shape)

    def cpu_used(self, w, p, lw, lp):
        w, p, lw, lp = _arrays(w, p, lw, lp)
        points, shape = _table_points(w, p, lw, lp)
        grids = _queueing_tables()[self.physics]
        worker = np.clip(grids["worker_util"](points.reshape(-1, 4)).reshape(shape), 0.01, 1.0) * lw
        ps = np.clip(grids["ps_util"](points.reshape(-1, 4)).reshape(shape), 0.01, 1.0) * lp
        return worker, ps

    def hot_ps_share(self, p):
        skew = queueing_physics()[self.physics].zipf_skew
        return max_share(p, skew)


# ---------------------------------------------------------------------------------------------
# Memory truth
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryTruth:
    """Per-node memory demand, MB. PS: base + (table + growth · (n/10⁶)^α) / p, n = samples trained
    so far (α < 1: new ids arrive ever more slowly); worker: base + activations · B — plus, when
    the tables are ``replicated`` (an all-reduce job: no PS), table + growth · (n/10⁶)^α."""

    ps_base_mb: float
    table_mb: float
    growth_mb_per_m: float
    alpha: float
    worker_base_mb: float
    activation_mb_per_sample: float
    replicated: bool = False

    def tables_mb(self, samples_done=0.0):
        """The tables, grown by ``samples_done`` trained samples."""
        grown = self.growth_mb_per_m * (np.maximum(np.asarray(samples_done, dtype=float), 0.0) / 1e6) ** self.alpha
        return self.table_mb + grown

    def ps_mb(self, p, samples_done=0.0):
        p = np.asarray(p, dtype=float)
        if self.replicated:
            return np.zeros_like(p)
        return self.ps_base_mb + self.tables_mb(samples_done) / p

    def worker_mb(self, samples_done=0.0):
        base = self.worker_base_mb + self.activation_mb_per_sample * BATCH
        return float(base + self.tables_mb(samples_done)) if self.replicated else base

    def samples_to(self, limit_mb: float, p: int) -> float:
        """Samples trained when the growing node (a PS; every worker when ``replicated``) reaches
        ``limit_mb``: inf when never, 0 when at once."""
        if self.replicated:
            room = limit_mb - self.worker_base_mb - self.activation_mb_per_sample * BATCH - self.table_mb
        else:
            room = (limit_mb - self.ps_base_mb) * p - self.table_mb
        if room <= 0:
            return 0.0
        if self.growth_mb_per_m <= 0:
            return math.inf
        return 1e6 * (room / self.growth_mb_per_m) ** (1.0 / self.alpha)


# ---------------------------------------------------------------------------------------------
# Regenerating the queueing tables
# ---------------------------------------------------------------------------------------------


def generate_queueing_tables(steps_per_worker: int = 30, seed: int = 7) -> pd.DataFrame:
    from sim.queueing import simulate_config

    rows = []
    for name, physics in queueing_physics().items():
        start = time.perf_counter()
        for w, p, lw, lp in itertools.product(TABLE_WORKERS, TABLE_PS, TABLE_CPU, TABLE_CPU):
            steps = steps_per_worker if w < 64 else max(10, steps_per_worker // 2)
            row = simulate_config(dict(workers=w, ps=p, worker_cpu=lw, ps_cpu=lp, batch_size=BATCH),
                                  physics, steps_per_worker=steps, seed=seed)
            rows.append(dict(physics=name, workers=w, ps=p, worker_cpu=lw, ps_cpu=lp,
                             throughput=round(row["throughput"], 3),
                             worker_util=round(row["worker_cpu_used"] / lw, 5),
                             ps_util=round(row["ps_cpu_used"] / lp, 5)))
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return pd.DataFrame(rows)


if __name__ == "__main__":  # pragma: no cover - a one-off generator
    out = sys.argv[1] if len(sys.argv) > 1 else str(QUEUEING_TABLES)
    generate_queueing_tables().to_csv(out, index=False)
    print(f"wrote {out}")
