"""What differs between the kinds of job one launcher runs: a strategy per job (:class:`JobKind`),
chosen once from its spec (:func:`job_kind`) and written over the launcher's primitives.

* :class:`RuntimeJob`: our elastic PS runtime — a master, PS and workers that report through the
  master's HTTP API; a resize changes nodes in place, adds and drains workers, relaunches the PS.
* :class:`TrainerJob`: a trainer of the user's (``spec.trainer``, :mod:`launchers.contract`) —
  no master; its nodes report through a metrics file, log lines or a Prometheus endpoint; a resize
  restarts the whole group. :class:`AllreduceTrainerJob`: a failed node restarts the group too.

The launcher's public operations take the job's lock, read its record and hand what differs to
the job's kind; a kind never takes the lock itself.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import TYPE_CHECKING, Any, Iterable

from airflow_dlrover import timings as T
from airflow_dlrover.launchers.contract import (
    ITERATION_FIELDS, TrainerSpec, job_progress, node_argv, node_env, node_report, parse_reports,
)
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import FAILED_STATES, Configuration, NodeState
from airflow_dlrover.runtime.auth import MasterRejected
from airflow_dlrover.runtime.prepare import prepare
from airflow_dlrover.runtime.spec import JobSpec

if TYPE_CHECKING:
    from airflow_dlrover.launchers.base import Launcher

log = logging.getLogger(__name__)

RUNNING, SUCCEEDED, FAILED, STOPPED = NodeState.RUNNING, NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED
#: how much of a failed node's output its failure shows (a Python traceback's last frames)
OUTPUT_TAIL_CHARS = 1500
__all__ = ["AllreduceTrainerJob", "JobKind", "RuntimeJob", "TrainerJob", "job_kind"]


def job_kind(launcher: Launcher, job_id: str, trainer: dict[str, Any] | None) -> JobKind:
    """The kind of a job whose spec names ``trainer`` (``JobSpec.trainer``; None: our runtime)."""
    if not trainer:
        return RuntimeJob(launcher, job_id)
    spec = TrainerSpec.from_dict(trainer)
    return (AllreduceTrainerJob if spec.kind == "allreduce" else TrainerJob)(launcher, job_id, spec)


class JobKind:
    """What a job of one kind does over its launcher's primitives (one object per job and launcher).

    ``record`` arguments are the job's record as the launcher's operation read it (with live states
    where it read them); a kind changes it in place and writes it through the launcher."""

    #: the user's trainer; None for our runtime
    trainer: TrainerSpec | None = None

    def __init__(self, launcher: Launcher, job_id: str) -> None:
        self.launcher, self.job_id = launcher, job_id

    # -- nodes ---------------------------------------------------------------------------------
    def create(self, spec: JobSpec, record: dict[str, Any], config: Configuration) -> None:
        """Create the job's objects and start its nodes for ``config``, on a new record."""
        raise NotImplementedError

    def adoptable(self, record: dict[str, Any]) -> bool:
        """Whether the record of a job launched to the end describes a running job that a retry adopts."""
        raise NotImplementedError

    def adopted(self, record: dict[str, Any]) -> None:
        """Finish, on adoption, what a launcher that died mid-operation began (nothing by default)."""

    def ports(self, role: str) -> tuple[str, ...]:
        """The node fields naming the ports a node of ``role`` listens on (a backend whose nodes share
        one host gives each its own)."""
        raise NotImplementedError

    def start_node(self, record: dict[str, Any], node: dict[str, Any]) -> None:
        """Start the node (placed by ``Launcher._new_node``)."""
        raise NotImplementedError

    def _renew(self, record: dict[str, Any], node: dict[str, Any], cpu: float, memory_mb: float | None, *,
               replacing: bool) -> None:
        """Stop the node and record its next incarnation: ``cpu`` / ``memory_mb``, one restart more,
        a ``relaunch`` event. The caller starts it."""
        self.launcher._stop_node(self.job_id, record, node, replacing=replacing)
        node.update(cpu=cpu, memory_mb=memory_mb, restarts=node.get("restarts", 0) + 1)
        record["events"].append({"time": time.time(), "node": node["name"], "event": "relaunch", "cpu": cpu,
                                 "memory_mb": memory_mb})

    # -- reports -------------------------------------------------------------------------------
    def reporters(self, record: dict[str, Any]) -> list[str]:
        """The workers whose reports make the job's rate and progress: every one of the job (not
        one that left it)."""
        return [name for name, node in record["nodes"].items()
                if node["role"] == "worker" and node.get("state") != STOPPED]

    def check_reports(self, record: dict[str, Any]) -> None:
        """Mark the nodes whose reports break their kind's rules as failed (``read_job``)."""
        raise NotImplementedError

    def job_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        """The job's ``throughput``, per-node ``nodes`` and ``status`` (``Launcher.metrics`` adds the usage)."""
        raise NotImplementedError

    def progress(self, timeout: float) -> dict[str, Any]:
        """The job's ``state``, ``samples_done``, ``samples_total`` and ``throughput``."""
        raise NotImplementedError

    def restart_cost_s(self) -> float | None:
        """What a resize costs the job in seconds; None: the controller's costs by kind of change."""
        raise NotImplementedError

    # -- changes -------------------------------------------------------------------------------
    def relaunch(self, record: dict[str, Any], node: dict[str, Any], cpu: float | None,
                 memory_mb: float | None) -> None:
        """Restart one node (``Launcher.relaunch``), optionally with new resources."""
        raise NotImplementedError

    def resize(self, record: dict[str, Any], config: Configuration, remove: Iterable[str]) -> dict[str, Any]:
        """Change the job to ``config`` (``Launcher.resize``); returns ``actions`` and ``seconds``."""
        raise NotImplementedError


class RuntimeJob(JobKind):
    """Our elastic PS runtime. The protocol with the job's master is the same on every backend:

    * workers join as new nodes and leave by ``/drain`` (finish the shard, then exit) — a node that
      is not running leaves by ``/node_lost`` (its shards are requeued);
    * a new PS count is ``/checkpoint {hold}`` → new PS → ``/cluster`` (which restores the new set
      from that checkpoint: the re-partition); while a PS is down no checkpoint can be taken (the
      master would wait on it), so the new set is restored from the last one;
    * a relaunched worker's shards are requeued (``/node_lost``), a relaunched PS rolls the job back
      to its last checkpoint (``/restore``), a relaunched master reloads its persisted state;
    * a node's new CPU / memory is applied in place where the backend can and the node keeps its
      number of torch threads (``torch_threads``; a PS is one numpy thread), else the node is
      relaunched.
    """

    def create(self, spec: JobSpec, record: dict[str, Any], config: Configuration) -> None:
        """Start the master, then the PS, then the workers; the job resumes from its checkpoint
        where one is left (the master reloads its state; ``/cluster`` restores the new, empty PS)."""
        launcher = self.launcher
        spec = prepare(spec, runs_here=launcher.runs_local_code)
        launcher._new_node(record, "master", "master", 0, T.MASTER_CPU, T.MASTER_MEMORY_MB)
        launcher._create_job(spec, record)
        launcher._wait_ready(self.job_id, record, ["master"])
        self._start_ps(record, config)
        for index in range(config.workers):
            self._add_worker(record, config, index)

    def adoptable(self, record: dict[str, Any]) -> bool:
        return self.launcher._adoptable(record)

    def adopted(self, record: dict[str, Any]) -> None:
        """A PS change whose launcher died after the new PS started, before ``/cluster`` (the master
        holds, with the old set): hand the master the PS set the record holds, which restores it; one
        whose launcher died before it changed the record (the master holds, with the record's set):
        ``/restore`` on that set. (A relaunched PS whose ``/restore`` never came, the master restores
        itself: ``master.serve``.)"""
        launcher, job_id = self.launcher, self.job_id
        names = sorted((n for n, node in record["nodes"].items() if node["role"] == "ps"),
                       key=lambda n: record["nodes"][n]["index"])
        if not names:
            return
        launcher._wait_ready(job_id, record, names)
        addresses = launcher._ps_addresses(job_id, record, names)
        status = launcher.master_call(job_id, "/status")
        if status["ps"] != addresses:
            log.warning("job %s: its master serves another PS set than its record's: handing it %s", job_id, addresses)
            launcher.master_call(job_id, "/cluster", {"ps": addresses})
        elif status.get("held"):
            log.warning("job %s: its master holds for a PS change that never came: restoring it on its PS", job_id)
            launcher.master_call(job_id, "/restore", {})

    def ports(self, role: str) -> tuple[str, ...]:
        return () if role == "worker" else ("port",)  # a worker only connects

    def start_node(self, record: dict[str, Any], node: dict[str, Any]) -> None:
        self.launcher._start_node(self.job_id, record, node)

    def _start_ps(self, record: dict[str, Any], config: Configuration,
                  previous: dict[str, dict[str, Any]] | None = None) -> None:
        """Start ``config.ps`` PS (each in the place of the PS it replaces) and hand them to the master
        (``/cluster``: a new job's start at generation 0, any other's are restored)."""
        launcher, job_id = self.launcher, self.job_id
        names = []
        for index in range(config.ps):
            name = f"ps-{index}"
            node = launcher._new_node(record, name, "ps", index, config.ps_cpu, config.ps_memory_mb, count=config.ps,
                                      previous=(previous or {}).get(name))
            self.start_node(record, node)
            names.append(name)
        launcher._write(job_id, record)
        launcher._wait_ready(job_id, record, names)
        launcher.master_call(job_id, "/cluster", {"ps": launcher._ps_addresses(job_id, record, names)})

    def _add_worker(self, record: dict[str, Any], config: Configuration, index: int) -> str:
        node = self.launcher._new_node(record, f"worker-{index}", "worker", index, config.worker_cpu,
                                       config.worker_memory_mb, gpu=config.worker_gpu)
        self.start_node(record, node)
        return node["name"]

    def _wait_exit(self, record: dict[str, Any], node: dict[str, Any], timeout_s: float = T.DRAIN_TIMEOUT_S) -> None:
        launcher = self.launcher
        deadline = time.monotonic() + timeout_s
        while launcher._node_state(self.job_id, record, node["name"]) == RUNNING:
            if time.monotonic() > deadline:
                log.warning("%s did not exit %.0f s after /drain: stopping it", node["name"], timeout_s)
                return
            time.sleep(launcher.poll_s)

    def _leave(self, record: dict[str, Any], node: dict[str, Any]) -> None:
        """A worker leaves the job: drained when it runs, its shards requeued when it does not."""
        launcher, job_id = self.launcher, self.job_id
        if launcher._node_state(job_id, record, node["name"]) == RUNNING:
            launcher.master_call(job_id, "/drain", {"node": node["name"]})
            self._wait_exit(record, node)
        else:
            launcher.master_call(job_id, "/node_lost", {"node": node["name"]})
        launcher._stop_node(job_id, record, node, replacing=False)
        node["state"] = STOPPED

    def check_reports(self, record: dict[str, Any]) -> None:
        """Nothing to check: the nodes report to the master, which keeps the job consistent."""

    def job_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        """The master's ``/metrics`` (an unreachable master: none)."""
        try:
            return self.launcher.master_call(self.job_id, "/metrics", timeout=T.MASTER_POLL_TIMEOUT_S)
        except ConnectionError:
            return {"throughput": 0.0, "nodes": {}, "status": None}

    def progress(self, timeout: float) -> dict[str, Any]:
        """The master's ``/status`` (``timeout``: how long an unreachable master is retried)."""
        return self.launcher.master_call(self.job_id, "/status", timeout=timeout)

    def restart_cost_s(self) -> float | None:
        return None

    def relaunch(self, record: dict[str, Any], node: dict[str, Any], cpu: float | None,
                 memory_mb: float | None) -> None:
        """Restart the node and re-join it to the job (see the class docstring). A node relaunched
        with more memory than its role's configuration raises the configuration's: the nodes of a
        role are alike, and a later resize must not shrink it back."""
        launcher, job_id, name, role = self.launcher, self.job_id, node["name"], node["role"]
        key = f"{role}_memory_mb"
        if memory_mb is not None and key in record["config"] and memory_mb > (record["config"][key] or 0):
            record["config"][key] = memory_mb
        self._renew(record, node, node["cpu"] if cpu is None else cpu,
                    node["memory_mb"] if memory_mb is None else memory_mb, replacing=True)
        if role == "worker":
            launcher.master_call(job_id, "/node_lost", {"node": name})
        self.start_node(record, node)
        launcher._write(job_id, record)
        if role in ("master", "ps"):
            launcher._wait_ready(job_id, record, [name])
        if role == "ps":
            launcher.master_call(job_id, "/restore", {})  # roll every PS back to the last checkpoint

    def resize(self, record: dict[str, Any], config: Configuration, remove: Iterable[str]) -> dict[str, Any]:
        """PS: in place, else ``/checkpoint`` → new PS → ``/cluster``; workers: in place, else each
        drained and relaunched; ``remove`` and any beyond ``config.workers`` leave, new ones join."""
        launcher, job_id = self.launcher, self.job_id
        current = Configuration(**record["config"])
        started = time.monotonic()
        actions = []
        ps_nodes = {n: node for n, node in record["nodes"].items() if node["role"] == "ps"}
        ps_resources = (config.ps_cpu, config.ps_memory_mb) != (current.ps_cpu, current.ps_memory_mb)
        if config.ps == current.ps and ps_resources and launcher._in_place("ps", current.ps_cpu, config.ps_cpu):
            for node in ps_nodes.values():
                node.update(cpu=config.ps_cpu, memory_mb=config.ps_memory_mb or None)
                launcher._set_limits(job_id, node)
            actions.append(f"ps resized in place to {config.ps_cpu:g} CPU / {config.ps_memory_mb:g} MB")
        elif config.ps != current.ps or ps_resources:
            def ps_up() -> bool:
                return all(launcher._node_state(job_id, record, name) == RUNNING for name in ps_nodes)

            if ps_up():
                try:
                    launcher.master_call(job_id, "/checkpoint", {"hold": True})
                except (ConnectionError, MasterRejected):  # a PS went down meanwhile: the last checkpoint it is
                    if ps_up():
                        raise
            for name, node in ps_nodes.items():
                launcher._stop_node(job_id, record, node, replacing=False)
                del record["nodes"][name]
            self._start_ps(record, config, previous=ps_nodes)
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
        if worker_resources and config.worker_gpu == current.worker_gpu and launcher._in_place(
                "worker", current.worker_cpu, config.worker_cpu):
            for node in staying:
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None)
                launcher._set_limits(job_id, node)
            actions.append(f"workers resized in place to {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        elif worker_resources:
            for node in staying:
                launcher.master_call(job_id, "/drain", {"node": node["name"]})
                self._wait_exit(record, node)
                launcher._stop_node(job_id, record, node, replacing=True)
                node.update(cpu=config.worker_cpu, memory_mb=config.worker_memory_mb or None, gpu=config.worker_gpu,
                            restarts=node.get("restarts", 0) + 1)
                self.start_node(record, node)
            actions.append(f"workers relaunched with {config.worker_cpu:g} CPU / {config.worker_memory_mb:g} MB")
        for node in leaving:
            self._leave(record, node)
            actions.append(f"{node['name']} removed")
        next_index = max((n["index"] for n in record["nodes"].values() if n["role"] == "worker"), default=-1) + 1
        for offset in range(config.workers - len(staying)):
            actions.append(f"{self._add_worker(record, config, next_index + offset)} added")
        record["config"] = config.to_row()
        record["resizes"] = record.get("resizes", 0) + 1
        record["events"].append({"time": time.time(), "event": "resize", "actions": actions})
        launcher._write(job_id, record)
        return {"actions": actions, "seconds": time.monotonic() - started}


def _with_kept_progress(status: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A trainer job's ``status`` (:func:`contract.job_progress`) with the progress its earlier
    incarnations reported (``TrainerJob._keep_progress``), where that is further."""
    kept = record.get("progress") or {}
    return {**status, "samples_done": max(status["samples_done"], kept.get("samples_done", 0)),
            "samples_total": status["samples_total"] or kept.get("samples_total")}


class TrainerJob(JobKind):
    """A trainer of the user's (a ``ps`` trainer; :class:`AllreduceTrainerJob` for ``allreduce``).

    It has no master: its nodes get the contract's argv and environment (:meth:`node_command`) and
    report through their metrics file, log or endpoint (the backend's ``_read_output``). A resize
    restarts the group (SIGTERM → the trainer checkpoints → the new configuration starts and
    resumes), timed from the SIGTERM to the first report of the new group; a failed node restarts
    alone. A node that exits non-zero before its first report, or reports nothing within
    ``report_timeout_s``, broke the contract: it reads as exit code ``USER_ERROR_EXIT_CODE`` (no
    retry fixes it). A node that SIGKILL ended (``SIGKILL_EXIT_CODES``) failed by the cluster's
    doing, before its first report too.
    """

    def __init__(self, launcher: Launcher, job_id: str, trainer: TrainerSpec) -> None:
        super().__init__(launcher, job_id)
        self.trainer = trainer

    # -- nodes ---------------------------------------------------------------------------------
    def create(self, spec: JobSpec, record: dict[str, Any], config: Configuration) -> None:
        record.update(trainer=True, generation=0)
        self.launcher._create_trainer_job(spec, record)
        self._start_group(record, config)

    def adoptable(self, record: dict[str, Any]) -> bool:
        """Whether the group still runs (or finished)."""
        states = [n.get("state") for n in record["nodes"].values() if n.get("state") != STOPPED]
        return bool(states) and all(s in (RUNNING, SUCCEEDED) for s in states)

    def ports(self, role: str) -> tuple[str, ...]:
        """Every node listens (its ``TF_CONFIG`` entry), and serves its reports where they are scraped."""
        return ("port", "metrics_port") if self.trainer.metrics_port else ("port",)

    def start_node(self, record: dict[str, Any], node: dict[str, Any]) -> None:
        argv, env = self.node_command(record, node)
        self.launcher._start_trainer_node(self.job_id, record, node, argv, env)

    def node_command(self, record: dict[str, Any], node: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The argv and contract environment of a node."""
        launcher, job_id, trainer = self.launcher, self.job_id, self.trainer
        spec = launcher.spec(job_id)
        peers = {name: launcher._peer_address(job_id, record, other) for name, other in record["nodes"].items()}
        env = node_env(job_id=job_id, trainer=trainer, config=Configuration(**record["config"]), node=node,
                       samples=spec.samples, peers=peers, rendezvous=tuple(record["rendezvous"]),
                       checkpoint_dir=trainer.checkpoint_dir or launcher._checkpoint_dir(job_id),
                       metrics_file=launcher._metrics_file(job_id, node), generation=record["generation"],
                       job_key=spec.authkey, metrics_port=launcher._metrics_port(job_id, node))
        return node_argv(trainer, env), env

    def _start_group(self, record: dict[str, Any], config: Configuration,
                     restarts: dict[str, int] | None = None) -> None:
        """Place every node of ``config`` (PS, then workers), then start them: each gets its peers'
        addresses."""
        launcher = self.launcher
        nodes = [launcher._new_node(record, f"ps-{i}", "ps", i, config.ps_cpu, config.ps_memory_mb, count=config.ps)
                 for i in range(config.ps)]
        nodes += [launcher._new_node(record, f"worker-{i}", "worker", i, config.worker_cpu, config.worker_memory_mb,
                                     gpu=config.worker_gpu) for i in range(config.workers)]
        for node in nodes:
            node.update(grace_s=self.trainer.grace_s, restarts=(restarts or {}).get(node["name"], 0))
        record["rendezvous"] = list(launcher._rendezvous(self.job_id, record))
        for node in nodes:
            self.start_node(record, node)
        launcher._write(self.job_id, record)

    def _stop_group(self, record: dict[str, Any]) -> dict[str, int]:
        """SIGTERM every node (the trainer checkpoints in its grace period); returns the restart
        count each node's next incarnation gets."""
        self.launcher._stop_nodes(self.job_id, record,
                                  [n for n in record["nodes"].values() if n.get("state") != STOPPED])
        return {name: node.get("restarts", 0) + 1 for name, node in record["nodes"].items()}

    def _restart_group(self, record: dict[str, Any], config: Configuration, reason: str) -> dict[str, Any]:
        """Stop the group and start it on ``config`` (it resumes from its checkpoint); returns the
        actions and the seconds from the SIGTERM to the first report of every new worker (None when
        one did not report within ``report_timeout_s``: the guard sees why)."""
        started, stamp = time.monotonic(), time.time()
        current = record["config"]
        self._keep_progress(record)
        restarts = self._stop_group(record)
        stopped_s = time.monotonic() - started
        record["nodes"] = {}
        record["config"] = config.to_row()
        record["generation"] = record.get("generation", 0) + 1
        self._start_group(record, config, restarts)
        reported = self.wait_first_reports()
        seconds = None if reported is None else reported - stamp
        event = {"time": stamp, "event": "restart", "reason": reason, "generation": record["generation"],
                 "from": current, "to": config.to_row(), "stop_s": stopped_s, "restart_s": seconds}
        record["events"].append(event)
        if reason == "resize":
            record["resizes"] = record.get("resizes", 0) + 1
        self.launcher._write(self.job_id, record)
        restart = "trainer did not report again" if seconds is None else f"training again after {seconds:.1f} s"
        return {"actions": [f"group restarted on {config.describe()} ({reason}; {restart})"],
                "seconds": time.monotonic() - started, "restart_s": seconds}

    def wait_first_reports(self) -> float | None:
        """Time of the last first report of the group's workers that report (:meth:`reporters`),
        None when a node failed or the trainer's ``report_timeout_s`` passed first."""
        launcher = self.launcher
        deadline = time.monotonic() + self.trainer.report_timeout_s
        while time.monotonic() < deadline:
            record = launcher.read_job(self.job_id)
            reporting = set(self.reporters(record))
            workers = [n for n in record["nodes"].values() if n["name"] in reporting]
            if any(n["state"] in FAILED_STATES for n in record["nodes"].values()):
                return None
            reports = self._reports(record)
            if all(reports[n["name"]]["reports"] > 0 or n["state"] == SUCCEEDED for n in workers):
                return time.time()
            time.sleep(max(launcher.poll_s, 0.2))
        return None

    # -- reports -------------------------------------------------------------------------------
    def node_report(self, node: dict[str, Any]) -> dict[str, Any]:
        """A node's reports since its start (:func:`contract.node_report`), from its metrics file, its
        log (``log_regex``) or its endpoint's scrapes (``metrics_port``)."""
        text, mtime = self.launcher._read_output(self.job_id, node, self.trainer.reports_via)
        return node_report(parse_reports(text, self.trainer.log_regex, written_at=mtime,
                                         per_iteration=self._per_iteration()))

    def _keep_progress(self, record: dict[str, Any]) -> None:
        """Keep the job's progress so far in the record (``progress``) before nodes restart: a new
        incarnation's reports start afresh, and one that resumes with nothing left reports nothing."""
        status = _with_kept_progress(job_progress(self._reports(record), {}), record)
        record["progress"] = {key: status[key] for key in ("samples_done", "samples_total")}

    def _finished_before(self, record: dict[str, Any]) -> bool:
        """Whether an earlier incarnation reported every sample trained (:meth:`_keep_progress`)."""
        kept = record.get("progress") or {}
        return bool(kept.get("samples_total")) and kept["samples_done"] >= kept["samples_total"]

    def _per_iteration(self) -> tuple[float, float] | None:
        """(samples the job trains an iteration, samples a reporting node's rate stands for): the
        job's batch × workers; rank 0 reports the job's rate, every node its own batch. None where
        the log gives no iterations (``contract.ITERATION_FIELDS``)."""
        if not any(f"(?P<{field}>" in self.trainer.log_regex for field in ITERATION_FIELDS):
            return None
        config = Configuration(**self.launcher._record(self.job_id)["config"])
        job = float(config.batch_size * config.workers)
        return job, job if self.trainer.reports_from == "rank0" else float(config.batch_size)

    def _reports(self, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each running or finished node's report, with its ``role``."""
        return {name: {**self.node_report(node), "role": node["role"]}
                for name, node in record["nodes"].items() if node.get("state") != STOPPED}

    def reporters(self, record: dict[str, Any]) -> list[str]:
        """The workers that report: every one, or ``worker-0`` alone for a rank-0 trainer."""
        active = super().reporters(record)
        return [w for w in active if w == "worker-0"] if self.trainer.reports_from == "rank0" else active

    def check_reports(self, record: dict[str, Any]) -> None:
        """Mark the workers that broke the contract (class docstring) as the user's failures; a
        rank of a rank-0 trainer other than 0 owes no report (its crash is a failure like any)."""
        trainer = self.trainer
        now = time.time()
        reporters = set(self.reporters(record))
        for name, node in record["nodes"].items():
            if node["role"] != "worker" or node.get("state") not in (RUNNING, FAILED, SUCCEEDED):
                continue
            if node["state"] == FAILED and node.get("exit_code") in (C.USER_ERROR_EXIT_CODE, *C.SIGKILL_EXIT_CODES):
                continue
            if node["state"] == SUCCEEDED and self._finished_before(record):
                continue  # it resumed with nothing left to train
            if name not in reporters or self.node_report(node)["reports"]:
                if node["state"] == FAILED:  # a crash after it reported: its traceback says why
                    output, _ = self.launcher._read_output(self.job_id, node, "log")
                    node["reason"] = f"{node.get('reason') or 'failed'}; output tail:\n{output[-OUTPUT_TAIL_CHARS:]}"
                continue
            source = {"log": f"log lines matching {trainer.log_regex!r}", "file": "DLROVER_METRICS_FILE",
                      "prometheus": f"Prometheus text on port {trainer.metrics_port}{trainer.metrics_path}",
                      }[trainer.reports_via]
            if node["state"] in (FAILED, SUCCEEDED):
                output, _ = self.launcher._read_output(self.job_id, node, "log")
                what = ("exited 0 without a report" if node["state"] == SUCCEEDED
                        else f"{node.get('reason') or 'failed'} before its first report")
                why = f"{what} (in {source}); output tail:\n{output[-OUTPUT_TAIL_CHARS:]}"
            elif now - (node.get("started") or now) > trainer.report_timeout_s:
                why = f"reported nothing (in {source}) in report_timeout_s={trainer.report_timeout_s:g}s"
            else:
                continue
            node.update(state=FAILED, exit_code=C.USER_ERROR_EXIT_CODE, reason=f"trainer {name} {why}")

    def job_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        """The nodes' reports in the master's ``/metrics`` shape: per-node reports, the job's
        throughput and progress (:func:`contract.job_progress`)."""
        record = self.launcher.read_job(self.job_id)
        reports = self._reports(record)
        states = {name: node["state"] for name, node in record["nodes"].items()}
        status = _with_kept_progress(job_progress(reports, states), record)
        return {"throughput": status["throughput"], "nodes": reports, "status": status}

    def progress(self, timeout: float) -> dict[str, Any]:
        return self.job_metrics(self.launcher._record(self.job_id))["status"]

    def restart_cost_s(self) -> float | None:
        """Every resize restarts the group: the median of its measured group restarts (SIGTERM →
        first report of every new worker; profiling makes some), else ``TRAINER_RESTART_COST_S``."""
        measured = [e["restart_s"] for e in self.launcher._record(self.job_id)["events"]
                    if e.get("event") == "restart" and e.get("restart_s") is not None]
        return statistics.median(measured) if measured else C.TRAINER_RESTART_COST_S

    # -- changes -------------------------------------------------------------------------------
    def relaunch(self, record: dict[str, Any], node: dict[str, Any], cpu: float | None,
                 memory_mb: float | None) -> None:
        """The node's new resources become its whole role's (the nodes of a role are alike): a new
        CPU count, or more memory than the role has."""
        role = node["role"]
        config = Configuration(**record["config"])
        changes = {}
        if cpu is not None and cpu != getattr(config, f"{role}_cpu"):
            changes[f"{role}_cpu"] = cpu
        if memory_mb is not None and memory_mb > (getattr(config, f"{role}_memory_mb") or 0):
            changes[f"{role}_memory_mb"] = memory_mb
        self._relaunch_member(record, node, dataclasses.replace(config, **changes), bool(changes))

    def _relaunch_member(self, record: dict[str, Any], node: dict[str, Any], config: Configuration,
                         changed: bool) -> None:
        """Restart the node alone on its role's resources in ``config``."""
        role = node["role"]
        record["config"] = config.to_row()
        self._keep_progress(record)
        self._renew(record, node, getattr(config, f"{role}_cpu"), getattr(config, f"{role}_memory_mb") or None,
                    replacing=False)
        self.start_node(record, node)
        self.launcher._write(self.job_id, record)

    def resize(self, record: dict[str, Any], config: Configuration, remove: Iterable[str]) -> dict[str, Any]:
        """The group restarts on ``config`` (``remove`` needs nothing more: every node restarts)."""
        return self._restart_group(record, config, "resize")


class AllreduceTrainerJob(TrainerJob):
    """An ``allreduce`` trainer (``torch.distributed``, no PS): a failed member restarts the whole
    group, as torchrun's elastic agent does."""

    def _relaunch_member(self, record: dict[str, Any], node: dict[str, Any], config: Configuration,
                         changed: bool) -> None:
        """Several failed members of a group restart it once: a member the group's restart already
        replaced, with the resources asked for, is running again."""
        if changed or node.get("state") in FAILED_STATES:
            self._restart_group(record, config, f"{node['name']} relaunched")
