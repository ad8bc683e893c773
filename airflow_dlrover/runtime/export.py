"""The trained model as a folder a retraining DAG can ship, written atomically, and its loader.

Layout of an export (a local folder or an fsspec URL)::

    manifest.json        format, job, feature layout, model (import path + its arguments),
                         held-out metrics, samples trained, and one entry per table
    dense.pt             the dense model's state dict (torch.save)
    tables/<t>.npz       table t's trained rows: ids (sorted int64) and rows (float32, ids × dim)

A row the job never touched is not stored: its value is its deterministic initial one,
``runtime.ps.initial_rows(seed, t, id, dim)`` (the seed is in the manifest), which is what the PS
served for it. Atomic: everything is written into a sibling staging folder, the manifest last,
then moved into place (a rename on a local filesystem; on an object store, where a move is a copy,
a folder without its manifest is incomplete and :func:`load_export` refuses it: see :func:`_move`).
An export that replaces an older one moves the old one aside first and deletes it after.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.datasets import filesystem, is_local
from airflow_dlrover.runtime.layout import FeatureLayout

if TYPE_CHECKING:
    import torch

FORMAT = "airflow-dlrover-export/1"
MANIFEST = "manifest.json"


def export_model(spec, model: torch.nn.Module, checkpoint_files: list[str], metrics: dict[str, Any],
                 heartbeat=lambda: None) -> str:
    """Write the model of ``spec`` (dense ``model``, tables from the PS checkpoint files) to
    ``spec.export``; returns the export's URL. ``heartbeat`` is called after each table. A
    destination the job may not write is a user error (``InvalidInputError``); others retry."""
    try:
        return _export(spec, model, checkpoint_files, metrics, heartbeat)
    except (PermissionError, NotADirectoryError, FileExistsError) as err:
        raise InvalidInputError("export", spec.export, "a folder or URL the job's workers can write", str(err)) from None


def _export(spec, model, checkpoint_files, metrics, heartbeat) -> str:
    fs, path = filesystem(spec.export)
    path = path.rstrip("/")
    import torch

    staging = f"{path}.staging-{uuid.uuid4().hex[:8]}"
    fs.makedirs(f"{staging}/tables", exist_ok=True)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    with fs.open(f"{staging}/dense.pt", "wb") as f:
        f.write(buffer.getvalue())
    tables = []
    for t, column in enumerate(spec.layout.sparse):
        ids, rows = [], []
        for file in checkpoint_files:
            with np.load(file) as data:
                ids.append(data[f"t{t}_ids"])
                rows.append(data[f"t{t}_rows"])
        ids, rows = np.concatenate(ids), np.concatenate(rows).reshape(-1, column.dim)
        order = np.argsort(ids, kind="stable")
        with fs.open(f"{staging}/tables/{t}.npz", "wb") as f:
            np.savez(f, ids=ids[order], rows=rows[order])
        tables.append({"name": column.name, "rows": column.rows, "dim": column.dim, "stored_rows": int(len(ids)),
                       "file": f"tables/{t}.npz"})
        heartbeat()
    manifest = {
        "format": FORMAT, "job_id": spec.job_id, "created": time.time(), "layout": spec.layout.to_dict(),
        "model": spec.model, "bottom_mlp": list(spec.bottom_mlp), "top_mlp": list(spec.top_mlp), "seed": spec.seed,
        "samples_trained": spec.total_samples, "epochs": spec.epochs, "data": spec.data,
        "held_out": list(spec.held_out), "init_from": spec.init_from or None,
        "metrics": {k: metrics[k] for k in ("loss", "auc", "samples") if k in metrics}, "tables": tables,
    }
    with fs.open(f"{staging}/{MANIFEST}", "w") as f:
        f.write(json.dumps(manifest, indent=1))
    old = None
    if fs.exists(path):
        old = f"{path}.replaced-{uuid.uuid4().hex[:8]}"
        _move(fs, path, old)
    _move(fs, staging, path)
    if old is not None:
        fs.rm(old, recursive=True)
    return spec.export


def _move(fs, source: str, destination: str) -> None:
    """Move the export folder ``source`` to ``destination`` (which does not exist). On a local
    filesystem a rename. Elsewhere (an object store: no rename, no folders, and fsspec's recursive
    move fails there on the folders it lists but cannot copy) file by file, so that a folder with a
    manifest is always complete: every file is copied, the manifest last; then the source's
    manifest is deleted, then its other files. An export that replaces an older one therefore shows,
    at its URL, the old export, then none (:func:`load_export` refuses the folder), then the new one;
    the old one stays complete beside it until the new one is in place."""
    if is_local(fs):
        fs.mv(source, destination, recursive=True)
        return
    manifest = f"{source}/{MANIFEST}"
    listed = fs.find(source)
    files = [f for f in listed if f != manifest]
    if files:
        fs.copy(files, [destination + f[len(source):] for f in files])
    if manifest in listed:
        fs.copy(manifest, f"{destination}/{MANIFEST}")
        fs.rm(manifest)
    if files:
        fs.rm(source, recursive=True)


def read_manifest(url: str, field: str = "export") -> dict[str, Any]:
    """The manifest of the complete export at ``url``; ``InvalidInputError`` on ``field`` when
    there is none (a folder without its manifest is incomplete) or it is of another format."""
    fs, path = filesystem(url)
    path = path.rstrip("/")
    if not fs.exists(f"{path}/{MANIFEST}"):
        raise InvalidInputError(field, url, f"a complete export (a folder with {MANIFEST})")
    with fs.open(f"{path}/{MANIFEST}", "r") as f:
        manifest = json.loads(f.read())
    if manifest.get("format") != FORMAT:
        raise InvalidInputError(field, url, f"an export of format {FORMAT}", f"found {manifest.get('format')}")
    return manifest


def read_table(url: str, entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A table of the export at ``url`` (its manifest's ``entry``): its ids (sorted) and rows."""
    fs, path = filesystem(url)
    with fs.open(f"{path.rstrip('/')}/{entry['file']}", "rb") as f, np.load(io.BytesIO(f.read())) as data:
        return data["ids"].copy(), data["rows"].copy()


def read_dense(url: str) -> dict[str, Any]:
    """The dense model's state dict of the export at ``url``."""
    import torch

    fs, path = filesystem(url)
    with fs.open(f"{path.rstrip('/')}/dense.pt", "rb") as f:
        return torch.load(io.BytesIO(f.read()), weights_only=True)


def starting_tables_mb(spec) -> float | None:
    """PS memory of the job's tables as it starts (``FeatureLayout.table_mb`` of the rows the export
    it continues holds); None: it starts empty."""
    if not spec.init_from:
        return None
    manifest = read_manifest(spec.init_from, "init_from")
    return spec.layout.table_mb(tuple(entry["stored_rows"] for entry in manifest["tables"]))


def check_continues(spec, manifest: dict[str, Any]) -> None:
    """Raise ``InvalidInputError`` on ``init_from`` unless the job ``spec`` can start from the
    export of ``manifest``: the same dense model (import path, MLPs, dense features) and the same
    tables, in order — name, dim, bag, and the same rows for the same values: a hashed table of
    the same size (another size re-hashes every value), a vocabulary that extends the export's."""
    layout = FeatureLayout.from_dict(manifest["layout"])
    problems = []
    dense = [c.name for c in layout.dense], [c.name for c in spec.layout.dense]
    if dense[0] != dense[1]:
        problems.append(f"dense features {dense[0]} ≠ {dense[1]}")
    model = manifest["model"], manifest["bottom_mlp"], manifest["top_mlp"]
    if model != (spec.model, list(spec.bottom_mlp), list(spec.top_mlp)):
        problems.append(f"model {model[0] or 'DenseDLRM'} {model[1]}/{model[2]} ≠ "
                        f"{spec.model or 'DenseDLRM'} {list(spec.bottom_mlp)}/{list(spec.top_mlp)}")
    if len(layout.sparse) != len(spec.layout.sparse):
        problems.append(f"{len(layout.sparse)} tables ≠ {len(spec.layout.sparse)}")
    for old, new in zip(layout.sparse, spec.layout.sparse):
        same = (old.name, old.dim, old.multi_hot, old.pooling) == (new.name, new.dim, new.multi_hot, new.pooling)
        if old.vocabulary is not None:
            same = same and new.vocabulary is not None and new.vocabulary[:len(old.vocabulary)] == old.vocabulary
        else:
            same = same and new.vocabulary is None and new.table_size == old.table_size
        if not same:
            problems.append(f"table {old.name} (dim {old.dim}, {old.rows} rows) ≠ {new.name} (dim {new.dim}, "
                            f"{new.rows} rows)")
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise InvalidInputError("init_from", spec.init_from, "an export of this job's model and layout (the same "
                                "tables; a vocabulary may grow at its end)", "; ".join(problems[:3]) + more)


class ExportedModel:
    """A loaded export: ``logits(batch)`` scores a :class:`~airflow_dlrover.runtime.data.Batch`
    read through the manifest's layout."""

    def __init__(self, url: str):
        from airflow_dlrover.runtime.dlrm import build_model
        from airflow_dlrover.runtime.spec import JobSpec

        self.manifest = read_manifest(url)
        self.layout = FeatureLayout.from_dict(self.manifest["layout"])
        spec = JobSpec(job_id=self.manifest["job_id"], samples=1, data=self.manifest["data"], layout=self.layout,
                       model=self.manifest["model"], bottom_mlp=tuple(self.manifest["bottom_mlp"]),
                       top_mlp=tuple(self.manifest["top_mlp"]), seed=self.manifest["seed"])
        self.model = build_model(spec)
        self.model.load_state_dict(read_dense(url))
        self.model.eval()
        self.tables = [read_table(url, entry) for entry in self.manifest["tables"]]

    def _rows(self, t: int, ids: np.ndarray) -> np.ndarray:
        from airflow_dlrover.runtime.ps import initial_rows

        stored_ids, stored = self.tables[t]
        dim = self.layout.sparse[t].dim
        rows = initial_rows(self.manifest["seed"], t, ids, dim)
        position = np.searchsorted(stored_ids, ids)
        found = (position < len(stored_ids)) & (stored_ids[np.minimum(position, len(stored_ids) - 1)] == ids)
        rows[found] = stored[position[found]]
        return rows

    def logits(self, batch) -> np.ndarray:
        import torch

        from airflow_dlrover.runtime.lookup import embed, route

        uniques, inverses, _ = route(batch.sparse, 1)
        rows = [torch.from_numpy(self._rows(t, u)) for t, u in enumerate(uniques)]
        with torch.no_grad():
            embedded = embed(rows, inverses, batch.sparse, self.layout, torch.device("cpu"))
            return self.model(torch.from_numpy(batch.dense), embedded).numpy()


def load_export(url: str) -> ExportedModel:
    """The export at ``url`` (a folder with its manifest), loaded to score."""
    return ExportedModel(url)
