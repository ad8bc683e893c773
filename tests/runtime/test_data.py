"""The data layer: synthetic CTR source (determinism, skew, planted signal) and Criteo file reading."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_dlrover.runtime.data import (
    Batch,
    FeatureSpec,
    FileSource,
    SyntheticSource,
    criteo_columns,
    open_source,
    read_criteo,
    roc_auc,
)

CRITEO_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "criteo_sample.csv"
AVAZU_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "avazu_sample.csv"
needs_samples = pytest.mark.skipif(not CRITEO_SAMPLE.exists(), reason="shared Criteo sample not present")

SMALL = FeatureSpec(num_dense=13, table_sizes=(2, 3, 17, 1000, 50_000, 10_000))


@pytest.fixture(scope="module")
def default_source() -> SyntheticSource:
    return SyntheticSource()


@pytest.fixture(scope="module")
def small_source() -> SyntheticSource:
    return SyntheticSource(SMALL, seed=3)


# ---------------------------------------------------------------------------------------------
# FeatureSpec, Batch, AUC
# ---------------------------------------------------------------------------------------------

def test_feature_spec_defaults_and_validation():
    spec = FeatureSpec()
    assert spec.num_dense == 13 and spec.num_sparse == 26
    assert all(t == 100_000 for t in spec.table_sizes)
    assert FeatureSpec(table_sizes=[5, 6]).table_sizes == (5, 6)  # JSON lists become tuples
    with pytest.raises(ValueError, match="allowed sizes ≥ 2"):
        FeatureSpec(table_sizes=(10, 1))
    with pytest.raises(ValueError, match="empty"):
        FeatureSpec(table_sizes=())
    with pytest.raises(ValueError, match="num_dense"):
        FeatureSpec(num_dense=0)
    assert criteo_columns()[:3] == ["label", "I1", "I2"] and criteo_columns()[-1] == "C26"
    assert len(criteo_columns()) == 40


def _batch(n: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch(rng.random((n, 3)), rng.integers(0, 9, (n, 2)), rng.integers(0, 2, n))


def test_batch_coerces_dtypes_and_slices_and_concats():
    b = _batch(10)
    assert b.dense.dtype == np.float32 and b.sparse.dtype == np.int64 and b.label.dtype == np.float32
    assert len(b) == 10 and b.num_dense == 3 and b.num_sparse == 2
    assert Batch.concat([b.slice(0, 4), b.slice(4, 4), b.slice(4, 10)]) == b
    assert len(b.slice(8, 20)) == 2
    assert b != _batch(10, seed=1)
    assert len(Batch.empty(SMALL)) == 0 and Batch.empty(SMALL).sparse.shape == (0, SMALL.num_sparse)
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])
    with pytest.raises(ValueError, match="disagree"):
        Batch(np.zeros((3, 2)), np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="shapes"):
        Batch(np.zeros(3), np.zeros((3, 2)), np.zeros(3))


def test_roc_auc_matches_pairwise_definition():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 20, 300).astype(float) + labels * 3  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        pos.size * neg.size)
    assert roc_auc(labels, scores) == pytest.approx(pairwise)
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert roc_auc([0, 1], [1.0, 1.0]) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 1], [0.2, 0.3])


# ---------------------------------------------------------------------------------------------
# Synthetic source
# ---------------------------------------------------------------------------------------------

def test_synthetic_shapes_dtypes_and_bounds(small_source):
    b = small_source.samples(10, 5010)
    assert b.dense.shape == (5000, 13) and b.sparse.shape == (5000, SMALL.num_sparse) and b.label.shape == (5000,)
    assert b.dense.dtype == np.float32 and b.sparse.dtype == np.int64 and b.label.dtype == np.float32
    sizes = np.array(SMALL.table_sizes)
    assert (b.sparse >= 0).all() and (b.sparse < sizes).all()
    assert set(np.unique(b.sparse[:, 0])) == {0, 1}  # a 2-row table uses both rows
    assert np.isin(b.label, [0, 1]).all()
    assert np.isfinite(b.dense).all() and (b.dense >= 0).all()
    # log1p of integer counts: expm1 gives back (near-)integers; some are missing (→ 0).
    counts = np.expm1(b.dense.astype(np.float64))
    assert np.allclose(counts, np.round(counts), atol=1e-3 * np.maximum(counts, 1))
    assert 0.05 < (b.dense == 0).mean() < 0.6
    assert len(small_source) >= 2**40
    assert len(small_source.samples(7, 7)) == 0
    with pytest.raises(ValueError, match="invalid"):
        small_source.samples(5, 4)
    with pytest.raises(ValueError, match="invalid"):
        small_source.samples(-1, 4)


def test_synthetic_is_split_invariant_and_deterministic(small_source):
    whole = small_source.samples(0, 100)
    assert Batch.concat([small_source.samples(0, 37), small_source.samples(37, 100)]) == whole
    assert Batch.concat([small_source.samples(i, i + 1) for i in range(100)]) == whole
    assert SyntheticSource(SMALL, seed=3).samples(0, 100) == whole  # a fresh instance (another process)
    # across the internal generation chunk
    long = small_source.samples(32_000, 34_000)
    assert Batch.concat([small_source.samples(32_000, 33_001), small_source.samples(33_001, 34_000)]) == long


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 2**40 - 200), cuts=st.lists(st.integers(0, 150), max_size=4))
def test_synthetic_any_split_gives_the_same_samples(small_source, start, cuts):
    stop = start + 150
    points = [start, *sorted(start + c for c in cuts), stop]
    pieces = [small_source.samples(a, b) for a, b in zip(points, points[1:])]
    assert Batch.concat(pieces) == small_source.samples(start, stop)


def test_synthetic_seeds_differ():
    a = SyntheticSource(SMALL, seed=0).samples(0, 200)
    b = SyntheticSource(SMALL, seed=1).samples(0, 200)
    assert not np.array_equal(a.dense, b.dense)
    assert not np.array_equal(a.sparse[:, 3:], b.sparse[:, 3:])
    assert not np.array_equal(a.label, b.label)


def test_synthetic_label_rate_and_oracle_auc(default_source):
    b = default_source.samples(0, 60_000)
    assert 0.25 <= b.label.mean() <= 0.35
    oracle = roc_auc(b.label, default_source.true_logits(b))
    assert 0.78 <= oracle <= 0.88
    assert default_source.oracle_auc(0, 60_000) == pytest.approx(oracle)
    # The labels follow the logits: the mean predicted probability matches the positive rate.
    p = 1 / (1 + np.exp(-default_source.true_logits(b)))
    assert p.mean() == pytest.approx(b.label.mean(), abs=0.015)
    # Both parts carry signal: dense alone is informative, but below the oracle.
    dense_only = roc_auc(b.label, default_source.dense_logits(b))
    assert 0.65 < dense_only < oracle - 0.03
    # No signal → AUC ≈ 0.5
    flat = SyntheticSource(SMALL, signal=0.0)
    fb = flat.samples(0, 20_000)
    assert abs(roc_auc(fb.label, fb.dense @ np.ones(13)) - 0.5) < 0.03


def _top_share(ids: np.ndarray, size: int, fraction: float = 0.01) -> float:
    counts = np.sort(np.bincount(ids, minlength=size))[::-1]
    return counts[: max(1, int(size * fraction))].sum() / counts.sum()


def test_zipf_skew_concentrates_traffic_on_hot_ids():
    spec = FeatureSpec(table_sizes=(10_000,) * 3)
    uniform = SyntheticSource(spec, zipf_skew=0.0).samples(0, 50_000).sparse
    criteo_like = SyntheticSource(spec, zipf_skew=1.05).samples(0, 50_000).sparse
    skewed = SyntheticSource(spec, zipf_skew=1.5).samples(0, 50_000).sparse
    shares = [_top_share(ids[:, 0], 10_000) for ids in (uniform, criteo_like, skewed)]
    assert shares[0] < 0.05  # ≈ 1 % plus sampling noise
    assert 0.5 < shares[1] < 0.85
    assert shares[2] > 0.9
    # every table is skewed, and the hot ids are spread over the id space, not packed at 0..k
    assert all(_top_share(skewed[:, t], 10_000) > 0.9 for t in range(3))
    hot = np.argsort(np.bincount(skewed[:, 0], minlength=10_000))[::-1][:20]
    assert hot.max() > 1000
    # the expected traffic agrees with what is drawn
    source = SyntheticSource(spec, zipf_skew=1.5)
    traffic = source.id_traffic(0)
    assert traffic.sum() == pytest.approx(1.0)
    drawn = np.bincount(skewed[:, 0], minlength=10_000) / len(skewed)
    assert np.abs(np.sort(traffic)[::-1][:5] - np.sort(drawn)[::-1][:5]).max() < 0.01


def test_synthetic_rejects_bad_parameters():
    for kwargs in (dict(seed=-1), dict(zipf_skew=-0.1), dict(zipf_skew=math.nan), dict(signal=-1.0),
                   dict(positive_rate=1.0)):
        with pytest.raises(ValueError, match="allowed"):
            SyntheticSource(SMALL, **kwargs)


# ---------------------------------------------------------------------------------------------
# Criteo files
# ---------------------------------------------------------------------------------------------

@needs_samples
def test_read_criteo_sample_csv():
    b = read_criteo(CRITEO_SAMPLE)
    assert b.dense.shape == (200, 13) and b.sparse.shape == (200, 26) and b.label.shape == (200,)
    assert set(np.unique(b.label)) <= {0.0, 1.0} and 0 < b.label.mean() < 1
    # Line 2: "0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,...,87c6f83c,,,0429f84b,,3a171ecb,c0d61a5c,,"
    assert b.label[0] == 0
    np.testing.assert_allclose(b.dense[0, :5], np.log1p([0, 3, 260, 0, 17668]).astype(np.float32), rtol=1e-6)
    assert b.dense[0, 7] == pytest.approx(math.log1p(33))
    assert b.dense[1, 1] == 0  # line 3 has I2 = -1: negatives clip to 0
    assert b.sparse[0, 18] == 0 and b.sparse[0, 19] == 0 and b.sparse[0, 21] == 0  # C19, C20, C22 empty
    assert b.sparse[0, 24] == 0 and b.sparse[0, 25] == 0
    assert (b.sparse[0, :18] >= 1).all()
    assert (b.sparse < 100_000).all() and (b.sparse >= 0).all()
    # a stable hash: fixed across calls, processes and runs (pinned value), and salted by the feature
    assert b.sparse[0, 0] == 18088
    assert read_criteo(CRITEO_SAMPLE) == b
    c1 = b.sparse[:, 0]
    raw_c1 = np.array([line.split(",")[14] for line in CRITEO_SAMPLE.read_text().splitlines()[1:]])
    assert len(set(zip(raw_c1, c1))) == len(set(raw_c1))  # same value → same id
    assert (b.sparse[:, 8] == b.sparse[0, 8]).mean() > 0.5  # C9 is dominated by one value


@needs_samples
def test_read_criteo_headerless_tsv_and_gzip_give_the_same_batch(tmp_path):
    lines = CRITEO_SAMPLE.read_text().splitlines()[1:]
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("".join(line.replace(",", "\t") + "\n" for line in lines))
    expected = read_criteo(CRITEO_SAMPLE)
    assert read_criteo(tsv) == expected
    gz = tmp_path / "day_0.gz"
    with gzip.open(gz, "wt") as f:
        f.write(tsv.read_text())
    assert read_criteo(gz) == expected
    assert read_criteo(tsv, max_rows=50) == expected.slice(0, 50)
    small = FeatureSpec(table_sizes=(7,) * 26)
    ids = read_criteo(tsv, small).sparse
    assert ids.max() < 7 and ((ids == 0) == (expected.sparse == 0)).all()


@needs_samples
def test_read_criteo_rejects_avazu_and_missing_files(tmp_path):
    if AVAZU_SAMPLE.exists():
        with pytest.raises(ValueError, match=r"avazu_sample\.csv: line 1: .*not the Criteo layout"):
            read_criteo(AVAZU_SAMPLE)
    with pytest.raises(ValueError, match="no such file"):
        read_criteo(tmp_path / "absent.tsv")
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_criteo(empty)


def _rows(n: int = 4) -> list[list[str]]:
    return [["1" if i % 2 else "0"] + [str(i + j) for j in range(13)] + [f"{i * 26 + t:08x}" for t in range(26)]
            for i in range(n)]


def _write(path: Path, rows: list[list[str]], sep: str = "\t", header: bool = False) -> Path:
    text = (sep.join(criteo_columns()) + "\n" if header else "") + "".join(sep.join(r) + "\n" for r in rows)
    path.write_text(text)
    return path


def test_read_criteo_names_line_column_and_value_of_bad_input(tmp_path):
    rows = _rows()
    rows[2][5] = "abc"  # I5 on data row 3
    with pytest.raises(ValueError, match=r"bad\.tsv: line 3, column I5: 'abc' is invalid: allowed a number"):
        read_criteo(_write(tmp_path / "bad.tsv", rows))
    with pytest.raises(ValueError, match=r"line 4, column I5: 'abc'"):  # the header counts as line 1
        read_criteo(_write(tmp_path / "bad.csv", rows, sep=",", header=True))
    rows = _rows()
    rows[1][0] = "2"
    with pytest.raises(ValueError, match=r"line 2, column label: '2' is invalid: allowed 0 or 1"):
        read_criteo(_write(tmp_path / "label.tsv", rows))
    rows = _rows()
    rows[3] = rows[3][:-1]
    with pytest.raises(ValueError, match=r"line 4 has 39 field\(s\).*allowed exactly 40 fields"):
        read_criteo(_write(tmp_path / "short.tsv", rows))
    rows = _rows()
    rows[0] = rows[0] + ["extra"]
    with pytest.raises(ValueError, match=r"line 1 has 41 field"):
        read_criteo(_write(tmp_path / "long.tsv", rows))
    rows = _rows()
    rows[1][2] = "inf"
    with pytest.raises(ValueError, match=r"line 2, column I2: 'inf'"):
        read_criteo(_write(tmp_path / "inf.tsv", rows))


def test_read_criteo_skips_blank_lines_but_counts_them(tmp_path):
    rows = _rows(3)
    path = tmp_path / "blank.tsv"
    path.write_text("\t".join(rows[0]) + "\n\n" + "\t".join(rows[1]) + "\n" + "\t".join(rows[2]) + "\n\n")
    b = read_criteo(path)
    assert len(b) == 3 and list(b.label) == [0, 1, 0]
    rows[2][3] = "x"
    path.write_text("\t".join(rows[0]) + "\n\n" + "\t".join(rows[1]) + "\n" + "\t".join(rows[2]) + "\n")
    with pytest.raises(ValueError, match=r"line 4, column I3"):
        read_criteo(path)


def test_read_criteo_hashes_any_string_and_reserves_zero_for_missing(tmp_path):
    rows = _rows(3)
    rows[0][14] = "not-hex-at-all"
    rows[1][14] = ""
    rows[2][14] = "ÄÖÜ12345"  # 8 characters, not hex
    b = read_criteo(_write(tmp_path / "strings.tsv", rows))
    assert b.sparse[0, 0] >= 1 and b.sparse[1, 0] == 0 and b.sparse[2, 0] >= 1
    assert read_criteo(tmp_path / "strings.tsv") == b
    np.testing.assert_allclose(b.dense[:, 0], np.log1p([0, 1, 2]))  # I1 of row i is i


def test_file_source_slices_rows(tmp_path):
    path = _write(tmp_path / "rows.tsv", _rows(10))
    source = FileSource(path)
    assert len(source) == 10
    whole = read_criteo(path)
    assert source.samples(2, 7) == whole.slice(2, 7)
    assert Batch.concat([source.samples(0, 4), source.samples(4, 10)]) == whole
    with pytest.raises(ValueError, match=r"allowed 0 ≤ start ≤ stop ≤ 10"):
        source.samples(5, 11)
    assert len(FileSource(path, max_rows=3)) == 3
    assert isinstance(open_source(str(path)), FileSource)
    assert isinstance(open_source("synthetic", SMALL), SyntheticSource)
