"""Epochs, the optimisers' settings and a job that starts from an export: the spec's arithmetic,
the master's order, the checks a launch makes (pure: no process)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from airflow_dlrover.operators.job import build_spec
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.accounting import batch_starts
from airflow_dlrover.runtime.datasets import write_synthetic
from airflow_dlrover.runtime.export import check_continues
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.master import Master
from airflow_dlrover.runtime.prepare import prepare
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.unit


def test_each_epoch_trains_every_row_once_under_its_own_sample_numbers():
    spec = JobSpec(job_id="e", samples=1000, shard_size=300, batch_size=128, epochs=3)
    assert spec.total_samples == 3000 and spec.shards_per_epoch == 4 and spec.num_shards == 12
    for shard in range(spec.num_shards):
        start, stop = spec.shard_range(shard)
        epoch = spec.epoch_of(shard)
        first, last, order = spec.shard_rows(shard)  # synthetic: the shard's own rows, shuffled
        assert (first, last) == (start - epoch * 1000, stop - epoch * 1000)
        assert sorted(order.tolist()) == list(range(last - first))
        assert spec.shard_of(start) == spec.shard_of(stop - 1) == shard
    starts = batch_starts(spec)  # a batch's name: its first sample, distinct in every epoch
    assert len(set(starts.tolist())) == len(starts) == 3 * (3 + 3 + 3 + 1)
    assert spec.shard_bounds[-1] == 3000 and spec.held_out == (1000, 21_000)  # held out: rows, once


def test_each_epoch_has_its_own_seeded_order_and_no_shuffle_keeps_the_datas():
    spec = JobSpec(job_id="e", samples=1000, shard_size=300, epochs=2, seed=5)
    first, second = spec.shard_rows(1)[2], spec.shard_rows(1 + spec.shards_per_epoch)[2]
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(300))
    assert not np.array_equal(first, second)  # another order in another epoch
    np.testing.assert_array_equal(first, replace(spec, job_id="again").shard_rows(1)[2])  # the same for a restart
    assert not np.array_equal(first, replace(spec, seed=6).shard_rows(1)[2])
    kept = replace(spec, shuffle_window_rows=0)
    assert kept.shard_rows(1) == (300, 600, None) and kept.window_order(0).tolist() == [0]


def _dataset_spec(tmp_path, **more) -> JobSpec:
    write_synthetic(str(tmp_path / "d"), 6000, row_group_rows=[1000], table_sizes=(100,) * 26)
    return prepare(JobSpec(job_id="m", data=str(tmp_path / "d"), shard_size=500, eval_fraction=0.0,
                           table_sizes=(100,) * 26, **more), runs_here=False)


def test_an_epoch_of_a_dataset_mixes_the_rows_of_a_window_and_trains_each_once(tmp_path):
    spec = _dataset_spec(tmp_path, epochs=3, shuffle_window_rows=2500)
    assert spec.windows == (0, 2500, 5000, 6000)  # windows cut across the row groups of 1000
    assert spec.shards_per_epoch == 12  # 500 at most, inside one window and one row group
    orders = []
    for epoch in range(3):
        rows = []
        for shard in range(epoch * 12, (epoch + 1) * 12):
            first, last, order = spec.shard_rows(shard)
            assert (first, last) == spec.windows[spec.window_of(shard):spec.window_of(shard) + 2]
            rows.append(first + order)
            if last - first == 2500:  # a shard draws from every row group of its window
                assert len(set((first + order) // 1000)) >= 3
        trained = np.concatenate(rows)
        assert sorted(trained.tolist()) == list(range(6000))  # every row once in each epoch
        orders.append(trained)
    assert not np.array_equal(orders[0], orders[1])
    assert sorted(spec.window_order(1).tolist()) == [0, 1, 2]
    again = _dataset_spec(tmp_path / "again", epochs=3, shuffle_window_rows=2500)
    np.testing.assert_array_equal(again.shard_rows(20)[2], spec.shard_rows(20)[2])  # a restart trains the same
    one = _dataset_spec(tmp_path / "one")
    assert one.windows == (0, 6000) and sorted(one.window_order(0)) == [0]  # one epoch is shuffled too
    kept = _dataset_spec(tmp_path / "kept", epochs=2, shuffle_window_rows=0)
    assert kept.windows == (0, 1000, 2000, 3000, 4000, 5000, 6000)  # the data's order, row group by group
    assert all(kept.shard_rows(s) == (s * 500 % 6000, s * 500 % 6000 + 500, None) for s in range(kept.num_shards))
    assert kept.window_order(1).tolist() == list(range(6))


def test_a_negative_shuffle_window_is_refused():
    with pytest.raises(InvalidInputError) as err:
        JobSpec(job_id="e", samples=100, shuffle_window_rows=-1)
    assert err.value.field == "shuffle_window_rows"


@pytest.mark.parametrize("field, value", [("epochs", 0), ("learning_rate", float("nan")), ("dense_learning_rate", 0),
                                          ("adagrad_initial_accumulator", -1.0), ("adam_betas", (0.9, 1.0)),
                                          ("dense_weight_decay", float("inf"))])
def test_a_bad_training_setting_names_the_field(field, value):
    with pytest.raises(InvalidInputError) as err:
        JobSpec(job_id="e", samples=100, **{field: value})
    assert err.value.field == field


def test_job_args_carry_the_training_settings():
    spec = build_spec("j", {"samples": "1000", "epochs": "3", "learning_rate": "0.1", "adam_betas": "[0.8, 0.99]",
                            "dense_weight_decay": 1e-4, "init_from": ""})
    assert (spec.epochs, spec.learning_rate, spec.adam_betas, spec.dense_weight_decay) == (3, 0.1, (0.8, 0.99), 1e-4)
    with pytest.raises(InvalidInputError) as err:
        build_spec("j", {"samples": 1000, "epochs": 0})
    assert err.value.field == "job_args.epochs"
    with pytest.raises(InvalidInputError) as err:
        build_spec("j", {"samples": 1000, "adam_betas": "fast"})
    assert err.value.field == "job_args.adam_betas"


def test_the_master_hands_out_an_epoch_whole_in_its_window_order(tmp_path):
    spec = _dataset_spec(tmp_path, epochs=2, shuffle_window_rows=2000)
    master = Master(spec, tmp_path)
    master.ps_addresses = ["127.0.0.1:1"]  # handed out, never dialled here
    handed = []
    while (reply := master.next_shard("a")).get("shard") is not None:
        handed.append(reply["shard"])
        master.shard_done("a", reply["shard"], reply["generation"], bad_rows=1 if reply["shard"] % 5 == 0 else 0)
    assert sorted(handed) == list(range(24)) and max(handed[:12]) < 12  # epoch 0 whole, then epoch 1
    windows = [spec.window_of(s) for s in handed]
    for epoch in (0, 1):
        visited = list(dict.fromkeys(windows[12 * epoch:12 * (epoch + 1)]))  # in the order first read
        assert visited == np.argsort(spec.window_order(epoch)).tolist()
        assert all(a <= b for a, b in zip(handed[12 * epoch:], handed[12 * epoch + 1:12 * (epoch + 1)])
                   if spec.window_of(a) == spec.window_of(b))  # a window read on, in order
    status = master.status()
    assert status["samples_total"] == 12_000 and status["samples_done"] == 12_000
    assert status["bad_rows"] == 3  # shards 0, 5, 10 of epoch 0; 15 and 20 of epoch 1: the most of one epoch


def _manifest(spec: JobSpec) -> dict:
    return {"layout": spec.layout.to_dict(), "model": spec.model, "bottom_mlp": list(spec.bottom_mlp),
            "top_mlp": list(spec.top_mlp)}


def test_a_job_continues_only_an_export_of_its_model_and_tables():
    layout = FeatureLayout.from_dict({"label": "y", "dense": [{"name": "x"}], "sparse": [
        {"name": "user", "table_size": 1000, "dim": 8}, {"name": "country", "vocabulary": ["de", "fr"], "dim": 8}]})
    yesterday = JobSpec(job_id="a", samples=10, data="day.parquet", layout=layout, bottom_mlp=(16, 8), init_from="s3://m/a")
    check_continues(yesterday, _manifest(yesterday))
    grown = layout.to_dict()
    grown["sparse"][1]["vocabulary"] = ["de", "fr", "us"]  # a vocabulary grows at its end
    check_continues(replace(yesterday, layout=FeatureLayout.from_dict(grown)), _manifest(yesterday))
    refused = {
        "table user": {**layout.to_dict(), "sparse": [{"name": "user", "table_size": 2000, "dim": 8},
                                                      layout.to_dict()["sparse"][1]]},  # re-hashes every value
        "table country": {**layout.to_dict(), "sparse": [layout.to_dict()["sparse"][0],
                                                         {"name": "country", "vocabulary": ["fr", "de"], "dim": 8}]},
        "dense features": {**layout.to_dict(), "dense": [{"name": "z"}]},
    }
    for problem, today in refused.items():
        with pytest.raises(InvalidInputError) as err:
            check_continues(replace(yesterday, layout=FeatureLayout.from_dict(today)), _manifest(yesterday))
        assert err.value.field == "init_from" and problem in str(err.value)
    with pytest.raises(InvalidInputError, match="model DenseDLRM"):
        check_continues(replace(yesterday, top_mlp=(8,)), _manifest(yesterday))
