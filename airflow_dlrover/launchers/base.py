"""The one launcher: launch/adopt, resize, relaunch and the controller's actions (``apply``),
written once over the small primitives a backend implements (``LocalLauncher``: processes in
cgroups; ``KubernetesLauncher``: pods through the ``cncf-kubernetes`` hooks).

A job's *record* (``job.json``: configuration, nodes with their resources and restarts, events)
is kept by the backend (a file; a ConfigMap), so that any process adopts the job by its id.

What differs between our runtime and a user's trainer (how the nodes start, how they report, what
a resize or a relaunch does to them) is the job's kind (:mod:`launchers.kinds`), chosen once per
job from its spec (:meth:`Launcher.kind`); the operations here take the job's lock, read its
record and hand the rest to it.

What a backend implements (everything else is here or in the kinds): ``_record`` / ``_write`` (the
record), ``_live_states`` (each node's state from its process or pod), ``_place`` (a new node's
backend fields), ``_create_job`` / ``_create_trainer_job`` (the job's objects, and our runtime's
master), ``_start_node`` / ``_start_trainer_node``, ``_stop_node``, ``_set_limits`` (in place),
``can_resize_in_place``, ``_ps_addresses``, ``_adoptable``, ``_discard``, ``_master_url``,
``_peer_address``, ``_rendezvous``, ``_read_output``, ``_acquire`` / ``_release`` (the job's lock),
``job_dir``, ``spec``, ``stop``, ``kill_node``.

Every operation that changes the job (launch, relaunch, set_limits, resize, stop) holds the job's
lock from its read of the record to its last write: two launcher processes (the fine-tune resizing
while the guard relaunches a node) take turns instead of each writing back a record without the
other's change. The lock is reentrant within a process (a resize relaunches nodes).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from airflow_dlrover.launchers.contract import TrainerSpec
from airflow_dlrover.launchers.kinds import JobKind, job_kind
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.transitions import TransitionCosts, measured as measured_transitions, torch_threads
from airflow_dlrover.optimizer.types import FAILED_STATES, Configuration, NodeState, NodeStatus
from airflow_dlrover.runtime.auth import call_master
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


class Launcher:
    """See the module docstring. Subclasses implement the primitives; ``poll_s`` is theirs."""

    poll_s: float = T.LOCAL_POLL_S
    start_timeout_s: float = T.NODE_START_TIMEOUT_S
    #: the job's nodes run this process's Python and path: a user's model is checked at launch here
    runs_local_code: bool = False

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._kinds: dict[str, JobKind] = {}
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
        """Create our runtime's job objects and start its master (``record["nodes"]["master"]``)."""
        raise NotImplementedError

    def _create_trainer_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """Create the objects of a trainer's job (it has no master)."""
        raise NotImplementedError

    def _start_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> None:
        """Start one of our runtime's nodes."""
        raise NotImplementedError

    def _start_trainer_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], argv: list[str],
                            env: dict[str, str]) -> None:
        """Start a trainer's node: ``argv`` with the contract's environment ``env``."""
        raise NotImplementedError

    def _stop_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], *, replacing: bool) -> None:
        """Stop the node and wait until it is gone; ``replacing``: it starts again at once and resumes
        from the state its job's master keeps (no grace period; a master keeps its dependents)."""
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
        self.kind(job_id, record).check_reports(record)
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

    # -- the job's kind (launchers.kinds) --------------------------------------------------------
    def kind(self, job_id: str, record: dict[str, Any] | None = None) -> JobKind:
        """The job's kind, chosen from its spec (once per job and launcher). ``record``: the job's
        record where at hand; one without the trainer flag is our runtime's, without reading the spec."""
        if job_id not in self._kinds:
            trainer = None if record is not None and not record.get("trainer") else self.spec(job_id).trainer
            self._kinds[job_id] = job_kind(self, job_id, trainer)
        return self._kinds[job_id]

    def reporters(self, job_id: str, record: dict[str, Any]) -> list[str]:
        """The workers whose reports make the job's rate and progress (``JobKind.reporters``)."""
        return self.kind(job_id, record).reporters(record)

    def trainer(self, job_id: str) -> TrainerSpec | None:
        """The job's trainer, or None for our runtime."""
        return self.kind(job_id).trainer

    def progress(self, job_id: str, timeout: float = T.MASTER_CALL_TIMEOUT_S) -> dict[str, Any]:
        """The job's ``state``, ``samples_done``, ``samples_total`` and ``throughput``: its master's
        ``/status`` (our runtime; ``timeout``: how long an unreachable master is retried), or its
        trainer's reports (:func:`contract.job_progress`)."""
        return self.kind(job_id).progress(timeout)

    def restart_cost_s(self, job_id: str) -> float | None:
        """What a resize costs a trainer of the user's, which every resize restarts: the median of
        its measured group restarts (SIGTERM → first report of every new worker; profiling makes
        some), else ``TRAINER_RESTART_COST_S``. None for our runtime (the controller's costs by kind)."""
        return self.kind(job_id).restart_cost_s()

    def transition_costs(self) -> TransitionCosts:
        """What each transition of our runtime costs on this backend (``optimizer.transitions``)."""
        return measured_transitions()

    def _metrics_port(self, job_id: str, node: dict[str, Any]) -> int:
        """Where a trainer's node serves Prometheus text (0: it reports otherwise)."""
        return self.trainer(job_id).metrics_port

    def _metrics_file(self, job_id: str, node: dict[str, Any]) -> str:
        """Where a trainer's node writes its reports, as the node sees the path."""
        return str(self.job_dir(job_id) / "metrics" / f"{node['name']}.jsonl")

    def _checkpoint_dir(self, job_id: str) -> str:
        """A trainer's default checkpoint folder, as its nodes see the path (it outlives them)."""
        return str(self.job_dir(job_id) / "checkpoint")

    # -- launch / adopt -----------------------------------------------------------------------------
    @exclusive
    def launch(self, spec: JobSpec, config: Configuration) -> str:
        """Start the job's nodes for ``config`` (its kind's: master, PS and workers, or the trainer's
        group) — or adopt the job when it already runs (an Airflow retry never starts a second copy).
        What is left of a launch whose master died, or that failed half-way, is removed first, and
        the new job resumes from its checkpoint. An adopted job's kind finishes what a launcher that
        died mid-operation began (``JobKind.adopted``)."""
        job_id = spec.job_id
        self._keys.pop(job_id, None)  # an adopted job keeps its own key; a new one gets spec's
        if self.exists(job_id):
            record = self.read_job(job_id)
            kind = self.kind(job_id, record)
            if record.get("launched") and kind.adoptable(record):  # a half-launched job is redone
                log.info("job %s already running: adopted", job_id)
                kind.adopted(record)
                return job_id
            self._discard(job_id, record)
        kind = self._kinds[job_id] = job_kind(self, job_id, spec.trainer)
        record = {"job_id": job_id, "config": config.to_row(), "nodes": {}, "events": [], "resizes": 0,
                  "started": time.time()}
        kind.create(spec, record, config)
        record["launched"] = True  # only now may a retry adopt the job
        self._write(job_id, record)
        return job_id

    # -- one node ------------------------------------------------------------------------------
    @exclusive
    def relaunch(self, job_id: str, node_name: str, cpu: float | None = None,
                 memory_mb: float | None = None) -> NodeStatus:
        """Restart one node (optionally with new resources) as its job's kind does: re-joined to our
        runtime's job, or a trainer's (a whole ``allreduce`` group). Its new memory raises its role's
        configuration when more: the nodes of a role are alike, and a later resize must not shrink it."""
        record = self.read_job(job_id)
        self.kind(job_id, record).relaunch(record, record["nodes"][node_name], cpu, memory_mb)
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

    # -- the whole job ---------------------------------------------------------------------------
    @exclusive
    def resize(self, job_id: str, config: Configuration, remove: Iterable[str] = ()) -> dict[str, Any]:
        """Change the job to ``config`` as its kind does (``launchers.kinds``); ``remove``: workers
        that leave first. Returns the actions taken and the seconds they took."""
        record = self.read_job(job_id)
        return self.kind(job_id, record).resize(record, config, remove)

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
