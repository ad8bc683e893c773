"""Throughput model of DLRM training (parameter-server or all-reduce), fitted by non-negative least squares.

Each worker runs steps of ``B`` samples. After the structure of the DLRover-RM paper (§4: the step
time is a sum of worker compute, PS service and communication terms), the time of one step is

    t_step = θ_overhead                          fixed per-step cost (RPC round trips, Python)
           + θ_worker_compute · B / λw           dense forward/backward on λw CPU cores
           + θ_gpu_compute    · B / g            ... or on g GPUs (replaces the CPU term)
           + θ_ps_latency     · B / (p·min(λp,1)) the wait for one's own B/p rows at each PS
                                                 before queues form: one request is served by
                                                 one thread, so more cores do not shorten it,
                                                 but a CFS quota below one core stretches it
           + θ_ps_service     · w · B / (p·λp)   lookups + sparse updates: the rows of all w
                                                 workers spread over p PS with λp cores each
           + θ_ps_request     · w / λp           the fixed cost of a request at a PS (decode,
                                                 dispatch, reply): every step sends one to each
                                                 PS, so this PS load does not shrink with p
           + θ_network        · w · B / p        the same rows through the p PS network links
           + θ_contention     · w²·B / (p²·λp)   lock/queue contention: each PS's per-row cost
                                                 grows with its concurrent clients (w/p), which
                                                 takes PS cores: θ_ps_service · (1 + α·w/p)
           + θ_io             · w · B            a job-wide cap no allocation moves (the shared
                                                 data source, the master's shard service)
           + θ_allreduce      · 2(w−1)/w         all-reduce jobs (p = 0) only: a ring all-reduce
                                                 of the dense gradients sends and receives
                                                 2(w−1)/w of them per worker, whatever B
           + θ_allreduce_latency · 2(w−1)        ... in 2(w−1) hops round the ring, each with a
                                                 fixed latency

and the job throughput is X = w·B / t_step. Each term, alone, bounds the throughput:

    X ≤ 1/t_k(x)   with t_k(x) = θ_k · f_k(x) and
    f = [1/(w·B), 1/(w·λw), 1/(w·g), 1/(w·p·min(λp,1)), 1/(p·λp), 1/(λp·B), 1/p, w/(p²·λp), 1,
         2(w−1)/(w²·B), 2(w−1)/(w·B)]

— X ≤ w·λw/θ_worker_compute (worker cores), X ≤ p·λp/θ_ps_service (PS cores), X ≤ p/θ_network
(links), X ≤ 1/θ_io (a plateau more resources cannot lift: what keeps the fine-tune policy still
on a flat curve); the contention term makes throughput *fall* past
w* = p·sqrt(λp·(θ_overhead/B + θ_worker_compute/λw)/θ_contention) (at q = 1): a best worker/PS ratio.

A job is of one kind for its whole life (``types.is_allreduce``). A PS job (p ≥ 1) has no ring:
its two all-reduce features are 0. An all-reduce job (p = 0: data-parallel workers, no PS) has no
PS: its five PS features (ps_latency, ps_service, ps_request, network, contention) are 0, and
a lone worker (w = 1) has no ring either. A model records its kind (``ThroughputModel.allreduce``,
from the samples it was fitted on), and the terms of the other kind are reported as not
identifiable. With p = 0 more workers stop paying: in 1/X the bandwidth term 2(w−1)/(w²·B) falls
as 1/w like the compute terms, but the latency term 2(w−1)/(w·B) rises to 2/B, so X tends to a
plateau X ≤ B/(2·θ_allreduce_latency), as with θ_io, that each added worker approaches by less.
At q = 1 and one batch size the latency feature is a combination of two others,
2(w−1)/(w·B) = (2/B)·1 − 2·1/(w·B): then ``io`` is pinned (it is last to be admitted) and
θ_allreduce_latency with θ_overhead carries it, which predicts the same.

The terms combine by a q-norm, whose exponent q (the "sharpness") is fitted too:

    1/X = ( Σ_k (θ_k · f_k(x))^q )^(1/q)

q = 1 adds the stages (nothing overlaps: the DLRover-RM sum of step times); q → ∞ keeps only the
slowest (perfect pipelining). Real PS jobs sit between: queues overlap the stages and sharpen the
knee at saturation (on our queueing simulation q = 2–3 halves the error of q = 1; see
benchmarks/accuracy.py). For a given q the model is *linear* in φ_k = θ_k^q ≥ 0:

    (1/X)^q = Σ_k φ_k · f_k(x)^q

so each fit is one NNLS problem (``scipy.optimize.nnls``); q is chosen from ``SHARPNESS_CANDIDATES``
by grouped cross-validation over configurations. A node's cores enter as its *effective* cores
(:func:`effective_cores`): λ^a from one core up (a_w for workers, a_p for PS: their threads'
efficiency), λ·(1 − ℓ·(1 − λ)) below one (ℓ: a CFS quota's throttling), whole cores (1, 1, 0)
by default. The core curve (a_w, a_p, ℓ) is chosen like q, by the same cross-validation, once the
samples hold ``SCALING_MIN_CONFIGURATIONS`` configurations (a grid, a history; not a cold
profile's few probes, on which it does not generalise: benchmarks/accuracy.py, fit_error.py).
Rows are weighted by X^q so that residuals are relative errors (≈ q × the relative error of X),
and recent rows weigh more. Parameters the samples cannot identify (``gpu_compute`` with no GPU
sample; ``ps_service`` against ``network`` when λp never varies; the terms of the other kind of job)
are pinned — to the prior when there is one, else to 0 — and listed in the report. A prior
(yesterday's model of the same job) enters as a ridge toward its parameters in relative terms
(weight ``WARM_START_PRIOR_WEIGHT``), so that a few new probes correct the terms they exercise and
the prior keeps the rest; it also fixes q. Predictions carry a band from the covariance of φ plus
the noise, which is at least the out-of-sample error (so that a model of the wrong form is not
over-confident).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import (
    InvalidInputError,
    check_kind,
    configuration_codes,
    is_allreduce,
    not_identifiable,
    validate_samples,
)

#: The terms only a PS job has, and those only an all-reduce job has (see the module docstring).
PS_TERMS = ("ps_latency", "ps_service", "ps_request", "network", "contention")
ALLREDUCE_TERMS = ("allreduce", "allreduce_latency")

PARAMETERS = (
    "overhead", "worker_compute", "gpu_compute", "ps_latency", "ps_service", "ps_request", "network",
    "contention", "io", *ALLREDUCE_TERMS,
)
#: The core curve (a_w, a_p, ℓ) of :func:`effective_cores` where every core counts whole: that
#: of a model fitted without one, or written before them.
NO_SCALING = (1.0, 1.0, 0.0)


def effective_cores(cores: Any, exponent: float, throttle: float) -> np.ndarray:
    """What λ cores give a node, in whole cores: λ^a from one core up (its threads' efficiency:
    a serial part, locks, memory bandwidth), λ·(1 − ℓ·(1 − λ)) below one (a CFS quota: the
    throttled thread also loses the period's tail and its cache). 1 at λ = 1 either way."""
    cores = np.asarray(cores, dtype=float)
    if exponent == 1.0 and throttle == 0.0:
        return cores
    return np.where(cores >= 1.0, np.maximum(cores, 1.0) ** exponent, cores * (1.0 - throttle * (1.0 - cores)))

#: The parameters of the models written before all-reduce jobs (their covariance is 9 × 9): the
#: first ones of ``PARAMETERS``, in its order.
_LEGACY_PARAMETERS = PARAMETERS[:9]

#: Order in which parameters are admitted when the samples identify only some of them: the
#: simplest explanation first (cores on each side), refinements last. The ring's latency comes
#: before ``io``, which at q = 1 and one batch size it can stand for (the module docstring), but
#: not the other way round without a negative overhead.
_IDENTIFY_ORDER = (
    "ps_service", "worker_compute", "gpu_compute", "overhead", "allreduce", "ps_latency", "ps_request", "network",
    "contention", "allreduce_latency", "io",
)


def kind_parameters(allreduce: bool) -> tuple[str, ...]:
    """The parameters a job of this kind has: all but the other kind's terms, in ``PARAMETERS``' order."""
    other = PS_TERMS if allreduce else ALLREDUCE_TERMS
    return tuple(name for name in PARAMETERS if name not in other)


def kind_columns(allreduce: bool) -> np.ndarray:
    """The indices in ``PARAMETERS`` (and in a design row) of ``kind_parameters(allreduce)``."""
    return np.array([PARAMETERS.index(name) for name in kind_parameters(allreduce)])


def features(
    workers: Any, ps: Any, worker_cpu: Any, ps_cpu: Any, worker_gpu: Any, batch_size: Any,
    columns: Any = None, scaling: tuple[float, float, float] = NO_SCALING,
) -> np.ndarray:
    """The design row f(x) of each configuration, so that 1/X = f(x)·θ. Shape (n, 11), columns in
    ``PARAMETERS``' order: the PS features are 0 where p = 0, the all-reduce features where p ≥ 1.
    ``columns``: only these (indices in ``PARAMETERS``, e.g. ``kind_columns``), in that order.
    ``scaling``: the core curve (a_w, a_p, ℓ): λw and λp enter as :func:`effective_cores`."""
    w = np.asarray(workers, dtype=float)
    p = np.asarray(ps, dtype=float)
    lw = effective_cores(worker_cpu, scaling[0], scaling[2])
    lp = effective_cores(ps_cpu, scaling[1], scaling[2])
    g = np.asarray(worker_gpu, dtype=float)
    b = np.asarray(batch_size, dtype=float)
    w, p, lw, lp, g, b = np.broadcast_arrays(w, p, lw, lp, g, b)
    on_gpu = g > 0
    has_ps = p > 0
    if has_ps.all():  # PS rows only (the planner's PS grid): no ring, nothing to guard
        ps_on, p_, lp_, ring = 1.0, p, lp, np.zeros_like(w)
    else:
        ps_on = has_ps.astype(float)  # the PS features of an all-reduce row are 0, not 1/0
        p_, lp_ = np.where(has_ps, p, 1.0), np.where(has_ps, lp, 1.0)
        ring = np.where(has_ps, 0.0, 2.0 * (w - 1.0) / w)  # 2(w−1)/w of the gradients per worker
    design = [
        1.0 / (w * b),
        np.where(on_gpu, 0.0, 1.0 / (w * lw)),
        np.where(on_gpu, 1.0 / (w * np.maximum(g, 1.0)), 0.0),
        ps_on / (w * p_ * np.minimum(lp_, 1.0)),
        ps_on / (p_ * lp_),
        ps_on / (lp_ * b),
        ps_on / p_,
        ps_on * w / (p_ * p_ * lp_),
        np.ones_like(w),
        ring / (w * b),
        ring / b,
    ]
    return np.stack(design if columns is None else [design[j] for j in columns], axis=-1)


def table_features(table: pd.DataFrame, scaling: tuple[float, float, float] = NO_SCALING) -> np.ndarray:
    gpu = table["worker_gpu"] if "worker_gpu" in table else 0
    return features(
        table["workers"], table["ps"], table["worker_cpu"], table["ps_cpu"], gpu, table["batch_size"],
        scaling=scaling,
    )


@dataclass(frozen=True)
class FitReport:
    """What a fit says about itself: errors, what was pinned and why."""

    n_samples: int
    n_configurations: int
    in_sample_mape: float
    out_of_sample_mape: float | None
    out_of_sample_method: str
    relative_noise: float
    pinned: dict[str, str]
    warm_start: bool
    sharpness_cv_mape: dict[str, float] | None = None
    #: The cross-validated MAPE of each point of the core curve tried ("worker_cpu^0.7": …).
    scaling_cv_mape: dict[str, float] | None = None
    #: The largest ``worker_cpu`` and ``ps_cpu`` the model rests on (its samples', and its
    #: prior's): the planner does not extrapolate node sizes far past them.
    largest_node_cpu: dict[str, float] | None = None
    #: [least, most] of ``workers``, ``ps``, ``worker_cpu`` and ``ps_cpu`` over the samples (and
    #: the prior's range): where the model interpolates (``planner.extrapolation``).
    probed_range: dict[str, list[float]] | None = None
    #: Fitted on a profile that ended before the probes that identify the model (a job too short
    #: to pay for them: ``probes.profile_is_partial``): it plans its run, never a later one's.
    partial: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ThroughputModel:
    """Fitted θ and sharpness q (see the module docstring), the covariance of φ = θ^q, and the
    relative noise of a measurement around the model. ``allreduce``: the kind of job it models
    (from its samples: ``types.is_allreduce``); the other kind's terms are 0 and not identified.
    ``scaling``: its core curve (a_w, a_p, ℓ), how λw and λp enter (:func:`effective_cores`)."""

    params: dict[str, float]
    sharpness: float
    covariance: np.ndarray
    relative_noise: float
    batch_size: int
    report: FitReport | None = None
    identified: tuple[str, ...] = field(default=PARAMETERS)
    allreduce: bool = False
    scaling: tuple[float, float, float] = NO_SCALING

    @property
    def theta(self) -> np.ndarray:
        return np.array([self.params[name] for name in PARAMETERS])

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters of this kind of job (``kind_parameters``)."""
        return kind_parameters(self.allreduce)

    def predict_features(self, feats: np.ndarray, band: bool = True, feats_q: np.ndarray | None = None,
                         columns: np.ndarray | None = None):
        """Throughput (and its lower, upper band) from design rows; ``feats_q`` = feats**q if cached.
        ``columns``: the indices in ``PARAMETERS`` of the rows' columns, when they are not all of
        them (the planner's grid keeps only its kind's: ``kind_columns``)."""
        q = self.sharpness
        fq = feats**q if feats_q is None else feats_q
        theta = self.theta if columns is None else self.theta[columns]
        yq = np.maximum(fq @ theta**q, 1e-300)
        x = yq ** (-1.0 / q)
        if not band:
            return x
        covariance = self.covariance if columns is None else self.covariance[np.ix_(columns, columns)]
        var = np.einsum("ij,jk,ik->i", fq, covariance, fq)
        rel = np.sqrt(np.maximum(var, 0.0)) / yq / q
        total = C.BAND_Z * np.sqrt(rel**2 + self.relative_noise**2)
        return x, x / (1.0 + total), x / np.maximum(1.0 - total, 0.05)

    def predict(self, configs: pd.DataFrame, band: bool = True):
        """Throughput of a configuration table (of this model's kind of job), with its band."""
        check_kind(configs, self.allreduce, "configs.ps", "the model is")
        table = configs.copy()
        if "worker_gpu" not in table:
            table["worker_gpu"] = 0
        if "batch_size" not in table:
            table["batch_size"] = self.batch_size
        return self.predict_features(table_features(table, self.scaling), band=band)

    def features(self, config) -> np.ndarray:
        """The design row of one ``Configuration`` at this model's scaling, shape (1, 11)."""
        return features(config.workers, config.ps, config.worker_cpu, config.ps_cpu, config.worker_gpu,
                        config.batch_size, scaling=self.scaling)[None, :]

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "sharpness": self.sharpness,
            "covariance": self.covariance.tolist(),
            "relative_noise": self.relative_noise,
            "batch_size": self.batch_size,
            "identified": list(self.identified),
            "allreduce": self.allreduce,
            "scaling": list(self.scaling),
            "report": self.report.to_dict() if self.report else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ThroughputModel":
        """The model ``to_dict`` wrote; also one written before all-reduce jobs (9 parameters,
        a 9 × 9 covariance, no ``allreduce``): a PS job's, whose all-reduce terms are 0."""
        try:
            k = len(PARAMETERS)
            allreduce = bool(data.get("allreduce", False))
            params = {name: float(data["params"].get(name, 0.0) if name in ALLREDUCE_TERMS else data["params"][name])
                      for name in PARAMETERS}
            stored = np.asarray(data["covariance"], dtype=float)
            m = len(_LEGACY_PARAMETERS) if stored.size == len(_LEGACY_PARAMETERS) ** 2 else k
            covariance = np.zeros((k, k))
            covariance[:m, :m] = stored.reshape(m, m)
            report = FitReport(**data["report"]) if data.get("report") else None
            if report is not None:
                other = [name for name in PARAMETERS if name not in kind_parameters(allreduce)]
                report = replace(report, pinned=dict(report.pinned) | {
                    name: not_identifiable(allreduce) for name in other if name not in report.pinned})
            return cls(
                params=params,
                sharpness=float(data["sharpness"]),
                covariance=covariance,
                relative_noise=float(data["relative_noise"]),
                batch_size=int(data["batch_size"]),
                report=report,
                identified=tuple(data.get("identified", kind_parameters(allreduce))),
                allreduce=allreduce,
                scaling=_scaling(data.get("scaling", NO_SCALING)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InvalidInputError(
                "model.throughput", f"{type(err).__name__}: {err}",
                "a throughput model written by `dlrover-rm fit`",
            ) from None

    def describe(self) -> list[str]:
        """θ_k ± standard error (delta method from the covariance of φ = θ^q), one line each."""
        q, lines = self.sharpness, [f"{'sharpness q':15s} {self.sharpness:g}"]
        for j, name in enumerate(PARAMETERS):
            theta = self.params[name]
            sd_phi = float(np.sqrt(max(self.covariance[j, j], 0.0)))
            sd = sd_phi / (q * theta ** (q - 1)) if theta > 0 else 0.0
            pinned = self.report.pinned.get(name) if self.report else None
            note = f"  (pinned: {pinned})" if pinned else ""
            lines.append(f"{name:15s} {theta:.4e} ± {sd:.1e}{note}")
        a_w, a_p, throttle = self.scaling
        lines.append(f"{'core curve':15s} worker λw^{a_w:g}, PS λp^{a_p:g} from one core; "
                     f"throttle {throttle:g} below")
        return lines


def _most_common(values: np.ndarray) -> int:
    distinct, counts = np.unique(values, return_counts=True)
    return int(distinct[np.argmax(counts)])


def _recency_weights(table: pd.DataFrame, half_life: float) -> np.ndarray:
    """w_i = 0.5^(newer_i / half_life), newer_i = number of samples taken after sample i
    (by ``timestamp`` when present, else by row order)."""
    n = len(table)
    if "timestamp" in table:
        stamps = table["timestamp"]
        if not pd.api.types.is_numeric_dtype(stamps):
            stamps = pd.to_datetime(stamps, errors="coerce", utc=True).astype("int64")
        order = np.argsort(np.argsort(stamps.to_numpy(), kind="stable"), kind="stable")
    else:
        order = np.arange(n)
    return 0.5 ** (((n - 1) - order) / half_life)


def _select_identifiable(design: np.ndarray, candidates: list[int]) -> list[int]:
    """Greedily admit columns (in ``_IDENTIFY_ORDER``) that raise the rank of the design."""
    chosen: list[int] = []
    scale = np.linalg.norm(design, axis=0)
    for j in candidates:
        if scale[j] == 0:
            continue
        trial = design[:, chosen + [j]] / scale[chosen + [j]]
        s = np.linalg.svd(trial, compute_uv=False)
        if len(s) == trial.shape[1] and s[-1] > C.IDENTIFIABILITY_RCOND * s[0]:
            chosen.append(j)
    return chosen


def _why_pinned(name: str, table: pd.DataFrame) -> str:
    if name in ALLREDUCE_TERMS and (table["workers"] == 1).all():
        return "every sample has one worker: a ring of one exchanges nothing"
    if name in ("io", "allreduce_latency", "overhead") and is_allreduce(table) and table["batch_size"].nunique() == 1:
        return ("batch_size never varies, so the ring's latency, io and overhead cannot all be told apart "
                "(2(w−1)/(w·B) = (2/B)·1 − 2·1/(w·B))")
    if name == "gpu_compute" and not (table["worker_gpu"] > 0).any():
        return "no sample has a GPU worker"
    if name == "worker_compute" and (table["worker_gpu"] > 0).all():
        return "every sample has GPU workers"
    if name in ("ps_service", "network") and table["ps_cpu"].nunique() == 1:
        return "ps_cpu never varies, so PS cores and PS links cannot be told apart"
    if name == "contention" and table["workers"].nunique() == 1:
        return "workers never varies"
    return f"{len(np.unique(configuration_codes(table)))} configurations cannot identify every parameter"


@dataclass(frozen=True)
class _Problem:
    """The arrays every fit of one sample table shares (numpy only: folds slice it often)."""

    codes: np.ndarray  # configuration of each row
    raw: np.ndarray  # (w, p, λw, λp, g, B) of each row
    feats: np.ndarray  # their design rows at ``scaling``
    observed: np.ndarray
    weights: np.ndarray  # sqrt of the recency weights
    batch: int
    allreduce: bool
    scaling: tuple[float, float, float] = NO_SCALING

    @classmethod
    def of(cls, table: pd.DataFrame, half_life: float) -> "_Problem":
        gpu = table["worker_gpu"] if "worker_gpu" in table else 0
        raw = np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (
            table["workers"], table["ps"], table["worker_cpu"], table["ps_cpu"], gpu, table["batch_size"]))), axis=1)
        return cls(
            configuration_codes(table), raw, features(*raw.T), table["throughput"].to_numpy(dtype=float),
            np.sqrt(_recency_weights(table, half_life)), _most_common(table["batch_size"].to_numpy()),
            is_allreduce(table),
        )

    @property
    def n_configs(self) -> int:
        return len(np.unique(self.codes))

    def subset(self, rows: np.ndarray) -> "_Problem":
        return replace(self, codes=self.codes[rows], raw=self.raw[rows], feats=self.feats[rows],
                       observed=self.observed[rows], weights=self.weights[rows])

    def scaled(self, scaling: tuple[float, float, float]) -> "_Problem":
        """The same rows with the design at the core curve ``scaling``."""
        if scaling == self.scaling:
            return self
        return replace(self, feats=features(*self.raw.T, scaling=scaling), scaling=scaling)


def _solve(problem: _Problem, q: float, prior: ThroughputModel | None, prior_weight: float,
           band: bool = True) -> ThroughputModel:
    """One NNLS fit at sharpness q (no report); ``band`` False: no covariance (zeros), for a fit
    that only predicts the mean (a fold of the cross-validation)."""
    k = len(PARAMETERS)
    design = problem.feats**q * (problem.observed**q * problem.weights)[:, None]
    target = problem.weights
    phi = np.zeros(k)
    if prior is None:
        free = _select_identifiable(design, [PARAMETERS.index(n) for n in _IDENTIFY_ORDER])
    else:  # the prior anchors every direction; pin only what the samples never exercise
        free = [j for j in range(k) if np.any(design[:, j] > 0)]
        phi[:] = prior.theta**q
    fixed = [j for j in range(k) if j not in free]
    rows, rhs = design[:, free], target - design[:, fixed] @ phi[fixed]
    if prior is not None:
        # Ridge toward the prior in relative terms: changing φ_j by 10 % costs prior_weight × 0.01,
        # like a 10 % error on prior_weight sample rows. A term the prior did not have costs its
        # share of the measured step time instead.
        prior_phi = prior.theta**q
        share = design.mean(axis=0)
        penalty = np.where(prior_phi[free] > 0, 1.0 / np.where(prior_phi[free] > 0, prior_phi[free], 1.0), share[free])
        rows = np.vstack([rows, np.sqrt(prior_weight) * np.diag(penalty)])
        rhs = np.concatenate([rhs, np.sqrt(prior_weight) * (prior_phi[free] > 0)])
    n = len(target)
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    reweight = np.ones(len(rows))
    for _ in range(C.LOG_ERROR_ITERATIONS):
        solution, _ = nnls(rows * reweight[:, None] / scale, rhs * reweight, maxiter=50 * k)
        phi[free] = solution / scale
        ratio = np.maximum(design @ phi / target, 1e-9)  # (X / X̂)^q of each sample
        reweight[:n] = np.where(np.abs(ratio - 1) > 1e-12, np.log(ratio) / np.where(ratio == 1, 1, ratio - 1), 1.0)

    # Residuals are ≈ q × relative errors of X: noise and covariance of φ follow.
    residual = design @ phi - target
    active = [j for j in free if phi[j] > 0]
    dof = len(target) - len(active)
    if dof > 0:
        noise = float(np.sqrt(np.sum(residual**2) / dof / np.mean(target**2))) / q
    else:
        noise = C.DEFAULT_RELATIVE_NOISE
    noise = max(noise, C.MIN_RELATIVE_NOISE)
    covariance = np.zeros((k, k))
    if active and band:
        sub = rows[:, [free.index(j) for j in active]]
        covariance[np.ix_(active, active)] = (q * noise) ** 2 * np.linalg.pinv(sub.T @ sub)
    return ThroughputModel(
        params=dict(zip(PARAMETERS, map(float, phi ** (1.0 / q)))),
        sharpness=q,
        covariance=covariance,
        relative_noise=noise,
        batch_size=problem.batch,
        identified=tuple(PARAMETERS[j] for j in free),
        allreduce=problem.allreduce,
        scaling=problem.scaling,
    )


def _held_out_mape(problem: _Problem, folds: list[np.ndarray], q: float, prior, prior_weight) -> float | None:
    """Mean absolute percentage error on each fold, fitted on the others (None when the others
    cannot be fitted: fewer than 2 configurations without a prior, or none at all)."""
    errors = []
    for held in folds:
        rest = problem.subset(~held)
        if rest.n_configs < (1 if prior is not None else 2):
            return None
        model = _solve(rest, q, prior, prior_weight, band=False)
        predicted = model.predict_features(problem.feats[held], band=False)
        errors.append(np.abs(predicted - problem.observed[held]) / problem.observed[held])
    return float(np.mean(np.concatenate(errors)))


def _folds(codes: np.ndarray, count: int) -> list[np.ndarray]:
    """Masks of ``count`` folds grouping rows by configuration (round robin over configurations);
    ``count`` = None: one fold per configuration (leave one configuration out)."""
    n = codes.max() + 1
    if count is None or count >= n:
        return [codes == c for c in range(n)]
    return [np.isin(codes, np.arange(f, n, count)) for f in range(count)]


def _choose_sharpness(problem: _Problem, folds, default: float, prior_weight: float) -> tuple[float, dict | None]:
    """q of ``SHARPNESS_CANDIDATES`` with the least grouped-CV MAPE (``default`` when none can be
    scored), and the score of each."""
    scores = {c: _held_out_mape(problem, folds, c, None, prior_weight) for c in C.SHARPNESS_CANDIDATES}
    cv = {f"{c:g}": score for c, score in scores.items() if score is not None}
    if not cv:
        return default, None
    return min((score, c) for c, score in scores.items() if score is not None)[1], cv


def _choose_scaling(problem: _Problem, folds, q: float, prior_weight: float) -> tuple[_Problem, dict | None]:
    """The core curve (a_w, a_p, ℓ), one axis after the other (``SCALING_CANDIDATES`` for the
    exponents, ``THROTTLE_CANDIDATES`` for ℓ) in up to ``SCALING_ROUNDS`` rounds (coordinate
    descent: an axis chosen while another was still whole is chosen again), by the same grouped
    CV as q; the scores are the last round's. An exponent is tried
    only where its role's CPU takes ≥ ``SCALING_MIN_CPU_VALUES`` values of at least one core, ℓ
    where a role does below one core (else their effect and the terms constant in λ cannot be
    told apart); a value other than whole cores is kept only when it cuts the CV MAPE of whole
    cores by ``SCALING_CV_MARGIN`` (the simpler form wins a tie)."""
    scores: dict[str, float] = {}
    cpus = [np.unique(problem.raw[:, 2]), np.unique(problem.raw[:, 3])]
    axes = [("worker_cpu^", C.SCALING_CANDIDATES, (cpus[0] >= 1).sum() >= C.SCALING_MIN_CPU_VALUES),
            ("ps_cpu^", C.SCALING_CANDIDATES, (cpus[1] >= 1).sum() >= C.SCALING_MIN_CPU_VALUES),
            ("throttle ", C.THROTTLE_CANDIDATES, any(((c > 0) & (c < 1)).any() for c in cpus))]
    for _ in range(C.SCALING_ROUNDS):
        before = problem.scaling
        for axis, (label, candidates, identifiable) in enumerate(axes):
            if not identifiable:
                continue
            whole = NO_SCALING[axis]
            tried = {}
            for value in candidates:
                scaling = tuple(value if i == axis else problem.scaling[i] for i in range(3))
                score = _held_out_mape(problem.scaled(scaling), folds, q, None, prior_weight)
                if score is not None:
                    tried[value] = scores[f"{label}{value:g}"] = score
            if whole not in tried:
                continue
            best = min(tried, key=tried.get)
            keep = best if tried[best] <= (1.0 - C.SCALING_CV_MARGIN) * tried[whole] else whole
            problem = problem.scaled(tuple(keep if i == axis else problem.scaling[i] for i in range(3)))
        if problem.scaling == before:
            break
    return problem, scores or None


def _scaling(value: Any) -> tuple[float, float, float]:
    """A core curve, checked: exponents in (0, 1], a throttle in [0, 1)."""
    a_w, a_p, throttle = (float(v) for v in value)
    if not (0.0 < a_w <= 1.0 and 0.0 < a_p <= 1.0 and 0.0 <= throttle < 1.0):
        raise ValueError(f"scaling {value!r}: exponents in (0, 1] and a throttle in [0, 1)")
    return a_w, a_p, throttle


def fit_throughput(
    samples: pd.DataFrame,
    prior: ThroughputModel | None = None,
    *,
    sharpness: float | None = None,
    scaling: tuple[float, float, float] | None = None,
    half_life: float = C.RECENCY_HALF_LIFE_SAMPLES,
    prior_weight: float = C.WARM_START_PRIOR_WEIGHT,
    leave_one_out: bool | None = None,
    validated: bool = False,
) -> ThroughputModel:
    """Fit θ ≥ 0, q and the core curve to a sample table; see the module docstring.

    ``prior``: an earlier model of the same job (warm start; its q is kept). ``sharpness``: fix q
    instead of choosing it by grouped cross-validation; ``scaling`` the core curve likewise
    (:func:`effective_cores`; chosen only from ``SCALING_MIN_CONFIGURATIONS``). ``half_life``: recency weighting, in
    samples. The out-of-sample error (which also floors the band's noise) is measured leaving
    one configuration out when ``leave_one_out`` is True, or None and there are at most
    ``LOCO_MAX_CONFIGURATIONS`` configurations; else by grouped ``SHARPNESS_CV_FOLDS``-fold CV.
    ``validated``: ``samples`` is what :func:`validate_samples` returned (not checked again).
    """
    table = samples if validated else validate_samples(samples)
    problem = _Problem.of(table, half_life)
    if prior is not None:
        check_kind(prior, problem.allreduce, "prior", "the samples are")
    n_configs = problem.n_configs
    if n_configs < 2 and prior is None:
        raise InvalidInputError(
            "samples", f"{n_configs} configuration",
            "at least 2 distinct configurations (more to identify the model; "
            "`dlrover-rm probes` designs them), or a prior model",
        )
    folds = _folds(problem.codes, C.SHARPNESS_CV_FOLDS)
    cv: dict[str, float] | None = None
    scaling_cv: dict[str, float] | None = None
    if scaling is not None or prior is not None:
        problem = problem.scaled(_scaling(scaling) if scaling is not None else prior.scaling)
    choose_q = sharpness is None and prior is None
    if sharpness is not None:
        q = float(sharpness)
    elif prior is not None:
        q = prior.sharpness
    else:
        q = C.DEFAULT_SHARPNESS
        free = len(_select_identifiable(problem.feats, list(range(len(PARAMETERS)))))
        choose_q = n_configs >= free + 2
        if choose_q:
            q, cv = _choose_sharpness(problem, folds, q, prior_weight)
    if scaling is None and prior is None and n_configs >= C.SCALING_MIN_CONFIGURATIONS:
        problem, scaling_cv = _choose_scaling(problem, folds, q, prior_weight)
        if choose_q and problem.scaling != NO_SCALING:
            q, cv = _choose_sharpness(problem, folds, q, prior_weight)
    model = _solve(problem, q, prior, prior_weight)

    if leave_one_out or (leave_one_out is None and n_configs <= C.LOCO_MAX_CONFIGURATIONS):
        method = "leave-one-configuration-out"
        out_of_sample = _held_out_mape(problem, _folds(problem.codes, None), q, prior, prior_weight)
    else:
        method = f"{len(folds)}-fold by configuration"
        out_of_sample = cv[f"{q:g}"] if cv and f"{q:g}" in cv else _held_out_mape(problem, folds, q, prior, prior_weight)
    if out_of_sample is not None:
        model = replace(model, relative_noise=max(model.relative_noise, C.MAPE_TO_SIGMA * out_of_sample))
    pinned = {
        name: _why_pinned(name, table)
        + (f"; kept at the prior's {prior.params[name]:.3g}" if prior is not None else "; set to 0")
        for name in model.parameters
        if name not in model.identified
    } | {name: not_identifiable(model.allreduce) for name in PARAMETERS if name not in model.parameters}
    predicted = model.predict_features(problem.feats, band=False)
    report = FitReport(
        n_samples=len(table),
        n_configurations=n_configs,
        in_sample_mape=float(np.mean(np.abs(predicted - problem.observed) / problem.observed)),
        out_of_sample_mape=out_of_sample,
        out_of_sample_method=method,
        relative_noise=model.relative_noise,
        pinned=pinned,
        warm_start=prior is not None,
        sharpness_cv_mape=cv,
        scaling_cv_mape=scaling_cv,
        largest_node_cpu=_largest_node_cpu(table, prior),
        probed_range=_probed_range(table, prior),
    )
    return replace(model, report=report)


#: The columns of a configuration whose range a fit reports (``FitReport.probed_range``).
RANGE_COLUMNS = ("workers", "ps", "worker_cpu", "ps_cpu")


def _probed_range(table: pd.DataFrame, prior: ThroughputModel | None) -> dict[str, list[float]]:
    known = prior.report.probed_range if prior is not None and prior.report is not None else None
    out = {}
    for name in RANGE_COLUMNS:
        values = table[name].to_numpy()  # validated: finite
        low, high = float(values.min()), float(values.max())
        if known and name in known:
            low, high = min(low, known[name][0]), max(high, known[name][1])
        out[name] = [low, high]
    return out


def _largest_node_cpu(table: pd.DataFrame, prior: ThroughputModel | None) -> dict[str, float]:
    largest = {name: float(table[name].to_numpy().max()) for name in ("worker_cpu", "ps_cpu")}  # validated: finite
    known = prior.report.largest_node_cpu if prior is not None and prior.report is not None else None
    return {name: max(value, (known or {}).get(name, 0.0)) for name, value in largest.items()}
