"""The closest real things to a cluster that run here (docs/dev/kmock-recipe.md):

* :class:`KmockThread`: kmock's Kubernetes REST API emulator served on loopback from a thread, so
  that sync clients (the official ``kubernetes`` client, ``KubernetesHook``) do not block its loop;
  :class:`LabelSelectingEmulator` fills kmock 0.8's gaps (label selectors, ``watch=True``, uid /
  namespace / creationTimestamp on create, delete-collection);
* :class:`Kubelet`: the test's scheduler and kubelet: new pods become Running and Ready, or stay
  Pending as Unschedulable; the test kills them (OOMKilled, Evicted, node lost) through the pods'
  status subresource, as a kubelet would;
* :class:`RecordingMaster`: the job master's HTTP API as the launcher sees it (no training runs in
  these pods): it records each call and, on ``/drain``, makes the worker's pod exit 0 as the real
  worker does.

Usage::

    with KmockThread() as km:
        print(km.url)            # e.g. http://127.0.0.1:41234
        km.requests()           # the requests it served
"""
from __future__ import annotations

import asyncio
import datetime
import uuid
import re
import threading

import json
import logging
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kmock

from airflow_dlrover.launchers.kubernetes_manifests import SCRAPE_CONTAINER

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one INFO line per request otherwise


def _match_selector(labels: dict, selector: str) -> bool:
    """Minimal K8s label selector: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    labels = labels or {}
    for term in re.split(r",(?![^()]*\))", selector or ""):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, vals = m[1], m[2], {v.strip() for v in m[3].split(",")}
            ok = labels.get(key) in vals if op == "in" else labels.get(key) not in vals
        elif "!=" in term:
            key, val = (x.strip() for x in term.split("!=", 1))
            ok = labels.get(key) != val
        elif "=" in term:
            key, val = (x.strip() for x in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == val
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


class LabelSelectingEmulator(kmock.KubernetesEmulator):
    """Fixes for kmock 0.8 gaps:
    * LIST and WATCH ignore ?labelSelector=  -> filter items/events here;
    * the python clients send ?watch=True (capital T) but kmock only recognises watch=true,
      so watches were served as a LIST (the client's Watch then yields nothing) -> re-classify;
    * CREATE stores the body verbatim: add metadata.namespace/uid/creationTimestamp;
    * DELETE on a collection (delete_collection_namespaced_*) -> 404 -> emulate it;
    * kmock matches each request to its reactions by scanning every request it has seen (59 ms a
      request after 2,000 of them) -> its history is cut to the last ``HISTORY_KEPT``, and every
      request is kept in ``recorded`` instead (:meth:`KmockThread.requests`).
    """

    HISTORY_KEPT = 64

    async def _serve_watch(self, request):
        selector = request.params.get("labelSelector")
        async for ev in super()._serve_watch(request):
            if (selector and isinstance(ev, dict) and not _match_selector(
                    ev.get("object", {}).get("metadata", {}).get("labels"), selector)):
                continue
            yield ev

    #: pod name → its container's log (a pod's log starts empty when the pod is created)
    pod_logs: dict

    async def _handle(self, request):
        import aiohttp.web

        self.__dict__.setdefault("recorded", []).append(request)
        del self._requests[:-self.HISTORY_KEPT]
        logs = self.__dict__.setdefault("pod_logs", {})
        path = request.url.path
        if request.method == kmock.method.GET and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log", path):
            name = path.split("/")[-2]
            if name not in logs:
                return aiohttp.web.json_response({"kind": "Status", "status": "Failure", "code": 404,
                                                  "reason": "NotFound"}, status=404)
            sidecar = f"{name}/{request.params.get('container')}"  # a sidecar's log: "pod/container"
            if sidecar in logs:
                return aiohttp.web.Response(text=logs[sidecar], content_type="text/plain")
            if request.params.get("container") == SCRAPE_CONTAINER:  # kept apart: "pod/container"
                return aiohttp.web.json_response({"kind": "Status", "status": "Failure", "code": 400, "reason": "BadRequest",
                                                  "message": "container is waiting to start"}, status=400)
            return aiohttp.web.Response(text=logs[name], content_type="text/plain")
        if (request.action == kmock.action.CREATE and isinstance(request.data, dict)
                and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods", path)):
            logs[request.data.get("metadata", {}).get("name")] = ""
        if (request.action == kmock.action.CREATE and request.resource is not None
                and isinstance(request.data, dict)):
            # kmock stores the body verbatim. Fill what a real apiserver would: without
            # metadata.namespace, namespaced WATCHes silently drop the object's events.
            meta = request.data.setdefault("metadata", {})
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp",
                            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if request.action == kmock.action.LIST and request.params.get("watch", "").lower() == "true":
            object.__setattr__(request, "action", kmock.action.WATCH)  # Request is a frozen attrs class
        if (request.method == kmock.method.DELETE and request.resource is not None
                and request.name is None):
            return await self._delete_collection(request)
        return await super()._handle(request)

    async def _delete_collection(self, request):
        import aiohttp.web
        selector = request.params.get("labelSelector", "")
        deleted = []
        for (res, ns, name), obj in list(self.objects.items()):
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and ns != request.namespace:
                continue
            if not _match_selector(obj.get("metadata", {}).get("labels"), selector):
                continue
            raw = obj.raw
            obj.delete()
            await self._buses[res].put({"type": "DELETED", "object": raw})
            deleted.append(raw)
        return aiohttp.web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
             "details": {"deleted": len(deleted)}})

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [o for o in result["items"]
                               if _match_selector(o.get("metadata", {}).get("labels"), selector)]
        return result


class KmockThread:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None,
                 cls: type[kmock.KubernetesEmulator] = LabelSelectingEmulator):
        self._host, self._port, self._cls = host, port, cls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.emulator: kmock.KubernetesEmulator | None = None
        self.server: kmock.Server | None = None
        self.url: str = ""

    async def _main(self) -> None:
        try:
            self._stop = asyncio.Event()
            emulator = self._cls()
            emulator.resources.load_bundled()  # WITHOUT this, list/discovery -> 404
            async with emulator, kmock.Server(emulator, host=self._host, port=self._port) as srv:
                self.emulator, self.server = emulator, srv
                self.url = str(srv.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
                # Open watch streams never end by themselves (timeoutSeconds is ignored) and
                # would block the server shutdown: cancel every other task of this loop first.
                me = asyncio.current_task()
                others = [t for t in asyncio.all_tasks() if t is not me]
                for t in others:
                    t.cancel()
                await asyncio.gather(*others, return_exceptions=True)
        except BaseException as e:  # surface startup errors to the caller
            self._error = e
            self._ready.set()
            raise

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException:
            pass
        finally:
            self._loop.close()

    def requests(self, since: int = 0) -> list:
        """The requests served so far, from the ``since``-th (``len(requests())`` marks a point)."""
        return self.emulator.__dict__.get("recorded", [])[since:]

    def call(self, fn, *args, **kwargs):
        """Run a plain function inside the server's loop thread (safe way to mutate emulator.objects)."""
        async def _wrap():
            return fn(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(_wrap(), self._loop).result(10)

    def __enter__(self) -> "KmockThread":
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("kmock did not start in 10s")
        if self._error:
            raise RuntimeError("kmock failed to start") from self._error
        return self

    def __exit__(self, *exc) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)


def kubeconfig(url: str, namespace: str = "default") -> dict:
    """A kubeconfig for the emulator (plain http, no credentials)."""
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": url}}],
            "users": [{"name": "anon", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "anon", "namespace": namespace}}],
            "current-context": "kmock"}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    """Schedules and "runs" the pods of ``namespace``: every pod without a status becomes Running
    and Ready, unless its name is in ``unschedulable`` (then it stays Pending with
    ``PodScheduled=False/Unschedulable``, transitioned ``pending_for_s`` ago)."""

    SELECTOR = "app.kubernetes.io/managed-by=airflow-dlrover"  # every pod a launcher creates

    def __init__(self, v1, namespace: str, poll_s: float = 0.05):
        self.v1, self.namespace, self.poll_s = v1, namespace, poll_s
        self.unschedulable: dict[str, float] = {}  # pod name → seconds it has been unschedulable
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def __enter__(self) -> "Kubelet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self._stop.wait(self.poll_s):
            try:
                pods = self.v1.list_namespaced_pod(self.namespace, label_selector=self.SELECTOR).items
            except Exception:  # the server is shutting down
                continue
            for pod in pods:
                if pod.status is not None and pod.status.phase:
                    continue
                try:
                    self.patch(pod.metadata.name, self._initial(pod))
                except ApiException:  # deleted meanwhile
                    pass

    def _initial(self, pod) -> dict:
        name = pod.metadata.name
        if name in self.unschedulable:
            since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=self.unschedulable[name])
            return {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "message": "0/3 nodes are available: 3 Insufficient cpu."}]}
        return {"phase": "Running", "podIP": "10.0.0.7", "startTime": _now(),
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [self._container(pod, {"running": {"startedAt": _now()}}, ready=True)]}

    @staticmethod
    def _container(pod, state: dict, ready: bool = False) -> dict:
        container = pod.spec.containers[0]
        return {"name": container.name, "image": container.image, "imageID": "", "ready": ready,
                "restartCount": 0, "state": state}

    def patch(self, name: str, status: dict) -> None:
        """Write the pod's status, as the kubelet does."""
        self.v1.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def set_status(self, name: str, status: dict) -> None:
        """The test's change of a pod's status, once this kubelet has started the pod (or the
        kubelet's first status would overwrite it)."""
        self.wait_seen([name])
        self.patch(name, status)

    def terminate(self, name: str, exit_code: int, reason: str) -> None:
        """The pod's container ends (``restartPolicy: Never``: the pod fails or succeeds)."""
        self.wait_seen([name])
        pod = self.v1.read_namespaced_pod(name, self.namespace)
        terminated = {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": _now()}}
        self.patch(name, {"phase": "Succeeded" if exit_code == 0 else "Failed",
                          "conditions": [{"type": "Ready", "status": "False"}],
                          "containerStatuses": [self._container(pod, terminated)]})

    def wait_running(self, names: list[str], timeout_s: float = 10.0) -> None:
        """Until every pod named runs."""
        self._wait(names, lambda phase: phase == "Running", "running", timeout_s)

    def wait_seen(self, names: list[str], timeout_s: float = 10.0) -> None:
        """Until this kubelet has given every pod named its first status (Running or Pending)."""
        self._wait(names, lambda phase: phase is not None, "seen by the kubelet", timeout_s)

    def _wait(self, names: list[str], done, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            phases = {p.metadata.name: (p.status.phase if p.status else None)
                      for p in self.v1.list_namespaced_pod(self.namespace).items}
            if all(done(phases.get(n)) for n in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods {names} not {what}: {phases}")
            time.sleep(self.poll_s)


class TrainerDouble:
    """Plays a trainer of the user's in the pods of ``job_id`` (and metrics-server for them): every
    ``poll_s`` each running worker pod's log gets one report line (docs/trainers.md) of
    ``rate_per_core`` × its ``DLROVER_CPU`` samples/s, and its PodMetrics say it uses 90 % of its
    CPU limit and 300 MiB. The job's ``samples_done`` is the sum since the group's start plus what
    the last group reached (its "checkpoint").

    With ``prometheus``, a worker serves its report as Prometheus gauges instead (a real
    ``prometheus_client`` endpoint per pod), and the pod's reports sidecar — the real
    ``airflow_dlrover.scrape.scrape_loop``, in a thread, at the URL of the pod's ``initContainers``
    command — scrapes it into the sidecar's log; the sidecar's PodMetrics container uses 20m / 30 MiB."""

    METRICS = "metrics.k8s.io/v1beta1/pods"

    def __init__(self, server: "KmockThread", v1, namespace: str, job_id: str, rate_per_core: float = 1000.0,
                 total: int = 10**9, poll_s: float = 0.1, prometheus: bool = False):
        self.server, self.v1, self.namespace, self.job_id = server, v1, namespace, job_id
        self.rate_per_core, self.total, self.poll_s, self.prometheus = rate_per_core, total, poll_s, prometheus
        self.done = 0.0
        self.endpoints: dict[str, tuple] = {}  # pod uid → (gauges, http server, scrape stop event)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)

    def __enter__(self) -> "TrainerDouble":
        self.server.call(lambda: setattr(self.server.emulator.resources[self.METRICS], "kind", "PodMetrics"))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        for uid in list(self.endpoints):
            self._close(uid)
        self.server.call(lambda: self.server.emulator.resources.pop(self.METRICS, None))

    def _run(self) -> None:
        from kubernetes import client

        custom = client.CustomObjectsApi(self.v1.api_client)
        while not self._stop.wait(self.poll_s):
            try:
                pods = self.v1.list_namespaced_pod(self.namespace, label_selector=f"dlrover.io/job={self.job_id}").items
            except Exception:  # the server is shutting down
                continue
            running = [p for p in pods if p.status and p.status.phase == "Running" and not p.metadata.deletion_timestamp]
            for uid in set(self.endpoints) - {p.metadata.uid for p in running}:
                self._close(uid)  # the trainer exited: its endpoint is gone
            for pod in running:
                env = {e.name: e.value for e in pod.spec.containers[0].env or []}
                cpu = float(env.get("DLROVER_CPU", "1"))
                if env.get("DLROVER_ROLE") == "worker":
                    rate = self.rate_per_core * cpu
                    self.done = min(self.total, self.done + rate * self.poll_s)
                    report = {"throughput": rate, "samples_done": int(self.done), "samples_total": self.total}
                    if self.prometheus:
                        self._serve(pod, report)
                    else:
                        self._log(pod.metadata.name, "step done\n" + json.dumps(report) + "\n")
                containers = [{"name": "main", "usage": {"cpu": f"{int(900 * cpu)}m", "memory": "300Mi"}}]
                if pod.spec.init_containers:
                    containers.append({"name": pod.spec.init_containers[0].name, "usage": {"cpu": "20m", "memory": "30Mi"}})
                body = {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
                        "metadata": {"name": pod.metadata.name, "namespace": self.namespace,
                                     "labels": {"dlrover.io/job": self.job_id}},
                        "timestamp": _now(), "window": "15s", "containers": containers}
                try:
                    custom.create_namespaced_custom_object("metrics.k8s.io", "v1beta1", self.namespace, "pods", body)
                except Exception:  # already there: refresh it
                    custom.patch_namespaced_custom_object("metrics.k8s.io", "v1beta1", self.namespace, "pods",
                                                          pod.metadata.name, body)

    def _log(self, key: str, text: str) -> None:
        self.server.call(lambda: self.server.emulator.pod_logs.__setitem__(
            key, self.server.emulator.pod_logs.get(key, "") + text))

    def _serve(self, pod, report: dict) -> None:
        """The worker's gauges, and the first time its endpoint and its sidecar's scrape loop."""
        import prometheus_client

        from airflow_dlrover.scrape import scrape_loop

        uid = pod.metadata.uid
        if uid not in self.endpoints:
            registry = prometheus_client.CollectorRegistry()
            gauges = {k: prometheus_client.Gauge(f"dlrover_{k}", k, registry=registry) for k in report}
            http, _ = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
            sidecar = pod.spec.init_containers[0]
            command = list(sidecar.command)
            path = urllib.parse.urlsplit(command[command.index("--url") + 1]).path
            target = f"http://127.0.0.1:{http.server_port}{path}"  # the pod's loopback port, here a free one
            names = json.loads(command[command.index("--names") + 1])
            every = float(command[command.index("--every") + 1]) / 20  # the test runs at 20× speed
            stop = threading.Event()
            key = f"{pod.metadata.name}/{sidecar.name}"
            threading.Thread(target=scrape_loop, args=(target, names, every, lambda line: self._log(key, line + "\n"), stop),
                             daemon=True).start()
            self.endpoints[uid] = (gauges, http, stop)
        for k, v in report.items():
            self.endpoints[uid][0][k].set(v)

    def _close(self, uid: str) -> None:
        _, http, stop = self.endpoints.pop(uid)
        stop.set()
        http.shutdown()


class RecordingMaster:
    """The job master's HTTP API, recording ``(method, path, body)``; ``on_drain(node)`` is called
    for ``POST /drain`` (the test makes the worker's pod exit 0). With ``key`` it refuses (401)
    what is not signed with it, as the real master does, and records it in ``refused``."""

    def __init__(self, on_drain=None, key: bytes | None = None):
        from airflow_dlrover.runtime.auth import HEADER, Refused, Verifier

        self.calls: list[tuple[str, str, dict | None]] = []
        self.refused: list[tuple[str, str]] = []
        self.on_drain = on_drain
        verifier = Verifier(key) if key else None
        master = self

        def refuse(handler, raw: bytes) -> bool:
            if verifier is None:
                return False
            try:
                verifier.check(handler.command, handler.path, raw, handler.headers.get(HEADER))
                return False
            except Refused:
                master.refused.append((handler.command, handler.path))
                handler.send_response(401)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return True

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if refuse(self, b""):
                    return
                master.calls.append(("GET", self.path, None))
                replies = {"/status": {"state": "running", "samples_done": 0, "ps": [], "generation": 0},
                           "/metrics": {"throughput": 0.0, "nodes": {}, "status": None}}
                self._reply(replies.get(self.path, {}))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if refuse(self, raw):
                    return
                body = json.loads(raw or b"{}")
                master.calls.append(("POST", self.path, body))
                if self.path == "/drain" and master.on_drain:
                    master.on_drain(body["node"])
                self._reply({"ok": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def posts(self) -> list[tuple[str, dict]]:
        return [(path, body) for method, path, body in self.calls if method == "POST"]

    def __enter__(self) -> "RecordingMaster":
        threading.Thread(target=self.server.serve_forever, name="master", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
