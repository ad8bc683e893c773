"""Kubernetes launcher: the job's nodes are pods created through the ``cncf-kubernetes`` provider's
``KubernetesHook`` (``AsyncKubernetesHook`` for the trigger's status polls); the objects are those
of :mod:`airflow_dlrover.launchers.kubernetes_manifests`.

The job's record (``job.json``: configuration, nodes with their resources and restarts, events)
lives in the job's ConfigMap ``J-spec``, so any Airflow worker adopts the job by its id. A node's
state is read from its pod (:func:`pod_state`): phase, container states and conditions become
``running`` / ``pending`` / ``succeeded``, ``oom_killed`` (with the limit it hit), ``failed``
(exit code, ``Evicted``), ``lost`` (pod gone, phase ``Unknown``, ``NodeLost``) and
``unschedulable`` (``PodScheduled=False/Unschedulable`` for longer than ``pending_timeout_s``).

Resizes keep the runtime's protocol (as ``LocalLauncher``): workers join as new pods, leave by
``/drain`` then deletion; a PS change is ``/checkpoint`` → new PS pods → ``/cluster`` →
``/restore`` (re-partition; the checkpoint files are on the job's ReadWriteMany volume). A node's
new CPU / memory is a relaunch, or an in-place pod resize (``pods/resize``, Kubernetes ≥ 1.33) with
``in_place_resize=True`` when its torch thread count does not change.

The master's HTTP API is reached at ``master_url`` (default: the ``J-master`` Service's cluster DNS
name, for Airflow workers that run in the cluster; a ``kubectl port-forward`` or ingress URL
otherwise; ``{job_id}`` and ``{namespace}`` are filled in).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_dlrover.launchers import default_jobs_dir
from airflow_dlrover.launchers import kubernetes_manifests as km
from airflow_dlrover.launchers.base import (
    FAILED, FAILED_STATES, LOST, OOM_KILLED, OOM_MEMORY_GROWTH, PENDING, RUNNING, STOPPED, SUCCEEDED,
    UNSCHEDULABLE, NodeStatus, call_master,
)
from airflow_dlrover.launchers.local import MASTER_CPU, MASTER_MEMORY_MB, _threads
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)

# -- tuning constants (one line of reason each) ---------------------------------------------------
#: A pod the scheduler cannot place for this long is an instability event (cluster-autoscaler
#: usually adds a node within 1–3 min; beyond 5 min the job should shrink or be told).
PENDING_TIMEOUT_S = 300.0
POD_START_TIMEOUT_S = 600.0  # pull a multi-GB torch image + start: the launch waits this long per pod
DRAIN_TIMEOUT_S = 120.0  # a draining worker finishes its shard (spec.shard_timeout_s default) then exits
STOP_TIMEOUT_S = 120.0  # stop() waits this long for the job's pods to disappear
POLL_S = 1.0  # pod status polls while waiting (API-server friendly)
DEFAULT_MASTER_URL = "http://{job_id}-master.{namespace}.svc:" + str(km.MASTER_PORT)
#: Waiting container reasons that a retry of the same pod cannot fix (a user mistake: image or config).
BROKEN_CONTAINER_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                            "CreateContainerError")


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def pod_state(pod: Any, pending_timeout_s: float = PENDING_TIMEOUT_S, now: float | None = None,
              ) -> tuple[str, int | None, str, int]:
    """(state, exit code, reason, OOM kills) of a node from its pod (a ``V1Pod`` of either client,
    or None when the pod does not exist)."""
    if pod is None:
        return LOST, None, "pod vanished (deleted, or its node was lost)", 0
    now = time.time() if now is None else now
    status = pod.status
    phase = (status.phase if status else None) or "Pending"
    containers = (status.container_statuses if status else None) or []
    limit = ((pod.spec.containers[0].resources.limits or {}).get("memory")
             if pod.spec and pod.spec.containers and pod.spec.containers[0].resources else None)
    terminated = next((c.state.terminated for c in containers if c.state and c.state.terminated), None)
    last_oom = sum(1 for c in containers if c.last_state and c.last_state.terminated
                   and c.last_state.terminated.reason == "OOMKilled")
    if status and (status.reason == "NodeLost" or phase == "Unknown"):
        return LOST, None, f"node lost: {status.message or status.reason or phase}", last_oom
    if status and status.reason == "Evicted":
        return FAILED, None, f"Evicted: {status.message or 'the kubelet evicted the pod'}", last_oom
    if pod.metadata and pod.metadata.deletion_timestamp is not None and phase not in ("Succeeded", "Failed"):
        return LOST, None, "pod is being deleted by someone else (node drain, preemption)", last_oom
    if terminated is not None:
        code = terminated.exit_code
        if terminated.reason == "OOMKilled":
            return OOM_KILLED, code, f"OOMKilled at its {limit or '?'} memory limit", last_oom + 1
        if code == 0:
            return SUCCEEDED, 0, "exited 0", last_oom
        return FAILED, code, f"exited {code}" + (f" ({terminated.reason})" if terminated.reason else ""), last_oom
    if phase == "Succeeded":
        return SUCCEEDED, 0, "succeeded", last_oom
    if phase == "Failed":
        return FAILED, None, f"failed: {status.message or status.reason or 'no reason given'}", last_oom
    if phase == "Running":
        return RUNNING, None, "", last_oom
    waiting = next((c.state.waiting for c in containers if c.state and c.state.waiting), None)
    if waiting is not None and waiting.reason in BROKEN_CONTAINER_REASONS:
        return FAILED, None, f"{waiting.reason}: {waiting.message or ''}".rstrip(": "), last_oom
    unschedulable = next((c for c in (status.conditions or []) if c.type == "PodScheduled" and c.status == "False"
                          and c.reason == "Unschedulable"), None) if status else None
    if unschedulable is not None:
        since = _timestamp(unschedulable.last_transition_time) or _timestamp(pod.metadata.creation_timestamp) or now
        if now - since > pending_timeout_s:
            return UNSCHEDULABLE, None, (f"Unschedulable for {now - since:.0f} s: "
                                         f"{unschedulable.message or 'no node fits'}"), last_oom
    return PENDING, None, "pending", last_oom


def _ready(pod: Any) -> bool:
    if pod is None or pod.status is None:
        return False
    conditions = pod.status.conditions or []
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True" for c in conditions)


class KubernetesLauncher:
    """See the module docstring. ``placement`` says where the pods run (namespace, image, volumes,
    service account, node selector, tolerations); ``hook`` / ``async_hook`` default to the
    provider's hooks on ``kubernetes_conn_id``."""

    def __init__(self, placement: km.Placement, *, kubernetes_conn_id: str = "kubernetes_default",
                 jobs_dir: str | Path | None = None, master_url: str | None = None,
                 pending_timeout_s: float = PENDING_TIMEOUT_S, in_place_resize: bool = False,
                 poll_s: float = POLL_S, hook: Any = None, async_hook: Any = None):
        if not isinstance(placement, km.Placement):
            raise InvalidInputError("placement", type(placement).__name__, "a kubernetes_manifests.Placement")
        if not placement.image:
            raise InvalidInputError("image", placement.image, "the runtime image (connection extra or operator "
                                    "argument kubernetes={'image': ...}), e.g. registry/airflow-dlrover:0.1.0")
        if not (isinstance(pending_timeout_s, (int, float)) and pending_timeout_s > 0):
            raise InvalidInputError("pending_timeout_s", pending_timeout_s, "a positive number of seconds")
        if master_url is not None and not (isinstance(master_url, str) and master_url.startswith(("http://", "https://"))):
            raise InvalidInputError("master_url", master_url, "an http(s) URL, may contain {job_id} and {namespace}")
        self.placement, self.namespace = placement, placement.namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.jobs_dir = Path(jobs_dir) if jobs_dir else default_jobs_dir()
        self.master_url = master_url or DEFAULT_MASTER_URL
        self.pending_timeout_s, self.in_place_resize = float(pending_timeout_s), bool(in_place_resize)
        self.poll_s, self._hook, self._async_hook = float(poll_s), hook, async_hook

    # -- clients -------------------------------------------------------------------------------
    @cached_property
    def hook(self) -> Any:
        if self._hook is not None:
            return self._hook
        from kubernetes import client
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        # Our own Configuration: otherwise the hook rewrites the process-wide default one.
        return KubernetesHook(conn_id=self.kubernetes_conn_id, client_configuration=client.Configuration())

    @cached_property
    def async_hook(self) -> Any:
        if self._async_hook is not None:
            return self._async_hook
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=self.kubernetes_conn_id)

    @property
    def core(self) -> Any:
        return self.hook.core_v1_client

    def _selector(self, job_id: str, role: str | None = None) -> str:
        return f"{km.LABEL_JOB}={job_id}" + (f",{km.LABEL_ROLE}={role}" if role else "")

    @staticmethod
    def _not_found(err: Exception) -> bool:
        return getattr(err, "status", None) == 404

    # -- the job's record ----------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        """This Airflow worker's folder for the job's reports (the job's own dir is on the volume)."""
        folder = self.jobs_dir / job_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _config_map(self, job_id: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_config_map(km.spec_config_map_name(job_id), self.namespace)
        except ApiException as err:
            if self._not_found(err):
                raise KeyError(f"no job {job_id!r} in namespace {self.namespace}") from None
            raise

    def exists(self, job_id: str) -> bool:
        try:
            self._config_map(job_id)
        except KeyError:
            return False
        return True

    def _record(self, job_id: str) -> dict[str, Any]:
        return json.loads(self._config_map(job_id).data["job.json"])

    def _write(self, job_id: str, record: dict[str, Any]) -> None:
        body = {"data": {"job.json": json.dumps(record, sort_keys=True)}}
        self.core.patch_namespaced_config_map(km.spec_config_map_name(job_id), self.namespace, body)

    def spec(self, job_id: str) -> JobSpec:
        import dataclasses

        spec = JobSpec.from_json(self._config_map(job_id).data["spec.json"])
        secret = self.core.read_namespaced_secret(km.authkey_secret_name(job_id), self.namespace)
        return dataclasses.replace(spec, authkey=base64.b64decode(secret.data["authkey"]).decode())

    def _pods(self, job_id: str, role: str | None = None) -> dict[str, Any]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self._selector(job_id, role)).items
        return {pod.metadata.name: pod for pod in pods}

    def read_job(self, job_id: str) -> dict[str, Any]:
        """The record with each node's live state (``state``, ``reason``, ``started``)."""
        return self._merge(self._record(job_id), self._pods(job_id))

    def _merge(self, record: dict[str, Any], pods: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        for node in record["nodes"].values():
            if node.get("state") == STOPPED:
                continue
            pod = pods.get(node["pod"])
            state, code, reason, ooms = pod_state(pod, self.pending_timeout_s, now)
            started = _timestamp(pod.status.start_time) if pod is not None and pod.status else None
            node.update(state=state, exit_code=code, reason=reason, oom_kills=ooms, started=started or 0)
        return record

    # -- master API ----------------------------------------------------------------------------
    def master_call(self, job_id: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
        url = self.master_url.format(job_id=job_id, namespace=self.namespace)
        try:
            return call_master(url, path, body, timeout)
        except ConnectionError as err:
            raise ConnectionError(f"master of {job_id}: {err}") from None

    # -- pods ----------------------------------------------------------------------------------
    def _node(self, record: dict[str, Any], name: str, role: str, index: int, cpu: float,
              memory_mb: float | None, gpu: int = 0, count: int = 1) -> dict[str, Any]:
        pod = {"master": km.master_name, "ps": km.ps_name, "worker": km.worker_name}[role]
        node = dict(name=name, role=role, index=index, cpu=cpu, memory_mb=memory_mb or None, gpu=gpu, count=count,
                    pod=pod(record["job_id"]) if role == "master" else pod(record["job_id"], index), restarts=0)
        record["nodes"][name] = node
        return node

    def _create_pod(self, record: dict[str, Any], node: dict[str, Any]) -> Any:
        body = km.node_pod(record["job_id"], node["role"], node["index"], cpu=node["cpu"], memory_mb=node["memory_mb"],
                           gpu=node.get("gpu", 0), ps_count=node.get("count", 1), placement=self.placement,
                           master_uid=record.get("master_uid"))
        return self.core.create_namespaced_pod(self.namespace, body)

    def _delete_pod(self, name: str, *, orphan: bool = False, wait: bool = True) -> None:
        """Delete a pod now (grace 0: the node is replaced or gone) and wait until it is gone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        options = client.V1DeleteOptions(grace_period_seconds=0,
                                         propagation_policy="Orphan" if orphan else "Background")
        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=options)
        except ApiException as err:
            if not self._not_found(err):
                raise
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while wait:
            try:
                self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as err:
                if self._not_found(err):
                    return
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {name} still exists {STOP_TIMEOUT_S:.0f} s after its deletion")
            time.sleep(self.poll_s)

    def _wait_ready(self, record: dict[str, Any], names: list[str], timeout_s: float = POD_START_TIMEOUT_S) -> None:
        """Wait until the nodes' pods are Ready; raise with the pod's reason when one cannot start."""
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + timeout_s
        for name in names:
            pod_name = record["nodes"][name]["pod"]
            while True:
                try:
                    pod = self.core.read_namespaced_pod(pod_name, self.namespace)
                except ApiException as err:
                    if not self._not_found(err):
                        raise
                    pod = None
                if pod is not None and _ready(pod):
                    break
                state, _, reason, _ = pod_state(pod, self.pending_timeout_s)
                if state in FAILED_STATES or state == SUCCEEDED or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} of job {record['job_id']} did not start ({pod_name}: "
                                       f"{reason or state}, waited {timeout_s - (deadline - time.monotonic()):.0f} s)")
                time.sleep(self.poll_s)

    def _start_ps(self, record: dict[str, Any], config: Configuration) -> None:
        names = []
        for index in range(config.ps):
            node = self._node(record, f"ps-{index}", "ps", index, config.ps_cpu, config.ps_memory_mb, count=config.ps)
            self._create_pod(record, node)
            names.append(node["name"])
        self._write(record["job_id"], record)
        self._wait_ready(record, names)
        self.master_call(record["job_id"], "/cluster", {"ps": km.ps_addresses(record["job_id"], config.ps, self.namespace)})

    def _add_worker(self, record: dict[str, Any], config: Configuration, index: int) -> str:
        node = self._node(record, f"worker-{index}", "worker", index, config.worker_cpu, config.worker_memory_mb,
                          gpu=config.worker_gpu)
        self._create_pod(record, node)
        return node["name"]

    # -- the interface -------------------------------------------------------------------------
    def launch(self, spec: JobSpec, config: Configuration) -> str:
        """Create master, job objects, PS and workers for ``config``; adopt the job if its master
        pod runs (an Airflow retry); after a failed launch, clean up and start again from the
        job's checkpoint (its dir on the volume survives)."""
        job_id = spec.job_id
        km.check_job_id(job_id, config)
        resuming = self.exists(job_id)
        if resuming:
            record = self.read_job(job_id)
            if record.get("launched") and record["nodes"]["master"]["state"] in (RUNNING, PENDING):
                log.info("job %s already running in %s: adopted", job_id, self.namespace)
                return job_id
            self._delete_job(job_id)  # a lost master, or a launch that failed half-way
        record = {"job_id": job_id, "config": config.to_row(), "nodes": {}, "events": [], "resizes": 0,
                  "started": time.time(), "namespace": self.namespace}
        master = self._node(record, "master", "master", 0, MASTER_CPU, MASTER_MEMORY_MB)
        record["master_uid"] = self._create_pod(record, master).metadata.uid
        for body in km.job_objects(spec, self.placement, km.owner_references(record["master_uid"], job_id), record):
            create = {"Secret": self.core.create_namespaced_secret, "ConfigMap": self.core.create_namespaced_config_map,
                      "Service": self.core.create_namespaced_service}[body["kind"]]
            create(self.namespace, body)
        self._wait_ready(record, ["master"])
        self._start_ps(record, config)
        if resuming:  # the master reloaded its state from the volume; the new PS are empty
            self.master_call(job_id, "/restore", {})
        for index in range(config.workers):
            self._add_worker(record, config, index)
        record["launched"] = True  # only now may a retry adopt the job
        self._write(job_id, record)
        return job_id

    def status(self, job_id: str) -> list[NodeStatus]:
        return self._statuses(self.read_job(job_id))

    async def astatus(self, job_id: str) -> list[NodeStatus]:
        """:meth:`status` through ``AsyncKubernetesHook`` (for triggers: no thread, no blocking)."""
        from kubernetes_asyncio import client as async_client

        async with self.async_hook.get_conn() as api:
            v1 = async_client.CoreV1Api(api)
            config_map = await v1.read_namespaced_config_map(km.spec_config_map_name(job_id), self.namespace)
            pods = await v1.list_namespaced_pod(self.namespace, label_selector=self._selector(job_id))
        record = json.loads(config_map.data["job.json"])
        return self._statuses(self._merge(record, {p.metadata.name: p for p in pods.items}))

    @staticmethod
    def _statuses(record: dict[str, Any]) -> list[NodeStatus]:
        return [NodeStatus(n["name"], n["role"], n["index"], n.get("state", STOPPED), n["cpu"], n["memory_mb"],
                           n.get("restarts", 0), n.get("exit_code"), n.get("reason", "stopped"), n.get("oom_kills", 0))
                for n in record["nodes"].values()]

    def metrics(self, job_id: str) -> dict[str, Any]:
        """The master's metrics plus each pod's CPU (cores, ``cpu_rate``) and memory from the
        metrics API (metrics-server); without it, no usage (logged)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.utils import parse_quantity

        record = self._record(job_id)
        try:
            metrics = self.master_call(job_id, "/metrics", timeout=5.0)
        except ConnectionError:
            metrics = {"throughput": 0.0, "nodes": {}, "status": None}
        by_pod = {n["pod"]: n for n in record["nodes"].values() if n.get("state") != STOPPED}
        usage = {}
        try:
            items = client.CustomObjectsApi(self.hook.api_client).list_namespaced_custom_object(
                "metrics.k8s.io", "v1beta1", self.namespace, "pods", label_selector=self._selector(job_id))["items"]
        except ApiException as err:
            log.warning("no pod metrics for job %s (metrics.k8s.io: %s %s): utilisation is not measured",
                        job_id, err.status, err.reason)
            items = []
        for item in items:
            node = by_pod.get(item["metadata"]["name"])
            if node is None:
                continue
            cpu = sum(float(parse_quantity(c["usage"]["cpu"])) for c in item["containers"])
            memory = sum(float(parse_quantity(c["usage"]["memory"])) for c in item["containers"]) / 2**20
            usage[node["name"]] = {"role": node["role"], "cpu_rate": cpu, "memory_mb": memory, "memory_peak_mb": None,
                                   "cpu": node["cpu"], "memory_limit_mb": node["memory_mb"]}
        metrics["usage"] = usage
        metrics["usage_time"] = time.monotonic()
        return metrics

    def relaunch(self, job_id: str, node_name: str, cpu: float | None = None, memory_mb: float | None = None) -> NodeStatus:
        """Replace one node's pod (optionally with new resources) and re-join it to the job: a
        worker's shards are requeued first, a PS makes the job roll back to its last checkpoint, a
        master is deleted without its dependents (``Orphan``), which are then re-owned."""
        record = self._record(job_id)
        node = record["nodes"][node_name]
        node["cpu"] = node["cpu"] if cpu is None else cpu
        node["memory_mb"] = node["memory_mb"] if memory_mb is None else memory_mb
        node["restarts"] = node.get("restarts", 0) + 1
        node.pop("state", None)
        record["events"].append({"time": time.time(), "node": node_name, "event": "relaunch", "cpu": node["cpu"],
                                 "memory_mb": node["memory_mb"]})
        if node["role"] == "worker":
            self.master_call(job_id, "/node_lost", {"node": node_name})
        self._delete_pod(node["pod"], orphan=node["role"] == "master")
        created = self._create_pod(record, node)
        if node["role"] == "master":
            record["master_uid"] = created.metadata.uid
            self._reown(job_id, created.metadata.uid)
        self._write(job_id, record)
        if node["role"] in ("master", "ps"):
            self._wait_ready(record, [node_name])
        if node["role"] == "ps":
            self.master_call(job_id, "/restore", {})
        return next(s for s in self.status(job_id) if s.name == node_name)

    def _reown(self, job_id: str, master_uid: str) -> None:
        """Point every object of the job at the new master pod (after an ``Orphan`` deletion)."""
        owner = {"metadata": {"ownerReferences": km.owner_references(master_uid, job_id)}}
        selector = self._selector(job_id)
        for kind in ("pod", "service", "config_map", "secret"):
            items = getattr(self.core, f"list_namespaced_{kind}")(self.namespace, label_selector=selector).items
            for item in items:
                if item.metadata.name != km.master_name(job_id) or kind != "pod":
                    getattr(self.core, f"patch_namespaced_{kind}")(item.metadata.name, self.namespace, owner)

    def recover(self, job_id: str) -> list[dict[str, Any]]:
        """Relaunch every failed node: more memory after an OOM kill (×``OOM_MEMORY_GROWTH``); a
        worker the cluster cannot place leaves the job (it trains on with fewer workers)."""
        events = []
        for status in self.status(job_id):
            if status.state not in FAILED_STATES:
                continue
            started = time.time()
            if status.state == UNSCHEDULABLE and status.role == "worker":
                self._remove_worker(job_id, status.name, reason=status.reason)
                events.append({"node": status.name, "state": status.state, "reason": status.reason,
                               "action": "removed from the job", "recovered_in_s": time.time() - started})
                continue
            memory = status.memory_mb
            if status.state == OOM_KILLED and memory:
                memory = math.ceil(memory * OOM_MEMORY_GROWTH / 64) * 64
            self.relaunch(job_id, status.name, memory_mb=memory)
            events.append({"node": status.name, "state": status.state, "reason": status.reason,
                           "memory_mb": memory, "recovered_in_s": time.time() - started})
        return events

    def _remove_worker(self, job_id: str, name: str, reason: str) -> None:
        record = self._record(job_id)
        self.master_call(job_id, "/node_lost", {"node": name})
        self._delete_pod(record["nodes"][name]["pod"])
        record["nodes"][name]["state"] = STOPPED
        record["config"]["workers"] = max(1, record["config"]["workers"] - 1)
        record["events"].append({"time": time.time(), "node": name, "event": "removed", "reason": reason})
        self._write(job_id, record)

    def _resize_in_place(self, node: dict[str, Any]) -> None:
        """New requests = limits through the ``resize`` subresource (the pod keeps running)."""
        resources = km.container_resources(node["cpu"], node["memory_mb"], node.get("gpu", 0))
        body = {"spec": {"containers": [{"name": node["role"], "resources": resources}]}}
        self.core.patch_namespaced_pod_resize(node["pod"], self.namespace, body)

    def _wait_exit(self, node: dict[str, Any], timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                pod = self.core.read_namespaced_pod(node["pod"], self.namespace)
            except ApiException as err:
                if self._not_found(err):
                    return
                raise
            if pod_state(pod, self.pending_timeout_s)[0] != RUNNING:
                return
            time.sleep(self.poll_s)
        log.warning("%s did not exit %.0f s after /drain: deleting it", node["name"], timeout_s)

    def resize(self, job_id: str, config: Configuration) -> dict[str, Any]:
        """Change the job to ``config`` (see the module docstring); returns the actions taken."""
        record = self.read_job(job_id)
        current = Configuration(**record["config"])
        started = time.monotonic()
        actions = []
        ps_resources = (config.ps_cpu, config.ps_memory_mb) != (current.ps_cpu, current.ps_memory_mb)
        ps_nodes = [n for n in record["nodes"].values() if n["role"] == "ps"]
        if config.ps == current.ps and ps_resources and self.in_place_resize:
            for node in ps_nodes:
                node.update(cpu=config.ps_cpu, memory_mb=config.ps_memory_mb or None)
                self._resize_in_place(node)
            actions.append(f"ps resized in place to {config.ps_cpu:g} CPU / {config.ps_memory_mb:g} MB")
        elif config.ps != current.ps or ps_resources:
            self.master_call(job_id, "/checkpoint", {})
            for node in ps_nodes:
                self._delete_pod(node["pod"])
                del record["nodes"][node["name"]]
            self._start_ps(record, config)
            self.master_call(job_id, "/restore", {})
            actions.append(f"ps {current.ps}×{current.ps_cpu:g} → {config.ps}×{config.ps_cpu:g} "
                           "(checkpoint, new pods, re-partition)")
        workers = sorted((n for n in record["nodes"].values() if n["role"] == "worker" and n.get("state") != STOPPED),
                         key=lambda n: n["index"])
        worker_resources = ((config.worker_cpu, config.worker_memory_mb, config.worker_gpu)
                            != (current.worker_cpu, current.worker_memory_mb, current.worker_gpu))
        in_place = (self.in_place_resize and config.worker_gpu == current.worker_gpu
                    and _threads(config.worker_cpu) == _threads(current.worker_cpu))
        if worker_resources and in_place:
            for node in workers[: config.workers]:
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None)
                self._resize_in_place(node)
            actions.append(f"workers resized in place to {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        elif worker_resources:
            for node in workers[: config.workers]:
                self.master_call(job_id, "/drain", {"node": node["name"]})
                self._wait_exit(node)
                self._delete_pod(node["pod"])
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None, gpu=config.worker_gpu,
                            restarts=node.get("restarts", 0) + 1)
                self._create_pod(record, node)
            actions.append(f"workers relaunched with {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        for node in workers[config.workers:]:
            self.master_call(job_id, "/drain", {"node": node["name"]})
            self._wait_exit(node)
            self._delete_pod(node["pod"])
            node["state"] = STOPPED
            actions.append(f"{node['name']} removed")
        next_index = max((n["index"] for n in record["nodes"].values() if n["role"] == "worker"), default=-1) + 1
        for offset in range(config.workers - len(workers)):
            actions.append(f"{self._add_worker(record, config, next_index + offset)} added")
        record["config"] = config.to_row()
        record["resizes"] = record.get("resizes", 0) + 1
        record["events"].append({"time": time.time(), "event": "resize", "actions": actions})
        self._write(job_id, record)
        return {"actions": actions, "seconds": time.monotonic() - started}

    def set_cpu(self, job_id: str, node_name: str, cpu: float) -> None:
        """A node's new CPU: in place with ``in_place_resize`` (same torch threads), else a relaunch."""
        record = self._record(job_id)
        node = record["nodes"][node_name]
        if self.in_place_resize and _threads(cpu) == _threads(node["cpu"]):
            node["cpu"] = cpu
            self._resize_in_place(node)
            self._write(job_id, record)
        else:
            self.relaunch(job_id, node_name, cpu=cpu)

    def kill_node(self, job_id: str, node_name: str) -> None:
        """Fault injection: delete the node's pod at once, as a node crash would."""
        self._delete_pod(self._record(job_id)["nodes"][node_name]["pod"], wait=False)

    def _delete_job(self, job_id: str) -> None:
        """Delete every object of the job: the master (its dependents are garbage-collected on a
        real cluster), then whatever carries the job's label, so that nothing is left even where
        the garbage collector lags; waits until no pod is left."""
        from kubernetes.client.exceptions import ApiException

        self._delete_pod(km.master_name(job_id), wait=False)
        selector = self._selector(job_id)
        for kind in ("pod", "service", "config_map", "secret"):
            try:
                getattr(self.core, f"delete_collection_namespaced_{kind}")(
                    self.namespace, label_selector=selector, grace_period_seconds=0)
            except ApiException as err:
                if not self._not_found(err):
                    raise
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._pods(job_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods of job {job_id} still exist {STOP_TIMEOUT_S:.0f} s after deletion: "
                                   f"{sorted(self._pods(job_id))}")
            time.sleep(self.poll_s)

    def stop(self, job_id: str) -> None:
        """Delete the job's pods, Services, Secret and ConfigMap (its dir on the volume stays:
        checkpoints and metrics)."""
        self._delete_job(job_id)
