"""The profile's visiting order: a prefix of the design wherever the budget ends it."""

import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.probes import design_probes, order_probes, probes_always_measured, visiting_order
from airflow_dlrover.optimizer.types import Configuration, Quota

pytestmark = pytest.mark.unit


def test_the_minimum_is_visited_in_the_cheapest_order_and_the_rest_in_the_designs():
    design = design_probes(Quota(cpu=64, memory_mb=256 * 1024))
    always = probes_always_measured(len(design))
    assert C.MIN_PROBES_COLD <= always < len(design)
    rows = [Configuration(**row) for row in design.to_dict("records")]
    order = visiting_order(design)
    head, tail = order[:always], order[always:]
    assert head == order_probes(design.iloc[:always])
    assert set(head) == set(rows[:always]) and tail == rows[always:]
    # the head's PS change at most once per PS count in it
    ps = [c.ps for c in head]
    assert sum(a != b for a, b in zip(ps, ps[1:])) == len(set(ps)) - 1
    assert visiting_order(design.iloc[:0]) == []
