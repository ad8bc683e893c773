"""Simulators that stand in for a real cluster.

:mod:`sim.queueing` is a discrete-event queueing simulation of parameter-server
DLRM training. It is a different model family from the optimizer's closed-form throughput model, so
it can serve as a hidden "true" performance function against which the optimizer is checked.
"""
