"""A batch's embedding lookups, shared by the training worker and the exported model: each
table's unique ids routed to the PS that holds them (id ≡ k mod p), the PS replies reassembled,
and the rows embedded as the model's input (a multi-hot table's rows pooled). Single-hot tables of
one dim travel packed (:class:`PackedRoute`): one array of ids each way and one leaf tensor of rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from airflow_dlrover.runtime.layout import FeatureLayout


def route(sparse: tuple[np.ndarray, ...], p: int) -> tuple[list[np.ndarray], list[np.ndarray], list[list[np.ndarray]]]:
    """Unique ids of each table, the maps from the batch's ids (a multi-hot table's present ones,
    row-major) to them, and each PS's share (id ≡ k mod p)."""
    uniques, inverses = [], []
    for ids in sparse:
        u, inverse = np.unique(ids if ids.ndim == 1 else ids[ids >= 0], return_inverse=True)
        uniques.append(u)
        inverses.append(inverse.reshape(-1))
    return uniques, inverses, [uniques] if p == 1 else [[u[u % p == k] for u in uniques] for k in range(p)]


def gather(uniques: list[np.ndarray], replies: list[dict[str, Any]], dims: tuple[int, ...]) -> list[np.ndarray]:
    """Each table's unique rows in the order of ``uniques``, reassembled from the PS replies."""
    p = len(replies)
    if p == 1:
        return list(replies[0]["rows"])
    out = []
    for t, u in enumerate(uniques):
        rows = np.empty((len(u), dims[t]), dtype=np.float32)
        for k in range(p):
            rows[u % p == k] = replies[k]["rows"][t]
        out.append(rows)
    return out


def embed(rows: list[torch.Tensor], inverses: list[np.ndarray], sparse: tuple[np.ndarray, ...], layout: FeatureLayout,
          device: torch.device) -> list[torch.Tensor]:
    """One (n, dim) tensor per table: the row of a single id; a multi-hot table's rows pooled by
    its ``pooling`` (sum, or mean over the present ids; no id → zeros)."""
    out = []
    for r, inverse, ids, column in zip(rows, inverses, sparse, layout.sparse):
        if ids.ndim == 1:
            out.append(r[torch.from_numpy(inverse).to(device)])
            continue
        present = ids >= 0
        index = np.full(ids.shape, len(r), dtype=np.int64)  # the padding points at a zero row
        index[present] = inverse
        pooled = torch.cat([r, r.new_zeros(1, r.shape[1])])[torch.from_numpy(index).to(device)].sum(dim=1)
        if column.pooling == "mean":
            pooled = pooled / torch.from_numpy(present.sum(axis=1)).to(device).clamp(min=1).unsqueeze(1)
        out.append(pooled)
    return out


class PackedRoute:
    """A batch's ids of single-hot tables of one dim as one array (the PS protocol's ``lengths``
    form): its distinct (table, id) pairs table by table, each table's ids sorted (``route``'s order),
    found by one ``np.unique`` over the ids offset by the rows of the tables before theirs (``sizes``);
    ``inverse`` maps the batch's (row, table) cells, row-major, to them."""

    def __init__(self, sparse: tuple[np.ndarray, ...], sizes: np.ndarray, p: int):
        matrix = np.stack(sparse, axis=1)
        outside = (matrix < 0) | (matrix >= sizes)
        if outside.any():  # offset into the next table's rows, it would be trained silently there
            row, t = np.argwhere(outside)[0]
            raise ValueError(f"table {t}'s id {matrix[row, t]} lies outside [0, {sizes[t]})")
        offsets = np.cumsum(sizes) - sizes
        keys, inverse = np.unique(matrix + offsets, return_inverse=True)
        self.table = np.searchsorted(offsets, keys, side="right") - 1
        self.ids = keys - offsets[self.table]
        self.inverse = torch.from_numpy(inverse.reshape(-1))
        self.owner = None if p == 1 else self.ids % p
        self.rows_per_sample = len(sizes)
        #: PS k's part: its selector into ``ids``, its ids and their count per table
        self.shares = []
        for k in range(p):
            mine = slice(None) if self.owner is None else self.owner == k
            self.shares.append((mine, self.ids[mine], np.bincount(self.table[mine], minlength=len(sizes))))

    def gather(self, replies: list[dict[str, Any]]) -> np.ndarray:
        """The rows of :attr:`ids`, in their order, reassembled from the PS replies (one array each)."""
        if self.owner is None:
            return replies[0]["rows"]
        rows = np.empty((len(self.ids), replies[0]["rows"].shape[1]), dtype=np.float32)
        for k, reply in enumerate(replies):
            rows[self.owner == k] = reply["rows"]
        return rows

    def embed(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """One (n, dim) tensor per table from the rows of :attr:`ids` (one gather, whose backward
        is one ``index_add`` into ``rows``' gradient)."""
        cells = rows.index_select(0, self.inverse.to(rows.device))
        return list(cells.view(-1, self.rows_per_sample, rows.shape[1]).unbind(1))
