"""The Kubernetes manifests of a job: offline schema validation (strict), names, labels, DNS,
resources and security of every container, and the ``dlrover-rm render`` command."""

import base64
import dataclasses
import json

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from airflow_dlrover.cli import main
from airflow_dlrover.launchers import kubernetes_manifests as km
from airflow_dlrover.timings import MASTER_CPU, MASTER_MEMORY_MB
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.unit

VERSION = max(set(kv_utils.all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
CPU_PLAN = Configuration(workers=3, ps=2, worker_cpu=1.5, ps_cpu=0.5, worker_memory_mb=1536, ps_memory_mb=0,
                         batch_size=256)
GPU_PLAN = Configuration(workers=2, ps=1, worker_cpu=4, ps_cpu=2, worker_memory_mb=8192, ps_memory_mb=4096.5,
                         worker_gpu=1, batch_size=1024)
UID = "8a6b5c1e-0f4d-4a36-9d0c-3f2b1a7e9c11"
PLACEMENT = {
    "service_account": "dlrover-runner",
    "node_selector": {"cloud.google.com/gke-nodepool": "training", "kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute",
                     "tolerationSeconds": 300}],
}
VARIANTS = {
    "cpu": (CPU_PLAN, {}),
    "cpu-owned": (CPU_PLAN, {"master_uid": UID}),
    "gpu-placed": (GPU_PLAN, PLACEMENT),
    "gpu-placed-owned": (GPU_PLAN, {**PLACEMENT, "master_uid": UID}),
    "launcher-elsewhere": (CPU_PLAN, {"launcher_namespace": "airflow",
                                      "launcher_pod_labels": {"component": "worker"}}),
}


def spec(job_id="dlrm-daily"):
    return JobSpec(job_id=job_id, samples=10_000, authkey="0" * 32)


def render(config=CPU_PLAN, job_id="dlrm-daily", **kwargs):
    kwargs.setdefault("image", "registry.example/airflow-dlrover:0.1.0")
    return km.render_job(spec(job_id), config, namespace=kwargs.pop("namespace", "training"), **kwargs)


def by_name(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(objects):
    for pod in by_name(objects, "Pod").values():
        for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            yield pod, container


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_validates_strictly_offline(variant):
    config, kwargs = VARIANTS[variant]
    objects = render(config, **kwargs)
    assert VERSION == kubernetes_validate.latest_version()
    for obj in objects:
        assert kubernetes_validate.validate(obj, VERSION, strict=True) == VERSION.rsplit(".", 1)[0]  # "1.37"
    # ...also after the YAML round trip a user would `kubectl apply`.
    for obj in yaml.safe_load_all(km.to_yaml(objects)):
        kubernetes_validate.validate(obj, VERSION, strict=True)


@pytest.mark.parametrize(
    "path, typo",
    [(("spec",), "restartPolicyy"), (("metadata",), "lables"), (("spec", "containers", 0), "imagee"),
     (("spec", "containers", 0, "securityContext"), "allowPrivilegeEscalaton")],
)
def test_strict_mode_rejects_a_misspelt_field(path, typo):
    pod = by_name(render(), "Pod")["dlrm-daily-worker-0"]
    target = pod
    for key in path:
        target = target[key]
    target[typo] = "Never"
    kubernetes_validate.validate(pod, VERSION, strict=False)  # lenient mode lets it through...
    with pytest.raises(kubernetes_validate.ValidationError, match=typo):
        kubernetes_validate.validate(pod, VERSION, strict=True)  # ...strict mode does not


def hardening_problems(pod):
    """What makes a pod's containers unsafe or unschedulable as Guaranteed: [] when none."""
    problems = []
    pod_sc = pod["spec"].get("securityContext") or {}
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        name = f'{pod["metadata"]["name"]}/{container["name"]}'
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if not (resources.get(kind) or {}).get(resource):
                    problems.append(f"{name}: no {kind}.{resource}")
        if resources.get("requests") != resources.get("limits"):
            problems.append(f"{name}: requests != limits")
        sc = container.get("securityContext") or {}
        effective = {**pod_sc, **sc}  # the container's settings win over the pod's
        root = effective.get("runAsUser") in (None, 0) or effective.get("runAsGroup") in (None, 0)
        if effective.get("runAsNonRoot") is not True or root:
            problems.append(f"{name}: may run as root")
        if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged"):
            problems.append(f"{name}: allows privilege escalation")
        capabilities = sc.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            problems.append(f"{name}: keeps capabilities")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: writable root filesystem")
        if (effective.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: no RuntimeDefault seccomp profile")
    if pod["spec"].get("hostNetwork") or pod["spec"].get("hostPID") or pod["spec"].get("hostIPC"):
        problems.append(f'{pod["metadata"]["name"]}: shares a host namespace')
    return problems


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_has_resources_and_cannot_gain_root(variant):
    config, kwargs = VARIANTS[variant]
    objects = render(config, **kwargs)
    pods = by_name(objects, "Pod")
    assert len(pods) == 1 + config.ps + config.workers
    for pod, container in containers(objects):
        name = pod["metadata"]["name"]
        assert hardening_problems(pod) == []
        assert pod["spec"]["securityContext"]["fsGroup"] == 1000 and pod["spec"]["restartPolicy"] == "Never"
        # Every path the runtime writes is writable: the job dir is the job's sub-directory of the
        # shared RWX claim (checkpoints cross pods, the master's state outlives its pod); run/ and /tmp are emptyDirs.
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        job_mount = mounts[km.JOB_DIR]
        assert volumes[job_mount["name"]] == {"name": "job", "persistentVolumeClaim": {"claimName": "dlrover-jobs"}}
        assert job_mount["subPath"] == "dlrm-daily" and not job_mount.get("readOnly")
        for path in (f"{km.JOB_DIR}/run", "/tmp"):
            assert "emptyDir" in volumes[mounts[path]["name"]] and not mounts[path].get("readOnly"), (name, path)
        spec_mount = mounts[f"{km.JOB_DIR}/spec.json"]
        assert spec_mount["readOnly"] and spec_mount["subPath"] == "spec.json"
        assert volumes[spec_mount["name"]]["configMap"]["name"] == "dlrm-daily-spec"
        # The PS connection key comes from the Secret, as a read-only file only the pod's group reads,
        # never from the ConfigMap or an environment variable.
        key = next(e for e in container["env"] if e["name"] == "DLROVER_AUTHKEY_FILE")
        assert key == {"name": "DLROVER_AUTHKEY_FILE", "value": f"{km.AUTHKEY_DIR}/authkey"}
        assert mounts[km.AUTHKEY_DIR]["readOnly"] and not any("valueFrom" in e for e in container["env"])
        assert volumes[mounts[km.AUTHKEY_DIR]["name"]]["secret"] == {
            "secretName": "dlrm-daily-authkey", "defaultMode": 0o440, "items": [{"key": "authkey", "path": "authkey"}]}
        assert km.DATA_DIR not in mounts  # no data claim given


@pytest.mark.parametrize(
    "breakage, problem",
    [(lambda p, c: c["resources"]["limits"].pop("memory"), "no limits.memory"),
     (lambda p, c: c["resources"]["requests"].pop("cpu"), "no requests.cpu"),
     (lambda p, c: c.pop("resources"), "no requests.cpu"),
     (lambda p, c: c["securityContext"].update(runAsUser=0), "may run as root"),
     (lambda p, c: p["spec"]["securityContext"].pop("runAsNonRoot") and c["securityContext"].pop("runAsNonRoot"),
      "may run as root"),
     (lambda p, c: c["securityContext"].update(allowPrivilegeEscalation=True), "allows privilege escalation"),
     (lambda p, c: c["securityContext"].pop("allowPrivilegeEscalation"), "allows privilege escalation"),
     (lambda p, c: c["securityContext"]["capabilities"].update(add=["NET_ADMIN"]), "keeps capabilities")],
)
def test_the_hardening_check_catches_a_broken_pod(breakage, problem):
    pod = by_name(render(GPU_PLAN), "Pod")["dlrm-daily-worker-0"]
    breakage(pod, pod["spec"]["containers"][0])
    assert any(problem in p for p in hardening_problems(pod)), hardening_problems(pod)


def test_resources_follow_the_plan_with_a_floor_for_unknown_memory():
    pods = by_name(render(CPU_PLAN), "Pod")
    limits = {name: pod["spec"]["containers"][0]["resources"]["limits"] for name, pod in pods.items()}
    assert limits["dlrm-daily-master"] == {"cpu": f"{round(MASTER_CPU * 1000)}m", "memory": f"{round(MASTER_MEMORY_MB)}Mi"}
    assert limits["dlrm-daily-worker-2"] == {"cpu": "1500m", "memory": "1536Mi"}
    assert limits["dlrm-daily-ps-1"] == {"cpu": "500m", "memory": f"{km.MEMORY_FLOOR_MB}Mi"}  # plan has 0 MB
    pods = by_name(render(GPU_PLAN), "Pod")
    worker = pods["dlrm-daily-worker-1"]["spec"]["containers"][0]
    assert worker["resources"]["requests"] == {"cpu": "4000m", "memory": "8192Mi", "nvidia.com/gpu": "1"}
    assert {"name": "DLROVER_WORKER_GPU", "value": "1"} in worker["env"]
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in worker["env"]
    ps = pods["dlrm-daily-ps-0"]["spec"]["containers"][0]
    assert ps["resources"]["limits"] == {"cpu": "2000m", "memory": "4097Mi"}  # rounded up, no GPU
    assert km.memory_quantity(None) == f"{km.MEMORY_FLOOR_MB}Mi" and km.cpu_quantity(0.0004) == "1m"


def test_names_labels_commands_and_dns():
    objects = render(CPU_PLAN, master_uid=UID)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Pod", "dlrm-daily-master"), ("Secret", "dlrm-daily-authkey"), ("ConfigMap", "dlrm-daily-spec"),
        ("Service", "dlrm-daily-master"),
        ("Service", "dlrm-daily-ps"), ("NetworkPolicy", "dlrm-daily-master-network"),
        ("NetworkPolicy", "dlrm-daily-ps-network"), ("NetworkPolicy", "dlrm-daily-worker-network"),
        ("Pod", "dlrm-daily-ps-0"), ("Pod", "dlrm-daily-ps-1"),
        ("Pod", "dlrm-daily-worker-0"), ("Pod", "dlrm-daily-worker-1"), ("Pod", "dlrm-daily-worker-2"),
    ]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "dlrover"
        assert labels["app.kubernetes.io/managed-by"] == "airflow-dlrover"
        assert labels["dlrover.io/job"] == "dlrm-daily"
        assert labels["dlrover.io/role"] in ("master", "ps", "worker") and "dlrover.io/index" in labels
        assert obj["metadata"]["namespace"] == "training"
        owners = obj["metadata"].get("ownerReferences")
        if obj["kind"] == "Pod" and obj["metadata"]["name"] == "dlrm-daily-master":
            assert owners is None
        else:
            assert owners == [{"apiVersion": "v1", "kind": "Pod", "name": "dlrm-daily-master", "uid": UID}]
    assert all("ownerReferences" not in o["metadata"] for o in render(CPU_PLAN))

    pods, services = by_name(objects, "Pod"), by_name(objects, "Service")
    assert pods["dlrm-daily-ps-1"]["metadata"]["labels"]["dlrover.io/index"] == "1"
    assert pods["dlrm-daily-worker-2"]["metadata"]["labels"]["dlrover.io/role"] == "worker"

    master_svc, ps_svc = services["dlrm-daily-master"]["spec"], services["dlrm-daily-ps"]["spec"]
    assert master_svc["type"] == "ClusterIP" and master_svc["ports"][0]["port"] == km.MASTER_PORT
    assert master_svc["selector"] == {"dlrover.io/job": "dlrm-daily", "dlrover.io/role": "master"}
    assert ps_svc["clusterIP"] == "None" and ps_svc["selector"] == {"dlrover.io/job": "dlrm-daily", "dlrover.io/role": "ps"}
    # Each PS: hostname + subdomain = a stable DNS name <job>-ps-<i>.<job>-ps.<ns>.svc
    for i in range(2):
        spec_ = pods[f"dlrm-daily-ps-{i}"]["spec"]
        assert (spec_["hostname"], spec_["subdomain"]) == (f"dlrm-daily-ps-{i}", "dlrm-daily-ps")
        selector = ps_svc["selector"]
        assert selector.items() <= pods[f"dlrm-daily-ps-{i}"]["metadata"]["labels"].items()
    assert km.ps_addresses("dlrm-daily", 2, "training") == [
        f"dlrm-daily-ps-0.dlrm-daily-ps.training.svc:{km.PS_PORT}", f"dlrm-daily-ps-1.dlrm-daily-ps.training.svc:{km.PS_PORT}"]
    assert km.master_address("dlrm-daily", "training") == f"dlrm-daily-master.training.svc:{km.MASTER_PORT}"
    assert master_svc["selector"].items() <= pods["dlrm-daily-master"]["metadata"]["labels"].items()

    # The commands local.py runs, with the pod's job dir, fixed ports, every interface and the master's DNS name.
    run = ["python", "-m", "airflow_dlrover.runtime"]
    args = {name: (p["spec"]["containers"][0]["command"], p["spec"]["containers"][0]["args"]) for name, p in pods.items()}
    assert args["dlrm-daily-master"] == (run, ["master", "--job-dir", km.JOB_DIR, "--index", "0", "--name", "master",
                                               "--port", str(km.MASTER_PORT), "--host", "0.0.0.0"])
    assert args["dlrm-daily-ps-1"] == (run, ["ps", "--job-dir", km.JOB_DIR, "--index", "1", "--name", "ps-1",
                                             "--port", str(km.PS_PORT), "--host", "0.0.0.0", "--count", "2"])
    assert args["dlrm-daily-worker-2"] == (run, ["worker", "--job-dir", km.JOB_DIR, "--index", "2", "--name", "worker-2",
                                                 "--port", "0", "--host", "0.0.0.0",
                                                 "--master", f"dlrm-daily-master.training.svc:{km.MASTER_PORT}",
                                                 "--threads", "1"])
    config_map = by_name(objects, "ConfigMap")["dlrm-daily-spec"]
    assert JobSpec.from_json(config_map["data"]["spec.json"]) == dataclasses.replace(spec(), authkey="")
    assert by_name(objects, "Secret")["dlrm-daily-authkey"]["data"] == {"authkey": base64.b64encode(b"0" * 32).decode()}
    assert km.spec_of(objects) == spec()


def test_data_claim_reaches_the_workers_read_only():
    objects = render(CPU_PLAN, data_volume_claim="criteo-days", volume_claim="team-jobs")
    for name, pod in by_name(objects, "Pod").items():
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert volumes["job"]["persistentVolumeClaim"] == {"claimName": "team-jobs"}
        if "worker" in name:
            assert mounts[km.DATA_DIR] == {"name": "data", "mountPath": km.DATA_DIR, "readOnly": True}
            assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "criteo-days", "readOnly": True}
        else:
            assert km.DATA_DIR not in mounts and "data" not in volumes
        kubernetes_validate.validate(pod, VERSION, strict=True)


def test_placement_options_reach_every_pod():
    objects = render(GPU_PLAN, **PLACEMENT)
    for pod in by_name(objects, "Pod").values():
        assert pod["spec"]["serviceAccountName"] == "dlrover-runner"
        assert pod["spec"]["nodeSelector"] == PLACEMENT["node_selector"]
        assert pod["spec"]["tolerations"] == PLACEMENT["tolerations"]
    for pod in by_name(render(CPU_PLAN), "Pod").values():
        assert not {"serviceAccountName", "nodeSelector", "tolerations"} & pod["spec"].keys()


@pytest.mark.parametrize(
    "job_id", ["DLRM", "dlrm_daily", "-dlrm", "dlrm-", "1dlrm", "", "a" * 60, "dlrm.daily", None]
)
def test_bad_job_id_names_the_field(job_id):
    with pytest.raises(InvalidInputError) as err:
        km.render_job(JobSpec(job_id=job_id), CPU_PLAN, image="img")
    assert err.value.field == "job_id" and "job_id=" in str(err.value)


def test_job_id_length_depends_on_the_plan():
    job_id = "a" * (km.NAME_MAX - len("-worker-9"))
    assert render(Configuration(workers=10, ps=1, worker_cpu=1, ps_cpu=1), job_id=job_id)
    with pytest.raises(InvalidInputError, match="job_id"):
        render(Configuration(workers=11, ps=1, worker_cpu=1, ps_cpu=1), job_id=job_id)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"namespace": "Training"}, "namespace"), ({"image": ""}, "image"), ({"image": "a b"}, "image"),
     ({"service_account": "Bad_SA"}, "service_account"), ({"node_selector": {"pool": 1}}, "node_selector"),
     ({"tolerations": {"key": "x"}}, "tolerations"), ({"master_uid": ""}, "master_uid"),
     ({"volume_claim": None}, "volume_claim"), ({"volume_claim": "Jobs_PVC"}, "volume_claim"),
     ({"data_volume_claim": "a/b"}, "data_volume_claim")],
)
def test_bad_options_name_the_field(kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        render(CPU_PLAN, **kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(
    "row, field",
    [({"ps": 1, "worker_cpu": 1, "ps_cpu": 1}, "PLAN.workers"),
     ({"workers": 0, "ps": 1, "worker_cpu": 1, "ps_cpu": 1}, "PLAN.workers"),
     ({"workers": 2, "ps": 1, "worker_cpu": -1, "ps_cpu": 1}, "PLAN.worker_cpu"),
     ({"workers": 2, "ps": 1, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": "2Gi"}, "PLAN.worker_memory_mb"),
     ([1, 2], "PLAN")],
)
def test_bad_plan_names_the_field(row, field):
    with pytest.raises(InvalidInputError) as err:
        km.config_from_plan(row)
    assert err.value.field == field


def test_plan_output_is_accepted():
    """``dlrover-rm plan`` prints Plan.to_dict(): the row plus prediction, reason and details."""
    from airflow_dlrover.optimizer.types import Plan

    row = Plan(GPU_PLAN, 1000.0, 900.0, 1100.0, "throughput", "why", [{"workers": 1}], []).to_dict()
    assert km.config_from_plan(json.loads(json.dumps(row))) == GPU_PLAN


def test_cli_render_prints_the_manifests(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(GPU_PLAN.to_row() | {"predicted_throughput": 1.0, "reason": "r"}))
    assert main(["render", "--launcher", "kubernetes", str(plan), "--job-id", "ctr-model", "--namespace", "ml",
                 "--image", "reg/dlrover:1", "--samples", "5000"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    job = km.spec_of(printed)  # authkey is random per render: take the printed spec
    assert (job.job_id, job.samples, job.batch_size) == ("ctr-model", 5000, GPU_PLAN.batch_size)
    assert printed == km.render_job(job, GPU_PLAN, namespace="ml", image="reg/dlrover:1")
    for obj in printed:
        kubernetes_validate.validate(obj, VERSION, strict=True)

    assert main(["render", "--launcher", "kubernetes", str(plan)]) == 0  # the defaults
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert km.spec_of(printed).job_id == "dlrm"
    assert {o["metadata"]["namespace"] for o in printed} == {"default"}
    assert by_name(printed, "Pod")["dlrm-master"]["spec"]["containers"][0]["image"] == "airflow-dlrover:latest"


@pytest.mark.parametrize(
    "args, message",
    [(["--launcher", "local"], "launcher='local' is invalid: allowed kubernetes"),
     (["--launcher", "kubernetes", "--job-id", "Bad_Id"], "job_id='Bad_Id' is invalid"),
     (["--launcher", "kubernetes", "--samples", "0"], "samples=0 is invalid")],
)
def test_cli_render_errors_exit_2(tmp_path, capsys, args, message):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(CPU_PLAN.to_row()))
    assert main(["render", str(plan), *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and message in captured.err and captured.out == ""


def test_cli_render_bad_plan_file_exits_2(tmp_path, capsys):
    assert main(["render", "--launcher", "kubernetes", str(tmp_path / "missing.json")]) == 2
    assert "PLAN=" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"workers": 2, "ps": 1, "worker_cpu": 1}))
    assert main(["render", "--launcher", "kubernetes", str(bad)]) == 2
    assert "PLAN.ps_cpu" in capsys.readouterr().err


# -- the job's NetworkPolicies: evaluated with Kubernetes' semantics ------------------------------
def _matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).get("matchLabels", {}).items())


def _peer_admits(peer, pod, policy_namespace):
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": pod["namespace"]}):
            return False
    elif pod["namespace"] != policy_namespace:
        return False
    return _matches(peer.get("podSelector"), pod["labels"])


def _port_admits(ports, port, target):
    """A rule's ports admit ``port`` (a number) on ``target`` (named ports resolve there)."""
    names = target.get("ports", {})
    return any(p["port"] == port or names.get(p["port"]) == port for p in ports)


def _allowed(policies, source, target, port):
    """Whether ``source`` may open a TCP connection to ``target``:``port`` under ``policies``."""
    def direction(pod, kind, other):
        selecting = [p for p in policies if p["metadata"]["namespace"] == pod["namespace"]
                     and kind in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], pod["labels"])]
        if not selecting:
            return True  # not isolated in that direction
        key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
        # A rule without peers admits every peer (the NetworkPolicy API's rule).
        return any((peers_key not in rule or any(_peer_admits(peer, other, p["metadata"]["namespace"])
                                                 for peer in rule[peers_key]))
                   and (not rule.get("ports") or _port_admits(rule["ports"], port, target))
                   for p in selecting for rule in p["spec"].get(key, []))
    return direction(target, "Ingress", source) and direction(source, "Egress", target)


def _pods(objects):
    out = {}
    for pod in by_name(objects, "Pod").values():
        ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        out[pod["metadata"]["name"]] = {"namespace": pod["metadata"]["namespace"], "labels": pod["metadata"]["labels"],
                                        "ports": ports}
    return out


def test_the_jobs_network_policies_admit_the_job_and_its_launcher_and_nobody_else():
    objects = render(CPU_PLAN, launcher_namespace="airflow", launcher_pod_labels={"component": "worker"})
    policies = list(by_name(objects, "NetworkPolicy").values())
    assert sorted(by_name(objects, "NetworkPolicy")) == [f"dlrm-daily-{r}-network" for r in ("master", "ps", "worker")]
    assert all(p["spec"]["policyTypes"] == ["Ingress", "Egress"] for p in policies)
    assert all(isinstance(port["port"], str) for p in policies for rule in p["spec"]["ingress"] for port in rule["ports"])
    pods = _pods(objects)
    other_job = _pods(render(CPU_PLAN, job_id="other-job"))
    master, ps, worker = pods["dlrm-daily-master"], pods["dlrm-daily-ps-0"], pods["dlrm-daily-worker-0"]
    airflow = {"namespace": "airflow", "labels": {"component": "worker"}, "ports": {}}
    airflow_web = {"namespace": "airflow", "labels": {"component": "webserver"}, "ports": {}}
    stranger = {"namespace": "training", "labels": {"app": "notebook"}, "ports": {}}
    dns = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}, "ports": {}}
    everything = policies + list(by_name(render(CPU_PLAN, job_id="other-job"), "NetworkPolicy").values())
    http, rpc = km.MASTER_PORT, km.PS_PORT
    admitted = [(worker, master, http), (airflow, master, http), (master, ps, rpc), (worker, ps, rpc),
                (worker, dns, 53), (master, dns, 53), (ps, dns, 53)]
    refused = [(stranger, master, http), (airflow_web, master, http), (other_job["other-job-worker-0"], master, http),
               (airflow, ps, rpc),  # the job evaluates and exports its model itself: no launcher reads the PS
               (other_job["other-job-worker-0"], ps, rpc), (stranger, ps, rpc), (stranger, worker, 1234),
               (master, worker, 1234), (ps, master, http), (worker, master, rpc), (master, stranger, 443),
               (worker, stranger, 443), (ps, stranger, 443), (worker, other_job["other-job-ps-0"], rpc)]
    for source, target, port in admitted:
        assert _allowed(everything, source, target, port), (source, target, port)
    for source, target, port in refused:
        assert not _allowed(everything, source, target, port), (source, target, port)


def test_workers_reach_an_object_store_only_when_the_data_or_export_is_on_one():
    import dataclasses

    remote = km.render_job(dataclasses.replace(spec("dlrm-daily"), data="s3://logs/day", export="/models/x"), CPU_PLAN,
                           namespace="training", image="registry.example/airflow-dlrover:0.1.0")
    policies = list(by_name(remote, "NetworkPolicy").values())
    pods = _pods(remote)
    store = {"namespace": "", "labels": {}, "ports": {}}
    assert _allowed(policies, pods["dlrm-daily-worker-0"], store, 443)
    assert not _allowed(policies, pods["dlrm-daily-worker-0"], store, 80)
    assert not _allowed(policies, pods["dlrm-daily-ps-0"], store, 443)
    assert not _allowed(policies, pods["dlrm-daily-master"], store, 443)
    local = km.render_job(dataclasses.replace(spec("dlrm-daily"), data="file:///data/day", export="/models/x"), CPU_PLAN,
                          namespace="training", image="registry.example/airflow-dlrover:0.1.0")
    assert not _allowed(list(by_name(local, "NetworkPolicy").values()), pods["dlrm-daily-worker-0"], store, 443)


def test_the_launcher_defaults_to_the_jobs_namespace():
    policy = by_name(render(CPU_PLAN), "NetworkPolicy")["dlrm-daily-master-network"]
    launcher = policy["spec"]["ingress"][0]["from"][1]
    assert launcher == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "training"}}}
    with pytest.raises(InvalidInputError, match="launcher_pod_labels"):
        render(CPU_PLAN, launcher_pod_labels={"component": 3})
    with pytest.raises(InvalidInputError, match="launcher_namespace"):
        render(CPU_PLAN, launcher_namespace="Airflow Pods")


def test_a_dataset_index_too_big_for_the_configmap_is_refused_naming_the_dataset():
    import dataclasses

    from airflow_dlrover.runtime.datasets import DatasetIndex

    groups = 30_000  # ~32 bytes each in the spec: past what one ConfigMap holds
    index = DatasetIndex("parquet", ("s3://logs/day/part-0.parquet",), (0,) * groups, tuple(range(groups)),
                         (0,) * groups, (100_000,) * groups, tuple(range(1, 100_000 * groups, 100_000)))
    big = dataclasses.replace(spec("dlrm-daily"), data="s3://logs/day", samples=None, dataset=index)
    with pytest.raises(InvalidInputError) as err:
        km.job_objects(big, km.Placement(namespace="training", image="registry.example/airflow-dlrover:0.1.0"), None)
    assert err.value.field == "data" and "fewer, larger files or row groups" in str(err.value)
    small = dataclasses.replace(big, samples=None, dataset=dataclasses.replace(index, **{k: getattr(index, k)[:2000] for k in (
        "fragment_file", "fragment_locator", "fragment_length", "fragment_rows", "fragment_first_row")}))
    assert any(o["kind"] == "ConfigMap" for o in km.job_objects(
        small, km.Placement(namespace="training", image="registry.example/airflow-dlrover:0.1.0"), None))


def test_a_rendered_pod_shares_nothing_with_the_next():
    """Changing one pod's security context (as a caller or a mutating webhook may) leaves the next
    pod's as rendered."""
    placement = km.Placement("ns", "img:1")
    first = km.node_pod("j", "worker", 0, cpu=1, memory_mb=1024, placement=placement)
    first["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    first["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    second = km.node_pod("j", "worker", 1, cpu=1, memory_mb=1024, placement=placement)
    assert second["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert second["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("metrics", [None, (9400, "/metrics", {"throughput": "train_samples_per_second"})])
def test_a_trainer_pod_validates_and_is_hardened_with_or_without_its_reports_sidecar(metrics):
    placement = km.Placement(namespace="ml", image="reg/dlrover:1", volume_claim="team-jobs")
    node = {"name": "worker-1", "role": "worker", "index": 1, "cpu": 1.5, "memory_mb": 2048, "gpu": 0}
    pod = km.trainer_pod("ddp-daily", node, argv=["python", "/app/train.py"], env={"RANK": "1"}, image="team/ddp:2",
                         grace_s=20, placement=placement, owner=km.config_map_owner(UID, "ddp-daily"), metrics=metrics)
    kubernetes_validate.validate(pod, VERSION, strict=True)
    assert hardening_problems(pod) == []
    sidecars = pod["spec"].get("initContainers", [])
    assert len(sidecars) == (metrics is not None)
    # the default checkpoint folder is a subPath of its own: the kubelet creates it before the trainer starts
    default = {"DLROVER_CHECKPOINT_DIR": km.TRAINER_CHECKPOINT_DIR}
    with_checkpoint = km.trainer_pod("ddp-daily", node, argv=["t"], env=default, image="team/ddp:2", grace_s=20,
                                     placement=placement, owner=km.config_map_owner(UID, "ddp-daily"), metrics=metrics)
    mounts = with_checkpoint["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "job", "mountPath": km.TRAINER_CHECKPOINT_DIR, "subPath": "ddp-daily/checkpoint"} in mounts
    assert not any(m["mountPath"] == km.TRAINER_CHECKPOINT_DIR for m in pod["spec"]["containers"][0]["volumeMounts"])
    if metrics:
        command = sidecars[0]["command"]
        assert json.loads(command[command.index("--names") + 1]) == {"throughput": "train_samples_per_second"}
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1500m", "memory": "2048Mi"}
