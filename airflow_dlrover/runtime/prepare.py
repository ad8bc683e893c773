"""What a launch checks and fills in before any node starts (``Launcher.launch``): the export the
job starts from checked against its model and layout, the dataset indexed and its files checked
against the layout, the ``standardize`` columns measured, the
export's destination writable, and the user's model imported, built and run on a small batch
where the launcher runs the job's code (and torch, the ``runtime`` extra, installed there)."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

#: the extra (pyproject.toml) that installs what our runtime's workers import: torch
RUNTIME_EXTRA = "runtime"


def prepare(spec: JobSpec, *, runs_here: bool) -> JobSpec:
    """``spec`` with its dataset index (and measured statistics); raises ``InvalidInputError``
    naming the file, the column and what is allowed. ``runs_here``: the job's nodes run on this
    machine (the local launcher), so its model module and export folder are checked here too; on
    Kubernetes they are the image's and the volume's, and the workers check them."""
    if runs_here:
        require_torch()
    if spec.init_from:
        spec = continued(spec)
    if spec.data != "synthetic" and spec.dataset is None:
        from airflow_dlrover.runtime.datasets import TabularSource, scan, standardize_statistics

        spec = replace(spec, dataset=scan(spec.data, spec.layout, fragment_rows=spec.shard_size))
        stats = standardize_statistics(TabularSource(spec.dataset, spec.layout), spec.held_out[0])
        if stats:
            spec = replace(spec, layout=spec.layout.with_statistics(stats))
    if runs_here and spec.export:
        check_destination(spec.export)
    if runs_here and spec.model:
        from airflow_dlrover.runtime.dlrm import build_model

        build_model(spec)
    return spec


def continued(spec: JobSpec) -> JobSpec:
    """``spec`` checked against the export it starts from (``export.check_continues``), with that
    export's ``standardize`` statistics: a continued model keeps the inputs it was trained on."""
    from airflow_dlrover.runtime.export import check_continues, read_manifest
    from airflow_dlrover.runtime.layout import FeatureLayout

    manifest = read_manifest(spec.init_from, "init_from")
    check_continues(spec, manifest)
    stats = {c.name: (c.mean, c.std) for c in FeatureLayout.from_dict(manifest["layout"]).dense
             if c.transform == "standardize" and c.mean is not None}
    return replace(spec, layout=spec.layout.with_statistics(stats)) if stats else spec


def require_torch() -> None:
    """Raise ``InvalidInputError`` naming the extra to install where torch, which our runtime's
    workers train with, is not installed in this Python (checked without importing it: ~3 s)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except ImportError:  # a meta-path finder that refuses the name
        found = False
    if not found:
        raise InvalidInputError(
            "python", sys.executable,
            f"a Python with the training runtime installed (pip install 'airflow-dlrover[{RUNTIME_EXTRA}]'), "
            "or a trainer of your own (job_args.trainer; dlrover-rm run-trainer)",
            "our runtime's workers train with torch, which is not installed there")


def check_destination(url: str) -> None:
    """A destination the job can write: its parent folder exists, or can be made, and is writable
    (checked at launch on a local filesystem; an object store's permissions show at the export)."""
    from airflow_dlrover.runtime.datasets import filesystem, is_local

    fs, path = filesystem(url)
    if not is_local(fs):
        return
    parent = os.path.dirname(path.rstrip("/")) or "/"
    try:
        fs.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise InvalidInputError("export", url, "a folder whose parent the job can create and write", str(err)) from None
    if not os.access(parent, os.W_OK):
        raise InvalidInputError("export", url, "a folder whose parent the job can write", f"{parent} is not writable")
