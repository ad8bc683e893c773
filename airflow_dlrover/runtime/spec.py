"""What a training job is: model, data and schedule (``JobSpec``), shared by every process as JSON."""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.datasets import DatasetIndex
from airflow_dlrover.runtime.layout import FeatureLayout

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")
#: A job id names the job's folder (and, on Kubernetes, its objects): a safe charset, no path.
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_job_id(job_id: object, field_name: str = "job_id") -> str:
    """``job_id`` when it is a safe folder name (:data:`JOB_ID`: 1–63 letters, digits, '.', '_',
    '-', a letter or digit first, so never ``..`` nor a path); raises ``InvalidInputError`` else."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise InvalidInputError(field_name, job_id, "1 to 63 letters, digits, '.', '_' or '-', starting with a "
                                "letter or digit")
    return job_id


@dataclass(frozen=True)
class JobSpec:
    """A DLRM training job, independent of where and on how many nodes it runs.

    ``data``: ``"synthetic"``, or a Parquet/CSV/TSV file, folder, glob or fsspec URL, read through
    ``layout`` (a :class:`FeatureLayout`; default the Criteo one of ``table_sizes`` ×
    ``embedding_dim``). ``dataset`` is that data's index (``runtime.datasets.scan``), filled in at
    launch (``runtime.prepare``) before anything starts. Rows ``[0, samples)`` are trained
    ``epochs`` times each (``None``: every training row of the dataset, 200,000 synthetic ones); the
    held-out split (:attr:`held_out`) is the ``eval_samples`` after them (synthetic), or the last
    ``eval_files`` files, else the last ``eval_fraction`` of the rows. A shard is the unit the master
    hands out: ``shard_size`` samples, never crossing a fragment of the dataset or a window: each
    epoch trains the rows of a window of ``shuffle_window_rows`` in a seeded order of its own
    (:meth:`shard_rows`), the windows in one too (:meth:`window_order`); 0 keeps the data's
    order (a Parquet row group is then streamed, never held decoded). ``model``:
    ``"pkg.module:build"``, the user's dense network (``runtime.dlrm``); empty for ``DenseDLRM``.
    ``export``: the folder or URL the trained model is exported to (``runtime.export``).
    ``trainer``: a trainer of the user's instead of our runtime (``launchers.contract.TrainerSpec``
    as a mapping): then only ``job_id``, ``samples`` and ``batch_size`` apply, handed to it.
    """

    job_id: str
    samples: int | None = None
    data: str = "synthetic"
    zipf_skew: float = 1.05
    seed: int = 0
    table_sizes: tuple[int, ...] = (20_000,) * 26
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32)
    batch_size: int = 512
    shard_size: int = 8192
    epochs: int = 1
    shuffle_window_rows: int = 262_144
    learning_rate: float = 0.05  # sparse Adagrad on the PS
    dense_learning_rate: float = 0.002  # Adam on the dense parameters (held by PS 0)
    adagrad_initial_accumulator: float = 0.1  # as TensorFlow's Adagrad
    adam_betas: tuple[float, float] = (0.9, 0.999)
    dense_weight_decay: float = 0.0
    init_from: str = ""
    eval_samples: int = 20_000
    eval_fraction: float = 0.2
    eval_files: int = 0
    shard_timeout_s: float = 120.0
    checkpoint_interval_s: float = 30.0
    layout: FeatureLayout | None = None
    dataset: DatasetIndex | None = None
    model: str = ""
    export: str = ""
    #: rows that cannot be read (counted, reported, trained as nothing) before the job fails
    max_bad_rows: int = 1000
    trainer: dict | None = None
    authkey: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        set_ = object.__setattr__
        set_(self, "bottom_mlp", tuple(int(t) for t in self.bottom_mlp))
        set_(self, "top_mlp", tuple(int(t) for t in self.top_mlp))
        set_(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        layout = self.layout
        if layout is None:
            layout = FeatureLayout.criteo(tuple(int(t) for t in self.table_sizes), int(self.embedding_dim))
        set_(self, "layout", FeatureLayout.from_dict(layout.to_dict() if isinstance(layout, FeatureLayout) else layout))
        set_(self, "table_sizes", self.layout.table_sizes)
        if isinstance(self.dataset, dict):
            set_(self, "dataset", DatasetIndex(**self.dataset))
        if self.samples is None and self.data == "synthetic" and self.trainer is None:
            set_(self, "samples", 200_000)
        dims = set(self.layout.dims)
        checks = {
            "samples": self.samples is None or self.samples >= 1, "batch_size": self.batch_size >= 1,
            "shard_size": self.shard_size >= 1, "embedding_dim": self.embedding_dim >= 1,
            "eval_fraction": 0 <= self.eval_fraction < 1, "eval_files": self.eval_files >= 0,
            "max_bad_rows": self.max_bad_rows >= 0,
            "zipf_skew": math.isfinite(self.zipf_skew) and self.zipf_skew >= 0,
            "bottom_mlp": len(self.bottom_mlp) >= 1 and (bool(self.model) or len(dims) > 1 or self.bottom_mlp[-1] in dims),
            "model": not self.model or _IMPORT_PATH.fullmatch(self.model) is not None,
            "epochs": isinstance(self.epochs, int) and self.epochs >= 1,
            "shuffle_window_rows": isinstance(self.shuffle_window_rows, int) and self.shuffle_window_rows >= 0,
            "learning_rate": _positive(self.learning_rate),
            "dense_learning_rate": _positive(self.dense_learning_rate),
            "adagrad_initial_accumulator": _positive(self.adagrad_initial_accumulator),
            "adam_betas": len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "dense_weight_decay": math.isfinite(self.dense_weight_decay) and self.dense_weight_decay >= 0,
            "shard_timeout_s": _positive(self.shard_timeout_s),
            "checkpoint_interval_s": _positive(self.checkpoint_interval_s),
        }
        allowed = {"bottom_mlp": "a last layer equal to the tables' embedding dim", "eval_fraction": "0 ≤ x < 1",
                   "zipf_skew": "a finite number ≥ 0 (0 = uniform ids)",
                   "model": "an import path pkg.module:function", "epochs": "an integer ≥ 1",
                   "shuffle_window_rows": "an integer ≥ 0 (0: the data's order)",
                   "adam_betas": "two numbers in [0, 1)", "dense_weight_decay": "a finite number ≥ 0"}
        for name, ok in checks.items():
            if not ok:
                raise InvalidInputError(name, getattr(self, name), allowed.get(name, "a finite number > 0"))
        if self.data == "synthetic" and any(c.multi_hot or c.vocabulary for c in self.layout.sparse):
            raise InvalidInputError("layout.sparse", "multi_hot/vocabulary", "hashed single-id tables with "
                                    "data=synthetic (the generator draws one id per table): declare them for a dataset")
        if len(dims) > 1 and not self.model:
            raise InvalidInputError("layout.sparse[].dim", sorted(dims), "one embedding dim for every table with the "
                                    "default DenseDLRM (its dot-product interaction needs it), or a model of your own")
        if self.dataset is not None:
            available = self.held_out[0]
            if available < 1:
                raise InvalidInputError("eval_files" if self.eval_files else "eval_fraction",
                                        self.eval_files or self.eval_fraction,
                                        f"a held-out split that leaves training rows (the dataset has {self.dataset.rows})")
            if self.samples is None:
                set_(self, "samples", available)
            elif self.samples > available:
                raise InvalidInputError("samples", self.samples, f"≤ the {available} training rows of {self.data} (the "
                                        "rows after them are held out for evaluation)")

    @property
    def held_out(self) -> tuple[int, int]:
        """The held-out rows ``[start, stop)``: see the class docstring."""
        if self.dataset is None:
            return self.samples, self.samples + self.eval_samples
        rows = self.dataset.rows
        if self.eval_files:
            files = self.dataset.fragment_file
            first = len(self.dataset.files) - self.eval_files
            if first < 1:
                return 0, rows
            starts = self.dataset.fragment_starts
            return starts[next(i for i, f in enumerate(files) if f >= first)], rows
        return rows - math.ceil(self.eval_fraction * rows), rows

    def signature(self) -> dict[str, Any]:
        """What a sample costs, for a prior from similar jobs (``optimizer.similarity``): the
        lookups a sample makes and their mean width, the table rows, the dense features, the
        dense network (its parameters: DenseDLRM's MLPs; a model of the user's by its import
        path) and the batch; a trainer of the user's by its kind and program
        (``launchers.contract.trainer_signature``)."""
        if self.trainer is not None:
            from airflow_dlrover.launchers.contract import trainer_signature

            return trainer_signature(self.trainer, self.batch_size)
        layout = self.layout
        signature: dict[str, Any] = {"trainer": "runtime", "batch": self.batch_size,
                                     "lookups": len(layout.sparse), "rows": sum(layout.table_sizes),
                                     "dim": sum(layout.dims) / len(layout.dims) if layout.dims else None,
                                     "dense": layout.num_dense or None, "model": self.model}
        if not self.model:
            signature["dense_params"] = _mlp_parameters(layout.num_dense, self.bottom_mlp) + _mlp_parameters(
                _interaction_width(len(layout.sparse), self.bottom_mlp[-1]), self.top_mlp + (1,))
        return {k: v for k, v in signature.items() if v is not None}

    @property
    def total_samples(self) -> int | None:
        """The samples the job trains: every row of ``[0, samples)``, ``epochs`` times (None: the
        dataset is not indexed yet)."""
        return None if self.samples is None else self.samples * self.epochs

    @cached_property
    def windows(self) -> tuple[int, ...]:
        """The edges of an epoch's windows, the row ranges whose rows an epoch shuffles together:
        ``shuffle_window_rows`` rows each (a worker decodes a window whole, once per epoch, and
        trains its shards from it); with 0, the dataset's fragments, in order. Synthetic rows are
        drawn independently of their neighbours, so a shard is shuffle enough: one window."""
        if self.samples is None:
            raise ValueError(f"job {self.job_id}: the dataset {self.data} is not indexed yet (runtime.prepare)")
        if self.dataset is None:
            return 0, self.samples
        if not self.shuffle_window_rows:
            return tuple(a for a in self.dataset.fragment_starts if a < self.samples) + (self.samples,)
        return tuple(range(0, self.samples, self.shuffle_window_rows)) + (self.samples,)

    @cached_property
    def epoch_bounds(self) -> tuple[int, ...]:
        """One epoch's shards: shard ``s`` is samples ``[bounds[s], bounds[s+1])`` of the epoch,
        ``shard_size`` at most, inside one window and one fragment (a Parquet row group, a run of
        text lines) of the dataset."""
        edges = set(self.windows)
        if self.dataset is not None:
            edges.update(a for a in self.dataset.fragment_starts if a < self.samples)
        edges = sorted(edges)
        bounds = [0]
        for a, b in zip(edges, edges[1:]):
            bounds.extend(range(a + self.shard_size, b, self.shard_size))
            bounds.append(b)
        return tuple(bounds)

    @cached_property
    def shard_bounds(self) -> tuple[int, ...]:
        """Shard ``i`` is the job's samples ``[bounds[i], bounds[i+1])``: the epoch's shards, one
        epoch after the other (see the class docstring)."""
        one = self.epoch_bounds
        return one + tuple(e * self.samples + b for e in range(1, self.epochs) for b in one[1:])

    @property
    def shards_per_epoch(self) -> int:
        return len(self.epoch_bounds) - 1

    @property
    def num_shards(self) -> int:
        return len(self.shard_bounds) - 1

    def shard_range(self, shard: int) -> tuple[int, int]:
        return self.shard_bounds[shard], self.shard_bounds[shard + 1]

    def shard_of(self, sample: int) -> int:
        return bisect.bisect_right(self.shard_bounds, sample) - 1

    def epoch_of(self, shard: int) -> int:
        return shard // self.shards_per_epoch

    def window_of(self, shard: int) -> int:
        """The window a shard's rows lie in (in every epoch)."""
        return bisect.bisect_right(self.windows, self.epoch_bounds[shard % self.shards_per_epoch]) - 1

    def window_order(self, epoch: int) -> np.ndarray:
        """The rank of each window in ``epoch``'s visiting order: a permutation seeded by
        (``seed``, epoch); the data's order without a shuffle."""
        count = len(self.windows) - 1
        if not self.shuffle_window_rows:
            return np.arange(count)
        return np.argsort(np.random.default_rng((self.seed, epoch, 0)).permutation(count))

    def shard_rows(self, shard: int) -> tuple[int, int, np.ndarray | None]:
        """``(first, last, order)``: the shard trains rows ``first + order`` of ``[first, last)``,
        in that order (None: every row of the range, as read). Epoch e's samples ``[a, b)`` of
        window ``[A, B)`` are the rows ``A + π[a−A : b−A]``, π the window's permutation seeded by
        (``seed``, e, ``A``): each epoch trains every row once, in its own order, the same after a
        restart. Without a shuffle, the samples' own rows in the data's order."""
        a, b = self.shard_range(shard)
        epoch = self.epoch_of(shard)
        a, b = a - epoch * self.samples, b - epoch * self.samples
        if not self.shuffle_window_rows:
            return a, b, None
        window = self.window_of(shard)
        first, last = self.windows[window], self.windows[window + 1]
        if self.dataset is None:  # synthetic: the shard's own rows, shuffled
            first, last = a, b
        return first, last, _permutation(self.seed, epoch, first, last - first)[a - first:b - first]

    @property
    def key(self) -> bytes:
        return self.authkey.encode()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=None if self.dataset is not None else 1)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        """Write the spec readable by its owner only (mode 0600, from the first byte): it holds the
        job's key, which authenticates every connection to the PS and so guards their unpickling."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "JobSpec":
        return cls.from_json(Path(path).read_text())


@lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, first: int, rows: int) -> np.ndarray:
    """The order of a window's rows in an epoch, drawn once per window for all its shards (read-only)."""
    order = np.random.default_rng((seed, epoch, 1, first)).permutation(rows)
    order.flags.writeable = False
    return order


def _positive(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _mlp_parameters(inputs: int, sizes: tuple[int, ...]) -> int:
    """Weights and biases of an MLP from ``inputs`` through ``sizes``."""
    total, width = 0, inputs
    for size in sizes:
        total, width = total + (width + 1) * size, size
    return total


def _interaction_width(tables: int, dim: int) -> int:
    """DenseDLRM's top MLP input: the bottom MLP's output and the dot products of every pair of
    its T + 1 vectors (``runtime.dlrm.DenseDLRM``)."""
    return dim + (tables + 1) * tables // 2
