"""The feature layout a job declares: which column is the label, which are dense (with their
transform) and which are sparse (each with its embedding table), checked against the dataset at
launch.

A layout is plain JSON (``job_args.layout``, ``dlrover-rm train --layout LAYOUT.json``)::

    {"label": "clicked",
     "dense":  [{"name": "price", "transform": "log1p"},            # log1p | standardize | none
                {"name": "age", "transform": "standardize"}],        # mean/std measured at launch
     "sparse": [{"name": "user_id", "table_size": 1000000, "dim": 32},          # hashed
                {"name": "country", "vocabulary": ["de", "fr", "us"], "dim": 8}, # value i → row i+1
                {"name": "recent_items", "table_size": 500000, "dim": 32,
                 "multi_hot": true, "pooling": "mean"}]}             # a list column: an embedding bag

Row 0 of every table is the missing value (an empty field, a null, a value outside the vocabulary);
a hashed value lands in ``[1, table_size)``. A dataset whose columns carry the Criteo names needs no
layout: :meth:`FeatureLayout.criteo` is the default (13 ``log1p`` counts, 26 hashed ids).
This module is pure Python: the operators check a layout without importing numpy's heavier users.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from airflow_dlrover.optimizer.types import InvalidInputError

TRANSFORMS = ("log1p", "standardize", "none")
POOLINGS = ("sum", "mean")
#: bytes a PS keeps per embedding row and dimension: the row and its Adagrad accumulator (float32)
BYTES_PER_ROW_DIM = 8
#: bytes a PS keeps per touched row besides: its id (int64); plus 8 per table row for the slot map
BYTES_PER_ROW = 8
BYTES_PER_SLOT = 8


@dataclass(frozen=True)
class DenseColumn:
    """A numeric column. ``log1p``: ``log(1 + max(x, 0))`` (the DLRM reference's count transform);
    ``standardize``: ``(x − mean) / std``, both measured on the training split at launch unless
    given; ``none``: ``x``. A missing value is 0 before the transform."""

    name: str
    transform: str = "log1p"
    mean: float | None = None
    std: float | None = None


@dataclass(frozen=True)
class SparseColumn:
    """A categorical column and its embedding table (``rows`` × ``dim``), hashed (``table_size``)
    or by ``vocabulary``; ``multi_hot``: a list of values per row (Parquet list column, or text
    split by ``separator``), pooled by ``sum`` or ``mean``."""

    name: str
    table_size: int | None = None
    vocabulary: tuple[str, ...] | None = None
    dim: int = 16
    multi_hot: bool = False
    pooling: str = "sum"
    separator: str = "|"

    @property
    def rows(self) -> int:
        return self.table_size if self.vocabulary is None else len(self.vocabulary) + 1


@dataclass(frozen=True)
class FeatureLayout:
    label: str = "label"
    dense: tuple[DenseColumn, ...] = ()
    sparse: tuple[SparseColumn, ...] = ()

    @classmethod
    def criteo(cls, table_sizes: tuple[int, ...] = (20_000,) * 26, dim: int = 16, num_dense: int = 13) -> "FeatureLayout":
        """The Criteo layout: ``label``, ``I1..I13`` (log1p counts), ``C1..C26`` hashed."""
        return cls("label", tuple(DenseColumn(f"I{j + 1}") for j in range(num_dense)),
                   tuple(SparseColumn(f"C{t + 1}", table_size=int(s), dim=dim) for t, s in enumerate(table_sizes)))

    @classmethod
    def from_dict(cls, value: Any, where: str = "layout") -> "FeatureLayout":
        """A layout from its JSON form, every field checked; the error names the field."""
        if isinstance(value, FeatureLayout):
            return value
        if not isinstance(value, dict):
            raise InvalidInputError(where, value, "a mapping with label, dense and sparse")
        _only(where, value, ("label", "dense", "sparse"))
        label = value.get("label", "label")
        if not isinstance(label, str) or not label:
            raise InvalidInputError(f"{where}.label", label, "a column name")
        dense = tuple(_dense(f"{where}.dense[{i}]", c) for i, c in enumerate(_list(f"{where}.dense", value.get("dense", []))))
        sparse = tuple(_sparse(f"{where}.sparse[{i}]", c) for i, c in enumerate(_list(f"{where}.sparse", value.get("sparse", []))))
        if not dense and not sparse:
            raise InvalidInputError(where, value, "at least one dense or sparse column")
        names = [label, *(c.name for c in dense), *(c.name for c in sparse)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidInputError(f"{where}", twice[0], "each column once (label, dense and sparse are distinct)")
        return cls(label, dense, sparse)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def columns(self) -> list[str]:
        return [self.label, *(c.name for c in self.dense), *(c.name for c in self.sparse)]

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    @property
    def table_sizes(self) -> tuple[int, ...]:
        return tuple(c.rows for c in self.sparse)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(c.dim for c in self.sparse)

    def with_statistics(self, stats: dict[str, tuple[float, float]]) -> "FeatureLayout":
        """The layout with the measured (mean, std) of its ``standardize`` columns filled in."""
        dense = tuple(replace(c, mean=stats[c.name][0], std=stats[c.name][1])
                      if c.transform == "standardize" and c.mean is None and c.name in stats else c for c in self.dense)
        return replace(self, dense=dense)

    def table_mb(self, rows_touched: tuple[float, ...] | None = None, ps: int = 1) -> float:
        """PS memory of the tables (MB, over all PS): per table ``rows`` slot entries (the id →
        row map, allocated whole) plus, per touched row, the row and its accumulator
        (``BYTES_PER_ROW_DIM · dim``) and its id. ``rows_touched`` defaults to every row (the bound)."""
        touched = rows_touched or self.table_sizes
        total = 0.0
        for column, n in zip(self.sparse, touched):
            total += (column.rows + ps) * BYTES_PER_SLOT + min(n, column.rows) * (BYTES_PER_ROW_DIM * column.dim + BYTES_PER_ROW)
        return total / 2**20

    def largest_table_mb(self) -> float:
        """``table_mb`` of the largest table alone, every row touched: what a PS holds twice at
        most while it restores a checkpoint or grows a table (one table at a time)."""
        return max((replace(self, sparse=(column,)).table_mb() for column in self.sparse), default=0.0)


def _only(where: str, value: dict, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise InvalidInputError(f"{where}.{unknown[0]}", value[unknown[0]], "one of the keys " + ", ".join(keys))


def _list(where: str, value: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise InvalidInputError(where, value, "a list of columns")
    return list(value)


def _name(where: str, column: Any) -> dict:
    if isinstance(column, str):
        column = {"name": column}
    if not isinstance(column, dict) or not isinstance(column.get("name"), str) or not column["name"]:
        raise InvalidInputError(where, column, "a column name or a mapping with name")
    return column


def _dense(where: str, column: Any) -> DenseColumn:
    column = _name(where, column)
    _only(where, column, ("name", "transform", "mean", "std"))
    transform = column.get("transform", "log1p")
    if transform not in TRANSFORMS:
        raise InvalidInputError(f"{where}.transform", transform, " | ".join(TRANSFORMS))
    mean, std = column.get("mean"), column.get("std")
    for key, v in (("mean", mean), ("std", std)):
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise InvalidInputError(f"{where}.{key}", v, "a finite number")
    if std is not None and std <= 0:
        raise InvalidInputError(f"{where}.std", std, "a number > 0")
    return DenseColumn(column["name"], transform, None if mean is None else float(mean), None if std is None else float(std))


def _sparse(where: str, column: Any) -> SparseColumn:
    column = _name(where, column)
    _only(where, column, ("name", "table_size", "vocabulary", "dim", "multi_hot", "pooling", "separator"))
    size, vocabulary = column.get("table_size"), column.get("vocabulary")
    if (size is None) == (vocabulary is None):
        raise InvalidInputError(where, column["name"], "exactly one of table_size (hashed) or vocabulary")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 2):
        raise InvalidInputError(f"{where}.table_size", size, "an integer ≥ 2 (row 0 is the missing value)")
    if vocabulary is not None:
        if not isinstance(vocabulary, (list, tuple)) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
            raise InvalidInputError(f"{where}.vocabulary", vocabulary, "a non-empty list of strings")
        if len(set(vocabulary)) != len(vocabulary):
            raise InvalidInputError(f"{where}.vocabulary", vocabulary, "distinct values")
        vocabulary = tuple(vocabulary)
    dim = column.get("dim", 16)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise InvalidInputError(f"{where}.dim", dim, "an integer ≥ 1")
    multi_hot = column.get("multi_hot", False)
    if not isinstance(multi_hot, bool):
        raise InvalidInputError(f"{where}.multi_hot", multi_hot, "true or false")
    pooling = column.get("pooling", "sum")
    if pooling not in POOLINGS:
        raise InvalidInputError(f"{where}.pooling", pooling, " | ".join(POOLINGS))
    separator = column.get("separator", "|")
    if not isinstance(separator, str) or len(separator) != 1 or separator in ",\t\n\r\"":
        raise InvalidInputError(f"{where}.separator", separator, "one character other than a comma, tab, quote or newline")
    return SparseColumn(column["name"], size, vocabulary, dim, multi_hot, pooling, separator)


__all__ = ["BYTES_PER_ROW_DIM", "DenseColumn", "FeatureLayout", "POOLINGS", "SparseColumn", "TRANSFORMS"]
