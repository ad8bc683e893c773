"""One export written by a process of its own, as a job's finishing worker writes it:

    python export_process.py URL JOB_ID VALUE WORKDIR [DIE_AT]

The model is the default DLRM over three tables of dim 4, every dense parameter set to VALUE; the
PS checkpoint is two files (two PS) whose rows are all VALUE. With DIE_AT, the process SIGKILLs
itself in ``export_model``'s DIE_AT-th heartbeat (it beats once after each table). Prints the
export's URL and the heartbeats as JSON."""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import torch

from airflow_dlrover.runtime.dlrm import build_model
from airflow_dlrover.runtime.export import export_model
from airflow_dlrover.runtime.spec import JobSpec

TABLES, DIM = 3, 4
#: the ids each PS stored per table: PS i holds the ids ≡ i (mod 2), written unsorted
IDS = [np.arange(20, dtype=np.int64)[::-1] * (t + 1) for t in range(TABLES)]


def spec(url: str, job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, samples=1000, table_sizes=(100,) * TABLES, embedding_dim=DIM, bottom_mlp=(8, DIM),
                   top_mlp=(8,), export=url)


def main(url: str, job_id: str, value: float, workdir: str, die_at: int = 0) -> None:
    os.makedirs(workdir, exist_ok=True)
    files = []
    for ps in range(2):
        arrays = {}
        for t, ids in enumerate(IDS):
            mine = ids[ids % 2 == ps]
            arrays[f"t{t}_ids"] = mine
            arrays[f"t{t}_rows"] = np.full((len(mine), DIM), value, np.float32)
        files.append(os.path.join(workdir, f"ps-{ps}.npz"))
        np.savez(files[-1], **arrays)
    job = spec(url, job_id)
    model = build_model(job)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    beats = 0

    def heartbeat():
        nonlocal beats
        beats += 1
        if beats == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    result = export_model(job, model, files, {"loss": 0.5, "auc": 0.75, "samples": 100}, heartbeat=heartbeat)
    print(json.dumps({"export": result, "heartbeats": beats}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], *(int(a) for a in sys.argv[5:]))
