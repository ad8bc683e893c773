"""What a launch checks and fills in before any node starts (``Launcher.launch``): the dataset
indexed and its files checked against the layout, the ``standardize`` columns measured, and the
user's model imported, built and run on a small batch where the launcher runs the job's code."""

from __future__ import annotations

from dataclasses import replace

from airflow_dlrover.runtime.spec import JobSpec


def prepare(spec: JobSpec, *, check_model: bool) -> JobSpec:
    """``spec`` with its dataset index (and measured statistics); raises ``InvalidInputError``
    naming the file, the column and what is allowed. ``check_model``: the model's module is
    importable here (the local launcher); on Kubernetes it is in the image, and the workers check it."""
    if spec.data != "synthetic" and spec.dataset is None:
        from airflow_dlrover.runtime.datasets import TabularSource, scan, standardize_statistics

        spec = replace(spec, dataset=scan(spec.data, spec.layout, fragment_rows=spec.shard_size))
        stats = standardize_statistics(TabularSource(spec.dataset, spec.layout), spec.held_out[0])
        if stats:
            spec = replace(spec, layout=spec.layout.with_statistics(stats))
    if check_model and spec.model:
        from airflow_dlrover.runtime.dlrm import build_model

        build_model(spec)
    return spec
