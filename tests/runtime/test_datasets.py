"""The user's data: Parquet and CSV/TSV read by fragment through the declared layout, the schema
check at launch, bad rows, and the shards a dataset gives the master."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.data import Batch, FeatureSpec, SyntheticSource, criteo_columns
from airflow_dlrover.runtime.datasets import TabularSource, scan, standardize_statistics, write_synthetic
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.prepare import prepare
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.lookup import embed, route

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[1] / "data"
CRITEO_SAMPLE = DATA / "criteo_sample.csv"
AVAZU_SAMPLE = DATA / "avazu_sample.csv"
CRITEO = FeatureLayout.criteo((100_000,) * 26)


def read(data, layout=CRITEO, fragment_rows=8192):
    source = TabularSource(scan(str(data), layout, fragment_rows=fragment_rows), layout)
    return source, source.samples(0, len(source))


# ---------------------------------------------------------------------------------------------
# Text: the Criteo sample, streamed
# ---------------------------------------------------------------------------------------------

def test_the_criteo_sample_reads_as_the_default_layout():
    _, b = read(CRITEO_SAMPLE)
    assert b.dense.shape == (200, 13) and b.num_sparse == 26 and len(b) == 200 and b.bad_rows == 0
    # Line 2: "0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,...,87c6f83c,,,0429f84b,,3a171ecb,c0d61a5c,,"
    assert b.label[0] == 0
    np.testing.assert_allclose(b.dense[0, :5], np.log1p([0, 3, 260, 0, 17668]).astype(np.float32), rtol=1e-6)
    assert b.dense[0, 7] == pytest.approx(math.log1p(33))
    assert b.dense[1, 1] == 0  # line 3 has I2 = -1: negatives clip to 0
    ids = b.id_matrix()
    assert ids[0, 18] == ids[0, 19] == ids[0, 21] == ids[0, 24] == ids[0, 25] == 0  # empty → row 0
    assert (ids[0, :18] >= 1).all() and (ids < 100_000).all()
    assert ids[0, 0] == 18088  # a stable hash: the same in every process and run
    raw_c1 = np.array([line.split(",")[14] for line in CRITEO_SAMPLE.read_text().splitlines()[1:]])
    assert len(set(zip(raw_c1, ids[:, 0]))) == len(set(raw_c1))  # same value → same id


def test_fragments_of_lines_read_alike_in_any_split_tsv_and_gzip(tmp_path):
    _, whole = read(CRITEO_SAMPLE)
    source, again = read(CRITEO_SAMPLE, fragment_rows=64)
    assert source.index.fragment_rows == (64, 64, 64, 8) and again == whole
    assert Batch.concat([source.samples(0, 63), source.samples(63, 130), source.samples(130, 200)]) == whole
    lines = CRITEO_SAMPLE.read_text().splitlines()[1:]
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("".join(line.replace(",", "\t") + "\n" for line in lines))  # headerless, Criteo order
    assert read(tsv, fragment_rows=50)[1] == whole
    gz = tmp_path / "day_0.tsv.gz"
    with gzip.open(gz, "wt") as f:
        f.write(tsv.read_text())
    source, b = read(gz, fragment_rows=50)
    assert b == whole and source.samples(120, 160) == whole.slice(120, 160)  # on from where it stopped
    assert source.samples(10, 20) == whole.slice(10, 20)  # and back from the start


def test_a_row_that_cannot_be_read_is_kept_flagged_counted_and_named(tmp_path):
    rows = [["1" if i % 2 else "0"] + [str(i + j) for j in range(13)] + [f"{i * 26 + t:08x}" for t in range(26)]
            for i in range(6)]
    rows[2][5] = "abc"  # I5 on data line 4 (the header is line 1)
    rows[3][0] = "2"  # a label other than 0/1
    rows[4] = rows[4][:-1]  # 39 fields
    path = tmp_path / "bad.csv"
    path.write_text(",".join(criteo_columns()) + "\n" + "".join(",".join(r) + "\n" for r in rows) + "\n")
    source, b = read(path)
    assert len(b) == 7  # the blank last line is a row too: nothing is dropped silently
    assert list(b.valid_mask) == [True, True, False, False, False, True, False] and b.bad_rows == 4
    errors = [str(e) for e in source.errors(0, 7)]
    assert errors[0].endswith("bad.csv: row 4, column I5: 'abc' is invalid: allowed a finite number, or empty/null for missing")
    assert "row 5, column label: '2'" in errors[1] and "row 6" in errors[2] and "not 39" in errors[2]
    np.testing.assert_allclose(b.dense[5], np.log1p(np.arange(5, 18)))  # the rows around them read right


def test_the_schema_is_checked_at_launch_naming_file_column_and_what_is_allowed(tmp_path):
    with pytest.raises(InvalidInputError, match=r"a header with the column 'label'.*id, click, hour"):
        scan(str(AVAZU_SAMPLE), CRITEO)
    with pytest.raises(InvalidInputError, match="an existing file, folder or glob"):
        scan(str(tmp_path / "absent.parquet"), CRITEO)
    pq.write_table(pa.table({"label": [0, 1], "price": ["1.5", "2"], "user": [3, 4]}), tmp_path / "t.parquet")
    layout = FeatureLayout.from_dict({"dense": ["price"], "sparse": [{"name": "user", "table_size": 10}]})
    with pytest.raises(InvalidInputError) as err:
        scan(str(tmp_path / "t.parquet"), layout)
    assert err.value.field == "layout column 'price'" and "t.parquet" in str(err.value.value)
    assert "an integer or floating-point column" in str(err.value)
    multi = FeatureLayout.from_dict({"dense": [], "sparse": [{"name": "user", "table_size": 10, "multi_hot": True}]})
    with pytest.raises(InvalidInputError, match="a list of integers or strings"):
        scan(str(tmp_path / "t.parquet"), multi)
    missing = FeatureLayout.from_dict({"sparse": [{"name": "item", "table_size": 10}]})
    with pytest.raises(InvalidInputError, match=r"a file with the column 'item'.*label, price, user"):
        scan(str(tmp_path / "t.parquet"), missing)
    for bad, field in (({"sparse": [{"name": "u", "table_size": 1}]}, "layout.sparse[0].table_size"),
                       ({"dense": [{"name": "x", "transform": "sqrt"}]}, "layout.dense[0].transform"),
                       ({"sparse": [{"name": "u", "table_size": 9, "pooling": "max"}]}, "layout.sparse[0].pooling"),
                       ({"sparse": [{"name": "u"}]}, "layout.sparse[0]"), ({"dense": ["label"]}, "layout")):
        with pytest.raises(InvalidInputError) as err:
            FeatureLayout.from_dict(bad)
        assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------------

def test_parquet_row_groups_of_varied_size_over_files_are_the_synthetic_rows(tmp_path):
    files = write_synthetic(str(tmp_path / "day"), 30_000, files=3, row_group_rows=[4000, 1500, 7000])
    index = scan(str(tmp_path / "day"), FeatureLayout.criteo())
    assert index.format == "parquet" and len(index.files) == 3 and index.rows == 30_000
    assert index.fragment_rows == tuple(pq.ParquetFile(f).metadata.row_group(g).num_rows
                                        for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups))
    source = TabularSource(index, FeatureLayout.criteo())
    truth = SyntheticSource(FeatureSpec(13, (20_000,) * 26)).samples(0, 30_000)
    got = Batch.concat([source.samples(a, min(a + 3333, 30_000)) for a in range(0, 30_000, 3333)])
    np.testing.assert_array_equal(got.dense, truth.dense)  # raw counts → log1p: the same features
    np.testing.assert_array_equal(got.label, truth.label)
    hashed = got.id_matrix()
    assert (hashed >= 1).all() and (hashed < 20_000).all()
    for t in (0, 13, 25):  # ids are hashed, one to one on the values present
        assert len(set(zip(truth.sparse[t], hashed[:, t]))) == len(set(truth.sparse[t]))
    assert len(source._stream.chunk[0]) <= 16_384 and not source._cache  # one chunk of a row group is held
    assert scan(str(tmp_path / "day" / "part-*.parquet"), FeatureLayout.criteo()).files == index.files  # a glob


def test_shards_never_cross_a_row_group_and_cover_the_training_rows_once(tmp_path):
    write_synthetic(str(tmp_path / "d"), 20_000, files=2, row_group_rows=[3000, 700])
    spec = prepare(JobSpec(job_id="s", data=str(tmp_path / "d"), shard_size=1000), runs_here=False)
    assert spec.samples == 16_000 and spec.held_out == (16_000, 20_000)
    bounds = spec.shard_bounds
    assert bounds[0] == 0 and bounds[-1] == 16_000 and all(b - a <= 1000 for a, b in zip(bounds, bounds[1:]))
    edges = set(spec.dataset.fragment_starts)
    for a, b in zip(bounds, bounds[1:]):
        assert not any(a < e < b for e in edges)
    assert [spec.shard_of(s) for s in (0, 999, 1000, 15_999)] == [0, 0, 1, spec.num_shards - 1]
    by_file = prepare(JobSpec(job_id="s", data=str(tmp_path / "d"), eval_files=1), runs_here=False)
    assert by_file.held_out == (10_000, 20_000) and by_file.samples == 10_000
    with pytest.raises(InvalidInputError, match=r"≤ the 16000 training rows"):
        JobSpec(job_id="s", data=str(tmp_path / "d"), samples=16_001, dataset=spec.dataset)


def test_a_memory_url_and_a_multi_hot_list_column_with_pooling():
    import fsspec

    fs = fsspec.filesystem("memory")
    table = pa.table({"y": pa.array([1, 0, 1], pa.int8()), "age": [20.0, None, 40.0],
                      "country": ["de", "xx", None],
                      "items": pa.array([[5, 7, 5], [], None], pa.list_(pa.int64())),
                      "tags": ["a|b", "", "c"]})
    with fs.open("/ds/part-0.parquet", "wb") as f:
        pq.write_table(table, f)
    layout = FeatureLayout.from_dict({
        "label": "y", "dense": [{"name": "age", "transform": "standardize"}],
        "sparse": [{"name": "country", "vocabulary": ["de", "fr"], "dim": 2},
                   {"name": "items", "table_size": 100, "dim": 3, "multi_hot": True, "pooling": "mean"},
                   {"name": "tags", "table_size": 50, "dim": 3, "multi_hot": True}]})
    index = scan("memory://ds", layout)
    source = TabularSource(index, layout)
    stats = standardize_statistics(source, 3)
    assert stats["age"] == pytest.approx((30.0, 10.0))  # the missing value does not count
    source = TabularSource(index, layout.with_statistics(stats))
    b = source.samples(0, 3)
    np.testing.assert_allclose(b.dense[:, 0], [-1.0, 0.0, 1.0])  # missing → the mean
    assert list(b.sparse[0]) == [1, 0, 0]  # de → row 1; unknown and missing → row 0
    items = b.sparse[1]
    assert items.shape == (3, 3) and items[0, 0] == items[0, 2] != items[0, 1] and (items[1:] == -1).all()
    assert (b.sparse[2][0] > 0).sum() == 2 and (b.sparse[2][1] == -1).all()
    uniques, inverses, _ = route(b.sparse, 1)
    rows = [torch.arange(len(u) * d, dtype=torch.float32).reshape(len(u), d) for u, d in zip(uniques, layout.dims)]
    out = embed(rows, inverses, b.sparse, layout, torch.device("cpu"))
    item_rows = dict(zip(uniques[1].tolist(), rows[1]))
    expected = (2 * item_rows[int(items[0, 0])] + item_rows[int(items[0, 1])]) / 3  # mean over 3 ids
    torch.testing.assert_close(out[1][0], expected)
    assert (out[1][1:] == 0).all() and out[0].shape == (3, 2)


def test_a_fresh_reader_reads_any_row_range_as_the_file_holds_it(tmp_path):
    """What a resumed or relaunched worker does: a new reader, an arbitrary shard in mid-file."""
    files = write_synthetic(str(tmp_path / "d"), 12_000, files=2, row_group_rows=[2500, 900])
    spec = prepare(JobSpec(job_id="r", data=str(tmp_path / "d"), shard_size=700), runs_here=False)
    direct = pa.concat_tables([pq.read_table(f) for f in files])
    for shard in (0, 5, spec.num_shards // 2, spec.num_shards - 1):
        start, stop = spec.shard_range(shard)
        batch = TabularSource(spec.dataset, spec.layout).samples(start, stop)
        rows = direct.slice(start, stop - start)
        np.testing.assert_array_equal(batch.label, rows.column("label").to_numpy())
        np.testing.assert_allclose(batch.dense[:, 2], np.log1p(rows.column("I3").to_numpy().astype(float)), rtol=1e-6)


@pytest.mark.parametrize("shuffle_window_rows", [0, 2000], ids=["row groups in order", "shuffled windows"])
def test_the_master_keeps_each_worker_in_its_own_window(tmp_path, shuffle_window_rows):
    """A window (a row group, in the data's order) is read by one worker while there are others."""
    from airflow_dlrover.runtime.master import Master

    write_synthetic(str(tmp_path / "d"), 8000, row_group_rows=[2000])
    spec = prepare(JobSpec(job_id="m", data=str(tmp_path / "d"), shard_size=500,
                           shuffle_window_rows=shuffle_window_rows), runs_here=False)
    master = Master(spec, tmp_path)
    master.ps_addresses = ["127.0.0.1:1"]  # handed out, never dialled here
    window = {}
    for _ in range(3):
        for worker in ("a", "b"):
            reply = master.next_shard(worker)
            window.setdefault(worker, set()).add(spec.window_of(reply["shard"]))
            master.shard_done(worker, reply["shard"], reply["generation"])
    assert len(spec.windows) == 4 + 1 and len(window["a"]) == len(window["b"]) == 1 and window["a"] != window["b"]


def test_the_streamed_metrics_match_the_exact_ones_in_any_split():
    from airflow_dlrover.runtime.data import roc_auc
    from airflow_dlrover.runtime.evaluate import StreamingMetrics, metrics

    rng = np.random.default_rng(7)
    logits = rng.normal(-0.8, 1.5, 1_000_000)  # a trained CTR model's scale
    labels = (rng.random(len(logits)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    whole = metrics(labels, logits)
    assert whole["auc"] == pytest.approx(roc_auc(labels, logits), abs=1e-5)
    exact_loss = float(np.mean(-labels * np.log(1 / (1 + np.exp(-logits))) - (1 - labels) * np.log(1 - 1 / (1 + np.exp(-logits)))))
    assert whole["loss"] == pytest.approx(exact_loss, rel=1e-9) and whole["samples"] == 1_000_000
    streaming = StreamingMetrics()
    for a in range(0, len(logits), 300_007):
        streaming.update(labels[a:a + 300_007], logits[a:a + 300_007])
    assert streaming.result() == pytest.approx(whole)
    assert math.isnan(metrics(np.ones(5), np.arange(5.0))["auc"]) and metrics([], [])["samples"] == 0
