"""A prior for a job with no history of its own, from jobs like it."""

import math
from dataclasses import replace

import numpy as np
import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.model import fit_throughput
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.similarity import (
    SIMILARITY_WEIGHTS, SimilarPrior, similar_prior, similar_probe_count, similarity,
)
from airflow_dlrover.optimizer.types import InvalidInputError, Quota
from airflow_dlrover.runtime.spec import JobSpec
from sim.synthetic import model_samples

pytestmark = pytest.mark.unit

DEMO = JobSpec("demo").signature()


def test_the_same_layout_is_alike_and_each_field_counts_by_its_weight():
    assert similarity(DEMO, dict(DEMO)) == 1.0
    assert similarity(DEMO, DEMO | {"lookups": 52}) == pytest.approx(0.5)  # a factor 2 at weight 1
    assert similarity(DEMO, DEMO | {"batch": 1024}) == pytest.approx(2 ** -SIMILARITY_WEIGHTS["batch"])
    assert similarity(DEMO, DEMO | {"model": "pkg.mod:build"}) == 0.0  # another dense network
    assert similarity(DEMO, DEMO | {"trainer": "allreduce"}) == 0.0
    missing = {k: v for k, v in DEMO.items() if k != "dense"}
    assert similarity(DEMO, missing) == pytest.approx(math.exp(-SIMILARITY_WEIGHTS["dense"]))
    with pytest.raises(InvalidInputError, match="signature.dim"):
        similarity(DEMO, DEMO | {"dim": -16})


def test_signatures_of_the_runtime_and_of_a_trainer():
    assert DEMO == {"trainer": "runtime", "batch": 512, "lookups": 26, "rows": 520_000, "dim": 16.0, "dense": 13,
                    "model": "", "dense_params": (13 + 1) * 64 + (64 + 1) * 16 + (16 + 351 + 1) * 64 + 65 * 32 + 33}
    wider = JobSpec("wide", embedding_dim=64, bottom_mlp=(64, 64)).signature()
    assert wider["dim"] == 64 and similarity(DEMO, wider) < C.SIMILAR_PRIOR_MIN_SIMILARITY  # 4× wider: cold
    trainer = {"command": ["python", "train.py", "--data", "/day/2026-12-06"], "kind": "allreduce"}
    a = JobSpec("a", samples=100, trainer=trainer).signature()
    b = JobSpec("b", samples=100, trainer=trainer | {"command": ["python", "train.py", "--data", "/other"]}).signature()
    assert a == b == {"trainer": "allreduce", "program": "python train.py", "batch": 512}
    assert similarity(a, DEMO) == 0.0


def test_the_prior_averages_the_alike_models_by_similarity_and_skips_the_unlike():
    one = fit_throughput(model_samples(seed=1), leave_one_out=False)
    two = replace(one, params={k: 2.0 * v for k, v in one.params.items()})
    other_form = replace(one, sharpness=one.sharpness + 1.0, params={k: 100.0 * v for k, v in one.params.items()})
    half = DEMO | {"lookups": 52}
    found = similar_prior(DEMO, [("a", DEMO, one), ("b", half, two), ("c", DEMO | {"batch": 1024}, other_form),
                                 ("d", DEMO | {"trainer": "allreduce"}, two)])
    assert found.similarity == 1.0 and [name for name, _ in found.sources] == ["a", "b"]
    assert np.allclose(found.throughput.theta, (1.0 * one.theta + 0.5 * two.theta) / 1.5)
    assert found.throughput.sharpness == one.sharpness
    assert SimilarPrior.from_dict(found.to_dict()).sources == found.sources
    assert similar_prior(DEMO, [("far", DEMO | {"lookups": 26 * 3}, one)]) is None  # a third alike: cold
    assert similar_prior(DEMO, []) is None


def test_the_more_alike_the_prior_the_fewer_the_probes():
    assert similar_probe_count(1.0, 10) == C.MIN_PROBES_SIMILAR
    assert similar_probe_count(0.0, 10) == 10
    assert similar_probe_count(0.5, 10) == C.MIN_PROBES_SIMILAR + 4
    assert similar_probe_count(0.9, 1) == 1
    with pytest.raises(InvalidInputError, match="similarity"):
        similar_probe_count(1.5, 10)
    quota = Quota(cpu=32, memory_mb=128 * 1024)
    prior = fit_throughput(model_samples(seed=2), leave_one_out=False)
    cold = design_probes(quota, prior=prior)
    alike = design_probes(quota, prior=prior, similarity=1.0)
    assert len(alike) == C.MIN_PROBES_SIMILAR < len(cold)
    assert len(design_probes(quota, prior=prior, similarity=0.6)) == similar_probe_count(0.6, len(cold))
    assert alike.iloc[0].to_dict() == cold.iloc[0].to_dict()  # the most informative under the prior first
