"""The Kubernetes objects of one training job, as plain dicts (no Kubernetes client needed).

``render_job(spec, config, image=...)`` returns, for job ``J`` in namespace ``NS``:

* Secret ``J-authkey``: the key of every PS connection (``JobSpec.authkey``), mounted read-only in
  each of our runtime's pods as a file (``DLROVER_AUTHKEY_FILE``; a trainer's, by the contract, gets
  ``DLROVER_JOB_KEY`` from it); the ConfigMap's copy of the spec has it blanked;
* ConfigMap ``J-spec``: ``spec.json`` (``JobSpec.to_json()``), mounted read-only as
  ``<job dir>/spec.json`` in every pod, and ``job.json``, the launcher's record of the job;
* Pod ``J-master`` and ClusterIP Service ``J-master`` (port :data:`MASTER_PORT`, the HTTP API);
* headless Service ``J-ps`` and Pods ``J-ps-<i>`` with ``hostname``/``subdomain``: each PS has the
  stable name ``J-ps-<i>.J-ps.NS.svc`` (:func:`ps_addresses`), which survives a relaunch;
* Pods ``J-worker-<i>``, started with ``--master J-master.NS.svc:<MASTER_PORT>``.

Every pod runs ``python -m airflow_dlrover.runtime ROLE`` with the arguments ``local.py`` passes,
as uid/gid 1000 with a read-only root filesystem, no capabilities, no privilege escalation and the
runtime's default seccomp profile; requests equal limits (Guaranteed QoS). ``restartPolicy: Never``:
the launcher, not the kubelet, relaunches a node (it must tell the master first).

Storage. The job dir is the sub-directory ``J`` of a ReadWriteMany PersistentVolumeClaim
(``volume_claim``, default :data:`DEFAULT_VOLUME_CLAIM`, created once per namespace: see
docs/kubernetes.md) mounted at :data:`JOB_DIR` in every pod. The master creates
``checkpoints/ckpt-N/`` there and each PS writes and reads ``ps-<i>.npz`` at the same path, and the
master's ``master_state.json`` outlives the master pod, so a relaunched master resumes. An optional
``data_volume_claim`` is mounted read-only at :data:`DATA_DIR` in the workers, for ``spec.data``
files (``job_args.dataset`` then names the path inside the pod). ``<job dir>/run`` (the ``*.addr``
announcements, not needed here: ports are fixed and names stable) and ``/tmp`` are emptyDirs.

Ownership. With ``master_uid`` every object but the master pod carries an ownerReference to the
master pod, so deleting the master garbage-collects the job (the PVC is shared and not owned).
A launcher creates the master pod first (rendered without ``master_uid``), then renders again with
its uid and creates the rest; the kubelet retries the master's Secret and ConfigMap mounts until
they exist. To relaunch the master, the launcher deletes it with ``propagationPolicy: Orphan`` and
re-owns the job's objects to the new master.

Network. Every request to the master carries an HMAC of the job's key (``runtime.auth``) and every
PS connection proves the key, so a stranger who reaches a port can do nothing; the job's
NetworkPolicies (:func:`network_policies`, one per role: a policy selects one set of pods) also
keep strangers from reaching them, ingress and egress, by named port:

* master: ingress on ``http`` from the job's workers and from the launcher (the Airflow pods:
  ``launcher_namespace`` / ``launcher_pod_labels``); egress to the job's PS on ``rpc``;
* PS: ingress on ``rpc`` from the job's master and workers (the job evaluates and exports its model
  itself); no egress;
* worker: no ingress; egress to the master on ``http`` and the PS on ``rpc`` — and, when the job's
  data or export is an object-store URL (``s3://``, ``gs://``, ...), on ``STORAGE_EGRESS_PORTS`` to
  anywhere (the store's endpoints are not pods; narrow it with your own policy, or keep the data
  on the job's volumes);
* every role: egress to the cluster DNS (``kube-system`` pods ``k8s-app: kube-dns``, port 53).

A trainer of the user's (``spec.trainer``, ``launchers.contract``) has no master: its ConfigMap is
created first and owns the rest (Secret, the headless Service ``J-nodes`` that names every node
``J-<role>-<i>.J-nodes.NS.svc``, one NetworkPolicy, the pods). Its pods run the trainer's image
and argv with the contract's environment (the job's key from the Secret as ``DLROVER_JOB_KEY``),
the same labels, security context and requests = limits as ours; ``DLROVER_CHECKPOINT_DIR`` is
``<job dir>/checkpoint`` on the job's volume, mounted as a subPath of its own so that the kubelet
creates it before the container starts (or the trainer's own ``checkpoint_dir``), and the
reports go to the pod's log (``DLROVER_METRICS_FILE=/dev/stdout``), which the launcher reads —
or, for a trainer that serves Prometheus text on ``metrics_port``, to the log of the pod's native
sidecar ``SCRAPE_CONTAINER`` (the runtime image running ``airflow_dlrover.scrape`` on the pod's loopback,
requests = limits ``SCRAPE_SIDECAR_CPU`` / ``_MEMORY_MB``; Kubernetes ≥ 1.29), and the pod carries
the ``prometheus.io/*`` annotations for a cluster Prometheus (which needs its own policy to reach it).
The policy admits the job's own pods to each other on any port, and egress to DNS and, for the
data a trainer reads itself, to ``STORAGE_EGRESS_PORTS``.
"""


from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_dlrover.launchers import contract
from airflow_dlrover.launchers.base import torch_threads
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError
from airflow_dlrover.runtime.__main__ import AUTHKEY_FILE_ENV, TERMINATION_FILE_ENV
from airflow_dlrover.runtime.spec import JobSpec

# -- tuning constants (one line of reason each) ---------------------------------------------------
MASTER_PORT = 8080  # the master's HTTP API (fixed in a pod, unlike local.py's free port: a Service needs it)
#: the spec (with its dataset index: ~32 bytes per row group) must fit the ConfigMap that carries it;
#: the API server refuses objects over 1 MiB, and the job record shares the map
SPEC_CONFIG_MAP_MAX_BYTES = 900_000
#: fsspec protocols that read and write the pod's own filesystem (the job's volumes)
LOCAL_PROTOCOLS = ("file", "local")
#: ports a worker may reach anywhere when the job's data or export is on an object store (HTTPS)
STORAGE_EGRESS_PORTS = (443,)
PS_PORT = 7070  # each PS's transport port (fixed: the DNS name + port is the address the master is given)
JOB_DIR = "/var/lib/dlrover/job"  # the job dir in every pod: same path everywhere, so checkpoint paths agree
TRAINER_CHECKPOINT_DIR = f"{JOB_DIR}/checkpoint"  # a trainer's default DLROVER_CHECKPOINT_DIR, its own mount
AUTHKEY_DIR = "/var/run/dlrover/authkey"  # where the job's Secret is mounted in our runtime's pods
DATA_DIR = "/var/lib/dlrover/data"  # where data_volume_claim is mounted (read-only) in the workers
DEFAULT_VOLUME_CLAIM = "dlrover-jobs"  # the RWX claim holding every job's dir (one sub-directory per job)
#: Memory request/limit of a PS or worker whose plan has no memory (0/None = no memory model).
#: A steady worker measures ~200 MB RSS with torch (optimizer/constants.py, OOM_MIN_RISE_MB note),
#: the default PS tables ~70 MB: 1 GiB leaves room, and an OOM kill grows it by OOM_MEMORY_GROWTH.
MEMORY_FLOOR_MB = 1024
RUN_AS_ID = 1000  # the non-root uid/gid of the image (Dockerfile) and of the pod's files
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's extended resource
MASTER_READY_PERIOD_S = 2  # readiness polls of the master's GET /healthz (open: a kubelet holds no key)
PS_READY_PERIOD_S = 2  # readiness polls of a PS's port (a TCP connect; the PS drops unauthenticated ones)
NAME_MAX = 63  # DNS-1123 label length: Service names, pod hostnames and label values
TRAINER_PORT = contract.PEER_PORT  # a trainer node's port in TF_CONFIG
RENDEZVOUS_PORT = contract.RENDEZVOUS_PORT  # torch.distributed's env:// rendezvous on worker 0
#: where a trainer writes its reports on Kubernetes: its log, which the launcher reads through the API
TRAINER_METRICS_FILE = "/dev/stdout"
#: the native sidecar that scrapes a trainer's Prometheus endpoint into its own log
SCRAPE_CONTAINER = "dlrover-reports"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "dlrover.io/job"
LABEL_ROLE = "dlrover.io/role"
LABEL_INDEX = "dlrover.io/index"

# Service names are RFC 1035 labels (a leading letter), stricter than DNS-1123 labels.
_JOB_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# -- names ----------------------------------------------------------------------------------------
def master_name(job_id: str) -> str:
    return f"{job_id}-master"


def ps_service_name(job_id: str) -> str:
    return f"{job_id}-ps"


def ps_name(job_id: str, index: int) -> str:
    return f"{job_id}-ps-{index}"


def worker_name(job_id: str, index: int) -> str:
    return f"{job_id}-worker-{index}"


def master_address(job_id: str, namespace: str = "default") -> str:
    """``host:port`` of the master's HTTP API through its Service (what ``--master`` gets)."""
    return f"{master_name(job_id)}.{namespace}.svc:{MASTER_PORT}"


def lock_lease_name(job_id: str) -> str:
    """The Lease a launcher holds while it changes the job (``KubernetesLauncher._acquire``)."""
    return f"{job_id}-launcher"


def trainer_service_name(job_id: str) -> str:
    return f"{job_id}-nodes"


def trainer_address(job_id: str, role: str, index: int, namespace: str, port: int = TRAINER_PORT) -> str:
    """``host:port`` of a trainer's node: its pod's stable name under ``J-nodes``."""
    pod = (ps_name if role == "ps" else worker_name)(job_id, index)
    return f"{pod}.{trainer_service_name(job_id)}.{namespace}.svc:{port}"


def network_policy_name(job_id: str, role: str) -> str:
    return f"{job_id}-{role}-network"


def spec_config_map_name(job_id: str) -> str:
    return f"{job_id}-spec"


def authkey_secret_name(job_id: str) -> str:
    return f"{job_id}-authkey"


def ps_addresses(job_id: str, count: int, namespace: str = "default") -> list[str]:
    """The stable ``host:port`` of each PS, for the master's ``POST /cluster``."""
    return [f"{ps_name(job_id, i)}.{ps_service_name(job_id)}.{namespace}.svc:{PS_PORT}" for i in range(count)]


# -- validation -----------------------------------------------------------------------------------
def check_job_id(job_id: Any, config: Configuration) -> None:
    """The job id names every object: an RFC 1035 label, short enough for the plan's longest pod name."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InvalidInputError(
            "job_id", job_id, "a DNS-1123 label starting with a letter: lowercase letters, digits and '-'"
        )
    longest = max(master_name(job_id), ps_name(job_id, config.ps - 1), worker_name(job_id, config.workers - 1), key=len)
    if len(longest) > NAME_MAX:
        raise InvalidInputError(
            "job_id", job_id, f"at most {NAME_MAX - len(longest) + len(job_id)} characters for this plan",
            f"The pod name {longest!r} would exceed {NAME_MAX} characters.",
        )


def _check_options(namespace: Any, image: Any, service_account: Any, node_selector: Any, tolerations: Any) -> None:
    if not isinstance(namespace, str) or len(namespace) > NAME_MAX or not _DNS_LABEL.fullmatch(namespace):
        raise InvalidInputError("namespace", namespace, "a DNS-1123 label: lowercase letters, digits and '-'")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise InvalidInputError("image", image, "a container image reference like airflow-dlrover:latest")
    if service_account is not None and (
        not isinstance(service_account, str) or len(service_account) > 253
        or not _DNS_SUBDOMAIN.fullmatch(service_account)
    ):
        raise InvalidInputError("service_account", service_account, "a DNS-1123 subdomain, or None")
    if node_selector is not None and (
        not isinstance(node_selector, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in node_selector.items())
    ):
        raise InvalidInputError("node_selector", node_selector, "a mapping of label names to label values (strings)")
    if tolerations is not None and (
        isinstance(tolerations, (str, Mapping)) or not all(isinstance(t, Mapping) for t in tolerations)
    ):
        raise InvalidInputError("tolerations", tolerations, "a list of toleration objects (dicts), or None")


def config_from_plan(row: Any, field_name: str = "PLAN") -> Configuration:
    """The configuration of a plan row (``dlrover-rm plan`` output: extra keys are ignored)."""
    if not isinstance(row, Mapping):
        raise InvalidInputError(field_name, type(row).__name__, "a JSON object with the configuration columns")
    missing = [c for c in ("workers", "ps", "worker_cpu", "ps_cpu") if c not in row]
    if missing:
        raise InvalidInputError(
            f"{field_name}.{missing[0]}", None, "a number", f"Missing: {', '.join(missing)}."
        )
    values = {c: row[c] for c in CONFIG_COLUMNS if c in row and row[c] is not None}
    try:
        return Configuration(**values)
    except InvalidInputError as err:
        raise InvalidInputError(f"{field_name}.{err.field}", err.value, err.allowed) from None


# -- quantities -----------------------------------------------------------------------------------
def cpu_quantity(cores: float) -> str:
    """Cores as millicores: ``0.5`` → ``"500m"`` (at least 1m)."""
    return f"{max(1, math.ceil(round(cores * 1000, 6)))}m"


def memory_quantity(mb: float | None) -> str:
    """MB as ``"<n>Mi"``; 0/None (no memory model) takes :data:`MEMORY_FLOOR_MB`."""
    return f"{math.ceil(mb) if mb else MEMORY_FLOOR_MB}Mi"


def container_resources(cpu: float, memory_mb: float | None, gpu: int = 0) -> dict[str, Any]:
    """Requests = limits (Guaranteed QoS: the plan's resources are what the node gets, no more)."""
    amounts: dict[str, Any] = {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory_mb)}
    if gpu:
        amounts[GPU_RESOURCE] = str(int(gpu))
    return {"requests": dict(amounts), "limits": dict(amounts)}


# -- objects --------------------------------------------------------------------------------------
def _labels(job_id: str, role: str, index: int | str) -> dict[str, str]:
    return {
        LABEL_NAME: "dlrover", LABEL_MANAGED_BY: "airflow-dlrover", LABEL_JOB: job_id,
        LABEL_ROLE: role, LABEL_INDEX: str(index),
    }


def _selector(job_id: str, role: str) -> dict[str, str]:
    return {LABEL_JOB: job_id, LABEL_ROLE: role}


def _metadata(name: str, namespace: str, labels: dict[str, str], owner: list[dict[str, Any]] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if owner:
        meta["ownerReferences"] = owner
    return meta


@dataclass(frozen=True)
class Placement:
    """Where and how the job's pods run: everything but the plan. Validated on creation."""

    namespace: str = "default"
    image: str = ""
    volume_claim: str = DEFAULT_VOLUME_CLAIM
    data_volume_claim: str | None = None
    service_account: str | None = None
    node_selector: Mapping[str, str] | None = None
    tolerations: Sequence[Mapping[str, Any]] | None = None
    #: Where the launcher (the Airflow workers and triggerer) runs: its namespace (None: the job's)
    #: and the labels of its pods (None: any pod of that namespace). The NetworkPolicies admit it.
    launcher_namespace: str | None = None
    launcher_pod_labels: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _check_options(self.namespace, self.image, self.service_account, self.node_selector, self.tolerations)
        if self.launcher_namespace is not None and (
            not isinstance(self.launcher_namespace, str) or not _DNS_LABEL.fullmatch(self.launcher_namespace)
        ):
            raise InvalidInputError("launcher_namespace", self.launcher_namespace,
                                    "the namespace of the Airflow pods (a DNS-1123 label), or None for the job's")
        if self.launcher_pod_labels is not None and (
            not isinstance(self.launcher_pod_labels, Mapping) or not self.launcher_pod_labels
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.launcher_pod_labels.items())
        ):
            raise InvalidInputError("launcher_pod_labels", self.launcher_pod_labels,
                                    "a non-empty mapping of label names to values (strings), or None for any pod")
        for field_name in ("volume_claim", "data_volume_claim"):
            value = getattr(self, field_name)
            if (value is not None or field_name == "volume_claim") and (
                not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value)
            ):
                allowed = "the name of a ReadWriteMany PersistentVolumeClaim in the namespace"
                raise InvalidInputError(field_name, value, allowed + (", or None" if field_name != "volume_claim" else ""))


def owner_references(master_uid: str | None, job_id: str) -> list[dict[str, Any]] | None:
    """The ownerReference to the master pod that makes its deletion delete the job."""
    if master_uid is None:
        return None
    if not isinstance(master_uid, str) or not master_uid:
        raise InvalidInputError("master_uid", master_uid, "the uid of the created master pod, or None")
    return [{"apiVersion": "v1", "kind": "Pod", "name": master_name(job_id), "uid": master_uid}]


def config_map_owner(uid: str, job_id: str) -> list[dict[str, Any]]:
    """The ownerReference to a trainer job's ConfigMap, the root of its objects."""
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": spec_config_map_name(job_id), "uid": uid}]


def _scheduling(placement: Placement) -> dict[str, Any]:
    """The pod spec fields of ``placement``: service account, node selector, tolerations."""
    fields: dict[str, Any] = {}
    if placement.service_account:
        fields["serviceAccountName"] = placement.service_account
    if placement.node_selector:
        fields["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        fields["tolerations"] = [dict(t) for t in placement.tolerations]
    return fields


def _container_security() -> dict[str, Any]:
    """A container's security context (a new dict each time: callers may change theirs)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "privileged": False}


def _pod_security() -> dict[str, Any]:
    """A pod's security context (a new dict each time)."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_ID, "runAsGroup": RUN_AS_ID, "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def trainer_pod(job_id: str, node: Mapping[str, Any], *, argv: Sequence[str], env: Mapping[str, str], image: str,
                grace_s: float, placement: Placement, owner: list[dict[str, Any]],
                metrics: tuple[int, str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The pod of one node of a trainer of the user's (see the module docstring): ``argv`` and
    ``env`` are the contract's (``launchers.contract``); ``metrics``: the (port, path, sample
    names) of the Prometheus text it serves, scraped by the pod's reports sidecar."""
    role, index = node["role"], int(node["index"])
    name = (ps_name if role == "ps" else worker_name)(job_id, index)
    variables = [{"name": k, "value": v} for k, v in env.items() if k != "DLROVER_JOB_KEY"]
    variables.append({"name": "DLROVER_JOB_KEY",
                      "valueFrom": {"secretKeyRef": {"name": authkey_secret_name(job_id), "key": "authkey"}}})
    container = {
        "name": role, "image": image, "command": list(argv), "env": variables,
        "resources": container_resources(node["cpu"], node.get("memory_mb"), node.get("gpu", 0)),
        "securityContext": _container_security(),
        "ports": [{"name": "peer", "containerPort": TRAINER_PORT, "protocol": "TCP"}]
        + ([{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}] if role == "worker" else []),
        "volumeMounts": [{"name": "job", "mountPath": JOB_DIR, "subPath": job_id}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    if env.get("DLROVER_CHECKPOINT_DIR") == TRAINER_CHECKPOINT_DIR:  # the kubelet creates a missing subPath
        container["volumeMounts"].insert(1, {"name": "job", "mountPath": TRAINER_CHECKPOINT_DIR,
                                             "subPath": f"{job_id}/checkpoint"})
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
        "terminationGracePeriodSeconds": int(math.ceil(grace_s)), "securityContext": _pod_security(),
        "hostname": name, "subdomain": trainer_service_name(job_id), "containers": [container],
        "volumes": [{"name": "job", "persistentVolumeClaim": {"claimName": placement.volume_claim}},
                    {"name": "tmp", "emptyDir": {}}],
    }
    spec.update(_scheduling(placement))
    metadata = _metadata(name, placement.namespace, _labels(job_id, role, index), owner)
    if metrics is not None:
        port, path, names = metrics
        container["ports"].append({"name": "metrics", "containerPort": port, "protocol": "TCP"})
        spec["initContainers"] = [{
            "name": SCRAPE_CONTAINER, "image": placement.image, "restartPolicy": "Always",
            "command": ["python", "-m", "airflow_dlrover.scrape", "--url", f"http://127.0.0.1:{port}{path}",
                        "--every", f"{T.TRAINER_SCRAPE_S:g}", "--names", json.dumps(dict(names), sort_keys=True)],
            "resources": container_resources(T.SCRAPE_SIDECAR_CPU, T.SCRAPE_SIDECAR_MEMORY_MB),
            "securityContext": _container_security(),
        }]
        metadata["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                                   "prometheus.io/path": path}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def trainer_objects(spec: JobSpec, placement: Placement, owner: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A trainer job's Secret, headless Service and NetworkPolicy (its ConfigMap comes first)."""
    job, namespace = spec.job_id, placement.namespace
    everyone = {"podSelector": {"matchLabels": {LABEL_JOB: job}}}
    dns = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    storage = {"ports": [{"port": port, "protocol": "TCP"} for port in STORAGE_EGRESS_PORTS]}
    return [
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": _metadata(authkey_secret_name(job), namespace, _labels(job, "trainer", "all"), owner),
         "data": {"authkey": base64.b64encode(spec.authkey.encode()).decode()}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": _metadata(trainer_service_name(job), namespace, _labels(job, "trainer", "all"), owner),
         "spec": {"clusterIP": "None", "selector": {LABEL_JOB: job}, "publishNotReadyAddresses": True,
                  "ports": [{"name": "peer", "port": TRAINER_PORT, "targetPort": "peer", "protocol": "TCP"}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _metadata(network_policy_name(job, "trainer"), namespace, _labels(job, "trainer", "all"), owner),
         "spec": {"podSelector": {"matchLabels": {LABEL_JOB: job}}, "policyTypes": ["Ingress", "Egress"],
                  "ingress": [{"from": [everyone]}], "egress": [{"to": [everyone]}, dns, storage]}},
    ]


def trainer_config_map(spec: JobSpec, placement: Placement, record: Mapping[str, Any]) -> dict[str, Any]:
    """A trainer job's ConfigMap: its spec (key blanked) and the launcher's record; the root object."""
    data = {"spec.json": dataclasses.replace(spec, authkey="").to_json(), "job.json": json.dumps(record, sort_keys=True)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
            "metadata": _metadata(spec_config_map_name(spec.job_id), placement.namespace,
                                  _labels(spec.job_id, "trainer", "all"), None)}


def node_pod(
    job_id: str, role: str, index: int, *, cpu: float, memory_mb: float | None, gpu: int = 0, ps_count: int = 1,
    placement: Placement, master_uid: str | None = None,
) -> dict[str, Any]:
    """The pod of one node (``role`` master | ps | worker) with the resources given: what
    :func:`render_job` renders for each node, and what a launcher creates to add or relaunch one."""
    namespace = placement.namespace
    names = {"master": master_name(job_id), "ps": ps_name(job_id, index), "worker": worker_name(job_id, index)}
    name = names[role]
    port = {"master": MASTER_PORT, "ps": PS_PORT}.get(role, 0)
    threads = torch_threads(cpu)
    args = [role, "--job-dir", JOB_DIR, "--index", str(index), "--name", name.removeprefix(f"{job_id}-"),
            "--port", str(port), "--host", "0.0.0.0"]
    if role == "ps":
        args += ["--count", str(ps_count)]
    if role == "worker":
        args += ["--master", master_address(job_id, namespace), "--threads", str(threads)]
    container: dict[str, Any] = {
        "name": role,
        "image": placement.image,
        "command": ["python", "-m", "airflow_dlrover.runtime"],
        "args": args,
        "env": [
            {"name": "OMP_NUM_THREADS", "value": str(threads)},
            {"name": "DLROVER_WORKER_GPU", "value": str(gpu)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": TERMINATION_FILE_ENV, "value": "/dev/termination-log"},
            {"name": AUTHKEY_FILE_ENV, "value": f"{AUTHKEY_DIR}/authkey"},
        ],
        "resources": container_resources(cpu, memory_mb, gpu),
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "job", "mountPath": JOB_DIR, "subPath": job_id},
            {"name": "spec", "mountPath": f"{JOB_DIR}/spec.json", "subPath": "spec.json", "readOnly": True},
            {"name": "run", "mountPath": f"{JOB_DIR}/run"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "authkey", "mountPath": AUTHKEY_DIR, "readOnly": True},
        ],
    }
    volumes: list[dict[str, Any]] = [
        {"name": "job", "persistentVolumeClaim": {"claimName": placement.volume_claim}},
        {"name": "spec", "configMap": {"name": spec_config_map_name(job_id),
                                       "items": [{"key": "spec.json", "path": "spec.json"}]}},
        {"name": "run", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        # 0440 root:fsGroup — the pod's user reads it through its group; nobody else (the default 0644
        # would let any process of the pod's image read it)
        {"name": "authkey", "secret": {"secretName": authkey_secret_name(job_id), "defaultMode": 0o440,
                                       "items": [{"key": "authkey", "path": "authkey"}]}},
    ]
    if role == "worker" and placement.data_volume_claim:
        container["volumeMounts"].append({"name": "data", "mountPath": DATA_DIR, "readOnly": True})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": placement.data_volume_claim,
                                                                  "readOnly": True}})
    if role == "master":
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": "http"},
                                       "periodSeconds": MASTER_READY_PERIOD_S}
    elif role == "ps":
        container["ports"] = [{"name": "rpc", "containerPort": port, "protocol": "TCP"}]
        container["readinessProbe"] = {"tcpSocket": {"port": "rpc"}, "periodSeconds": PS_READY_PERIOD_S}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # the runtime never calls the Kubernetes API
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables from every Service of the namespace
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
    }
    if role == "ps":
        spec["hostname"] = name
        spec["subdomain"] = ps_service_name(job_id)
    spec.update(_scheduling(placement))
    owner = None if role == "master" else owner_references(master_uid, job_id)
    metadata = _metadata(name, namespace, _labels(job_id, role, index), owner)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def render_job(
    spec: JobSpec,
    config: Configuration,
    *,
    namespace: str = "default",
    image: str,
    volume_claim: str = DEFAULT_VOLUME_CLAIM,
    data_volume_claim: str | None = None,
    service_account: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    launcher_namespace: str | None = None,
    launcher_pod_labels: Mapping[str, str] | None = None,
    master_uid: str | None = None,
    record: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The job's objects in creation order: master Pod, Secret, ConfigMap, master Service, PS
    Service, NetworkPolicies, PS Pods, worker Pods (see the module docstring); ``record`` is the
    launcher's ``job.json``. Raises :class:`InvalidInputError` naming the field."""
    if not isinstance(config, Configuration):
        raise InvalidInputError("config", type(config).__name__, "a Configuration")
    job = spec.job_id
    check_job_id(job, config)
    placement = Placement(namespace, image, volume_claim, data_volume_claim, service_account, node_selector,
                          tolerations, launcher_namespace, launcher_pod_labels)
    owner = owner_references(master_uid, job)
    objects = [node_pod(job, "master", 0, cpu=T.MASTER_CPU, memory_mb=T.MASTER_MEMORY_MB, placement=placement)]
    objects += job_objects(spec, placement, owner, record)
    for index in range(config.ps):
        objects.append(node_pod(job, "ps", index, cpu=config.ps_cpu, memory_mb=config.ps_memory_mb,
                                ps_count=config.ps, placement=placement, master_uid=master_uid))
    for index in range(config.workers):
        objects.append(node_pod(job, "worker", index, cpu=config.worker_cpu, memory_mb=config.worker_memory_mb,
                                gpu=config.worker_gpu, placement=placement, master_uid=master_uid))
    return objects


def job_objects(spec: JobSpec, placement: Placement, owner: list[dict[str, Any]] | None,
                record: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The job's Secret, ConfigMap, Services and NetworkPolicies (everything but its pods)."""
    job, namespace = spec.job_id, placement.namespace
    data = {"spec.json": dataclasses.replace(spec, authkey="").to_json()}
    if len(data["spec.json"].encode()) > SPEC_CONFIG_MAP_MAX_BYTES:
        raise InvalidInputError("data", spec.data, f"a dataset whose index fits the job's ConfigMap "
                                f"(≤ {SPEC_CONFIG_MAP_MAX_BYTES:,} bytes): fewer, larger files or row groups",
                                f"its spec takes {len(data['spec.json'].encode()):,} bytes")
    if record is not None:
        data["job.json"] = json.dumps(record, sort_keys=True)
    return [
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": _metadata(authkey_secret_name(job), namespace, _labels(job, "master", 0), owner),
         # data (base64), not stringData: what the API server stores, so a read returns it as written.
         "data": {"authkey": base64.b64encode(spec.authkey.encode()).decode()}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": _metadata(spec_config_map_name(job), namespace, _labels(job, "master", 0), owner), "data": data},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": _metadata(master_name(job), namespace, _labels(job, "master", 0), owner),
         "spec": {"type": "ClusterIP", "selector": _selector(job, "master"),
                  "ports": [{"name": "http", "port": MASTER_PORT, "targetPort": "http", "protocol": "TCP"}]}},
        {"apiVersion": "v1", "kind": "Service",
         # It serves every PS: index "all".
         "metadata": _metadata(ps_service_name(job), namespace, _labels(job, "ps", "all"), owner),
         "spec": {"clusterIP": "None", "selector": _selector(job, "ps"),
                  # DNS names exist before readiness: the master connects while the PS start.
                  "publishNotReadyAddresses": True,
                  "ports": [{"name": "rpc", "port": PS_PORT, "targetPort": "rpc", "protocol": "TCP"}]}},
        *network_policies(job, placement, owner, remote_storage=remote_storage(spec)),
    ]


def remote_storage(spec: JobSpec) -> bool:
    """Whether the job's workers read its data or write its export over the network (an fsspec URL
    whose protocol is not a local one)."""
    urls = [u for u in (spec.data, spec.export) if u and u != "synthetic"]
    return any("://" in u and u.split("://", 1)[0] not in LOCAL_PROTOCOLS for u in urls)


def network_policies(job: str, placement: Placement, owner: list[dict[str, Any]] | None,
                     remote_storage: bool = False) -> list[dict[str, Any]]:
    """The job's NetworkPolicies, one per role (see the module docstring)."""
    namespace = placement.namespace

    def pods(role: str) -> dict[str, Any]:
        return {"podSelector": {"matchLabels": _selector(job, role)}}

    launcher: dict[str, Any] = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": placement.launcher_namespace or namespace}}}
    if placement.launcher_pod_labels:
        launcher["podSelector"] = {"matchLabels": dict(placement.launcher_pod_labels)}
    http, rpc = [{"port": "http", "protocol": "TCP"}], [{"port": "rpc", "protocol": "TCP"}]
    dns = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    rules = {
        "master": ([{"from": [pods("worker"), launcher], "ports": http}], [dns, {"to": [pods("ps")], "ports": rpc}]),
        "ps": ([{"from": [pods("master"), pods("worker")], "ports": rpc}], [dns]),
        "worker": ([], [dns, {"to": [pods("master")], "ports": http}, {"to": [pods("ps")], "ports": rpc}]),
    }
    if remote_storage:
        rules["worker"][1].append({"ports": [{"port": port, "protocol": "TCP"} for port in STORAGE_EGRESS_PORTS]})
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _metadata(network_policy_name(job, role), namespace, _labels(job, role, "all"), owner),
         "spec": {"podSelector": {"matchLabels": _selector(job, role)}, "policyTypes": ["Ingress", "Egress"],
                  "ingress": ingress, "egress": egress}}
        for role, (ingress, egress) in rules.items()
    ]


def spec_of(objects: Sequence[Mapping[str, Any]]) -> JobSpec:
    """The JobSpec carried by rendered objects (their ConfigMap, with the Secret's authkey)."""
    keys = [base64.b64decode(o["data"]["authkey"]).decode() for o in objects
            if o.get("kind") == "Secret" and "authkey" in (o.get("data") or {})]
    for obj in objects:
        if obj.get("kind") == "ConfigMap" and "spec.json" in (obj.get("data") or {}):
            spec = JobSpec.from_json(obj["data"]["spec.json"])
            return dataclasses.replace(spec, authkey=keys[0]) if keys else spec
    raise InvalidInputError("manifests", "no ConfigMap", "rendered manifests with a spec.json ConfigMap")


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A multi-document YAML (as ``kubectl apply -f -`` reads it): ``yaml.safe_dump_all``'s
    SafeDumper, with multi-line strings (``spec.json``) as literal blocks so that they stay readable."""
    import yaml

    class BlockDumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    BlockDumper.add_representer(str, text)
    # Round-trip through JSON so that tuples and the like become plain lists.
    return yaml.dump_all(json.loads(json.dumps(list(objects))), Dumper=BlockDumper, sort_keys=False)
