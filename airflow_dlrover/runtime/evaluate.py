"""Held-out evaluation of a (running or finished) job: loss and AUC, read through the PS."""

from __future__ import annotations

import numpy as np
import torch

from airflow_dlrover.runtime.data import roc_auc
from airflow_dlrover.runtime.dlrm import build_model, load_flat
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, parse_address
from airflow_dlrover.runtime.worker import gather, route, source_for


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
    peers = [Peer(parse_address(a), spec.key) for a in ps_addresses]
    p = len(peers)
    model = build_model(spec)
    model.eval()
    scores, labels, losses = [], [], []
    try:
        dense_loaded = False
        for offset in range(start, stop, batch_size):
            batch = source.samples(offset, min(offset + batch_size, stop))
            uniques, inverses, owner = route(batch.sparse, p)
            replies = [peers[k].call("lookup", generation=generation, ids=owner[k], dense=not dense_loaded and k == 0)
                       for k in range(p)]
            if not dense_loaded:
                load_flat(model, replies[0]["dense"])
                dense_loaded = True
            rows = gather(uniques, replies, spec.embedding_dim)
            embedded = [r[inverse] for r, inverse in zip(rows, inverses)]
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
    return {"loss": sum(losses) / len(y), "auc": roc_auc(y, s), "samples": int(len(y))}
