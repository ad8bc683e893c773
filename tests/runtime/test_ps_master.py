"""The PS and the master in one process (real transport, no training): exactly-once bookkeeping,
checkpoint/restore consistency, re-partitioning, master restart."""

from pathlib import Path

import numpy as np
import pytest

from airflow_dlrover.runtime.master import Master
from airflow_dlrover.runtime.ps import ParameterServer, initial_rows
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, RemoteError, Server

SPEC = JobSpec(job_id="unit", samples=10 * 100, shard_size=100, table_sizes=(1000, 500), embedding_dim=4,
               bottom_mlp=(8, 4), shard_timeout_s=60)


@pytest.fixture()
def cluster(tmp_path):
    """``count`` PS servers in threads and a master over them; returns (master, ps objects, peers)."""
    servers = []

    def make(count, spec=SPEC):
        ps = [ParameterServer(spec, i, count) for i in range(count)]
        started = [Server(p.handle, spec.key).start() for p in ps]
        servers.extend(started)
        master = Master(spec, tmp_path)
        master.set_cluster([f"{s.address[0]}:{s.address[1]}" for s in started])
        peers = [Peer(s.address, spec.key, retry_s=2) for s in started]
        return master, ps, peers

    yield make
    for server in servers:
        server.close()


def train_shard(master, peers, worker, rng, fail_after=None):
    """What a worker does for one shard, with numpy gradients; returns the lease reply."""
    reply = master.next_shard(worker)
    shard, generation, p = reply["shard"], reply["generation"], len(peers)
    peers[0].call("init_dense", generation=generation, params=np.zeros(3, np.float32))
    for batch, offset in enumerate(range(reply["start"], reply["stop"], 25)):
        if fail_after is not None and batch == fail_after:
            return reply
        ids = [np.unique(rng.integers(0, size, 10)) for size in SPEC.table_sizes]
        for k in range(p):
            mine = [i[i % p == k] for i in ids]
            grads = [np.ones((len(i), SPEC.embedding_dim), np.float32) for i in mine]
            extra = dict(dense_grad=np.ones(3, np.float32), shard=shard, samples=min(25, reply["stop"] - offset)) if k == 0 else {}
            peers[k].call("push", generation=generation, ids=mine, grads=grads, **extra)
    master.shard_done(worker, shard, generation)
    return reply


def test_every_sample_applied_exactly_once_and_a_lost_worker_costs_at_most_one_shard(cluster):
    master, _, peers = cluster(2)
    rng = np.random.default_rng(0)
    crashed = train_shard(master, peers, "w0", rng, fail_after=2)  # w0 dies after 2 of 4 batches
    master.node_lost("w0")
    while master.status()["state"] != "done":
        train_shard(master, peers, "w1", rng)
    ledger = np.array(master.ledger())
    assert ledger.sum() == SPEC.samples + 50  # the partial shard, trained again
    assert ledger[crashed["shard"]] == 150 and (np.delete(ledger, crashed["shard"]) == 100).all()
    assert master.status()["counters"]["shards_requeued"] == 1


def test_restore_rolls_model_ledger_and_shards_back_to_the_checkpoint(cluster):
    master, ps, peers = cluster(2)
    rng = np.random.default_rng(1)
    for _ in range(3):
        train_shard(master, peers, "w", rng)
    master.checkpoint()
    saved = {k: p.tables[0].export() for k, p in enumerate(ps)}
    for _ in range(2):
        train_shard(master, peers, "w", rng)
    old_generation = master.generation
    result = master.restore()
    assert result["done"] == 3 and master.generation == old_generation + 1
    assert np.array(master.ledger()).sum() == 300
    for k, p in enumerate(ps):
        now = p.tables[0].export()
        order_now, order_saved = np.argsort(now["ids"]), np.argsort(saved[k]["ids"])
        np.testing.assert_array_equal(now["ids"][order_now], saved[k]["ids"][order_saved])
        np.testing.assert_array_equal(now["rows"][order_now], saved[k]["rows"][order_saved])
    # A push from the old generation is refused, so stragglers cannot pollute the restored model.
    with pytest.raises(RemoteError, match="StaleGeneration"):
        peers[0].call("push", generation=old_generation, ids=[np.array([0]), np.array([0])],
                      grads=[np.ones((1, 4), np.float32)] * 2)
    while master.status()["state"] != "done":
        train_shard(master, peers, "w", rng)
    assert (np.array(master.ledger()) == 100).all()


def test_repartition_keeps_every_row(tmp_path):
    two = [ParameterServer(SPEC, i, 2) for i in range(2)]
    rng = np.random.default_rng(2)
    for p in two:
        p.generation = 0
    for t, size in enumerate(SPEC.table_sizes):
        ids = np.unique(rng.integers(0, size, 300))
        for k, p in enumerate(two):
            mine = ids[ids % 2 == k]
            p.tables[t].apply_adagrad(mine, rng.standard_normal((len(mine), 4)).astype(np.float32), 0.1)
    files = [str(tmp_path / f"ps-{k}.npz") for k in range(2)]
    for p, f in zip(two, files):
        p.save(f)
    three = [ParameterServer(SPEC, i, 3) for i in range(3)]
    for p in three:
        p.restore(files, generation=1)
    for t in range(len(SPEC.table_sizes)):
        before = {int(i): r for p in two for i, r in zip(p.tables[t].export()["ids"], p.tables[t].export()["rows"])}
        after = {int(i): r for p in three for i, r in zip(p.tables[t].export()["ids"], p.tables[t].export()["rows"])}
        assert before.keys() == after.keys()
        for i in before:
            np.testing.assert_array_equal(before[i], after[i])
        for k, p in enumerate(three):
            assert (p.tables[t].export()["ids"] % 3 == k).all()


def test_untouched_rows_are_deterministic():
    a = initial_rows(0, 3, np.array([5, 7, 5]), 8)
    np.testing.assert_array_equal(a[0], a[2])
    assert not np.array_equal(a[0], a[1])
    assert np.abs(a).max() <= 0.05


def test_master_restart_loses_nothing(cluster, tmp_path):
    master, _, peers = cluster(1)
    rng = np.random.default_rng(3)
    for _ in range(4):
        train_shard(master, peers, "w", rng)
    reborn = Master(SPEC, tmp_path)  # a new process reads the persisted state
    assert reborn.status()["shards"]["done"] == 4
    assert reborn.ps_addresses == master.ps_addresses
    assert reborn.counters["master_restarts"] == 1
    assert reborn.next_shard("w")["shard"] == 4


def test_leases_expire_and_draining_workers_exit(cluster):
    master, _, _ = cluster(1)
    first = master.next_shard("slow")
    master.leases[first["shard"]].deadline = 0  # as if the lease timed out
    again = master.next_shard("fast")
    assert again["shard"] == first["shard"]
    master.drain("fast")
    assert master.next_shard("fast") == {"exit": True}
    assert master.shard_done("slow", first["shard"], generation=master.generation - 1)["accepted"] is False


def test_prometheus_text(cluster):
    master, _, _ = cluster(1)
    text = master.prometheus()
    assert 'dlrover_shards{job="unit",state="todo"} 10' in text
    assert "# TYPE dlrover_throughput_samples_per_second gauge" in text


def test_a_fresh_lease_is_not_revoked_as_silent(cluster, monkeypatch):
    """A worker blocked longer than ``REPORT_TIMEOUT_S`` (waiting for the PS after a PS change)
    asks for a shard: asking is a sign of life, so the next lease check, by another worker, must
    not revoke the lease at once and hand the same shard out again (both would train it)."""
    import time
    from types import SimpleNamespace

    from airflow_dlrover.runtime import master as master_module

    master, _, _ = cluster(1)
    clock = [time.monotonic()]
    monkeypatch.setattr(master_module, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time,
                                                               sleep=time.sleep))
    master.report("worker-0", role="worker", samples=0, samples_per_s=0.0)
    master.report("worker-1", role="worker", samples=0, samples_per_s=0.0)
    clock[0] += master_module.REPORT_TIMEOUT_S + 5  # worker-0 was blocked, silent, this long
    master.report("worker-1", role="worker", samples=0, samples_per_s=0.0)
    first = master.next_shard("worker-0")
    second = master.next_shard("worker-1")
    assert first["shard"] != second["shard"]
    assert master.leases[first["shard"]].worker == "worker-0"
    assert master.counters["shards_requeued"] == 0
    clock[0] += master_module.REPORT_TIMEOUT_S + 5  # silent for real now: its lease goes back
    master.report("worker-1", role="worker", samples=0, samples_per_s=0.0)
    master.next_shard("worker-1")
    assert first["shard"] not in master.leases or master.leases[first["shard"]].worker == "worker-1"
    assert master.counters["shards_requeued"] == 1


def test_a_wrong_key_or_a_silent_client_never_stops_a_server_from_serving(monkeypatch):
    """The handshake runs in the connection's thread with a time-out: a client with a wrong key,
    or one that connects and says nothing, leaves the accept loop serving everybody else."""
    import socket
    import threading
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from airflow_dlrover.runtime import transport

    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 1.0)
    server = Server(lambda method, **kw: method.upper(), b"k" * 32).start()
    try:
        with pytest.raises(AuthenticationError):
            Client(server.address, authkey=b"wrong" * 8)
        silent = socket.create_connection(server.address)  # connects, never answers the challenge
        answers = []
        caller = threading.Thread(target=lambda: answers.append(Peer(server.address, b"k" * 32, retry_s=3).call("ping")))
        caller.start()
        caller.join(timeout=10)
        assert answers == ["PING"]
        silent.settimeout(5)
        assert len(silent.recv(1024)) > 0 and silent.recv(1024) == b""  # challenged, then dropped after the time-out
        silent.close()
    finally:
        server.close()


def test_the_job_spec_with_its_key_is_readable_by_its_owner_only(tmp_path):
    import os
    import stat

    old = os.umask(0)  # even under a permissive umask
    try:
        SPEC.save(tmp_path / "spec.json")
        SPEC.save(tmp_path / "spec.json")  # rewriting keeps it private
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(tmp_path / "spec.json").st_mode)
    assert mode == 0o600, oct(mode)
    assert JobSpec.load(tmp_path / "spec.json") == SPEC


def test_a_push_of_the_old_generation_never_lands_in_the_restored_state():
    """The PS checks a request's generation under the lock that its work takes: a restore that
    comes in between a push's check and its update cannot happen."""
    import threading
    import time

    from airflow_dlrover.runtime.ps import StaleGeneration

    ps = ParameterServer(SPEC, 0, 1)
    ps.set_generation(3)
    ids = [np.array([5], dtype=np.int64), np.array([], dtype=np.int64)]
    before = ps.lookup(ids)["rows"][0].copy()
    grads = [np.ones((1, SPEC.embedding_dim), np.float32), np.zeros((0, SPEC.embedding_dim), np.float32)]
    outcome = []

    def push():
        try:
            ps.handle("push", generation=3, ids=ids, grads=grads)
            outcome.append("applied")
        except StaleGeneration:
            outcome.append("stale")

    with ps.lock:  # the restore holds the lock; the push arrives meanwhile
        pusher = threading.Thread(target=push)
        pusher.start()
        time.sleep(0.2)
        ps.generation = 4  # what restore() sets, with the restored rows
    pusher.join(timeout=5)
    assert outcome == ["stale"]
    assert np.array_equal(ps.lookup(ids)["rows"][0], before)


def test_old_checkpoints_are_deleted_and_an_unreadable_newest_falls_back_to_an_older_one(cluster):
    from airflow_dlrover.runtime.master import CHECKPOINTS_KEPT

    master, ps, peers = cluster(2)
    rng = np.random.default_rng(4)
    folders = []
    for _ in range(CHECKPOINTS_KEPT + 2):
        train_shard(master, peers, "w", rng)
        folders.append(Path(master.checkpoint()["path"]))
    assert [Path(c["path"]) for c in master.checkpoints] == folders[-CHECKPOINTS_KEPT:]
    assert not any(f.exists() for f in folders[:-CHECKPOINTS_KEPT])  # the retired ones are gone
    assert not list(folders[-1].glob(".*.tmp")) and not list(folders[-1].glob("*.tmp.npz"))
    # The newest checkpoint lost a PS file half-written (its node died): restore takes the one before.
    (folders[-1] / "ps-1.npz").write_bytes(b"PK\x03\x04 half a zip")
    result = master.restore()
    assert result["done"] == CHECKPOINTS_KEPT + 1  # the shards the previous checkpoint held
    assert np.array(master.ledger()).sum() == (CHECKPOINTS_KEPT + 1) * 100
