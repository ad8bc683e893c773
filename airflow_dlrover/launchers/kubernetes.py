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
``/restore`` (re-partition; the checkpoint files are on the job's ReadWriteMany volume). A trainer
of the user's gets its own pods (``kubernetes_manifests.trainer_pod``), stopped with its grace
period and restarted as its kind says (``launchers.kinds``); its reports are read from its pods'
logs. A node's new CPU / memory is a relaunch, or an in-place pod resize (``pods/resize``,
Kubernetes ≥ 1.33) with ``in_place_resize=True`` when its torch thread count does not change.

The master's HTTP API is reached at ``master_url`` (default: the ``J-master`` Service's cluster DNS
name, for Airflow workers that run in the cluster; a ``kubectl port-forward`` or ingress URL
otherwise; ``{job_id}`` and ``{namespace}`` are filled in).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import time
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_dlrover.launchers import default_jobs_dir
from airflow_dlrover.launchers import kubernetes_manifests as km
from airflow_dlrover.launchers.base import (
    FAILED, FAILED_STATES, LOST, OOM_KILLED, PENDING, RUNNING, STOPPED, SUCCEEDED, UNSCHEDULABLE, Launcher,
    NodeStatus, statuses, with_live_states,
)
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.transitions import TransitionCosts, measured as measured_transitions
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec, check_job_id

log = logging.getLogger(__name__)

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


def pod_state(pod: Any, pending_timeout_s: float = T.PENDING_TIMEOUT_S, now: float | None = None,
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
        if code == C.USER_ERROR_EXIT_CODE and terminated.message:
            return FAILED, code, terminated.message, last_oom
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


class KubernetesLauncher(Launcher):
    """See the module docstring. ``placement`` says where the pods run (namespace, image, volumes,
    service account, node selector, tolerations); ``hook`` / ``async_hook`` default to the
    provider's hooks on ``kubernetes_conn_id``."""

    def __init__(self, placement: km.Placement, *, kubernetes_conn_id: str = "kubernetes_default",
                 jobs_dir: str | Path | None = None, master_url: str | None = None,
                 pending_timeout_s: float = T.PENDING_TIMEOUT_S, in_place_resize: bool = False,
                 poll_s: float = T.POD_POLL_S, hook: Any = None, async_hook: Any = None):
        super().__init__()
        self._renewers: dict[str, threading.Event] = {}  # lock holder identity → stops its renewal
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

    @property
    def coordination(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self.hook.api_client)

    @property
    def networking(self) -> Any:
        from kubernetes import client

        return client.NetworkingV1Api(self.hook.api_client)

    def _selector(self, job_id: str, role: str | None = None) -> str:
        return f"{km.LABEL_JOB}={job_id}" + (f",{km.LABEL_ROLE}={role}" if role else "")

    @staticmethod
    def _not_found(err: Exception) -> bool:
        return getattr(err, "status", None) == 404

    # -- the job's record ----------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        """This Airflow worker's folder for the job's reports (the job's own dir is on the volume)."""
        folder = self.jobs_dir / check_job_id(job_id)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
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

    def _live_states(self, job_id: str, record: dict[str, Any]) -> dict[str, tuple]:
        """Each node's state from its pod (one list call); a stopped node has none."""
        return self._pod_states(record, self._pods(job_id))

    def _pod_states(self, record: dict[str, Any], pods: dict[str, Any]) -> dict[str, tuple]:
        now = time.time()
        out = {}
        for name, node in record["nodes"].items():
            if node.get("state") == STOPPED:
                continue
            pod = pods.get(node["pod"])
            started = _timestamp(pod.status.start_time) if pod is not None and pod.status else None
            out[name] = (*pod_state(pod, self.pending_timeout_s, now), started or 0)
        return out

    def _read_pod(self, name: str) -> Any:
        """The pod by name; None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as err:
            if not self._not_found(err):
                raise
            return None

    def _node_state(self, job_id: str, record: dict[str, Any], name: str) -> str:
        """One node's state from its pod, read by name."""
        return pod_state(self._read_pod(record["nodes"][name]["pod"]), self.pending_timeout_s)[0]

    def _master_url(self, job_id: str) -> str:
        return self.master_url.format(job_id=job_id, namespace=self.namespace)

    def _acquire(self, job_id: str) -> str:
        """A Lease ``J-launcher`` held by this process (create is atomic: a second holder gets
        409 and waits), renewed every ``JOB_LOCK_RENEW_S`` until released (``_renew``); one not
        renewed for ``JOB_LOCK_TTL_S`` is taken over (its holder died)."""
        import os
        import socket
        import uuid

        from kubernetes.client.exceptions import ApiException

        name, identity = km.lock_lease_name(job_id), f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        while True:
            now = datetime.now(timezone.utc)
            body = {"metadata": {"name": name, "labels": {km.LABEL_JOB: job_id, km.LABEL_MANAGED_BY: "airflow-dlrover"}},
                    "spec": {"holderIdentity": identity, "leaseDurationSeconds": int(T.JOB_LOCK_TTL_S),
                             "acquireTime": now, "renewTime": now}}
            try:
                self.coordination.create_namespaced_lease(self.namespace, body)
                stop = threading.Event()
                self._renewers[identity] = stop
                threading.Thread(target=self._renew, args=(name, identity, stop), daemon=True,
                                 name=f"lease-{name}").start()
                return identity
            except ApiException as err:
                if err.status != 409:
                    raise
            try:
                lease = self.coordination.read_namespaced_lease(name, self.namespace)
            except ApiException as err:
                if self._not_found(err):
                    continue  # released meanwhile
                raise
            renewed = lease.spec.renew_time or lease.spec.acquire_time
            if renewed is not None and (now - renewed).total_seconds() > (lease.spec.lease_duration_seconds or 0):
                log.warning("lock of job %s held by %s since %s: taken over", job_id, lease.spec.holder_identity, renewed)
                self._delete_lease(name, lease.metadata.resource_version)
                continue
            time.sleep(self.poll_s)

    def _renew(self, name: str, identity: str, stop: threading.Event) -> None:
        """Renew the Lease while this process holds it: its ``renewTime``, on the version read (a
        lease another process took over is not written; this one then stops, with an error)."""
        from kubernetes.client.exceptions import ApiException

        while not stop.wait(T.JOB_LOCK_RENEW_S):
            try:
                lease = self.coordination.read_namespaced_lease(name, self.namespace)
                if lease.spec.holder_identity != identity:
                    log.error("lock %s was taken over by %s: this launcher no longer holds it", name,
                              lease.spec.holder_identity)
                    return
                body: dict[str, Any] = {"spec": {"renewTime": datetime.now(timezone.utc)}}
                if lease.metadata.resource_version:  # a precondition: a lease taken over meanwhile stays
                    body["metadata"] = {"resourceVersion": lease.metadata.resource_version}
                self.coordination.patch_namespaced_lease(name, self.namespace, body)
            except ApiException as err:
                if self._not_found(err) or stop.is_set():
                    return
                log.warning("lock %s not renewed: %s", name, err)
            except Exception as err:  # noqa: BLE001 - the API server unreachable: try again at the next renewal
                log.warning("lock %s not renewed: %s", name, err)

    def _release(self, job_id: str, identity: str) -> None:
        from kubernetes.client.exceptions import ApiException

        stop = self._renewers.pop(identity, None)
        if stop is not None:
            stop.set()
        name = km.lock_lease_name(job_id)
        try:
            lease = self.coordination.read_namespaced_lease(name, self.namespace)
        except ApiException as err:
            if self._not_found(err):
                return
            raise
        if lease.spec.holder_identity == identity:  # not one that took over after our TTL
            self._delete_lease(name, lease.metadata.resource_version)

    def _delete_lease(self, name: str, resource_version: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:  # only the version read: a lease taken meanwhile by another process stays
            self.coordination.delete_namespaced_lease(
                name, self.namespace, body={"preconditions": {"resourceVersion": resource_version}})
        except ApiException as err:
            if not (self._not_found(err) or err.status == 409):
                raise

    # -- pods ----------------------------------------------------------------------------------
    # -- a trainer of the user's -----------------------------------------------------------------
    def _peer_address(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> str:
        return km.trainer_address(job_id, node["role"], node["index"], self.namespace)

    def _rendezvous(self, job_id: str, record: dict[str, Any]) -> tuple[str, int]:
        return km.trainer_address(job_id, "worker", 0, self.namespace).rsplit(":", 1)[0], km.RENDEZVOUS_PORT

    def _metrics_file(self, job_id: str, node: dict[str, Any]) -> str:
        return km.TRAINER_METRICS_FILE

    def _checkpoint_dir(self, job_id: str) -> str:
        return km.TRAINER_CHECKPOINT_DIR

    def _read_output(self, job_id: str, node: dict[str, Any], via: str) -> tuple[str, float | None]:
        """The trainer container's log (its reports are JSON lines there: ``TRAINER_METRICS_FILE``),
        or for ``prometheus`` its reports sidecar's (``SCRAPE_CONTAINER``). Read raw: the client
        (36.x) turns a log that is not JSON into the ``repr`` of its bytes."""
        from kubernetes.client.exceptions import ApiException

        container = km.SCRAPE_CONTAINER if via == "prometheus" else node["role"]
        try:
            response = self.core.read_namespaced_pod_log(node["pod"], self.namespace, container=container,
                                                         _preload_content=False)
            return response.data.decode(errors="replace"), time.time()
        except ApiException as err:
            if err.status in (400, 404):  # not started yet, or gone
                return "", None
            raise

    def _start_trainer_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], argv: list[str],
                            env: dict[str, str]) -> None:
        """The node's pod of the trainer's image, with its grace period and, for a trainer that serves
        Prometheus text, its reports sidecar."""
        trainer = self.trainer(job_id)
        metrics = (trainer.metrics_port, trainer.metrics_path, trainer.metrics_names) if trainer.metrics_port else None
        body = km.trainer_pod(job_id, node, argv=argv, env=env, image=trainer.image, grace_s=trainer.grace_s,
                              placement=self.placement, owner=km.config_map_owner(record["config_map_uid"], job_id),
                              metrics=metrics)
        self.core.create_namespaced_pod(self.namespace, body)

    def _create_trainer_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """The ConfigMap first (it owns the rest: deleting it garbage-collects the job), then the
        Secret, the nodes' Service and the NetworkPolicy."""
        if not self.trainer(spec.job_id).image:
            raise InvalidInputError("trainer.image", "", "the trainer's container image, to run it on Kubernetes")
        record["namespace"] = self.namespace
        created = self.core.create_namespaced_config_map(self.namespace,
                                                         km.trainer_config_map(spec, self.placement, record))
        record["config_map_uid"] = created.metadata.uid
        for body in km.trainer_objects(spec, self.placement, km.config_map_owner(created.metadata.uid, spec.job_id)):
            create = {"Secret": self.core.create_namespaced_secret, "Service": self.core.create_namespaced_service,
                      "NetworkPolicy": self.networking.create_namespaced_network_policy}[body["kind"]]
            create(self.namespace, body)

    def _stop_nodes(self, job_id: str, record: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        """Delete the pods together, each with its grace period (a trainer checkpoints on SIGTERM),
        then wait until they are gone."""
        for node in nodes:
            self._delete_pod(node["pod"], wait=False, grace_s=node.get("grace_s", 0))
        for node in nodes:
            self._wait_deleted(node["pod"], T.STOP_TIMEOUT_S + node.get("grace_s", 0))

    def _place(self, record: dict[str, Any], node: dict[str, Any], previous: dict[str, Any] | None) -> None:
        role, index = node["role"], node["index"]
        node["pod"] = km.master_name(record["job_id"]) if role == "master" else {
            "ps": km.ps_name, "worker": km.worker_name}[role](record["job_id"], index)

    def _create_pod(self, record: dict[str, Any], node: dict[str, Any]) -> Any:
        body = km.node_pod(record["job_id"], node["role"], node["index"], cpu=node["cpu"], memory_mb=node["memory_mb"],
                           gpu=node.get("gpu", 0), ps_count=node.get("count", 1), placement=self.placement,
                           master_uid=record.get("master_uid"))
        return self.core.create_namespaced_pod(self.namespace, body)

    def _delete_pod(self, name: str, *, orphan: bool = False, wait: bool = True, grace_s: float = 0) -> None:
        """Delete a pod (``grace_s``: SIGTERM to SIGKILL; 0 for our runtime's nodes, which are
        replaced from the master's state) and wait until it is gone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        options = client.V1DeleteOptions(grace_period_seconds=int(math.ceil(grace_s)),
                                         propagation_policy="Orphan" if orphan else "Background")
        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=options)
        except ApiException as err:
            if not self._not_found(err):
                raise
        if wait:
            self._wait_deleted(name, T.STOP_TIMEOUT_S + grace_s)

    def _wait_deleted(self, name: str, timeout_s: float) -> None:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as err:
                if self._not_found(err):
                    return
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {name} still exists {timeout_s:.0f} s after its deletion")
            time.sleep(self.poll_s)

    def _wait_ready(self, job_id: str, record: dict[str, Any], names: list[str]) -> None:
        """Wait until the nodes' pods are Ready; raise with the pod's reason when one cannot start."""
        timeout_s = T.POD_START_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        for name in names:
            pod_name = record["nodes"][name]["pod"]
            while True:
                pod = self._read_pod(pod_name)
                if pod is not None and _ready(pod):
                    break
                state, _, reason, _ = pod_state(pod, self.pending_timeout_s)
                if state in FAILED_STATES or state == SUCCEEDED or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} of job {record['job_id']} did not start ({pod_name}: "
                                       f"{reason or state}, waited {timeout_s - (deadline - time.monotonic()):.0f} s)")
                time.sleep(self.poll_s)

    def _create_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """The master pod first (it owns everything else: deleting it garbage-collects the job),
        then the Secret (the job's key), the ConfigMap (spec and record) and the Services."""
        record["namespace"] = self.namespace
        record["master_uid"] = self._create_pod(record, record["nodes"]["master"]).metadata.uid
        owners = km.owner_references(record["master_uid"], spec.job_id)
        for body in km.job_objects(spec, self.placement, owners, record):
            create = {"Secret": self.core.create_namespaced_secret, "ConfigMap": self.core.create_namespaced_config_map,
                      "Service": self.core.create_namespaced_service,
                      "NetworkPolicy": self.networking.create_namespaced_network_policy}[body["kind"]]
            create(self.namespace, body)

    def _start_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> None:
        """Create the node's pod; a relaunched master re-owns the job's objects."""
        created = self._create_pod(record, node)
        if node["role"] == "master" and node.get("restarts", 0) > 0:
            record["master_uid"] = created.metadata.uid
            self._reown(job_id, created.metadata.uid)

    def _stop_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], *, replacing: bool) -> None:
        """Delete the pod (a master being replaced without its dependents: ``Orphan``; a trainer's
        node with its grace period)."""
        self._delete_pod(node["pod"], orphan=replacing and node["role"] == "master", grace_s=node.get("grace_s", 0))

    def _set_limits(self, job_id: str, node: dict[str, Any]) -> None:
        self._resize_in_place(node)

    def can_resize_in_place(self) -> bool:
        return self.in_place_resize

    def transition_costs(self) -> TransitionCosts:
        """The runtime's measured table with a pod's start added where a pod starts."""
        return measured_transitions().on_kubernetes()

    def _ps_addresses(self, job_id: str, record: dict[str, Any], names: list[str]) -> list[str]:
        return km.ps_addresses(job_id, len(names), self.namespace)

    def _adoptable(self, record: dict[str, Any]) -> bool:
        return record["nodes"]["master"]["state"] in (RUNNING, PENDING)

    def _discard(self, job_id: str, record: dict[str, Any]) -> None:
        self._delete_job(job_id)  # a lost master, or a launch that failed half-way

    # -- the interface -------------------------------------------------------------------------
    def launch(self, spec: JobSpec, config: Configuration) -> str:
        """See ``Launcher.launch``; a job id that cannot name the job's objects is refused first."""
        km.check_job_id(spec.job_id, config)
        return super().launch(spec, config)

    async def astatus(self, job_id: str) -> list[NodeStatus]:
        """:meth:`status` through ``AsyncKubernetesHook`` (for triggers: no thread, no blocking)."""
        from kubernetes_asyncio import client as async_client

        async with self.async_hook.get_conn() as api:
            v1 = async_client.CoreV1Api(api)
            config_map = await v1.read_namespaced_config_map(km.spec_config_map_name(job_id), self.namespace)
            pods = await v1.list_namespaced_pod(self.namespace, label_selector=self._selector(job_id))
        record = json.loads(config_map.data["job.json"])
        return statuses(with_live_states(record, self._pod_states(record, {p.metadata.name: p for p in pods.items})))

    def metrics(self, job_id: str) -> dict[str, Any]:
        """The master's metrics plus each pod's CPU (cores, ``cpu_rate``) and memory from the
        metrics API (metrics-server; the node's containers, not a reports sidecar); without it, no
        usage (logged)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.utils import parse_quantity

        record = self._record(job_id)
        metrics = self.kind(job_id, record).job_metrics(record)
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
            containers = [c for c in item["containers"] if c["name"] != km.SCRAPE_CONTAINER]  # not the node's allocation
            cpu = sum(float(parse_quantity(c["usage"]["cpu"])) for c in containers)
            memory = sum(float(parse_quantity(c["usage"]["memory"])) for c in containers) / 2**20
            usage[node["name"]] = {"role": node["role"], "cpu_rate": cpu, "memory_mb": memory, "memory_peak_mb": None,
                                   "cpu": node["cpu"], "memory_limit_mb": node["memory_mb"]}
        metrics["usage"] = usage
        metrics["usage_time"] = time.monotonic()
        return metrics

    def _reown(self, job_id: str, master_uid: str) -> None:
        """Point every object of the job at the new master pod (after an ``Orphan`` deletion)."""
        owner = {"metadata": {"ownerReferences": km.owner_references(master_uid, job_id)}}
        selector = self._selector(job_id)
        for api, kind in [(self.core, k) for k in ("pod", "service", "config_map")] + [
                (self.networking, "network_policy")]:
            items = getattr(api, f"list_namespaced_{kind}")(self.namespace, label_selector=selector).items
            for item in items:
                if item.metadata.name != km.master_name(job_id) or kind != "pod":
                    getattr(api, f"patch_namespaced_{kind}")(item.metadata.name, self.namespace, owner)
        # by name: listing Secrets would read every Secret of the namespace (the Role allows no list)
        self.core.patch_namespaced_secret(km.authkey_secret_name(job_id), self.namespace, owner)

    def _resize_in_place(self, node: dict[str, Any]) -> None:
        """New requests = limits through the ``resize`` subresource (the pod keeps running)."""
        resources = km.container_resources(node["cpu"], node["memory_mb"], node.get("gpu", 0))
        body = {"spec": {"containers": [{"name": node["role"], "resources": resources}]}}
        self.core.patch_namespaced_pod_resize(node["pod"], self.namespace, body)

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
        deletions = [(getattr(api, f"delete_collection_namespaced_{kind}"), (), {"label_selector": selector})
                     for api, kind in [(self.core, k) for k in ("pod", "service", "config_map")]
                     + [(self.networking, "network_policy")]]
        # the Secret by name: a collection's deletion returns what it deleted (the Role allows none)
        deletions.append((self.core.delete_namespaced_secret, (km.authkey_secret_name(job_id),), {}))
        for delete, args, kwargs in deletions:
            try:
                delete(*args, self.namespace, grace_period_seconds=0, **kwargs)
            except ApiException as err:
                if not self._not_found(err):
                    raise
        deadline = time.monotonic() + T.STOP_TIMEOUT_S
        while self._pods(job_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods of job {job_id} still exist {T.STOP_TIMEOUT_S:.0f} s after deletion: "
                                   f"{sorted(self._pods(job_id))}")
            time.sleep(self.poll_s)

    def stop(self, job_id: str) -> None:
        """Delete the job's pods, Services, NetworkPolicies, Secret and ConfigMap (its dir on the volume stays:
        checkpoints and metrics)."""
        self._delete_job(job_id)
