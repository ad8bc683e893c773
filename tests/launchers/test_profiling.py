"""The profile's visiting order: a prefix of the design wherever the budget ends it."""

from airflow_dlrover.launchers.profiling import order_probes, visiting_order
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Configuration, Quota


def test_the_minimum_is_visited_in_the_cheapest_order_and_the_rest_in_the_designs():
    design = design_probes(Quota(cpu=64, memory_mb=256 * 1024))
    assert len(design) > C.MIN_PROBES_COLD
    rows = [Configuration(**row) for row in design.to_dict("records")]
    order = visiting_order(design)
    head, tail = order[:C.MIN_PROBES_COLD], order[C.MIN_PROBES_COLD:]
    assert head == order_probes(design.iloc[:C.MIN_PROBES_COLD])
    assert set(head) == set(rows[:C.MIN_PROBES_COLD]) and tail == rows[C.MIN_PROBES_COLD:]
    # the head's PS change at most once per PS count in it
    ps = [c.ps for c in head]
    assert sum(a != b for a, b in zip(ps, ps[1:])) == len(set(ps)) - 1
    assert visiting_order(design.iloc[:0]) == []
