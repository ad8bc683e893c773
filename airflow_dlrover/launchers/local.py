"""Local launcher (the embedded default): each node is a process on this machine, in its own cgroup
with the plan's CPU quota and memory limit, torch threads sized from its CPU allocation.

Everything about a job lives in ``<base_dir>/<job_id>/``: ``spec.json``, ``job.json`` (the nodes,
their resources, pids and restarts), ``logs/``, ``run/`` (the address each node listens on),
``exit/`` (each node's exit status, written by a ``sh`` wrapper so that it survives the launcher)
and the master's state and checkpoints. A second launcher process adopts the job from there: an
Airflow retry never starts a second copy.

Recovery of a failed node keeps the data consistent through the master: a lost worker's shards are
requeued; a restarted PS makes the master roll the whole job back to its last checkpoint; a
restarted master reloads its persisted state. Nodes keep their ports across restarts, so clients
reconnect transparently.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from airflow_dlrover.launchers.base import (
    FAILED, FAILED_STATES, LOST, OOM_KILLED, OOM_MEMORY_GROWTH, RUNNING, STOPPED, SUCCEEDED, NodeStatus, call_master,
)
from airflow_dlrover.launchers.cgroups import CgroupManager, Limits
from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)

MASTER_CPU = 0.5  # the master only hands out shards and checkpoints (our measurement: < 0.1 core)
MASTER_MEMORY_MB = 512.0
START_TIMEOUT_S = 60.0


def _threads(cpu: float | None) -> int:
    """Torch threads of a node: its whole cores (FIELD-NOTES: never more threads than cores owned)."""
    return max(1, math.floor(cpu or 1))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalLauncher:
    """See the module docstring. ``base_dir`` holds one folder per job."""

    def __init__(self, base_dir: str | Path, cgroups: CgroupManager | None = None, python: str = sys.executable):
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.cgroups = cgroups or CgroupManager()
        self.python = python
        self._groups: dict[tuple[str, str], Any] = {}

    def _group(self, job_id: str, node: dict[str, Any], *, apply: bool = False):
        """The node's cgroup: created (limits written) when first needed or when ``apply``;
        afterwards read from the cache, so that status polls do not rewrite limits."""
        key = (job_id, node["name"])
        if apply or key not in self._groups:
            self._groups[key] = self.cgroups.create(job_id, node["name"], Limits(node["cpu"], node["memory_mb"]))
        return self._groups[key]

    # -- job files -----------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        return self.base_dir / job_id

    def read_job(self, job_id: str) -> dict[str, Any]:
        """The job's record (``job.json``): configuration, nodes with their resources, events."""
        path = self.job_dir(job_id) / "job.json"
        if not path.exists():
            raise KeyError(f"no job {job_id!r} under {self.base_dir}")
        return json.loads(path.read_text())

    def _write(self, job_id: str, job: dict[str, Any]) -> None:
        path = self.job_dir(job_id) / "job.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(job, indent=1))
        os.replace(tmp, path)

    def spec(self, job_id: str) -> JobSpec:
        return JobSpec.load(self.job_dir(job_id) / "spec.json")

    def master_address(self, job_id: str) -> str:
        return self.read_job(job_id)["nodes"]["master"]["address"]

    # -- master API ----------------------------------------------------------------------------
    def master_call(self, job_id: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
        try:
            return call_master(f"http://{self.master_address(job_id)}", path, body, timeout)
        except ConnectionError as err:
            raise ConnectionError(f"master of {job_id}: {err}") from None

    def exists(self, job_id: str) -> bool:
        """Whether the job was launched (its record exists): a retry adopts it."""
        return (self.job_dir(job_id) / "job.json").exists()

    # -- processes -----------------------------------------------------------------------------
    def _command(self, job_id: str, node: dict[str, Any], master: str | None) -> list[str]:
        args = [self.python, "-m", "airflow_dlrover.runtime", node["role"], "--job-dir", str(self.job_dir(job_id)),
                "--index", str(node["index"]), "--name", node["name"], "--port", str(node["port"])]
        if node["role"] == "ps":
            args += ["--count", str(node["count"])]
        if node["role"] == "worker":
            args += ["--master", master, "--threads", str(_threads(node["cpu"]))]
        return args

    def _start(self, job_id: str, job: dict[str, Any], name: str) -> None:
        node = job["nodes"][name]
        folder = self.job_dir(job_id)
        for sub in ("logs", "run", "exit"):
            (folder / sub).mkdir(exist_ok=True)
        (folder / "run" / f"{name}.addr").unlink(missing_ok=True)
        exit_file = folder / "exit" / f"{name}.code"
        exit_file.unlink(missing_ok=True)
        group = self._group(job_id, node, apply=True)
        master = job["nodes"]["master"].get("address")
        inner = shlex.join(self._command(job_id, node, master))
        script = f"{inner}; echo $? > {shlex.quote(str(exit_file))}"
        env = dict(os.environ, OMP_NUM_THREADS=str(_threads(node["cpu"])),
                   DLROVER_WORKER_GPU=str(node.get("gpu", 0)), PYTHONUNBUFFERED="1")
        with open(folder / "logs" / f"{name}.log", "ab") as logfile:
            process = subprocess.Popen(["/bin/sh", "-c", script], stdout=logfile, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, preexec_fn=group.preexec_fn(), cwd=folder)
        group.add_pid(process.pid)  # already there in v1/v2; advisory mode tracks usage from it
        node.update(pid=process.pid, started=psutil.Process(process.pid).create_time(), state=RUNNING,
                    oom_base=group.usage().oom_kills)
        self._write(job_id, job)

    def _wait_ready(self, job_id: str, job: dict[str, Any], names: list[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for name in names:
            path = self.job_dir(job_id) / "run" / f"{name}.addr"
            while not path.exists():
                if time.monotonic() > deadline or self._node_state(job_id, job["nodes"][name])[0] != RUNNING:
                    tail = (self.job_dir(job_id) / "logs" / f"{name}.log").read_text()[-2000:]
                    raise RuntimeError(f"{name} of job {job_id} did not start:\n{tail}")
                time.sleep(0.05)
            job["nodes"][name]["address"] = path.read_text()
        self._write(job_id, job)

    def _node_state(self, job_id: str, node: dict[str, Any]) -> tuple[str, int | None, str, int]:
        """(state, exit code, reason, oom kills since start) of a node's process."""
        if node.get("state") == STOPPED:
            return STOPPED, None, "stopped", 0
        exit_file = self.job_dir(job_id) / "exit" / f"{node['name']}.code"
        ooms = self._group(job_id, node).usage().oom_kills - node.get("oom_base", 0)
        alive = False
        try:
            process = psutil.Process(node["pid"])
            alive = abs(process.create_time() - node["started"]) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, KeyError, TypeError):
            pass
        if exit_file.exists() and exit_file.read_text().strip():
            code = int(exit_file.read_text().strip())
            if code == 0:
                return SUCCEEDED, 0, "exited 0", ooms
            if ooms > 0 and code in (137, -9):
                return OOM_KILLED, code, f"OOM-killed at its {node['memory_mb']:g} MB limit", ooms
            reason = "killed (SIGKILL)" if code == 137 else f"exited {code}"
            return FAILED, code, reason, ooms
        if alive:
            return RUNNING, None, "", ooms
        return LOST, None, "process vanished without an exit status", ooms

    def _kill(self, job_id: str, node: dict[str, Any], sig: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
        """Signal the node's whole process group (wrapper and training process), wait until the
        group is empty, SIGKILL it after ``grace_s``."""
        try:
            process = psutil.Process(node["pid"])
            if abs(process.create_time() - node["started"]) >= 1.0:
                return
            group = os.getpgid(process.pid)
        except (psutil.NoSuchProcess, ProcessLookupError, KeyError):
            return
        deadline = time.monotonic() + grace_s
        try:
            os.killpg(group, sig)
            while True:
                try:  # reap our own child, if it is one, so that it does not linger as a zombie
                    os.waitpid(node["pid"], os.WNOHANG)
                except ChildProcessError:
                    pass
                os.killpg(group, 0)  # raises once no process of the group is left
                if time.monotonic() > deadline:
                    os.killpg(group, signal.SIGKILL)
                time.sleep(0.02)
        except ProcessLookupError:
            return

    # -- the interface -------------------------------------------------------------------------
    def launch(self, spec: JobSpec, config: Configuration) -> str:
        """Start master, PS and workers for ``config``; adopt the job if it already runs."""
        folder = self.job_dir(spec.job_id)
        resuming = (folder / "job.json").exists()
        if resuming:
            job = self.read_job(spec.job_id)
            if self._node_state(spec.job_id, job["nodes"]["master"])[0] == RUNNING:
                log.info("job %s already running: adopted", spec.job_id)
                return spec.job_id
            for node in job["nodes"].values():  # leftovers of a launch whose master died
                self._kill(spec.job_id, node)
        folder.mkdir(parents=True, exist_ok=True)
        spec.save(folder / "spec.json")
        job = {"job_id": spec.job_id, "config": config.to_row(), "nodes": {}, "events": [], "resizes": 0,
               "started": time.time()}
        job["nodes"]["master"] = dict(name="master", role="master", index=0, cpu=MASTER_CPU,
                                      memory_mb=MASTER_MEMORY_MB, port=_free_port(), restarts=0)
        self._write(spec.job_id, job)
        self._start(spec.job_id, job, "master")
        self._wait_ready(spec.job_id, job, ["master"])
        self._start_ps(spec.job_id, job, config)
        if resuming and (folder / "master_state.json").exists():
            # The master kept its shards; the new PS are empty: roll back to the last checkpoint.
            self.master_call(spec.job_id, "/restore", {})
        for index in range(config.workers):
            self._add_worker(spec.job_id, job, config, index)
        return spec.job_id

    def _start_ps(self, job_id: str, job: dict[str, Any], config: Configuration, ports: dict[str, int] | None = None) -> None:
        """Start ``config.ps`` PS (keeping the ports of the PS they replace) and tell the master."""
        names = []
        for index in range(config.ps):
            name = f"ps-{index}"
            port = (ports or {}).get(name) or _free_port()
            job["nodes"][name] = dict(name=name, role="ps", index=index, count=config.ps, cpu=config.ps_cpu,
                                      memory_mb=config.ps_memory_mb or None, port=port, restarts=0)
            self._start(job_id, job, name)
            names.append(name)
        self._wait_ready(job_id, job, names)
        self.master_call(job_id, "/cluster", {"ps": [job["nodes"][n]["address"] for n in names]})

    def _add_worker(self, job_id: str, job: dict[str, Any], config: Configuration, index: int) -> str:
        name = f"worker-{index}"
        job["nodes"][name] = dict(name=name, role="worker", index=index, cpu=config.worker_cpu,
                                  memory_mb=config.worker_memory_mb or None, gpu=config.worker_gpu, port=0, restarts=0)
        self._start(job_id, job, name)
        return name

    def status(self, job_id: str) -> list[NodeStatus]:
        job = self.read_job(job_id)
        out = []
        for node in job["nodes"].values():
            state, code, reason, ooms = self._node_state(job_id, node)
            out.append(NodeStatus(node["name"], node["role"], node["index"], state, node["cpu"], node["memory_mb"],
                                  node.get("restarts", 0), code, reason, ooms))
        return out

    def metrics(self, job_id: str) -> dict[str, Any]:
        """The master's metrics plus each node's cgroup usage (CPU seconds, memory)."""
        job = self.read_job(job_id)
        try:
            metrics = self.master_call(job_id, "/metrics", timeout=5.0)
        except ConnectionError:
            metrics = {"throughput": 0.0, "nodes": {}, "status": None}
        usage = {}
        for name, node in job["nodes"].items():
            if node.get("state") == STOPPED:
                continue
            u = self._group(job_id, node).usage()
            usage[name] = {"role": node["role"], "cpu_seconds": u.cpu_seconds, "memory_mb": u.memory_mb,
                           "memory_peak_mb": u.memory_peak_mb, "cpu": node["cpu"], "memory_limit_mb": node["memory_mb"]}
        metrics["usage"] = usage
        metrics["usage_time"] = time.monotonic()  # when the usage was read (for CPU rates)
        return metrics

    def relaunch(self, job_id: str, node_name: str, cpu: float | None = None, memory_mb: float | None = None) -> NodeStatus:
        """Restart one node (optionally with new resources) and re-join it to the job."""
        job = self.read_job(job_id)
        node = job["nodes"][node_name]
        self._kill(job_id, node, signal.SIGKILL, grace_s=2.0)
        if cpu is not None:
            node["cpu"] = cpu
        if memory_mb is not None:
            node["memory_mb"] = memory_mb
        node["restarts"] = node.get("restarts", 0) + 1
        job["events"].append({"time": time.time(), "node": node_name, "event": "relaunch", "cpu": node["cpu"],
                              "memory_mb": node["memory_mb"]})
        if node["role"] == "worker":
            self.master_call(job_id, "/node_lost", {"node": node_name})
        self._start(job_id, job, node_name)
        if node["role"] in ("master", "ps"):
            self._wait_ready(job_id, job, [node_name])
        if node["role"] == "ps":
            self.master_call(job_id, "/restore", {})  # roll every PS back to the last checkpoint
        state, code, reason, ooms = self._node_state(job_id, node)
        return NodeStatus(node_name, node["role"], node["index"], state, node["cpu"], node["memory_mb"],
                          node["restarts"], code, reason, ooms)

    def recover(self, job_id: str) -> list[dict[str, Any]]:
        """Relaunch every failed node: more memory after a real OOM (once per kill); returns events."""
        events = []
        for status in self.status(job_id):
            if status.state not in FAILED_STATES:
                continue
            memory = status.memory_mb
            if status.state == OOM_KILLED and memory:
                memory = math.ceil(memory * OOM_MEMORY_GROWTH / 64) * 64
            started = time.time()
            self.relaunch(job_id, status.name, memory_mb=memory)
            events.append({"node": status.name, "state": status.state, "reason": status.reason,
                           "memory_mb": memory, "recovered_in_s": time.time() - started})
        return events

    def resize(self, job_id: str, config: Configuration) -> dict[str, Any]:
        """Change the job to ``config``: workers join or drain without stopping the others; a new
        PS count goes checkpoint → restart PS → restore (re-partition). New CPU / memory of the PS,
        or of workers that keep their number of torch threads, are new cgroup limits in place (no
        restart, as Kubernetes' in-place pod resize); otherwise each worker is relaunched."""
        job = self.read_job(job_id)
        current = Configuration(**job["config"])
        started = time.monotonic()
        actions = []
        ps_nodes = [node for node in job["nodes"].values() if node["role"] == "ps"]
        if config.ps == current.ps and (config.ps_cpu, config.ps_memory_mb) != (current.ps_cpu, current.ps_memory_mb):
            for node in ps_nodes:  # in place: a PS is one numpy thread, its rows stay where they are
                node.update(cpu=config.ps_cpu, memory_mb=config.ps_memory_mb or None)
                self._group(job_id, node, apply=True)
            actions.append(f"ps resized in place to {config.ps_cpu:g} CPU / {config.ps_memory_mb:g} MB")
        elif config.ps != current.ps:
            self.master_call(job_id, "/checkpoint", {})
            ports = {}
            for name in [n for n, node in job["nodes"].items() if node["role"] == "ps"]:
                self._kill(job_id, job["nodes"][name])
                ports[name] = job["nodes"].pop(name)["port"]
            self._start_ps(job_id, job, config, ports)
            self.master_call(job_id, "/restore", {})
            actions.append(f"ps {current.ps}×{current.ps_cpu:g} → {config.ps}×{config.ps_cpu:g} (checkpoint, re-partition)")
        workers = sorted((n for n, node in job["nodes"].items() if node["role"] == "worker" and node.get("state") != STOPPED),
                         key=lambda n: job["nodes"][n]["index"])
        in_place = config.worker_gpu == current.worker_gpu and _threads(config.worker_cpu) == _threads(current.worker_cpu)
        if (config.worker_cpu, config.worker_memory_mb) != (current.worker_cpu, current.worker_memory_mb) and in_place:
            for name in workers[: config.workers]:  # same torch threads: new cgroup limits suffice
                job["nodes"][name].update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None)
                self._group(job_id, job["nodes"][name], apply=True)
            actions.append(f"workers resized in place to {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        elif (config.worker_cpu, config.worker_memory_mb, config.worker_gpu) != (current.worker_cpu, current.worker_memory_mb, current.worker_gpu):
            for name in workers[: config.workers]:
                node = job["nodes"][name]
                self.master_call(job_id, "/drain", {"node": name})
                self._wait_exit(job_id, node, timeout_s=60.0)
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None, gpu=config.worker_gpu)
                node["restarts"] = node.get("restarts", 0) + 1
                self._start(job_id, job, name)
            actions.append(f"workers relaunched with {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        for name in workers[config.workers:]:  # remove: drain (finish the shard, then exit)
            self.master_call(job_id, "/drain", {"node": name})
            self._wait_exit(job_id, job["nodes"][name], timeout_s=60.0)
            job["nodes"][name]["state"] = STOPPED
            actions.append(f"{name} removed")
        next_index = max((node["index"] for node in job["nodes"].values() if node["role"] == "worker"), default=-1) + 1
        for offset in range(config.workers - len(workers)):
            name = self._add_worker(job_id, job, config, next_index + offset)
            actions.append(f"{name} added")
        job = self.read_job(job_id) | {"nodes": job["nodes"]}
        job["config"] = config.to_row()
        job["resizes"] = job.get("resizes", 0) + 1
        job["events"].append({"time": time.time(), "event": "resize", "actions": actions})
        self._write(job_id, job)
        return {"actions": actions, "seconds": time.monotonic() - started}

    def _wait_exit(self, job_id: str, node: dict[str, Any], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._node_state(job_id, node)[0] == RUNNING:
            if time.monotonic() > deadline:
                self._kill(job_id, node)
                return
            time.sleep(0.1)

    def kill_node(self, job_id: str, node_name: str) -> None:
        """Fault injection: SIGKILL the node's training process (not its wrapper)."""
        node = self.read_job(job_id)["nodes"][node_name]
        for child in psutil.Process(node["pid"]).children(recursive=True):
            child.kill()

    def set_cpu(self, job_id: str, node_name: str, cpu: float) -> None:
        """Change a node's CPU quota in place (fault injection ``slow-worker``)."""
        job = self.read_job(job_id)
        node = job["nodes"][node_name]
        node["cpu"] = cpu
        self._group(job_id, node, apply=True)
        self._write(job_id, job)

    def stop(self, job_id: str) -> None:
        job = self.read_job(job_id)
        for node in job["nodes"].values():
            self._kill(job_id, node)
        for node in job["nodes"].values():
            node["state"] = STOPPED
        self._write(job_id, job)
        self._groups = {key: group for key, group in self._groups.items() if key[0] != job_id}
        self.cgroups.remove_job(job_id)
