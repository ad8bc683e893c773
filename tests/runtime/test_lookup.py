"""The worker's packed route, the PS store's whole-row gathers and Adagrad, and the DLRM's
interaction: each equal to the plain formula it replaces, values and gradients."""

import numpy as np
import pytest
import torch

from airflow_dlrover.runtime.dlrm import DenseDLRM, FlatParameters
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.lookup import PackedRoute, embed, gather, route
from airflow_dlrover.runtime.ps import EmbeddingStore

pytestmark = pytest.mark.unit

SIZES = (50, 7, 300, 1)


def _batch(rng, n=64):
    return tuple(rng.integers(0, size, n) for size in SIZES)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_a_packed_route_gives_the_per_table_ids_rows_and_gradients(p):
    rng = np.random.default_rng(p)
    sparse, dim = _batch(rng), 4
    tables = [rng.standard_normal((size, dim)).astype(np.float32) for size in SIZES]
    packed = PackedRoute(sparse, np.array(SIZES), p)
    uniques, inverses, owner = route(sparse, p)

    assert np.array_equal(packed.ids, np.concatenate(uniques))
    for k in range(p):  # each PS's share: the same ids, counted per table
        _, ids, lengths = packed.shares[k]
        assert np.array_equal(ids, np.concatenate(owner[k]))
        assert lengths.tolist() == [len(u) for u in owner[k]]

    def reply(k, per_table):
        rows = [tables[t][u] for t, u in enumerate(owner[k])]
        return {"rows": rows if per_table else np.concatenate(rows)}

    plain = [torch.from_numpy(r).requires_grad_() for r in
             gather(uniques, [reply(k, True) for k in range(p)], (dim,) * len(SIZES))]
    one = torch.from_numpy(packed.gather([reply(k, False) for k in range(p)])).requires_grad_()
    layout = FeatureLayout.criteo(SIZES, dim)
    expected = embed(plain, inverses, sparse, layout, torch.device("cpu"))
    got = packed.embed(one)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))

    weights = torch.randn(len(SIZES), dim)
    sum((e * w).sum() ** 2 for e, w in zip(expected, weights)).backward()
    sum((e * w).sum() ** 2 for e, w in zip(got, weights)).backward()
    assert torch.allclose(one.grad, torch.cat([r.grad for r in plain]), rtol=1e-6, atol=1e-6)


def test_a_packed_route_refuses_an_id_outside_its_table():
    sparse = list(_batch(np.random.default_rng(0)))
    sparse[1] = sparse[1].copy()
    sparse[1][5] = SIZES[1]  # would land in table 2's rows
    with pytest.raises(ValueError, match="table 1's id 7 lies outside"):
        PackedRoute(tuple(sparse), np.array(SIZES), 1)


def test_the_store_gathers_and_steps_rows_as_the_plain_formula():
    rng = np.random.default_rng(0)
    store = EmbeddingStore([(0, 40), (1, 25)], 8, index=0, count=1, seed=3, initial_accumulator=0.1)
    keys = np.concatenate([store.keys(0, np.arange(40)), store.keys(1, np.arange(25))])
    slots = store.slots(keys)
    rows, acc = store.rows[slots].copy(), store.accumulator[slots].copy()
    assert np.array_equal(store.gather(slots[::-1]), rows[::-1])

    chosen = rng.permutation(len(slots))[:30]
    grads = rng.standard_normal((30, 8)).astype(np.float32)
    store.adagrad(slots[chosen], grads, 0.05)
    acc[chosen] += grads * grads
    rows[chosen] -= 0.05 * grads / np.sqrt(acc[chosen])
    assert np.array_equal(store.accumulator[slots], acc)
    assert np.array_equal(store.rows[slots], rows)


def test_the_interaction_takes_every_pair_once_with_the_gradients_of_indexing():
    torch.manual_seed(0)
    model = DenseDLRM(num_dense=5, num_tables=6, dim=4, bottom=(8, 4), top=(8,))
    dense = torch.randn(10, 5)
    embedded = [torch.randn(10, 4, requires_grad=True) for _ in range(6)]
    vectors = torch.stack([model.bottom(dense), *embedded], dim=1)
    upper = torch.triu_indices(7, 7, offset=1)
    dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, upper[0], upper[1]]
    expected = model.top(torch.cat([vectors[:, 0], dots], dim=1)).squeeze(1)
    expected_grads = torch.autograd.grad(expected.sum(), embedded)
    got = model(dense, embedded)
    assert torch.allclose(got, expected, atol=1e-6)
    for a, b in zip(torch.autograd.grad(got.sum(), embedded), expected_grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_flat_parameters_load_zero_and_read_the_model_through_one_buffer_each():
    torch.manual_seed(0)
    model = DenseDLRM(num_dense=5, num_tables=3, dim=4, bottom=(8, 4), top=(8,))
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    flat = FlatParameters(model)
    assert np.array_equal(flat.numpy(), before)
    flat.load(before * 2)
    assert torch.equal(model.bottom[0].weight, torch.from_numpy(before[:40].reshape(8, 5) * 2))
    dense, embedded = torch.randn(6, 5), [torch.randn(6, 4) for _ in range(3)]
    for _ in range(2):  # the second batch's gradients do not add to the first's
        flat.zero_grad()
        model(dense, embedded).sum().backward()
    model.zero_grad(set_to_none=True)
    model(dense, embedded).sum().backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
    assert np.allclose(flat.gradients(), expected)
