"""Memory model: what each node needs, and when a growing node will hit its limit.

PS memory holds the embedding rows of its shard and their sparse-optimizer state; rows are
partitioned over the p servers, and the tables grow as new ids arrive — with the samples trained,
not with the clock (DLRover-RM §5: PS memory grows with embedding rows; worker memory with the
batch):

    ps_memory(p, n)   = ps_base_mb + G(n) / p
    G(n)              = T₀ + (A − T₀) · (1 − exp(−g · n / (10⁶ · (A − T₀))))
    worker_memory(B)  = worker_base_mb + activation_mb_per_sample · B

with n the samples trained, G the tables summed over the PS, T₀ = ``table_mb`` (G(0)) and
g = ``table_growth_mb_per_m_samples`` (G's initial slope, MB per 10⁶ samples). The rows that n
samples touch saturate: ids drawn uniformly from R rows touch R·(1 − exp(−k·n/R)) distinct rows,
skewed ids fewer, so a line fitted on seconds of profiling over-predicts a run's peak. G rises
monotonically from T₀ with slope g towards its asymptote A and never passes it (A ≤ T₀: no
growth). A is ``table_asymptote_mb`` where the samples show the growth slowing (fitted, at most
the capacity), else ``table_capacity_mb``: the tables with every row touched, when the job's
feature layout is known, Σ_t rows_t·8 + rows_t·(8·dim_t + 8) bytes — the id → slot map, then each
row and its Adagrad accumulator (float32) and its id (``runtime.layout.FeatureLayout.table_mb``; a
full 26 × 20,000 × 16 layout: 71.4 MB predicted, 71.1 MB measured as the growth of one PS's RSS).
With neither (a trainer whose layout we do not know, growth not seen slowing) nothing bounds the
tables and G is the line T₀ + g · n / 10⁶ — where the line rose at least
``MEMORY_CURVE_MIN_RISE_MB`` a node over the samples: a smaller rise is a node's wander, and g is
pinned to 0 (the guard's trend watches the running job).

The fit: NNLS of the line (base, T₀, g; linear in its parameters) on the ``*_memory_used_mb``
columns of a sample table, g from its ``samples_seen`` column when the windows were taken at
different points of a run. Where ``samples_seen`` takes ≥ ``MEMORY_CURVE_MIN_POINTS`` distinct
values over which the line rises ≥ ``MEMORY_CURVE_MIN_RISE_MB`` a node, the curve (A too) is
fitted by bounded least squares (``scipy.optimize.least_squares``; A ≤ the capacity), and kept
when an F-test of the curve against the line (one parameter more) rejects the line at
``MEMORY_CURVE_SIGNIFICANCE``: the growth is seen slowing. A node's memory over time is fitted
with the Theil–Sen estimator (``scipy.stats.theilslopes``: robust to the allocator's sawtooth
and to GC drops) to forecast when it reaches its limit.

An all-reduce job (p = 0, ``types.is_allreduce``) has no PS: ``ps_base_mb`` and ``table_mb`` are
None ("not identifiable: the job has no PS" in ``pinned``) and a PS needs 0 MB. Each of its
workers holds the whole model, tables included, so the tables' growth is each worker's, on the
same curve from T₀ = 0:

    worker_memory(B, n) = worker_base_mb + activation_mb_per_sample · B + G(n)      (p = 0, T₀ = 0)

fitted from ``worker_memory_used_mb`` (and ``samples_seen``). The tables as they were when
measured are in ``worker_base_mb``, so once every row is touched the capacity over-reserves by at
most those.
The fit reads per-node *peaks* (``*_memory_peak_mb``: the largest node of the role in each
window — a request holds for every node of its role, the hottest PS too), the role's means where
a table has no peaks. A node's request is sized for the most it was measured to use: the
forecast peak plus the largest amount a measured peak passed the fitted curve
(``*_peak_excess_mb``: what the allocator keeps after a restore, a hot node), plus a margin:

    request = ⌈(peak + excess) · (1 + m) ⌉, at least peak + excess + floor, rounded up to ``MEMORY_GRANULARITY_MB``

with m the role's margin fraction and the floor its least headroom: a worker's
``MEMORY_MIN_HEADROOM_MB`` (its evaluation and export at the end), a PS's ``PS_MIN_HEADROOM_MB``
and at least its share of the largest table once more (restoring a checkpoint or growing a table
holds a second copy of it, one table at a time: ``ps_transient_mb``). m is VPA's safety margin
``MEMORY_MARGIN_FRACTION`` for a job whose history shows no OOM kill of the role, and grows with
each of its last ``MEMORY_OOM_HISTORY_RUNS`` runs that had one (:func:`margin_after_ooms`): the
margin the job's own OOM history justifies, no more.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls
from scipy.stats import f as f_dist

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import InvalidInputError, is_allreduce, not_identifiable, validate_samples


def memory_request_mb(peak_mb: Any, transient_mb: Any = 0.0, *, margin: float = C.MEMORY_MARGIN_FRACTION,
                      floor_mb: float = C.MEMORY_MIN_HEADROOM_MB) -> Any:
    """Peak + headroom, rounded up to the granularity (vectorised): the headroom is ``margin`` of
    the peak, at least ``floor_mb`` (a worker's ``MEMORY_MIN_HEADROOM_MB``, a PS's
    ``PS_MIN_HEADROOM_MB``) and at least ``transient_mb`` (a known short-lived copy above the
    steady peak: a PS's checkpoint)."""
    peak = np.asarray(peak_mb, dtype=float)
    headroom = np.maximum(np.maximum(peak * margin, floor_mb), np.asarray(transient_mb, dtype=float))
    return np.ceil((peak + headroom) / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB


def ps_request_mb(peak_mb: Any, transient_mb: Any = 0.0, *, margin: float = C.MEMORY_MARGIN_FRACTION) -> Any:
    """A PS's request for ``peak_mb`` (``memory_request_mb`` with the PS's floor)."""
    return memory_request_mb(peak_mb, transient_mb, margin=margin, floor_mb=C.PS_MIN_HEADROOM_MB)


def margin_after_ooms(runs_with_kills: int) -> float:
    """The margin fraction m of a role whose nodes were OOM-killed in ``runs_with_kills`` of the
    job's last ``MEMORY_OOM_HISTORY_RUNS`` runs: 1 + m = (1 + ``MEMORY_MARGIN_FRACTION``) ·
    ``OOM_MEMORY_GROWTH``^k — each such run grows the request as a kill grows the killed node
    (``OOM_MEMORY_GROWTH``, once per kill); ``MEMORY_OOM_HISTORY_RUNS`` runs without one take it
    back to VPA's."""
    if not isinstance(runs_with_kills, int) or runs_with_kills < 0:
        raise InvalidInputError("runs_with_kills", runs_with_kills, "an integer ≥ 0")
    return C.MEMORY_MARGIN_FRACTION + (1.0 + C.MEMORY_MARGIN_FRACTION) * (C.OOM_MEMORY_GROWTH ** runs_with_kills - 1.0)


@dataclass(frozen=True)
class MemoryModel:
    """Per-node memory in MB; see the module docstring for the equations. ``ps_base_mb`` and
    ``table_mb`` None: the model of an all-reduce job (no PS). ``table_asymptote_mb``: A where
    fitted (None: the capacity); ``fitted_samples_seen``: the most samples trained among the
    rows it was fitted on (0: none); ``largest_table_mb``: the layout's largest table, every row
    touched (None: unknown, taken as all of them). ``*_peak_excess_mb``: the most a measured
    per-node peak passed the fitted curve; ``*_margin_fraction``: the role's margin m (VPA's, or
    what the job's OOM history justifies: :func:`margin_after_ooms`)."""

    ps_base_mb: float | None
    table_mb: float | None
    worker_base_mb: float
    activation_mb_per_sample: float
    table_growth_mb_per_m_samples: float = 0.0
    pinned: dict[str, str] = field(default_factory=dict)
    table_capacity_mb: float | None = None
    table_asymptote_mb: float | None = None
    fitted_samples_seen: float = 0.0
    largest_table_mb: float | None = None
    worker_peak_excess_mb: float = 0.0
    ps_peak_excess_mb: float = 0.0
    worker_margin_fraction: float = C.MEMORY_MARGIN_FRACTION
    ps_margin_fraction: float = C.MEMORY_MARGIN_FRACTION

    @property
    def allreduce(self) -> bool:
        """The model of an all-reduce job (``types.is_allreduce``): it has no PS part."""
        return self.ps_base_mb is None

    @property
    def asymptote_mb(self) -> float | None:
        """A: the fitted asymptote, else the capacity; None: nothing bounds the tables (G linear)."""
        return self.table_asymptote_mb if self.table_asymptote_mb is not None else self.table_capacity_mb

    def table_growth_mb(self, samples: Any) -> Any:
        """G(n) − T₀: the tables' growth (sum over PS; an all-reduce worker's, T₀ = 0) at
        ``samples`` samples trained: (A − T₀)·(1 − exp(−g·n / (10⁶·(A − T₀)))), g·n / 10⁶
        without A."""
        n = np.asarray(samples, dtype=float)
        g = self.table_growth_mb_per_m_samples
        asymptote = self.asymptote_mb
        if asymptote is None:
            return g * n / 1e6
        headroom = max(asymptote - (self.table_mb or 0.0), 0.0)
        if headroom == 0.0 or g == 0.0:
            return np.zeros(n.shape)
        with np.errstate(over="ignore"):  # a headroom of a few ulps: the exponent is −inf, G = A
            return -headroom * np.expm1(-g * n / (1e6 * headroom))

    def ps_peak_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """PS memory at ``samples`` samples trained (n); 0 where ``ps`` is 0 (no PS)."""
        p = np.asarray(ps, dtype=float)
        n = np.asarray(samples, dtype=float)
        if self.allreduce:
            if np.any(p != 0):
                raise InvalidInputError("ps", ps, "0: the memory model is of an all-reduce job (no PS)")
            return np.zeros(np.broadcast(p, n).shape)
        return np.where(p > 0, self.ps_base_mb + self.ps_tables_mb(p, n), 0.0)

    def ps_tables_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """One PS's share of the tables, G(n) / p, at ``samples`` samples trained (0 where ``ps`` is 0)."""
        p = np.asarray(ps, dtype=float)
        if self.allreduce:
            return np.zeros(np.broadcast(p, np.asarray(samples)).shape)
        grown = self.table_mb + self.table_growth_mb(samples)
        return np.where(p > 0, grown / np.where(p > 0, p, 1.0), 0.0)

    def worker_peak_mb(self, batch_size: Any, samples: Any = 0.0) -> Any:
        """Worker memory at ``batch_size``; an all-reduce worker's at ``samples``
        samples trained (it holds the whole tables; a PS job's worker holds none)."""
        peak = self.worker_base_mb + self.activation_mb_per_sample * np.asarray(batch_size, dtype=float)
        if not self.allreduce or not self.table_growth_mb_per_m_samples:
            return peak
        return peak + self.table_growth_mb(samples)

    def ps_request_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """The request (:func:`ps_request_mb`) for a PS's peak and excess, with room for what it
        holds twice for a moment (``ps_transient_mb``); 0 where ``ps`` is 0: nothing runs."""
        request = ps_request_mb(self.ps_peak_mb(ps, samples) + self.ps_peak_excess_mb,
                                self.ps_transient_mb(ps, samples), margin=self.ps_margin_fraction)
        p = np.asarray(ps)
        return request if np.all(p > 0) else np.where(p > 0, request, 0.0)

    def ps_transient_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """What a PS holds twice for a moment: a table it restores from a checkpoint (read beside
        the one it fills), one table at a time (a table grows in place, ``ps.EmbeddingStore``, and a
        save streams the rows, ``EmbeddingShard.export``) — ``PS_TABLE_COPY_FACTOR`` × its share
        of the largest table, at most of them all."""
        tables = self.ps_tables_mb(ps, samples)
        if self.largest_table_mb is not None:
            p = np.asarray(ps, dtype=float)
            tables = np.minimum(tables, np.where(p > 0, self.largest_table_mb / np.where(p > 0, p, 1.0), 0.0))
        return C.PS_TABLE_COPY_FACTOR * tables

    def worker_request_mb(self, batch_size: Any, samples: Any = 0.0) -> Any:
        return memory_request_mb(self.worker_peak_mb(batch_size, samples) + self.worker_peak_excess_mb,
                                 margin=self.worker_margin_fraction)

    def with_oom_history(self, runs: Iterable[Iterable[str]]) -> "MemoryModel":
        """The same model with the margins its job's OOM history justifies: ``runs``, newest first,
        the roles (worker, ps) OOM-killed in each run; of the last ``MEMORY_OOM_HISTORY_RUNS``,
        those with a kill of a role set its margin (:func:`margin_after_ooms`)."""
        recent = [set(roles) for roles in itertools.islice(runs, C.MEMORY_OOM_HISTORY_RUNS)]
        return replace(self, worker_margin_fraction=margin_after_ooms(sum("worker" in r for r in recent)),
                       ps_margin_fraction=margin_after_ooms(sum("ps" in r for r in recent)))

    def with_table_growth(self, mb_per_m_samples: float) -> "MemoryModel":
        """The same model with another initial growth g of the whole tables (sum over PS), MB per 10⁶ samples."""
        return replace(self, table_growth_mb_per_m_samples=max(float(mb_per_m_samples), 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemoryModel":
        try:
            return cls(**data)
        except TypeError as err:
            raise InvalidInputError("model.memory", str(err), "a memory model written by `dlrover-rm fit`") from None


def _nnls_fit(columns: dict[str, np.ndarray], y: np.ndarray, why: dict[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    """NNLS of y on the named columns; a column that never varies (beyond the first, the base)
    is pinned to 0 with the reason in ``why`` and the base absorbs it."""
    names = list(columns)
    keep = [names[0]] + [n for n in names[1:] if np.ptp(columns[n]) > 0]
    solution, _ = nnls(np.column_stack([columns[n] for n in keep]), y)
    values = dict.fromkeys(names, 0.0) | dict(zip(keep, map(float, solution)))
    return values, {n: why[n] for n in names if n not in keep}


def memory_columns(allreduce: bool) -> tuple[str, ...]:
    """The usage columns a memory fit needs: the workers' (all-reduce), and the PS's (PS jobs)."""
    return ("worker_memory_used_mb",) if allreduce else ("ps_memory_used_mb", "worker_memory_used_mb")


def has_memory_usage(table: pd.DataFrame) -> bool:
    """Whether a (validated) sample table measured what ``fit_memory`` needs for its kind of job."""
    return all(c in table and table[c].notna().any() for c in memory_columns(is_allreduce(table)))


def node_peaks(table: pd.DataFrame, role: str) -> pd.Series:
    """Per window, the role's largest node (``{role}_memory_peak_mb``), its mean where the window
    measured no peak (a table written before peaks were measured)."""
    used = table[f"{role}_memory_used_mb"].astype(float)
    peak = f"{role}_memory_peak_mb"
    return table[peak].astype(float).fillna(used) if peak in table else used


def _excess(measured: np.ndarray, fitted: Any) -> float:
    """The most a measured peak passed the fitted curve, MB (0 where none did)."""
    return float(np.max(measured - np.asarray(fitted, dtype=float), initial=0.0))


def fit_memory(samples: pd.DataFrame, *, validated: bool = False, table_capacity_mb: float | None = None,
               largest_table_mb: float | None = None, base_from: MemoryModel | None = None) -> MemoryModel:
    """Fit the memory model from a sample table with ``ps_memory_used_mb`` (PS jobs) and
    ``worker_memory_used_mb`` (per-node means; rows with empty usage are ignored) and, when
    present, ``samples_seen`` (samples trained when the window was measured): the line by NNLS,
    the curve where the samples show the growth slowing (see the module docstring).
    ``validated``: ``samples`` is what :func:`validate_samples` returned (not checked again);
    ``table_capacity_mb``: the layout's bound on the tables; ``largest_table_mb``: its largest table's;
    ``base_from``: an earlier model of the job whose PS base is kept where the samples' PS count
    never varies (:func:`_split_at_base`), and whose margins (``*_margin_fraction``) are kept."""
    table = samples if validated else validate_samples(samples)
    allreduce = is_allreduce(table)
    for column in memory_columns(allreduce):
        if column not in table or not table[column].notna().any():
            raise InvalidInputError(
                f"samples.{column}", "missing",
                "measured per-node memory in MB (the profiler records it)",
                "The planner sizes memory from it.",
            )
    margins = {} if base_from is None else {
        "worker_margin_fraction": base_from.worker_margin_fraction, "ps_margin_fraction": base_from.ps_margin_fraction}
    if allreduce:
        return replace(_fit_allreduce_memory(table, table_capacity_mb), largest_table_mb=largest_table_mb, **margins)
    ps_rows = table[table["ps_memory_used_mb"].notna()]
    inverse_ps = 1.0 / ps_rows["ps"].to_numpy(float)
    seen = _samples_seen(ps_rows)
    used = node_peaks(ps_rows, "ps").to_numpy(float)
    ps, pinned = _nnls_fit(
        {"ps_base_mb": np.ones_like(inverse_ps), "table_mb": inverse_ps, "growth": seen / 1e6 * inverse_ps},
        used,
        {"table_mb": "ps never varies: the whole PS memory counts as base",
         "growth": "no samples_seen that varies: table growth unknown (0)"},
    )
    start = None if "table_mb" in pinned else "table_mb"
    ps, asymptote, curve_pins = _fit_curve({"ps_base_mb": np.ones_like(inverse_ps)}, inverse_ps, seen, used, ps,
                                           start, table_capacity_mb)
    base_known = base_from is not None and not base_from.allreduce and "table_mb" not in base_from.pinned
    if "table_mb" in pinned and base_known:
        ps, asymptote, pinned = _split_at_base(ps, asymptote, pinned, float(ps_rows["ps"].iloc[0]), base_from,
                                               table_capacity_mb)
    worker_rows = table[table["worker_memory_used_mb"].notna()]
    batch = worker_rows["batch_size"].to_numpy(float)
    worker_used = node_peaks(worker_rows, "worker").to_numpy(float)
    worker, pinned_w = _nnls_fit(
        {"worker_base_mb": np.ones_like(batch), "activation_mb_per_sample": batch}, worker_used,
        {"activation_mb_per_sample": "batch_size never varies: worker memory is taken as constant"},
    )
    model = MemoryModel(
        ps["ps_base_mb"], ps["table_mb"], worker["worker_base_mb"], worker["activation_mb_per_sample"],
        ps["growth"], _growth_pinned(pinned, curve_pins) | pinned_w, table_capacity_mb, asymptote, _most(seen),
        largest_table_mb, **margins,
    )
    return replace(model, ps_peak_excess_mb=_excess(used, model.ps_peak_mb(ps_rows["ps"].to_numpy(float), seen)),
                   worker_peak_excess_mb=_excess(worker_used, model.worker_peak_mb(batch)))


def _split_at_base(ps: dict[str, float], asymptote: float | None, pinned: dict[str, str], count: float,
                   base_from: MemoryModel, capacity: float | None,
                   ) -> tuple[dict[str, float], float | None, dict[str, str]]:
    """A PS fit on one PS count p cannot tell the process's base from its share of the tables: its
    base b' = b + T₀/p. The process's base b does not change with the data; so keep the earlier
    model's (``base_from``, fitted over several PS counts), at most b', and T₀ = (b' − b)·p — the
    tables then divide over another PS count (as DLRover-RM §5 sizes a PS by its share of the
    rows). The fitted asymptote, relative to T₀ = 0, moves up by T₀ (at most the capacity).
    Otherwise a refit on 34 PS sizes each of 9 PS for a 34th of the tables (in the simulation,
    the next day's PS were killed for memory until the job failed)."""
    base = min(float(base_from.ps_base_mb), ps["ps_base_mb"])
    tables = (ps["ps_base_mb"] - base) * count
    if asymptote is not None:
        asymptote = asymptote + tables if capacity is None else min(asymptote + tables, max(capacity, tables))
    kept = {k: v for k, v in pinned.items() if k != "table_mb"}
    return ps | {"ps_base_mb": base, "table_mb": tables}, asymptote, kept


def _samples_seen(rows: pd.DataFrame) -> np.ndarray:
    seen = pd.to_numeric(rows.get("samples_seen", 0.0), errors="coerce")
    return np.nan_to_num(np.broadcast_to(np.asarray(seen, dtype=float), (len(rows),)))


def _most(seen: np.ndarray) -> float:
    return float(seen.max()) if len(seen) else 0.0


def _growth_pinned(pinned: dict[str, str], curve: dict[str, str]) -> dict[str, str]:
    """``pinned`` under the model's names, with what the curve's fit pinned (``curve``)."""
    return {("table_growth_mb_per_m_samples" if k == "growth" else k): v for k, v in pinned.items()} | curve


def _fit_curve(terms: dict[str, np.ndarray], share: np.ndarray, seen: np.ndarray, y: np.ndarray,
               line: dict[str, float], start: str | None, capacity: float | None,
               ) -> tuple[dict[str, float], float | None, dict[str, str]]:
    """The curve y = Σ_j c_j·x_j + share·G(n) (``terms``: the x_j beside the tables; ``start``:
    the name of T₀'s coefficient, None: T₀ = 0) by bounded least squares from the line's values
    ``line`` (NNLS; ``growth``: g), with A = T₀ + s·(capacity − T₀), s ∈ [0, 1] (A = T₀ + s,
    s ≥ 0 without a capacity). Returns (values, A, {}) where an F-test rejects the line at
    ``MEMORY_CURVE_SIGNIFICANCE``, else (``line``, None, what was pinned and why: the asymptote; the
    growth too, 0, where it rose less than ``MEMORY_CURVE_MIN_RISE_MB`` a node and no capacity
    bounds it: a wander's slope, extrapolated to a job's end, once asked 1.7 GB of a 100 MB node);
    {} where nothing grows."""
    if line["growth"] <= 0:
        return line, None, {}
    bound = ("the asymptote is the layout's capacity" if capacity is not None
             else "growth taken as linear (no capacity known)")
    if len(np.unique(seen)) < C.MEMORY_CURVE_MIN_POINTS:
        why = f"fewer than {C.MEMORY_CURVE_MIN_POINTS} distinct samples_seen: {bound}"
        return line, None, {"table_asymptote_mb": why}
    if line["growth"] * np.ptp(seen) / 1e6 * np.median(share) < C.MEMORY_CURVE_MIN_RISE_MB:
        within = f"the tables rose < {C.MEMORY_CURVE_MIN_RISE_MB:g} MB a node over the samples"
        if capacity is None:  # a slope within the wander, extrapolated without a bound, is no growth
            return line | {"growth": 0.0}, None, {
                "table_growth_mb_per_m_samples": f"{within}, within a node's wander, and nothing bounds them: "
                                                 "0 (the guard's trend watches the job)"}
        return line, None, {"table_asymptote_mb": f"{within}: {bound}"}
    first, *rest = terms
    names = [first] + [k for k in rest if np.ptp(terms[k]) > 0]  # as _nnls_fit: a constant column stays 0
    x = np.column_stack([terms[k] for k in names])
    top = np.inf if capacity is None else float(capacity)
    curve = _Curve(x, share, seen, None if capacity is None else top, start is not None)
    start_mb = line[start] if start else 0.0
    line_sse = float(np.sum((x @ [line[k] for k in names] + share * (start_mb + line["growth"] * seen / 1e6) - y) ** 2))
    dof = len(y) - (len(names) + bool(start) + 2)  # less the curve's parameters
    if dof < 1:
        return line, None, {"table_asymptote_mb": f"no more rows than the curve's parameters: {bound}"}
    why = f"growth not seen slowing (F-test at {C.MEMORY_CURVE_SIGNIFICANCE:g}): {bound}"
    not_slowing = line, None, {"table_asymptote_mb": why}
    floor = _curve_sse_floor(x, share, seen, y, start is not None)
    if floor is not None and _line_kept(line_sse, floor, dof):  # the F-test keeps the line at the curve's best
        return not_slowing
    lower = [0.0] * (len(names) + bool(start) + 2)
    upper = [np.inf] * len(names) + ([top] if start else []) + [np.inf, 1.0 if capacity is not None else np.inf]
    t0 = min(line[start], top) if start else 0.0
    rise = line["growth"] * np.ptp(seen) / 1e6
    best = None
    tried = set()
    for g_factor, rise_factor in itertools.product((1.0, 3.0), (0.5, 1.0, 3.0)):
        headroom = rise * rise_factor
        s0 = min(headroom / max(top - t0, 1e-9), 1.0) if capacity is not None else headroom
        theta0 = [line[k] for k in names] + ([t0] if start else []) + [line["growth"] * g_factor, s0]
        if tuple(theta0) in tried:  # a start the capacity clipped to one tried already: the same result
            continue
        tried.add(tuple(theta0))
        result = least_squares(lambda th: curve.predict(th) - y, theta0, jac=curve.jacobian, bounds=(lower, upper),
                               x_scale="jac")
        if best is None or result.cost < best.cost:
            best = result
    if _line_kept(line_sse, 2.0 * float(best.cost), dof):
        return not_slowing
    c, t0, g, headroom = curve.parts(best.x)
    values = dict(line) | dict(zip(names, map(float, c))) | {"growth": float(g)} | ({start: float(t0)} if start else {})
    return values, float(t0 + headroom), {}


@dataclass(frozen=True)
class _Curve:
    """``_fit_curve``'s curve of θ = (c_j…, [T₀], g, s): y = x·c + share·(T₀ − h·expm1(−g·n/(10⁶·h)))
    with h = s·(capacity − T₀) (s ∈ [0, 1]), else h = s; ``start``: T₀ is fitted (else 0)."""

    x: np.ndarray
    share: np.ndarray
    seen: np.ndarray
    capacity: float | None
    start: bool

    def parts(self, theta: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """(c, T₀, g, h) of θ."""
        k = self.x.shape[1]
        t0 = theta[k] if self.start else 0.0
        g, s = theta[-2], theta[-1]
        return theta[:k], t0, g, s * max(self.capacity - t0, 0.0) if self.capacity is not None else s

    def predict(self, theta: np.ndarray) -> np.ndarray:
        c, t0, g, headroom = self.parts(theta)
        return self.x @ c + self.share * (t0 - headroom * np.expm1(-g * self.seen / (1e6 * max(headroom, 1e-12))))

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        """∂predict/∂θ: with z = −g·n/(10⁶·h), ∂/∂g = share·e^z·n/10⁶, ∂/∂h = share·(z·e^z − expm1(z))
        (h ≤ 10⁻¹², held at 10⁻¹² in z: −share·expm1(z)), and ∂/∂T₀ = share + ∂/∂h·∂h/∂T₀."""
        _, t0, g, headroom = self.parts(theta)
        floor = max(headroom, 1e-12)
        z = -g * self.seen / (1e6 * floor)
        ez = np.exp(z)
        d_g = self.share * (headroom / floor) * ez * self.seen / 1e6
        d_h = self.share * ((z * ez if headroom > 1e-12 else 0.0) - np.expm1(z))
        room = max(self.capacity - t0, 0.0) if self.capacity is not None else None
        d_t0 = [self.share - (d_h * theta[-1] if room else 0.0)] if self.start else []
        return np.column_stack([self.x, *d_t0, d_g, d_h * (room if room is not None else 1.0)])


def _line_kept(line_sse: float, curve_sse: float, dof: int) -> bool:
    """The F-test of the curve (one parameter more) against the line does not reject the line at
    ``MEMORY_CURVE_SIGNIFICANCE``; it keeps it for any curve_sse at least this one (the statistic
    falls as curve_sse grows)."""
    noise = max(curve_sse / dof, C.MEMORY_NOISE_FLOOR_MB ** 2)
    return f_dist.sf((line_sse - curve_sse) / noise, 1, dof) >= C.MEMORY_CURVE_SIGNIFICANCE


def _curve_sse_floor(x: np.ndarray, share: np.ndarray, seen: np.ndarray, y: np.ndarray, start: bool) -> float | None:
    """At most the least squared error of ``_fit_curve``'s curve (None: no bound), without fitting it.
    The curve is y = x·c + share·(T₀ + φ(n)), c, T₀ ≥ 0 (T₀ = 0 without ``start``) and φ(n) = G(n) − T₀
    concave, non-decreasing, φ(0) = 0; at the rows' n ≥ 0, so is φ's piecewise-linear interpolant
    through the distinct n_j > 0, Σ_j e_j·min(n, n_j) with every e_j ≥ 0. So the NNLS of y on x,
    share and share·min(n, n_j) fits at least as well as any curve; its error, less a margin for
    rounding (10⁻⁴ of it and 10⁻⁹ of Σy²), is the bound."""
    if not ((seen >= 0).all() and np.isfinite(y).all() and np.isfinite(x).all() and np.isfinite(share).all()):
        return None
    knots = np.unique(seen[seen > 0])
    interpolant = share[:, None] * np.minimum(seen[:, None], knots) / 1e6
    design = np.hstack([x] + ([share[:, None]] if start else []) + [interpolant])
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    try:
        _, residual = nnls(design / scale, y, maxiter=50 * design.shape[1])
    except (RuntimeError, ValueError, np.linalg.LinAlgError):
        return None
    return max(float(residual) ** 2 * (1.0 - 1e-4) - 1e-9 * float(y @ y), 0.0)


def _fit_allreduce_memory(table: pd.DataFrame, table_capacity_mb: float | None) -> MemoryModel:
    """The workers' part of the model, with the tables' growth on each worker (no PS part)."""
    rows = table[table["worker_memory_used_mb"].notna()]
    batch = rows["batch_size"].to_numpy(float)
    seen = _samples_seen(rows)
    used = node_peaks(rows, "worker").to_numpy(float)
    terms = {"worker_base_mb": np.ones_like(batch), "activation_mb_per_sample": batch}
    worker, pinned = _nnls_fit(
        terms | {"growth": seen / 1e6}, used,
        {"activation_mb_per_sample": "batch_size never varies: worker memory is taken as constant",
         "growth": "no samples_seen that varies: table growth unknown (0)"},
    )
    worker, asymptote, curve_pins = _fit_curve(terms, np.ones_like(batch), seen, used, worker, None, table_capacity_mb)
    no_ps = dict.fromkeys(("ps_base_mb", "table_mb"), not_identifiable(True))
    model = MemoryModel(None, None, worker["worker_base_mb"], worker["activation_mb_per_sample"], worker["growth"],
                        no_ps | _growth_pinned(pinned, curve_pins), table_capacity_mb, asymptote, _most(seen))
    return replace(model, worker_peak_excess_mb=_excess(used, model.worker_peak_mb(batch, seen)))


@dataclass(frozen=True)
class MemoryTrend:
    """A robust linear trend of one node's memory: used(t) = intercept + slope · t."""

    slope_mb_per_s: float
    intercept_mb: float
    last_time_s: float
    last_used_mb: float

    def at(self, time_s: float) -> float:
        return self.intercept_mb + self.slope_mb_per_s * time_s

    def seconds_to(self, limit_mb: float) -> float:
        """Seconds from the last observation until the trend reaches ``limit_mb`` (inf if never)."""
        now = max(self.at(self.last_time_s), self.last_used_mb)
        if now >= limit_mb:
            return 0.0
        if self.slope_mb_per_s <= 0:
            return float("inf")
        return (limit_mb - now) / self.slope_mb_per_s


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil–Sen line (Sen 1968), as ``scipy.stats.theilslopes`` computes it: the slope is the
    median of the pairwise slopes (yj − yi) / (xj − xi) over pairs with xj > xi, the intercept
    median(y) − slope · median(x)."""
    slopes, intercepts = theil_sen_many(np.asarray(x, dtype=float)[None, :], np.asarray(y, dtype=float)[None, :])
    return float(slopes[0]), float(intercepts[0])


def theil_sen_many(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``theil_sen`` of each row of ``x`` and ``y`` (shape: series × points; every row has two
    distinct times; NaN where one has not) at once: the detectors fit a few points of every node
    each window."""
    dx = x[:, None, :] - x[:, :, None]
    dy = y[:, None, :] - y[:, :, None]
    pair = (dx > 0).reshape(len(x), -1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pairwise = np.sort(np.where(pair, (dy / dx).reshape(len(x), -1), np.inf), axis=1)  # the pairs first
    # The median of each row's pairs, as np.nanmedian takes it: the middle one, or half the sum of the two
    counts = pair.sum(axis=1)
    rows, high = np.arange(len(x)), counts // 2
    low = np.where(counts % 2 == 1, high, high - 1)
    slopes = np.where(counts > 0, (pairwise[rows, low] + pairwise[rows, high]) / 2.0, np.nan)
    return slopes, np.median(y, axis=1) - slopes * np.median(x, axis=1)


def fit_trend(times_s: Sequence[float], used_mb: Sequence[float]) -> MemoryTrend:
    """Theil–Sen slope and intercept of a memory series (needs ≥ 2 points, distinct times)."""
    t = np.asarray(times_s, dtype=float)
    y = np.asarray(used_mb, dtype=float)
    if t.shape != y.shape or len(t) < 2 or np.ptp(t) == 0 or not (np.isfinite(t).all() and np.isfinite(y).all()):
        raise InvalidInputError("memory series", f"{len(t)} points", "≥ 2 finite points at distinct times")
    slope, intercept = theil_sen(t, y)
    last = int(np.argmax(t))
    return MemoryTrend(float(slope), float(intercept), float(t[last]), float(y[last]))
