"""Held-out metrics of a model's scores: log loss and ROC AUC. The job computes them itself, on the
held-out split, in its finishing worker (``Worker._finish``); an exported model, on any data
(``runtime.export.ExportedModel``)."""

from __future__ import annotations

import numpy as np

from airflow_dlrover.runtime.data import roc_auc


def metrics(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """``{"loss", "auc", "samples"}``: mean log loss ``log(1 + e^{−z}) + (1 − y)·z`` of logits ``z``
    (computed stably), AUC (NaN where one class is missing), and the number of rows scored."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    if len(y) == 0:
        return {"loss": float("nan"), "auc": float("nan"), "samples": 0}
    loss = float(np.mean(np.logaddexp(0.0, -z) + (1.0 - y) * z))
    try:
        auc = roc_auc(y, z)
    except ValueError:
        auc = float("nan")
    return {"loss": loss, "auc": auc, "samples": int(len(y))}
