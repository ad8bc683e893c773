"""Throughput model of parameter-server DLRM training, fitted by non-negative least squares.

Each worker runs steps of ``B`` samples. After the structure of the DLRover-RM paper (§4: the step
time is a sum of worker compute, PS service and communication terms), the time of one step is

    t_step = θ_overhead                          fixed per-step cost (RPC round trips, Python)
           + θ_worker_compute · B / λw           dense forward/backward on λw CPU cores
           + θ_gpu_compute    · B / g            ... or on g GPUs (replaces the CPU term)
           + θ_ps_service     · w · B / (p·λp)   lookups + sparse updates: the rows of all w
                                                 workers spread over p PS with λp cores each
           + θ_network        · w · B / p        the same rows through the p PS network links
           + θ_contention     · w² / p           synchronisation/queueing that grows with the
                                                 clients per PS (w/p) times the contenders (w)
           + θ_io             · w · B            a job-wide cap no allocation moves (the shared
                                                 data source, the master's shard service)

and the job throughput is X = w·B / t_step. Its reciprocal is *linear* in θ ≥ 0:

    1/X = θ_overhead/(w·B) + θ_worker_compute/(w·λw) + θ_gpu_compute/(w·g)
        + θ_ps_service/(p·λp) + θ_network/p + θ_contention·w/(p·B) + θ_io

so the fit is an NNLS problem (``scipy.optimize.nnls``). Each term is a bound: X ≤ w·λw/θ_worker
(worker cores), X ≤ p·λp/θ_ps (PS cores), X ≤ p/θ_network (links), X ≤ 1/θ_io (a plateau that
more resources cannot lift: what keeps the fine-tune policy still on a flat curve), and the
contention term makes
throughput *fall* past w* = sqrt(p·(θ_overhead + θ_worker_compute·B/λw)/θ_contention).

Rows are weighted by the measured throughput so that residuals are relative errors
(X_obs·f·θ − 1 ≈ relative error of the prediction); recent rows weigh more. Parameters the samples
cannot identify (e.g. ``gpu_compute`` with no GPU sample, or ``ps_service`` against ``network``
when λp never varies) are pinned — to the prior when there is one, else to 0 — and listed in the
report. A prior (yesterday's model of the same job) enters as pseudo-observations of its own
predictions on a fixed anchor set of configurations (weight: ``WARM_START_PRIOR_WEIGHT`` rows).
Predictions carry a band from the parameter covariance plus the residual noise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import (
    InvalidInputError,
    configuration_key,
    validate_samples,
)

PARAMETERS = ("overhead", "worker_compute", "gpu_compute", "ps_service", "network", "contention", "io")

#: Order in which parameters are admitted when the samples identify only some of them: the
#: simplest explanation first (cores on each side), refinements last.
_IDENTIFY_ORDER = ("ps_service", "worker_compute", "gpu_compute", "overhead", "network", "contention", "io")


def features(
    workers: Any, ps: Any, worker_cpu: Any, ps_cpu: Any, worker_gpu: Any, batch_size: Any
) -> np.ndarray:
    """The design row f(x) of each configuration, so that 1/X = f(x)·θ. Shape (n, 7)."""
    w = np.asarray(workers, dtype=float)
    p = np.asarray(ps, dtype=float)
    lw = np.asarray(worker_cpu, dtype=float)
    lp = np.asarray(ps_cpu, dtype=float)
    g = np.asarray(worker_gpu, dtype=float)
    b = np.asarray(batch_size, dtype=float)
    w, p, lw, lp, g, b = np.broadcast_arrays(w, p, lw, lp, g, b)
    on_gpu = g > 0
    return np.stack(
        [
            1.0 / (w * b),
            np.where(on_gpu, 0.0, 1.0 / (w * lw)),
            np.where(on_gpu, 1.0 / (w * np.maximum(g, 1.0)), 0.0),
            1.0 / (p * lp),
            1.0 / p,
            w / (p * b),
            np.ones_like(w),
        ],
        axis=-1,
    )


def table_features(table: pd.DataFrame) -> np.ndarray:
    gpu = table["worker_gpu"] if "worker_gpu" in table else 0
    return features(
        table["workers"], table["ps"], table["worker_cpu"], table["ps_cpu"], gpu, table["batch_size"]
    )


@dataclass(frozen=True)
class FitReport:
    """What a fit says about itself: errors, what was pinned and why."""

    n_samples: int
    n_configurations: int
    in_sample_mape: float
    loco_mape: float | None
    relative_noise: float
    pinned: dict[str, str]
    warm_start: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ThroughputModel:
    """Fitted θ (see the module docstring), their covariance and the relative noise."""

    params: dict[str, float]
    covariance: np.ndarray
    relative_noise: float
    batch_size: int
    report: FitReport | None = None
    identified: tuple[str, ...] = field(default=PARAMETERS)

    @property
    def theta(self) -> np.ndarray:
        return np.array([self.params[name] for name in PARAMETERS])

    def reciprocal(self, feats: np.ndarray) -> np.ndarray:
        return feats @ self.theta

    def predict_features(self, feats: np.ndarray, band: bool = True):
        """Throughput and its (lower, upper) band from design rows."""
        y = np.maximum(feats @ self.theta, 1e-300)
        x = 1.0 / y
        if not band:
            return x
        var = np.einsum("ij,jk,ik->i", feats, self.covariance, feats)
        rel = np.sqrt(np.maximum(var, 0.0)) / y
        total = C.BAND_Z * np.sqrt(rel**2 + self.relative_noise**2)
        return x, x / (1.0 + total), x / np.maximum(1.0 - total, 0.05)

    def predict(self, configs: pd.DataFrame, band: bool = True):
        table = configs.copy()
        if "worker_gpu" not in table:
            table["worker_gpu"] = 0
        if "batch_size" not in table:
            table["batch_size"] = self.batch_size
        return self.predict_features(table_features(table), band=band)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "covariance": self.covariance.tolist(),
            "relative_noise": self.relative_noise,
            "batch_size": self.batch_size,
            "identified": list(self.identified),
            "report": self.report.to_dict() if self.report else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ThroughputModel":
        try:
            params = {name: float(data["params"][name]) for name in PARAMETERS}
            cov = np.asarray(data["covariance"], dtype=float).reshape(len(PARAMETERS), len(PARAMETERS))
            report = FitReport(**data["report"]) if data.get("report") else None
            return cls(
                params=params,
                covariance=cov,
                relative_noise=float(data["relative_noise"]),
                batch_size=int(data["batch_size"]),
                report=report,
                identified=tuple(data.get("identified", PARAMETERS)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidInputError(
                "model.throughput", f"{type(err).__name__}: {err}",
                "a throughput model written by `dlrover-rm fit`",
            ) from None

    def describe(self) -> list[str]:
        lines = []
        for name in PARAMETERS:
            j = PARAMETERS.index(name)
            sd = float(np.sqrt(max(self.covariance[j, j], 0.0)))
            pinned = self.report.pinned.get(name) if self.report else None
            note = f"  (pinned: {pinned})" if pinned else ""
            lines.append(f"{name:15s} {self.params[name]:.4e} ± {sd:.1e}{note}")
        return lines


@lru_cache(maxsize=8)
def _anchor_features(batch_size: int, with_gpu: bool) -> np.ndarray:
    """A fixed, diverse set of configurations on which a prior speaks (warm start)."""
    gpus = (0, 1) if with_gpu else (0,)
    rows = list(itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (0.5, 1, 2, 4, 8), (0.5, 1, 2, 4, 8), gpus))
    arr = np.array(rows, dtype=float)
    return features(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], batch_size)


def _recency_weights(table: pd.DataFrame, half_life: float) -> np.ndarray:
    """w_i = 0.5^(newer_i / half_life), newer_i = number of samples taken after sample i
    (by ``timestamp`` when present, else by row order)."""
    n = len(table)
    if "timestamp" in table:
        stamps = pd.to_numeric(table["timestamp"], errors="coerce").fillna(0).to_numpy()
        order = np.argsort(np.argsort(stamps, kind="stable"), kind="stable")
    else:
        order = np.arange(n)
    newer = (n - 1) - order
    return 0.5 ** (newer / half_life)


def _select_identifiable(design: np.ndarray, candidates: list[int]) -> list[int]:
    """Greedily admit columns (in ``_IDENTIFY_ORDER``) that raise the rank of the design."""
    chosen: list[int] = []
    scale = np.linalg.norm(design, axis=0)
    for j in candidates:
        if scale[j] == 0:
            continue
        trial = design[:, chosen + [j]] / scale[chosen + [j]]
        s = np.linalg.svd(trial, compute_uv=False)
        if s[-1] > C.IDENTIFIABILITY_RCOND * s[0]:
            chosen.append(j)
    return chosen


def _why_pinned(name: str, table: pd.DataFrame) -> str:
    has_gpu = (table["worker_gpu"] > 0).any()
    if name == "gpu_compute" and not has_gpu:
        return "no sample has a GPU worker"
    if name == "worker_compute" and (table["worker_gpu"] > 0).all():
        return "every sample has GPU workers"
    if name in ("ps_service", "network") and table["ps_cpu"].nunique() == 1:
        return "ps_cpu never varies, so PS cores and PS links cannot be told apart"
    if name == "contention" and table["workers"].nunique() == 1:
        return "workers never varies"
    return "the samples do not vary enough to identify it"


def fit_throughput(
    samples: pd.DataFrame,
    prior: ThroughputModel | None = None,
    *,
    half_life: float = C.RECENCY_HALF_LIFE_SAMPLES,
    prior_weight: float = C.WARM_START_PRIOR_WEIGHT,
    leave_one_out: bool = True,
) -> ThroughputModel:
    """Fit θ ≥ 0 to a sample table (NNLS on relative errors of 1/X); see the module docstring.

    ``prior``: an earlier model of the same job (warm start). ``half_life``: recency weighting.
    ``leave_one_out``: also compute the leave-one-configuration-out MAPE (costs one refit per
    configuration).
    """
    table = validate_samples(samples)
    keys = configuration_key(table)
    n_configs = keys.nunique()
    if n_configs < 2 and prior is None:
        raise InvalidInputError(
            "samples", f"{n_configs} configuration",
            "at least 2 distinct configurations (4 or more to identify the model; "
            "`dlrover-rm probes` designs them), or a prior model",
        )
    feats = table_features(table)
    observed = table["throughput"].to_numpy(dtype=float)
    weights = np.sqrt(_recency_weights(table, half_life))
    design = feats * (observed * weights)[:, None]
    target = weights.copy()

    k = len(PARAMETERS)
    theta = np.zeros(k)
    pinned: dict[str, str] = {}
    if prior is None:
        free = _select_identifiable(design, [PARAMETERS.index(n) for n in _IDENTIFY_ORDER])
    else:
        # The prior anchors every direction; pin only what the real samples never exercise.
        free = [j for j in range(k) if np.any(design[:, j] > 0)]
        theta[:] = prior.theta
    for j in range(k):
        if j not in free:
            name = PARAMETERS[j]
            pinned[name] = _why_pinned(name, table) + (
                f"; kept at the prior's {theta[j]:.3g}" if prior is not None else "; set to 0"
            )
    fixed = [j for j in range(k) if j not in free]
    batch = int(table["batch_size"].mode().iloc[0])
    rows, rhs = design[:, free], target - design[:, fixed] @ theta[fixed]
    if prior is not None:
        anchors = _anchor_features(batch, bool((table["worker_gpu"] > 0).any()))
        anchor_weight = np.sqrt(prior_weight / len(anchors))
        anchor_rows = anchors * (prior.predict_features(anchors, band=False) * anchor_weight)[:, None]
        rows = np.vstack([rows, anchor_rows[:, free]])
        rhs = np.concatenate([rhs, anchor_weight - anchor_rows[:, fixed] @ theta[fixed]])
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale, rhs, maxiter=50 * k)
    theta[free] = solution / scale

    # Relative residuals of the real samples (weighted), noise and covariance.
    residual = design @ theta - target
    active = [j for j in free if theta[j] > 0]
    dof = len(table) - len(active)
    if dof > 0:
        noise = float(np.sqrt(np.sum(residual**2) / dof / np.mean(weights**2)))
    else:
        noise = C.DEFAULT_RELATIVE_NOISE
    noise = max(noise, C.MIN_RELATIVE_NOISE)
    covariance = np.zeros((k, k))
    if active:
        sub = rows[:, [free.index(j) for j in active]]
        covariance[np.ix_(active, active)] = noise**2 * np.linalg.pinv(sub.T @ sub)

    model = ThroughputModel(
        params=dict(zip(PARAMETERS, map(float, theta))),
        covariance=covariance,
        relative_noise=noise,
        batch_size=batch,
        identified=tuple(PARAMETERS[j] for j in free),
    )
    predicted = model.predict_features(feats, band=False)
    in_sample = float(np.mean(np.abs(predicted - observed) / observed))
    loco = _loco_mape(table, keys, prior, half_life, prior_weight) if leave_one_out else None
    report = FitReport(
        n_samples=len(table),
        n_configurations=int(n_configs),
        in_sample_mape=in_sample,
        loco_mape=loco,
        relative_noise=noise,
        pinned=pinned,
        warm_start=prior is not None,
    )
    return ThroughputModel(model.params, covariance, noise, batch, report, model.identified)


def _loco_mape(table, keys, prior, half_life, prior_weight) -> float | None:
    """Leave-one-configuration-out MAPE: refit without each configuration, predict it."""
    errors = []
    for key in keys.unique():
        held = (keys == key).to_numpy()
        rest = table[~held]
        if configuration_key(rest).nunique() < 2 and prior is None:
            return None
        model = fit_throughput(rest, prior, half_life=half_life, prior_weight=prior_weight, leave_one_out=False)
        predicted = model.predict_features(table_features(table[held]), band=False)
        observed = table.loc[held, "throughput"].to_numpy(dtype=float)
        errors.append(np.mean(np.abs(predicted - observed) / observed))
    return float(np.mean(errors))
