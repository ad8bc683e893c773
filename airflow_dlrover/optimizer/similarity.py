"""A prior for a job with no history of its own, from the models of jobs like it.

Two jobs cost alike per sample as far as their work per sample is alike: the tables a sample looks
up and their width, the dense features and network, the batch, and the trainer that runs them. A
job's *signature* holds these (``runtime.spec.JobSpec.signature``: our runtime's layout;
``launchers.contract.trainer_signature``: a trainer of the user's, whose layout we do not know).
The similarity of two signatures a, b is

    s(a, b) = exp(−Σ_k w_k · |ln(a_k / b_k)|)        (0 where a categorical field differs)

over their numeric fields k with the weights ``SIMILARITY_WEIGHTS`` (a field one of them lacks
counts as a factor e of difference): s = 1 for the same layout, ½ for one whose lookups a sample
makes, at weight 1, differ by a factor 2. The weights are ours, chosen before any measurement.

The prior (:func:`similar_prior`): the throughput models of the candidates at least
``SIMILAR_PRIOR_MIN_SIMILARITY`` alike that share the form of the most alike (its kind, sharpness
and core curve), θ = Σ sᵢ·θᵢ / Σ sᵢ; with s the largest similarity. It carries no memory model:
tables and their growth are the job's own, measured by its probes. The profile then measures
:func:`similar_probe_count` probes, the fewer the more alike the prior, and the fit pulls toward
the prior with ``WARM_START_PRIOR_WEIGHT`` × s (``controller.begin``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.model import PARAMETERS, ThroughputModel
from airflow_dlrover.optimizer.types import InvalidInputError

#: Weight of each numeric field's log-ratio: what a sample costs scales with its lookups and their
#: width, less with the dense network (a few MLP layers beside 26 lookups), the batch (per-step
#: overheads), and least with the rows (the PS's cache: a table 10× larger touches other rows). (ours)
SIMILARITY_WEIGHTS = {"lookups": 1.0, "dim": 1.0, "dense": 0.5, "dense_params": 0.5, "batch": 0.5, "rows": 0.25}


@dataclass(frozen=True)
class SimilarPrior:
    """A prior from other jobs: the combined throughput model, its similarity s and the jobs it
    came from (name, similarity), most alike first."""

    throughput: ThroughputModel
    similarity: float
    sources: tuple[tuple[str, float], ...]

    def describe(self) -> str:
        names = ", ".join(f"{name} ({s:.2f})" for name, s in self.sources)
        return f"a prior from {len(self.sources)} similar job{'s' if len(self.sources) > 1 else ''}: {names}"

    def to_dict(self) -> dict[str, Any]:
        return {"throughput": self.throughput.to_dict(), "similarity": self.similarity,
                "sources": [list(source) for source in self.sources]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SimilarPrior":
        return cls(ThroughputModel.from_dict(data["throughput"]), float(data["similarity"]),
                   tuple((str(name), float(s)) for name, s in data["sources"]))


def similarity(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """s(a, b) of two signatures (see the module docstring): a dict of numeric fields (> 0) and
    categorical ones (strings, compared equal)."""
    distance = 0.0
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if key in SIMILARITY_WEIGHTS:
            if x is None or y is None:
                distance += SIMILARITY_WEIGHTS[key]
            elif x != y:
                if not (_positive(x) and _positive(y)):
                    raise InvalidInputError(f"signature.{key}", x if not _positive(x) else y, "a number > 0")
                distance += SIMILARITY_WEIGHTS[key] * abs(math.log(float(x) / float(y)))
        elif x != y:
            return 0.0
    return math.exp(-distance)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def similar_prior(signature: Mapping[str, Any], candidates: Iterable[tuple[str, Mapping[str, Any], ThroughputModel]],
                  ) -> SimilarPrior | None:
    """The prior of a job of ``signature`` from ``candidates`` (name, signature, throughput model
    of each other job: its own prior), None when none is ``SIMILAR_PRIOR_MIN_SIMILARITY`` alike."""
    scored = sorted(((similarity(signature, sig), name, model) for name, sig, model in candidates),
                    key=lambda c: -c[0])
    scored = [c for c in scored if c[0] >= C.SIMILAR_PRIOR_MIN_SIMILARITY]
    if not scored:
        return None
    best = scored[0][2]
    alike = [(s, name, m) for s, name, m in scored
             if (m.allreduce, m.sharpness, tuple(m.scaling)) == (best.allreduce, best.sharpness, tuple(best.scaling))]
    weights = np.array([s for s, _, _ in alike])
    theta = weights @ np.array([m.theta for _, _, m in alike]) / weights.sum()
    combined = replace(best, params=dict(zip(PARAMETERS, map(float, theta))))
    return SimilarPrior(combined, float(scored[0][0]), tuple((name, float(s)) for s, name, _ in alike))


def similar_probe_count(similarity_: float, cold_count: int) -> int:
    """Probes for a job whose prior is ``similarity_`` alike: ``MIN_PROBES_SIMILAR`` for the same
    layout, growing linearly to a cold profile's ``cold_count`` as s falls to 0 —
    MIN + round((1 − s)·(cold − MIN)), halves up."""
    if not 0.0 <= similarity_ <= 1.0:
        raise InvalidInputError("similarity", similarity_, "a number in [0, 1]")
    least = min(C.MIN_PROBES_SIMILAR, cold_count)
    return least + math.floor(round((1.0 - similarity_) * (cold_count - least), 9) + 0.5)
