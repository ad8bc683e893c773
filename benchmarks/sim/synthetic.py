"""Samples drawn from the model's own family, with known θ: what the tests recover and the benchmarks plan on."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer.model import PARAMETERS, features

TRUE_THETA = dict(overhead=0.02, worker_compute=4e-4, gpu_compute=0.0, ps_latency=3e-5, ps_service=1.5e-4, ps_request=2e-3, network=2e-5, contention=1e-5, io=5e-6,
                  allreduce=0.0, allreduce_latency=0.0)
#: An all-reduce job (ps = 0): no PS terms; a ring all-reduce of the dense gradients instead.
ALLREDUCE_THETA = dict(TRUE_THETA, ps_latency=0.0, ps_service=0.0, ps_request=0.0, network=0.0, contention=0.0,
                       allreduce=0.05, allreduce_latency=2e-3, io=2e-6)

#: A design that exercises every CPU parameter.
DIVERSE_CONFIGS = [
    (1, 1, 1, 1), (2, 1, 1, 1), (4, 2, 2, 1), (8, 2, 1, 2), (2, 2, 4, 4),
    (8, 4, 2, 1), (4, 1, 2, 4), (16, 4, 1, 1), (16, 2, 2, 4), (1, 2, 4, 0.5),
    (3, 3, 2, 0.5), (6, 2, 4, 2),
]
#: All-reduce configurations (w, 0, λw, 0) that exercise every all-reduce parameter.
ALLREDUCE_CONFIGS = [(w, 0, lw, 0.0) for w, lw in ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 4), (2, 2), (4, 4),
                                                   (8, 0.5), (16, 2), (3, 2), (6, 0.5))]


def theta_vector(theta: dict) -> np.ndarray:
    return np.array([theta[name] for name in PARAMETERS])


def model_samples(theta=TRUE_THETA, configs=DIVERSE_CONFIGS, *, noise=0.0, windows=1, seed=0, batch=512, gpu=0,
                  ps_table_mb=8000.0, ps_base_mb=400.0, worker_base_mb=900.0, activation_mb=0.5):
    rng = np.random.default_rng(seed)
    rows = []
    for (w, p, lw, lp), _ in itertools.product(configs, range(windows)):
        x = 1.0 / float(features(w, p, lw, lp, gpu, batch) @ theta_vector(theta))
        x *= 1.0 + noise * rng.standard_normal()
        rows.append(dict(
            workers=w, ps=p, worker_cpu=lw, ps_cpu=lp, worker_memory_mb=4096, ps_memory_mb=4096 if p else 0.0,
            worker_gpu=gpu, batch_size=batch, throughput=x,
            worker_cpu_used=0.8 * lw, ps_cpu_used=0.6 * lp if p else np.nan,
            worker_memory_used_mb=worker_base_mb + activation_mb * batch,
            ps_memory_used_mb=ps_base_mb + ps_table_mb / p if p else np.nan,
        ))
    return pd.DataFrame(rows)


def true_throughput(configs: pd.DataFrame, theta=TRUE_THETA) -> np.ndarray:
    f = features(configs["workers"], configs["ps"], configs["worker_cpu"], configs["ps_cpu"],
                 configs.get("worker_gpu", 0), configs.get("batch_size", 512))
    return 1.0 / (f @ theta_vector(theta))
