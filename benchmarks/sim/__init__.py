"""What stands in for a real cluster, shared by the benchmarks and the tests.

:mod:`sim.cluster`, :mod:`sim.policies`, :mod:`sim.run`: the cluster simulator and its policies.
:mod:`sim.truth`, :mod:`sim.queueing`: hidden "true" performance families, of other forms than the
optimizer's closed-form model, against which the optimizer is judged. :mod:`sim.synthetic`:
samples of the optimizer's own form with known θ. :mod:`sim.kubernetes_api`: kmock's Kubernetes
API emulator with a kubelet and a job master, for the Kubernetes launcher.
"""
