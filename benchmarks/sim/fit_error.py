"""How well the product's throughput model fits each truth family, as the product would see it.

For a truth and a quota, the model (``fit_throughput``, the throughput half of ``fit_job_model``)
is fitted on

* ``probes``: the cold probes ``design_probes(quota, batch_size=BATCH, allreduce=...)``, each
  measured as the cluster measures a probe — one window of the truth's throughput times the
  segment's rate noise (``SimConfig.rate_noise``) and the window's noise (``window_noise``);
  ``probes_exact``: the same probes without noise (what is left is the form's extrapolation);
* ``dense``: ``dense`` configurations of the planner's range within the quota, noise-free: the
  best the model's *form* can do on that truth (its form error),

and scored by the mean absolute percentage error on ``held_out`` other configurations of the
planner's range within the quota (``policies.planner_configurations(quota.cpu, allreduce)``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer.model import ThroughputModel, fit_throughput
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Quota
from sim.policies import planner_configurations
from sim.truth import BATCH, AllReduce, QueueingTable, Truth, measured_roofline
from sim.workload import SimConfig, _allreduce_truth, _moving_shard_truth, _roofline_truth

_NOISE_FREE = replace(SimConfig(), rate_noise=0.0, window_noise=0.0)
QUOTA = Quota(cpu=128.0, memory_mb=1024.0 * 1024)
COLUMNS = ["workers", "ps", "worker_cpu", "ps_cpu"]


@dataclass(frozen=True)
class FitError:
    probes: float  # held-out MAPE of the model fitted on the noisy cold probes
    probes_exact: float  # ... on the same probes without noise
    dense: float  # held-out MAPE of the model fitted on the dense noise-free grid (the form error)


def is_allreduce(truth: Truth) -> bool:
    return isinstance(truth, AllReduce)


def grid_configs(quota: Quota, allreduce: bool, count: int, seed: int, skip: int = 0) -> pd.DataFrame:
    """``count`` configurations of the planner's range within ``quota`` (a seeded random draw;
    ``skip`` the draw's first ones, so that two calls with the same seed are disjoint)."""
    grid = planner_configurations(quota.cpu, allreduce)
    pick = np.random.default_rng(seed).permutation(len(grid))[skip: skip + count]
    return pd.DataFrame({"workers": grid.workers[pick], "ps": grid.ps[pick], "worker_cpu": grid.worker_cpu[pick],
                         "ps_cpu": grid.ps_cpu[pick], "worker_gpu": 0, "batch_size": BATCH})


def true_throughput(truth: Truth, configs: pd.DataFrame) -> np.ndarray:
    return np.asarray(truth.throughput(*(configs[c].to_numpy(float) for c in COLUMNS)), dtype=float)


def probe_samples(truth: Truth, quota: Quota, seed: int, config: SimConfig = SimConfig()) -> pd.DataFrame:
    """The cold probes, one noisy window each, as the cluster measures them."""
    probes = design_probes(quota, batch_size=BATCH, allreduce=is_allreduce(truth)).reset_index(drop=True)
    rng = np.random.default_rng(seed)
    x = true_throughput(truth, probes) * rng.lognormal(0.0, config.rate_noise, len(probes))
    return probes.assign(throughput=x * rng.lognormal(0.0, config.window_noise, len(probes)))


def mape(model: ThroughputModel, truth: Truth, configs: pd.DataFrame) -> float:
    x = true_throughput(truth, configs)
    predicted, _, _ = model.predict(configs)
    return float(np.mean(np.abs(predicted - x) / x))


def dense_model(truth: Truth, quota: Quota = QUOTA, dense: int = 300, seed: int = 0) -> ThroughputModel:
    configs = grid_configs(quota, is_allreduce(truth), dense, seed)
    return fit_throughput(configs.assign(throughput=true_throughput(truth, configs)), leave_one_out=False)


@dataclass(frozen=True)
class ModelTruth(Truth):
    """A truth that *is* a fitted model's formula (its ``predict`` without the band): a family
    inside the model's span, against which the form errors of the others are read."""

    model: ThroughputModel = None  # type: ignore[assignment]
    scale: float = 1.0
    family: str = "model"

    def throughput(self, w, p, lw, lp):
        w, p, lw, lp = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (w, p, lw, lp)))
        configs = pd.DataFrame({"workers": w.ravel(), "ps": p.ravel(), "worker_cpu": lw.ravel(), "ps_cpu": lp.ravel(),
                                "worker_gpu": 0, "batch_size": BATCH})
        return self.scale * self.model.predict(configs, band=False).reshape(w.shape)

    def cpu_used(self, w, p, lw, lp):
        w, p, lw, lp = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (w, p, lw, lp)))
        return 0.5 * lw, 0.5 * lp


def own_formula(truth: Truth, quota: Quota = QUOTA, dense: int = 300, seed: int = 0) -> ModelTruth:
    """The model's formula with the parameters it fits to ``truth`` on the dense grid."""
    return ModelTruth(dense_model(truth, quota, dense, seed))


def fit_error(truth: Truth, quota: Quota = QUOTA, *, dense: int = 300, held_out: int = 300,
              seed: int = 0) -> FitError:
    allreduce = is_allreduce(truth)
    n = len(planner_configurations(quota.cpu, allreduce))
    if dense + held_out > n:  # a small grid (an all-reduce job's, a small quota): split it in proportion
        dense = n * dense // (dense + held_out)
        held_out = n - dense
    test = grid_configs(quota, allreduce, held_out, seed, skip=dense)
    noisy = fit_throughput(probe_samples(truth, quota, seed), leave_one_out=False)
    exact = fit_throughput(probe_samples(truth, quota, seed, _NOISE_FREE), leave_one_out=False)
    return FitError(probes=mape(noisy, truth, test), probes_exact=mape(exact, truth, test),
                    dense=mape(dense_model(truth, quota, dense, seed), truth, test))


def families(draws: int = 8, seed: int = 0) -> dict[str, list[Truth]]:
    """Every truth family; the random ones ``draws`` times (the trace's own draws)."""
    rng = np.random.default_rng([seed, 17])
    return {
        "queueing:default": [QueueingTable("default")],
        "queueing:hot_shard": [QueueingTable("hot_shard")],
        "queueing:net_bound": [QueueingTable("net_bound")],
        "measured": [measured_roofline()[0]],
        "roofline": [_roofline_truth(rng) for _ in range(draws)],
        "allreduce": [_allreduce_truth(rng) for _ in range(draws)],
        "moving_shard": [_moving_shard_truth(rng) for _ in range(draws)],
    }


def fit_error_table(quota: Quota = QUOTA, *, draws: int = 8, dense: int = 300, held_out: int = 300,
                    seed: int = 0) -> pd.DataFrame:
    """family × (median, max over the family's draws) of the MAPE from probes and from the dense grid."""
    rows = []
    for name, truths in families(draws, seed).items():
        errors = [fit_error(truth, quota, dense=dense, held_out=held_out, seed=seed + i)
                  for i, truth in enumerate(truths)]
        probes, form = np.array([e.probes for e in errors]), np.array([e.dense for e in errors])
        exact = np.array([e.probes_exact for e in errors])
        rows.append(dict(family=name, draws=len(truths), probes_median=np.median(probes), probes_max=probes.max(),
                         exact_median=np.median(exact),
                         dense_median=np.median(form), dense_min=form.min(), dense_max=form.max()))
    return pd.DataFrame(rows)
