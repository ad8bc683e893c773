"""A user's dataset, streamed: Parquet (one file, a folder or a glob) or CSV/TSV, from local paths
and fsspec URLs, read a fragment at a time and turned into :class:`Batch` es by the feature layout.

* :func:`scan` runs once, at launch, before anything starts: it lists the files, reads every
  Parquet footer (its row groups) or finds a text file's line offsets, checks the layout against
  each file's columns and types, and measures the ``standardize`` columns. Its result, a
  :class:`DatasetIndex`, travels in the job spec, so that every process sees the same rows at the
  same global indices.
* A **fragment** is a Parquet row group, or ``TEXT_FRAGMENT_ROWS`` lines of a text file (a byte
  range of an uncompressed file; compressed text is read on from the start of the file, so keep it
  for small files). Shards (``JobSpec.shard_bounds``) never cross a fragment, so the master's
  dynamic sharding and accounting work on global index ranges unchanged.
* :class:`TabularSource` ``.samples(start, stop)`` reads the rows of the range with the layout's
  columns only: a Parquet row group is streamed ``PARQUET_CHUNK_ROWS`` at a time (a worker takes
  the shards of one row group in order: the master hands them out so), a text fragment is decoded
  whole and the last ``FRAGMENT_CACHE`` are kept. A reader's memory does not grow with the dataset
  nor with its row groups (measured: ~250 MB RSS with row groups of 262,144 or 1,048,576 rows,
  0.25 to 2 GB datasets; ``benchmarks/data.py reader``).
* A value that cannot be read (a non-number in a dense column, a label other than 0/1, a text line
  with the wrong number of fields) makes its row **bad**: it stays at its index with
  ``Batch.valid`` False and trains nothing, and is counted; :meth:`TabularSource.errors` names the
  first ones (file, row, column, value). The master fails the job past ``JobSpec.max_bad_rows``.

Ids: a sparse value is hashed into ``[1, table_size)`` (row 0: missing) by splitmix64 of a 64-bit
key — an integer's value; an 8-hex-digit string's number (Criteo's ids); any other string the first
8 bytes of its BLAKE2b — mixed with the table's index, so the same value gives the same row in every
process and run. A vocabulary maps its ``i``-th value to row ``i + 1``.
"""

from __future__ import annotations

import bisect
import io
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.data import _GOLDEN, _MIX1, Batch, _category_keys, _mix64
from airflow_dlrover.runtime.layout import DenseColumn, FeatureLayout, SparseColumn

PARQUET_SUFFIXES = (".parquet", ".pq")
TEXT_SUFFIXES = (".csv", ".tsv", ".txt")
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
#: lines per fragment of a text file: one default shard (``JobSpec.shard_size``)
TEXT_FRAGMENT_ROWS = 8192
#: decoded text fragments a reader keeps: the one it reads and the one before
FRAGMENT_CACHE = 2
#: rows a Parquet reader decodes at a time (one chunk of a row group: ~5 MB in the Criteo layout),
#: and the read buffer of its pages: a reader's memory does not grow with the row groups' size
PARQUET_CHUNK_ROWS = 16_384
PARQUET_BUFFER_BYTES = 4 * 2**20
#: rows of the training split that measure a ``standardize`` column's mean and std at launch
STATS_ROWS = 100_000
#: bad rows whose detail a reader keeps per fragment (the first names the job's failure)
ERRORS_KEPT = 3
_SCAN_BLOCK = 16 * 2**20


@dataclass(frozen=True)
class DatasetIndex:
    """Where every row is: ``files`` (URLs or paths), and per fragment its file, locator (row
    group, or byte offset of its first line), byte length (text), rows, and first row in its file
    (1-based line for text, for error messages). Fragments are in global row order."""

    format: str  # parquet | text
    files: tuple[str, ...]
    fragment_file: tuple[int, ...]
    fragment_locator: tuple[int, ...]
    fragment_length: tuple[int, ...]
    fragment_rows: tuple[int, ...]
    fragment_first_row: tuple[int, ...]
    separator: str = ","
    columns: tuple[str, ...] = ()  # text: the names of the fields, in file order
    compression: str | None = None

    def __post_init__(self) -> None:
        for name in ("files", "fragment_file", "fragment_locator", "fragment_length", "fragment_rows",
                     "fragment_first_row", "columns"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def rows(self) -> int:
        return sum(self.fragment_rows)

    @property
    def fragment_starts(self) -> list[int]:
        return np.concatenate([[0], np.cumsum(self.fragment_rows)]).astype(int).tolist()


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def filesystem(url: str):
    """(fsspec filesystem, path) of a local path or URL; a protocol whose package is missing is a
    user error naming the URL."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:  # an fsspec protocol whose package is not installed
        raise InvalidInputError("data", url, "a local path or an fsspec URL whose filesystem is installed "
                                "(s3fs for s3://, gcsfs for gs://)", str(err)) from None


def is_local(fs) -> bool:
    """Whether ``fs`` reads and writes this machine's (or pod's) own filesystem."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _url(fs, path: str) -> str:
    """What a file of ``fs`` is called in the spec: its path locally, its URL elsewhere."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def _format_of(path: str) -> str | None:
    lower = path.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def list_files(data: str) -> tuple[str, list[str]]:
    """(format, file URLs) of ``data``: a file, a folder (every Parquet/CSV/TSV file under it, not
    hidden ones nor ``_SUCCESS``-style markers) or a glob, sorted; one format per dataset."""
    fs, root = filesystem(data)
    if any(c in root for c in "*?["):
        paths = sorted(fs.glob(root))
    elif fs.isdir(root):
        paths = sorted(p for p in fs.find(root) if not re.search(r"(^|/)[._]", p[len(root.rstrip("/")):]))
    elif fs.isfile(root):
        paths = [root]
    else:
        raise InvalidInputError("data", data, "synthetic, or an existing file, folder or glob of Parquet/CSV/TSV files")
    formats = {p: _format_of(p) for p in paths if fs.isfile(p)}
    known = {p: f for p, f in formats.items() if f}
    if not known:
        raise InvalidInputError("data", data, f"files ending in {', '.join(PARQUET_SUFFIXES + TEXT_SUFFIXES)} "
                                f"(optionally compressed); found {len(formats)} other file(s)")
    kinds = set(known.values())
    if len(kinds) > 1:
        raise InvalidInputError("data", data, "one format per dataset: Parquet or CSV/TSV, not both")
    return kinds.pop(), [_url(fs, p) for p in known]


def _open(url: str, mode: str = "rb", compression: str | None = None):
    import fsspec

    return fsspec.open(url, mode, compression=compression).open()


# ---------------------------------------------------------------------------------------------
# Scan: index and schema check, at launch
# ---------------------------------------------------------------------------------------------

def scan(data: str, layout: FeatureLayout, *, fragment_rows: int = TEXT_FRAGMENT_ROWS) -> DatasetIndex:
    """Index ``data`` and check ``layout`` against every file (columns and types); see the module."""
    kind, files = list_files(data)
    return _scan_parquet(files, layout) if kind == "parquet" else _scan_text(files, layout, fragment_rows)


def _allowed(column: DenseColumn | SparseColumn | None) -> str:
    if column is None:
        return "an integer, boolean or floating-point column of 0/1"
    if isinstance(column, DenseColumn):
        return "an integer or floating-point column"
    values = "integers or strings"
    if column.multi_hot:
        return f"a list of {values}, or strings of values joined by {column.separator!r} (multi_hot)"
    return f"{values} (one id per row)"


def _type_ok(arrow_type, column: DenseColumn | SparseColumn | None) -> bool:
    import pyarrow.types as t

    def scalar_id(x):
        if t.is_dictionary(x):
            x = x.value_type
        return t.is_integer(x) or t.is_string(x) or t.is_large_string(x) or t.is_null(x)

    if t.is_null(arrow_type):
        return True
    if column is None:
        return t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type)
    if isinstance(column, DenseColumn):
        return t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type) or t.is_decimal(arrow_type)
    if column.multi_hot:
        joined = t.is_string(arrow_type) or t.is_large_string(arrow_type)
        return joined or ((t.is_list(arrow_type) or t.is_large_list(arrow_type)) and scalar_id(arrow_type.value_type))
    return scalar_id(arrow_type)


def _scan_parquet(files: list[str], layout: FeatureLayout) -> DatasetIndex:
    import pyarrow.parquet as pq

    wanted = {layout.label: None, **{c.name: c for c in layout.dense}, **{c.name: c for c in layout.sparse}}
    frag: dict[str, list[int]] = {k: [] for k in ("file", "locator", "length", "rows", "first")}
    for i, url in enumerate(files):
        try:
            with _open(url) as f:
                meta = pq.ParquetFile(f).metadata
                schema = meta.schema.to_arrow_schema()
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a broken file
            raise InvalidInputError("data", url, "a readable Parquet file", f"{type(err).__name__}: {err}") from None
        for name, column in wanted.items():
            if name not in schema.names:
                raise InvalidInputError(f"layout column {name!r}", url, f"a file with the column {name!r} "
                                        f"({_allowed(column)}); the file has {', '.join(schema.names[:12])}"
                                        f"{', ...' if len(schema.names) > 12 else ''}")
            arrow_type = schema.field(name).type
            if not _type_ok(arrow_type, column):
                raise InvalidInputError(f"layout column {name!r}", f"{arrow_type} in {url}", _allowed(column))
        first = 1
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if rows:
                for key, value in zip(frag, (i, g, 0, rows, first)):
                    frag[key].append(value)
            first += rows
    return DatasetIndex("parquet", tuple(files), frag["file"], frag["locator"], frag["length"], frag["rows"], frag["first"])


def _compression(url: str) -> str | None:
    from fsspec.utils import infer_compression

    return infer_compression(url)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.strip() == ""  # an empty first field is a data row with a missing label
    return True


def _scan_text(files: list[str], layout: FeatureLayout, fragment_rows: int) -> DatasetIndex:
    """Every file: its first line (a header, or the first row), its separator, and the byte offset
    of every ``fragment_rows``-th line (one pass over the bytes with numpy, ~1 GB/s)."""
    wanted = layout.columns
    separator, columns, compression = None, None, None
    frag: dict[str, list[int]] = {k: [] for k in ("file", "locator", "length", "rows", "first")}
    for i, url in enumerate(files):
        comp = _compression(url)
        if i and comp != compression:
            raise InvalidInputError("data", url, f"files compressed alike ({compression or 'none'} as the first)")
        compression = comp
        with _open(url, compression=comp) as f:
            first = f.readline()
        text = first.decode("utf-8", errors="replace").rstrip("\r\n")
        if not text.strip():
            raise InvalidInputError("data", url, "a CSV/TSV file whose first line is a header or a row", "it is empty")
        sep = "\t" if "\t" in text else ","
        fields = text.split(sep)
        header = not _is_number(fields[0])
        names = tuple(x.strip() for x in fields) if header else tuple(wanted)
        if not header and len(fields) != len(wanted):
            raise InvalidInputError("data", url, f"a header line, or rows of exactly the layout's {len(wanted)} "
                                    f"columns in its order ({', '.join(wanted[:4])}, ...)", f"line 1 has {len(fields)} fields")
        if header:
            lower = {n.lower(): n for n in names}
            missing = [c for c in wanted if c not in names and c.lower() not in lower]
            if missing:
                raise InvalidInputError(f"layout column {missing[0]!r}", url, f"a header with the column "
                                        f"{missing[0]!r}; the header has {', '.join(names[:12])}")
            names = tuple(next((c for c in wanted if c.lower() == n.lower()), n) for n in names)
        if columns is not None and (names != columns or sep != separator):
            raise InvalidInputError("data", url, f"files with the same columns and separator as {files[0]}")
        separator, columns = sep, names
        _index_lines(url, i, comp, skip=len(first) if header else 0, header=header, fragment_rows=fragment_rows, frag=frag)
    return DatasetIndex("text", tuple(files), frag["file"], frag["locator"], frag["length"], frag["rows"], frag["first"],
                        separator, columns, compression)


def _index_lines(url: str, file: int, compression: str | None, *, skip: int, header: bool, fragment_rows: int,
                 frag: dict[str, list[int]]) -> None:
    """Append the fragments of one text file: every ``fragment_rows`` lines after the header."""
    starts = [skip]  # byte offset of the first line of each fragment
    position, lines, pending_tail = 0, 0, False
    with _open(url, compression=compression) as f:
        while True:
            block = f.read(_SCAN_BLOCK)
            if not block:
                break
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + position
            newlines = newlines[newlines >= skip]
            counts = lines + np.arange(1, len(newlines) + 1)
            boundaries = newlines[counts % fragment_rows == 0] + 1
            starts.extend(int(b) for b in boundaries)
            lines += len(newlines)
            position += len(block)
            pending_tail = block[-1:] != b"\n"
    end = position
    total = lines + (1 if pending_tail and end > skip else 0)
    if starts[-1] >= end and len(starts) > 1:
        starts.pop()
    first_line = 2 if header else 1
    for k, start in enumerate(starts):
        rows = min(fragment_rows, total - k * fragment_rows)
        if rows <= 0:
            break
        stop = starts[k + 1] if k + 1 < len(starts) else end
        for key, value in zip(frag, (file, start, stop - start, rows, first_line + k * fragment_rows)):
            frag[key].append(value)


# ---------------------------------------------------------------------------------------------
# Reading a fragment into a batch
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BadRow:
    """A row that could not be read: its file, row (1-based; a text file's line), column, value."""

    file: str
    row: int
    column: str
    value: str
    allowed: str

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}, column {self.column}: {self.value!r} is invalid: allowed {self.allowed}"


def _hash_rows(keys: np.ndarray, table: int, size: int) -> np.ndarray:
    """Row in ``[1, size)`` of 64-bit keys, for table ``table`` (see the module docstring)."""
    keys = keys.astype(np.uint64, copy=True)
    keys ^= np.uint64((table + 1) * int(_MIX1) % 2**64)
    keys *= _GOLDEN
    return (_mix64(keys) % np.uint64(size - 1)).astype(np.int64) + 1


def _id_rows(values, table: int, column: SparseColumn) -> np.ndarray:
    """Rows of a flat arrow array of ids (null or empty → 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary.take(values.indices)
    n = len(values)
    rows = np.zeros(n, dtype=np.int64)
    if n == 0:
        return rows
    if column.vocabulary is not None:
        text = values if pa.types.is_string(values.type) or pa.types.is_large_string(values.type) else pc.cast(values, pa.string())
        index = pc.index_in(text, value_set=pa.array(list(column.vocabulary)))
        return pc.fill_null(pc.add(index, 1), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_integer(values.type):
        present = values.is_valid().to_numpy(zero_copy_only=False)
        keys = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        rows[present] = _hash_rows(keys[present], table, column.rows)
        return rows
    if pa.types.is_null(values.type):
        return rows
    encoded = pc.dictionary_encode(values)
    uniques = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    index = encoded.indices.to_numpy(zero_copy_only=False)
    present = encoded.indices.is_valid().to_numpy(zero_copy_only=False)
    unique_rows = _hash_rows(_category_keys(uniques), table, column.rows)
    unique_rows[uniques == ""] = 0
    rows[present] = unique_rows[index[present].astype(np.int64)]
    return rows


def _multi_hot_rows(values, table: int, column: SparseColumn) -> np.ndarray:
    """(n, L) rows of a list column (−1 pads); a text column is split by the column's separator."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = pc.split_pattern(values, column.separator)
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(values)
    ids = _id_rows(flat, table, column)
    keep = ids > 0  # an empty or missing element is no id
    width = max(int(lengths.max()) if len(lengths) else 0, 1)
    out = np.full((len(lengths), width), -1, dtype=np.int64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[row[keep], position[keep]] = ids[keep]
    return out


def _numbers(values):
    """float64 values and a mask of unreadable ones: null or empty → NaN (missing), a text that is
    not a number → unreadable."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        stripped = pc.utf8_trim_whitespace(values)
        empty = pc.equal(stripped, "")
        text = pc.if_else(empty, pa.scalar(None, pa.string()), stripped)
        try:
            number = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
            bad = np.zeros(len(number), dtype=bool)
        except pa.ArrowInvalid:
            import pandas as pd

            raw = text.to_numpy(zero_copy_only=False)
            number = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
            bad = np.isnan(number) & pd.notna(pd.Series(raw, dtype=object)).to_numpy()
        return np.array(number, dtype=np.float64), bad
    if pa.types.is_boolean(values.type) or pa.types.is_decimal(values.type) or pa.types.is_null(values.type):
        values = pc.cast(values, pa.float64())
    number = np.asarray(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    return number, np.zeros(len(number), dtype=bool)


def table_to_batch(table, layout: FeatureLayout, where: tuple[str, int], bad_text: dict[int, BadRow] | None = None
                   ) -> tuple[Batch, list[BadRow]]:
    """A fragment (an arrow table with the layout's columns) as a batch, and its first bad rows.
    ``where``: (file, row number of the table's first row); ``bad_text``: rows the text parser
    could not split (index in the table → why)."""
    file, first_row = where
    n = table.num_rows
    invalid = np.zeros(n, dtype=bool)
    errors: dict[int, BadRow] = dict(bad_text or {})
    for i in errors:
        invalid[i] = True

    def flag(mask: np.ndarray, name: str, raw, allowed: str) -> None:
        fresh = np.flatnonzero(mask & ~invalid)
        for i in fresh[:ERRORS_KEPT]:
            errors.setdefault(int(i), BadRow(file, first_row + int(i), name, str(raw[int(i)].as_py()), allowed))
        invalid[mask] = True

    label, bad = _numbers(table.column(layout.label))
    flag(bad | ~np.isin(label, (0.0, 1.0)), layout.label, table.column(layout.label), "0 or 1")
    dense = np.zeros((n, layout.num_dense), dtype=np.float32)
    for j, column in enumerate(layout.dense):
        values, bad = _numbers(table.column(column.name))
        bad |= np.isinf(values)
        flag(bad, column.name, table.column(column.name), "a finite number, or empty/null for missing")
        missing = np.isnan(values) | bad
        if column.transform == "log1p":
            values = np.log1p(np.maximum(np.where(missing, 0.0, values), 0.0))
        elif column.transform == "standardize":
            mean, std = column.mean or 0.0, column.std or 1.0
            values = np.where(missing, 0.0, (values - mean) / std)
        else:
            values = np.where(missing, 0.0, values)
        dense[:, j] = values
    sparse = tuple(_multi_hot_rows(table.column(c.name), t, c) if c.multi_hot else _id_rows(table.column(c.name), t, c)
                   for t, c in enumerate(layout.sparse))
    label = np.where(invalid, 0.0, label)
    kept = [errors[i] for i in sorted(errors)[:ERRORS_KEPT]]
    return Batch(dense, sparse, label, ~invalid), kept


class _RowGroupStream:
    """One Parquet row group read on in chunks of ``PARQUET_CHUNK_ROWS`` (``iter_batches`` over
    the layout's columns, pages read ``PARQUET_BUFFER_BYTES`` at a time): a reader holds the chunk
    it serves from, never the decoded row group. Rows before the current chunk need a new stream
    (a worker reads its row group's shards in order: the master hands them out so)."""

    def __init__(self, source: "TabularSource", f: int):
        import pyarrow.parquet as pq

        index = source.index
        self.source, self.fragment = source, f
        self.url = index.files[index.fragment_file[f]]
        self.handle = _open(self.url)
        self.batches = pq.ParquetFile(self.handle, buffer_size=PARQUET_BUFFER_BYTES).iter_batches(
            batch_size=PARQUET_CHUNK_ROWS, row_groups=[index.fragment_locator[f]], columns=source.layout.columns,
            use_threads=False)
        self.chunk_start, self.chunk = 0, None  # the chunk: (Batch, bad rows) of rows [chunk_start, ...)
        self.next_row = 0  # the first row the iterator has not yielded

    def serves(self, f: int, row: int) -> bool:
        return f == self.fragment and row >= self.chunk_start

    def rows(self, lo: int, hi: int) -> list[tuple[Batch, list[BadRow]]]:
        import pyarrow as pa

        out = []
        while lo < hi:
            while self.chunk is None or lo >= self.chunk_start + len(self.chunk[0]):
                record_batch = next(self.batches)
                self.chunk_start, self.next_row = self.next_row, self.next_row + record_batch.num_rows
                if self.next_row > lo:  # a chunk wholly before ``lo`` is skipped undecoded
                    first = self.source.index.fragment_first_row[self.fragment] + self.chunk_start
                    self.chunk = table_to_batch(pa.Table.from_batches([record_batch]), self.source.layout,
                                                (self.url, first))
            batch, bad = self.chunk
            end = min(hi, self.chunk_start + len(batch))
            first = self.source.index.fragment_first_row[self.fragment]
            out.append((batch.slice(lo - self.chunk_start, end - self.chunk_start),
                        [b for b in bad if lo <= b.row - first < end]))
            lo = end
        return out

    def close(self) -> None:
        self.handle.close()


class TabularSource:
    """Rows of a :class:`DatasetIndex` by global index; see the module docstring."""

    def __init__(self, index: DatasetIndex, layout: FeatureLayout):
        self.index, self.layout = index, layout
        self.starts = index.fragment_starts
        self._cache: OrderedDict[int, tuple[Batch, list[BadRow]]] = OrderedDict()  # text fragments
        self._stream: _RowGroupStream | None = None  # the Parquet row group being read
        self._text_handles: dict[int, Any] = {}
        self._errors: tuple[int, int, list[BadRow]] = (0, 0, [])

    def __len__(self) -> int:
        return self.starts[-1]

    def fragment_of(self, row: int) -> int:
        return bisect.bisect_right(self.starts, row) - 1

    def samples(self, start: int, stop: int) -> Batch:
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= len(self):
            raise ValueError(f"sample range [{start}, {stop}) is invalid: allowed 0 ≤ start ≤ stop ≤ {len(self)} "
                             f"(the dataset's rows)")
        if start == stop:  # an empty batch of the layout's shape
            return self._rows(0, 0, 1)[0][0].slice(0, 0)
        parts, errors = [], []
        for f in range(self.fragment_of(start), self.fragment_of(stop - 1) + 1):
            lo = max(start, self.starts[f]) - self.starts[f]
            hi = min(stop, self.starts[f + 1]) - self.starts[f]
            for batch, bad in self._rows(f, lo, hi):
                parts.append(batch)
                errors += bad
        self._errors = (start, stop, errors)
        return Batch.concat(parts)

    def errors(self, start: int, stop: int) -> list[BadRow]:
        """The first bad rows among ``[start, stop)`` (those of the last ``samples`` call that covers it)."""
        first, last, errors = self._errors
        if not first <= start <= stop <= last:
            self.samples(start, stop)
            first, last, errors = self._errors
        return [b for b in errors if start <= self.row_of(b) < stop]

    def row_of(self, bad: BadRow) -> int:
        """A bad row's global index."""
        file = self.index.files.index(bad.file)
        candidates = [f for f, i in enumerate(self.index.fragment_file) if i == file
                      and self.index.fragment_first_row[f] <= bad.row]
        f = candidates[-1]
        return self.starts[f] + bad.row - self.index.fragment_first_row[f]

    def _rows(self, f: int, lo: int, hi: int) -> list[tuple[Batch, list[BadRow]]]:
        """Rows ``[lo, hi)`` of fragment ``f`` as batches with their bad rows."""
        if self.index.format == "parquet":
            if self._stream is None or not self._stream.serves(f, lo):
                if self._stream is not None:
                    self._stream.close()
                self._stream = _RowGroupStream(self, f)
            return self._stream.rows(lo, hi)
        batch, bad = self.fragment(f)
        first = self.index.fragment_first_row[f]
        return [(batch.slice(lo, hi), [b for b in bad if lo <= b.row - first < hi])]

    def fragment(self, f: int) -> tuple[Batch, list[BadRow]]:
        """A text fragment, decoded whole (``TEXT_FRAGMENT_ROWS`` lines), from the cache."""
        if f in self._cache:
            self._cache.move_to_end(f)
            return self._cache[f]
        table, bad_text = self.table(f, self.layout.columns)
        index = self.index
        result = table_to_batch(table, self.layout, (index.files[index.fragment_file[f]], index.fragment_first_row[f]),
                                bad_text)
        self._cache[f] = result
        while len(self._cache) > FRAGMENT_CACHE:
            self._cache.popitem(last=False)
        return result

    def table(self, f: int, columns: list[str]):
        """Fragment ``f``'s ``columns`` as an arrow table (text: all strings), and the text rows the
        parser could not split (index → why)."""
        index = self.index
        url = index.files[index.fragment_file[f]]
        if index.format == "parquet":
            import pyarrow.parquet as pq

            with _open(url) as handle:
                return pq.ParquetFile(handle).read_row_group(index.fragment_locator[f], columns=columns), {}
        return self._read_text(f, url, (url, index.fragment_first_row[f]), columns)

    def _text_bytes(self, f: int, url: str) -> bytes:
        index = self.index
        offset, length = index.fragment_locator[f], index.fragment_length[f]
        if index.compression is None:
            with _open(url) as handle:
                handle.seek(offset)
                return handle.read(length)
        # A compressed stream cannot seek: read on from where this reader stopped, or from the start.
        file = index.fragment_file[f]
        handle, position = self._text_handles.get(file, (None, 0))
        if handle is None or position > offset:
            if handle is not None:
                handle.close()
            handle, position = _open(url, compression=index.compression), 0
        while position < offset:
            position += len(handle.read(min(_SCAN_BLOCK, offset - position)))
        data = handle.read(length)
        self._text_handles[file] = (handle, position + len(data))
        return data

    def _read_text(self, f: int, url: str, where: tuple[str, int], columns: list[str]):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        index = self.index
        rows = index.fragment_rows[f]
        data = self._text_bytes(f, url)
        if data.endswith(b"\n"):
            data = data[:-1]
        skipped: list[tuple[int, str, int]] = []

        def invalid(row) -> str:
            skipped.append((row.number, row.text, row.actual_columns))
            return "skip"

        wanted = set(columns)
        table = pcsv.read_csv(
            io.BytesIO(data),
            read_options=pcsv.ReadOptions(column_names=list(index.columns), use_threads=False, block_size=len(data) + 1),
            parse_options=pcsv.ParseOptions(delimiter=index.separator, invalid_row_handler=invalid,
                                            ignore_empty_lines=False, quote_char='"' if index.separator == "," else False),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in index.columns},
                                                strings_can_be_null=False, include_columns=[c for c in index.columns if c in wanted]),
        )
        bad_text: dict[int, BadRow] = {}
        if skipped:  # put the rows the parser could not split back at their places, as bad rows
            positions = sorted(number - 1 for number, _, _ in skipped)
            keep = np.setdiff1d(np.arange(rows), positions)
            take = np.full(rows, len(table), dtype=np.int64)
            take[keep] = np.arange(len(keep))
            padded = pa.concat_tables([table, pa.table({c: pa.array([""], pa.string()) for c in table.column_names})])
            table = padded.take(pa.array(take))
            for number, text, count in skipped:
                bad_text[number - 1] = BadRow(where[0], where[1] + number - 1, "(the line)", text[:120],
                                              f"{len(index.columns)} fields separated by {index.separator!r}, "
                                              f"not {count}")
        if table.num_rows != rows:
            raise ValueError(f"{url}: fragment {f} has {table.num_rows} rows where the index counted {rows}: "
                             "the file changed after the job was launched")
        return table, bad_text


def standardize_statistics(source: TabularSource, train_rows: int) -> dict[str, tuple[float, float]]:
    """(mean, std) of each ``standardize`` column without given statistics, over the readable,
    present values of the first ``STATS_ROWS`` training rows (std 1 where it is 0)."""
    columns = [c.name for c in source.layout.dense if c.transform == "standardize" and c.mean is None]
    if not columns:
        return {}
    rows = min(train_rows, STATS_ROWS)
    values: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    for f in range(source.fragment_of(0), source.fragment_of(max(rows - 1, 0)) + 1):
        table, _ = source.table(f, columns)
        take = min(table.num_rows, rows - source.starts[f])
        for c in columns:
            x, bad = _numbers(table.column(c).slice(0, take))
            values[c].append(x[~bad & np.isfinite(x)])
    stats = {}
    for c in columns:
        x = np.concatenate(values[c])
        mean = float(x.mean()) if len(x) else 0.0
        std = float(x.std()) if len(x) > 1 else 0.0
        stats[c] = (mean, std if std > 0 and math.isfinite(std) else 1.0)
    return stats


def write_synthetic(url: str, rows: int, *, files: int = 1, row_group_rows: int | list[int] = 65_536,
                    table_sizes: tuple[int, ...] = (20_000,) * 26, seed: int = 0, zipf_skew: float = 1.05,
                    first: int = 0) -> list[str]:
    """Write ``rows`` synthetic samples (``runtime.data.SyntheticSource``'s from sample ``first``:
    another day's rows of the same generator) as a Parquet dataset in the
    Criteo columns — ``label``, ``I1..I13`` the raw counts (the default layout's ``log1p`` gives the
    synthetic dense features back exactly), ``C1..C26`` the int64 ids — over ``files`` files of row
    groups of ``row_group_rows`` (a list: cycled, for groups of varied size). Written a row group at a
    time. Returns the files' URLs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_dlrover.runtime.data import FeatureSpec, SyntheticSource, criteo_columns

    spec = FeatureSpec(13, table_sizes)
    source = SyntheticSource(spec, seed=seed, zipf_skew=zipf_skew)
    names = criteo_columns(spec)
    schema = pa.schema([("label", pa.int8())] + [(n, pa.int64()) for n in names[1:]])
    groups = row_group_rows if isinstance(row_group_rows, list) else [row_group_rows]
    fs, root = filesystem(url)
    fs.makedirs(root, exist_ok=True)
    per_file = -(-rows // files)
    written, start, g = [], 0, 0
    for i in range(files):
        path = f"{root.rstrip('/')}/part-{i:05d}.parquet"
        stop = min(start + per_file, rows)
        with fs.open(path, "wb") as f, pq.ParquetWriter(f, schema) as writer:
            while start < stop:
                end = min(start + groups[g % len(groups)], stop)
                g += 1
                b = source.samples(first + start, first + end)
                columns = [pa.array(b.label.astype(np.int8))]
                columns += [pa.array(np.rint(np.expm1(b.dense[:, j].astype(np.float64))).astype(np.int64)) for j in range(13)]
                columns += [pa.array(ids) for ids in b.sparse]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema), row_group_size=end - start)
                start = end
        written.append(_url(fs, path))
    return written
