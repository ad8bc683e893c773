"""The one launcher: launch/adopt, resize, relaunch and the controller's actions (``apply``),
written once over the small primitives a backend implements (``LocalLauncher``: processes in
cgroups; ``KubernetesLauncher``: pods through the ``cncf-kubernetes`` hooks).

A job's *record* (``job.json``: configuration, nodes with their resources and restarts, events)
is kept by the backend (a file; a ConfigMap), so that any process adopts the job by its id. The
protocol with the job's master is the runtime's, the same on every backend:

* workers join as new nodes and leave by ``/drain`` (finish the shard, then exit) — a node that
  is not running leaves by ``/node_lost`` (its shards are requeued);
* a new PS count is ``/checkpoint {hold}`` → new PS → ``/cluster`` (which restores the new set
  from that checkpoint: the re-partition);
* a relaunched worker's shards are requeued (``/node_lost``), a relaunched PS rolls the job back
  to its last checkpoint (``/restore``), a relaunched master reloads its persisted state;
* a node's new CPU / memory is applied in place where the backend can and the node keeps its
  number of torch threads (:func:`torch_threads`; a PS is one numpy thread), else the node is
  relaunched.

What a backend implements (everything else is here): ``_record`` / ``_write`` (the record),
``_live_states`` (each node's state from its process or pod), ``_place`` (a new node's
backend fields), ``_create_job`` (the job's objects and its master), ``_start_node``,
``_stop_node``, ``_set_limits`` (in place), ``can_resize_in_place``, ``_ps_addresses``,
``_adoptable``, ``_discard``, ``_master_url``, ``_acquire`` / ``_release`` (the job's lock),
``job_dir``, ``spec``, ``stop``, ``kill_node``.

A *trainer of the user's* (``spec.trainer``, ``launchers.contract``) has no master: its nodes get
the contract's environment (``_trainer_env``) and report through their metrics file or log
(``_read_output``); a resize restarts the group (SIGTERM → the trainer checkpoints → the new
configuration starts and resumes), timed from the SIGTERM to the first report of the new group;
a failed node restarts the whole group of an ``allreduce`` trainer (as torchrun's elastic agent
does) and only itself in a ``ps`` trainer. A node that exits non-zero before its first report,
or reports nothing within ``report_timeout_s``, broke the contract: it reads as exit code
``USER_ERROR_EXIT_CODE`` (no retry fixes it). A node that SIGKILL ended (``SIGKILL_EXIT_CODES``)
failed by the cluster's doing, before its first report too.

Every operation that changes the job (launch, relaunch, set_limits, resize, stop) holds the job's
lock from its read of the record to its last write: two launcher processes (the fine-tune resizing
while the guard relaunches a node) take turns instead of each writing back a record without the
other's change. The lock is reentrant within a process (a resize relaunches nodes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from airflow_dlrover.launchers.contract import (
    TrainerSpec, job_progress, node_argv, node_env, node_report, parse_reports,
)
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import FAILED_STATES, Configuration, NodeState, NodeStatus
from airflow_dlrover.runtime.auth import call_master
from airflow_dlrover.runtime.prepare import prepare
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)

RUNNING, SUCCEEDED, FAILED, OOM_KILLED, LOST, STOPPED, PENDING, UNSCHEDULABLE = (
    NodeState.RUNNING, NodeState.SUCCEEDED, NodeState.FAILED, NodeState.OOM_KILLED, NodeState.LOST,
    NodeState.STOPPED, NodeState.PENDING, NodeState.UNSCHEDULABLE,
)
__all__ = ["FAILED_STATES", "Launcher", "NodeStatus", "call_master", "torch_threads"]


def exclusive(operation):
    """Run a launcher operation holding its job's lock (the job id, or the spec, comes first)."""
    @functools.wraps(operation)
    def locked(self: "Launcher", job: Any, *args: Any, **kwargs: Any) -> Any:
        with self._job_lock(job if isinstance(job, str) else job.job_id):
            return operation(self, job, *args, **kwargs)
    return locked


def torch_threads(cpu: float | None) -> int:
    """Torch threads of a node: its whole cores (more threads than the cores a node owns contend and run slower)."""
    return max(1, math.floor(cpu or 1))


class Launcher:
    """See the module docstring. Subclasses implement the primitives; ``poll_s`` is theirs."""

    poll_s: float = T.LOCAL_POLL_S
    start_timeout_s: float = T.NODE_START_TIMEOUT_S
    #: the job's nodes run this process's Python and path: a user's model is checked at launch here
    runs_local_code: bool = False

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._trainers: dict[str, TrainerSpec | None] = {}
        self._locks: dict[str, tuple[threading.RLock, list]] = {}  # job → (thread lock, [depth, handle])
        self._locks_guard = threading.Lock()

    @contextlib.contextmanager
    def _job_lock(self, job_id: str):
        """The job's lock: a thread lock for this process, the backend's (``_acquire``) across processes."""
        with self._locks_guard:
            thread_lock, held = self._locks.setdefault(job_id, (threading.RLock(), [0, None]))
        with thread_lock:
            if held[0] == 0:
                held[1] = self._acquire(job_id)
            held[0] += 1
            try:
                yield
            finally:
                held[0] -= 1
                if held[0] == 0:
                    self._release(job_id, held[1])

    # -- primitives (per backend) ----------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        raise NotImplementedError

    def spec(self, job_id: str) -> JobSpec:
        raise NotImplementedError

    def exists(self, job_id: str) -> bool:
        raise NotImplementedError

    def _record(self, job_id: str) -> dict[str, Any]:
        """The stored record (``KeyError`` when there is no such job)."""
        raise NotImplementedError

    def _write(self, job_id: str, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def _live_states(self, job_id: str, record: dict[str, Any]) -> dict[str, tuple]:
        """Each node's ``(state, exit code, reason, OOM kills since its start, start time)``."""
        raise NotImplementedError

    def _place(self, record: dict[str, Any], node: dict[str, Any], previous: dict[str, Any] | None) -> None:
        """A new node's backend fields (a port, a pod name); ``previous``: the node it replaces."""

    def _create_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """Create the job's objects and start its master (``record["nodes"]["master"]``)."""
        raise NotImplementedError

    def _start_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> None:
        raise NotImplementedError

    def _stop_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], *, replacing: bool) -> None:
        """Stop the node and wait until it is gone; ``replacing``: it starts again at once."""
        raise NotImplementedError

    def _stop_nodes(self, job_id: str, record: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        """Stop several nodes, signalled together (a trainer's ranks stop as one)."""
        for node in nodes:
            self._stop_node(job_id, record, node, replacing=False)

    def _set_limits(self, job_id: str, node: dict[str, Any]) -> None:
        """Apply the node's ``cpu`` / ``memory_mb`` to the running node, in place."""
        raise NotImplementedError

    def can_resize_in_place(self) -> bool:
        raise NotImplementedError

    def _ps_addresses(self, job_id: str, record: dict[str, Any], names: list[str]) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self, job_id: str, record: dict[str, Any], names: list[str]) -> None:
        raise NotImplementedError

    def _adoptable(self, record: dict[str, Any]) -> bool:
        """Whether the record of a job launched to the end describes a running job to adopt."""
        raise NotImplementedError

    def _discard(self, job_id: str, record: dict[str, Any]) -> None:
        """Remove what is left of a launch whose master died or that failed half-way."""
        raise NotImplementedError

    def _master_url(self, job_id: str) -> str:
        raise NotImplementedError

    def _peer_address(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> str:
        """``host:port`` where a trainer's node listens (its ``TF_CONFIG`` entry)."""
        raise NotImplementedError

    def _rendezvous(self, job_id: str, record: dict[str, Any]) -> tuple[str, int]:
        """(host, port) of a trainer group's ``torch.distributed`` rendezvous, on worker 0."""
        raise NotImplementedError

    def _read_output(self, job_id: str, node: dict[str, Any], via: str) -> tuple[str, float | None]:
        """(text, modification time) since its start of a trainer node's reports ``via`` its
        metrics ``file``, its ``log`` (also its output's tail), or its ``prometheus`` endpoint's
        scrapes as JSON lines (:func:`contract.scrape`, at most every ``TRAINER_SCRAPE_S``);
        ("", None) when there is none yet."""
        raise NotImplementedError

    def _acquire(self, job_id: str) -> Any:
        """Take the job's lock across processes (block until it is free); returns a handle."""
        raise NotImplementedError

    def _release(self, job_id: str, handle: Any) -> None:
        raise NotImplementedError

    def stop(self, job_id: str) -> None:
        raise NotImplementedError

    def stopped(self, job_id: str) -> bool:
        """Whether the job was stopped (``stop``: its record says so, or is gone): a watcher of it
        has nothing left to wait for."""
        return not self.exists(job_id) or bool(self._record(job_id).get("stopped"))

    def kill_node(self, job_id: str, node_name: str) -> None:
        """Fault injection: kill the node as a crash would."""
        raise NotImplementedError

    def metrics(self, job_id: str) -> dict[str, Any]:
        """The master's metrics plus each node's usage (``usage``, read at ``usage_time``)."""
        raise NotImplementedError

    # -- the record and the master ----------------------------------------------------------------
    def read_job(self, job_id: str) -> dict[str, Any]:
        """The record with each node's live ``state``, ``exit_code``, ``reason``, ``oom_kills``, ``started``."""
        record = self._record(job_id)
        record = with_live_states(record, self._live_states(job_id, record))
        if record.get("trainer"):
            self._check_contract(job_id, record)
        return record

    def status(self, job_id: str) -> list[NodeStatus]:
        return statuses(self.read_job(job_id))

    def master_call(self, job_id: str, path: str, body: dict[str, Any] | None = None,
                    timeout: float = T.MASTER_CALL_TIMEOUT_S) -> Any:
        try:
            return call_master(self._master_url(job_id), path, body, timeout=timeout, key=self._key(job_id))
        except ConnectionError as err:
            raise ConnectionError(f"master of {job_id}: {err}") from None

    def _key(self, job_id: str) -> bytes:
        """The job's key (read once per job and launcher: it does not change while the job runs)."""
        if self._keys.get(job_id) is None:
            self._keys[job_id] = self.spec(job_id).key
        return self._keys[job_id]

    def _new_node(self, record: dict[str, Any], name: str, role: str, index: int, cpu: float,
                  memory_mb: float | None, gpu: int = 0, count: int = 1,
                  previous: dict[str, Any] | None = None) -> dict[str, Any]:
        node = dict(name=name, role=role, index=index, cpu=cpu, memory_mb=memory_mb or None, gpu=gpu, count=count,
                    restarts=0)
        self._place(record, node, previous)
        record["nodes"][name] = node
        return node

    def _node_state(self, job_id: str, record: dict[str, Any], name: str) -> str:
        return self._live_states(job_id, {**record, "nodes": {name: record["nodes"][name]}})[name][0]

    # -- a trainer of the user's (launchers.contract) ----------------------------------------------
    def trainer(self, job_id: str) -> TrainerSpec | None:
        """The job's trainer, or None for our runtime (read once per job and launcher)."""
        if job_id not in self._trainers:
            data = self.spec(job_id).trainer
            self._trainers[job_id] = TrainerSpec.from_dict(data) if data else None
        return self._trainers[job_id]

    def progress(self, job_id: str, timeout: float = T.MASTER_CALL_TIMEOUT_S) -> dict[str, Any]:
        """The job's ``state``, ``samples_done``, ``samples_total`` and ``throughput``: its master's
        ``/status`` (our runtime; ``timeout``: how long an unreachable master is retried), or its
        trainer's reports (:func:`contract.job_progress`)."""
        if self.trainer(job_id) is None:
            return self.master_call(job_id, "/status", timeout=timeout)
        return self._job_metrics(job_id, self._record(job_id))["status"]

    def restart_cost_s(self, job_id: str) -> float | None:
        """What a resize costs a trainer of the user's, which every resize restarts: the median of
        its measured group restarts (SIGTERM → first report of every new worker; profiling makes
        some), else ``TRAINER_RESTART_COST_S``. None for our runtime (the controller's costs by kind)."""
        if self.trainer(job_id) is None:
            return None
        measured = [e["restart_s"] for e in self._record(job_id)["events"]
                    if e.get("event") == "restart" and e.get("restart_s") is not None]
        return statistics.median(measured) if measured else C.TRAINER_RESTART_COST_S

    def _trainer_reports(self, job_id: str, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each running or finished node's report, with its ``role``."""
        return {name: {**self._node_report(job_id, node), "role": node["role"]}
                for name, node in record["nodes"].items() if node.get("state") != STOPPED}

    def _node_report(self, job_id: str, node: dict[str, Any]) -> dict[str, Any]:
        """A trainer node's reports since its start (:func:`contract.node_report`), from its metrics
        file, its log (``log_regex``) or its endpoint's scrapes (``metrics_port``)."""
        trainer = self.trainer(job_id)
        text, mtime = self._read_output(job_id, node, trainer.reports_via)
        return node_report(parse_reports(text, trainer.log_regex, written_at=mtime))

    def _job_metrics(self, job_id: str, record: dict[str, Any]) -> dict[str, Any]:
        """The master's ``/metrics`` (an unreachable master: none), or a trainer's answer in its
        shape: per-node reports, the job's throughput and progress. ``metrics`` adds the usage."""
        if not record.get("trainer"):
            try:
                return self.master_call(job_id, "/metrics", timeout=T.MASTER_POLL_TIMEOUT_S)
            except ConnectionError:
                return {"throughput": 0.0, "nodes": {}, "status": None}
        record = self.read_job(job_id)
        reports = self._trainer_reports(job_id, record)
        status = job_progress(reports, {n: node["state"] for n, node in record["nodes"].items()})
        return {"throughput": status["throughput"], "nodes": reports, "status": status}

    def _check_contract(self, job_id: str, record: dict[str, Any]) -> None:
        """Mark the workers that broke the contract (module docstring) as the user's failures."""
        trainer = self.trainer(job_id)
        now = time.time()
        for name, node in record["nodes"].items():
            if node["role"] != "worker" or node.get("state") not in (RUNNING, FAILED, SUCCEEDED):
                continue
            if node["state"] == FAILED and node.get("exit_code") in (C.USER_ERROR_EXIT_CODE, *C.SIGKILL_EXIT_CODES):
                continue
            if self._node_report(job_id, node)["reports"]:
                continue
            source = {"log": f"log lines matching {trainer.log_regex!r}", "file": "DLROVER_METRICS_FILE",
                      "prometheus": f"Prometheus text on port {trainer.metrics_port}{trainer.metrics_path}"}[trainer.reports_via]
            if node["state"] in (FAILED, SUCCEEDED):
                output, _ = self._read_output(job_id, node, "log")
                what = "exited 0 without a report" if node["state"] == SUCCEEDED else f"{node.get('reason') or 'failed'} before its first report"
                why = f"{what} (in {source}); output tail:\n{output[-1500:]}"
            elif now - (node.get("started") or now) > trainer.report_timeout_s:
                why = f"reported nothing (in {source}) in report_timeout_s={trainer.report_timeout_s:g}s"
            else:
                continue
            node.update(state=FAILED, exit_code=C.USER_ERROR_EXIT_CODE, reason=f"trainer {name} {why}")

    def _trainer_env(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The argv and contract environment of a trainer's node."""
        trainer, spec = self.trainer(job_id), self.spec(job_id)
        peers = {name: self._peer_address(job_id, record, other) for name, other in record["nodes"].items()}
        env = node_env(job_id=job_id, trainer=trainer, config=Configuration(**record["config"]), node=node,
                       samples=spec.samples, peers=peers, rendezvous=tuple(record["rendezvous"]),
                       checkpoint_dir=trainer.checkpoint_dir or self._checkpoint_dir(job_id),
                       metrics_file=self._metrics_file(job_id, node), generation=record["generation"],
                       job_key=spec.authkey, metrics_port=self._metrics_port(job_id, node))
        return node_argv(trainer, env), env

    def _metrics_port(self, job_id: str, node: dict[str, Any]) -> int:
        """Where a trainer's node serves Prometheus text (0: it reports otherwise)."""
        return self.trainer(job_id).metrics_port

    def _metrics_file(self, job_id: str, node: dict[str, Any]) -> str:
        """Where a trainer's node writes its reports, as the node sees the path."""
        return str(self.job_dir(job_id) / "metrics" / f"{node['name']}.jsonl")

    def _checkpoint_dir(self, job_id: str) -> str:
        """A trainer's default checkpoint folder, as its nodes see the path (it outlives them)."""
        return str(self.job_dir(job_id) / "checkpoint")

    def _start_group(self, job_id: str, record: dict[str, Any], config: Configuration,
                     restarts: dict[str, int] | None = None) -> None:
        """Place every node of ``config`` (PS, then workers), then start them: each gets its peers'
        addresses."""
        grace = self.trainer(job_id).grace_s
        nodes = [self._new_node(record, f"ps-{i}", "ps", i, config.ps_cpu, config.ps_memory_mb, count=config.ps)
                 for i in range(config.ps)]
        nodes += [self._new_node(record, f"worker-{i}", "worker", i, config.worker_cpu, config.worker_memory_mb,
                                 gpu=config.worker_gpu) for i in range(config.workers)]
        for node in nodes:
            node.update(grace_s=grace, restarts=(restarts or {}).get(node["name"], 0))
        record["rendezvous"] = list(self._rendezvous(job_id, record))
        for node in nodes:
            self._start_node(job_id, record, node)
        self._write(job_id, record)

    def _stop_group(self, job_id: str, record: dict[str, Any]) -> dict[str, int]:
        """SIGTERM every node (the trainer checkpoints in its grace period); returns the restart
        count each node's next incarnation gets."""
        self._stop_nodes(job_id, record, [n for n in record["nodes"].values() if n.get("state") != STOPPED])
        return {name: node.get("restarts", 0) + 1 for name, node in record["nodes"].items()}

    def _restart_group(self, job_id: str, record: dict[str, Any], config: Configuration, reason: str) -> dict[str, Any]:
        """Stop the trainer's group and start it on ``config`` (it resumes from its checkpoint);
        returns the actions and the seconds from the SIGTERM to the first report of every new worker
        (None when one did not report within ``report_timeout_s``: the guard sees why)."""
        started, stamp = time.monotonic(), time.time()
        current = record["config"]
        restarts = self._stop_group(job_id, record)
        stopped_s = time.monotonic() - started
        record["nodes"] = {}
        record["config"] = config.to_row()
        record["generation"] = record.get("generation", 0) + 1
        self._start_group(job_id, record, config, restarts)
        reported = self._wait_first_reports(job_id)
        seconds = None if reported is None else reported - stamp
        event = {"time": stamp, "event": "restart", "reason": reason, "generation": record["generation"],
                 "from": current, "to": config.to_row(), "stop_s": stopped_s, "restart_s": seconds}
        record["events"].append(event)
        if reason == "resize":
            record["resizes"] = record.get("resizes", 0) + 1
        self._write(job_id, record)
        restart = "trainer did not report again" if seconds is None else f"training again after {seconds:.1f} s"
        return {"actions": [f"group restarted on {config.describe()} ({reason}; {restart})"],
                "seconds": time.monotonic() - started, "restart_s": seconds}

    def _wait_first_reports(self, job_id: str) -> float | None:
        """Time of the last first report of the group's workers, None when a node failed or the
        trainer's ``report_timeout_s`` passed first."""
        deadline = time.monotonic() + self.trainer(job_id).report_timeout_s
        while time.monotonic() < deadline:
            record = self.read_job(job_id)
            workers = [n for n in record["nodes"].values() if n["role"] == "worker"]
            if any(n["state"] in FAILED_STATES for n in record["nodes"].values()):
                return None
            reports = self._trainer_reports(job_id, record)
            if all(reports[n["name"]]["reports"] > 0 or n["state"] == SUCCEEDED for n in workers):
                return time.time()
            time.sleep(max(self.poll_s, 0.2))
        return None

    def _relaunch_trainer_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any],
                               cpu: float | None, memory_mb: float | None) -> NodeStatus:
        """A failed trainer node: an ``allreduce`` group restarts as a whole (with the node's new
        resources for its whole role), a ``ps`` trainer's node alone. Several failed members of a
        group restart it once: a member the group's restart already replaced, with the resources
        asked for, is running again."""
        role = node["role"]
        config = Configuration(**record["config"])
        changes = {}
        if cpu is not None and cpu != getattr(config, f"{role}_cpu"):
            changes[f"{role}_cpu"] = cpu
        if memory_mb is not None and memory_mb > (getattr(config, f"{role}_memory_mb") or 0):
            changes[f"{role}_memory_mb"] = memory_mb
        config = dataclasses.replace(config, **changes)
        if self.trainer(job_id).kind == "allreduce":
            if changes or node.get("state") in FAILED_STATES:
                self._restart_group(job_id, record, config, f"{node['name']} relaunched")
        else:
            self._stop_node(job_id, record, node, replacing=True)
            node.update(cpu=getattr(config, f"{role}_cpu"), memory_mb=getattr(config, f"{role}_memory_mb") or None,
                        restarts=node.get("restarts", 0) + 1)
            record["config"] = config.to_row()
            record["events"].append({"time": time.time(), "node": node["name"], "event": "relaunch",
                                     "cpu": node["cpu"], "memory_mb": node["memory_mb"]})
            self._start_node(job_id, record, node)
            self._write(job_id, record)
        return next(s for s in self.status(job_id) if s.name == node["name"])

    # -- launch / adopt -----------------------------------------------------------------------------
    @exclusive
    def launch(self, spec: JobSpec, config: Configuration) -> str:
        """Start master, PS and workers for ``config`` — or adopt the job when it already runs (an
        Airflow retry never starts a second copy). What is left of a launch whose master died is
        removed first, and the new job resumes from its checkpoint (the master reloaded its state;
        ``/cluster`` restores the new, empty PS)."""
        job_id = spec.job_id
        self._keys.pop(job_id, None)  # an adopted job keeps its own key; a new one gets spec's
        resuming = self.exists(job_id)
        if resuming:
            record = self.read_job(job_id)
            adoptable = _group_alive(record) if record.get("trainer") else self._adoptable(record)
            if record.get("launched") and adoptable:  # a half-launched job is redone
                log.info("job %s already running: adopted", job_id)
                return job_id
            self._discard(job_id, record)
        record = {"job_id": job_id, "config": config.to_row(), "nodes": {}, "events": [], "resizes": 0,
                  "started": time.time()}
        if spec.trainer is not None:
            trainer = TrainerSpec.from_dict(spec.trainer)
            self._trainers[job_id] = trainer
            record.update(trainer=True, generation=0)
            self._create_job(spec, record)
            self._start_group(job_id, record, config)
            record["launched"] = True
            self._write(job_id, record)
            return job_id
        spec = prepare(spec, runs_here=self.runs_local_code)
        self._new_node(record, "master", "master", 0, T.MASTER_CPU, T.MASTER_MEMORY_MB)
        self._create_job(spec, record)
        self._wait_ready(job_id, record, ["master"])
        self._start_ps(job_id, record, config)
        for index in range(config.workers):
            self._add_worker(job_id, record, config, index)
        record["launched"] = True  # only now may a retry adopt the job
        self._write(job_id, record)
        return job_id

    def _start_ps(self, job_id: str, record: dict[str, Any], config: Configuration,
                  previous: dict[str, dict[str, Any]] | None = None) -> None:
        """Start ``config.ps`` PS (each in the place of the PS it replaces) and hand them to the master
        (``/cluster``: a new job's start at generation 0, any other's are restored)."""
        names = []
        for index in range(config.ps):
            name = f"ps-{index}"
            node = self._new_node(record, name, "ps", index, config.ps_cpu, config.ps_memory_mb, count=config.ps,
                                  previous=(previous or {}).get(name))
            self._start_node(job_id, record, node)
            names.append(name)
        self._write(job_id, record)
        self._wait_ready(job_id, record, names)
        self.master_call(job_id, "/cluster", {"ps": self._ps_addresses(job_id, record, names)})

    def _add_worker(self, job_id: str, record: dict[str, Any], config: Configuration, index: int) -> str:
        node = self._new_node(record, f"worker-{index}", "worker", index, config.worker_cpu, config.worker_memory_mb,
                              gpu=config.worker_gpu)
        self._start_node(job_id, record, node)
        return node["name"]

    # -- one node ------------------------------------------------------------------------------
    @exclusive
    def relaunch(self, job_id: str, node_name: str, cpu: float | None = None, memory_mb: float | None = None) -> NodeStatus:
        """Restart one node (optionally with new resources) and re-join it to the job. A node
        relaunched with more memory than its role's configuration raises the configuration's:
        the nodes of a role are alike, and a later resize must not shrink it back."""
        record = self.read_job(job_id)
        node = record["nodes"][node_name]
        if record.get("trainer"):
            return self._relaunch_trainer_node(job_id, record, node, cpu, memory_mb)
        self._stop_node(job_id, record, node, replacing=True)
        node["cpu"] = node["cpu"] if cpu is None else cpu
        node["memory_mb"] = node["memory_mb"] if memory_mb is None else memory_mb
        node["restarts"] = node.get("restarts", 0) + 1
        key = f"{node['role']}_memory_mb"
        if memory_mb is not None and key in record["config"] and memory_mb > (record["config"][key] or 0):
            record["config"][key] = memory_mb
        record["events"].append({"time": time.time(), "node": node_name, "event": "relaunch", "cpu": node["cpu"],
                                 "memory_mb": node["memory_mb"]})
        if node["role"] == "worker":
            self.master_call(job_id, "/node_lost", {"node": node_name})
        self._start_node(job_id, record, node)
        self._write(job_id, record)
        if node["role"] in ("master", "ps"):
            self._wait_ready(job_id, record, [node_name])
        if node["role"] == "ps":
            self.master_call(job_id, "/restore", {})  # roll every PS back to the last checkpoint
        return next(s for s in self.status(job_id) if s.name == node_name)

    @exclusive
    def set_limits(self, job_id: str, node_name: str, cpu: float | None = None, memory_mb: float | None = None) -> str:
        """New CPU / memory for one node: in place where the backend can and its torch threads do
        not change (a PS is one thread: always), else a relaunch. Returns what was done."""
        record = self._record(job_id)
        node = record["nodes"][node_name]
        cpu = node["cpu"] if cpu is None else cpu
        memory_mb = node["memory_mb"] if memory_mb is None else memory_mb
        if self._in_place(node["role"], node["cpu"], cpu):
            node.update(cpu=cpu, memory_mb=memory_mb)
            self._set_limits(job_id, node)
            self._write(job_id, record)
            return f"{node_name} set to {cpu:g} CPU / {memory_mb or 0:g} MB in place"
        self.relaunch(job_id, node_name, cpu=cpu, memory_mb=memory_mb)
        return f"{node_name} relaunched with {cpu:g} CPU / {memory_mb or 0:g} MB"

    def _in_place(self, role: str, cpu_before: float | None, cpu_after: float | None) -> bool:
        return self.can_resize_in_place() and (role == "ps" or torch_threads(cpu_before) == torch_threads(cpu_after))

    def _wait_exit(self, job_id: str, record: dict[str, Any], node: dict[str, Any],
                   timeout_s: float = T.DRAIN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while self._node_state(job_id, record, node["name"]) == RUNNING:
            if time.monotonic() > deadline:
                log.warning("%s did not exit %.0f s after /drain: stopping it", node["name"], timeout_s)
                return
            time.sleep(self.poll_s)

    def _leave(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> None:
        """A worker leaves the job: drained when it runs, its shards requeued when it does not."""
        if self._node_state(job_id, record, node["name"]) == RUNNING:
            self.master_call(job_id, "/drain", {"node": node["name"]})
            self._wait_exit(job_id, record, node)
        else:
            self.master_call(job_id, "/node_lost", {"node": node["name"]})
        self._stop_node(job_id, record, node, replacing=False)
        node["state"] = STOPPED

    # -- the whole job ---------------------------------------------------------------------------
    @exclusive
    def resize(self, job_id: str, config: Configuration, remove: Iterable[str] = ()) -> dict[str, Any]:
        """Change the job to ``config`` (see the module docstring); ``remove``: workers that leave
        first. Returns the actions taken and the seconds they took."""
        record = self.read_job(job_id)
        if record.get("trainer"):
            return self._restart_group(job_id, record, config, "resize")
        current = Configuration(**record["config"])
        started = time.monotonic()
        actions = []
        ps_nodes = {n: node for n, node in record["nodes"].items() if node["role"] == "ps"}
        ps_resources = (config.ps_cpu, config.ps_memory_mb) != (current.ps_cpu, current.ps_memory_mb)
        if config.ps == current.ps and ps_resources and self._in_place("ps", current.ps_cpu, config.ps_cpu):
            for node in ps_nodes.values():
                node.update(cpu=config.ps_cpu, memory_mb=config.ps_memory_mb or None)
                self._set_limits(job_id, node)
            actions.append(f"ps resized in place to {config.ps_cpu:g} CPU / {config.ps_memory_mb:g} MB")
        elif config.ps != current.ps or ps_resources:
            self.master_call(job_id, "/checkpoint", {"hold": True})
            for name, node in ps_nodes.items():
                self._stop_node(job_id, record, node, replacing=False)
                del record["nodes"][name]
            self._start_ps(job_id, record, config, previous=ps_nodes)
            actions.append(f"ps {current.ps}×{current.ps_cpu:g} → {config.ps}×{config.ps_cpu:g} "
                           "(checkpoint, re-partition)")
        workers = sorted((n for n in record["nodes"].values() if n["role"] == "worker" and n.get("state") != STOPPED),
                         key=lambda n: n["index"])
        remove = set(remove)
        staying = [n for n in workers if n["name"] not in remove]
        leaving = [n for n in workers if n["name"] in remove] + staying[config.workers:]
        staying = staying[: config.workers]
        worker_resources = ((config.worker_cpu, config.worker_memory_mb, config.worker_gpu)
                            != (current.worker_cpu, current.worker_memory_mb, current.worker_gpu))
        if worker_resources and config.worker_gpu == current.worker_gpu and self._in_place(
                "worker", current.worker_cpu, config.worker_cpu):
            for node in staying:
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None)
                self._set_limits(job_id, node)
            actions.append(f"workers resized in place to {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        elif worker_resources:
            for node in staying:
                self.master_call(job_id, "/drain", {"node": node["name"]})
                self._wait_exit(job_id, record, node)
                self._stop_node(job_id, record, node, replacing=True)
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None, gpu=config.worker_gpu,
                            restarts=node.get("restarts", 0) + 1)
                self._start_node(job_id, record, node)
            actions.append(f"workers relaunched with {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        for node in leaving:
            self._leave(job_id, record, node)
            actions.append(f"{node['name']} removed")
        next_index = max((n["index"] for n in record["nodes"].values() if n["role"] == "worker"), default=-1) + 1
        for offset in range(config.workers - len(staying)):
            actions.append(f"{self._add_worker(job_id, record, config, next_index + offset)} added")
        record["config"] = config.to_row()
        record["resizes"] = record.get("resizes", 0) + 1
        record["events"].append({"time": time.time(), "event": "resize", "actions": actions})
        self._write(job_id, record)
        return {"actions": actions, "seconds": time.monotonic() - started}

    # -- the controller's actions --------------------------------------------------------------
    def apply(self, job_id: str, actions: Iterable[Any]) -> list[dict[str, Any]]:
        """Carry out ``controller.step``'s actions, in order; one record per action that changes
        the job (``Keep`` and ``Fail`` are the caller's to record): the action's record plus
        ``done`` (what the launcher did) and ``seconds``."""
        from airflow_dlrover.optimizer.controller import Heal, Relaunch, Resize

        records = []
        for action in actions:
            started = time.monotonic()
            if isinstance(action, Resize):
                done = self.resize(job_id, action.config, remove=action.remove)["actions"]
            elif isinstance(action, Heal):
                done = [self.set_limits(job_id, action.node, cpu=action.cpu, memory_mb=action.memory_mb)]
            elif isinstance(action, Relaunch):
                self.relaunch(job_id, action.node, cpu=action.cpu, memory_mb=action.memory_mb)
                done = [f"{action.node} relaunched"]
            else:
                continue
            records.append({**action.to_record(), "done": done, "seconds": time.monotonic() - started})
        return records


def _group_alive(record: dict[str, Any]) -> bool:
    """Whether a trainer's group still runs (or finished): a retry adopts it."""
    states = [n.get("state") for n in record["nodes"].values() if n.get("state") != STOPPED]
    return bool(states) and all(s in (RUNNING, SUCCEEDED) for s in states)


def with_live_states(record: dict[str, Any], states: dict[str, tuple]) -> dict[str, Any]:
    """The record with each node's ``(state, exit code, reason, OOM kills, start time)`` written in."""
    for name, (state, code, reason, ooms, started) in states.items():
        record["nodes"][name].update(state=state, exit_code=code, reason=reason, oom_kills=ooms, started=started)
    return record


def statuses(record: dict[str, Any]) -> list[NodeStatus]:
    """The ``NodeStatus`` of every node of a record read with its live states."""
    return [NodeStatus(n["name"], n["role"], n["index"], NodeState(n.get("state") or STOPPED), n["cpu"],
                       n["memory_mb"], n.get("restarts", 0), n.get("exit_code"), n.get("reason", ""),
                       n.get("oom_kills", 0))
            for n in record["nodes"].values()]
