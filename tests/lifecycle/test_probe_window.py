"""A probe window ends as soon as its rate is tight enough (sequential stopping), not after a
fixed time: steady reports end it early, noisy ones run it to its length, and the row it returns
is the whole window's rate either way."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest

import airflow_dlrover.lifecycle.profiling as profiling
from airflow_dlrover.launchers.base import statuses
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.probes import window_settled
from airflow_dlrover.optimizer.types import Configuration, Quota

pytestmark = pytest.mark.unit

CONFIG = Configuration(2, 1, 1.0, 1.0, 2048.0, 2048.0, 0, 512)


def test_the_rule_needs_enough_intervals_and_a_tight_mean():
    assert not window_settled([], 0.03)
    assert not window_settled([100.0, 100.0], 0.03)  # fewer than PROBE_MIN_INTERVALS
    assert window_settled([100.0] * C.PROBE_MIN_INTERVALS, 0.03)
    assert not window_settled([100.0] * 10, 0.0)  # 0: never early
    steady, noisy = [100, 101, 99, 100, 102], [60, 140, 90, 130, 70]
    assert window_settled(steady, 0.03) and not window_settled(noisy, 0.03)
    # t·s/√n against the half-width: 3 intervals of ±2 % are not enough for ±1 %, 12 are
    wobble = [98.0, 102.0, 100.0]
    assert not window_settled(wobble, 0.01) and window_settled(wobble * 4, 0.02)


class ReportingJob:
    """A launcher over a running job of two workers that report every ``every_s`` seconds at
    ``rate`` samples/s each, times a lognormal factor of ``noise`` per report."""

    def __init__(self, rate: float, noise: float, every_s: float = 0.1, seed: int = 0):
        self.rate, self.noise, self.every_s = rate, noise, every_s
        self.rng = np.random.default_rng(seed)
        self.started = time.time()
        self.reports = {w: (0.0, self.started) for w in ("worker-0", "worker-1")}
        nodes = {n: {"name": n, "role": r, "index": 0, "state": "running", "cpu": 1.0, "memory_mb": 2048.0,
                     "restarts": 0, "started": self.started}
                 for n, r in (("ps-0", "ps"), ("worker-0", "worker"), ("worker-1", "worker"))}
        self.record = {"config": CONFIG.to_row(), "nodes": nodes, "events": []}

    def _advance(self) -> None:
        now = time.time()
        for w, (samples, at) in self.reports.items():
            while at + self.every_s <= now:
                at += self.every_s
                samples += self.rate * self.every_s * self.rng.lognormal(0.0, self.noise)
            self.reports[w] = (samples, at)

    def read_job(self, job_id):
        return copy.deepcopy(self.record)

    def status(self, job_id):
        return statuses(self.read_job(job_id))

    def progress(self, job_id, timeout=0.0):
        if time.time() - self.started > 30:
            raise RuntimeError("the probe window never ended")
        self._advance()
        return {"state": "training", "samples_done": sum(s for s, _ in self.reports.values()), "samples_total": 1e9}

    def metrics(self, job_id):
        status = self.progress(job_id)
        now = time.time()
        usage = {n: {"role": node["role"], "cpu": 1.0, "cpu_seconds": 0.8 * (now - self.started),
                     "memory_mb": 900.0, "memory_limit_mb": 2048.0} for n, node in self.record["nodes"].items()}
        return {"status": status, "usage_time": time.monotonic(), "usage": usage,
                "nodes": {w: {"samples": s, "reported_at": at} for w, (s, at) in self.reports.items()}}

    def trainer(self, job_id):
        return None

    def reporters(self, job_id, record):
        return ["worker-0", "worker-1"]


@pytest.fixture
def fast_polls(monkeypatch):
    monkeypatch.setattr(profiling.T, "SUPERVISOR_POLL_S", 0.02)
    monkeypatch.setattr(profiling.C, "PROBE_REPORT_AFTER_S", 0.05)


def _measure(job, halfwidth, window_s=3.0):
    started = time.monotonic()
    row = profiling.measure_probe(job, "job", CONFIG, window_s, Quota(cpu=8, memory_mb=16384), halfwidth)
    return row, time.monotonic() - started


def test_a_steady_window_ends_early_and_a_noisy_one_runs_its_length(fast_polls):
    steady, steady_s = _measure(ReportingJob(rate=5000.0, noise=0.01), C.PROBE_STOP_HALFWIDTH)
    noisy, noisy_s = _measure(ReportingJob(rate=5000.0, noise=0.8), C.PROBE_STOP_HALFWIDTH)
    fixed, fixed_s = _measure(ReportingJob(rate=5000.0, noise=0.01), 0.0)
    assert steady_s < 1.5 < 3.0 <= noisy_s and fixed_s >= 3.0
    for row in (steady, fixed):  # the whole window's rate: two workers at 5,000 samples/s
        assert row["throughput"] == pytest.approx(10_000.0, rel=0.05)
    assert noisy["throughput"] > 0
