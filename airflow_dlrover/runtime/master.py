"""The job master: dynamic data shards, checkpoints, restores, metrics, and a JSON/Prometheus API.

Shards move todo → doing (leased to a worker) → done, as in DLRover's dynamic data sharding: a
lease that expires, a worker reported lost, or a rollback returns the shard to todo. The master
persists its state (``master_state.json``, written atomically on every change) so that its own
restart loses nothing; time series go to an append-only ``metrics.jsonl``.

Checkpoints are consistent: the master stops handing out shards, waits until no shard is in
flight (every pushed update of a done shard is on the PS), has every PS save, then records the
done set with the PS files in a manifest. A restore (after a PS is lost, or to change the number
of PS) rolls *everything* back to the latest manifest — PS rows, dense parameters, the applied
batches and the done set — and bumps the generation so that stragglers of the old state are
refused. Samples trained after the checkpoint are trained again; samples before it are not.

What each state change survives (a node may die at any point of it):

* a lease is persisted when it is granted: a restarted master keeps every lease (with a fresh
  deadline), so the workers that hold them finish their shards and nobody else redoes them;
* a restore is written ahead: the rolled-back done set, the new generation and ``restoring`` are
  persisted before any PS is told, and a master that finds ``restoring`` set (it died half-way,
  or a PS was unreachable) restores again until every PS serves its generation;
* a new PS set (``/cluster``) is restored to the latest checkpoint in the same step, so no request
  and no checkpoint ever sees a new, empty PS under the old done set; ``/checkpoint {hold: true}``
  (a PS change follows) hands out no shard and takes no periodic checkpoint until that ``/cluster``
  or a ``/restore`` — or, when the launcher died, until ``HOLD_S`` passes and the master restores
  itself onto the PS it has;
* every requeue is appended to ``requeues.jsonl`` with its reason (``runtime.accounting``
  attributes duplicates to it).

What the master writes it can later verify (``runtime.integrity``): its state and each manifest
carry a CRC-32, and a manifest the SHA-256 of each PS file. A restore takes the newest checkpoint
that verifies, and falls back to an older one (down to the job's start) when a PS cannot read a
file of it. A state file that does not verify is not served: the master restores from the newest
checkpoint under a new generation (:meth:`Master._distrust`).

HTTP API (JSON bodies). Every request but ``GET /metrics/prometheus`` and ``GET /healthz`` must
carry a signature with the job's key (``runtime.auth``) and is refused with 401 otherwise. Those two
stay open because a Prometheus scraper and a kubelet's readiness probe hold no job's key, and they
only read throughput, shard counts and the generation, or "ok" — nothing that can change the job or
reveal its data. A request's length is checked against its route's limit (413) and its signed
header (401) before its body is read; connections, and the time a request may take to arrive, are
bounded (``MAX_CONNECTIONS``, ``READ_TIMEOUT_S``, ``REQUEST_READ_S``). A key holder's fields are
checked like a user's: 400 naming the field and what is allowed, and nothing persisted:
  GET  /status  /metrics  /metrics/prometheus  /healthz  /plan  /accounting
  POST /shard/next {worker, generation}        → {shard,start,stop,generation,ps} | {wait} | {exit} | {done}
                                                 | {finish, generation, ps}: evaluate and export (one worker)
                                                 | {fail}: the data is past its bad-row limit
  POST /shard/done {worker, shard, generation, bad_rows?, first_bad?}  POST /shard/abandon {worker, shard}
  POST /finish {worker, generation, loss, auc, samples, export?}  the job's result: its state is done
  POST /report {node, role, ...metrics}        → {command, report_interval_s}
  POST /report_interval {seconds}              how often the workers report from their next report on
  POST /cluster {ps: ["host:port", ...]}       POST /plan {...}
  POST /node_lost {node}  POST /drain {node}  POST /command {node, command}
  POST /checkpoint {hold?}                     POST /restore
  POST /faults {faults: [{kind, at_s, node}]}  fault injection for demos, due at_s after this call:
                                               the node's next report is answered with the command
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.accounting import JOURNAL_DIR, REQUEUES_FILE, read_journal, reconcile
from airflow_dlrover.runtime.auth import HEADER, Refused, Verifier
from airflow_dlrover.runtime.integrity import Damaged, seal, sha256_file, unseal
from airflow_dlrover.runtime.ps import DamagedCheckpoint
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, RemoteError, Unreachable, announce, parse_address

log = logging.getLogger(__name__)


class CheckpointUnavailable(Unreachable):
    """No checkpoint can be taken until a PS the master cannot reach is back: its caller goes on from
    the last one rather than ask again (the API answers 409, which callers do not send again)."""

TODO, DOING, DONE = "todo", "doing", "done"
FINISH = -1  # the lease of the job's last task: held-out evaluation and export, by one worker
WAIT_S = 0.2  # how long a worker waits before asking again while the master is paused
REPORT_TIMEOUT_S = 10.0  # a worker silent this long (no report, no shard asked or done) has lost its leases
#: Checkpoints kept on disk: the newest, and older ones to fall back on when the newest cannot be
#: read (a node died while it was written). Older ones are deleted (~70 MB each in the demo). (ours)
CHECKPOINTS_KEPT = 3
#: How long a master held for a PS change waits for the new PS set before it restores onto the PS
#: it has (the launcher died mid-resize; a PS change takes ~10–40 s in the demo). (ours)
HOLD_S = 300.0
#: How long a PS may serve no generation (a new process: relaunched, or started for a PS change)
#: before the master restores the job onto it by itself — its launcher died before ``/restore``;
#: a live launcher restores it within a second or two of its start. (ours)
UNSERVED_PS_S = 10.0
PS_CHECK_S = 2.0  # how often the master asks its PS which generation they serve
#: How long a checkpoint waits for a PS it cannot reach before it fails: it holds the master's lock,
#: and a dead PS's relaunch (which needs the lock) would wait as long; the next checkpoint is taken
#: on the new PS. (ours, measured: docs/tuning.md#checkpoint_peer_retry_s)
CHECKPOINT_PEER_RETRY_S = 2.0
#: faults the job injects into itself (POST /faults), as the command the worker receives
FAULT_COMMANDS = {"kill-worker": "kill", "oom-worker": "oom"}
#: what a worker does on a command (POST /command, ``runtime.worker``): die as a lost node does,
#: allocate until its memory limit's OOM killer ends it, exit 0
WORKER_COMMANDS = ("kill", "oom", "exit")
#: The longest node name a request may carry: a DNS-1123 subdomain (a pod's name). (Kubernetes)
NAME_MAX_CHARS = 253
#: The master's nonces (``runtime.auth``): replay protection that outlives a restart.
NONCES_FILE = "nonces.txt"
#: The state file before the last write (``write_durably(keep_previous=True)``): the master's
#: metadata (PS set, checkpoints, plan) when the state file itself is damaged.
PREVIOUS_SUFFIX = ".prev"


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= NAME_MAX_CHARS or not value.isprintable():
        raise InvalidInputError(field, value, f"a name of 1 to {NAME_MAX_CHARS} printable characters")
    return value


def _integer(field: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` when it is an integer in ``[low, high)``; raises ``InvalidInputError`` else."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        raise InvalidInputError(field, value, f"an integer ≥ {low}" if high is None else
                                f"an integer in [{low}, {high - 1}]")
    return value


def _number(field: str, value: Any) -> float:
    """``value`` when it is a finite number ≥ 0; raises ``InvalidInputError`` else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(field, value, "a finite number ≥ 0")
    return value


_ADDRESS = re.compile(r"[A-Za-z0-9._-]{1,253}:[0-9]{1,5}")


@dataclass
class Lease:
    worker: str
    deadline: float
    generation: int


class Master:
    def __init__(self, spec: JobSpec, workdir: Path):
        self.spec = spec
        self.workdir = Path(workdir)
        self.state_path = self.workdir / "master_state.json"
        self.metrics_path = self.workdir / "metrics.jsonl"
        self.lock = threading.RLock()
        self.paused = 0  # > 0 while a checkpoint or restore runs
        self.leases: dict[int, Lease] = {}
        self.latest: dict[str, dict[str, Any]] = {}  # node → its last report
        self.heard: dict[str, float] = {}  # node → when it last spoke to the master (monotonic)
        self.commands: dict[str, str] = {}
        self.report_interval_s = T.REPORT_INTERVAL_S  # what the workers' reports are told
        self.draining: set[str] = set()
        self.peers: list[Peer] = []
        self.last_shard: dict[str, int] = {}  # worker → the shard it was last handed
        self._ranks = (-1, None)  # an epoch's window order, cached
        self.started = time.time()
        self._load()

    # -- persistence ---------------------------------------------------------------------------
    def _fresh(self) -> None:
        """The state of a new job."""
        self.done: set[int] = set()
        self.generation, self.ps_addresses, self.checkpoints = 0, [], []
        self.counters: dict[str, int] = {"shards_requeued": 0, "checkpoints": 0, "restores": 0, "master_restarts": 0}
        self.plan: dict[str, Any] = {}
        self.faults: list[dict[str, Any]] = []
        self.restoring, self.held_until = False, None
        self.bad_rows: dict[int, tuple[int, str]] = {}
        self.failure: str | None = None
        self.result: dict[str, Any] | None = None
        self.leases.clear()
        self.heard.clear()

    def _apply(self, state: dict[str, Any]) -> None:
        """Take the persisted ``state`` (raises KeyError, TypeError or ValueError where it is not one)."""
        self.done = {int(s) for s in state["done"]}
        self.generation = int(state["generation"])
        self.ps_addresses = [str(a) for a in state["ps"]]
        self.checkpoints = list(state["checkpoints"])
        self.counters = dict(state["counters"])
        self.plan = dict(state.get("plan", {}))
        self.faults = list(state.get("faults", []))
        self.restoring = bool(state.get("restoring", False))
        self.held_until = state.get("held_until")
        self.bad_rows = {int(k): tuple(v) for k, v in state.get("bad_rows", {}).items()}
        self.failure = state.get("failure")
        self.result = state.get("result")
        now = time.monotonic()
        for shard, (worker, generation) in state.get("leases", {}).items():  # kept, with a fresh deadline
            self.leases[int(shard)] = Lease(worker, now + self.spec.shard_timeout_s, generation)
            self.heard[worker] = now

    def _load(self) -> None:
        """The persisted state, when the state file can be trusted (its checksum matches);
        otherwise :meth:`_distrust` it."""
        self._fresh()
        previous = self.state_path.with_name(self.state_path.name + PREVIOUS_SUFFIX)
        if self.state_path.exists() or previous.exists():
            trusted = False
            for path in (self.state_path, previous):
                try:
                    self._apply(unseal(path.read_text(), required=False))
                except (OSError, Damaged, KeyError, TypeError, ValueError) as err:
                    log.error("master state %s cannot be read: %s", path, err)
                    self._fresh()
                    continue
                trusted = path == self.state_path
                break
            if not trusted:
                self._distrust()
            self.counters["master_restarts"] = self.counters.get("master_restarts", 0) + 1
            log.info("master restored: %d/%d shards done, generation %d", len(self.done), self.spec.num_shards,
                     self.generation)
        self._connect_ps()
        self._persist()

    def _distrust(self) -> None:
        """The state file is damaged: the done set, the leases and the generation it held are
        lost, while the PS hold the rows those shards trained, so neither an empty done set nor the
        previous state file (one change behind) may be served over them. The master restores from
        the newest checkpoint that verifies (its done set and its PS files agree), under a
        generation above every one handed out before (from the checkpoints and the PS journals: a
        worker of an older one is refused), onto the PS set of the previous state file or of the
        launcher's next ``/cluster``. The previous state file gives the rest: plan, faults,
        counters, the result."""
        log.error("master state is damaged: restoring from the newest checkpoint that verifies")
        self.checkpoints = _checkpoints_on_disk(self.workdir)
        generations = [self.generation, *(c["generation"] for c in self.checkpoints)]
        for path in (self.workdir / JOURNAL_DIR).glob("*.jsonl"):
            generations += [e["g"] for e in read_journal(path)[0] if isinstance(e.get("g"), int)]
        self.generation = max(generations)
        self.counters["checkpoints"] = max([self.counters.get("checkpoints", 0), *(c["id"] for c in self.checkpoints)])
        self.counters["state_damaged"] = self.counters.get("state_damaged", 0) + 1
        self.done, self.restoring = set(), True
        self.leases.clear()

    def _persist(self) -> None:
        state = {
            "done": sorted(self.done), "generation": self.generation, "ps": self.ps_addresses,
            "checkpoints": self.checkpoints, "counters": self.counters, "plan": self.plan,
            "faults": self.faults, "restoring": self.restoring, "held_until": self.held_until,
            "bad_rows": {str(k): list(v) for k, v in self.bad_rows.items()}, "failure": self.failure,
            "result": self.result,
            "leases": {str(s): [lease.worker, lease.generation] for s, lease in self.leases.items()},
        }
        write_durably(self.state_path, seal(state), keep_previous=True)

    def _connect_ps(self) -> None:
        for peer in self.peers:
            peer.close()
        self.peers = [Peer(parse_address(a), self.spec.key, retry_s=30.0) for a in self.ps_addresses]

    # -- shards --------------------------------------------------------------------------------
    @property
    def _paused(self) -> bool:
        """No shard is handed out: a checkpoint or restore runs, one is pending, or a PS change is held."""
        return bool(self.paused) or self.restoring or self.held_until is not None

    def _status_of(self, shard: int) -> str:
        return DONE if shard in self.done else DOING if shard in self.leases else TODO

    def next_shard(self, worker: str, generation: int | None = None) -> dict[str, Any]:
        _name("worker", worker)
        if generation is not None:
            _integer("generation", generation, -1)
        with self.lock:
            self.heard[worker] = time.monotonic()  # a worker asking for a shard is alive
            self._expire_leases()
            if worker in self.draining:
                self.draining.discard(worker)
                self.latest.pop(worker, None)  # its rate no longer counts in the job's throughput
                return {"exit": True}
            if self.failure:
                return {"fail": self.failure}
            if self.result is not None:
                return {"done": True}
            if self._paused or not self.ps_addresses:
                return {"wait": WAIT_S}
            if len(self.done) == self.spec.num_shards:
                if FINISH in self.leases:  # another worker evaluates and exports: this one is done
                    return {"done": True}
                self._lease(FINISH, worker)
                return {"finish": True, "generation": self.generation, "ps": self.ps_addresses}
            shard = self._next_todo(worker)
            if shard is None:
                return {"wait": WAIT_S}  # every remaining shard is leased: wait for one to come back
            self._lease(shard, worker)
            start, stop = self.spec.shard_range(shard)
            return {"shard": shard, "start": start, "stop": stop, "generation": self.generation, "ps": self.ps_addresses}

    def _lease(self, shard: int, worker: str) -> None:
        self.leases[shard] = Lease(worker, time.monotonic() + self.spec.shard_timeout_s, self.generation)
        self.last_shard[worker] = shard
        self._persist()  # a restarted master keeps the lease

    def _next_todo(self, worker: str) -> int | None:
        """From the earliest epoch with a free shard: the shard after the worker's last one when
        it is free (a worker reads on through the window it has read), else the first free shard,
        in the epoch's window order (``JobSpec.window_order``), of a window no other worker reads
        (holds a lease in, or was last handed a shard of), else the first free one: each window is
        read by as few workers as can be (without a shuffle, a window is a row group, streamed)."""
        per_epoch = self.spec.shards_per_epoch
        free = []
        for first in range(0, self.spec.num_shards, per_epoch):  # the earliest epoch with a free shard
            free = [s for s in range(first, first + per_epoch) if s not in self.done and s not in self.leases]
            if free:
                break
        if not free or self.spec.dataset is None:  # synthetic samples cost the same anywhere
            return free[0] if free else None
        window = self.spec.window_of
        rank = self._window_rank(self.spec.epoch_of(free[0]))
        free.sort(key=lambda s: (rank[window(s)], s))
        after = self.last_shard.get(worker, -2) + 1
        if after in free and window(after) == window(after - 1):
            return after
        busy = {window(s) for s in self.leases if s != FINISH}
        busy |= {window(s) for w, s in self.last_shard.items() if w != worker and s != FINISH}
        return next((s for s in free if window(s) not in busy), free[0])

    def _window_rank(self, epoch: int):
        if self._ranks[0] != epoch:
            self._ranks = (epoch, self.spec.window_order(epoch))
        return self._ranks[1]

    def finish(self, worker: str, generation: int, **result: Any) -> dict[str, Any]:
        """The held-out metrics (and the export) of the finishing worker: the job is done."""
        _name("worker", worker)
        _integer("generation", generation, -1)
        with self.lock:
            self.heard[worker] = time.monotonic()
            lease = self.leases.get(FINISH)
            if generation != self.generation or lease is None or lease.worker != worker:
                return {"accepted": False, "reason": "not this worker's finish, or a stale generation"}
            del self.leases[FINISH]
            self.result = {**result, "worker": worker, "time": time.time()}
            self._persist()
            return {"accepted": True}

    def shard_done(self, worker: str, shard: int, generation: int, bad_rows: int = 0, first_bad: str = "") -> dict[str, Any]:
        """A shard is trained; its unreadable rows are counted once (every epoch reads the same
        rows: the dataset's are the most any epoch has met, :meth:`_bad_rows`), and past
        ``max_bad_rows`` the job fails, naming the first offending row of the earliest shard with one."""
        _name("worker", worker)
        _integer("shard", shard, 0, self.spec.num_shards)
        _integer("generation", generation, -1)
        _integer("bad_rows", bad_rows, 0)
        if not isinstance(first_bad, str):
            raise InvalidInputError("first_bad", first_bad, "a string naming the first unreadable row")
        with self.lock:
            self.heard[worker] = time.monotonic()
            if generation != self.generation:
                return {"accepted": False, "reason": "stale generation"}
            if bad_rows:
                self.bad_rows[shard] = (int(bad_rows), first_bad)
                total = self._bad_rows()
                if total > self.spec.max_bad_rows and not self.failure:
                    first = self.bad_rows[min(self.bad_rows)][1]
                    self.failure = (f"{total} rows cannot be read, more than max_bad_rows={self.spec.max_bad_rows}; "
                                    f"the first: {first}")
                    log.error("job fails: %s", self.failure)
            # Done by whoever finished it (a revoked holder, or the worker it was handed to: each
            # PS applied every batch once); a lease still out on it is void.
            self.leases.pop(shard, None)
            self.done.add(shard)
            self._persist()
            return {"accepted": True}

    def _bad_rows(self) -> int:
        """The unreadable rows of the data: the most of any epoch (each reads every row once)."""
        per_epoch: collections.Counter = collections.Counter()
        for shard, (n, _) in self.bad_rows.items():
            per_epoch[self.spec.epoch_of(shard)] += n
        return max(per_epoch.values(), default=0)

    def abandon(self, worker: str, shard: int) -> dict[str, Any]:
        _name("worker", worker)
        _integer("shard", shard, FINISH, self.spec.num_shards)
        with self.lock:
            self.heard[worker] = time.monotonic()
            lease = self.leases.get(shard)
            if lease is not None and lease.worker == worker:
                self._requeue(shard, f"abandoned by {worker} (its PS state was replaced)")
            return {"ok": True}

    def _requeue(self, shard: int, reason: str) -> None:
        """Return a leased shard to todo, and say why in the append-only ``requeues.jsonl``."""
        del self.leases[shard]
        self.counters["shards_requeued"] += 1
        with open(self.workdir / REQUEUES_FILE, "a") as f:
            f.write(seal({"t": time.time(), "shard": shard, "reason": reason}) + "\n")

    def node_lost(self, node: str) -> dict[str, Any]:
        """The launcher saw ``node`` die: its shards go back to todo now, not at lease expiry."""
        _name("node", node)
        with self.lock:
            self.latest.pop(node, None)
            lost = [s for s, lease in self.leases.items() if lease.worker == node]
            for shard in lost:
                self._requeue(shard, f"{node} lost")
            return {"requeued": lost}

    def _expire_leases(self) -> None:
        now = time.monotonic()
        for shard, lease in list(self.leases.items()):
            if lease.generation != self.generation:
                self._requeue(shard, f"rolled back to generation {self.generation}")
            elif now - self.heard.get(lease.worker, now) > REPORT_TIMEOUT_S:
                self._requeue(shard, f"{lease.worker} silent for {REPORT_TIMEOUT_S:g} s")
            elif lease.deadline < now:
                self._requeue(shard, f"lease of {lease.worker} expired")

    # -- metrics -------------------------------------------------------------------------------
    def report(self, node: str, **metrics: Any) -> dict[str, Any]:
        """A node's metrics (``runtime.worker``): the ones the master sums or the observer reads
        must be numbers; the rest is kept as it comes."""
        _name("node", node)
        for field in ("samples", "samples_per_s", "window_s", "cpu_seconds", "rss_mb"):
            if field in metrics:
                _number(field, metrics[field])
        if "role" in metrics:
            _name("role", metrics["role"])
        if not isinstance(metrics.get("loss", 0.0), (int, float)) or isinstance(metrics.get("loss"), bool):
            raise InvalidInputError("loss", metrics["loss"], "a number")
        with self.lock:
            metrics["_seen"] = self.heard[node] = time.monotonic()
            metrics["reported_at"] = time.time()
            if metrics.get("final"):  # the node leaves: its rate no longer counts
                self.latest.pop(node, None)
            else:
                self.latest[node] = metrics
            for lease in self.leases.values():
                if lease.worker == node:
                    lease.deadline = time.monotonic() + self.spec.shard_timeout_s
            command = self.commands.pop(node, None) or self._due_fault(node)
        row = {k: v for k, v in metrics.items() if not k.startswith("_")}
        row.update(node=node, time=time.time())
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return {"command": command, "report_interval_s": self.report_interval_s}

    def set_report_interval(self, seconds: float) -> dict[str, Any]:
        """How often the workers report from their next report on (``timings.PROBE_REPORT_INTERVAL_S``
        while profiled); not persisted: a restarted master tells them ``REPORT_INTERVAL_S`` again."""
        low, high = T.REPORT_INTERVAL_RANGE_S
        if not low <= _number("seconds", seconds) <= high:
            raise InvalidInputError("seconds", seconds, f"a report interval of {low:g}–{high:g} s")
        with self.lock:
            self.report_interval_s = float(seconds)
            return {"report_interval_s": self.report_interval_s}

    def job_throughput(self) -> float:
        with self.lock:
            now = time.monotonic()
            return float(sum(m.get("samples_per_s", 0.0) for m in self.latest.values()
                             if m.get("role") == "worker" and now - m["_seen"] < REPORT_TIMEOUT_S))

    def status(self) -> dict[str, Any]:
        with self.lock:
            counts = {TODO: 0, DOING: len(self.leases) - (FINISH in self.leases), DONE: len(self.done)}
            counts[TODO] = self.spec.num_shards - counts[DOING] - counts[DONE]
            state = ("failed" if self.failure else "done" if self.result is not None else "paused" if self._paused
                     else "finishing" if counts[DONE] == self.spec.num_shards else "training")
            return {
                "job_id": self.spec.job_id, "state": state, "generation": self.generation, "shards": counts,
                "samples_done": sum(self.spec.shard_range(s)[1] - self.spec.shard_range(s)[0] for s in self.done),
                "samples_total": self.spec.total_samples, "epochs": self.spec.epochs, "ps": self.ps_addresses,
                "workers": sorted(n for n, m in self.latest.items() if m.get("role") == "worker"),
                "throughput": self.job_throughput(), "checkpoint": self.checkpoints[-1] if self.checkpoints else None,
                "counters": dict(self.counters), "uptime_s": time.time() - self.started, "pid": os.getpid(),
                "bad_rows": self._bad_rows(), "failure": self.failure, "result": self.result,
                "held": self.held_until is not None,
            }

    def metrics(self) -> dict[str, Any]:
        with self.lock:
            nodes = {n: {k: v for k, v in m.items() if not k.startswith("_")} for n, m in self.latest.items()}
        return {"throughput": self.job_throughput(), "nodes": nodes, "status": self.status()}

    def prometheus(self) -> str:
        status = self.status()
        lines = [
            "# TYPE dlrover_throughput_samples_per_second gauge",
            f'dlrover_throughput_samples_per_second{{job="{self.spec.job_id}"}} {status["throughput"]:.3f}',
            "# TYPE dlrover_shards gauge",
        ]
        lines += [f'dlrover_shards{{job="{self.spec.job_id}",state="{k}"}} {v}' for k, v in status["shards"].items()]
        lines += ["# TYPE dlrover_generation gauge", f'dlrover_generation{{job="{self.spec.job_id}"}} {self.generation}',
                  "# TYPE dlrover_node_samples_per_second gauge"]
        with self.lock:
            for node, m in self.latest.items():
                if m.get("role") == "worker":
                    lines.append(f'dlrover_node_samples_per_second{{job="{self.spec.job_id}",node="{node}"}} {m.get("samples_per_s", 0):.3f}')
        return "\n".join(lines) + "\n"

    # -- cluster, plan, commands ----------------------------------------------------------------
    def set_cluster(self, ps: list[str]) -> dict[str, Any]:
        """A new PS set: a new job's serves generation 0; any other is restored to the latest
        checkpoint in the same step (see the module docstring)."""
        if not isinstance(ps, list) or not all(isinstance(a, str) and _ADDRESS.fullmatch(a) for a in ps):
            raise InvalidInputError("ps", ps, "a list of host:port addresses")
        with self.lock:
            fresh = not self.done and not self.checkpoints and self.generation == 0 and not self.restoring
            self.ps_addresses = list(ps)
            self._connect_ps()
            self.held_until = None
            if not fresh:
                return {"ps": self.ps_addresses, **self._restore()}
            self._persist()
            for peer in self.peers:
                peer.call("set_generation", generation=self.generation, journal=str(self.workdir / JOURNAL_DIR))
            return {"ps": self.ps_addresses}

    def set_plan(self, **plan: Any) -> dict[str, Any]:
        with self.lock:
            self.plan = plan
            self._persist()
            return plan

    def drain(self, node: str) -> dict[str, Any]:
        _name("node", node)
        with self.lock:
            self.draining.add(node)
            return {"draining": node}

    def command(self, node: str, command: str) -> dict[str, Any]:
        _name("node", node)
        if command not in WORKER_COMMANDS:
            raise InvalidInputError("command", command, ", ".join(WORKER_COMMANDS))
        with self.lock:
            self.commands[node] = command
            return {"node": node, "command": command}

    def schedule_faults(self, faults: list[dict[str, Any]]) -> dict[str, Any]:
        """Fault injection: ``{kind, at_s, node}`` fires ``at_s`` after this call (persisted, so
        a master restart neither forgets nor repeats one); kinds: FAULT_COMMANDS."""
        if not isinstance(faults, list):
            raise InvalidInputError("faults", faults, "a list of {kind, at_s, node}")
        for i, fault in enumerate(faults):
            if not isinstance(fault, dict) or set(fault) != {"kind", "at_s", "node"}:
                raise InvalidInputError(f"faults[{i}]", fault, "a mapping of kind, at_s and node")
            if fault["kind"] not in FAULT_COMMANDS:
                raise InvalidInputError(f"faults[{i}].kind", fault["kind"], ", ".join(FAULT_COMMANDS))
            _number(f"faults[{i}].at_s", fault["at_s"])
            _name(f"faults[{i}].node", fault["node"])
        with self.lock:
            now = time.time()
            self.faults = [{"kind": f["kind"], "node": f["node"], "due": now + float(f["at_s"]), "fired": None}
                           for f in faults]
            self._persist()
            return {"faults": self.faults}

    def _due_fault(self, node: str) -> str | None:
        for fault in self.faults:
            if fault["node"] == node and fault["fired"] is None and time.time() >= fault["due"]:
                fault["fired"] = time.time()
                self._persist()
                log.warning("fault injection: %s on %s", fault["kind"], node)
                return FAULT_COMMANDS[fault["kind"]]
        return None

    # -- checkpoint and restore -----------------------------------------------------------------
    def _quiesce(self, deadline_s: float) -> None:
        """Stop handing out shards and wait until none is in flight (or leases expire). The finish
        is no shard: its worker takes the last checkpoint for the export."""
        self.paused += 1
        end = time.monotonic() + deadline_s
        while True:
            with self.lock:
                self._expire_leases()
                in_flight = [s for s in self.leases if s != FINISH]
                if not in_flight:
                    return
                if time.monotonic() > end:
                    for shard in in_flight:
                        self._requeue(shard, f"checkpoint waited {deadline_s:g} s for it")
                    return
            time.sleep(0.02)

    def checkpoint(self, hold: bool = False) -> dict[str, Any]:
        """A consistent checkpoint (see the module docstring); returns its manifest. ``hold``: a PS
        change follows, so the master stays paused until the new set arrives."""
        if not isinstance(hold, bool):
            raise InvalidInputError("hold", hold, "true or false")
        started = time.monotonic()
        self._quiesce(self.spec.shard_timeout_s)
        try:
            with self.lock:
                number = self.counters["checkpoints"] + 1
                folder = self.workdir / "checkpoints" / f"ckpt-{number:05d}"
                folder.mkdir(parents=True, exist_ok=True)
                files, digests = [], []
                for index, peer in enumerate(self.peers):
                    path = folder / f"ps-{index}.npz"
                    try:
                        digests.append(peer.call("save", retry_s=CHECKPOINT_PEER_RETRY_S, generation=self.generation,
                                                 path=str(path))["sha256"])
                    except Unreachable as err:
                        raise CheckpointUnavailable(f"no checkpoint while a PS is unreachable: {err}") from None
                    files.append(str(path))
                manifest = {"id": number, "done": sorted(self.done), "generation": self.generation,
                            "ps_count": len(files), "files": files, "sha256": digests, "time": time.time(),
                            "stall_s": time.monotonic() - started}
                write_durably(folder / "manifest.json", seal(manifest))
                self.checkpoints.append(_entry(manifest, folder))
                self.counters["checkpoints"] = number
                if hold:
                    self.held_until = time.time() + HOLD_S
                retired, self.checkpoints = self.checkpoints[:-CHECKPOINTS_KEPT], self.checkpoints[-CHECKPOINTS_KEPT:]
                self._persist()
                for old in retired:  # only once the state no longer names them
                    shutil.rmtree(old["path"], ignore_errors=True)
                return self.checkpoints[-1]
        finally:
            self.paused -= 1

    def restore(self) -> dict[str, Any]:
        """Roll the job back to the latest checkpoint (or to the start) on the current PS set."""
        with self.lock:
            self.held_until = None
            return self._restore()

    def _restore(self) -> dict[str, Any]:
        """The restore, written ahead (see the module docstring); the caller holds the lock."""
        started = time.monotonic()
        self.generation += 1
        for shard in list(self.leases):
            self._requeue(shard, f"rolled back to generation {self.generation}")
        for checkpoint in [*reversed(self.checkpoints), None]:  # the newest that verifies; None: the start
            files, self.done, restored_from = [], set(), None
            if checkpoint is not None:
                manifest = _verified_manifest(Path(checkpoint["path"]))
                if manifest is None:
                    log.warning("checkpoint %s does not verify: falling back to an older one", checkpoint["path"])
                    continue
                files, self.done, restored_from = manifest["files"], set(manifest["done"]), manifest["id"]
            elif self.checkpoints:
                log.error("no checkpoint verifies: the job starts again from its first state")
            self.restoring = True
            self._persist()
            journal = str(self.workdir / JOURNAL_DIR)
            try:
                for peer in self.peers:
                    peer.call("restore", paths=files, generation=self.generation, journal=journal)
            except RemoteError as err:  # a file the PS cannot read whole: an older checkpoint, on every PS
                if checkpoint is None or f"{DamagedCheckpoint.__name__}:" not in str(err):
                    raise
                log.warning("checkpoint %s cannot be restored (%s): falling back to an older one",
                            checkpoint["path"], err)
                continue
            break
        self.restoring = False
        self.counters["restores"] += 1
        self._persist()
        return {"generation": self.generation, "checkpoint": restored_from, "done": len(self.done),
                "stall_s": time.monotonic() - started}

    def unserved_ps(self) -> list[str]:
        """The PS of the current set that serve no generation (each asked once, briefly; a PS that
        does not answer is the launcher's to relaunch)."""
        with self.lock:
            addresses = list(self.ps_addresses)
        unserved = []
        for address in addresses:
            peer = Peer(parse_address(address), self.spec.key, retry_s=1.0)
            try:
                if peer.call("serving") < 0:
                    unserved.append(address)
            except Exception:  # noqa: BLE001 - down or restarting: not this check's to judge
                pass
            finally:
                peer.close()
        return unserved

    def restore_if_unserved(self, unserved: list[str]) -> bool:
        """Restore the job when the PS ``unserved`` are still in the set and nothing else restores
        it: the master finishes a PS's start that its launcher did not (see ``serve``)."""
        with self.lock:
            if not unserved or self._paused or not set(unserved) <= set(self.ps_addresses):
                return False
            log.warning("PS %s serve no generation %.0f s after they were seen: restoring the job onto them",
                        ", ".join(unserved), UNSERVED_PS_S)
            self.restoring = True
            self._persist()
            return True

    def accounting(self) -> dict[str, Any]:
        """The exactly-once figures from the PS journals (``runtime.accounting``)."""
        with self.lock:
            generation = self.generation
        return reconcile(self.workdir, self.spec, generation)


#: The one request anyone may make (see the module docstring).
OPEN_ROUTES = {("GET", "/metrics/prometheus"), ("GET", "/healthz")}
#: A connection that sends nothing for this long while its request is read is closed (a request
#: of a few KB arrives in milliseconds, in a cluster or over loopback). (ours)
READ_TIMEOUT_S = 10.0
#: The whole request (line, headers, body) must arrive within this long: a client that trickles a
#: byte at a time never hits ``READ_TIMEOUT_S``. Handling it (a checkpoint waits on the PS) is not
#: limited. (ours)
REQUEST_READ_S = 30.0
#: Connections served at once; one more is answered 503 and closed (``call_master`` retries). A
#: node holds one only while its request is served: 128 serves a job of a hundred workers while
#: bounding the threads (and memory) that idle connections can take. (ours)
MAX_CONNECTIONS = 128
#: The largest body of a request, by route, checked on its Content-Length before a byte is read
#: (413 beyond). Every route takes 16 KiB, many times the largest request measured; the plan (free
#: text), the fault list and the PS set (they grow with the job) take 1 MiB. (ours, measured: the
#: example DAG's jobs; docs/tuning.md#body_limit_bytes)
BODY_LIMIT_BYTES = 16 << 10
BODY_LIMITS = {"/plan": 1 << 20, "/faults": 1 << 20, "/cluster": 1 << 20}
_LENGTH = re.compile(r"[0-9]{1,15}")
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"


class _Handler(BaseHTTPRequestHandler):
    """One connection's request: length, signature (header first), body, route (see
    :func:`http_server`)."""

    master: Master  # set on the subclass
    verifier: Verifier
    timeout = READ_TIMEOUT_S  # set on the subclass: every read of the socket gives up after it

    def setup(self) -> None:
        super().setup()
        self.server.reading(self.connection, True)

    def finish(self) -> None:
        self.server.reading(self.connection, False)
        try:
            super().finish()
        except OSError:  # the client went away
            pass

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _refuse(self, err: Refused) -> None:
        """Reply 401 saying what failed; the log adds what only the master may know."""
        with self.master.lock:
            self.master.counters["requests_refused"] = self.master.counters.get("requests_refused", 0) + 1
        detail = f" ({err.detail})" if err.detail else ""
        log.warning("refused %s %s from %s: %s%s", self.command, self.path, self.client_address[0], err, detail)
        self._reply({"error": f"refused: {err}"}, 401)

    def _reply(self, body: Any, status: int = 200, text: bool = False) -> None:
        data = body.encode() if text else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _length(self) -> int | None:
        """The body's length from Content-Length (absent: 0); None after answering 400 when it
        is not a whole number of bytes, or the body is chunked."""
        text = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") is not None:
            error = "Transfer-Encoding is invalid: allowed none (send a Content-Length)"
        elif text is None or _LENGTH.fullmatch(text.strip()):
            return int(text or 0)
        else:
            error = f"Content-Length={text!r} is invalid: allowed a whole number of bytes"
        self.close_connection = True
        self._reply({"error": error}, 400)
        return None

    def _read(self, length: int) -> bytes | None:
        """Exactly ``length`` bytes of body; None (the connection closes) when the client stops
        sending first."""
        try:
            raw = self.rfile.read(length)
        except OSError:  # READ_TIMEOUT_S passed, or the server cut a request past REQUEST_READ_S
            raw = b""
        if len(raw) == length:
            return raw
        self.close_connection = True
        return None

    def do_GET(self) -> None:
        m = self.master
        self.server.reading(self.connection, False)
        if (self.command, self.path) not in OPEN_ROUTES:
            try:
                self.verifier.check(self.command, self.path, b"", self.headers.get(HEADER))
            except Refused as err:
                return self._refuse(err)
        routes = {"/status": m.status, "/metrics": m.metrics, "/plan": lambda: m.plan, "/accounting": m.accounting}
        if self.path == "/metrics/prometheus":
            return self._reply(m.prometheus(), text=True)
        if self.path == "/healthz":
            return self._reply({"ok": True})
        if self.path not in routes:
            return self._reply({"error": f"no route {self.path}"}, 404)
        self._reply(routes[self.path]())

    def do_POST(self) -> None:
        """Length (400), its limit (413) and the signed header (401) are checked before a byte of
        the body is read; then exactly that many bytes are, and their hash checked (401)."""
        m = self.master
        length = self._length()
        if length is None:
            return
        limit = BODY_LIMITS.get(self.path, BODY_LIMIT_BYTES)
        if length > limit:
            self.close_connection = True
            return self._reply({"error": f"Content-Length={length} is invalid: allowed at most {limit} bytes "
                                         f"for {self.path}"}, 413)
        try:
            signed = self.verifier.check_header(self.command, self.path, self.headers.get(HEADER), length)
        except Refused as err:
            self._read(length)  # within the route's limit: read so that the caller gets the 401
            return self._refuse(err)
        raw = self._read(length)
        if raw is None:
            return
        self.server.reading(self.connection, False)
        try:
            self.verifier.check_body(raw, signed)
        except Refused as err:
            return self._refuse(err)
        try:
            body = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return self._reply({"error": f"body is not JSON: {err}"}, 400)
        if not isinstance(body, dict):
            return self._reply({"error": "body is invalid: allowed a JSON object"}, 400)
        routes = {
            "/shard/next": m.next_shard, "/shard/done": m.shard_done, "/shard/abandon": m.abandon,
            "/report": m.report, "/cluster": m.set_cluster, "/plan": m.set_plan, "/node_lost": m.node_lost,
            "/drain": m.drain, "/command": m.command, "/checkpoint": m.checkpoint, "/restore": m.restore,
            "/faults": m.schedule_faults, "/finish": m.finish, "/report_interval": m.set_report_interval,
        }
        if self.path not in routes:
            return self._reply({"error": f"no route {self.path}"}, 404)
        try:
            self._reply(routes[self.path](**body))
        except InvalidInputError as err:
            self._reply({"error": str(err)}, 400)
        except CheckpointUnavailable as err:
            self._reply({"error": str(err)}, 409)
        except TypeError as err:
            self._reply({"error": f"bad request to {self.path}: {err}"}, 400)
        except Exception as err:  # noqa: BLE001 - reported to the caller
            log.exception("POST %s failed", self.path)
            self._reply({"error": f"{type(err).__name__}: {err}"}, 500)


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once (one more is answered 503 and
    closed without a thread); a request not read within ``request_read_s`` has its connection
    shut down (checked between the accept loop's polls)."""

    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS  # the listen backlog

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int, request_read_s: float):
        self._slots = threading.BoundedSemaphore(max_connections)
        self._reading: dict[socket.socket, float] = {}  # connection → when its request must be read
        self._reading_lock = threading.Lock()
        self._request_read_s = request_read_s
        self.turned_away = 0
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.turned_away += 1
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def reading(self, connection: socket.socket, started: bool) -> None:
        """The handler starts (or is done) reading ``connection``'s request."""
        with self._reading_lock:
            if started:
                self._reading[connection] = time.monotonic() + self._request_read_s
            else:
                self._reading.pop(connection, None)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._reading_lock:
            late = [c for c, deadline in self._reading.items() if deadline < now]
            for connection in late:
                del self._reading[connection]
        for connection in late:
            try:
                connection.shutdown(socket.SHUT_RDWR)  # its handler's read returns, and it ends
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        self.RequestHandlerClass.verifier.close()


def http_server(master: Master, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The master's HTTP API (see the module docstring), not yet serving: nonces kept in
    ``NONCES_FILE`` of the master's folder, the limits of this module."""
    verifier = Verifier(master.spec.key, nonce_file=master.workdir / NONCES_FILE)
    handler = type("Handler", (_Handler,), {"master": master, "verifier": verifier, "timeout": READ_TIMEOUT_S})
    return _Server((host, port), handler, MAX_CONNECTIONS, REQUEST_READ_S)


def serve(spec: JobSpec, workdir: Path, port: int = 0, ready_file: Path | None = None, host: str = "127.0.0.1") -> None:
    """Run the master until SIGTERM: HTTP API, lease expiry, periodic checkpoints, and the restore
    of a PS that serves no generation for ``UNSERVED_PS_S`` (a new PS whose launcher died before
    ``/restore``: the restore is the master's to finish, from its own state)."""
    master = Master(spec, workdir)
    server = http_server(master, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if ready_file is not None:
        announce(ready_file, (host, server.server_address[1]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    last_checkpoint = time.monotonic()
    unserved_since: dict[str, float] = {}
    last_check = time.monotonic()
    while not stop.wait(0.5):
        now = time.monotonic()
        if now - last_check >= PS_CHECK_S and master.ps_addresses and not master._paused:
            last_check = now
            unserved_since = {a: unserved_since.get(a, now) for a in master.unserved_ps()}
            master.restore_if_unserved([a for a, since in unserved_since.items() if now - since >= UNSERVED_PS_S])
        with master.lock:
            master._expire_leases()
            training = master.ps_addresses and len(master.done) < spec.num_shards
            held, restoring = master.held_until is not None, master.restoring
            if held and time.time() > master.held_until:
                log.warning("no new PS set %.0f s after the checkpoint for a PS change: restoring onto the PS I have", HOLD_S)
                restoring = True
        if restoring:
            try:
                master.restore()
            except Exception:  # a PS is still down: its relaunch restores, or the next loop does
                log.exception("restore failed: retrying")
            continue
        if training and not held and time.monotonic() - last_checkpoint > spec.checkpoint_interval_s:
            try:
                master.checkpoint()
            except Exception:  # a PS is down: the launcher will restore; try again later
                log.exception("periodic checkpoint failed")
            last_checkpoint = time.monotonic()
    server.shutdown()
    server.server_close()


def write_durably(path: Path, text: str, keep_previous: bool = False) -> None:
    """Write ``path`` so that a crash leaves the old file or the new one, whole: a temporary file
    (mode 0600), fsync, rename, fsync of the folder. ``keep_previous``: the old file stays as
    ``<path>.prev`` (a hard link, renamed into place before the new file is)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if keep_previous and path.exists():
        link = path.with_name(f".{path.name}{PREVIOUS_SUFFIX}.tmp")
        link.unlink(missing_ok=True)
        try:
            os.link(path, link)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(path, link)
        os.replace(link, path.with_name(path.name + PREVIOUS_SUFFIX))
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _entry(manifest: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A checkpoint as the master's state lists it: its manifest without the done set and the
    checksums (they stay in the manifest), and its folder."""
    return {k: v for k, v in manifest.items() if k not in ("done", "sha256")} | {"path": str(folder)}


def _checkpoints_on_disk(workdir: Path) -> list[dict[str, Any]]:
    """The checkpoints whose manifest can be read, oldest first (their files are verified when
    a restore takes one)."""
    found = []
    for folder in (Path(workdir) / "checkpoints").glob("ckpt-*"):
        try:
            manifest = unseal((folder / "manifest.json").read_text(), required=False)
            found.append(_entry(manifest, folder) | {"id": int(manifest["id"]),
                                                     "generation": int(manifest["generation"])})
        except (OSError, Damaged, KeyError, TypeError, ValueError):
            log.warning("checkpoint %s has no readable manifest", folder)
    return sorted(found, key=lambda c: c["id"])


def _verified_manifest(folder: Path) -> dict[str, Any] | None:
    """A checkpoint's manifest when it and every file it names are the bytes that were written
    (the manifest's own checksum, then each file's SHA-256); None otherwise. A manifest of an
    older writer, without checksums: when each file's archive directory can be read."""
    import zipfile

    import numpy as np

    try:
        manifest = unseal((folder / "manifest.json").read_text(), required=False)
        files, digests = manifest["files"], manifest.get("sha256")
        if digests is not None:
            if len(digests) != len(files) or any(sha256_file(f) != d for f, d in zip(files, digests)):
                return None
            return manifest
        for name in files:
            with np.load(name) as data:  # an .npz: opening it reads the archive's directory
                if not data.files:
                    return None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
    return manifest
