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


def _table(**changes):
    from dataclasses import replace

    from airflow_dlrover.optimizer.transitions import measured
    return replace(measured(), **changes)


@pytest.mark.parametrize("cpu", [2.0, 8.0, 64.0])
def test_the_order_is_the_cheapest_path_through_the_probes(cpu):
    import itertools

    from airflow_dlrover.optimizer.probes import _rule_order, path_cost_s

    design = design_probes(Quota(cpu=cpu, memory_mb=cpu * 4096)).iloc[:7]
    table = _table()
    order = order_probes(design, table)
    assert sorted(map(repr, order)) == sorted(map(repr, _rule_order(design)))
    cheapest = min(path_cost_s(list(p), table) for p in itertools.permutations(order))
    assert path_cost_s(order, table) == pytest.approx(cheapest)
    assert path_cost_s(order, table) <= path_cost_s(_rule_order(design), table)


def test_the_order_follows_the_backends_costs():
    from airflow_dlrover.optimizer.probes import path_cost_s

    design = design_probes(Quota(cpu=8.0, memory_mb=32768)).iloc[:8]
    dear_joins = _table(worker_join_s=30.0, worker_leave_s=0.1)
    dear_leaves = _table(worker_join_s=0.1, worker_leave_s=30.0)
    by_joins, by_leaves = order_probes(design, dear_joins), order_probes(design, dear_leaves)
    assert path_cost_s(by_joins, dear_joins) < path_cost_s(by_leaves, dear_joins)
    assert path_cost_s(by_leaves, dear_leaves) < path_cost_s(by_joins, dear_leaves)


def test_a_profile_orders_its_probes_at_the_costs_its_first_observation_brings():
    from airflow_dlrover.optimizer.controller import Observation, begin, step

    quota = Quota(cpu=8.0, memory_mb=32768)
    state = begin(quota)
    dear_joins = _table(worker_join_s=30.0, worker_leave_s=0.1)
    state, actions = step(state, Observation(now_s=0.0, transitions=dear_joins))
    design = design_probes(quota)
    assert state.probes == tuple(visiting_order(design, dear_joins))
    assert actions[0].config == state.probes[0]  # the first probe is the new order's
    workers = [c.workers for c in state.probes[:probes_always_measured(len(design))]]
    assert sum(max(b - a, 0) for a, b in zip(workers, workers[1:])) <= sum(
        max(a - b, 0) for a, b in zip(workers, workers[1:]))  # more leaves than joins when joins are dear
