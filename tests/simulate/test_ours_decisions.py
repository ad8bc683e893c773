"""The ``ours`` policy's decisions on a fixed trace equal the recorded ones: a speed-up of the
controller (``optimizer.controller.step`` and what it calls) must change no decision.

The record, ``data/ours_decisions.csv``, holds each job's outcome (``sim.run.job_table``): final
configuration, resizes, failures, JCT, status and the allocated core- and GB-hours, which move
with any change of a decision or of its timing. Regenerate it, after a change that is meant to
change decisions (the simulator's costs, a tuning constant), from the repository root with

    PYTHONPATH=.:benchmarks python tests/simulate/test_ours_decisions.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.run import run_policy
from sim.workload import SimConfig

pytestmark = pytest.mark.unit

#: The trace: a few days (the later ones warm-start from the earlier runs), some all-reduce families.
TRACE = SimConfig(jobs=30, days=3, seed=7, allreduce_fraction=0.2)
RECORD = Path(__file__).parent / "data" / "ours_decisions.csv"
COLUMNS = ("job", "family", "day", "status", "jct_s", "run_s", "profile_s", "workers", "ps", "worker_cpu", "ps_cpu",
           "worker_memory_mb", "ps_memory_mb", "resizes", "deferred", "refused", "failures", "ooms",
           "wasted_samples", "trained_samples", "cpu_alloc_core_h", "mem_alloc_gb_h")


def decisions() -> pd.DataFrame:
    """The ``ours`` policy's per-job outcome on :data:`TRACE` (the record's columns)."""
    return run_policy(TRACE, "ours").jobs.loc[:, list(COLUMNS)].reset_index(drop=True)


def test_ours_decides_as_recorded():
    recorded = pd.read_csv(RECORD, float_precision="round_trip")
    pd.testing.assert_frame_equal(decisions(), recorded, check_dtype=False, check_exact=True)


if __name__ == "__main__":
    RECORD.parent.mkdir(exist_ok=True)
    decisions().to_csv(RECORD, index=False)
    print(f"wrote {RECORD}")
