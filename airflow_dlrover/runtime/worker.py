"""A training worker: takes shards from the master, looks rows up on the PS, runs the dense model
locally (CUDA when it has a GPU and torch sees one), pushes gradients, and reports samples/s, the
step-time breakdown (data / lookup / compute / push), CPU used and RSS. The worker the master hands
the finish evaluates the held-out split and exports the model, inside the job.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil
import torch

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.auth import call_master
from airflow_dlrover.runtime.data import Batch
from airflow_dlrover.runtime.dlrm import FlatParameters, build_model
from airflow_dlrover.runtime.lookup import PackedRoute, embed, gather, route
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, RemoteError, Unreachable, parse_address

log = logging.getLogger(__name__)

MASTER_RETRY_S = 120.0  # a master restart takes seconds; give it time before giving up
PS_RETRY_S = 10.0  # a PS that stays away this long was replaced: ask the master for the cluster


class MasterClient:
    """The worker's requests to the master, signed with the job's key, retried across a master
    restart (``MASTER_RETRY_S``)."""

    def __init__(self, address: str, key: bytes):
        self.base, self.key = f"http://{address}", key

    def post(self, path: str, **body: Any) -> dict[str, Any]:
        try:
            return call_master(self.base, path, body, timeout=MASTER_RETRY_S, key=self.key)
        except ConnectionError as err:
            raise Unreachable(str(err)) from None


def source_for(spec: JobSpec):
    """The job's data source: synthetic, or the user's dataset read through the layout."""
    if spec.data == "synthetic":
        from airflow_dlrover.runtime.data import FeatureSpec, SyntheticSource

        return SyntheticSource(FeatureSpec(spec.layout.num_dense, spec.layout.table_sizes), seed=spec.seed,
                               zipf_skew=spec.zipf_skew)
    from airflow_dlrover.runtime.datasets import TabularSource

    return TabularSource(spec.dataset, spec.layout)


class Worker:
    def __init__(self, spec: JobSpec, name: str, master: str, threads: int):
        self.spec, self.name = spec, name
        torch.set_num_threads(max(1, threads))
        self.device = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("DLROVER_WORKER_GPU", "0") != "0" else "cpu")
        self.master = MasterClient(master, spec.key)
        self.model = build_model(spec)
        if spec.init_from:  # the dense model the job starts from (PS 0 takes it as the initial one)
            from airflow_dlrover.runtime.export import read_dense

            self.model.load_state_dict(read_dense(spec.init_from))
        self.model = self.model.to(self.device)
        self.dense = FlatParameters(self.model)
        self.source = source_for(spec)
        layout = spec.layout
        # single-hot tables of one dim: every table's ids and rows in one array each way
        self.packed = len(set(layout.dims)) == 1 and not any(column.multi_hot for column in layout.sparse)
        self.table_sizes = np.array(layout.table_sizes, dtype=np.int64)
        self._read: tuple[int, int, Batch | None] = (0, 0, None)  # the rows last read: first, last, them
        self.ps_addresses: list[str] = []
        self.peers: list[Peer] = []
        self.pool: ThreadPoolExecutor | None = None
        self.generation = -1
        self.initial_dense = self.dense.numpy()  # the deterministic init every worker shares
        self.process = psutil.Process()
        self.samples = 0
        self.window = {"samples": 0, "data": 0.0, "lookup": 0.0, "compute": 0.0, "push": 0.0, "start": time.monotonic()}
        self.last_loss = float("nan")
        self.report_interval_s = T.REPORT_INTERVAL_S  # the master's, from its last reply

    def _set_cluster(self, ps: list[str], generation: int) -> None:
        if ps != self.ps_addresses:
            for peer in self.peers:
                peer.close()
            self.peers = [Peer(parse_address(a), self.spec.key, retry_s=PS_RETRY_S) for a in ps]
            self.pool = ThreadPoolExecutor(max_workers=len(ps))
            self.ps_addresses = list(ps)
        self.generation = generation

    def run(self) -> None:
        """Train shards until the master says the job is done; the worker handed the finish
        evaluates the held-out split and exports the model (``runtime.export``) first."""
        while True:
            reply = self.master.post("/shard/next", worker=self.name, generation=self.generation)
            if "fail" in reply:  # the job's data is past its bad-row limit: nothing a retry fixes
                raise InvalidInputError("data", self.spec.data, f"at most max_bad_rows={self.spec.max_bad_rows} "
                                        "unreadable rows", reply["fail"])
            if reply.get("exit") or reply.get("done"):
                self._report(force=True, final=True)
                return
            if "wait" in reply:
                self._report()
                time.sleep(reply["wait"])
                continue
            self._set_cluster(reply["ps"], reply["generation"])
            try:
                if reply.get("finish"):
                    self.master.post("/finish", worker=self.name, generation=self.generation, **self._finish())
                    continue
                bad = self._train_shard(reply["shard"], reply["start"], reply["stop"])
            except (RemoteError, Unreachable) as err:
                if isinstance(err, RemoteError) and "StaleGeneration" not in str(err):
                    raise
                # The PS set was restored or replaced under us: drop the shard (the model it
                # was updating is gone) and take the current cluster from the master.
                log.info("shard %s dropped: %s", reply.get("shard", "finish"), err)
                self.master.post("/shard/abandon", worker=self.name, shard=reply.get("shard", -1))
                time.sleep(0.1)  # the master is restoring the PS: ask again shortly
                continue
            self.master.post("/shard/done", worker=self.name, shard=reply["shard"], generation=self.generation, **bad)

    def _train_shard(self, shard: int, start: int, stop: int) -> dict[str, Any]:
        """Train the job's samples ``[start, stop)``: the shard's rows in its epoch's order
        (``JobSpec.shard_rows``), read from the last range read when the shard lies in it (an
        epoch's window, decoded once); returns its bad rows (count, and the first named)."""
        t = time.perf_counter()
        first, last, order = self.spec.shard_rows(shard)
        if self._read[:2] != (first, last):
            self._read = (first, last, None)  # the previous range is freed before the next is read
            self._read = (first, last, self.source.samples(first, last))
        data = self._read[2] if order is None else self._read[2].take(order)
        self.window["data"] += time.perf_counter() - t
        for offset in range(0, len(data), self.spec.batch_size):
            self._step(start + offset, data.slice(offset, min(offset + self.spec.batch_size, len(data))))
            self._report()
        for peer in self.peers:  # every push of the shard applied (or refused) before it is done
            peer.wait()
        if not data.bad_rows:
            return {}
        rows = None if order is None else first + order
        errors = [e for e in self.source.errors(first, last) if rows is None or self.source.row_of(e) in rows]
        return {"bad_rows": data.bad_rows, "first_bad": str(errors[0]) if errors else f"a row in [{first}, {last})"}

    def _route(self, batch: Batch):
        """The batch's ids, distinct per table, with each PS's share: a :class:`PackedRoute`, or
        ``lookup.route``'s per-table lists."""
        if self.packed:
            return PackedRoute(batch.sparse, self.table_sizes, len(self.peers))
        return route(batch.sparse, len(self.peers))

    def _lookup(self, routed) -> list[dict[str, Any]]:
        """Each PS's rows for its share of the ids of a routed batch (``_route``; None: no ids),
        PS 0's reply with the dense parameters. A PS 0 that holds none (a new job, or a checkpoint
        taken before any) is given the initial ones first."""
        def lookup(k: int) -> dict[str, Any]:
            if routed is None:
                ids = {"ids": [np.zeros(0, np.int64) for _ in self.spec.layout.sparse]}
            elif self.packed:
                ids = dict(zip(("ids", "lengths"), routed.shares[k][1:]))
            else:
                ids = {"ids": routed[2][k]}
            return self.peers[k].call("lookup", generation=self.generation, dense=k == 0, **ids)

        replies = self._each_ps(lookup)
        if replies[0]["dense"] is None:
            self.peers[0].call("init_dense", generation=self.generation, params=self.initial_dense)
            replies[0] = lookup(0)
        return replies

    def _each_ps(self, request):
        """``request(k)`` for every PS k, at once (one thread each) where there are several."""
        if len(self.peers) == 1:
            return [request(0)]
        return list(self.pool.map(request, range(len(self.peers))))

    def _forward(self, batch: Batch, routed, replies, grad: bool):
        """Logits of ``batch`` from the PS replies, and the leaf row tensor(s) (for their gradients):
        one for a packed route, one per table otherwise."""
        self.dense.load(replies[0]["dense"])
        if self.packed:
            rows = torch.from_numpy(routed.gather(replies)).to(self.device).requires_grad_(grad)
            embedded = routed.embed(rows)
        else:
            uniques, inverses, _ = routed
            rows = [torch.from_numpy(r).to(self.device).requires_grad_(grad)
                    for r in gather(uniques, replies, self.spec.layout.dims)]
            embedded = embed(rows, inverses, batch.sparse, self.spec.layout, self.device)
        return self.model(torch.from_numpy(batch.dense).to(self.device), embedded), rows

    def _step(self, first_sample: int, batch: Batch) -> None:
        """One batch: lookup, forward/backward, push (the push names the batch by its first sample:
        a PS applies each batch once). Bad rows weigh nothing; a batch of bad rows only is pushed
        without gradients, so that it counts as trained once like any other. The push is posted:
        the next batch's data is read and routed while the PS applies it, and its reply is read
        before the next lookup on the same connection, which the PS serves after it (so a
        worker's lookup always sees its own last push)."""
        t0 = time.perf_counter()
        routed = self._route(batch)
        t1 = time.perf_counter()
        replies = self._lookup(routed)
        t2 = time.perf_counter()
        valid = torch.from_numpy(batch.valid_mask.astype(np.float32)).to(self.device)
        count = float(valid.sum())
        logits, rows = self._forward(batch, routed, replies, grad=True)
        self.dense.zero_grad()
        label = torch.from_numpy(batch.label).to(self.device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label, weight=valid, reduction="sum")
        loss = loss / max(count, 1.0)
        loss.backward()
        if count:
            self.last_loss = float(loss.detach())
        dense_grad = self.dense.gradients() if count else None
        t3 = time.perf_counter()
        self._push(first_sample, len(batch), routed, rows if count else None, dense_grad)
        t4 = time.perf_counter()
        self.samples += len(batch)
        w = self.window
        w["samples"] += len(batch)
        w["data"] += t1 - t0
        w["lookup"] += t2 - t1
        w["compute"] += t3 - t2
        w["push"] += t4 - t3

    def _push(self, first_sample: int, samples: int, routed, rows, dense_grad: np.ndarray | None) -> None:
        """Post to each PS the batch's gradients of the rows it holds (none when ``rows`` is None: a
        batch of bad rows only, pushed so that it counts as trained); the dense one to PS 0."""
        dims = self.spec.layout.dims
        if self.packed:
            grads = rows.grad.cpu().numpy() if rows is not None else None
        else:
            uniques, _, owner = routed
            grads = [r.grad.cpu().numpy() for r in rows] if rows is not None else None
        for k, peer in enumerate(self.peers):
            if self.packed:
                mine, ids, lengths = routed.shares[k]
                shares = ({"ids": ids, "grads": grads[mine], "lengths": lengths} if grads is not None else
                          {"ids": ids[:0], "grads": np.zeros((0, dims[0]), np.float32), "lengths": lengths * 0})
            elif grads is None:
                shares = {"ids": [u[:0] for u in uniques], "grads": [np.zeros((0, d), np.float32) for d in dims]}
            elif len(self.peers) == 1:
                shares = {"ids": uniques, "grads": grads}
            else:
                masks = [u % len(self.peers) == k for u in uniques]
                shares = {"ids": owner[k], "grads": [g[m] for g, m in zip(grads, masks)]}
            peer.post("push", generation=self.generation, batch=first_sample, samples=samples,
                      worker=self.name, dense_grad=dense_grad if k == 0 else None, **shares)

    def evaluate(self, start: int, stop: int, batch_size: int = 4096, previous=None) -> dict[str, Any]:
        """Held-out metrics (``evaluate.StreamingMetrics``) of the readable rows of ``[start, stop)``,
        with the PS's current model, in memory that does not grow with the rows; with ``previous``
        (an ``export.ExportedModel``) that model's too, on the same rows, as ``result["previous"]``."""
        from airflow_dlrover.runtime.evaluate import StreamingMetrics

        streaming, theirs = StreamingMetrics(), StreamingMetrics()
        with torch.no_grad():
            for offset in range(start, stop, batch_size):
                batch = self.source.samples(offset, min(offset + batch_size, stop))
                routed = self._route(batch)
                logits, _ = self._forward(batch, routed, self._lookup(routed), grad=False)
                keep = batch.valid_mask
                streaming.update(batch.label[keep], logits.cpu().numpy()[keep])
                if previous is not None:
                    theirs.update(batch.label[keep], previous.logits(batch)[keep])
                self._report()  # keeps the finish's lease
        result = streaming.result()
        if previous is not None:
            result["previous"] = {"uri": self.spec.init_from, **theirs.result()}
        return result

    def _finish(self) -> dict[str, Any]:
        """The job's last task: held-out loss and AUC (and those of the model it started from,
        on the same rows), and the export."""
        previous = None
        if self.spec.init_from:
            from airflow_dlrover.runtime.export import load_export

            previous = load_export(self.spec.init_from)
        result = self.evaluate(*self.spec.held_out, previous=previous)
        del previous
        if self.spec.export:
            from airflow_dlrover.runtime.export import export_model

            checkpoint = self.master.post("/checkpoint")
            replies = self._lookup(None)
            self.dense.load(replies[0]["dense"])
            result["export"] = export_model(self.spec, self.model, checkpoint["files"], result,
                                            heartbeat=lambda: self._report(force=True))
        return result

    def _report(self, force: bool = False, final: bool = False) -> None:
        w = self.window
        elapsed = time.monotonic() - w["start"]
        if elapsed < self.report_interval_s and not force:
            return
        cpu = self.process.cpu_times()
        reply = self.master.post(
            "/report", node=self.name, role="worker", samples=self.samples,
            samples_per_s=w["samples"] / max(elapsed, 1e-9), loss=self.last_loss,
            step_time={k: w[k] for k in ("data", "lookup", "compute", "push")}, window_s=elapsed,
            cpu_seconds=cpu.user + cpu.system, rss_mb=self.process.memory_info().rss / 2**20,
            generation=self.generation, final=final,
        )
        self.window = {"samples": 0, "data": 0.0, "lookup": 0.0, "compute": 0.0, "push": 0.0, "start": time.monotonic()}
        self.report_interval_s = float(reply.get("report_interval_s", T.REPORT_INTERVAL_S))
        command = reply.get("command")
        if command == "oom":
            _allocate_until_killed()
        elif command == "kill":  # fault injection: die as a lost node does, without cleanup
            log.warning("fault injection: SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)
        elif command == "exit":
            raise SystemExit(0)


def _allocate_until_killed() -> None:
    """Fault injection: grow the resident set until the memory limit's OOM killer ends us."""
    log.warning("fault injection: allocating until OOM-killed")
    hoard = []
    while True:
        block = bytearray(64 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        hoard.append(block)
