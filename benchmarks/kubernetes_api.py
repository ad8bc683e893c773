"""The Kubernetes launcher's own cost per operation, against the kmock API emulator on loopback
(the test's kubelet and job master of ``benchmarks/sim/kubernetes_api.py``; needs the test extra).

    python benchmarks/kubernetes_api.py [--repeats 5]

Prints, per operation, the median wall time and the number of API requests the launcher made
(the kubelet's status writes and polls left out). This is the launcher's and the client's
overhead on this machine, not a cluster's: a real API server, scheduler and image pulls add
their own seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="dlrover-bench-airflow-"))

NS = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from sim.kubernetes_api import Kubelet, KmockThread, RecordingMaster, kubeconfig
    from kubernetes import client

    from airflow_dlrover.launchers import make_launcher
    from airflow_dlrover.optimizer.types import Configuration
    from airflow_dlrover.runtime.spec import JobSpec

    plan = Configuration(workers=2, ps=2, worker_cpu=1.0, ps_cpu=1.0, worker_memory_mb=1024, ps_memory_mb=1024)
    times: dict[str, list[float]] = {}
    requests: dict[str, list[int]] = {}
    with KmockThread() as server:
        os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig(server.url, NS))}})
        configuration = client.Configuration()
        configuration.host = server.url
        v1 = client.CoreV1Api(client.ApiClient(configuration))
        with Kubelet(v1, NS) as kubelet, RecordingMaster(
                on_drain=lambda node: kubelet.terminate(f"{job}-{node}", 0, "Completed")) as master:
            launcher = make_launcher("kubernetes", tempfile.mkdtemp(), {
                "namespace": NS, "image": "bench/dlrover:1", "master_url": master.url})
            launcher.poll_s = 0.02

            def measure(name, operation):
                before = len(server.requests())
                started = time.perf_counter()
                operation()
                times.setdefault(name, []).append(time.perf_counter() - started)
                own = [r for r in server.requests(before)
                       if not r.url.path.endswith("/status") and "managed-by" not in r.params.get("labelSelector", "")]
                requests.setdefault(name, []).append(len(own))

            for repeat in range(args.repeats + 1):  # the first round warms the clients up
                job = f"bench-{repeat}"
                spec = JobSpec(job_id=job, samples=100_000, authkey="b" * 32)
                measure("launch 2 workers + 2 PS", lambda: launcher.launch(spec, plan))
                kubelet.wait_running([f"{job}-worker-0", f"{job}-worker-1"])
                measure("status", lambda: launcher.status(job))
                measure("resize: +1 worker", lambda: launcher.resize(job, replace(plan, workers=3)))
                measure("resize: -1 worker (drain)", lambda: launcher.resize(job, plan))
                measure("resize: 2 → 3 PS (re-partition)", lambda: launcher.resize(job, replace(plan, ps=3)))
                measure("relaunch a worker", lambda: launcher.relaunch(job, "worker-0", memory_mb=1536))
                measure("relaunch the master (re-own)", lambda: launcher.relaunch(job, "master"))
                measure("stop", lambda: launcher.stop(job))
                if repeat == 0:
                    times.clear()
                    requests.clear()

    print(f"Kubernetes launcher against kmock on loopback, median of {args.repeats} jobs")
    print(f"{'operation':<34} {'median s':>9} {'API requests':>13}")
    for name in times:
        print(f"{name:<34} {statistics.median(times[name]):>9.3f} {statistics.median(requests[name]):>13.0f}")


if __name__ == "__main__":
    main()
