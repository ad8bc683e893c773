"""What a training job is: model, data and schedule (``JobSpec``), shared by every process as JSON."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass(frozen=True)
class JobSpec:
    """A DLRM training job, independent of where and on how many nodes it runs.

    ``data`` is ``"synthetic"`` or the path of a Criteo-format file. Samples ``[0, samples)`` are
    trained once each (one epoch); ``eval_samples`` after them are the held-out split (synthetic;
    a file keeps its last ``eval_fraction`` rows). A shard is the unit the master hands out.
    """

    job_id: str
    samples: int = 200_000
    data: str = "synthetic"
    zipf_skew: float = 1.05
    seed: int = 0
    table_sizes: tuple[int, ...] = (20_000,) * 26
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32)
    batch_size: int = 512
    shard_size: int = 8192
    learning_rate: float = 0.05  # sparse Adagrad on the PS
    dense_learning_rate: float = 0.002  # Adam on the dense parameters (held by PS 0)
    eval_samples: int = 20_000
    eval_fraction: float = 0.2
    shard_timeout_s: float = 120.0
    checkpoint_interval_s: float = 30.0
    authkey: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", tuple(int(t) for t in self.table_sizes))
        object.__setattr__(self, "bottom_mlp", tuple(int(t) for t in self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(int(t) for t in self.top_mlp))
        checks = {
            "samples": self.samples >= 1, "batch_size": self.batch_size >= 1, "shard_size": self.shard_size >= 1,
            "embedding_dim": self.embedding_dim >= 1, "table_sizes": all(t >= 2 for t in self.table_sizes),
            "bottom_mlp": len(self.bottom_mlp) >= 1 and self.bottom_mlp[-1] == self.embedding_dim,
        }
        for name, ok in checks.items():
            if not ok:
                allowed = "a last layer equal to embedding_dim" if name == "bottom_mlp" else "positive values"
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: allowed {allowed}")

    @property
    def key(self) -> bytes:
        return self.authkey.encode()

    @property
    def num_shards(self) -> int:
        return -(-self.samples // self.shard_size)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.samples)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

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
