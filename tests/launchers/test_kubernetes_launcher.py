"""The Kubernetes launcher's lifecycle with the official client and the provider's hooks
(``KubernetesHook``, ``AsyncKubernetesHook`` through a ``kubernetes`` connection) against kmock's
Kubernetes API emulator on loopback. The test plays the kubelet (pod status) and the job's master
(its HTTP API): see ``benchmarks/sim/kubernetes_api.py``. Every Kubernetes request is read back from the emulator's
log, so the tests assert the exact calls: verb, path (namespace, resource, name), label selector
and body."""

import asyncio
import base64
import datetime
import json
from dataclasses import replace

import pytest
from sim.kubernetes_api import Kubelet, KmockThread, RecordingMaster, kubeconfig
from kubernetes import client

from airflow_dlrover.launchers import make_launcher
from airflow_dlrover.launchers import kubernetes_manifests as km
from airflow_dlrover.launchers.base import (
    FAILED, LOST, OOM_KILLED, PENDING, RUNNING, STOPPED, SUCCEEDED, UNSCHEDULABLE,
)
from airflow_dlrover.launchers.kubernetes import KubernetesLauncher, pod_state
from airflow_dlrover.launchers.watch import failed_nodes
from airflow_dlrover.lifecycle.observer import recover
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.unit

NS = "training"
JOB = "ctr-daily-20261130"
PLAN = Configuration(workers=2, ps=2, worker_cpu=1.5, ps_cpu=0.5, worker_memory_mb=1024, ps_memory_mb=768,
                     batch_size=256)
SELECTOR = f"dlrover.io/job={JOB}"


@pytest.fixture(scope="module")
def server():
    with KmockThread() as km_thread:
        yield km_thread


@pytest.fixture
def cluster(server, monkeypatch, tmp_path):
    """(launcher, kubelet, master, v1): a launcher on the ``kubernetes_default`` connection."""
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig(server.url, NS)), "namespace": NS}}))
    configuration = client.Configuration()
    configuration.host = server.url
    v1 = client.CoreV1Api(client.ApiClient(configuration))
    with Kubelet(v1, NS) as kubelet, RecordingMaster(key=spec().key, on_drain=lambda node: kubelet.terminate(
            f"{JOB}-{node}", 0, "Completed")) as master:
        launcher = make_launcher("kubernetes", str(tmp_path), {
            "namespace": NS, "image": "registry.example/airflow-dlrover:0.1.0", "master_url": master.url,
            "pending_timeout_s": 60})
        launcher.poll_s = 0.02
        yield launcher, kubelet, master, v1
        for kind in ("pod", "service", "config_map", "secret"):  # leave the shared server empty
            getattr(v1, f"delete_collection_namespaced_{kind}")(NS)
        client.NetworkingV1Api(v1.api_client).delete_collection_namespaced_network_policy(NS)
        assert master.refused == []  # every call of the launcher proved the job's key (from its Secret)


def requests_since(server, mark):
    """The emulator's requests after ``mark`` as (verb, path, query, body)."""
    out = []
    for request in server.requests(mark):
        out.append((request.method.name if hasattr(request.method, "name") else str(request.method).upper(),
                    request.url.path, dict(request.params), request.data))
    return out


def writes(requests, locks=False):
    """The launcher's writes (the kubelet's pod status patches left out, and the job's lock unless
    ``locks``)."""
    return [(verb, path) for verb, path, _, _ in requests
            if verb in ("POST", "PATCH", "DELETE", "PUT") and not path.endswith("/status")
            and (locks or "/leases" not in path)]


def spec():
    return JobSpec(job_id=JOB, samples=100_000, authkey="k" * 32)


def pods(v1, selector=SELECTOR):
    return {p.metadata.name: p for p in v1.list_namespaced_pod(NS, label_selector=selector).items}


def limits(pod):
    return pod.spec.containers[0].resources.limits


def test_launch_creates_the_job_with_exact_calls(server, cluster):
    launcher, kubelet, master, v1 = cluster
    mark = len(server.requests())
    assert launcher.launch(spec(), PLAN) == JOB
    calls = requests_since(server, mark)
    base = f"/api/v1/namespaces/{NS}"
    leases, policies = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
    assert writes(calls, locks=True) == [
        ("POST", leases),  # the job's lock, held for the whole launch
        ("POST", f"{base}/pods"),  # the master first: the others are owned by it
        ("POST", f"{base}/secrets"), ("POST", f"{base}/configmaps"), ("POST", f"{base}/services"),
        ("POST", f"{base}/services"), ("POST", policies), ("POST", policies), ("POST", policies),
        ("POST", f"{base}/pods"), ("POST", f"{base}/pods"),  # PS
        ("PATCH", f"{base}/configmaps/{JOB}-spec"),  # the record, once the PS exist
        ("POST", f"{base}/pods"), ("POST", f"{base}/pods"),  # workers
        ("PATCH", f"{base}/configmaps/{JOB}-spec"),
        ("DELETE", f"{leases}/{JOB}-launcher"),
    ]
    created = [body for verb, path, _, body in calls if verb == "POST" and path.endswith("/pods")]
    assert [b["metadata"]["name"] for b in created] == [
        f"{JOB}-master", f"{JOB}-ps-0", f"{JOB}-ps-1", f"{JOB}-worker-0", f"{JOB}-worker-1"]
    master_uid = pods(v1)[f"{JOB}-master"].metadata.uid
    for body in created[1:]:  # owned by the master pod: deleting it garbage-collects the job
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": f"{JOB}-master", "uid": master_uid}]
        assert body["metadata"]["labels"]["dlrover.io/job"] == JOB
    resources = {b["metadata"]["name"]: b["spec"]["containers"][0]["resources"] for b in created}
    assert resources[f"{JOB}-ps-1"] == {"requests": {"cpu": "500m", "memory": "768Mi"},
                                        "limits": {"cpu": "500m", "memory": "768Mi"}}
    assert resources[f"{JOB}-worker-0"]["limits"] == {"cpu": "1500m", "memory": "1024Mi"}
    secret = next(b for verb, path, _, b in calls if path.endswith("/secrets"))
    assert secret["data"] == {"authkey": base64.b64encode(b"k" * 32).decode()}
    # The master learns its PS by their stable DNS names once they are Ready.
    assert master.posts() == [("/cluster", {"ps": km.ps_addresses(JOB, 2, NS)})]
    # Readiness polls are GETs by name; the launcher lists only with the job's selector.
    selectors = {q.get("labelSelector") for verb, path, q, _ in calls if verb == "GET" and path.endswith("/pods")}
    assert selectors <= {SELECTOR, Kubelet.SELECTOR}
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    states = {s.name: (s.state, s.cpu, s.memory_mb) for s in launcher.status(JOB)}
    assert states == {"master": (RUNNING, 0.5, 512.0), "ps-0": (RUNNING, 0.5, 768), "ps-1": (RUNNING, 0.5, 768),
                      "worker-0": (RUNNING, 1.5, 1024), "worker-1": (RUNNING, 1.5, 1024)}
    assert launcher.spec(JOB) == spec()  # the key comes back from the Secret
    assert json.loads(v1.read_namespaced_config_map(f"{JOB}-spec", NS).data["spec.json"])["authkey"] == ""


def test_status_through_the_async_hook_matches(cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    kubelet.terminate(f"{JOB}-worker-1", 137, "OOMKilled")
    statuses = asyncio.run(launcher.astatus(JOB))
    assert statuses == launcher.status(JOB)
    assert failed_nodes(statuses) == [{"name": "worker-1", "state": OOM_KILLED, "memory_mb": 1024,
                                       "reason": "OOMKilled at its 1024Mi memory limit"}]


def test_resize_up_down_and_ps_repartition(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    master.calls.clear()
    base = f"/api/v1/namespaces/{NS}"

    up = launcher.resize(JOB, replace(PLAN, workers=3))
    assert up["actions"] == ["worker-2 added"] and master.posts() == []
    assert set(pods(v1)) >= {f"{JOB}-worker-2"}

    mark = len(server.requests())
    down = launcher.resize(JOB, replace(PLAN, workers=1))
    assert down["actions"] == ["worker-1 removed", "worker-2 removed"]
    assert master.posts() == [("/drain", {"node": "worker-1"}), ("/drain", {"node": "worker-2"})]
    deletes = [(v, p) for v, p in writes(requests_since(server, mark)) if v == "DELETE"]
    assert deletes == [("DELETE", f"{base}/pods/{JOB}-worker-1"), ("DELETE", f"{base}/pods/{JOB}-worker-2")]
    assert {n for n in pods(v1) if "worker" in n} == {f"{JOB}-worker-0"}
    states = {s.name: s.state for s in launcher.status(JOB)}
    assert (states["worker-1"], states["worker-2"], states["worker-0"]) == (STOPPED, STOPPED, RUNNING)

    master.calls.clear()
    mark = len(server.requests())
    launcher.resize(JOB, replace(PLAN, workers=1, ps=1, ps_cpu=1.0))
    # checkpoint → new PS pods → tell the master → restore (the re-partition), in that order
    assert [p for p, _ in master.posts()] == ["/checkpoint", "/cluster"]  # /cluster restores the new set
    assert master.posts()[0] == ("/checkpoint", {"hold": True})
    assert master.posts()[1] == ("/cluster", {"ps": km.ps_addresses(JOB, 1, NS)})
    calls = writes(requests_since(server, mark))
    assert calls[:2] == [("DELETE", f"{base}/pods/{JOB}-ps-0"), ("DELETE", f"{base}/pods/{JOB}-ps-1")]
    ps = {n: p for n, p in pods(v1, f"{SELECTOR},dlrover.io/role=ps").items()}
    assert list(ps) == [f"{JOB}-ps-0"]
    assert limits(ps[f"{JOB}-ps-0"])["cpu"] == "1" or limits(ps[f"{JOB}-ps-0"])["cpu"] == "1000m"
    assert ps[f"{JOB}-ps-0"].spec.containers[0].args[-2:] == ["--count", "1"]
    assert launcher.read_job(JOB)["config"] == replace(PLAN, workers=1, ps=1, ps_cpu=1.0).to_row()


def test_in_place_resize_patches_the_resize_subresource(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.in_place_resize = True
    launcher.launch(spec(), PLAN)
    mark = len(server.requests())
    result = launcher.resize(JOB, replace(PLAN, worker_cpu=1.9, worker_memory_mb=1536))  # still 1 torch thread
    assert result["actions"] == ["workers resized in place to 1.9 CPU / 1536 MB"]
    calls = requests_since(server, mark)
    patches = [(p, b) for v, p, _, b in calls if v == "PATCH" and p.endswith("/resize")]
    amounts = {"cpu": "1900m", "memory": "1536Mi"}
    assert patches == [
        (f"/api/v1/namespaces/{NS}/pods/{JOB}-worker-{i}/resize",
         {"spec": {"containers": [{"name": "worker", "resources": {"requests": amounts, "limits": amounts}}]}})
        for i in range(2)]
    assert not [c for c in writes(calls) if c[0] in ("DELETE", "POST")]  # nothing restarted


def test_oom_killed_worker_is_relaunched_with_more_memory(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    master.calls.clear()
    kubelet.terminate(f"{JOB}-worker-0", 137, "OOMKilled")
    failed = failed_nodes(launcher.status(JOB))
    assert failed == [{"name": "worker-0", "state": OOM_KILLED, "reason": "OOMKilled at its 1024Mi memory limit",
                       "memory_mb": 1024}]
    events = recover(launcher, JOB)
    assert [(e["action"], e["reason"], e["node"], e["memory_mb"]) for e in events] == [
        ("relaunch", "oom_killed", "worker-0", 1536)]
    assert master.posts() == [("/node_lost", {"node": "worker-0"})]  # its shards are requeued first
    kubelet.wait_running([f"{JOB}-worker-0"])
    pod = pods(v1)[f"{JOB}-worker-0"]
    assert limits(pod)["memory"] == "1536Mi" and pod.spec.containers[0].resources.requests["memory"] == "1536Mi"
    status = {s.name: s for s in launcher.status(JOB)}["worker-0"]
    assert (status.state, status.restarts, status.memory_mb) == (RUNNING, 1, 1536)
    assert failed_nodes(launcher.status(JOB)) == []


def test_failed_ps_is_relaunched_and_the_job_rolls_back(cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    master.calls.clear()
    kubelet.set_status(f"{JOB}-ps-1", {"phase": "Failed", "reason": "Evicted",
                                  "message": "The node was low on resource: memory."})
    assert failed_nodes(launcher.status(JOB)) == [{"name": "ps-1", "state": FAILED, "memory_mb": 768,
                                                   "reason": "Evicted: The node was low on resource: memory."}]
    events = recover(launcher, JOB)
    assert [(e["action"], e["reason"], e["node"], e["memory_mb"]) for e in events] == [
        ("relaunch", "node_failed", "ps-1", None)]  # an eviction is not an OOM: the same memory
    assert master.posts() == [("/restore", {})]
    assert {s.name: s.state for s in launcher.status(JOB)}["ps-1"] == RUNNING


def test_pod_pending_past_the_threshold_is_an_event_and_the_worker_leaves(cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    kubelet.unschedulable = {f"{JOB}-worker-2": 30.0, f"{JOB}-worker-3": 90.0}
    launcher.resize(JOB, replace(PLAN, workers=4))
    kubelet.wait_seen([f"{JOB}-worker-2", f"{JOB}-worker-3"])  # the scheduler has looked at them
    statuses = {s.name: s for s in launcher.status(JOB)}
    assert statuses["worker-2"].state == PENDING  # 30 s < 60 s: still waiting for a node
    assert statuses["worker-3"].state == UNSCHEDULABLE
    assert statuses["worker-3"].reason.startswith("Unschedulable for 9") and "Insufficient cpu" in statuses["worker-3"].reason
    assert [f["name"] for f in failed_nodes(statuses.values())] == ["worker-3"]
    master.calls.clear()
    events = recover(launcher, JOB)
    assert [(e["action"], e["reason"], e["remove"], e["done"]) for e in events] == [
        ("resize", "unschedulable", ["worker-3"], ["worker-3 removed"])]
    assert master.posts() == [("/node_lost", {"node": "worker-3"})]
    assert f"{JOB}-worker-3" not in pods(v1)
    job = launcher.read_job(JOB)
    assert job["config"]["workers"] == 3 and job["nodes"]["worker-3"]["state"] == STOPPED


def test_retry_adopts_the_running_job(server, cluster, tmp_path):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    retry = make_launcher("kubernetes", str(tmp_path), {"namespace": NS, "image": "registry.example/airflow-dlrover:0.1.0",
                                                        "master_url": master.url})
    mark = len(server.requests())
    assert retry.exists(JOB) and retry.launch(spec(), PLAN) == JOB
    assert writes(requests_since(server, mark)) == []  # adopted: nothing created or deleted
    assert len(pods(v1)) == 5


def test_launch_after_a_lost_master_cleans_up_and_resumes_from_the_checkpoint(cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    kubelet.set_status(f"{JOB}-master", {"phase": "Unknown", "reason": "NodeLost", "message": "node n-3 is not ready"})
    assert {s.name: (s.state, s.reason) for s in launcher.status(JOB)}["master"] == (LOST, "node lost: node n-3 is not ready")
    old_uid = pods(v1)[f"{JOB}-master"].metadata.uid
    master.calls.clear()
    launcher.launch(spec(), PLAN)
    assert pods(v1)[f"{JOB}-master"].metadata.uid != old_uid and len(pods(v1)) == 5
    # the new master reloads its state from the job's volume; /cluster rolls the new PS back to the checkpoint
    assert [p for p, _ in master.posts()] == ["/cluster"]


def test_master_relaunch_orphans_then_reowns_the_job(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    mark = len(server.requests())
    launcher.relaunch(JOB, "master")
    calls = requests_since(server, mark)
    delete = next(b for v, p, _, b in calls if v == "DELETE" and p.endswith(f"/pods/{JOB}-master"))
    assert delete["propagationPolicy"] == "Orphan" and delete["gracePeriodSeconds"] == 0
    assert not [(v, p) for v, p, _, _ in calls if p.endswith("/secrets")]  # no Secret listed: it is patched by name
    new_uid = pods(v1)[f"{JOB}-master"].metadata.uid
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": f"{JOB}-master", "uid": new_uid}]
    for kind in ("pod", "service", "config_map", "secret"):
        for item in getattr(v1, f"list_namespaced_{kind}")(NS, label_selector=SELECTOR).items:
            if item.metadata.name != f"{JOB}-master" or kind != "pod":
                refs = [client.ApiClient().sanitize_for_serialization(r) for r in item.metadata.owner_references]
                assert refs == owner, (kind, item.metadata.name)


def test_stop_leaves_no_pods_services_or_secrets(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    other = JobSpec(job_id="other-job", samples=1000, authkey="k" * 32)  # the recording master's key
    launcher.launch(other, replace(PLAN, workers=1, ps=1))
    mark = len(server.requests())
    launcher.stop(JOB)
    calls = requests_since(server, mark)
    collections = [(v, p, q.get("labelSelector")) for v, p, q, _ in calls
                   if v == "DELETE" and not p.endswith("-master") and "/leases" not in p]
    assert collections == [("DELETE", f"/api/v1/namespaces/{NS}/{kind}", SELECTOR)
                           for kind in ("pods", "services", "configmaps")] + [
        ("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", SELECTOR),
        ("DELETE", f"/api/v1/namespaces/{NS}/secrets/{JOB}-authkey", None)]  # by name: the Role lists no Secret
    for kind in ("pod", "service", "config_map", "secret"):
        assert getattr(v1, f"list_namespaced_{kind}")(NS, label_selector=SELECTOR).items == [], kind
    assert client.NetworkingV1Api(v1.api_client).list_namespaced_network_policy(NS, label_selector=SELECTOR).items == []
    assert not launcher.exists(JOB)
    assert len(pods(v1, "dlrover.io/job=other-job")) == 3  # the other job is untouched
    launcher.stop("other-job")
    assert v1.list_namespaced_pod(NS).items == []


def test_trigger_polls_pods_through_the_async_hook(cluster, tmp_path):
    from airflow_dlrover.triggers.job import DLRoverJobTrigger

    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    trigger = DLRoverJobTrigger(JOB, "guard", launcher="kubernetes", jobs_dir=str(tmp_path), poll_s=0.05,
                                deadline=2e9, launcher_options={"namespace": NS, "image": "registry.example/airflow-dlrover:0.1.0",
                                                  "master_url": master.url})
    classpath, kwargs = trigger.serialize()
    trigger = DLRoverJobTrigger(**json.loads(json.dumps(kwargs)))  # what the triggerer re-creates

    async def first_event():
        generator = trigger.run()
        task = asyncio.ensure_future(generator.__anext__())
        await asyncio.sleep(0.5)
        assert not task.done()  # every node runs: nothing to report
        await asyncio.to_thread(kubelet.terminate, f"{JOB}-ps-0", 1, "Error")
        return await asyncio.wait_for(task, 20)

    event = asyncio.run(first_event())
    # A failed node wakes the guard at once; it is the controller's to decide what to do about it.
    assert (event.payload["kind"], event.payload["usage"]) == ("observation", [])
    assert event.payload["deadline"] == kwargs["deadline"] == 2e9  # a re-deferral keeps the task's deadline
    assert failed_nodes(launcher.status(JOB)) == [{"name": "ps-0", "state": FAILED, "reason": "exited 1 (Error)",
                                                   "memory_mb": 768}]


@pytest.mark.parametrize("options, field", [
    ({"namespace": NS}, "image"),
    ({"image": "reg/x:1", "namespace": "Bad_NS"}, "namespace"),
    ({"image": "reg/x:1", "volume_claim": "No_Such"}, "volume_claim"),
    ({"image": "reg/x:1", "pending_timeout_s": 0}, "pending_timeout_s"),
    ({"image": "reg/x:1", "master_url": "master:8080"}, "master_url"),
    ({"image": "reg/x:1", "replicas": 3}, "kubernetes"),
])
def test_bad_settings_name_the_field(options, field):
    with pytest.raises(InvalidInputError) as err:
        make_launcher("kubernetes", None, options)
    assert err.value.field == field


# -- pod states (pure) -----------------------------------------------------------------------------
def _pod(phase, *, container_state=None, reason=None, message=None, conditions=None, deleting=False, limit="2Gi"):
    now = datetime.datetime.now(datetime.timezone.utc)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", creation_timestamp=now - datetime.timedelta(seconds=5),
                                     deletion_timestamp=now if deleting else None),
        spec=client.V1PodSpec(containers=[client.V1Container(
            name="worker", resources=client.V1ResourceRequirements(limits={"memory": limit}))]),
        status=client.V1PodStatus(
            phase=phase, reason=reason, message=message, conditions=conditions,
            container_statuses=None if container_state is None else [client.V1ContainerStatus(
                name="worker", image="i", image_id="", ready=False, restart_count=0, state=container_state)]))


def _terminated(code, reason, message=None):
    return client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=code, reason=reason,
                                                                                message=message))


def _unschedulable(seconds_ago):
    at = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds_ago)
    return [client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                  message="0/8 nodes are available: 8 Insufficient nvidia.com/gpu.",
                                  last_transition_time=at)]


@pytest.mark.parametrize("pod, expected", [
    (None, (LOST, None, "pod vanished (deleted, or its node was lost)", 0)),
    (_pod("Running"), (RUNNING, None, "", 0)),
    (_pod("Succeeded", container_state=_terminated(0, "Completed")), (SUCCEEDED, 0, "exited 0", 0)),
    (_pod("Failed", container_state=_terminated(137, "OOMKilled")), (OOM_KILLED, 137, "OOMKilled at its 2Gi memory limit", 1)),
    (_pod("Running", container_state=_terminated(137, "OOMKilled")), (OOM_KILLED, 137, "OOMKilled at its 2Gi memory limit", 1)),
    (_pod("Failed", container_state=_terminated(2, "Error")), (FAILED, 2, "exited 2 (Error)", 0)),
    (_pod("Failed", container_state=_terminated(65, "Error", "model='a.b:c' is invalid: ...Traceback")),
     (FAILED, 65, "model='a.b:c' is invalid: ...Traceback", 0)),  # a user error: the node's termination message
    (_pod("Failed", reason="Evicted", message="The node had condition: [DiskPressure]."),
     (FAILED, None, "Evicted: The node had condition: [DiskPressure].", 0)),
    (_pod("Unknown"), (LOST, None, "node lost: Unknown", 0)),
    (_pod("Running", reason="NodeLost", message="Node n-1 which was running pod p is unresponsive"),
     (LOST, None, "node lost: Node n-1 which was running pod p is unresponsive", 0)),
    (_pod("Running", deleting=True), (LOST, None, "pod is being deleted by someone else (node drain, preemption)", 0)),
    (_pod("Pending", container_state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(
        reason="ImagePullBackOff", message='Back-off pulling image "reg/typo:1"'))),
     (FAILED, None, 'ImagePullBackOff: Back-off pulling image "reg/typo:1"', 0)),
])
def test_pod_state(pod, expected):
    assert pod_state(pod, pending_timeout_s=60) == expected


def test_unschedulable_past_the_threshold():
    assert pod_state(_pod("Pending", conditions=_unschedulable(10)), pending_timeout_s=60) == (PENDING, None, "pending", 0)
    state, code, reason, _ = pod_state(_pod("Pending", conditions=_unschedulable(75)), pending_timeout_s=60)
    assert (state, code) == (UNSCHEDULABLE, None)
    assert reason.startswith("Unschedulable for 7") and reason.endswith("8 Insufficient nvidia.com/gpu.")


def test_launcher_needs_a_placement():
    with pytest.raises(InvalidInputError) as err:
        KubernetesLauncher({"image": "x"})
    assert err.value.field == "placement"


def test_a_killed_task_deletes_its_job(cluster, monkeypatch, tmp_path):
    from airflow_dlrover.operators import DLRoverFineTuneOperator

    launcher, kubelet, master, v1 = cluster
    monkeypatch.setenv("AIRFLOW_CONN_DLROVER_DEFAULT", json.dumps({"conn_type": "dlrover", "extra": {
        "launcher": "kubernetes", "namespace": NS, "image": "reg/dlrover:0.1", "jobs_dir": str(tmp_path)}}))
    launcher.launch(spec(), PLAN)
    task = DLRoverFineTuneOperator(task_id="fine_tune", job="ctr", kubernetes={"master_url": master.url})
    assert task.launcher.master_url == master.url and task.launcher.namespace == NS  # task over connection
    task.on_kill()  # not started yet: it knows no job and deletes nothing
    assert len(pods(v1)) == 5
    task._dlrover_job_id = JOB  # what run_ids() sets when the task runs
    task.on_kill()
    assert pods(v1) == {} and not launcher.exists(JOB)


def test_metrics_read_pod_usage_from_the_metrics_api(server, cluster):
    launcher, kubelet, master, v1 = cluster
    launcher.launch(spec(), PLAN)
    assert launcher.metrics(JOB)["usage"] == {}  # no pod metrics yet: the job runs, utilisation is not measured
    resource = "metrics.k8s.io/v1beta1/pods"
    server.call(lambda: setattr(server.emulator.resources[resource], "kind", "PodMetrics"))
    try:  # the test plays metrics-server
        custom = client.CustomObjectsApi(v1.api_client)
        for name, cpu, memory in ((f"{JOB}-worker-0", "1234567890n", "300Mi"), (f"{JOB}-ps-1", "250m", "512000Ki"),
                                  ("unrelated-pod", "1", "1Gi")):
            custom.create_namespaced_custom_object("metrics.k8s.io", "v1beta1", NS, "pods", {
                "apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
                "metadata": {"name": name, "namespace": NS, "labels": {"dlrover.io/job": JOB if "unrelated" not in name else "x"}},
                "timestamp": "2026-11-30T12:00:00Z", "window": "15s",
                "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}]})
        usage = launcher.metrics(JOB)["usage"]
    finally:
        server.call(lambda: server.emulator.resources.pop(resource))
    assert usage == {
        "worker-0": {"role": "worker", "cpu_rate": pytest.approx(1.23456789), "memory_mb": 300.0, "memory_peak_mb": None,
                     "cpu": 1.5, "memory_limit_mb": 1024},
        "ps-1": {"role": "ps", "cpu_rate": 0.25, "memory_mb": 500.0, "memory_peak_mb": None, "cpu": 0.5,
                 "memory_limit_mb": 768},
    }


def test_a_launch_that_failed_half_way_is_redone_not_adopted(cluster):
    launcher, kubelet, master, v1 = cluster
    kubelet.unschedulable = {f"{JOB}-ps-1": 120.0}  # past the 60 s threshold at once
    with pytest.raises(RuntimeError, match=r"ps-1 of job .* did not start .*Unschedulable for 1[0-9]{2} s"):
        launcher.launch(spec(), PLAN)
    assert f"{JOB}-worker-0" not in pods(v1)  # it stopped before the workers
    kubelet.unschedulable = {}  # the cluster autoscaler added a node
    master.calls.clear()
    launcher.launch(spec(), PLAN)  # the task's retry
    kubelet.wait_running([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    assert {s.name: s.state for s in launcher.status(JOB)} == {n: RUNNING for n in (
        "master", "ps-0", "ps-1", "worker-0", "worker-1")}
    assert [p for p, _ in master.posts()] == ["/cluster"]  # resumes from the job's volume (/cluster restores)


def test_two_launchers_take_turns_on_a_job_and_a_dead_holders_lock_is_taken_over(cluster, monkeypatch):
    """The job's Lease serialises launcher processes: a second one waits while the first holds
    it, and one whose holder died (older than JOB_LOCK_TTL_S) is taken over."""
    import threading
    from datetime import datetime, timedelta, timezone

    from airflow_dlrover import timings as T

    launcher, _, _, v1 = cluster
    other = make_launcher("kubernetes", None, {"namespace": NS, "image": "registry.example/airflow-dlrover:0.1.0",
                                               "master_url": "http://127.0.0.1:9"})
    other.poll_s = 0.02
    order = []
    with launcher._job_lock(JOB):  # "other" takes the Lease and never releases it: it dies holding it
        waiter = threading.Thread(target=lambda: (other._acquire(JOB), order.append("other")))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and order == []  # it waits for the first holder
        order.append("first released")
    waiter.join(timeout=10)
    assert order == ["first released", "other"]
    coordination = client.CoordinationV1Api(v1.api_client)
    lease = coordination.read_namespaced_lease(f"{JOB}-launcher", NS)  # "other" died holding it
    stale = datetime.now(timezone.utc) - timedelta(seconds=T.JOB_LOCK_TTL_S + 60)
    coordination.patch_namespaced_lease(lease.metadata.name, NS, {"spec": {"renewTime": stale, "acquireTime": stale}})
    with launcher._job_lock(JOB):
        assert coordination.read_namespaced_lease(f"{JOB}-launcher", NS).spec.holder_identity != lease.spec.holder_identity
    assert not coordination.list_namespaced_lease(NS).items  # released


def test_a_held_lock_is_renewed_until_it_is_released(cluster, monkeypatch):
    """A launcher renews the job's Lease while it holds it, however long its operation; the Lease
    goes with the release, and its renewal stops."""
    import time

    from airflow_dlrover import timings as T

    launcher, _, _, v1 = cluster
    monkeypatch.setattr(T, "JOB_LOCK_RENEW_S", 0.1)
    coordination = client.CoordinationV1Api(v1.api_client)
    with launcher._job_lock(JOB):
        first = coordination.read_namespaced_lease(f"{JOB}-launcher", NS).spec.renew_time
        time.sleep(1.5)  # kmock keeps times to the second
        assert coordination.read_namespaced_lease(f"{JOB}-launcher", NS).spec.renew_time > first
    assert not coordination.list_namespaced_lease(NS).items and not launcher._renewers
