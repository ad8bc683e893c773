"""A trainer of the user's on the Kubernetes launcher, against kmock's API emulator (the test plays
the kubelet, metrics-server and the trainer in the pods: ``sim.kubernetes_api.TrainerDouble``): pods of
the user's image with the contract's environment, probes as pods, a resize by relaunch, an
OOM-killed worker relaunched with more memory once, and clean deletion."""

import dataclasses
import json

import pytest
from sim.kubernetes_api import Kubelet, KmockThread, TrainerDouble, kubeconfig
from kubernetes import client

from airflow_dlrover.launchers import make_launcher
from airflow_dlrover.launchers.contract import TrainerSpec
from airflow_dlrover.lifecycle.profiling import profile_job
from airflow_dlrover.lifecycle.observer import recover
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import memory_request_mb
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.unit

NS = "training"
JOB = "ddp-daily-20261201"
IMAGE = "registry.example/team/ddp-dlrm:2.1"
TWO = Configuration(workers=2, ps=0, worker_cpu=1.5, ps_cpu=0, worker_memory_mb=2048, batch_size=256)
TRAINER = TrainerSpec(command=("python", "/app/train.py", "--rank={rank}", "--ckpt={checkpoint_dir}"), image=IMAGE,
                      grace_s=20, report_timeout_s=30)


@pytest.fixture(scope="module")
def server():
    with KmockThread() as km_thread:
        yield km_thread


RUNTIME_IMAGE = "registry.example/airflow-dlrover:0.1.0"
PROMETHEUS = dataclasses.replace(TRAINER, metrics_port=9400)


@pytest.fixture(params=[False])
def cluster(request, server, monkeypatch, tmp_path):
    """(launcher, kubelet, trainer double, core API); ``indirect`` param True: the double's
    workers serve Prometheus text."""
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig(server.url, NS)), "namespace": NS}}))
    configuration = client.Configuration()
    configuration.host = server.url
    v1 = client.CoreV1Api(client.ApiClient(configuration))
    with Kubelet(v1, NS) as kubelet, TrainerDouble(server, v1, NS, JOB, prometheus=request.param) as trainer:
        launcher = make_launcher("kubernetes", str(tmp_path), {"namespace": NS, "image": RUNTIME_IMAGE})
        launcher.poll_s = 0.02
        yield launcher, kubelet, trainer, v1
        for kind in ("pod", "service", "config_map", "secret"):
            getattr(v1, f"delete_collection_namespaced_{kind}")(NS)
        client.NetworkingV1Api(v1.api_client).delete_collection_namespaced_network_policy(NS)


def spec(trainer=TRAINER):
    return JobSpec(job_id=JOB, samples=10**9, batch_size=256, authkey="k" * 32, trainer=trainer.to_dict())


def pods(v1):
    return {p.metadata.name: p for p in v1.list_namespaced_pod(NS, label_selector=f"dlrover.io/job={JOB}").items}


def requests_since(server, mark):
    return [(r.method.name if hasattr(r.method, "name") else str(r.method).upper(), r.url.path, dict(r.params), r.data)
            for r in server.requests(mark)]


def wait_reported(launcher, workers, timeout_s=10.0):
    """Until every worker of the job has reported (the double's trainer writes a line each poll)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reports = launcher.metrics(JOB)["nodes"]
        if sum(1 for r in reports.values() if r.get("reports")) >= workers:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the workers did not report within {timeout_s:g} s")


def test_a_trainer_runs_as_pods_of_its_image_with_the_contract(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    mark = len(server.requests())
    launcher.launch(spec(), TWO)
    base = f"/api/v1/namespaces/{NS}"
    created = [(path, body) for verb, path, _, body in requests_since(server, mark)  # the launcher's (not the double's)
               if verb == "POST" and "/leases" not in path and "/metrics.k8s.io/" not in path]
    assert [path for path, _ in created] == [
        f"{base}/configmaps", f"{base}/secrets", f"{base}/services",
        f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", f"{base}/pods", f"{base}/pods"]
    config_map_uid = v1.read_namespaced_config_map(f"{JOB}-spec", NS).metadata.uid
    bodies = [body for path, body in created if path.endswith("/pods")]
    assert [b["metadata"]["name"] for b in bodies] == [f"{JOB}-worker-0", f"{JOB}-worker-1"]
    for index, body in enumerate(bodies):
        pod, (container,) = body["spec"], body["spec"]["containers"]
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": f"{JOB}-spec", "uid": config_map_uid}]
        assert body["metadata"]["labels"]["dlrover.io/job"] == JOB and body["metadata"]["labels"]["dlrover.io/role"] == "worker"
        assert container["image"] == IMAGE
        assert container["command"] == ["python", "/app/train.py", f"--rank={index}", "--ckpt=/var/lib/dlrover/job/checkpoint"]
        assert container["resources"] == {"requests": {"cpu": "1500m", "memory": "2048Mi"},
                                          "limits": {"cpu": "1500m", "memory": "2048Mi"}}
        assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
        assert pod["terminationGracePeriodSeconds"] == 20 and pod["restartPolicy"] == "Never"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RANK"] == str(index) and env["WORLD_SIZE"] == "2" and env["DLROVER_PS"] == "0"
        assert env["MASTER_ADDR"] == f"{JOB}-worker-0.{JOB}-nodes.{NS}.svc" and env["MASTER_PORT"] == "29500"
        assert env["DLROVER_METRICS_FILE"] == "/dev/stdout" and env["OMP_NUM_THREADS"] == "1"
        assert json.loads(env["TF_CONFIG"])["cluster"] == {"worker": [
            f"{JOB}-worker-0.{JOB}-nodes.{NS}.svc:2222", f"{JOB}-worker-1.{JOB}-nodes.{NS}.svc:2222"]}
        key = next(e for e in container["env"] if e["name"] == "DLROVER_JOB_KEY")
        assert key == {"name": "DLROVER_JOB_KEY", "valueFrom": {"secretKeyRef": {"name": f"{JOB}-authkey", "key": "authkey"}}}
    # the reports come from the pods' logs, the usage from the metrics API
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    wait_reported(launcher, 2)
    progress = launcher.progress(JOB)
    assert progress["state"] == "training" and progress["throughput"] == pytest.approx(3000.0)
    usage = launcher.metrics(JOB)["usage"]
    assert usage["worker-0"]["cpu_rate"] == pytest.approx(1.35)
    launcher.stop(JOB)
    assert pods(v1) == {} and not launcher.exists(JOB)


@pytest.mark.parametrize("cluster", [True], indirect=True)
def test_a_prometheus_trainer_is_scraped_by_its_pods_sidecar_and_its_reports_outlive_it(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    launcher.launch(spec(PROMETHEUS), TWO)
    for name, pod in pods(v1).items():
        (sidecar,), (container,) = pod.spec.init_containers, pod.spec.containers
        assert sidecar.name == "dlrover-reports" and sidecar.image == RUNTIME_IMAGE and sidecar.restart_policy == "Always"
        assert sidecar.command[:3] == ["python", "-m", "airflow_dlrover.scrape"]
        assert sidecar.command[sidecar.command.index("--url") + 1] == "http://127.0.0.1:9400/metrics"
        assert sidecar.resources.requests == sidecar.resources.limits == {"cpu": "50m", "memory": "64Mi"}
        assert sidecar.security_context.read_only_root_filesystem and sidecar.security_context.capabilities.drop == ["ALL"]
        assert {"name": "metrics", "containerPort": 9400} in [{"name": p.name, "containerPort": p.container_port}
                                                            for p in container.ports]
        assert {e.name: e.value for e in container.env}["DLROVER_METRICS_PORT"] == "9400"
        assert pod.metadata.annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400",
                                            "prometheus.io/path": "/metrics"}
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    wait_reported(launcher, 2)
    assert launcher.progress(JOB)["throughput"] == pytest.approx(3000.0)
    assert launcher.metrics(JOB)["usage"]["worker-0"]["cpu_rate"] == pytest.approx(1.35)  # not the sidecar's 20m
    # the trainer exits: its endpoint is gone, the scrapes stay in the sidecar's log
    for index in (0, 1):
        kubelet.terminate(f"{JOB}-worker-{index}", 0, "Completed")
    import time

    time.sleep(0.5)
    progress = launcher.progress(JOB)
    assert progress["state"] == "done" and progress["samples_done"] > 0
    assert progress["samples_done"] <= trainer.done  # what was scraped, never more than was trained
    launcher.stop(JOB)
    assert pods(v1) == {}


def test_a_trainer_without_an_image_is_refused_before_anything_is_created(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    with pytest.raises(InvalidInputError) as err:
        launcher.launch(spec(TrainerSpec(command=("python", "t.py"))), TWO)
    assert err.value.field == "trainer.image"
    assert pods(v1) == {}


def test_resize_relaunches_the_group_with_its_grace_and_measures_the_restart(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    launcher.launch(spec(), TWO)
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    mark = len(server.requests())
    three = Configuration(workers=3, ps=0, worker_cpu=1.0, ps_cpu=0, worker_memory_mb=2048, batch_size=256)
    result = launcher.resize(JOB, three)
    calls = requests_since(server, mark)
    deletes = [(path, body) for verb, path, _, body in calls if verb == "DELETE" and path.split("/")[-1].startswith(JOB)
               and "/pods/" in path]
    assert sorted(p.split("/")[-1] for p, _ in deletes) == [f"{JOB}-worker-0", f"{JOB}-worker-1"]
    assert all(body["gracePeriodSeconds"] == 20 for _, body in deletes)  # SIGTERM: the trainer checkpoints
    assert sorted(pods(v1)) == [f"{JOB}-worker-{i}" for i in range(3)]
    assert {p.spec.containers[0].resources.limits["cpu"] for p in pods(v1).values()} == {"1000m"}
    assert result["restart_s"] is not None and 0 < result["restart_s"] < 10
    [event] = [e for e in launcher.read_job(JOB)["events"] if e["event"] == "restart"]
    assert event["generation"] == 1 and launcher.restart_cost_s(JOB) == event["restart_s"]
    launcher.stop(JOB)


def test_an_oom_killed_worker_relaunches_the_group_with_more_memory_once(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    launcher.launch(spec(), TWO)
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    wait_reported(launcher, 2)  # a failure from now on is the cluster's
    kubelet.set_status(f"{JOB}-worker-1", {"phase": "Failed", "containerStatuses": [{
        "name": "worker", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
    [record] = recover(launcher, JOB, Quota(cpu=16, memory_mb=64 * 1024))
    assert record["action"] == "relaunch" and record["node"] == "worker-1"
    grown = -(-2048 * C.OOM_MEMORY_GROWTH // C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB
    assert record["memory_mb"] == grown
    assert {p.spec.containers[0].resources.limits["memory"] for p in pods(v1).values()} == {f"{int(grown)}Mi"}
    assert launcher.read_job(JOB)["config"]["worker_memory_mb"] == grown
    assert recover(launcher, JOB, Quota(cpu=16, memory_mb=64 * 1024)) == []  # once per kill
    launcher.stop(JOB)


def test_probes_run_as_pods_and_are_measured_from_the_reports_and_the_metrics_api(server, cluster):
    launcher, kubelet, trainer, v1 = cluster
    quota = Quota(cpu=4, memory_mb=4096)
    probes = design_probes(quota, batch_size=256, allreduce=True).head(3)
    assert list(probes.worker_memory_mb) == [2048, 1024, 256]  # half the quota over each probe's workers
    mark = len(server.requests())
    try:
        table = profile_job(launcher, spec(), quota, window_s=1.0, probes=probes)
    finally:
        launcher.stop(JOB)
    assert len(table) == 3 and (table.ps == 0).all()
    # 1000 samples/s per core and worker, the mean of each window's reports
    assert (abs(table.throughput - 1000 * table.workers * table.worker_cpu) < 1e-6).all()
    assert (abs(table.worker_cpu_used - 0.9 * table.worker_cpu) < 1e-6).all() and (table.worker_memory_used_mb == 300).all()
    # the last probe's workers would get 256 MB; the earlier probes measured 300 used: 300 + 96 headroom
    assert list(table.worker_memory_mb) == [2048, 1024, memory_request_mb(300)] and memory_request_mb(300) == 400
    posted = [b for verb, path, _, b in requests_since(server, mark)
              if verb == "POST" and path == f"/api/v1/namespaces/{NS}/pods"]
    assert len(posted) == int(probes.workers.sum())  # every probe's pods, none on the Airflow worker
    assert [b["spec"]["containers"][0]["resources"]["limits"]["memory"] for b in posted[-8:]] == ["400Mi"] * 8
    assert pods(v1) == {}
