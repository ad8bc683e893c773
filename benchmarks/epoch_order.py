"""How the order of each epoch's rows moves the held-out AUC, on the NYC flights of 2013.

    python benchmarks/epoch_order.py [--window A --train "0[1-4]" --eval 05] [--epochs 2]
                                     [--orders time blocks:8192 blocks:512 rows] [--seeds 0 1 2]

The runtime's DLRM (``DenseDLRM``, the spec's default MLPs, element-wise Adagrad on the embedding
rows from uniform ±``INIT_SCALE`` with the initial accumulator 0.1, Adam on the dense part, batch
512) trained in this one process, synchronously, on the rows ``TabularSource`` reads from
``benchmarks/public/flights.py``'s files and layout, so that the order of the rows is the only thing
that changes between the rows of the table. ``--train`` and ``--eval`` are comma-separated month globs
of ``--window`` (default: January–April trained, May held out: ``public_data.py --sweep``'s split).

Orders, per epoch: ``time`` (the data's own), ``blocks:B`` (blocks of B rows in a shuffled order, the
rows of each shuffled: the runtime's order with ``shuffle_window_rows`` B), ``rows``
(every row of the training set shuffled), ``time-then-rows`` (the first epoch in time order, the
others shuffled). Each row of the table is the mean AUC over ``--seeds``, every seed printed.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch import nn

from public import flights

from airflow_dlrover.runtime.data import Batch, roc_auc
from airflow_dlrover.runtime.datasets import TabularSource, scan
from airflow_dlrover.runtime.dlrm import DenseDLRM
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.ps import INIT_SCALE
from airflow_dlrover.runtime.spec import JobSpec

BATCH = 512


def read(root, layout: FeatureLayout, window: str, months: str) -> Batch:
    """The rows of the comma-separated month globs of ``window``, in order."""
    parts = []
    for glob in months.split(","):
        source = TabularSource(scan(str(root / window / f"2013-{glob}.parquet"), layout), layout)
        parts.append(source.samples(0, len(source)))
    return Batch.concat(parts)


def epoch_order(order: str, epoch: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if order == "time" or (order == "time-then-rows" and epoch == 0):
        return np.arange(n)
    if order.startswith("blocks:"):
        size = int(order.split(":")[1])
        starts = rng.permutation(np.arange(0, n, size))
        return np.concatenate([s + rng.permutation(min(size, n - s)) for s in starts])
    if order in ("rows", "time-then-rows"):
        return rng.permutation(n)
    raise SystemExit(f"--orders: {order!r} is invalid: allowed time, blocks:B, rows, time-then-rows")


def train_and_score(train: Batch, held_out: Batch, layout: FeatureLayout, *, order: str, epochs: int, seed: int,
                    learning_rate: float, dense_learning_rate: float) -> float:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = DenseDLRM(train.num_dense, len(layout.sparse), layout.dims[0], JobSpec.bottom_mlp, JobSpec.top_mlp)
    tables = [nn.Embedding(column.rows, column.dim, sparse=True) for column in layout.sparse]
    for table in tables:
        nn.init.uniform_(table.weight, -INIT_SCALE, INIT_SCALE)
    sparse = torch.optim.Adagrad([t.weight for t in tables], lr=learning_rate,
                                 initial_accumulator_value=JobSpec.adagrad_initial_accumulator)
    dense = torch.optim.Adam(model.parameters(), lr=dense_learning_rate)
    labels = torch.from_numpy(train.label)
    for epoch in range(epochs):
        rows = epoch_order(order, epoch, len(train), rng)
        for start in range(0, len(rows), BATCH):
            batch = rows[start:start + BATCH]
            embedded = [table(torch.from_numpy(ids[batch])) for table, ids in zip(tables, train.sparse)]
            loss = nn.functional.binary_cross_entropy_with_logits(
                model(torch.from_numpy(train.dense[batch]), embedded), labels[batch])
            sparse.zero_grad()
            dense.zero_grad()
            loss.backward()
            sparse.step()
            dense.step()
    with torch.no_grad():
        embedded = [table(torch.from_numpy(ids)) for table, ids in zip(tables, held_out.sparse)]
        scores = model(torch.from_numpy(held_out.dense), embedded).numpy()
    return roc_auc(held_out.label, scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", default="A")
    parser.add_argument("--train", default="0[1-4]")
    parser.add_argument("--eval", default="05")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--orders", nargs="+", default=["time", "blocks:8192", "blocks:512", "time-then-rows", "rows"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--learning-rate", type=float, default=0.02)
    parser.add_argument("--dense-learning-rate", type=float, default=0.001)
    args = parser.parse_args()
    root = flights.prepare()
    layout = FeatureLayout.from_dict(json.loads((root / "layout.json").read_text()))
    train, held_out = read(root, layout, args.window, args.train), read(root, layout, args.window, args.eval)
    print(f"window {args.window}: {len(train):,} rows trained ({args.train}), {len(held_out):,} held out "
          f"({args.eval}); {args.epochs} epochs, lr {args.learning_rate:g} / dense {args.dense_learning_rate:g}")
    print(f"| order | mean AUC | seeds {', '.join(map(str, args.seeds))} |\n|---|---|---|")
    for order in args.orders:
        aucs = [train_and_score(train, held_out, layout, order=order, epochs=args.epochs, seed=seed,
                                learning_rate=args.learning_rate, dense_learning_rate=args.dense_learning_rate)
                for seed in args.seeds]
        print(f"| {order} | {np.mean(aucs):.4f} | {', '.join(f'{a:.4f}' for a in aucs)} |")


if __name__ == "__main__":
    main()
