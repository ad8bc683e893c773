"""Training data for DLRM: batches, and the synthetic source in the Criteo display-ads layout.

A sample has ``num_dense`` (13) integer count features, ``num_sparse`` (26) categorical features
and a 0/1 click label. A :class:`Batch` holds them as numpy arrays, ready for the model: dense
features already ``log1p(max(x, 0))``-transformed (missing → 0, as in the DLRM reference), every
categorical feature already hashed to a row of its embedding table (``[0, table_sizes[t])``).

Every source gives ``samples(start, stop)`` by global sample index, so that a master can hand out
shards as index ranges and any worker can materialise any shard, on any restart, identically:

* :class:`SyntheticSource` — deterministic, infinite, with a planted signal (a known true logit,
  so the Bayes-optimal AUC is measurable) and Zipf-skewed ids (hot embedding rows, as in real
  CTR data, which is what makes parameter-server load uneven). Counter-based: sample ``i`` is a
  pure function of ``(seed, i)`` (a splitmix64 hash of the index), never of how a range is split.
* ``runtime.datasets.TabularSource`` — the user's Parquet or CSV/TSV dataset, streamed by fragment
  and read through the job's feature layout.

Generation speed (26 tables of 100,000 rows, default skew; one core)::

    taskset -c 0 .venv/bin/python -m airflow_dlrover.runtime.data
    → 520,000–570,000 samples/s in ranges of 65,536; 535,000–600,000 in ranges of 512
      (2-vCPU cloud VM, numpy 2.4; a range is one call of ``samples``)

Measured at the defaults (seed 0, samples [0, 10⁶)): positive rate 0.304; Bayes-optimal AUC (the
true logits as scores) 0.827; the dense part of the true logit alone 0.737. A DLRM like the
runtime's (embedding dim 8, Adagrad on the tables, Adam on the MLPs, batch 512), trained one epoch
and scored on 50,000 held-out samples, reached AUC 0.77 after 200,000 samples (20,000-row tables
as in ``JobSpec``, and 0.77 with 100,000-row ones) and 0.80 after 10⁶ (20,000 rows); with uniform ids
(``zipf_skew=0``) only 0.72, since no id is seen often enough to learn its effect.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Batch", "DataSource", "FeatureSpec", "SyntheticSource", "criteo_columns", "roc_auc"]


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeatureSpec:
    """The feature layout: ``num_dense`` count features and one embedding table per categorical one.

    ``table_sizes[t]`` is the number of rows of table ``t``, i.e. the hash space of feature ``t``.
    """

    num_dense: int = 13
    table_sizes: tuple[int, ...] = (100_000,) * 26

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_dense", int(self.num_dense))
        object.__setattr__(self, "table_sizes", tuple(int(t) for t in self.table_sizes))
        if self.num_dense < 1:
            raise ValueError(f"num_dense={self.num_dense} is invalid: allowed ≥ 1")
        if len(self.table_sizes) < 1:
            raise ValueError("table_sizes is empty: allowed one or more table sizes, each ≥ 2")
        bad = [t for t in self.table_sizes if t < 2]
        if bad:
            raise ValueError(f"table_sizes contains {bad[0]}: allowed sizes ≥ 2 (row 0 is reserved for missing)")

    @property
    def num_sparse(self) -> int:
        return len(self.table_sizes)


def criteo_columns(spec: FeatureSpec = FeatureSpec()) -> list[str]:
    """Column names of the Criteo layout: ``label, I1..I{num_dense}, C1..C{num_sparse}``."""
    return (["label"] + [f"I{j + 1}" for j in range(spec.num_dense)]
            + [f"C{t + 1}" for t in range(spec.num_sparse)])


@dataclass(frozen=True, eq=False)
class Batch:
    """``dense`` float32 (n, num_dense), transformed; ``sparse`` one int64 array per table: (n,) ids
    in ``[0, rows)`` for a single-id table, (n, L) for a multi-hot one (−1 pads a row's shorter
    list); ``label`` float32 (n,) of 0/1; ``valid`` bool (n,) or None: a row that could not be
    parsed stays in the batch (its index keeps the shard's accounting exact) with ``valid`` False,
    and trains nothing. Equality compares contents."""

    dense: np.ndarray
    sparse: tuple[np.ndarray, ...]
    label: np.ndarray
    valid: np.ndarray | None = None

    def __post_init__(self) -> None:
        dense = np.asarray(self.dense, dtype=np.float32)
        sparse = self.sparse
        if isinstance(sparse, np.ndarray) and sparse.ndim == 2:  # one column per table
            sparse = tuple(np.ascontiguousarray(sparse.T, dtype=np.int64))
        sparse = tuple(np.asarray(s, dtype=np.int64) for s in sparse)
        label = np.asarray(self.label, dtype=np.float32)
        if dense.ndim != 2 or label.ndim != 1 or any(s.ndim not in (1, 2) for s in sparse):
            raise ValueError(f"Batch needs dense (n, d), sparse (n,) or (n, L) per table, label (n,); got shapes "
                             f"{dense.shape}, {[s.shape for s in sparse]}, {label.shape}")
        if len({len(dense), len(label), *(len(s) for s in sparse)}) > 1:
            raise ValueError(f"Batch arrays disagree on the number of samples: {len(dense)}, "
                             f"{[len(s) for s in sparse]}, {len(label)}")
        valid = None if self.valid is None else np.asarray(self.valid, dtype=bool)
        if valid is not None and valid.shape != label.shape:
            raise ValueError(f"Batch valid has shape {valid.shape}: allowed ({len(label)},)")
        object.__setattr__(self, "dense", dense)
        object.__setattr__(self, "sparse", sparse)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "valid", None if valid is None or valid.all() else valid)

    def __len__(self) -> int:
        return len(self.label)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (len(self.sparse) == len(other.sparse)
                and all(np.array_equal(a, b) for a, b in ((self.dense, other.dense), (self.label, other.label),
                                                           *zip(self.sparse, other.sparse)))
                and np.array_equal(self.valid_mask, other.valid_mask))

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside

    @property
    def num_dense(self) -> int:
        return self.dense.shape[1]

    @property
    def num_sparse(self) -> int:
        return len(self.sparse)

    def id_matrix(self) -> np.ndarray:
        """The ids as one (n, tables) array, for batches of single-id tables only."""
        if any(s.ndim != 1 for s in self.sparse):
            raise ValueError("id_matrix needs single-id tables: this batch has multi-hot ones")
        return np.stack(self.sparse, axis=1) if self.sparse else np.zeros((len(self), 0), np.int64)

    @property
    def valid_mask(self) -> np.ndarray:
        return np.ones(len(self), dtype=bool) if self.valid is None else self.valid

    @property
    def bad_rows(self) -> int:
        return 0 if self.valid is None else int((~self.valid).sum())

    def slice(self, start: int, stop: int) -> "Batch":
        """Samples ``[start, stop)`` (Python slice semantics) as views, not copies."""
        return Batch(self.dense[start:stop], tuple(s[start:stop] for s in self.sparse), self.label[start:stop],
                     None if self.valid is None else self.valid[start:stop])

    def take(self, order: np.ndarray) -> "Batch":
        """The samples at positions ``order``, in that order (copies)."""
        return Batch(self.dense[order], tuple(s[order] for s in self.sparse), self.label[order],
                     None if self.valid is None else self.valid[order])

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        batches = list(batches)
        if not batches:
            raise ValueError("Batch.concat needs at least one batch (an empty list has no feature layout)")
        if len(batches) == 1:
            return batches[0]
        sparse = []
        for t in range(batches[0].num_sparse):
            columns = [b.sparse[t] for b in batches]
            if columns[0].ndim == 2:  # multi-hot: pad to the longest list
                width = max(c.shape[1] for c in columns)
                columns = [np.pad(c, ((0, 0), (0, width - c.shape[1])), constant_values=-1) for c in columns]
            sparse.append(np.concatenate(columns))
        valid = None if all(b.valid is None for b in batches) else np.concatenate([b.valid_mask for b in batches])
        return Batch(np.concatenate([b.dense for b in batches]), tuple(sparse),
                     np.concatenate([b.label for b in batches]), valid)

    @staticmethod
    def empty(spec: "FeatureSpec | None" = None) -> "Batch":
        spec = spec or FeatureSpec()
        return Batch(np.zeros((0, spec.num_dense), np.float32), tuple(np.zeros(0, np.int64) for _ in spec.table_sizes),
                     np.zeros(0, np.float32))


class DataSource(Protocol):
    """What a trainer needs: ``samples(start, stop)`` by global index, and a length."""

    spec: FeatureSpec

    def __len__(self) -> int: ...

    def samples(self, start: int, stop: int) -> Batch: ...


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney, ties counted half). Needs both classes."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores differ in length: {labels.size} vs {scores.size}")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUC needs both classes; got {positives} positive and {negatives} negative labels")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = ends - (counts - 1) / 2.0  # 1-based, ties share their mean rank
    rank_sum = float(average_rank[inverse][labels].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


# ---------------------------------------------------------------------------------------------
# Counter-based hashing (splitmix64), vectorised over uint64 arrays
# ---------------------------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U16 = np.uint64(0xFFFF)
_U32 = np.uint64(0xFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, in place on a uint64 array (a bijection with full avalanche)."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


# ---------------------------------------------------------------------------------------------
# Synthetic source
# ---------------------------------------------------------------------------------------------

#: Share of the informative logit's variance carried by the dense features (the rest: the ids).
_DENSE_SHARE = 0.55
#: Samples generated per internal step (bounds the temporaries to ~60 MB).
_CHUNK = 32_768


def _zipf_cdf(x: np.ndarray, size: int, skew: float) -> np.ndarray:
    """CDF of X on [1, size+1) with density ∝ x^(−skew); rank = floor(X) is a bounded Zipf law."""
    e = 1.0 - skew
    top = math.log(size + 1.0)
    if abs(e * top) < 1e-9:
        return np.log(x) / top
    return np.expm1(e * np.log(x)) / math.expm1(e * top)


def _ih3_moments(mu: float, sigma: float) -> tuple[float, float]:
    """E[h], E[h²] of h = log1p(floor(exp(mu + sigma·z))), z the standardised sum of 3 uniforms."""
    s = (np.arange(60_000) + 0.5) * (3.0 / 60_000)  # midpoint rule on the support [0, 3]
    density = np.where(s < 1, s * s / 2, np.where(s < 2, (-2 * s * s + 6 * s - 3) / 2, (3 - s) ** 2 / 2))
    weights = density / density.sum()
    h = np.log1p(np.floor(np.exp(mu + sigma * (s - 1.5) / 0.5)))
    return float(weights @ h), float(weights @ (h * h))


class SyntheticSource:
    """Deterministic synthetic CTR data with a planted signal and Zipf-skewed ids.

    * Sample ``i`` depends only on ``(seed, i)``: ``samples(0, 100)`` equals
      ``Batch.concat([samples(0, 37), samples(37, 100)])``.
    * Dense feature ``j``: ``floor(exp(μ_j + σ_j z))`` (a lognormal count, z ≈ N(0, 1)), missing
      with probability ``m_j`` (μ, σ, m drawn per feature from the seed), then ``log1p``.
    * Categorical feature ``t``: a rank ``r`` in ``[1, N_t]`` from a bounded Zipf law
      ``P(r) ∝ r^(−zipf_skew)`` (0 = uniform; 1.05 ≈ Criteo-like: the top 1 % of rows get about
      2/3 of the lookups), mapped through a fixed random permutation of ``[0, N_t)`` so hot rows
      are spread over the id space.
    * Label ~ Bernoulli(sigmoid(logit)), ``logit = bias + signal · (√ρ·g_dense + √(1−ρ)·g_sparse)``:
      ``g_dense`` a fixed linear function of the transformed dense features, ``g_sparse = Σ_t σ_t
      effect_t(id_t)`` with normal per-id effects; both standardised to unit variance under the
      sample distribution (ρ = 0.55). ``bias`` sets the positive rate to ``positive_rate``.
      ``true_logits`` gives the logit, ``oracle_auc`` the Bayes-optimal AUC (≈ 0.83 at defaults).

    Hot ids are also the learnable ones: a model trained on 10⁵–10⁶ samples sees tail ids too
    rarely to learn their effect, so its AUC lies between the dense-only AUC (≈ 0.74) and the
    oracle's (≈ 0.83). The per-table permutation and effects cost 8 bytes per embedding row (26 × 100,000
    rows: 21 MB), built once in ``__init__``.
    """

    def __init__(self, spec: FeatureSpec = FeatureSpec(), *, seed: int = 0, zipf_skew: float = 1.05,
                 signal: float = 1.6, positive_rate: float = 0.3):
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed={seed!r} is invalid: allowed a non-negative integer")
        if not (math.isfinite(zipf_skew) and zipf_skew >= 0):
            raise ValueError(f"zipf_skew={zipf_skew!r} is invalid: allowed a finite number ≥ 0 (0 = uniform ids)")
        if not (math.isfinite(signal) and signal >= 0):
            raise ValueError(f"signal={signal!r} is invalid: allowed a finite number ≥ 0 (0 = labels are noise)")
        if not 0 < positive_rate < 1:
            raise ValueError(f"positive_rate={positive_rate!r} is invalid: allowed 0 < rate < 1")
        self.spec = spec
        self.seed = int(seed)
        self.zipf_skew = float(zipf_skew)
        self.signal = float(signal)
        self.positive_rate = float(positive_rate)
        keys = np.random.SeedSequence([self.seed, 0x5D17]).generate_state(2, np.uint64)
        self._sample_key = keys[0]
        rng = np.random.default_rng([self.seed, 0xFEA7])
        d, t_count = spec.num_dense, spec.num_sparse

        # Dense: per-feature lognormal counts with a missing rate, standardised for the logit.
        self._dense_mu = rng.uniform(0.0, 4.0, d)
        self._dense_sigma = rng.uniform(0.4, 1.4, d)
        self._dense_missing = rng.uniform(0.0, 0.45, d)
        self._missing_threshold = np.floor(self._dense_missing * 65536.0).astype(np.uint64)
        mean, var = np.empty(d), np.empty(d)
        for j in range(d):
            m1, m2 = _ih3_moments(self._dense_mu[j], self._dense_sigma[j])
            keep = 1.0 - self._dense_missing[j]
            mean[j], var[j] = keep * m1, keep * m2 - (keep * m1) ** 2
        weights = rng.standard_normal(d)
        scale = math.sqrt(float((weights**2 * var).sum())) or 1.0
        self._dense_weights = weights / scale  # Var(dense @ w) = 1 under the sample distribution
        self._dense_offset = float(self._dense_weights @ mean)

        # Sparse: per-table rank → id permutation and per-id effect, standardised under the traffic.
        sizes = np.asarray(spec.table_sizes, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        importance = rng.exponential(1.0, t_count)
        table_weight = np.sqrt(importance / importance.sum())  # Σ σ_t² = 1
        id_dtype = np.int32 if int(sizes.max()) < 2**31 else np.int64
        self._perm = np.empty(int(sizes.sum()), dtype=id_dtype)
        self._effect = np.empty(int(sizes.sum()), dtype=np.float32)
        self._id_traffic: list[np.ndarray] = []
        for t, size in enumerate(spec.table_sizes):
            lo = int(self._offsets[t])
            perm = rng.permutation(size)
            ranks = np.arange(1, size + 2, dtype=np.float64)
            cdf = _zipf_cdf(ranks, size, self.zipf_skew)
            p_rank = np.diff(cdf)
            p_rank /= p_rank.sum()
            z = rng.standard_normal(size)
            z_mean = float(p_rank @ z)
            z_std = math.sqrt(max(float(p_rank @ (z - z_mean) ** 2), 1e-12))
            effect = np.empty(size)
            effect[perm] = (z - z_mean) / z_std * table_weight[t]
            traffic = np.empty(size)
            traffic[perm] = p_rank
            self._perm[lo : lo + size] = perm
            self._effect[lo : lo + size] = effect
            self._id_traffic.append(traffic)
        self._log_top = np.log(sizes + 1.0)
        e = 1.0 - self.zipf_skew
        self._zipf_e = e
        self._zipf_uniform = bool(np.all(np.abs(e * self._log_top) < 1e-9))
        self._zipf_c = np.expm1(e * self._log_top) if not self._zipf_uniform else None
        self._sizes = sizes

        # Bias: E[sigmoid(b + S·g)] = rate for g ~ N(0, 1), by the probit approximation.
        self._rho = _DENSE_SHARE
        rate_logit = math.log(self.positive_rate / (1.0 - self.positive_rate))
        self.bias = rate_logit * math.sqrt(1.0 + math.pi * self.signal**2 / 8.0)

    def __len__(self) -> int:
        return 2**40

    def __repr__(self) -> str:
        return (f"SyntheticSource(tables={self.spec.num_sparse}, seed={self.seed}, zipf_skew={self.zipf_skew}, "
                f"signal={self.signal})")

    # -- generation -------------------------------------------------------------------------

    def samples(self, start: int, stop: int) -> Batch:
        """Samples with global indices ``[start, stop)``; the same index always gives the same sample."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= len(self):
            raise ValueError(f"sample range [{start}, {stop}) is invalid: allowed 0 ≤ start ≤ stop ≤ 2**40")
        if stop - start <= _CHUNK:
            return self._generate(start, stop)
        return Batch.concat(self._generate(a, min(a + _CHUNK, stop)) for a in range(start, stop, _CHUNK))

    def _generate(self, start: int, stop: int) -> Batch:
        n = stop - start
        d, s = self.spec.num_dense, self.spec.num_sparse
        pairs = (s + 1) // 2
        streams = d + pairs + 1
        counter = np.arange(start, stop, dtype=np.uint64)[:, None] * np.uint64(streams) + np.arange(
            streams, dtype=np.uint64)
        counter *= _GOLDEN
        counter += self._sample_key
        h = _mix64(counter)  # (n, streams) independent 64-bit words

        # Dense: 16 bits decide "missing", 3 × 16 bits make an Irwin–Hall normal.
        hd = h[:, :d]
        missing = (hd & _U16) < self._missing_threshold
        total = ((hd >> np.uint64(16)) & _U16) + ((hd >> np.uint64(32)) & _U16) + (hd >> np.uint64(48))
        z = (total.astype(np.float64) - 98302.5) * (1.0 / 32768.0)
        z *= self._dense_sigma
        z += self._dense_mu
        dense = np.log1p(np.floor(np.exp(z)))
        dense[missing] = 0.0
        dense = dense.astype(np.float32)

        # Sparse: two 32-bit uniforms per word → bounded-Zipf rank by inverse CDF → permuted id.
        hs = h[:, d : d + pairs]
        u = np.empty((n, 2 * pairs))
        u[:, 0::2] = hs & _U32
        u[:, 1::2] = hs >> np.uint64(32)
        u = u[:, :s]
        u += 0.5
        u *= 2.0**-32
        if self._zipf_uniform:
            x = np.exp(u * self._log_top)
        else:
            x = np.exp(np.log1p(u * self._zipf_c) / self._zipf_e)
        rank = x.astype(np.int64)  # floor, x ≥ 1
        np.minimum(rank, self._sizes, out=rank)
        rank -= 1
        rank += self._offsets
        sparse = self._perm[rank].astype(np.int64)

        logits = self._logits(dense, sparse)
        u_label = (h[:, -1] >> np.uint64(11)).astype(np.float64) * 2.0**-53
        label = (u_label < _sigmoid(logits)).astype(np.float32)
        return Batch(dense, sparse, label)

    # -- the planted signal -----------------------------------------------------------------

    def _logits(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        g_dense = dense.astype(np.float64) @ self._dense_weights - self._dense_offset
        g_sparse = self._effect[sparse + self._offsets].sum(axis=1, dtype=np.float64)
        return self.bias + self.signal * (math.sqrt(self._rho) * g_dense + math.sqrt(1.0 - self._rho) * g_sparse)

    def true_logits(self, batch: Batch) -> np.ndarray:
        """The logit the labels were drawn from (float64, (n,)): the Bayes-optimal score."""
        if batch.num_dense != self.spec.num_dense or batch.num_sparse != self.spec.num_sparse:
            raise ValueError(f"batch layout ({batch.num_dense} dense, {batch.num_sparse} sparse) differs from the "
                             f"source's ({self.spec.num_dense}, {self.spec.num_sparse})")
        return self._logits(batch.dense, batch.id_matrix())

    def dense_logits(self, batch: Batch) -> np.ndarray:
        """The dense part of the true logit alone (what a model that ignores the ids can reach)."""
        g_dense = batch.dense.astype(np.float64) @ self._dense_weights - self._dense_offset
        return self.bias + self.signal * math.sqrt(self._rho) * g_dense

    def oracle_auc(self, start: int, stop: int) -> float:
        """AUC of the true logits on samples ``[start, stop)``: the best any model can do there."""
        batch = self.samples(start, stop)
        return roc_auc(batch.label, self.true_logits(batch))

    def id_traffic(self, table: int) -> np.ndarray:
        """Expected share of lookups of each row of ``table`` (float64, sums to 1)."""
        return self._id_traffic[table]


# ---------------------------------------------------------------------------------------------
# Category keys (for hashing the values of a file's sparse columns: runtime.datasets)
# ---------------------------------------------------------------------------------------------

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


def _category_keys(values: np.ndarray) -> np.ndarray:
    """A stable 64-bit key per category string: an 8-hex-digit value is its own number (the Criteo
    case, vectorised); anything else the first 8 bytes of its BLAKE2b digest."""
    keys = np.zeros(len(values), dtype=np.uint64)
    if len(values) == 0:
        return keys
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    hexlike = lengths == 8
    if hexlike.any():
        try:
            raw = np.array(values[hexlike], dtype="S8").view(np.uint8).reshape(-1, 8)
        except UnicodeEncodeError:
            raw = None
        if raw is not None:
            nibbles = _HEX[raw]
            ok = (nibbles != 255).all(axis=1)
            number = np.zeros(len(raw), dtype=np.uint64)
            for k in range(8):
                number = (number << np.uint64(4)) | nibbles[:, k].astype(np.uint64)
            index = np.flatnonzero(hexlike)
            keys[index[ok]] = number[ok]
            hexlike[index[~ok]] = False
        else:
            hexlike[:] = False
    for i in np.flatnonzero(~hexlike):
        digest = hashlib.blake2b(str(values[i]).encode("utf-8"), digest_size=8).digest()
        keys[i] = int.from_bytes(digest, "little")
    return keys


def _benchmark() -> None:  # pragma: no cover - measured by hand, figures in the module docstring
    import time

    source = SyntheticSource()
    source.samples(0, 1000)
    for size in (65_536, 512):
        calls = max(1, 1_000_000 // size)
        t0 = time.perf_counter()
        for i in range(calls):
            source.samples(i * size, (i + 1) * size)
        rate = calls * size / (time.perf_counter() - t0)
        print(f"ranges of {size}: {rate:,.0f} samples/s")
    batch = source.samples(0, 1_000_000)
    print(f"positive rate {batch.label.mean():.3f}; oracle AUC {roc_auc(batch.label, source.true_logits(batch)):.3f}; "
          f"dense-only AUC {roc_auc(batch.label, source.dense_logits(batch)):.3f}")


if __name__ == "__main__":  # pragma: no cover
    _benchmark()
