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

HTTP API (JSON bodies). Every request but ``GET /metrics/prometheus`` and ``GET /healthz`` must
carry a signature with the job's key (``runtime.auth``) and is refused with 401 otherwise. Those two
stay open because a Prometheus scraper and a kubelet's readiness probe hold no job's key, and they
only read throughput, shard counts and the generation, or "ok" — nothing that can change the job or
reveal its data:
  GET  /status  /metrics  /metrics/prometheus  /healthz  /plan  /accounting
  POST /shard/next {worker, generation}        → {shard,start,stop,generation,ps} | {wait} | {exit} | {done}
                                                 | {finish, generation, ps}: evaluate and export (one worker)
                                                 | {fail}: the data is past its bad-row limit
  POST /shard/done {worker, shard, generation, bad_rows?, first_bad?}  POST /shard/abandon {worker, shard}
  POST /finish {worker, generation, loss, auc, samples, export?}  the job's result: its state is done
  POST /report {node, role, ...metrics}        → {command}
  POST /cluster {ps: ["host:port", ...]}       POST /plan {...}
  POST /node_lost {node}  POST /drain {node}  POST /command {node, command}
  POST /checkpoint {hold?}                     POST /restore
  POST /faults {faults: [{kind, at_s, node}]}  fault injection for demos, due at_s after this call:
                                               the node's next report is answered with the command
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from airflow_dlrover.runtime.accounting import JOURNAL_DIR, REQUEUES_FILE, reconcile
from airflow_dlrover.runtime.auth import HEADER, Refused, Verifier
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, announce, parse_address

log = logging.getLogger(__name__)

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
#: faults the job injects into itself (POST /faults), as the command the worker receives
FAULT_COMMANDS = {"kill-worker": "kill", "oom-worker": "oom"}


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
        self.draining: set[str] = set()
        self.peers: list[Peer] = []
        self.last_shard: dict[str, int] = {}  # worker → the shard it was last handed
        if spec.dataset is not None:
            self._fragment_starts = spec.dataset.fragment_starts
            self._ranks = (-1, None)  # an epoch's fragment order, cached
        self.started = time.time()
        self._load()

    # -- persistence ---------------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.done: set[int] = set(state["done"])
            self.generation = state["generation"]
            self.ps_addresses: list[str] = state["ps"]
            self.checkpoints: list[dict[str, Any]] = state["checkpoints"]
            self.counters: dict[str, int] = state["counters"]
            self.plan: dict[str, Any] = state.get("plan", {})
            self.faults: list[dict[str, Any]] = state.get("faults", [])
            self.restoring: bool = state.get("restoring", False)
            self.held_until: float | None = state.get("held_until")
            self.bad_rows: dict[int, tuple[int, str]] = {int(k): tuple(v) for k, v in state.get("bad_rows", {}).items()}
            self.failure: str | None = state.get("failure")
            self.result: dict[str, Any] | None = state.get("result")
            self.counters["master_restarts"] = self.counters.get("master_restarts", 0) + 1
            now = time.monotonic()
            for shard, (worker, generation) in state.get("leases", {}).items():  # kept, with a fresh deadline
                self.leases[int(shard)] = Lease(worker, now + self.spec.shard_timeout_s, generation)
                self.heard[worker] = now
            log.info("master restored: %d/%d shards done, generation %d", len(self.done), self.spec.num_shards, self.generation)
        else:
            self.done, self.generation, self.ps_addresses, self.checkpoints = set(), 0, [], []
            self.counters = {"shards_requeued": 0, "checkpoints": 0, "restores": 0, "master_restarts": 0}
            self.plan = {}
            self.faults = []
            self.restoring, self.held_until = False, None
            self.bad_rows, self.failure, self.result = {}, None, None
        self._connect_ps()
        self._persist()

    def _persist(self) -> None:
        state = {
            "done": sorted(self.done), "generation": self.generation, "ps": self.ps_addresses,
            "checkpoints": self.checkpoints, "counters": self.counters, "plan": self.plan,
            "faults": self.faults, "restoring": self.restoring, "held_until": self.held_until,
            "bad_rows": {str(k): list(v) for k, v in self.bad_rows.items()}, "failure": self.failure,
            "result": self.result,
            "leases": {str(s): [lease.worker, lease.generation] for s, lease in self.leases.items()},
        }
        write_durably(self.state_path, json.dumps(state))

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
        it is free (a worker reads on through the fragment it has decoded), else the first free
        shard, in the epoch's fragment order (``JobSpec.fragment_order``), of a fragment no other
        worker reads (holds a lease in, or was last handed a shard of), else the first free one."""
        per_epoch = self.spec.shards_per_epoch
        free = []
        for first in range(0, self.spec.num_shards, per_epoch):  # the earliest epoch with a free shard
            free = [s for s in range(first, first + per_epoch) if s not in self.done and s not in self.leases]
            if free:
                break
        if not free or self.spec.dataset is None:  # synthetic samples cost the same anywhere
            return free[0] if free else None
        rank = self._fragment_rank(self.spec.epoch_of(free[0]))
        free.sort(key=lambda s: (rank[self._fragment(s)], s))
        after = self.last_shard.get(worker, -2) + 1
        if after in free and self._fragment(after) == self._fragment(after - 1):
            return after
        busy = {self._fragment(s) for s in self.leases if s != FINISH}
        busy |= {self._fragment(s) for w, s in self.last_shard.items() if w != worker and s != FINISH}
        return next((s for s in free if self._fragment(s) not in busy), free[0])

    def _fragment_rank(self, epoch: int):
        if self._ranks[0] != epoch:
            self._ranks = (epoch, self.spec.fragment_order(epoch, len(self._fragment_starts) - 1))
        return self._ranks[1]

    def _fragment(self, shard: int) -> int:
        """The fragment (row group, run of lines) a shard lies in; shards never cross one."""
        return bisect.bisect_right(self._fragment_starts, self.spec.rows_of(shard)[0]) - 1

    def finish(self, worker: str, generation: int, **result: Any) -> dict[str, Any]:
        """The held-out metrics (and the export) of the finishing worker: the job is done."""
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
        """A shard is trained; its unreadable rows are counted once per shard's rows (not per
        epoch), and past
        ``max_bad_rows`` the job fails, naming the first offending row."""
        with self.lock:
            self.heard[worker] = time.monotonic()
            if generation != self.generation:
                return {"accepted": False, "reason": "stale generation"}
            if bad_rows:
                self.bad_rows[shard % self.spec.shards_per_epoch] = (int(bad_rows), first_bad)
                total = sum(n for n, _ in self.bad_rows.values())
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

    def abandon(self, worker: str, shard: int) -> dict[str, Any]:
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
            f.write(json.dumps({"t": time.time(), "shard": shard, "reason": reason}) + "\n")

    def node_lost(self, node: str) -> dict[str, Any]:
        """The launcher saw ``node`` die: its shards go back to todo now, not at lease expiry."""
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
        return {"command": command}

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
                "bad_rows": sum(n for n, _ in self.bad_rows.values()), "failure": self.failure, "result": self.result,
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
        with self.lock:
            self.draining.add(node)
            return {"draining": node}

    def command(self, node: str, command: str) -> dict[str, Any]:
        with self.lock:
            self.commands[node] = command
            return {"node": node, "command": command}

    def schedule_faults(self, faults: list[dict[str, Any]]) -> dict[str, Any]:
        """Fault injection: ``{kind, at_s, node}`` fires ``at_s`` after this call (persisted, so
        a master restart neither forgets nor repeats one); kinds: FAULT_COMMANDS."""
        unknown = [f["kind"] for f in faults if f["kind"] not in FAULT_COMMANDS]
        if unknown:
            raise ValueError(f"fault kind {unknown[0]!r} is invalid: allowed {', '.join(FAULT_COMMANDS)}")
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
        started = time.monotonic()
        self._quiesce(self.spec.shard_timeout_s)
        try:
            with self.lock:
                number = self.counters["checkpoints"] + 1
                folder = self.workdir / "checkpoints" / f"ckpt-{number:05d}"
                folder.mkdir(parents=True, exist_ok=True)
                files = []
                for index, peer in enumerate(self.peers):
                    path = folder / f"ps-{index}.npz"
                    peer.call("save", generation=self.generation, path=str(path))
                    files.append(str(path))
                manifest = {"id": number, "done": sorted(self.done), "generation": self.generation,
                            "ps_count": len(files), "files": files, "time": time.time(),
                            "stall_s": time.monotonic() - started}
                write_durably(folder / "manifest.json", json.dumps(manifest))
                self.checkpoints.append({k: v for k, v in manifest.items() if k != "done"} | {"path": str(folder)})
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
        files, self.done, restored_from = [], set(), None
        for checkpoint in reversed(self.checkpoints):  # the newest that can be read whole
            manifest = _readable_manifest(Path(checkpoint["path"]))
            if manifest is not None:
                files, self.done, restored_from = manifest["files"], set(manifest["done"]), manifest["id"]
                break
            log.warning("checkpoint %s cannot be read: falling back to an older one", checkpoint["path"])
        self.restoring = True
        self._persist()
        for peer in self.peers:
            peer.call("restore", paths=files, generation=self.generation, journal=str(self.workdir / JOURNAL_DIR))
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


class _Handler(BaseHTTPRequestHandler):
    master: Master  # set on the subclass
    verifier: Verifier

    def _refused(self, body: bytes) -> bool:
        """Reply 401 and return True unless the request proves the job's key."""
        if (self.command, self.path) in OPEN_ROUTES:
            return False
        try:
            self.verifier.check(self.command, self.path, body, self.headers.get(HEADER))
            return False
        except Refused as err:
            with self.master.lock:
                self.master.counters["requests_refused"] = self.master.counters.get("requests_refused", 0) + 1
            log.warning("refused %s %s from %s: %s", self.command, self.path, self.client_address[0], err)
            self._reply({"error": f"refused: {err}"}, 401)
            return True

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, body: Any, status: int = 200, text: bool = False) -> None:
        data = body.encode() if text else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        m = self.master
        if self._refused(b""):
            return
        routes = {"/status": m.status, "/metrics": m.metrics, "/plan": lambda: m.plan, "/accounting": m.accounting}
        if self.path == "/metrics/prometheus":
            return self._reply(m.prometheus(), text=True)
        if self.path == "/healthz":
            return self._reply({"ok": True})
        if self.path not in routes:
            return self._reply({"error": f"no route {self.path}"}, 404)
        self._reply(routes[self.path]())

    def do_POST(self) -> None:
        m = self.master
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self._refused(raw):
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as err:
            return self._reply({"error": f"body is not JSON: {err}"}, 400)
        routes = {
            "/shard/next": m.next_shard, "/shard/done": m.shard_done, "/shard/abandon": m.abandon,
            "/report": m.report, "/cluster": m.set_cluster, "/plan": m.set_plan, "/node_lost": m.node_lost,
            "/drain": m.drain, "/command": m.command, "/checkpoint": m.checkpoint, "/restore": m.restore,
            "/faults": m.schedule_faults, "/finish": m.finish,
        }
        if self.path not in routes:
            return self._reply({"error": f"no route {self.path}"}, 404)
        try:
            self._reply(routes[self.path](**body))
        except TypeError as err:
            self._reply({"error": f"bad request to {self.path}: {err}"}, 400)
        except Exception as err:  # noqa: BLE001 - reported to the caller
            log.exception("POST %s failed", self.path)
            self._reply({"error": f"{type(err).__name__}: {err}"}, 500)


def http_server(master: Master, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The master's HTTP API (see the module docstring), not yet serving."""
    handler = type("Handler", (_Handler,), {"master": master, "verifier": Verifier(master.spec.key)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


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


def write_durably(path: Path, text: str) -> None:
    """Write ``path`` so that a crash leaves the old file or the new one, whole: a temporary file,
    fsync, rename, fsync of the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _readable_manifest(folder: Path) -> dict[str, Any] | None:
    """A checkpoint's manifest when it and every file it names can be read; None otherwise."""
    import zipfile

    import numpy as np

    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        for name in manifest["files"]:
            with np.load(name) as data:  # an .npz: opening it reads the archive's directory
                if not data.files:
                    return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return manifest
