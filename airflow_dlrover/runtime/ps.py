"""Parameter server: embedding rows partitioned by ``id % p``, sparse Adagrad; PS 0 also holds the
dense parameters (Adam).

Exactly once: a push names its batch (the batch's first sample), and a PS applies each batch once
per model state — a second push of it (a shard redone after its lease was revoked, a request resent
after a lost reply) is refused and journalled as such. The set of applied batches is saved and
restored with the rows. Every apply, refusal, save and restore is appended to this process's
journal, which ``runtime.accounting`` reconciles after the run.

Rows are created on first touch (their initial value is a deterministic function of
(seed, table, id), so re-partitioning or restoring never changes a row that was not trained), so
PS memory grows as new ids arrive — the growth the memory model forecasts. A job that continues an
export (``init_from``) starts from its rows instead: each PS loads the rows it owns, with fresh
accumulators. numpy only: a PS starts in well under a second, which is what a PS restart costs.

Every request carries the job's *generation*: a restore from a checkpoint bumps it, and a push
from an older generation is refused, so a worker that trained against the old model drops its
shard instead of polluting the restored one.

A request's arrays are checked before they touch a row (``InvalidInputError`` naming the field): an
id outside its table, or one another PS owns, would index another id's row (``id // p``); a
gradient must have the shape of its rows; a batch must be one of the job's; a checkpoint or journal
path must lie inside the job's folder (``root``: the master's, at the same path). A checkpoint file that
cannot be read whole fails its restore with :class:`DamagedCheckpoint` and leaves this PS serving
nothing until the master restores it from an older one.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import sys
import threading
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.accounting import batch_starts
from airflow_dlrover.runtime.integrity import seal, sha256_file
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Server, announce

log = logging.getLogger(__name__)

INIT_SCALE = 0.05  # embedding rows start uniform in ±INIT_SCALE (DLRM uses ~1/sqrt(rows))
ADAM_EPS = 1e-8


class StaleGeneration(RuntimeError):
    """The request belongs to a model state that was rolled back."""


class DamagedCheckpoint(RuntimeError):
    """A checkpoint file cannot be read whole (its bytes changed, or it was cut short)."""


def initial_rows(seed: int, table: int | np.ndarray, ids: np.ndarray, dim: int) -> np.ndarray:
    """Deterministic initial rows: splitmix64 of (seed, table, id, column) → uniform(±INIT_SCALE);
    ``table`` one number, or one per id."""
    with np.errstate(over="ignore"):
        x = (ids.astype(np.uint64)[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None, :])
        # ((seed·1,000,003 + table) · φ·2⁶⁴) mod 2⁶⁴, in uint64 arithmetic that wraps mod 2⁶⁴
        offset = (np.uint64(seed * 1_000_003 % (1 << 64)) + np.asarray(table, dtype=np.uint64)) * np.uint64(
            0x9E3779B97F4A7C15)
        x = x + (offset[:, None] if offset.ndim else offset)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    unit = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return ((unit * 2.0 - 1.0) * INIT_SCALE).astype(np.float32)


#: Linux's flag for a mapping whose pages are not counted against the commit limit until written
#: (``mmap(2)``); Python's ``mmap`` module does not name it.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def reserved(rows: int, dim: int, dtype: Any) -> np.ndarray:
    """A zeroed (rows, dim) array whose memory is taken page by page as it is first written (an
    anonymous private mapping, ``MAP_NORESERVE``): a table's region reserved whole, resident as
    its rows arrive."""
    nbytes = max(rows * dim * np.dtype(dtype).itemsize, 1)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    return np.frombuffer(mapping, dtype=dtype, count=rows * dim).reshape(rows, dim)


class EmbeddingStore:
    """The rows this PS owns (ids ≡ index mod p) of every table of one dim, in one array, so that a
    batch's lookup and Adagrad step over all its tables are a few array operations.

    Table j of the store has a region of ``size_j // p + 1`` rows; its rows are created on first
    touch, in the order they arrive, at the start of its region (``used[j]`` of them), so that
    the memory a table takes grows with its ids (``reserved``). A row's *key* is its region's
    start plus ``id // p``; ``slot[key]`` is the row it lies in (−1: not created yet)."""

    def __init__(self, tables: list[tuple[int, int]], dim: int, index: int, count: int, seed: int,
                 initial_accumulator: float):
        self.tables = np.array([t for t, _ in tables], dtype=np.int64)  # the job's table numbers
        self.dim, self.index, self.count, self.seed = dim, index, count, seed
        self.initial_accumulator = initial_accumulator
        capacity = np.array([size // count + 1 for _, size in tables], dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(capacity)]).astype(np.int64)  # region j: [base[j], base[j+1])
        total = int(self.base[-1])
        self.slot = np.full(total, -1, dtype=np.int64)
        self.ids = np.empty(total, dtype=np.int64)
        self.rows = reserved(total, dim, np.float32)
        self.accumulator = reserved(total, dim, np.float32)
        self.used = np.zeros(len(tables), dtype=np.int64)
        # the same memory with one element per row, so that gathers and scatters move whole rows
        self._row = np.dtype((np.void, dim * 4))
        self._rows_whole = self.rows.view(self._row).reshape(-1)
        self._accumulator_whole = self.accumulator.view(self._row).reshape(-1)

    def keys(self, position: int, ids: np.ndarray) -> np.ndarray:
        return self.base[position] + ids // self.count

    def slots(self, keys: np.ndarray, initialise: bool = True) -> np.ndarray:
        """The rows of ``keys``, creating the missing ones (their initial values unless the caller
        writes them: ``initialise`` False)."""
        slots = self.slot[keys]
        new = slots < 0
        if new.any():
            fresh = np.unique(keys[new])  # sorted: grouped by table, each table's ids ascending
            j = np.searchsorted(self.base, fresh, side="right") - 1
            counts = np.bincount(j, minlength=len(self.used))
            rank = np.arange(len(fresh)) - (np.cumsum(counts) - counts)[j]
            made = self.base[j] + self.used[j] + rank
            self.used += counts
            self.slot[fresh] = made
            ids = (fresh - self.base[j]) * self.count + self.index
            self.ids[made] = ids
            if initialise:
                self.rows[made] = initial_rows(self.seed, self.tables[j], ids, self.dim)
                self.accumulator[made] = self.initial_accumulator
            slots = self.slot[keys]
        return slots

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """The rows in ``slots``, a (len(slots), dim) copy."""
        return self._gather(self._rows_whole, slots)

    def _gather(self, whole: np.ndarray, slots: np.ndarray) -> np.ndarray:
        # one element per row: half the time of ``np.take(..., axis=0)`` on (n, dim), a third of ``[slots]``
        return np.take(whole, slots).view(np.float32).reshape(len(slots), self.dim)

    def adagrad(self, slots: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """Sparse Adagrad (Duchi et al. 2011) on unique rows: G += g², θ −= lr·g/√G."""
        acc = self._gather(self._accumulator_whole, slots)
        acc += grads * grads
        self._accumulator_whole[slots] = acc.view(self._row).reshape(-1)
        rows = self._gather(self._rows_whole, slots)
        rows -= lr * grads / np.sqrt(acc)
        self._rows_whole[slots] = rows.view(self._row).reshape(-1)


class EmbeddingShard:
    """One table of an :class:`EmbeddingStore`: its ``rows``, ``accumulator`` and ``ids`` are views
    of the store's arrays over the table's region, the first ``used`` of them in use."""

    def __init__(self, store: EmbeddingStore, position: int, size: int):
        self.store, self.position, self.size = store, position, size
        self.table, self.dim = int(store.tables[position]), store.dim
        self.index, self.count = store.index, store.count
        self.region = slice(int(store.base[position]), int(store.base[position + 1]))

    @property
    def used(self) -> int:
        return int(self.store.used[self.position])

    @property
    def rows(self) -> np.ndarray:
        return self.store.rows[self.region]

    @property
    def accumulator(self) -> np.ndarray:
        return self.store.accumulator[self.region]

    @property
    def ids(self) -> np.ndarray:
        return self.store.ids[self.region]

    def _slots(self, ids: np.ndarray, initialise: bool = True) -> np.ndarray:
        return self.store.slots(self.store.keys(self.position, ids), initialise)

    def apply_adagrad(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """Sparse Adagrad; ``ids`` are unique (the worker aggregates duplicates)."""
        self.store.adagrad(self._slots(ids), grads, lr)

    def export(self) -> dict[str, np.ndarray]:
        """The rows in use, as views: valid while the caller holds the PS's lock (``save`` writes
        them under it, and ``np.savez`` streams each array in chunks), so a checkpoint holds no
        second copy of the tables."""
        n = self.used
        return {"ids": self.ids[:n], "rows": self.rows[:n], "acc": self.accumulator[:n]}

    def absorb(self, ids: np.ndarray, rows: np.ndarray, acc: np.ndarray) -> None:
        """Take the rows of ``ids`` that this shard owns (re-partitioning; ids are unique). The
        rows it takes are written, not initialised first, and copied only when it owns a part of
        them: a restore holds the file's table beside the one it fills, nothing more."""
        mine = ids % self.count == self.index
        if not mine.all():
            ids, rows, acc = ids[mine], rows[mine], acc[mine]
        if len(ids):
            slots = self._slots(ids, initialise=False)
            self.store.rows[slots] = rows
            self.store.accumulator[slots] = acc


@dataclass
class DenseState:
    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int = 0


class ParameterServer:
    """Request handler of one PS process (see the module docstring)."""

    def __init__(self, spec: JobSpec, index: int, count: int, root: Path | None = None):
        self.spec, self.index, self.count = spec, index, count
        self.root = None if root is None else Path(root).resolve()  # None: any path (in-process tests)
        self.generation = -1  # not serving until the master sets or restores the generation
        self.lock = threading.RLock()  # held across a request's generation check and its work
        self.tables = self._empty_tables()
        self.dense: DenseState | None = None
        self.batches: set[int] = set()  # the batches (first samples) whose update this state holds
        self.requests = 0
        self._journal = None
        self._sizes = np.array([c.rows for c in spec.layout.sparse], dtype=np.int64)
        self._batches: np.ndarray | None = None  # the job's batch starts, sorted (``batch_starts``)

    def _empty_tables(self) -> list[EmbeddingShard]:
        """One empty shard per table, the tables of one dim in one :class:`EmbeddingStore`."""
        columns = self.spec.layout.sparse
        tables: list[EmbeddingShard | None] = [None] * len(columns)
        for dim in sorted({c.dim for c in columns}):
            members = [(t, c.rows) for t, c in enumerate(columns) if c.dim == dim]
            store = EmbeddingStore(members, dim, self.index, self.count, self.spec.seed,
                                   self.spec.adagrad_initial_accumulator)
            for position, (t, size) in enumerate(members):
                tables[t] = EmbeddingShard(store, position, size)
        return tables

    def _by_store(self, ids: np.ndarray, lengths: np.ndarray) -> list[tuple[EmbeddingStore, np.ndarray]]:
        """Per store of the tables: the store, and the rows of its tables' ids in ``ids`` (every
        table's, ``lengths[t]`` of table t after those of the tables before it), created where missing."""
        stores = list({id(t.store): t.store for t in self.tables}.values())
        out = []
        for store in stores:
            mine = ids if len(stores) == 1 else ids[np.repeat(np.isin(np.arange(len(lengths)), store.tables), lengths)]
            keys = mine // self.count + np.repeat(store.base[:-1], lengths[store.tables])
            out.append((store, store.slots(keys)))
        return out

    def _start_tables(self) -> list[EmbeddingShard]:
        """The job's first state of the tables: empty, or the rows this PS owns of the export the
        job starts from (``init_from``), with fresh Adagrad accumulators."""
        tables = self._empty_tables()
        if self.spec.init_from:
            from airflow_dlrover.runtime.export import read_manifest, read_table

            manifest = read_manifest(self.spec.init_from, "init_from")
            for table, entry in zip(tables, manifest["tables"]):
                ids, rows = read_table(self.spec.init_from, entry)
                table.absorb(ids, rows, np.full(rows.shape, self.spec.adagrad_initial_accumulator, np.float32))
        return tables

    def _log(self, event: str, **fields: Any) -> None:
        """Append one event to this process's journal (see ``runtime.accounting``)."""
        if self._journal is not None:
            self._journal.write(seal({"e": event, "t": time.time(), "g": self.generation, **fields}) + "\n")

    def _inside(self, field: str, path: Any) -> Path:
        """``path`` as a Path, when it names a place inside the job's folder (``root``)."""
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise InvalidInputError(field, path, "a path")
        if self.root is not None and not Path(path).resolve().is_relative_to(self.root):
            raise InvalidInputError(field, str(path), f"a path inside the job's folder {self.root}")
        return Path(path)

    def _open_journal(self, folder: str | None) -> None:
        if folder is not None:
            self._inside("journal", folder)
        if self._journal is None and folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            name = f"ps{self.index}-{os.getpid()}-{time.time_ns()}.jsonl"
            self._journal = open(Path(folder) / name, "a", buffering=1)  # a line reaches the OS at once

    # -- requests ------------------------------------------------------------------------------
    def handle(self, method: str, **kwargs: Any) -> Any:
        if method not in _METHODS:
            raise ValueError(f"unknown method {method!r}")
        if method not in _DATA_METHODS:
            return getattr(self, method)(**kwargs)
        generation = kwargs.pop("generation")
        with self.lock:  # checked and served under one lock: a restore cannot come in between
            if self.generation < 0:
                raise StaleGeneration("this PS has not been restored by the master yet")
            if generation != self.generation:
                raise StaleGeneration(f"generation {generation} is stale: the job was restored to {self.generation}")
            return getattr(self, method)(**kwargs)

    def _check_ids(self, ids: Any, lengths: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Every table's ids in one int64 array, and each table's count: ``ids`` is one 1-D integer
        array per table, or (with ``lengths``, one count per table) all of them in one array, in
        table order. Each id must lie in its table and be one this PS owns."""
        tables = len(self.tables)
        if lengths is None:
            if not isinstance(ids, (list, tuple)) or len(ids) != tables:
                raise InvalidInputError("ids", type(ids).__name__, f"a list of {tables} id arrays, one per table")
            parts = []
            for t, values in enumerate(ids):
                values = np.asarray(values)
                if values.ndim != 1 or (len(values) and values.dtype.kind not in "iu"):
                    raise InvalidInputError(f"ids[{t}]", f"{values.dtype} {values.shape}", "a 1-D array of integer ids")
                parts.append(values.astype(np.int64, copy=False))
            every, lengths = np.concatenate(parts), np.array([len(v) for v in parts], dtype=np.int64)
        else:
            lengths = np.asarray(lengths)
            if lengths.shape != (tables,) or (tables and lengths.dtype.kind not in "iu") or (lengths < 0).any():
                raise InvalidInputError("lengths", np.shape(lengths), f"{tables} counts ≥ 0, one per table")
            every = np.asarray(ids)
            if every.ndim != 1 or (len(every) and every.dtype.kind not in "iu") or len(every) != lengths.sum():
                raise InvalidInputError("ids", f"{every.dtype} {every.shape}",
                                        f"a 1-D array of {lengths.sum()} integer ids (the sum of lengths)")
            every, lengths = every.astype(np.int64, copy=False), lengths.astype(np.int64, copy=False)
        if len(every):  # one pass over every table's ids: ~0.1 ms for 26 tables × 512 ids
            bad = (every < 0) | (every >= np.repeat(self._sizes, lengths))
            if self.count > 1:
                bad |= every % self.count != self.index
            if bad.any():
                first = int(np.argmax(bad))
                t = int(np.searchsorted(np.cumsum(lengths), first, side="right"))
                raise InvalidInputError(f"ids[{t}]", int(every[first]), f"an id in [0, {self.tables[t].size}) with "
                                        f"id % {self.count} = {self.index} (the ids this PS owns)")
        return every, lengths

    def _check_push(self, lengths: np.ndarray, packed: bool, grads: Any, batch: Any, samples: Any, worker: Any,
                    dense_grad: Any) -> None:
        if packed:
            shape = (int(lengths.sum()), self.tables[0].dim if self.tables else 0)
            if np.shape(grads) != shape:
                raise InvalidInputError("grads", np.shape(grads), f"shape {shape} (one row per id)")
        else:
            if not isinstance(grads, (list, tuple)) or len(grads) != len(lengths):
                raise InvalidInputError("grads", type(grads).__name__, f"a list of {len(lengths)} gradient arrays")
            for t, (n, g) in enumerate(zip(lengths, grads)):
                shape = (int(n), self.tables[t].dim)
                if np.shape(g) != shape:
                    raise InvalidInputError(f"grads[{t}]", np.shape(g), f"shape {shape} (one row per id)")
        if self._batches is None:
            self._batches = batch_starts(self.spec)
        numeric = isinstance(batch, (int, np.integer)) and 0 <= batch < 2**62
        at = np.searchsorted(self._batches, batch) if numeric else -1
        if isinstance(batch, bool) or not 0 <= at < len(self._batches) or self._batches[at] != batch:
            raise InvalidInputError("batch", batch, "the first sample of one of the job's batches")
        if (isinstance(samples, bool) or not isinstance(samples, (int, np.integer))
                or not 1 <= samples <= self.spec.batch_size):
            raise InvalidInputError("samples", samples, f"an integer in [1, {self.spec.batch_size}]")
        if not isinstance(worker, str):
            raise InvalidInputError("worker", worker, "a node name")
        if dense_grad is not None and self.dense is not None and np.shape(dense_grad) != self.dense.params.shape:
            raise InvalidInputError("dense_grad", np.shape(dense_grad), f"shape {self.dense.params.shape}")

    def lookup(self, ids: Any, dense: bool = False, lengths: Any = None) -> dict[str, Any]:
        """The rows of ``ids`` (see ``_check_ids``): one array per table, or with ``lengths`` every
        table's in one array; on PS 0 with ``dense``, the dense parameters too."""
        every, counts = self._check_ids(ids, lengths)
        self._check_packable(lengths)
        with self.lock:
            self.requests += 1
            taken = [(store, store.gather(slots)) for store, slots in self._by_store(every, counts)]
            params = self.dense.params.copy() if dense and self.dense is not None else None
        if lengths is not None:  # one store: the tables share their dim
            return {"rows": taken[0][1], "dense": params}
        per_table: list[np.ndarray] = [None] * len(self.tables)
        for store, rows in taken:
            for t, part in zip(store.tables, np.split(rows, np.cumsum(counts[store.tables])[:-1])):
                per_table[t] = part
        return {"rows": per_table, "dense": params}

    def _check_packable(self, lengths: Any) -> None:
        if lengths is not None and len({t.dim for t in self.tables}) > 1:
            raise InvalidInputError("lengths", "given", "none: the tables have several dims, so ids and gradients "
                                    "go one array per table")

    def push(self, ids: Any, grads: Any, batch: int, samples: int, worker: str,
             dense_grad: np.ndarray | None = None, lengths: Any = None) -> bool:
        """Apply the sparse gradients of ``batch`` (its first sample) and, on PS 0, its dense
        gradient — unless this state already holds the batch. Returns whether it was applied.
        ``ids`` as ``lookup`` takes them; ``grads`` one (ids, dim) array per table, or with
        ``lengths`` every table's rows in one."""
        every, counts = self._check_ids(ids, lengths)
        self._check_packable(lengths)
        self._check_push(counts, lengths is not None, grads, batch, samples, worker, dense_grad)
        batch = int(batch)
        with self.lock:
            if batch in self.batches:
                self._log("refused", b=batch, n=samples, w=worker)
                return False
            if dense_grad is not None and self.dense is None:
                raise StaleGeneration("dense parameters are not initialised (restored without them)")
            for store, slots in self._by_store(every, counts):
                g = (np.asarray(grads, dtype=np.float32) if lengths is not None  # one store
                     else np.concatenate([grads[t] for t in store.tables], dtype=np.float32))
                store.adagrad(slots, g, self.spec.learning_rate)
            if dense_grad is not None:
                self._adam(np.asarray(dense_grad, dtype=np.float32))
            self.batches.add(batch)
            self._log("apply", b=batch, n=samples, w=worker)
            return True

    def init_dense(self, params: np.ndarray) -> bool:
        """Set the dense parameters once (the first worker's deterministic init)."""
        with self.lock:
            if self.dense is None:
                params = np.asarray(params, dtype=np.float32)
                self.dense = DenseState(params.copy(), np.zeros_like(params), np.zeros_like(params))
                return True
            return False

    def _adam(self, grad: np.ndarray) -> None:
        """Adam (Kingma & Ba 2015) with decoupled weight decay λ (AdamW): θ −= lr·(m̂/(√v̂ + ε) + λ·θ)."""
        d = self.dense
        d.step += 1
        b1, b2 = self.spec.adam_betas
        d.m = b1 * d.m + (1 - b1) * grad
        d.v = b2 * d.v + (1 - b2) * grad * grad
        m_hat = d.m / (1 - b1**d.step)
        v_hat = d.v / (1 - b2**d.step)
        step = m_hat / (np.sqrt(v_hat) + ADAM_EPS)
        if self.spec.dense_weight_decay:
            step += self.spec.dense_weight_decay * d.params
        d.params -= self.spec.dense_learning_rate * step

    def save(self, path: str) -> dict[str, Any]:
        """Write this PS's state (rows, accumulators, applied batches; dense on PS 0) to ``path``."""
        path = self._inside("path", path)
        with self.lock:
            arrays: dict[str, np.ndarray] = {}
            for t, table in enumerate(self.tables):
                for name, value in table.export().items():
                    arrays[f"t{t}_{name}"] = value
            if self.dense is not None:
                arrays.update(dense=self.dense.params, dense_m=self.dense.m, dense_v=self.dense.v,
                              dense_step=np.array(self.dense.step))
            arrays["batches"] = np.array(sorted(self.batches), dtype=np.int64)
            arrays["ps_index"] = np.array(self.index)
            tmp = Path(path).with_suffix(".tmp.npz")
            with open(tmp, "wb") as f:  # durable before it is named: a crash leaves no half file
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._log("save", path=str(path))
            if self._journal is not None:
                os.fsync(self._journal.fileno())  # what the checkpoint holds is on disk with it
            return {"rows": int(sum(t.used for t in self.tables)), "batches": len(self.batches),
                    "sha256": sha256_file(path)}

    def restore(self, paths: list[str], generation: int, journal: str | None = None) -> dict[str, Any]:
        """Replace the state by the rows this PS owns in the checkpoint files of *all* PS of the
        checkpoint (any count: this is the re-partition), dense from PS 0's file; the applied
        batches are those every file holds (a batch pushed to some PS only is pushed again). A file
        that cannot be read whole raises :class:`DamagedCheckpoint`: the PS serves no generation
        then, and holds no part of the file."""
        if not isinstance(paths, list):
            raise InvalidInputError("paths", paths, "a list of checkpoint files")
        paths = [str(self._inside(f"paths[{i}]", path)) for i, path in enumerate(paths)]
        self._open_journal(journal)
        with self.lock:
            self.tables = self._empty_tables() if paths else self._start_tables()
            self.dense = None
            batches = None
            for path in paths:
                try:
                    with np.load(path) as data:
                        for t, table in enumerate(self.tables):
                            table.absorb(data[f"t{t}_ids"], data[f"t{t}_rows"], data[f"t{t}_acc"])
                        held = set(data["batches"].tolist())
                        batches = held if batches is None else batches & held
                        if int(data["ps_index"]) == 0 and self.index == 0:  # the dense parameters live on PS 0
                            if "dense" in data:
                                self.dense = DenseState(data["dense"].copy(), data["dense_m"].copy(),
                                                        data["dense_v"].copy(), int(data["dense_step"]))
                except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as err:
                    self.generation, self.tables, self.dense, self.batches = -1, self._empty_tables(), None, set()
                    raise DamagedCheckpoint(f"{path}: {type(err).__name__}: {err}") from None
            self.batches = batches or set()
            self.generation = generation
            self._log("restore", ps=self.index, of=self.count, **{"from": list(paths)})
            return {"rows": int(sum(t.used for t in self.tables)), "generation": generation}

    def set_generation(self, generation: int, journal: str | None = None) -> None:
        """Serve ``generation``: a new job's PS, from the job's first state (``_start_tables``)."""
        self._open_journal(journal)
        with self.lock:
            if self.generation < 0 and self.spec.init_from:
                self.tables = self._start_tables()
            self.generation = generation
            self._log("start", ps=self.index, of=self.count)


    def serving(self) -> int:
        """The generation this PS serves (−1: none yet — a new process the master has not restored)."""
        return self.generation


_METHODS = {"lookup", "push", "init_dense", "save", "restore", "set_generation", "serving"}
#: Requests that carry the caller's generation and are refused when it is not the current one.
_DATA_METHODS = {"lookup", "push", "init_dense", "save"}


def serve(spec: JobSpec, index: int, count: int, port: int = 0, ready_file: Path | None = None,
          host: str = "127.0.0.1", root: Path | None = None) -> None:
    """Run a PS until SIGTERM; writes ``host:port`` to ``ready_file`` once it listens. ``root``: the
    job's folder, where every checkpoint and journal path it is sent must lie."""
    ps = ParameterServer(spec, index, count, root)
    server = Server(ps.handle, spec.key, host=host, port=port).start()
    if ready_file is not None:
        announce(ready_file, server.address)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.close()
