"""The data layer: batches and the synthetic CTR source (determinism, skew, planted signal)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_dlrover.runtime.data import Batch, FeatureSpec, SyntheticSource, criteo_columns, roc_auc

pytestmark = pytest.mark.unit

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
    assert b.dense.dtype == np.float32 and b.id_matrix().dtype == np.int64 and b.label.dtype == np.float32
    assert len(b) == 10 and b.num_dense == 3 and b.num_sparse == 2
    assert Batch.concat([b.slice(0, 4), b.slice(4, 4), b.slice(4, 10)]) == b
    assert len(b.slice(8, 20)) == 2
    assert b != _batch(10, seed=1)
    assert len(Batch.empty(SMALL)) == 0 and Batch.empty(SMALL).id_matrix().shape == (0, SMALL.num_sparse)
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
    assert b.dense.shape == (5000, 13) and b.id_matrix().shape == (5000, SMALL.num_sparse) and b.label.shape == (5000,)
    assert b.dense.dtype == np.float32 and b.id_matrix().dtype == np.int64 and b.label.dtype == np.float32
    sizes = np.array(SMALL.table_sizes)
    assert (b.id_matrix() >= 0).all() and (b.id_matrix() < sizes).all()
    assert set(np.unique(b.id_matrix()[:, 0])) == {0, 1}  # a 2-row table uses both rows
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
    assert not np.array_equal(a.id_matrix()[:, 3:], b.id_matrix()[:, 3:])
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
    uniform = SyntheticSource(spec, zipf_skew=0.0).samples(0, 50_000).id_matrix()
    criteo_like = SyntheticSource(spec, zipf_skew=1.05).samples(0, 50_000).id_matrix()
    skewed = SyntheticSource(spec, zipf_skew=1.5).samples(0, 50_000).id_matrix()
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
