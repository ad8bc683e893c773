"""Day over day: which earlier export a daily run continues from (:func:`previous_export`, a DAG
macro) and whether the run's model may replace the previous one (:func:`deploy_verdict`, the
deploy gate). Imports nothing heavy: DAG files import it at parse time.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

#: How far today's held-out AUC may fall below the previous model's — both measured by the job on
#: today's held-out rows — and the model still deploy. 0.001 is the AUC change that CTR work counts
#: as significant (DCN, Wang et al. 2017; DCN-V2, 2021): a smaller drop is within a day's noise, a
#: larger one a regression to stop. The two models score the same rows, so this paired difference is
#: far less noisy than either AUC; raise it for a held-out split of a few thousand rows.
MAX_AUC_DROP = 0.001
#: Slack of the tolerance comparison: a drop equal to ``max_auc_drop`` up to float rounding passes.
_ROUNDING = 1e-12
#: An export is complete once its manifest is written (``runtime.export.MANIFEST``; that module
#: imports numpy and the dataset readers, more than a DAG file should at parse time).
MANIFEST = "manifest.json"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def previous_export(export: str, ds: str | None = None) -> str:
    """The newest complete export ``<export>/<YYYY-MM-DD>`` (a folder with ``manifest.json``)
    dated before ``ds`` (any date when None), as ``<export>/<date>``; ``''`` when there is none,
    ``export`` is empty or does not exist. The run's own ``ds`` is never chosen: a rerun of a day
    continues from the day before, not from its own output. Other names (an export's staging or
    replaced sibling) are skipped. ``export`` is a local folder or an fsspec URL."""
    if not export:
        return ""
    import fsspec

    fs, root = fsspec.core.url_to_fs(export)
    root = root.rstrip("/")
    try:
        names = [path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(root, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return ""
    days = sorted((n for n in names if _DAY.fullmatch(n) and (ds is None or n < ds)), reverse=True)
    for day in days:
        if fs.exists(f"{root}/{day}/{MANIFEST}"):
            return f"{export.rstrip('/')}/{day}"
    return ""


class Verdict(NamedTuple):
    """The deploy gate's decision and its reason (the failure message when ``deploy`` is False)."""

    deploy: bool
    reason: str


def _number(value: float | None) -> float | None:
    """``value`` as a float; None when it is missing or NaN (an AUC undefined on one-class rows)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def deploy_verdict(auc: float | None, previous_auc: float | None = None, *, min_auc: float,
                   max_auc_drop: float = MAX_AUC_DROP) -> Verdict:
    """Whether a model of held-out ``auc`` may be deployed: its AUC is known and at least
    ``min_auc``, and — when the job compared it with the model it continued from — at most
    ``max_auc_drop`` below that model's ``previous_auc`` on the same held-out rows (a drop of exactly
    ``max_auc_drop`` passes). Without a previous AUC (no previous model, or its AUC is missing or
    NaN) only ``min_auc`` applies. Every rule that fails is named in the reason."""
    auc, previous = _number(auc), _number(previous_auc)
    if auc is None:
        return Verdict(False, "the model has no held-out AUC (missing, or undefined on one-class rows): not deployed")
    failed = []
    if auc < min_auc:
        failed.append(f"AUC {auc:.4f} is below min_auc={min_auc:g}")
    if previous is not None and previous - auc > max_auc_drop + _ROUNDING:
        failed.append(f"AUC {auc:.4f} is {previous - auc:.4f} below the previous model's AUC {previous:.4f} on "
                      f"the same held-out rows, more than max_auc_drop={max_auc_drop:g}")
    if failed:
        return Verdict(False, "; ".join(failed) + ": not deployed")
    compared = (f", and at most max_auc_drop={max_auc_drop:g} below the previous model's AUC {previous:.4f}"
                if previous is not None else " (no previous model's AUC to compare with)")
    return Verdict(True, f"AUC {auc:.4f} is at least min_auc={min_auc:g}{compared}")
