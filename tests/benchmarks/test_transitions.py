"""The transition benchmark's measure (benchmarks/runtime.py): an equivalent pause, ``W − S / r``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from runtime import TAIL_S, TRANSITIONS, equivalent_pause_s

pytestmark = pytest.mark.unit


def series(rate_of, end_s: float = 80.0, step_s: float = 0.2) -> pd.DataFrame:
    """The master's ``samples_done`` every ``step_s`` for a job training at ``rate_of(t)``."""
    t = np.arange(0.0, end_s, step_s)
    return pd.DataFrame({"time_s": t, "samples_done": np.concatenate([[0.0], np.cumsum(rate_of(t[:-1]) * step_s)])})


def test_a_stop_of_three_seconds_costs_three_seconds():
    stopped = series(lambda t: np.where((t >= 20.0) & (t < 23.0), 0.0, 1000.0))
    assert equivalent_pause_s(stopped, 20.0, 10.0) == pytest.approx(3.0, abs=0.05)


def test_a_faster_configuration_is_charged_against_its_own_rate():
    """Workers joined at 20 s: 1 s of nothing, then twice the rate: 1 s lost against the new rate."""
    joined = series(lambda t: np.where(t < 20.0, 1000.0, np.where(t < 21.0, 0.0, 2000.0)))
    assert equivalent_pause_s(joined, 20.0, 10.0) == pytest.approx(1.0, abs=0.05)


def test_work_rolled_back_to_a_checkpoint_is_not_in_the_cost():
    frame = series(lambda t: np.where((t >= 30.0) & (t < 32.0), 0.0, 1000.0))
    frame.loc[frame.time_s >= 31.0, "samples_done"] -= 5000.0  # the restore: 5 s of work lost, charged apart
    assert equivalent_pause_s(frame, 30.0, 10.0) == pytest.approx(2.0, abs=0.05)


def test_no_measurement_window_overlaps_the_next_transition():
    for (_, at, window, _), (_, following, _, _) in zip(TRANSITIONS, TRANSITIONS[1:]):
        assert at + window + TAIL_S <= following
