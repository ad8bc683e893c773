"""Held-out evaluation of a (running or finished) job: loss and AUC, read through the PS."""

from __future__ import annotations

import numpy as np
import torch

from airflow_dlrover.runtime.dlrm import auc, build_model, load_flat
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer
from airflow_dlrover.runtime.worker import source_for


def held_out_range(spec: JobSpec, source) -> tuple[int, int]:
    """Synthetic: the ``eval_samples`` after the training range. A file: its last rows."""
    if spec.data == "synthetic":
        return spec.samples, spec.samples + spec.eval_samples
    return spec.samples, len(source)


def evaluate(spec: JobSpec, ps_addresses: list[str], generation: int, batch_size: int = 4096) -> dict[str, float]:
    source = source_for(spec)
    start, stop = held_out_range(spec, source)
    if stop <= start:
        return {"loss": float("nan"), "auc": float("nan"), "samples": 0}
    peers = [Peer((a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])), spec.key) for a in ps_addresses]
    p = len(peers)
    model = build_model(spec)
    model.eval()
    scores, labels, losses = [], [], []
    try:
        dense_loaded = False
        for offset in range(start, stop, batch_size):
            batch = source.samples(offset, min(offset + batch_size, stop))
            uniques, inverses = zip(*(np.unique(batch.sparse[:, t], return_inverse=True) for t in range(batch.sparse.shape[1])))
            replies = [peers[k].call("lookup", generation=generation, ids=[u[u % p == k] for u in uniques], dense=not dense_loaded and k == 0)
                       for k in range(p)]
            if not dense_loaded:
                load_flat(model, replies[0]["dense"])
                dense_loaded = True
            embedded = []
            for t, u in enumerate(uniques):
                rows = np.empty((len(u), spec.embedding_dim), dtype=np.float32)
                for k in range(p):
                    rows[u % p == k] = replies[k]["rows"][t]
                embedded.append(rows[inverses[t]])
            with torch.no_grad():
                logits = model(torch.from_numpy(batch.dense), torch.from_numpy(np.stack(embedded, axis=1)))
                label = torch.from_numpy(batch.label)
                losses.append(float(torch.nn.functional.binary_cross_entropy_with_logits(logits, label, reduction="sum")))
            scores.append(logits.numpy())
            labels.append(batch.label)
    finally:
        for peer in peers:
            peer.close()
    y, s = np.concatenate(labels), np.concatenate(scores)
    return {"loss": sum(losses) / len(y), "auc": auc(y, s), "samples": int(len(y))}
